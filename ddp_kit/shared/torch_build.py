"""The torch that `import torch` would find, told without importing it where that is enough.

Importing torch costs about 2 CPU seconds and 200 MB: a kernel that only plots, or a host
asked before a launch (rank.probe), need not spend them to learn torch's version or that it
has no GPU to count.

- `version()`: torch.__version__, read from torch/version.py (torch/__init__.py's comes from it).
- `cuda_device_count()`: the GPUs torch can use (torch.cuda counts ROCm's too), 0 without
  importing torch when torch is built for neither CUDA nor ROCm (version.py: `cuda = None`,
  `hip = None`). The probe also trusts the device files (GPU_DEVICE_FILES): a host with none
  of them answers 0 without importing torch. The kernel does not: it asks torch whenever
  torch is built for a GPU, whatever device files there are.

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


def cuda_device_count(*, trust_device_files: bool = False) -> int:
    """How many GPUs torch can use here (CUDA's, or ROCm's): 0 without them. Told without
    importing torch when version.py says it is built for neither; with `trust_device_files`
    (the probe), also where no GPU device file is here."""
    found = version_file()
    if found is not None:
        cpu_only = all(k in found and found[k] is None for k in ("cuda", "hip"))
        no_device = not any(map(os.path.exists, GPU_DEVICE_FILES))
        if cpu_only or (trust_device_files and no_device):
            return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
