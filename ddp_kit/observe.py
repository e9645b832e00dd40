"""Instrumentation used inside workers: record what a REAL DDP run does on each rank.

Nothing here re-implements DDP. The gradient recorder is a DDP communication hook: DDP calls it
with each bucket of local gradients, it records them, calls a real PyTorch hook (by default
`allreduce_hook`, which divides by the world size and all-reduces the sum, as DDP does without
a hook) and records the reduced result.
(No `from __future__ import annotations` here: DDP checks the hook's `bucket` annotation at
run time and needs the real dist.GradBucket class.)
"""

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .traffic import uncounted
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

    It wraps a real hook, PyTorch's `default_hooks.allreduce_hook` unless `hook` names another
    (fp16_compress_hook, powerSGD_hook with its `state`, ...): DDP calls the recorder, the
    recorder copies the bucket's local gradients, calls `hook(state, bucket)` and copies what it
    returns. Per step it records ``grad_local`` and ``grad_synced`` (flat, in
    model.parameters() order) and ``buckets`` (per bucket: index, size, dtype, parameter names,
    launch and finish times; and ``ready``: when backward produced each gradient). With
    ``exact=True`` it also records ``grad_exact``: the plain average of the local gradients (an
    all-reduce of a copy, which no counter sees), to measure a compressing hook's error against.
    `prefix` goes before every record name (to record several models). DDP takes one hook per
    model: to record, pass yours here.
    """

    def __init__(
        self,
        ddp_model: nn.parallel.DistributedDataParallel,
        hook: Callable[..., torch.futures.Future] = default_hooks.allreduce_hook,
        state: Any = None,
        exact: bool = False,
        prefix: str = "",
    ) -> None:
        self.prefix = prefix
        self.process_group = ddp_model.process_group
        self.hook, self.hook_state, self.exact = hook, state, exact
        self.names = {id(p): n for n, p in ddp_model.module.named_parameters()}
        self.order = [n for n, _ in ddp_model.module.named_parameters()]
        self.step = 0
        self.local: dict[str, torch.Tensor] = {}
        self.synced: dict[str, torch.Tensor] = {}
        self.averaged: dict[str, torch.Tensor] = {}
        self.buckets: list[dict[str, Any]] = []
        self.ready: dict[str, float] = {}
        for name, param in ddp_model.module.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._ready_hook(name))
        ddp_model.register_comm_hook(self, recording_hook)
        before_flush(self.finish_step)

    def launched(self, bucket: dist.GradBucket) -> dict[str, Any]:
        """Note a bucket about to be all-reduced; keep copies of its local gradients."""
        if bucket.index() == 0 and self._step_done():
            self.finish_step()
        names = [self.names[id(p)] for p in bucket.parameters()]
        for name, grad in zip(names, bucket.gradients(), strict=True):
            self.local[name] = grad.detach().clone().cpu()
        if self.exact:
            self._split_into(self.averaged, names, self._exact_average(bucket.buffer()))
        event = {
            "index": bucket.index(),
            "numel": bucket.buffer().numel(),
            "dtype": str(bucket.buffer().dtype).removeprefix("torch."),
            "device": bucket.buffer().device.type,
            "params": names,
            "last": bucket.is_last(),
            "launched": time.time(),
        }
        self.buckets.append(event)
        return event

    def finished(self, event: dict[str, Any], reduced: torch.Tensor) -> None:
        """Note a finished all-reduce; keep copies of the averaged gradients."""
        event["finished"] = time.time()
        self._split_into(self.synced, event["params"], reduced)

    def finish_step(self) -> None:
        """Record the step's gradients and buckets, then start the next step."""
        if not self.buckets:
            return
        named = {"grad_local": self.local, "grad_synced": self.synced}
        if self.exact:
            named["grad_exact"] = self.averaged
        for name, grads in named.items():
            record(self.prefix + name, _flatten(grads, self.order), self.step)
        record(self.prefix + "buckets", {"buckets": self.buckets, "ready": self.ready}, self.step)
        self.step += 1
        self.local, self.synced, self.averaged, self.buckets, self.ready = {}, {}, {}, [], {}

    def _ready_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def note_ready(_param: torch.Tensor) -> None:
            if self._step_done():  # the first gradient of a new backward
                self.finish_step()
            self.ready[name] = time.time()

        return note_ready

    def _step_done(self) -> bool:
        """Whether this step's last bucket was launched and every bucket has come back."""
        launched_all = any(b["last"] for b in self.buckets)
        return launched_all and all("finished" in b for b in self.buckets)

    def _exact_average(self, buffer: torch.Tensor) -> torch.Tensor:
        group = self.process_group or dist.group.WORLD
        total = buffer.detach().clone()
        uncounted("all_reduce")(total, group=group)
        return total / dist.get_world_size(group)

    def _split_into(
        self, target: dict[str, torch.Tensor], names: list[str], flat: torch.Tensor
    ) -> None:
        offset = 0
        for name in names:
            numel = self.local[name].numel()
            chunk = flat[offset : offset + numel].detach().clone().cpu()
            target[name] = chunk.reshape(self.local[name].shape)
            offset += numel


