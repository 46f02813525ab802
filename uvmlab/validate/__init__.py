"""`uvmlab validate`: the fidelity scorecard (every real data set we hold, measured vs predicted)."""
