"""Backend choice: gloo on CPU by default, nccl only with one GPU per rank."""

import os
import subprocess
import sys
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


def test_shared_gpu_mode_puts_gloo_on_the_gpus_when_they_are_too_few():
    choice = choose_backend(4, "auto", gpus=1, shared_gpu=True)
    assert (choice.backend, choice.device, choice.fallback) == ("gloo", "cuda", False)
    assert "cuda:(i mod 1)" in choice.reason
    # enough GPUs: nccl as always; no GPU or gloo asked for: gloo on CPU
    assert choose_backend(4, "auto", gpus=4, shared_gpu=True).backend == "nccl"
    assert choose_backend(4, "auto", gpus=0, shared_gpu=True).device == "cpu"
    assert choose_backend(2, "gloo", gpus=1, shared_gpu=True).device == "cpu"


def test_the_shared_gpu_switch_applies_to_this_machine_only(monkeypatch):
    from ddp_kit.kernel import backend
    from ddp_kit.shared import contract

    monkeypatch.setattr(backend, "cuda_device_count", lambda: 1)
    monkeypatch.setenv(contract.SHARED_GPU, "1")
    assert choose_backend(2, "auto").device == "cuda"  # this machine: the switch holds
    assert choose_backend(2, "auto", gpus=1).device == "cpu"  # another machine's question
    monkeypatch.setenv(contract.SHARED_GPU, "0")
    assert choose_backend(2, "auto").fallback


def test_the_ranks_learn_the_device_kind_and_gpu_runs_start_plain(monkeypatch, tmp_path):
    from ddp_kit import worker
    from ddp_kit.kernel import fast_start
    from ddp_kit.kernel.torchrun import rank_env
    from ddp_kit.shared import contract

    assert rank_env(tmp_path, "gloo", 60.0, None)[contract.DEVICE] == "cpu"
    assert rank_env(tmp_path, "nccl", 60.0, None)[contract.DEVICE] == "cuda"
    shared = rank_env(tmp_path, "gloo", 60.0, None, device="cuda")
    assert not fast_start.wanted(shared)  # a fork server must not stand behind CUDA ranks
    for key in (contract.BACKEND, contract.DEVICE):
        monkeypatch.setenv(key, shared[key])
    assert worker.backend() == "gloo" and worker._on_cuda()
    monkeypatch.delenv(contract.DEVICE)  # a run from before the variable: gloo means CPU
    assert not worker._on_cuda()
    monkeypatch.setenv(contract.BACKEND, "nccl")
    assert worker._on_cuda() and worker.backend() == "cpu:gloo,cuda:nccl"


VERSION_FILE = """from typing import Optional
__version__ = '9.9.9'
cuda: Optional[str] = {cuda}
hip: Optional[str] = {hip}
"""
ASK = ("import sys; from ddp_kit.shared import torch_build; "
       "print(torch_build.cuda_device_count(), torch_build.version(), 'torch' in sys.modules)")


@pytest.mark.parametrize(("cuda", "hip"), [("None", "None"), ("'13.0'", "None"),
                                           ("None", "'6.2'")])  # fmt: skip
def test_a_torch_built_for_cpu_only_has_no_gpu_to_count_and_is_not_imported(tmp_path, cuda, hip):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(  # a GPU build's: it has 3 GPUs
        "raise SystemExit('torch was imported')\n" if cuda == hip == "None" else
        "__version__ = '9.9.9'\nclass cuda:\n    device_count = staticmethod(lambda: 3)\n"
        "    is_available = staticmethod(lambda: True)\n"
    )  # fmt: skip
    (fake / "version.py").write_text(VERSION_FILE.format(cuda=cuda, hip=hip))
    done = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60)  # fmt: skip
    if cuda == hip == "None":
        assert done.stdout.split() == ["0", "9.9.9", "False"], done.stderr
    else:  # a GPU build: torch is asked, device file or not (the probe alone trusts those)
        assert done.stdout.split() == ["3", "9.9.9", "True"], done.stderr


def test_a_kernel_learns_this_torchs_gpus_and_version_without_importing_a_cpu_build():
    done = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True, timeout=60)
    import torch

    imported = not (torch.version.cuda is None and torch.version.hip is None)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert done.stdout.split() == [str(gpus), torch.__version__, str(imported)], done.stderr
