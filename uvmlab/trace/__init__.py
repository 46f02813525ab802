"""Traces of training workloads: the schema (torch-free), capture (torch), snapshots, orchestration.

Import ``uvmlab.trace.schema`` for the Trace tables; ``uvmlab.trace.capture`` needs torch.
"""
