"""uvmlab.report."""
