"""What a host answers before a launch over hosts (ddp_kit.rank.probe): the torch that
`import torch` finds there, read without importing it where no GPU can be counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_kit.shared import torch_build

ROOT = Path(__file__).resolve().parent.parent


def answer(pythonpath: list[Path], *paths: str) -> dict:
    """The probe's answer from a fresh Python that finds `pythonpath` first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, ROOT]))}
    done = subprocess.run([sys.executable, "-m", "ddp_kit.rank.probe", *paths], env=env,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_the_probe_names_the_torch_import_would_find_and_what_it_lacks(tmp_path):
    said = answer([], str(tmp_path), str(tmp_path / "absent"))
    assert said["torch"] == torch.__version__ and said["gpus"] == torch.cuda.device_count()
    assert said["missing"] == [str(tmp_path / "absent")]
    assert said["kit"] == str(ROOT / "ddp_kit") and said["executable"] == sys.executable


def test_without_a_gpu_device_the_version_is_read_and_torch_not_imported(tmp_path):
    if any(map(os.path.exists, torch_build.GPU_DEVICE_FILES)):
        pytest.skip("a GPU device file is here: the probe imports torch (the test above)")
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (fake / "version.py").write_text("__version__ = '9.9.9+fake'\n")
    said = answer([tmp_path])
    assert said["torch"] == "9.9.9+fake" and said["gpus"] == 0


def test_a_torch_without_version_py_is_imported_and_asked(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "__version__ = '0.0.1'\nclass cuda:\n    device_count = staticmethod(lambda: 3)\n"
        "    is_available = staticmethod(lambda: True)\n"
    )
    said = answer([tmp_path])
    assert said["torch"] == "0.0.1" and said["gpus"] == 3
