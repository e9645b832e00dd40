"""The student's API inside every rank: who am I (rank), which backend and device, record().

The kernel sets the DDP_KIT_* variables of shared.contract; outside a ddp_kit run these helpers
fall back to the plain torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE) and gloo on CPU.
(What prepares a rank before the student's code runs lives in ddp_kit.rank.runner.)
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .shared import contract
from .shared.records import RecordWriter

_writer: RecordWriter | None = None
_before_flush: list[Callable[[], None]] = []


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
    """What to pass to init_process_group: "gloo" (CPU tensors, and CUDA tensors in the shared
    GPU mode); with one GPU per rank, "cpu:gloo,cuda:nccl" (nccl for CUDA tensors, gloo for
    any CPU tensor a lesson reduces)."""
    return "cpu:gloo,cuda:nccl" if _on_gpus() else "gloo"


def _on_gpus() -> bool:
    """Whether the launcher chose nccl, one GPU per rank."""
    return os.environ.get(contract.BACKEND) == "nccl"


def _on_cuda() -> bool:
    """Whether the launcher put the ranks on GPUs: nccl, or gloo on shared GPUs."""
    return os.environ.get(contract.DEVICE, "cuda" if _on_gpus() else "cpu") == "cuda"


def device():
    """This rank's device: cuda:<index> under nccl (one GPU each), cuda:<index mod GPUs> under
    gloo on shared GPUs (DDP_KIT_SHARED_GPU=1: on one GPU, cuda:0 for every rank), else the
    CPU."""
    import torch

    if _on_cuda():
        index = local_rank() + int(os.environ.get(contract.DEVICE_OFFSET, "0"))
        if not _on_gpus():
            index %= torch.cuda.device_count()
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
        directory = Path(os.environ.get(contract.RECORD_DIR, "ddp_kit_records"))
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


def forget_flush_callbacks() -> None:
    """Drop the before_flush callbacks (and the objects they hold) once records are saved."""
    _before_flush.clear()


def before_flush(callback: Callable[[], None]) -> None:
    """Run `callback` (which may record more) every time the records are written, at exit too."""
    _record_writer()
    _before_flush.append(callback)


def lose_this_node() -> None:
    """End this node at once, as abruptly as a host that loses its power: SIGKILL to its
    torchrun agent and to every rank of it, this one last, so none of them says anything. (Its
    machine stays up, and closes their connections: the others learn it at once.)
    The other nodes' ranks learn it from their next collective (notebook 28). Flush first what
    should be kept: this rank's records are not saved.

    Only in a launch of several nodes (DDP_KIT_NODE set): the node's processes are those whose
    environment holds this run's marker folder and this node's index (on another host, the
    host's own processes). In a fast start, the fork server kills those it forked first, and
    answers once it has: the relays' end would make it kill them too, but later, and a rank
    left running a moment could see this one's end and report it. (A server that has retired,
    or does not answer within 2 s, leaves them to the relays' end, as before.)"""
    import signal

    import psutil

    from .rank.forkserver import end_children

    node, markers = os.environ.get(contract.NODE), os.environ.get(contract.MARKER_DIR)
    if node is None or markers is None:
        raise RuntimeError("lose_this_node() ends one node of several: launch with nnodes=2 "
                           "(or hosts=) under the kit.")  # fmt: skip
    mine = {contract.NODE: node, contract.MARKER_DIR: markers}
    server = os.environ.get(contract.FORK_SERVER)
    if server:
        end_children(server, mine, spare=os.getpid())
    for process in psutil.process_iter():
        try:
            environ = process.environ()
            if process.pid != os.getpid() and all(environ.get(k) == v for k, v in mine.items()):
                process.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # ended meanwhile, or another user's
    os.kill(os.getpid(), signal.SIGKILL)
