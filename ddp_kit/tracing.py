"""Merge the ranks' torch.profiler traces into one, and measure how much communication hides.

Terms
-----
trace          a Chrome trace as a dict: what `json.load` reads from the file a rank wrote with
               `torch.profiler.profile(...).export_chrome_trace(path)`. Its "traceEvents" are
               dicts with a phase "ph" ("X": a complete event, with "ts" and "dur" in
               microseconds; "M": metadata such as a process's name), a "pid" and a "tid".
merged trace   the ranks' traces in one (`merge`): rank r is process r, on one time axis.
main thread    the thread that runs a rank's forward and backward (its Python thread; on CPU.
               With CUDA, backward runs on autograd's device thread: this module is for gloo
               traces of CPU training).
compute        the main thread's top-level operators (`cpu_op` events nested in no other),
               less the time they spent launching a collective (`spans`).
communication  the collectives' events: names starting "gloo:" or "nccl:". With gloo they run
               on gloo's own threads for their real duration; with nccl and CPU profiling only,
               they mark the launch, not the transfer on the GPU.
overlap share  the part of the communication time during which compute runs too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
LAUNCH_PREFIX = "c10d::"  # the main thread's call that hands a collective to the backend
DDP_FORWARD = "DistributedDataParallel.forward"
PROCESS_METADATA = ("process_name", "process_sort_index")  # merge writes its own

Interval = tuple[float, float]


def merge(traces: Sequence[dict]) -> dict:
    """One Chrome trace of every rank's.

    Rank r's events get pid r (named "rank r", sorted r-th); their tids are kept. The rank is
    trace["distributedInfo"]["rank"] when present, else the trace's position in the list.
    Times are aligned across ranks by each trace's baseTimeNanoseconds (the ranks share one
    machine and so one clock) and shifted so that the earliest event is at 0 us.
    """
    numbers = [trace.get("distributedInfo", {}).get("rank", i) for i, trace in enumerate(traces)]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"two traces of the same rank: ranks {numbers}")
    bases = [int(trace.get("baseTimeNanoseconds", 0)) for trace in traces]
    first = min(bases, default=0)
    events = []
    for rank, base, trace in zip(numbers, bases, traces, strict=True):
        offset = (base - first) / 1000
        events += [_moved(event, rank, offset) for event in trace["traceEvents"] if _kept(event)]
    start = min((e["ts"] for e in events if "ts" in e and e.get("ph") != "M"), default=0.0)
    for event in events:
        if "ts" in event:
            event["ts"] = 0.0 if event.get("ph") == "M" else round(event["ts"] - start, 3)
    for rank in sorted(numbers):
        events.append(_metadata("process_name", rank, {"name": f"rank {rank}"}))
        events.append(_metadata("process_sort_index", rank, {"sort_index": rank}))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": first + round(start * 1000),
    }


def _kept(event: dict) -> bool:
    """Every event but a rank's own process name and sort index (merge gives its own)."""
    return not (event.get("ph") == "M" and event.get("name") in PROCESS_METADATA)


def _moved(event: dict, rank: int, offset: float) -> dict:
    """A copy of `event` in process `rank`, `offset` us later. Flow events ("s", "t", "f")
    link by id across processes, so a flow's id is made unique to its rank."""
    event = {**event, "pid": rank}
    if "ts" in event:
        event["ts"] += offset
    if event.get("ph") in ("s", "t", "f") and isinstance(event.get("id"), int):
        event["id"] += rank << 32
    return event


def _metadata(name: str, rank: int, args: dict) -> dict:
    return {"ph": "M", "name": name, "pid": rank, "tid": 0, "ts": 0.0, "args": args}


def from_records(records, name: str, which: int = -1) -> dict:
    """The merged trace of what the ranks recorded under `name` (`%%ranks --profile NAME`, or
    ddp_kit.profiling.profiled(NAME) in a script): each rank's `which`-th trace of that name
    (default: its last), for every rank that recorded one (`%%ranks --on 0 --profile` profiles
    only rank 0)."""
    traces = []
    for rank, recorded in enumerate(records.per_rank):
        steps = sorted(recorded.get(name, {}))
        if steps:
            traces.append(records.get(name, steps[which], rank))
    if not traces:
        raise ValueError(f"no rank recorded a trace named {name!r}")
    return merge(traces)


