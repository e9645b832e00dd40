"""Choose the process-group backend and device for a run: gloo on CPU unless NCCL can work."""

from __future__ import annotations

import sys
from dataclasses import dataclass

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class BackendChoice:
    """The backend ("gloo" or "nccl"), the device kind ("cpu" or "cuda") and why."""

    backend: str
    device: str
    reason: str
    fallback: bool = False


def cuda_device_count() -> int:
    """How many CUDA GPUs this machine has (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(ranks: int, requested: str = "auto", gpus: int | None = None) -> BackendChoice:
    """Pick the backend for `ranks` processes on this machine.

    NCCL needs one GPU per rank (two ranks on one GPU fail with "Duplicate GPU detected"),
    so "auto" uses nccl only when there are at least as many GPUs as ranks, else gloo on CPU.
    """
    from ..shared.errors import LaunchConfigError

    if requested not in BACKENDS:
        raise LaunchConfigError(
            f"Unknown backend {requested!r}: use one of {', '.join(BACKENDS)} "
            '("auto" picks nccl when every rank can have its own GPU, else gloo).'
        )
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


def say_fallback(choice: BackendChoice) -> None:
    """Say under the cell why the run uses gloo on CPU although there are GPUs (only then)."""
    if choice.fallback:
        print(f"[ddp_kit] {choice.reason}", file=sys.stderr)
