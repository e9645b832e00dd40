"""Check functions for the notebooks' exercises. Each prints a verdict and returns True/False
(None while the answer is still None), computing the right answer from real PyTorch objects."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from .backend import choose_backend
from .toy import make_model


def _number(answer: Any) -> float | None:
    """A numeric answer as a float: Python, numpy or a one-element tensor; None for anything
    else (a bool is not a number here: True is not the answer 1)."""
    if isinstance(answer, torch.Tensor):
        answer = answer.item() if answer.numel() == 1 else None
    if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, numbers.Real):
        return None
    return float(answer)


def _verdict(
    answer: Any,
    correct: Any,
    explain: str,
    close: bool = False,
    accept: Callable[[Any], bool] | None = None,
) -> bool | None:
    """Print and return whether `answer` is right: `accept`ed, or the same number (close to it
    with close=True, for floats), or equal."""
    if answer is None:
        print("Not answered yet: replace None with your answer and run the cell again.")
        return None
    if accept is not None:
        ok = bool(accept(answer))
    elif isinstance(correct, (int, float)) and not isinstance(correct, bool):
        number = _number(answer)
        ok = number is not None and (
            math.isclose(number, correct, rel_tol=1e-6) if close else number == correct
        )
    else:
        ok = answer == correct
    print(("Correct! " if ok else f"Not quite: you said {answer!r}. ") + explain)
    return ok


def _index_list(answer: Any) -> Any:
    """A list of indices as a list of ints, whatever held them; otherwise the answer as it is."""
    try:
        return [int(i) for i in answer]
    except (TypeError, ValueError):
        return answer


def check_rank_sum(world_size: int, answer: float | None) -> bool | None:
    """Intro: all_reduce(SUM) of each rank's own number: what does every rank print?"""
    correct = sum(range(world_size))
    return _verdict(answer, correct, f"0 + 1 + ... + {world_size - 1} = {correct} on every rank.")


def check_batch_count(size: int, batch_size: int, answer: int | None) -> bool | None:
    """Step 1: how many batches does a DataLoader make of `size` samples?"""
    correct = len(DataLoader(range(size), batch_size=batch_size))
    return _verdict(answer, correct, f"ceil({size} / {batch_size}) = {correct} batches.")


def check_shard(size: int, ranks: int, rank: int, answer: list[int] | None) -> bool | None:
    """Step 2: which indices does DistributedSampler (shuffle=False) give `rank`?"""
    sampler = DistributedSampler(range(size), num_replicas=ranks, rank=rank, shuffle=False)
    correct = list(sampler)
    if answer is not None:
        answer = _index_list(answer)
    explain = (
        f"rank {rank} takes every {ranks}th index from {rank} on; the list is first padded "
        "by repeating its start up to a multiple of the ranks."
    )
    return _verdict(answer, correct, explain)


def check_parameter_count(answer: int | None) -> bool | None:
    """Step 3: how many weights (numbers) does TinyNet have?"""
    correct = sum(p.numel() for p in make_model().parameters())
    return _verdict(answer, correct, "4x3 + 3 (hidden) + 3x1 + 1 (out) = 19.")


def check_broadcast_source(answer: int | None) -> bool | None:
    """Step 4: whose weights does every rank hold after DDP(model)?"""
    return _verdict(answer, 0, "DDP broadcasts rank 0's parameters and buffers when it wraps.")


def check_backend(nproc: int, gpus: int, answer: str | None) -> bool | None:
    """Step 5: which backend does ddp_kit choose for `nproc` ranks and `gpus` GPUs?"""
    choice = choose_backend(nproc, "auto", gpus=gpus)
    return _verdict(answer, choice.backend, choice.reason)


def check_global_batch(per_rank: int, ranks: int, answer: int | None) -> bool | None:
    """Step 6: how many samples go through the model per step, over all ranks?"""
    return _verdict(answer, per_rank * ranks, "batch_size is per rank: global = per rank x ranks.")


def check_average(local_values: list[float], answer: float | None) -> bool | None:
    """Step 7: the value of one gradient entry after DDP's all-reduce."""
    correct = float(torch.tensor(local_values, dtype=torch.float64).mean())
    explain = "DDP averages: sum over the ranks, divided by their number."
    return _verdict(answer, correct, explain, close=True)


def check_ring_traffic(megabytes: float, ranks: int, answer: float | None) -> bool | None:
    """Step 8: megabytes each rank sends in a ring all-reduce of `megabytes` of gradients."""
    correct = 2 * (ranks - 1) / ranks * megabytes
    return _verdict(answer, correct, f"2(N-1)/N x size = {correct:g} MB.", close=True)


def check_copies_identical(answer: bool | None) -> bool | None:
    """Step 9: with the same averaged gradients and the same optimizer, do the copies match?"""
    explain = "Same start, same gradient, same update: identical copies."
    return _verdict(answer, True, explain, accept=lambda a: isinstance(a, (bool, np.bool_)) and a)


def check_linear_lr(base_lr: float, ranks: int, answer: float | None) -> bool | None:
    """Step 10: the linear scaling rule for the learning rate with `ranks` times the batch."""
    explain = "Linear rule: lr x (global batch / base batch)."
    return _verdict(answer, base_lr * ranks, explain, close=True)


def check_epoch_fix(answer: str | None) -> bool | None:
    """Pitfalls: what makes DistributedSampler shuffle differently every epoch?"""
    explain = "Call sampler.set_epoch(epoch) at the start of every epoch."
    return _verdict(answer, None, explain, accept=lambda text: "set_epoch" in str(text))