def recording_hook(
    state: GradientRecorder, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The recorder's hook: copy the bucket, run the real hook, copy what it returns."""
    event = state.launched(bucket)
    future = state.hook(state.hook_state, bucket)

    def record_result(fut: torch.futures.Future) -> torch.Tensor:
        value = fut.value()
        reduced = value[0] if isinstance(value, list) else value
        state.finished(event, reduced)
        return reduced

    return future.then(record_result)


def _flatten(per_name: dict[str, torch.Tensor], order: Iterable[str]) -> torch.Tensor:
    return torch.cat([per_name[name].reshape(-1) for name in order if name in per_name])


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class _WatchedWork:
    """An asynchronous all_reduce's Work as AllReduceTimeline hands it back: the same, but its
    first wait() is noted in the call (`waited`), so a wait inside backward can be told."""

    def __init__(self, work: Any, call: dict[str, Any]) -> None:
        self._work, self._call = work, call

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._call.setdefault("waited", time.time())
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class AllReduceTimeline:
    """Watch data parallelism written by hand, as GradientRecorder watches DDP.

        timeline = AllReduceTimeline(model, prefix="mine/")  # before the code under watch
        sync = MyDDP(model)                                    # registers its own hooks
        with timeline.step(0):
            loss.backward(); sync.finish()

    Made before the code it watches, its post-accumulate-grad hooks (one per parameter) run
    before that code's (PyTorch runs a tensor's hooks in the order they were registered), so
    each gradient's ready time is noted before the all-reduce it may start. Inside
    `step(n)`, every `dist.all_reduce` call is timed: when it started and when it finished (an
    asynchronous one, `async` noted: when its future completed; its Work's first wait(), if
    any, is noted as `waited`). At the end of the block it records
    ``buckets`` under `prefix` at step n, in GradientRecorder's format, so that
    plots.bucket_timeline draws both alike; here a "bucket" is one all_reduce call, whatever
    tensor it was given (its `params` are not known: empty).
    """

    def __init__(self, model: nn.Module, prefix: str = "") -> None:
        self.prefix = prefix
        self.ready: dict[str, float] = {}
        for name, param in _unwrap(model).named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._noter(name))

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Time the all_reduce calls of one step; record them with the ready times."""
        self.ready = {}
        calls: list[dict[str, Any]] = []
        noted: list[tuple[dict[str, Any], Any, torch.futures.Future]] = []
        original = dist.all_reduce

        def timed(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            call = {"index": len(calls), "numel": tensor.numel(), "params": [],
                    "dtype": str(tensor.dtype).removeprefix("torch."), "last": False,
                    "device": tensor.device.type, "launched": time.time()}  # fmt: skip
            calls.append(call)
            work = original(tensor, *args, **kwargs)
            call["async"] = work is not None
            if work is None:  # a blocking call has finished when it returns
                call["finished"] = time.time()
                return None
            done = work.get_future().then(lambda _: call.__setitem__("finished", time.time()))
            noted.append((call, work, done))
            return _WatchedWork(work, call)

        dist.all_reduce = functools.wraps(original)(timed)
        try:
            yield
        finally:
            dist.all_reduce = original
        unfinished = [call["index"] for call, work, _ in noted if not work.get_future().done()]
        if unfinished:
            raise RuntimeError(
                f"all_reduce call(s) {unfinished} had not finished when the block ended: "
                "wait for every asynchronous all_reduce inside the block"
            )
        for _, _, done in noted:
            done.wait()  # its callback has noted the time (it may run just after work.wait())
        if calls:
            calls[-1]["last"] = True
        record(self.prefix + "buckets", {"buckets": calls, "ready": self.ready}, step)

    def _noter(self, name: str) -> Callable[[torch.Tensor], None]:
        def note_ready(_param: torch.Tensor) -> None:
            self.ready[name] = time.time()

        return note_ready
