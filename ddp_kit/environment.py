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


def torch_build() -> str:
    """One line: which torch this is (a CPU or a CUDA build) and what launches here will use."""
    import torch

    if torch.version.cuda:
        build = f"a CUDA {torch.version.cuda} build"
    elif torch.version.hip:
        build = f"a ROCm {torch.version.hip} build"
    else:
        build = "a CPU-only build"
    gpus = cuda_device_count()
    if gpus:
        use = (f"{gpus} GPU(s) visible: up to {gpus} ranks use nccl, one GPU each; more ranks "
               "use gloo on CPU")  # fmt: skip
    else:
        use = "no GPU visible: ranks use gloo on CPU"
    return f"torch {torch.__version__}, {build}; {use}"