def save(trace: dict, path) -> Path:
    """Write `trace` as JSON to `path`; it opens in Perfetto (ui.perfetto.dev) and in
    chrome://tracing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace))
    return path


def spans(trace: dict, rank: int) -> dict[str, list[Interval]]:
    """{"compute": [...], "communication": [...]}: (start_us, end_us) of a merged trace's rank.

    communication: the collectives' events, on any thread. compute: the main thread's cpu_op
    events nested in no other cpu_op, less the time of the collectives' launches within them
    (names starting "c10d::": DDP launches a bucket's all-reduce inside the
    `autograd::engine::evaluate_function: AccumulateGrad` range of the gradient after which it
    can be launched, it and every earlier bucket being complete; handing it to gloo is not
    computing). The main thread is the one of
    the "DistributedDataParallel.forward" annotation when there is one, else the one with the
    most cpu_op time. For gloo traces only: ValueError for nccl's, whose CPU events mark only
    the launches (profile the GPU's kernels, and use Holistic Trace Analysis).
    """
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid") == rank]
    communication = [_interval(e) for e in events if e["name"].startswith(COLLECTIVE_PREFIXES)]
    if any(e["name"].startswith("nccl:") for e in events):
        raise ValueError(
            "an nccl trace: its CPU events mark only the collectives' launches, so this "
            "overlap would mean nothing; profile with ProfilerActivity.CUDA and analyse the "
            "GPU kernels (Holistic Trace Analysis does)"
        )
    main = _main_thread(events)
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == main]
    launches = [_interval(e) for e in ops if e["name"].startswith(LAUNCH_PREFIX)]
    top = [_interval(e) for e in _top_level(ops) if not e["name"].startswith(LAUNCH_PREFIX)]
    return {"compute": _subtract(_union(top), _union(launches)),
            "communication": sorted(communication)}  # fmt: skip


def _interval(event: dict) -> Interval:
    return (event["ts"], event["ts"] + event.get("dur", 0.0))


def _main_thread(events: list[dict]):
    """The tid of the DDP forward annotation, else the tid with the most cpu_op time."""
    for event in events:
        if event["name"] == DDP_FORWARD:
            return event["tid"]
    busy: dict = {}
    for event in events:
        if event.get("cat") == "cpu_op":
            busy[event["tid"]] = busy.get(event["tid"], 0.0) + event.get("dur", 0.0)
    return max(busy, key=busy.get, default=None)


def _top_level(events: list[dict]) -> list[dict]:
    """The events of one thread that start after every earlier one has ended."""
    top, end = [], float("-inf")
    for event in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0.0))):
        start, stop = _interval(event)
        if start >= end:
            top.append(event)
            end = stop
    return top


def overlap_share(compute: Sequence[Interval], communication: Sequence[Interval]) -> float:
    """The time during which communication runs while compute runs too, over all communication
    time: Holistic Trace Analysis's formula for comm/comp overlap (which HTA applies to GPU
    kernels; here, to a CPU trace's events). Each list is first taken as the
    union of its intervals (time two of them share counts once). From 0.0 (nothing hidden) to
    1.0 (all of it hidden); ValueError if there is no communication."""
    total = _length(_union(communication))
    if total <= 0:
        raise ValueError("no communication: the overlap share is undefined")
    return _intersection_length(_union(compute), _union(communication)) / total


def _union(intervals: Sequence[Interval]) -> list[Interval]:
    """The sorted, disjoint intervals that cover the same time as `intervals`."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def _subtract(union: Sequence[Interval], holes: Sequence[Interval]) -> list[Interval]:
    """The parts of a union (sorted, disjoint) outside the holes (sorted, disjoint)."""
    kept: list[Interval] = []
    for start, end in union:
        for hole_start, hole_end in holes:
            if hole_end <= start or hole_start >= end:
                continue
            if hole_start > start:
                kept.append((start, hole_start))
            start = max(start, hole_end)
        if start < end:
            kept.append((start, end))
    return kept


def _length(union: Sequence[Interval]) -> float:
    return sum(end - start for start, end in union)


def _intersection_length(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """The time two unions (sorted, disjoint) share."""
    shared, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        shared += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def ranks(trace: dict) -> list[int]:
    """The ranks of a merged trace: the pids of its events that are numbers."""
    return sorted({e["pid"] for e in trace["traceEvents"] if isinstance(e.get("pid"), int)})


def timeline(trace: dict) -> Figure:
    """A row per rank of a merged trace: its compute and its communication as bars over ms
    since the trace's start; each row's title gives the rank's overlap share."""
    from .plots import RANK_COLORS  # the other figures' rank colours (a notebook-side import)

    world = ranks(trace)
    fig = Figure(figsize=(8.0, 0.6 + 1.2 * len(world)))
    axes = fig.subplots(len(world), 1, sharex=True, squeeze=False)[:, 0]
    for ax, rank in zip(axes, world, strict=True):
        lanes = spans(trace, rank)
        color = RANK_COLORS[rank % len(RANK_COLORS)]
        for y, name, face in ((1, "compute", color), (0, "communication", "#444444")):
            bars = [(start / 1000, (end - start) / 1000) for start, end in lanes[name]]
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=face)
        ax.set_yticks([1, 0], ["compute", "communication"], fontsize=8)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(f"rank {rank}: {_share_text(lanes)}", fontsize=9)
    axes[-1].set_xlabel("ms since the trace's start")
    fig.suptitle("Compute (main thread) and collectives, per rank", fontsize=10)
    fig.tight_layout()
    return fig


def _share_text(lanes: dict[str, list[Interval]]) -> str:
    if not lanes["communication"]:
        return "no communication"
    share = overlap_share(lanes["compute"], lanes["communication"])
    return f"{share:.0%} of the communication time overlaps compute"
