"""uvmlab.measure.nsys."""
