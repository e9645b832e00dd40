"""Inside the ranks: how long one epoch of DDP training takes on the first n ranks, with and
without the gradient all-reduce (the "when does DDP pay off" lesson and the benchmark)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from .worker import device, device_ids


def first_ranks_groups(sizes: Iterable[int]) -> dict[int, dist.ProcessGroup]:
    """A process group of ranks 0..n-1 for each n. Every rank must call this (it is collective)."""
    return {n: dist.new_group(list(range(n))) for n in sizes}


def epoch_seconds(
    make_model: Callable[[], nn.Module],
    data: Dataset,
    batch_size: int,
    group: dist.ProcessGroup,
    sync: bool = True,
) -> float | None:
    """Seconds one epoch over `data` takes when `group`'s ranks share it, `batch_size` per rank
    (after one untimed warm-up step), the model and the batches on this rank's device. sync=False
    runs every backward under no_sync(): the same computation without the all-reduce. None on
    ranks outside the group."""
    if dist.get_rank() not in dist.get_process_group_ranks(group):
        return None
    sampler = DistributedSampler(
        data, num_replicas=group.size(), rank=dist.get_rank(group), shuffle=False
    )
    here = device()
    batches = [(x.to(here), y.to(here))
               for x, y in DataLoader(data, batch_size=batch_size, sampler=sampler)]
    model = DDP(make_model().to(here), device_ids=device_ids(), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        with contextlib.nullcontext() if sync else model.no_sync():
            nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    def settle() -> None:
        """Wait for this rank's GPU (it runs behind the Python code), then for the group."""
        if here.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier(group=group)

    step(*batches[0])  # warm-up: DDP rebuilds its buckets after the first step
    settle()
    start = time.perf_counter()
    for x, y in batches:
        step(x, y)
    settle()
    return time.perf_counter() - start
