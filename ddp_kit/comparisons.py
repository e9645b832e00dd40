"""Figures that put variants of one training side by side (the lessons after the ten steps):
communication hooks, sharded memory, precision.

Like ddp_kit.plots, every function returns a matplotlib Figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

VARIANT_STYLES = [
    ("black", "-"),
    ("#1f77b4", "--"),
    ("#d62728", "-."),
    ("#2ca02c", ":"),
    ("#9467bd", "-"),
]
MEMORY_PARTS = {
    "params": "#4c72b0",
    "grads": "#dd8452",
    "buckets": "#c44e52",  # DDP's flat copy of the gradients
    "optimizer": "#55a868",
}


def variant_losses(
    losses: Mapping[str, Sequence[float]], title: str = "", xlabel: str = "step"
) -> Figure:
    """One loss curve per variant, each in its own colour and line style."""
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.add_subplot()
    for (name, values), (color, style) in zip(losses.items(), VARIANT_STYLES, strict=False):
        ax.plot(range(len(values)), values, style, color=color, lw=1.8, label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("global loss (mean over ranks)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def hook_tradeoff(
    sent_bytes: Mapping[str, float], errors: Mapping[str, float], floor: float = 1e-7
) -> Figure:
    """Bytes each rank hands to all-reduce per step against the synced gradient's error."""
    fig = Figure(figsize=(6.0, 3.6))
    ax = fig.add_subplot()
    for (name, sent), (color, _) in zip(sent_bytes.items(), VARIANT_STYLES, strict=False):
        error = errors[name]
        ax.scatter(sent, max(error, floor), s=70, color=color, zorder=3)
        label = f"  {name}\n  {error:.1e}" if error > 0 else f"  {name}\n  exact (0)"
        ax.annotate(label, (sent, max(error, floor)), fontsize=8, va="center")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(min(sent_bytes.values()) / 2, max(sent_bytes.values()) * 4)
    ax.set_xlabel("bytes all-reduced per step, per rank (log)")
    ax.set_ylabel("|synced - exact average| / |exact|")
    ax.set_title("Fewer bytes, larger gradient error")
    fig.tight_layout()
    return fig


def memory_per_rank(usage: Mapping[str, Sequence[Mapping[str, int]]]) -> Figure:
    """Stacked bars: each variant's parameters, gradients, DDP buckets and optimizer state on
    each rank (a part a variant does not report counts 0)."""
    variants = list(usage)
    world = len(next(iter(usage.values())))
    fig = Figure(figsize=(7.0, 3.6))
    ax = fig.add_subplot()
    width = 0.8 / world
    for v, name in enumerate(variants):
        for rank, parts in enumerate(usage[name]):
            x = v + (rank - (world - 1) / 2) * width
            bottom = 0.0
            for part, color in MEMORY_PARTS.items():
                kib = parts.get(part, 0) / 1024
                label = part if v == 0 and rank == 0 else None
                ax.bar(x, kib, width * 0.9, bottom=bottom, color=color, label=label)
                bottom += kib
            ax.text(x, bottom, f"r{rank}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(variants)), variants)
    ax.set_ylabel("KiB on each rank")
    ax.set_title("What each rank holds (bars: ranks 0, 1, ...)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def join_rounds(batches: Sequence[int], rounds: int) -> Figure:
    """Under Join: per rank, the all-reduce rounds it trained in and those it shadowed."""
    world = len(batches)
    fig = Figure(figsize=(6.0, 0.8 + 0.5 * world))
    ax = fig.add_subplot()
    for rank, own in enumerate(batches):
        for r in range(rounds):
            trained = r < own
            ax.barh(rank, 0.9, left=r - 0.45, color="#2ca02c" if trained else "white",
                    edgecolor="black", hatch=None if trained else "//")  # fmt: skip
            ax.text(r, rank, "batch" if trained else "zeros", ha="center", va="center",
                    fontsize=8)  # fmt: skip
    ax.set_yticks(range(world), [f"rank {r}" for r in range(world)])
    ax.set_xticks(range(rounds))
    ax.invert_yaxis()
    ax.set_xlabel("all-reduce round (one per training step of the busiest rank)")
    ax.set_title("Join: green = a real batch, hatched = shadowing with zeros")
    fig.tight_layout()
    return fig


def speedup(epoch_seconds: Mapping[str, Mapping[int, float]]) -> Figure:
    """Speedup over one rank (time of 1 rank / time of n ranks) per model, with the ideal n."""
    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.add_subplot()
    sizes = sorted({n for times in epoch_seconds.values() for n in times})
    ax.plot(sizes, sizes, ":", color="grey", label="ideal: n ranks, n times faster")
    for (name, times), (color, style) in zip(epoch_seconds.items(), VARIANT_STYLES, strict=False):
        ranks = sorted(times)
        ax.plot(ranks, [times[1] / times[n] for n in ranks], style, marker="o", color=color,
                label=name)  # fmt: skip
    ax.set_xticks(sizes)
    ax.set_xlabel("ranks")
    ax.set_ylabel("speedup over 1 rank")
    ax.set_title("Time per epoch: 1 rank / n ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def exposed_by_cap(
    caps: Sequence[float],
    measured: Mapping[float, float],
    predicted: Mapping[float, float],
    title: str = "Exposed communication per step",
) -> Figure:
    """Exposed communication (s) against bucket_cap_mb: measured points, the model's line."""
    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.add_subplot()
    ax.plot(caps, [1e3 * predicted[c] for c in caps], "--", color="grey", marker="x",
            label="model (costmodel.exposed_communication)")  # fmt: skip
    ax.plot(caps, [1e3 * measured[c] for c in caps], "o-", color="#1f77b4", label="measured")
    ax.set_xscale("log")
    ax.set_xticks(caps, [f"{c:g}" for c in caps])
    ax.set_ylim(bottom=0)
    _label(ax, "bucket_cap_mb (MiB)", "exposed communication (ms)", title)
    fig.tight_layout()
    return fig


def alpha_beta(
    sizes: Sequence[float], seconds: Mapping[int, Sequence[float]], fits: Mapping[int, Any]
) -> Figure:
    """Left: all-reduce time against size per number of ranks (points) with each alpha-beta
    fit (lines), log-log. Right: the bus bandwidth of each point (nccl-tests' busbw)."""
    from .costmodel import busbw

    fig = Figure(figsize=(10, 3.6))
    left, right = fig.subplots(1, 2)
    sizes = np.asarray(sizes, dtype=float)
    line = np.geomspace(sizes.min(), sizes.max(), 100)
    for (ranks, times), (color, _) in zip(seconds.items(), VARIANT_STYLES[1:], strict=False):
        times = np.asarray(times, dtype=float)
        left.loglog(sizes, times, "o", color=color, label=f"{ranks} ranks, measured")
        left.loglog(line, fits[ranks].seconds(line), "-", color=color, lw=1,
                    label=f"fit: {fits[ranks]}")  # fmt: skip
        right.semilogx(sizes, busbw(sizes, times, ranks) / 1e6, "o-", color=color,
                       label=f"{ranks} ranks")  # fmt: skip
    _label(left, "bytes per rank (S)", "seconds per all-reduce", "t(S) = alpha + beta x S")
    _label(right, "bytes per rank (S)", "busbw (MB/s)", "Bus bandwidth: S / t x 2(N-1)/N")
    fig.tight_layout()
    return fig


def _label(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    """Name an axes' axes and title, and show its legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
