"""uvmlab.nsys."""
