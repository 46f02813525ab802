"""Characterization sweeps: YAML specs (spec), executors and resume (runner), the per-run child (worker),
and the sweep-level results table (aggregate). See docs/sweeps.md."""
