"""`./kit test --cpu` (tools/cpu_profile.py): a test's CPU seconds include a process it started
in a session of its own, which no wait of the test's counts (as a fork server's, or a rank's
behind a relay), and a test that only waits costs next to none; in pytest-xdist workers, as
./kit test runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BURN = '''
import subprocess, sys, time
BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"
def test_burns_a_cpu_second_in_a_detached_child():
    subprocess.run([sys.executable, "-c", BURN], start_new_session=True, check=True)
def test_waits():
    time.sleep(1.0)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="--cpu makes cgroups: root (CI runs as root)")
def test_the_cpu_of_a_detached_child_is_its_tests_and_a_wait_costs_none(tmp_path):
    (tmp_path / "test_burn.py").write_text(BURN)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tools.cpu_profile",
         "-n", "2", "--cpu", "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    seconds = {name: float(s) for s, name in re.findall(r"^\s+([\d.]+)  test_burn.py::(\w+)$",
                                                        done.stdout, re.MULTILINE)}  # fmt: skip
    assert 0.9 <= seconds["test_burns_a_cpu_second_in_a_detached_child"] < 3.0, done.stdout
    assert seconds["test_waits"] < 0.3, done.stdout
