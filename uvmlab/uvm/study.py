"""The seed study's published numbers (seeds/003: Lin & Jeon, EuroMLSys '25; A100 80GB PCIe, measured).

Validation targets only: nothing in uvmlab is fitted to them (docs/uvm-sim.md, "The study's grid").
"""

from __future__ import annotations

WORKLOADS = ("alexnet", "resnet50", "resnet101", "gpt2", "bert", "whisper-small")
"""The six workloads of Table 2, as uvmlab's built-in workload names."""
FACTORS = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
"""Oversubscription factors of Figure 3 (1.25-10) plus 1.0, the no-oversubscription reference."""
FOOTPRINT_MB = {
    "alexnet": 5316,
    "resnet50": 15952,
    "resnet101": 22588,
    "gpt2": 12008,
    "bert": 12350,
    "whisper-small": 9824,
}
"""Table 2, "Memory Footprint (MB)" per workload."""
HEADLINES = {
    "mean_slowdown_pca": 7.29,
    "max_slowdown_pca": 57.74,
    "mean_slowdown_nopca": 1.75,
    "max_slowdown_nopca": 17.85,
    "nopca_over_pca_at_1": 7.22,
}
"""Section 4.2: slowdowns over factors 1.25-10, and no-PCA / PCA without oversubscription."""
DROPS = {"alexnet": 5.0, "whisper-small": 6.0}
"""Section 4.2: the factors beyond which AlexNet and Whisper slow down sharply."""
