"""Helpers used INSIDE a worker started by ddp_kit (rank, backend, device, record).

The launcher sets DDP_KIT_* variables; outside a ddp_kit run these helpers fall back to the
plain torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE) and gloo on CPU.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from .records import RecordWriter

_writer: RecordWriter | None = None
_before_flush: list[Callable[[], None]] = []
_script: str | None = None


def rank() -> int:
    """This process's global rank (0 .. world_size-1)."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """This process's rank on its own machine."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    """How many processes take part in the run."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def backend() -> str:
    """What to pass to init_process_group: "gloo" on CPU; with one GPU per rank,
    "cpu:gloo,cuda:nccl" (nccl for CUDA tensors, gloo for any CPU tensor a lesson reduces)."""
    return "cpu:gloo,cuda:nccl" if _on_gpus() else "gloo"


def _on_gpus() -> bool:
    """Whether the launcher chose nccl, one GPU per rank."""
    return os.environ.get("DDP_KIT_BACKEND") == "nccl"


def device():
    """This rank's device: cuda:<index> under nccl, else the CPU."""
    import torch

    if _on_gpus():
        index = local_rank() + int(os.environ.get("DDP_KIT_DEVICE_OFFSET", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def device_ids() -> list[int] | None:
    """What to pass as DDP(model, device_ids=...): [this rank's GPU], or None on CPU."""
    dev = device()
    return [dev.index] if dev.type == "cuda" else None


def _record_writer() -> RecordWriter:
    """This rank's writer, created on first use together with the flush at exit."""
    global _writer
    if _writer is None:
        directory = Path(os.environ.get("DDP_KIT_RECORD_DIR", "ddp_kit_records"))
        _writer = RecordWriter(directory, rank())
        atexit.register(flush)
    return _writer


def record(name: str, value: Any, step: int | None = None) -> None:
    """Save `value` (tensor, number, list, str or dict) for this rank under `name` at `step`."""
    _record_writer().add(name, value, step)


def flush() -> None:
    """Write this rank's records to disk now (also done automatically at exit)."""
    for callback in _before_flush:
        callback()
    if _writer is not None:
        _writer.save()


def before_flush(callback: Callable[[], None]) -> None:
    """Run `callback` (which may record more) every time the records are written, at exit too."""
    _record_writer()
    _before_flush.append(callback)


def collective_timeout() -> timedelta:
    """How long a collective waits for the other ranks before raising (set by the launcher)."""
    return timedelta(seconds=float(os.environ.get("DDP_KIT_COLLECTIVE_TIMEOUT", "1800")))


def bootstrap(script: str | None = None) -> None:
    """Prepare a worker: short collective timeout, error reports, clean shutdown at exit.

    Reported tracebacks start at `script` (the runner's own frames are left out).
    """
    global _script
    _script = script
    _die_with_parent()
    _shorten_default_collective_timeout()
    sys.excepthook = _report_exception
    atexit.register(_destroy_process_group)


def _shorten_default_collective_timeout() -> None:
    """Make init_process_group's default timeout the launcher's, so a hang becomes an error."""
    if "DDP_KIT_COLLECTIVE_TIMEOUT" not in os.environ:
        return
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = collective_timeout()
    if getattr(c10d, "default_pg_nccl_timeout", None) is not None:
        c10d.default_pg_nccl_timeout = collective_timeout()


def _report_exception(kind: type[BaseException], error: BaseException, tb: Any) -> None:
    """Write the uncaught exception for the launcher, and a one-line notice to stderr."""
    error_dir = os.environ.get("DDP_KIT_ERROR_DIR")
    if error_dir is None:
        sys.__excepthook__(kind, error, tb)
        return
    report = {
        "rank": rank(),
        "type": kind.__name__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(kind, error, _from_script(tb))),
        "time": time.time(),
    }
    path = Path(error_dir) / f"rank{rank()}.json"
    path.write_text(json.dumps(report))
    # sys.__stderr__: init_process_group wraps the excepthook and would prefix "[rankN]:".
    notice = f"{kind.__name__}: {error}  (traceback in the launch error)"
    print(notice, file=sys.__stderr__, flush=True)


def _from_script(tb: Any) -> Any:
    """Skip the traceback entries above the worker script (the runner and runpy)."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename != _script:
        tb = tb.tb_next
    return tb or first


def _destroy_process_group() -> None:
    """Tear down the process group if the worker forgot to (avoids aborts at exit)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _die_with_parent() -> None:
    """On Linux, ask the kernel to kill this worker if its torchrun agent dies."""
    if sys.platform.startswith("linux"):
        from .processes import die_with_parent

        die_with_parent()
