"""uvmlab: GPU memory under CUDA Unified Memory oversubscription and PyTorch's caching allocator."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1
"""Version of every table and JSON file uvmlab writes (trace, run directory, results)."""
