"""Find where the ranks' copies of a model stop being the same (runs in the ranks).

Under DDP every rank holds the same weights after every step, bit for bit (notebook 09). When a
bug breaks that (a layer left out of DDP, an optimizer step skipped on one rank, a buffer with
per-rank randomness, `no_sync` never left), `first_divergence` names the first parameter or
buffer whose copies differ, by how much, and on which ranks; `DivergenceWatch`, checked every
step, also names the first step.

Every rank must call them at the same point: they are collectives (an all_gather_object of the
names, shapes and dtypes, then an all_gather per tensor until one differs; not counted by
CollectiveCounter), and every rank gets the same answer. "Differ" means not the same bit for
bit unless `atol` is given; a NaN in one copy where rank 0's has none always differs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .traffic import uncounted

Tensors = nn.Module | Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class Divergence:
    """The first tensor whose copies differ: its name, the largest |difference| from rank 0's
    copy (nan: a NaN in some copies but not in the same places in rank 0's), the ranks that
    differ from rank 0, whether the difference is in the layout (a rank has no such tensor, or
    another shape or dtype: then there is no max_diff), and the step (DivergenceWatch)."""

    name: str
    max_diff: float
    ranks: list[int]
    step: int | None = None
    layout: bool = False

    def __str__(self) -> str:
        when = f"step {self.step}: " if self.step is not None else ""
        if self.layout:
            how = "is missing, or has another shape or dtype,"
        elif math.isnan(self.max_diff):
            how = "differs from rank 0's copy (NaN where the other copy has none)"
        else:
            how = f"differs from rank 0's copy (max |diff| {self.max_diff:.3g})"
        ranks = ", ".join(map(str, self.ranks))
        return f"{when}{self.name!r} {how} on rank{'s' if len(self.ranks) > 1 else ''} {ranks}"


def named_tensors(tensors: Tensors) -> list[tuple[str, torch.Tensor]]:
    """A model's parameters then buffers (`module.` of DDP dropped), or the named tensors."""
    if isinstance(tensors, nn.Module):
        model = getattr(tensors, "module", tensors)  # DDP's wrapped model: the same names
        return [*model.named_parameters(), *model.named_buffers()]
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    return list(items)


def difference(copy: torch.Tensor, ref: torch.Tensor, atol: float) -> float | None:
    """None if `copy` is the same as `ref` (bit for bit when atol is 0, else within atol, NaN
    where `ref` has NaN); else the max |difference| (nan if NaN is where `ref` has none)."""
    if atol == 0 and torch.equal(copy.view(torch.uint8), ref.view(torch.uint8)):
        return None
    a, b = copy.double(), ref.double()
    if not torch.equal(a.isnan(), b.isnan()):
        return math.nan
    both = ~a.isnan()
    gap = (a[both] - b[both]).abs()
    biggest = gap.max().item() if gap.numel() else 0.0
    if atol == 0:
        return biggest  # the bits differ, even if no value does (-0.0 and 0.0)
    return None if biggest <= atol else biggest


def first_divergence(tensors: Tensors, atol: float = 0.0) -> Divergence | None:
    """The first tensor (in the model's order) whose copies differ across ranks (bit for bit,
    or by more than `atol`), or None if every rank holds the same. A collective: call it on
    every rank, at the same point."""
    named = named_tensors(tensors)
    world = dist.get_world_size()
    layouts: list = [None] * world
    mine = [(n, tuple(t.shape), str(t.dtype)) for n, t in named]
    uncounted("all_gather_object")(layouts, mine)
    for index, (name, _, _) in enumerate(layouts[0]):
        differ = [r for r in range(world) if index >= len(layouts[r])
                  or layouts[r][index] != layouts[0][index]]  # fmt: skip
        if differ:
            return Divergence(name, math.nan, differ, layout=True)
    longer = [r for r in range(world) if len(layouts[r]) != len(layouts[0])]
    if longer:
        last = layouts[0][-1][0] if layouts[0] else "nothing"
        return Divergence(f"(tensors after {last})", math.nan, longer, layout=True)
    gather = uncounted("all_gather")
    for name, tensor in named:
        local = tensor.detach().contiguous()
        copies = [torch.empty_like(local) for _ in range(world)]
        gather(copies, local)
        gaps = {r: difference(copies[r], copies[0], atol) for r in range(1, world)}
        differ = sorted(r for r, gap in gaps.items() if gap is not None)
        if differ:
            found = [gaps[r] for r in differ]
            worst = math.nan if any(math.isnan(g) for g in found) else max(found)
            return Divergence(name, worst, differ)
    return None


class DivergenceWatch:
    """`check(step)` every step: the first divergence and the step it was first seen at (then
    kept: later steps only diverge further). A collective each step, until it finds one."""

    def __init__(self, tensors: Tensors, atol: float = 0.0) -> None:
        self.tensors, self.atol = tensors, atol
        self.first: Divergence | None = None

    def check(self, step: int) -> Divergence | None:
        if self.first is None:
            found = first_divergence(self.tensors, self.atol)
            if found is not None:
                self.first = dataclasses.replace(found, step=step)
        return self.first
