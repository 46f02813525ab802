"""A tiny MLP classifier: an example user workload (uvmlab trace docs/examples/tiny_mlp.py -o DIR).

A workload file defines ``build(cfg, device, options)`` returning a ``workloads.base.Workload``; optional
``DEFAULT_BATCH_SIZE``, ``OPTIONS`` (the --option keys it accepts, with defaults) and ``DESCRIPTION``.
"""

from __future__ import annotations

import torch  # noqa: TID251 (a workload file needs torch)
import torch.nn.functional as F  # noqa: TID251

from workloads.base import Workload

DEFAULT_BATCH_SIZE = 64
OPTIONS = {"in_features": 256, "hidden": 512, "classes": 10}
DESCRIPTION = "tiny MLP: in_features -> hidden -> hidden -> classes, ReLU, cross entropy"


def build(cfg, device, options):
    """Build the MLP on ``device``; batches are random features and labels made on the device."""
    dev = torch.device(device)
    with dev:
        model = torch.nn.Sequential(
            torch.nn.Linear(options["in_features"], options["hidden"]),
            torch.nn.ReLU(),
            torch.nn.Linear(options["hidden"], options["hidden"]),
            torch.nn.ReLU(),
            torch.nn.Linear(options["hidden"], options["classes"]),
        )
    batch = cfg.batch_size or DEFAULT_BATCH_SIZE

    def make_batch():
        x = torch.randn(batch, options["in_features"], device=dev)
        y = torch.randint(0, options["classes"], (batch,), device=dev)
        return x, y

    def loss_fn(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    return Workload("tiny_mlp", model, make_batch, loss_fn, dev)
