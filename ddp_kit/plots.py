"""Figures of a run's records: shards, gradient sync, weight equality, losses, buckets, ring.

Every function returns a matplotlib Figure (not attached to pyplot, so a notebook shows it
once, as the cell's result) and accepts a RunResult or its Records.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from .kernel.result import RunResult
from .shared.records import Records

RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


def show_figures_in(shell) -> None:
    """Let an IPython shell display a bare Figure (one not made with pyplot) as a PNG image."""
    from IPython.core.pylabtools import print_figure

    formatter = shell.display_formatter.formatters["image/png"]
    formatter.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


def rank_color(rank: int) -> str:
    """The colour every figure uses for `rank`."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def as_records(run: RunResult | Records) -> Records:
    """Accept either a RunResult or its Records."""
    return run.records if isinstance(run, RunResult) else run


def shard_map(
    run: RunResult | Records, name: str = "shard", dataset_size: int | None = None
) -> Figure:
    """Which rank gets which sample, one row per epoch; samples given twice: dashed outline."""
    shards = as_records(run)[name]  # [epoch, rank, i]
    epochs, world, _ = shards.shape
    size = dataset_size or int(shards.max()) + 1
    fig = Figure(figsize=(max(6.0, 0.35 * size + 1.5), 0.9 + 0.7 * epochs))
    ax = fig.add_subplot()
    owner = np.full((epochs, size), -1)
    for epoch in range(epochs):
        for rank in range(world):
            for sample in shards[epoch, rank]:
                if owner[epoch, sample] >= 0:
                    ax.add_patch(Rectangle((sample - 0.5, epoch - 0.5), 1, 1, fill=False,
                                           ec="black", ls="--", lw=2.5))  # fmt: skip
                    ax.text(sample, epoch + 0.32, f"+r{rank}", ha="center", fontsize=7)
                else:
                    owner[epoch, sample] = rank
    colors = ListedColormap(["white", *[rank_color(r) for r in range(world)]])
    ax.imshow(owner + 1, cmap=colors, vmin=0, vmax=world, aspect="auto")
    for epoch in range(epochs):
        for sample in range(size):
            if owner[epoch, sample] >= 0:
                ax.text(sample, epoch, str(sample), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(epochs), [f"epoch {e}" for e in range(epochs)])
    ax.set_xticks([])
    ax.set_xlabel("dataset index (colour = the rank that gets it; dashed box = padded duplicate)")
    handles = [Rectangle((0, 0), 1, 1, color=rank_color(r)) for r in range(world)]
    ax.legend(handles, [f"rank {r}" for r in range(world)], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), frameon=False)  # fmt: skip
    ax.set_title(f"DistributedSampler: {size} samples over {world} ranks")
    fig.tight_layout()
    return fig


