"""Instrumentation used inside workers: record what a REAL DDP run does on each rank.

Nothing here re-implements DDP. The gradient recorder is a DDP communication hook: DDP calls it
with each bucket of local gradients, it records them, runs the same all-reduce as PyTorch's
default hook (divide by world size, then sum), and records the reduced result.
(No `from __future__ import annotations` here: DDP checks the hook's `bucket` annotation at
run time and needs the real dist.GradBucket class.)
"""

import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .worker import before_flush, record


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters of `model` as one detached vector (in model.parameters() order)."""
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def checksum(model: nn.Module) -> float:
    """A number that changes whenever any weight changes: sum of weights x their position."""
    flat = flat_parameters(model).double()
    return float((flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum())


def record_parameter_layout(model: nn.Module) -> None:
    """Record [name, shape] of every parameter so flat vectors can be split again."""
    layout = [[name, list(p.shape)] for name, p in _unwrap(model).named_parameters()]
    record("param_layout", {"params": layout})


def record_weights(model: nn.Module, step: int | None = None, name: str = "weights") -> None:
    """Record this rank's weights (one flat vector) at `step`."""
    record(name, flat_parameters(model), step)


def record_sampler(sampler: Any, epochs: int = 1, name: str = "shard") -> list[list[int]]:
    """Record the dataset indices `sampler` gives this rank in each epoch (calls set_epoch)."""
    per_epoch = []
    for epoch in range(epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        indices = [int(i) for i in sampler]
        record(name, indices, step=epoch)
        per_epoch.append(indices)
    return per_epoch


class GradientRecorder:
    """A DDP communication hook that records each bucket before and after its all-reduce.

    Per step it records ``grad_local`` and ``grad_synced`` (flat, in model.parameters() order)
    and ``buckets`` (index, size, parameter names, launch and finish times).
    """

    def __init__(self, ddp_model: nn.parallel.DistributedDataParallel) -> None:
        self.process_group = ddp_model.process_group
        self.names = {id(p): n for n, p in ddp_model.module.named_parameters()}
        self.order = [n for n, _ in ddp_model.module.named_parameters()]
        self.step = 0
        self.local: dict[str, torch.Tensor] = {}
        self.synced: dict[str, torch.Tensor] = {}
        self.buckets: list[dict[str, Any]] = []
        ddp_model.register_comm_hook(self, recording_allreduce_hook)
        before_flush(self.finish_step)

    def launched(self, bucket: dist.GradBucket) -> dict[str, Any]:
        """Note a bucket about to be all-reduced; keep copies of its local gradients."""
        if bucket.index() == 0 and self.buckets and all("finished" in b for b in self.buckets):
            self.finish_step()
        names = [self.names[id(p)] for p in bucket.parameters()]
        for name, grad in zip(names, bucket.gradients(), strict=True):
            self.local[name] = grad.detach().clone().cpu()
        event = {
            "index": bucket.index(),
            "numel": bucket.buffer().numel(),
            "params": names,
            "launched": time.time(),
        }
        self.buckets.append(event)
        return event

    def finished(self, event: dict[str, Any], reduced: torch.Tensor) -> None:
        """Note a finished all-reduce; keep copies of the averaged gradients."""
        event["finished"] = time.time()
        offset = 0
        for name in event["params"]:
            numel = self.local[name].numel()
            chunk = reduced[offset : offset + numel].detach().clone().cpu()
            self.synced[name] = chunk.reshape(self.local[name].shape)
            offset += numel

    def finish_step(self) -> None:
        """Record the step's gradients and buckets, then start the next step."""
        if not self.buckets:
            return
        record("grad_local", _flatten(self.local, self.order), self.step)
        record("grad_synced", _flatten(self.synced, self.order), self.step)
        record("buckets", {"buckets": self.buckets}, self.step)
        self.step += 1
        self.local, self.synced, self.buckets = {}, {}, []


def recording_allreduce_hook(
    state: GradientRecorder, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's default all-reduce hook, with recording around it."""
    event = state.launched(bucket)
    group = state.process_group or dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    future = dist.all_reduce(tensor, group=group, async_op=True).get_future()

    def record_result(fut: torch.futures.Future) -> torch.Tensor:
        reduced = fut.value()[0]
        state.finished(event, reduced)
        return reduced

    return future.then(record_result)


def _flatten(per_name: dict[str, torch.Tensor], order: Iterable[str]) -> torch.Tensor:
    return torch.cat([per_name[name].reshape(-1) for name in order if name in per_name])


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
