"""./kit gpu-check's plumbing (tools/gpu_check.py), without a GPU and without the network: what
the offline wheelhouse must hold, and that a built one resolves on its own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / "wheelhouse-gpu"
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up
spec.loader.exec_module(gpu_check)


def test_the_wheelhouse_holds_the_kits_needs_but_torch_and_jupyterlab():
    names = {r.split(">")[0].split("=")[0] for r in gpu_check.requirements()}
    assert {"numpy", "matplotlib", "ipywidgets", "ipython", "psutil"} <= names
    assert {"pytest", "nbval", "nbclient", "nbformat", "ipykernel"} <= names
    assert not names & {"torch", "jupyterlab"}


def test_a_notebook_is_labelled_with_where_its_ranks_run(tmp_path):
    assert gpu_check.notebook_ranks(ROOT / "notebooks" / "10_training_loop.ipynb") == [2, 4]
    two_gpus = gpu_check.placement([2, 4], 2, shared=False)
    assert two_gpus == "2 ranks: nccl on cuda; 4 ranks: gloo on cpu"
    assert gpu_check.placement([4], 1, shared=True) == "4 ranks: gloo on cuda"
    for name, code, placed in (("a", "x.to(device())", True), ("b", "DDP(m, device_ids=d)", True),
                               ("c", "x = torch.ones(3)", False)):  # fmt: skip
        cells = [{"cell_type": "code", "source": ["%%ranks\n", code]}]
        (tmp_path / f"{name}.ipynb").write_text(json.dumps({"cells": cells}))
        assert gpu_check.places_on_device(tmp_path / f"{name}.ipynb") == placed


def test_a_failures_first_error_line_is_found(tmp_path):
    log = "notebooks/x.ipynb F\n  E   RuntimeError: No backend type associated with device cuda\n"
    assert gpu_check.first_error(tmp_path / "none.xml", log).startswith("RuntimeError: No backend")


@pytest.mark.skipif(not (WHEELHOUSE / "target.json").exists(),
                    reason="no wheelhouse-gpu/ (./kit gpu-check --prepare)")
def test_the_built_wheelhouse_resolves_offline(tmp_path):
    version = json.loads((WHEELHOUSE / "target.json").read_text())["python_version"]
    assert (WHEELHOUSE / "requirements.txt").read_text().split() == gpu_check.requirements()
    (kit,) = WHEELHOUSE.glob("ddp_kit-*.whl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1")  # nothing but the wheelhouse
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index",
               "--find-links", str(WHEELHOUSE), "--target", str(tmp_path), "--only-binary=:all:",
               "--implementation", "cp", "--python-version", version,
               *(f"--platform={p}" for p in gpu_check.PLATFORMS),
               "-r", str(WHEELHOUSE / "requirements.txt")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert kit.stat().st_size > 0  # installed with --no-deps: its needs are the requirements
