"""Estimator evaluation with xMem's method (metrics.py), the estimators (estimators.py) and ground truth."""
