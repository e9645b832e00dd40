"""Single-process training on the global batches: what DDP must agree with."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import TensorDataset


class ReferenceRun(NamedTuple):
    """Per step of a single-process run: gradient before the step, weights after, loss."""

    grads: list[torch.Tensor]
    weights: list[torch.Tensor]
    losses: list[float]


def single_process_run(
    model: nn.Module,
    dataset: TensorDataset,
    global_batches: Sequence[Sequence[int]],
    lr: float,
    loss_fn: nn.Module | None = None,
) -> ReferenceRun:
    """Train `model` with SGD on each global batch in turn, in one process."""
    loss_fn = loss_fn or nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    run = ReferenceRun([], [], [])
    for batch in global_batches:
        x, y = dataset[list(batch)]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        run.grads.append(_flat(p.grad for p in model.parameters()))
        optimizer.step()
        run.weights.append(_flat(model.parameters()))
        run.losses.append(loss.item())
    return run


def _flat(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def global_batches(per_rank_batches: Sequence[Sequence[Sequence[int]]]) -> list[list[int]]:
    """Join the ranks' batches of each step: [rank][step][i] -> [step][all indices]."""
    steps = len(per_rank_batches[0])
    return [[i for rank in per_rank_batches for i in rank[step]] for step in range(steps)]
