"""The plain example scripts: the DDP one runs unchanged under bare torchrun and the kit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import ddp_kit
from ddp_kit.launcher import loopback_interface

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def epochs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


def test_ddp_script_runs_unchanged_under_bare_torchrun_and_the_kit(tmp_path):
    args = ["--epochs", "2", "--checkpoint", str(tmp_path / "bare.pt")]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
               "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1",
               str(EXAMPLES / "ddp_train.py"), *args]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": loopback_interface()}
    bare = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd="/")
    kit_args = ["--epochs", "2", "--checkpoint", str(tmp_path / "kit.pt")]
    kit = ddp_kit.launch(EXAMPLES / "ddp_train.py", nproc=2, args=kit_args, output="quiet")
    assert len(epochs(bare.stdout)) == 2 and epochs(bare.stdout) == epochs(kit.stdout[0])
    assert kit.stdout[1] == ""  # only rank 0 prints
    assert "over 64 samples" in epochs(bare.stdout)[0]  # the loss of every process, added up
    saved = [torch.load(tmp_path / name, map_location="cpu") for name in ("bare.pt", "kit.pt")]
    assert list(saved[0]) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # no "module."
    assert all(torch.equal(saved[0][k], saved[1][k]) for k in saved[0])


def test_single_process_script_runs(tmp_path):
    command = [sys.executable, str(EXAMPLES / "single_process.py"), "--epochs", "1",
               "--checkpoint", str(tmp_path / "one.pt")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd="/")
    assert epochs(done.stdout)[0].endswith("over 64 samples")
    assert (tmp_path / "one.pt").exists()
