"""A short report of what this machine offers for distributed training."""

from __future__ import annotations

import os
import platform

from .kernel.backend import choose_backend, cuda_device_count


def describe(nproc: int = 4) -> str:
    """Python, torch, CPU cores, GPUs, and the backend a `nproc`-rank launch would use."""
    import torch
    import torch.distributed as dist

    choice = choose_backend(nproc, "auto")
    lines = [
        f"Python {platform.python_version()}, torch {torch.__version__}",
        f"CPU cores: {os.cpu_count()}, CUDA GPUs: {cuda_device_count()}",
        f"gloo available: {dist.is_gloo_available()}, nccl available: {dist.is_nccl_available()}",
        f"A {nproc}-rank launch uses: {choice.backend} on {choice.device} ({choice.reason})",
    ]
    return "\n".join(lines)
