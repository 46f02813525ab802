"""Statistics tables shared by the simulated and the measured side (same column names: comparing is a join)."""
