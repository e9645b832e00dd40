"""Find where the ranks' copies of a model stop being the same (runs in the ranks).

Under DDP every rank holds the same weights after every step, bit for bit (notebook 09). When a
bug breaks that (a layer left out of DDP, an optimizer step skipped on one rank, a buffer with
per-rank randomness, `no_sync` never left), `first_divergence` names the first parameter or
buffer whose copies differ, by how much, and on which ranks; `DivergenceWatch`, checked every
step, also names the first step.

Every rank must call them at the same point (they are collectives: an all_gather per tensor,
not counted by CollectiveCounter), and every rank gets the same answer. "Differ" means "not
equal" unless `atol` is given.
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
    copy (inf: a rank has no such tensor, or another shape), the ranks that differ from rank 0,
    and the step (DivergenceWatch)."""

    name: str
    max_diff: float
    ranks: list[int]
    step: int | None = None

    def __str__(self) -> str:
        when = f"step {self.step}: " if self.step is not None else ""
        how = "is missing or has another shape" if math.isinf(self.max_diff) else (
            f"differs from rank 0's copy (max |diff| {self.max_diff:.3g})")  # fmt: skip
        ranks = ", ".join(map(str, self.ranks))
        return f"{when}{self.name!r} {how} on rank{'s' if len(self.ranks) > 1 else ''} {ranks}"


def named_tensors(tensors: Tensors) -> list[tuple[str, torch.Tensor]]:
    """A model's parameters then buffers (`module.` of DDP dropped), or the named tensors."""
    if isinstance(tensors, nn.Module):
        model = getattr(tensors, "module", tensors)  # DDP's wrapped model: the same names
        return [*model.named_parameters(), *model.named_buffers()]
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    return list(items)


def first_divergence(tensors: Tensors, atol: float = 0.0) -> Divergence | None:
    """The first tensor (in the model's order) whose copies differ across ranks by more than
    `atol`, or None if every rank holds the same. A collective: call it on every rank."""
    named = named_tensors(tensors)
    world = dist.get_world_size()
    layouts: list = [None] * world
    uncounted("all_gather_object")(layouts, [(n, tuple(t.shape)) for n, t in named])
    for index, (name, _) in enumerate(layouts[0]):
        differ = [r for r in range(world) if index >= len(layouts[r])
                  or layouts[r][index] != layouts[0][index]]  # fmt: skip
        if differ:
            return Divergence(name, math.inf, differ)
    if any(len(layout) != len(layouts[0]) for layout in layouts):
        extra = [r for r in range(world) if len(layouts[r]) != len(layouts[0])]
        return Divergence(f"(tensors after {layouts[0][-1][0] if layouts[0] else 'none'})",
                          math.inf, extra)  # fmt: skip
    gather = uncounted("all_gather")
    for name, tensor in named:
        mine = tensor.detach().contiguous()
        copies = [torch.empty_like(mine) for _ in range(world)]
        gather(copies, mine)
        diffs = [(copy.double() - copies[0].double()).abs().max().item() if copy.numel()
                 else 0.0 for copy in copies]  # fmt: skip
        differ = [r for r, diff in enumerate(diffs) if diff > atol]
        if differ:
            return Divergence(name, max(diffs), differ)
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
