"""Data parallelism from scratch, to run beside torch DDP: broadcast, all-reduce, average."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn


def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Step 4 by hand: every rank takes rank `src`'s weights."""
    for param in model.parameters():
        dist.broadcast(param.data, src=src)


def average_gradients(model: nn.Module) -> None:
    """Step 8 by hand: sum every gradient over the ranks, then divide by the number of ranks."""
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world
