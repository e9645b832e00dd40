"""ddp_kit: watch PyTorch DistributedDataParallel work, step by step, on real torchrun runs.

Definitions (the vocabulary every module keeps to)
--------------------------------------------------
kernel   the notebook's Python process (a Jupyter kernel, or any Python program using the kit);
         it starts runs and shows what they did.
rank     one of the processes that run the student's code, numbered 0 .. world size - 1; torchrun
         starts it and passes RANK, LOCAL_RANK and WORLD_SIZE. (WorkerError: a rank failed.)
agent    the torchrun process of one node, which starts that node's ranks and watches them.
node     one machine of a job: every node on 127.0.0.1 (--nnodes starts several agents), or one
         per host.
host     another machine that runs one node, reached by ssh (launch(hosts=..., launcher="ssh"):
         kernel.hosts).
backend  the process group's communication library: "gloo" (CPU) or "nccl" (one GPU per rank).
         worker.backend() is the string init_process_group takes for it. (A check of a machine
         with too few GPUs can ask for gloo on the GPUs, shared: DDP_KIT_SHARED_GPU=1.)
run      one torchrun job, with its private run directory (shared.contract gives its layout).
launch   a one-shot run: ranks start, run a script (or a %%torchrun cell) and end.
session  a run whose ranks stay up between cells (Session, %ranks); a cell runs in one
         persistent namespace per rank.
cell     code sent to a session's ranks (%%ranks), or the code of a %%torchrun launch.
record   a value a rank saved with worker.record(name, value, step), read back as Records.
fork server  a process of the kernel's that has imported torch once and forks the agents and
         ranks of a fast start (kernel.fast_start); over hosts, one on each host for the
         launch, started by rank.remote; DDP_KIT_FAST_START=0 turns it off.
relay    what torchrun (or the kernel, for an agent; rank.remote, on a host) starts in a
         fast start: it hands its command to the fork server and stands in for the forked
         process, passing signals on and ending as it ends.

Where each module runs (the path answers "does this run in the kernel or in the ranks?")
-----------------------------------------------------------------------------------------
In the ranks, imported by the students' code:
    worker   rank(), backend(), device(), record()    observe  DDP comm-hook recorder
    traffic  CollectiveCounter                          scratch  data parallelism by hand
    toy      the lessons' data and models              speedup  epoch timing on n ranks
    divergence  first_divergence, DivergenceWatch: where the ranks' models stop agreeing
    link     an emulated slow network link (a comm hook)  profiling  profiled(): a rank's trace
In the notebook, imported by the lessons:
    plots, comparisons  figures          widgets    StepExplorer        exercises  checks
    reference  the one-process run       environment  this machine
    tracing  the ranks' profiler traces merged, the overlap share
In both:
    costmodel  the alpha-beta model of an all-reduce, the bucket overhead model
    facts    asserted facts (same_bits, same_up_to_rounding, within): in cells and in ranks
kernel/   the kit's machinery in the kernel: launch, session, channel, magic, torchrun (plumbing),
          fast_start, output, progress, diagnose, result, script, backend, hosts (a launch
          over several hosts, by ssh)
rank/     what runs below the kernel: agent (torchrun that dies with the kernel), runner (a rank's
          bootstrap), server (a live rank's loop), groups (destroyed process groups freed
          safely), waits (a bound on waits torch ends late), where (a live cell's position);
          forkserver and relay (the fast start: the kernel starts the server and the agent's
          relay, torchrun the ranks' relays); on another host: probe (what the host runs) and
          remote (the host's agent, and its fork server, ended when its ssh goes)
shared/   what both sides read and write: contract (the seam: variables, run directory,
          messages), records, failures, markers, errors, processes, torch_build (torch's
          version and GPU count, without importing it where that can be told)

Modules that run in a rank never import kernel/ (a test checks it), and importing ddp_kit
imports nothing else: the public names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "BackendChoice": "kernel.backend",
    "choose_backend": "kernel.backend",
    "CellResult": "kernel.result",
    "RunResult": "kernel.result",
    "Session": "kernel.session",
    "launch": "kernel.launch",
    "DDPKitError": "shared.errors",
    "LaunchConfigError": "shared.errors",
    "LaunchTimeout": "shared.errors",
    "RecordError": "shared.errors",
    "WorkerError": "shared.errors",
    "RankFailure": "shared.failures",
    "Records": "shared.records",
}

__all__ = [*sorted(_PUBLIC), "load_ipython_extension"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'ddp_kit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


def load_ipython_extension(ipython) -> None:
    """`%load_ext ddp_kit`: the %%torchrun and %ranks magics, inline figures, and the fork
    server started ahead of the first run (kernel.fast_start)."""
    from .kernel import fast_start
    from .kernel.magic import register
    from .plots import show_figures_in

    register(ipython)
    show_figures_in(ipython)
    fast_start.prestart()
