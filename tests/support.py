"""What several test files need: the kit's processes started by THIS test run, a child
Python process that behaves like a notebook kernel, the wheel built from a copy, and the
benchmark (benchmarks/bench.py, a script) as a module.

Every process the kit starts inherits the environment, so this run's processes carry its
marker (DDP_KIT_TEST_RUN, set by conftest.py); a notebook open in JupyterLab, another
checkout's session or a second test run has another marker or none, and is never counted.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil

import ddp_kit

WORKERS = Path(__file__).parent / "workers"  # the scripts the topic tests launch
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"
KIT_DIR = str(Path(ddp_kit.__file__).parent)

RUN_MARKER = "DDP_KIT_TEST_RUN"
KIT_COMMANDS = ("ddp_kit.rank.",)  # agents and ranks run `python -m ddp_kit.rank....`

# Code that makes a child Python process stand in for a notebook kernel: like ipykernel while a
# cell runs, SIGINT raises KeyboardInterrupt, even if this test run was started with SIGINT
# ignored (a shell's background job: its children then inherit SIG_IGN).
KERNEL_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def kit_processes() -> list[psutil.Process]:
    """Every living process of the kit started by this test run, orphans included, except a
    fork server that still has its kernel as its parent: it lives as long as its kernel
    (kernel.fast_start). What a server forked is counted, and so is a server left behind."""
    marker = os.environ[RUN_MARKER]
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] == psutil.STATUS_ZOMBIE or not any(
            k in cmdline for k in KIT_COMMANDS
        ):
            continue
        try:  # each of these reads /proc: a process may end in between (then it is gone)
            if "ddp_kit.rank.forkserver" in cmdline and cmdline.endswith(f" {proc.ppid()}"):
                continue  # a fork server with its kernel: `... forkserver SOCKET KERNEL_PID`
            if proc.environ().get(RUN_MARKER) == marker:
                found.append(proc)
        except psutil.Error:  # NoSuchProcess (ended meanwhile), ZombieProcess, AccessDenied
            continue
    return found


def describe(procs: list[psutil.Process]) -> list[str]:
    """Each process as "PID COMMAND...", leaving out those that ended meanwhile."""
    described = []
    for proc in procs:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline()[:6])}")
        except psutil.Error:
            continue
    return described


def kit_roles() -> Counter:
    """This run's kit processes by role: "agent" and "rank" (started plain, or the relay that
    torchrun or the kernel started in a fast start), "forked" (the process behind a relay)
    and "fork server" (another process's: a child kernel's)."""
    roles: Counter = Counter()
    for proc in kit_processes():
        try:
            words = proc.cmdline()
            parent = " ".join(proc.parent().cmdline()) if proc.parent() else ""
        except psutil.Error:
            continue
        if "ddp_kit.rank.forkserver" in words:
            roles["forked" if "ddp_kit.rank.forkserver" in parent else "fork server"] += 1
        else:
            roles["agent" if "ddp_kit.rank.agent" in words else "rank"] += 1
    return roles


def wait_until_gone(seconds: float = 5.0) -> list[str]:
    """Wait up to `seconds` for this run's kit processes to end; describe those still there."""
    deadline = time.monotonic() + seconds
    while kit_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return describe(kit_processes())


def kit_frames(traceback: str) -> list[str]:
    """The traceback's frames that are the kit's own code (a student should see none)."""
    return [line for line in traceback.splitlines()
            if re.match(r'\s*File "', line) and KIT_DIR in line]  # fmt: skip


# The first lines of a live-session cell that takes part in collectives.
SETUP = """
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_kit.worker import backend, record
dist.init_process_group(backend())
rank = dist.get_rank()
"""


def build_wheel(directory: Path) -> Path:
    """The wheel of a copy of the project's packaged files, built in `directory` (building in
    place would leave build/ and *.egg-info in the checkout, and build/ could ship stale files)."""
    source = directory / "source"
    root = Path(ddp_kit.__file__).resolve().parent.parent
    for folder in ("ddp_kit", "notebooks", "examples"):  # pyproject: the lessons' two folders
        skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
        shutil.copytree(root / folder, source / folder, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(directory), str(source)],
                   check=True, capture_output=True)  # fmt: skip
    (wheel,) = directory.glob("ddp_kit-*.whl")
    return wheel


def bench_module():
    """benchmarks/bench.py, loaded as a module (it is a script, outside any package)."""
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench
