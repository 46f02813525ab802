"""uvmlab.gpu."""
