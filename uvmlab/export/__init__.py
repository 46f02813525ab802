"""Exports of a run for other tools: PyTorch memory snapshots (memory_viz) and Chrome/Perfetto timelines."""
