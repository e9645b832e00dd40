"""The plain example scripts: the DDP one runs unchanged under bare torchrun and the kit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import WORKERS

import ddp_kit
from ddp_kit.kernel.torchrun import loopback_interface

pytestmark = pytest.mark.torchrun

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def epochs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


def test_ddp_script_runs_under_bare_torchrun_and_the_kit_and_resumes(tmp_path):
    args = ["--epochs", "2", "--checkpoint", str(tmp_path / "bare.pt")]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
               "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1",
               str(EXAMPLES / "ddp_train.py"), *args]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": loopback_interface()}
    bare = subprocess.run(command, env=env, capture_output=True, text=True, cwd="/")
    # The script imports torch._dynamo first and frees its DDP model before the group: 0
    # teardown aborts in 40 loaded bare runs (12 in 70 before; docs/upstream.md section 4).
    assert bare.returncode == 0, bare.stderr
    kit_args = ["--epochs", "2", "--checkpoint", str(tmp_path / "kit.pt")]
    kit = ddp_kit.launch(EXAMPLES / "ddp_train.py", nproc=2, args=kit_args, output="quiet")
    assert len(epochs(bare.stdout)) == 2 and epochs(bare.stdout) == epochs(kit.stdout[0])
    assert kit.stdout[1] == ""  # only rank 0 prints
    assert "over 64 samples" in epochs(bare.stdout)[0]  # the loss of every process, added up
    saved = [torch.load(tmp_path / name, map_location="cpu") for name in ("bare.pt", "kit.pt")]
    assert saved[0]["epoch"] == 1 and set(saved[0]) == {"model", "optimizer", "epoch"}
    weights = [state["model"] for state in saved]
    assert list(weights[0]) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # no "module."
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])

    # resume the bare run's checkpoint for a third epoch: the same as 3 epochs in one go
    resumed = ["--epochs", "3", "--checkpoint", str(tmp_path / "bare.pt"), "--resume"]
    third = ddp_kit.launch(EXAMPLES / "ddp_train.py", nproc=2, args=resumed, output="quiet")
    straight = ["--epochs", "3", "--checkpoint", str(tmp_path / "straight.pt")]
    whole = ddp_kit.launch(EXAMPLES / "ddp_train.py", nproc=2, args=straight, output="quiet")
    assert epochs(third.stdout[0]) == epochs(whole.stdout[0])[2:]  # only epoch 2, the same
    ends = [torch.load(tmp_path / name, map_location="cpu") for name in ("bare.pt", "straight.pt")]
    assert ends[0]["epoch"] == ends[1]["epoch"] == 2
    assert all(torch.equal(ends[0]["model"][k], ends[1]["model"][k]) for k in ends[0]["model"])


def test_uneven_data_is_padded_with_repeats_and_counted_twice(tmp_path):
    # notebook 12, item 6: 64 samples on 3 processes print "over 66 samples"
    args = ["--epochs", "1", "--checkpoint", str(tmp_path / "three.pt")]
    run = ddp_kit.launch(EXAMPLES / "ddp_train.py", nproc=3, args=args, output="quiet")
    assert epochs(run.stdout[0])[0].endswith("over 66 samples")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_torch_distributed_nn_imported_after_init_keeps_that_group_alive():
    env = {**os.environ, "GLOO_SOCKET_IFNAME": loopback_interface()}
    done = subprocess.run([sys.executable, str(WORKERS / "pinned_group.py")], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    alone, freed, pinned, after = map(int, done.stdout.split())
    assert freed == alone  # destroy_process_group freed the world and ended gloo's threads
    assert pinned == alone + 3  # not this one: gloo's loop and its 2 worker threads live on
    assert after == pinned  # the next world is freed again


def test_single_process_script_runs(tmp_path):
    command = [sys.executable, str(EXAMPLES / "single_process.py"), "--epochs", "1",
               "--checkpoint", str(tmp_path / "one.pt")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd="/")
    assert epochs(done.stdout)[0].endswith("over 64 samples")
    script = command[:2]
    resume = [*script, "--epochs", "2", "--checkpoint", str(tmp_path / "one.pt"), "--resume"]
    second = subprocess.run(resume, capture_output=True, text=True, check=True, cwd="/")
    straight = [*script, "--epochs", "2", "--checkpoint", str(tmp_path / "two.pt")]
    whole = subprocess.run(straight, capture_output=True, text=True, check=True, cwd="/")
    assert epochs(second.stdout) == epochs(whole.stdout)[1:]
