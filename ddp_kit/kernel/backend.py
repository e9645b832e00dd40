"""Choose the process-group backend and device for a run: gloo on CPU unless NCCL can work.

One exception, for checking a machine with fewer GPUs than ranks (./kit gpu-check): with the
switch DDP_KIT_SHARED_GPU=1 (shared.contract) "auto" gives such a run gloo on the GPUs, the
ranks sharing them (rank i on cuda:(i mod GPUs); on a one-GPU machine every rank on cuda:0),
so that every lesson's `.to(device())` and `device_ids` still put the work on a GPU. gloo takes
CUDA tensors for the collectives the lessons use (it copies them to the host and back); nccl
cannot do this (two ranks on one GPU: "Duplicate GPU detected").
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..shared import contract
from ..shared.torch_build import cuda_device_count

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class BackendChoice:
    """The backend ("gloo" or "nccl"), the device kind ("cpu" or "cuda") and why.

    nccl is always on "cuda" (one GPU per rank); gloo is on "cpu", or on "cuda" in the shared
    GPU mode (the module docstring)."""

    backend: str
    device: str
    reason: str
    fallback: bool = False


def shared_gpu_wanted() -> bool:
    """Whether the switch DDP_KIT_SHARED_GPU=1 asks for gloo on shared GPUs (module docstring)."""
    return os.environ.get(contract.SHARED_GPU, "0") == "1"


def choose_backend(
    ranks: int, requested: str = "auto", gpus: int | None = None, shared_gpu: bool | None = None
) -> BackendChoice:
    """Pick the backend for `ranks` processes on this machine.

    NCCL needs one GPU per rank (two ranks on one GPU fail with "Duplicate GPU detected"),
    so "auto" uses nccl only when there are at least as many GPUs as ranks, else gloo on CPU.
    `shared_gpu` (None: DDP_KIT_SHARED_GPU=1 on this machine, but never for a question about
    another machine, `gpus` given) makes "auto" with too few GPUs, at least one, use gloo on
    the GPUs instead, shared by the ranks.
    """
    from ..shared.errors import LaunchConfigError

    if requested not in BACKENDS:
        raise LaunchConfigError(
            f"Unknown backend {requested!r}: use one of {', '.join(BACKENDS)} "
            '("auto" picks nccl when every rank can have its own GPU, else gloo).'
        )
    if shared_gpu is None:
        shared_gpu = gpus is None and shared_gpu_wanted()
    gpus = cuda_device_count() if gpus is None else gpus
    if requested == "gloo":
        return BackendChoice("gloo", "cpu", "gloo on CPU, as requested.")
    if requested == "nccl":
        if gpus < ranks:
            raise LaunchConfigError(
                f"backend='nccl' needs one CUDA GPU per rank, but this machine has {gpus} "
                f"GPU(s) for {ranks} rank(s). Use nproc={max(gpus, 1)} or less with nccl, "
                "or backend='gloo' (or 'auto') to run on CPU."
            )
        return BackendChoice("nccl", "cuda", f"nccl with one GPU per rank ({gpus} GPUs).")
    if gpus >= ranks:
        return BackendChoice("nccl", "cuda", f"nccl: {gpus} GPUs for {ranks} ranks, one each.")
    if gpus > 0 and shared_gpu:
        return BackendChoice(
            "gloo",
            "cuda",
            f"{gpus} GPU(s) for {ranks} ranks, shared ({contract.SHARED_GPU}=1): gloo with "
            f"rank i on cuda:(i mod {gpus}).",
        )
    if gpus > 0:
        return BackendChoice(
            "gloo",
            "cpu",
            f"Only {gpus} GPU(s) for {ranks} ranks: NCCL needs one GPU per rank "
            '(it refuses two ranks on one GPU: "Duplicate GPU detected"), '
            "so this run uses gloo on CPU.",
            fallback=True,
        )
    return BackendChoice("gloo", "cpu", "No CUDA GPU here: gloo on CPU.")


def say_choice(choice: BackendChoice, ranks: int) -> None:
    """Say under the cell what the choice means on this machine: why gloo on CPU although there
    are GPUs (only then), and, for ranks on the CPU, that they outnumber its cores (once)."""
    from .diagnose import say
    from .torchrun import cores_note

    say_fallback(choice)
    note = cores_note(ranks) if choice.device == "cpu" else None
    if note:
        say(note)


def say_fallback(choice: BackendChoice) -> None:
    """Say under the cell why the run uses gloo on CPU although there are GPUs (only then)."""
    if choice.fallback:
        print(f"[ddp_kit] {choice.reason}", file=sys.stderr)
