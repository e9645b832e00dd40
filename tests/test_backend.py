"""Backend choice: gloo on CPU by default, nccl only with one GPU per rank."""

from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, _get_default_timeout

from ddp_kit import LaunchConfigError, choose_backend


def test_no_gpu_means_gloo_on_cpu():
    choice = choose_backend(4, "auto", gpus=0)
    assert (choice.backend, choice.device, choice.fallback) == ("gloo", "cpu", False)


def test_enough_gpus_means_nccl():
    assert choose_backend(4, "auto", gpus=4).backend == "nccl"
    assert choose_backend(2, "nccl", gpus=8).device == "cuda"


def test_too_few_gpus_fall_back_to_gloo_with_a_reason():
    choice = choose_backend(4, "auto", gpus=1)
    assert (choice.backend, choice.device, choice.fallback) == ("gloo", "cpu", True)
    assert "Only 1 GPU(s) for 4 ranks" in choice.reason and "Duplicate GPU" in choice.reason


def test_nccl_without_enough_gpus_is_refused_with_the_fix():
    with pytest.raises(LaunchConfigError, match=r"3 GPU\(s\) for 4 rank\(s\). Use nproc=3"):
        choose_backend(4, "nccl", gpus=3)


def test_gloo_on_request_even_with_gpus():
    assert choose_backend(2, "gloo", gpus=8).backend == "gloo"


def test_default_timeout_is_30_minutes_except_for_plain_nccl():
    assert _get_default_timeout(Backend("gloo")) == timedelta(minutes=30)
    # the kit's GPU string (ddp_kit.worker.backend()) is not Backend.NCCL: 30 minutes too
    assert _get_default_timeout(Backend("cpu:gloo,cuda:nccl")) == timedelta(minutes=30)
    if dist.is_nccl_available():  # a torch build with NCCL
        assert _get_default_timeout(Backend("nccl")) == timedelta(minutes=10)
