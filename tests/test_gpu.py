"""On a CUDA machine (./kit gpu-check): nccl with one GPU per rank, and gloo when GPUs are short.

Skipped without CUDA; the CPU runs of the same lessons are in the other topic tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import WORKERS

import ddp_kit
from ddp_kit.kernel.backend import cuda_device_count

GPUS = cuda_device_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.torchrun,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU"),
]


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
def test_nccl_puts_each_rank_on_its_own_gpu_and_averages_the_gradient():
    run = ddp_kit.launch(WORKERS / "gpu.py", nproc=2, output="quiet")
    assert (run.backend, run.device) == ("nccl", "cuda")
    assert [str(d) for d in run.records["gpu/device"][0]] == ["cuda:0", "cuda:1"]
    local, synced = run.records["gpu/grad_local"][0], run.records["gpu/grad_synced"][0]
    assert np.abs(local[0] - local[1]).max() > 1e-3  # each rank's shard gives its own gradient
    mean = local.mean(axis=0)
    for r in range(2):  # nccl's sum / 2, equal up to float32 rounding
        assert np.abs(synced[r] - mean).max() < 1e-6


def test_nccl_on_one_gpu_places_the_model_before_wrapping_and_keeps_the_gradient():
    run = ddp_kit.launch(WORKERS / "gpu.py", nproc=1, output="quiet")
    assert (run.backend, run.device) == ("nccl", "cuda")
    assert [str(d) for d in run.records["gpu/device"][0]] == ["cuda:0"]
    local, synced = run.records["gpu/grad_local"][0], run.records["gpu/grad_synced"][0]
    assert np.array_equal(synced, local)  # one rank: nccl's sum of one, divided by 1, is exact


def test_more_ranks_than_gpus_fall_back_to_gloo_on_cpu_and_say_why(capfd):
    run = ddp_kit.launch(WORKERS / "gpu.py", nproc=GPUS + 1, output="quiet")
    assert (run.backend, run.device) == ("gloo", "cpu")
    assert f"Only {GPUS} GPU(s) for {GPUS + 1} ranks" in capfd.readouterr().err
    assert {str(d) for d in run.records["gpu/device"][0]} == {"cpu"}
