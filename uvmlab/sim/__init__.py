"""uvmlab.sim."""
