"""The torch that `import torch` would find, told without importing it where that is enough.

Importing torch costs about 2 CPU seconds and 200 MB: a kernel that only plots, or a
host asked before a launch (rank.probe), need not spend them to learn torch's version or that
it has no GPU to count.

- `version()`: torch.__version__, read from torch/version.py (torch/__init__.py's comes from it).
- `cuda_device_count()`: torch.cuda.device_count() (which counts ROCm's GPUs too), 0 without
  importing torch when torch is built for neither CUDA nor ROCm (version.py: `cuda = None`,
  `hip = None`) or when no GPU device file is here (GPU_DEVICE_FILES).

Where version.py cannot be read, or torch is imported already, torch itself is asked.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys

# The device files of a GPU that torch.cuda can count: NVIDIA's, AMD's (ROCm) and WSL's
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def version_file() -> dict | None:
    """The names torch/version.py defines (`__version__`, `cuda`, `hip`, ...), run without
    importing torch; None where torch is imported already, or the file cannot be found or run."""
    if "torch" in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec("torch")  # finds the package; runs none of it
        path = os.path.join(os.path.dirname(spec.origin), "version.py")
        return runpy.run_path(path) if os.path.isfile(path) else None
    except Exception:  # no torch, a namespace package, a file that does not run: ask torch
        return None


def version() -> str:
    """torch.__version__ of the torch `import torch` finds."""
    found = version_file()
    if found is not None and "__version__" in found:
        return str(found["__version__"])
    import torch

    return torch.__version__


def cuda_device_count() -> int:
    """How many CUDA (or ROCm) GPUs torch sees here: 0 without CUDA."""
    found = version_file()
    if found is not None:
        no_gpu_build = all(k in found and found[k] is None for k in ("cuda", "hip"))
        if no_gpu_build or not any(map(os.path.exists, GPU_DEVICE_FILES)):
            return 0
    import torch

    return torch.cuda.device_count()