def per_rank(values: Sequence[float], label: str, title: str = "") -> Figure:
    """One bar per rank (in the rank colours) and a line at their mean."""
    values = np.asarray(values, dtype=float).reshape(-1)
    ranks = range(len(values))
    fig = Figure(figsize=(5.0, 3.0))
    ax = fig.add_subplot()
    ax.bar(ranks, values, color=[rank_color(r) for r in ranks])
    ax.axhline(values.mean(), color="black", lw=2, label=f"mean of the ranks: {values.mean():.4g}")
    ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax.set_ylabel(label)
    ax.set_title(title or f"{label} on each rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def parameter_labels(records: Records, count: int) -> list[str]:
    """Names like 'hidden.weight[0,1]' for the first `count` entries of a flat vector."""
    if "param_layout" not in records:
        return [f"w{i}" for i in range(count)]
    labels = []
    for name, shape in records.get("param_layout", 0, 0)["params"]:
        for idx in np.ndindex(*shape) if shape else [()]:
            labels.append(f"{name}[{','.join(map(str, idx))}]")
    return labels[:count]


def gradient_sync(
    run: RunResult | Records, step: int = 0, params: Sequence[int] | None = None
) -> Figure:
    """Each rank's local gradient (bars), their mean (black line) and the synced gradient (x)."""
    records = as_records(run)
    local = records["grad_local"][step]  # [rank, n]
    synced = records["grad_synced"][step]
    index = list(params) if params is not None else list(range(min(8, local.shape[1])))
    world = local.shape[0]
    labels = np.array(parameter_labels(records, local.shape[1]))[index]
    fig = Figure(figsize=(max(6.0, 0.9 * len(index) + 2), 3.8))
    ax = fig.add_subplot()
    width = 0.8 / world
    x = np.arange(len(index))
    for rank in range(world):
        ax.bar(x - 0.4 + width * (rank + 0.5), local[rank, index], width,
               color=rank_color(rank), label=f"rank {rank} local")  # fmt: skip
    ax.hlines(local[:, index].mean(axis=0), x - 0.4, x + 0.4, colors="black", lw=2,
              label="mean of local gradients")  # fmt: skip
    ax.plot(x, synced[0, index], "x", color="black", ms=9, mew=2,
            label="after all-reduce (every rank)")  # fmt: skip
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("gradient")
    ax.set_title(f"Step {step}: local gradients differ; after all-reduce all ranks hold the mean")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def max_rank_difference(weights: np.ndarray) -> np.ndarray:
    """Per step, the largest |w_rank - w_rank0| over all ranks and weights ([step, rank, n])."""
    return np.abs(weights - weights[:, :1]).reshape(len(weights), -1).max(axis=1)


WEIGHT_LABELS = {"weights": "DDP (all-reduced)", "unsynced_weights": "under no_sync (never)"}


def weight_sync(
    run: RunResult | Records, names: Sequence[str] = ("weights", "unsynced_weights")
) -> Figure:
    """Largest weight difference between ranks per step: 0 with DDP, growing without sync."""
    records = as_records(run)
    fig = Figure(figsize=(6.0, 3.2))
    ax = fig.add_subplot()
    for name, style in zip(names, ("o-", "s--"), strict=False):
        if name in records:
            diff = max_rank_difference(records[name])
            label = f"{WEIGHT_LABELS.get(name, name)}: max {diff.max():.2g}"
            ax.plot(records.steps(name), diff, style, label=label)
    ax.set_yscale("symlog", linthresh=1e-8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("max |w_rank - w_rank0|")
    ax.set_title("Are the model copies identical?")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def loss_curves(
    run: RunResult | Records,
    name: str = "loss",
    reference: Sequence[float] | None = None,
    title: str = "Loss per step: each rank's shard, and the global batch",
) -> Figure:
    """Each rank's loss per step, the global loss (their mean) and an optional reference."""
    records = as_records(run)
    steps = records.steps(name)
    losses = records[name].reshape(len(steps), -1)  # [step, rank]
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.add_subplot()
    for rank in range(losses.shape[1]):
        ax.plot(steps, losses[:, rank], ".-", color=rank_color(rank), alpha=0.7,
                label=f"rank {rank} (its shard)")  # fmt: skip
    ax.plot(steps, losses.mean(axis=1), "k-", lw=2.5, label="global loss (mean of ranks)")
    if reference is not None:
        ax.plot(steps[: len(reference)], reference, "D", color="black", mfc="white", ms=7,
                label="single process, global batch")  # fmt: skip
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(name)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


BUCKET_COLORS = ["#bebada", "#8dd3c7", "#fdb462", "#80b1d3", "#fccde5", "#b3de69"]


def bucket_timeline(run: RunResult | Records, step: int = -1, prefix: str = "") -> Figure:
    """One time axis per rank for one backward: a tick when each gradient was ready (the
    backward computation) and a bar per bucket from its all-reduce's launch to its finish.
    With CUDA tensors (nccl) the times are the CPU's: a collective's future completes once
    it is queued on the GPU, so the bars end then, and the title says so."""
    records = as_records(run)
    name = prefix + "buckets"
    step = records.steps(name)[step]
    per_rank = [records.get(name, step, r) for r in range(records.world_size)]
    start = min(min(rank["ready"].values()) for rank in per_rank)
    lanes = max(len(rank["buckets"]) for rank in per_rank) + 1
    fig = Figure(figsize=(7.5, 0.8 + 0.35 * lanes * len(per_rank)))
    ax = fig.add_subplot()
    height = 0.85 / lanes
    for r, rank in enumerate(per_rank):
        top = r - 0.42
        ready_ms = [1000 * (t - start) for t in rank["ready"].values()]
        ax.plot(ready_ms, [top + height / 2] * len(ready_ms), "|", color="black", ms=10, mew=1.5)
        for b in rank["buckets"]:
            left = 1000 * (b["launched"] - start)
            width = max(1000 * (b["finished"] - b["launched"]), 0.02)
            y = top + height * (b["index"] + 1.5)
            ax.barh(y, width, left=left, height=height * 0.85, edgecolor="black", lw=0.5,
                    color=BUCKET_COLORS[b["index"] % len(BUCKET_COLORS)])  # fmt: skip
            what = f"{len(b['params'])} tensors, " if b["params"] else ""  # unknown: by hand
            ax.text(left + width, y, f" bucket {b['index']}: {what}{b['numel']:,} numbers",
                    va="center", fontsize=7)  # fmt: skip
    ax.set_yticks(range(len(per_rank)), [f"rank {r}" for r in range(len(per_rank))])
    ax.set_ylim(len(per_rank) - 0.5, -0.5)
    title = f"Step {step}: gradients ready in backward (ticks), bucket all-reduces (bars)"
    if any(b.get("device") == "cuda" for rank in per_rank for b in rank["buckets"]):
        # Work.get_future: "For GPU work, fut.done() returns true only whether the operation
        # has been enqueued". The GPU's own times are in the profiler's CUDA trace.
        ax.set_xlabel("ms since the first gradient was ready, on the CPU (under nccl a bar "
                      "ends once its all-reduce is queued on the GPU)")  # fmt: skip
        title += "\nCUDA tensors: the CPU's clock, not the GPU's"
    else:
        ax.set_xlabel("ms since the first gradient was ready (bars: a bucket's all-reduce in "
                      "flight)")  # fmt: skip
    ax.set_title(title)
    fig.tight_layout()
    return fig


def ring_allreduce_states(ranks: int) -> list[tuple[str, np.ndarray]]:
    """Ring all-reduce of `ranks` chunks: after each phase, how many ranks' values each
    (rank, chunk) holds. Reduce-scatter takes N-1 phases, all-gather N-1 more."""
    held = np.ones((ranks, ranks), dtype=int)  # [rank, chunk]
    states = [("start", held.copy())]
    for phase in range(ranks - 1):  # reduce-scatter: send chunk (r - phase) to r + 1, which adds
        new = held.copy()
        for rank in range(ranks):
            chunk = (rank - phase) % ranks
            new[(rank + 1) % ranks, chunk] += held[rank, chunk]
        held = new
        states.append((f"reduce-scatter {phase + 1}/{ranks - 1}", held.copy()))
    for phase in range(ranks - 1):  # all-gather: pass the finished chunk (r + 1 - phase) on
        new = held.copy()
        for rank in range(ranks):
            chunk = (rank + 1 - phase) % ranks
            new[(rank + 1) % ranks, chunk] = held[rank, chunk]
        held = new
        states.append((f"all-gather {phase + 1}/{ranks - 1}", held.copy()))
    return states


def ring_allreduce(ranks: int = 4) -> Figure:
    """The ring all-reduce as 2(N-1) phases; a cell's number = ranks summed into that chunk."""
    states = ring_allreduce_states(ranks)
    fig = Figure(figsize=(2.0 * len(states), 2.6))
    axes = fig.subplots(1, len(states))
    for ax, (title, held) in zip(axes, states, strict=True):
        ax.imshow(held, cmap="Greens", vmin=0, vmax=ranks)
        for (rank, chunk), count in np.ndenumerate(held):
            color = "white" if count == ranks else "black"
            ax.text(chunk, rank, str(count), ha="center", va="center", color=color, fontsize=9)
        ax.set_title(title, fontsize=8)
        ax.set_xticks(range(ranks), [f"c{c}" for c in range(ranks)], fontsize=7)
        ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)], fontsize=7)
    fig.suptitle(
        f"Ring all-reduce on {ranks} ranks: each rank sends 2(N-1)/N times its data, under 2x "
        "for any N",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
