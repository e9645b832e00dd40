"""Count what a rank asks torch.distributed's collectives to send, inside each rank.

PyTorch's Python-level users of collectives (DDP's communication hooks, ZeroRedundancyOptimizer,
FSDP2's fully_shard) call them as `torch.distributed.<name>(...)`. While a `CollectiveCounter`
is active those names are wrapped: each call is noted (which collective, how many elements, which
dtype) and then runs unchanged. DDP's built-in reducer calls the C++ process group directly, so
a DDP model is counted only through a registered hook (`default_hooks.allreduce_hook` does
what DDP does without one).

What is counted is each call's payload: the tensor handed to the collective by this rank. How
many bytes actually cross the wire per rank depends on the algorithm: `ring_bytes_per_rank`.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# collective name -> this rank's payload (the tensor it contributes): position, keyword.
# all_gather_single and reduce_scatter_single (what FSDP2 calls from torch 2.13) are absent from
# older torch, whose FSDP2 calls all_gather_into_tensor and reduce_scatter_tensor: a name this
# torch lacks is not wrapped.
COUNTED = {
    "all_reduce": (0, "tensor"),
    "broadcast": (0, "tensor"),
    "all_gather_into_tensor": (1, "input_tensor"),
    "all_gather_single": (1, "input_tensor"),
    "reduce_scatter_tensor": (1, "input"),
    "reduce_scatter_single": (1, "input"),
}


@dataclass
class Call:
    """One collective call: its name, the payload's element count and dtype."""

    op: str
    numel: int
    dtype: str
    element_size: int

    @property
    def bytes(self) -> int:
        return self.numel * self.element_size


@dataclass
class CollectiveCounter:
    """A context manager that notes every counted collective called while it is active."""

    calls: list[Call] = field(default_factory=list)
    _originals: dict[str, Callable] = field(default_factory=dict, repr=False)

    def __enter__(self) -> CollectiveCounter:
        for op, payload in COUNTED.items():
            original = getattr(dist, op, None)
            if original is None:  # a collective of a newer torch
                continue
            self._originals[op] = original
            setattr(dist, op, self._counting(op, *payload, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for op, original in self._originals.items():
            setattr(dist, op, original)
        self._originals.clear()

    def _counting(self, op: str, index: int, keyword: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:  # marked below: see uncounted()
            payload = args[index] if len(args) > index else kwargs.get(keyword)
            if isinstance(payload, torch.Tensor):
                self.calls.append(
                    Call(op, payload.numel(), str(payload.dtype), payload.element_size())
                )
            return original(*args, **kwargs)

        counted.ddp_kit_counter = True  # type: ignore[attr-defined]
        return counted

    @property
    def bytes(self) -> int:
        """Payload bytes of every call so far."""
        return sum(call.bytes for call in self.calls)

    def bytes_by_op(self) -> dict[str, int]:
        """Payload bytes per collective name."""
        totals: Counter[str] = Counter()
        for call in self.calls:
            totals[call.op] += call.bytes
        return dict(totals)

    def dtypes(self) -> list[str]:
        """The dtypes that were sent, each once, sorted."""
        return sorted({call.dtype.removeprefix("torch.") for call in self.calls})


def uncounted(op: str) -> Callable:
    """torch.distributed's `op` as it is without any active counter (for reference sums)."""
    function = getattr(dist, op)
    while getattr(function, "ddp_kit_counter", False):  # only the counters' own wrappers
        function = function.__wrapped__
    return function


def ring_bytes_per_rank(op: str, payload_bytes: float, world_size: int) -> float:
    """Bytes one rank sends (and receives) for a call with this payload, in a ring.

    all_reduce: a reduce-scatter then an all-gather of N chunks -> 2 (N-1)/N x payload.
    reduce_scatter: (N-1)/N x payload. all_gather: every rank's payload (its shard) reaches the
    N-1 others -> (N-1) x payload. (Broadcast depends on the algorithm: not given here.)
    """
    n = world_size
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "reduce_scatter_tensor": (n - 1) / n,
        "reduce_scatter_single": (n - 1) / n,
        "all_gather_into_tensor": n - 1,
        "all_gather_single": n - 1,
    }
    if op not in factors:
        raise ValueError(f"no ring formula for {op!r}; known: {', '.join(factors)}")
    return factors[op] * payload_bytes
