"""Inside the ranks: a torch.profiler trace of some code, saved as a record.

    with profiled("step"):            # in a script, or what `%%ranks --profile step` does
        loss = model(x).sum(); loss.backward()

records the Chrome trace of what this rank did meanwhile under the name "step" (one step per
use), as the dict that `torch.profiler.profile.export_chrome_trace` writes. In the notebook,
`ddp_kit.tracing` merges the ranks' traces into one, a row per rank, draws it and saves a file
that Perfetto (ui.perfetto.dev) and chrome://tracing open.

What it shows: the CPU operators run by the thread that profiles and by the threads working
for it (gloo's: its collectives appear as `gloo:all_reduce` ranges on gloo's threads, from the
moment gloo starts one to its end; with CUDA, autograd's device threads), with DDP's
`record_function` ranges; a thread the code starts itself is not recorded. With CUDA
initialised before the block, the GPU kernels too (nccl's among them). Python code between
operators is not shown (with_stack is off: it costs much).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator

from .worker import record


@contextlib.contextmanager
def profiled(name: str) -> Iterator[None]:
    """Profile the block on this rank and record its trace under `name` (even if it raised)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # before the block starts
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(activities=activities)
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        record(name, chrome_trace(profiler))


def chrome_trace(profiler) -> dict:
    """The profiler's Chrome trace as a dict (it writes only to a file)."""
    handle, path = tempfile.mkstemp(prefix="ddp_kit-trace-", suffix=".json")
    os.close(handle)
    try:
        profiler.export_chrome_trace(path)
        with open(path) as file:
            return json.load(file)
    finally:
        os.unlink(path)
