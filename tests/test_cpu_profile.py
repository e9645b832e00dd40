"""`./kit test --cpu` (tools/cpu_profile.py): a test's CPU seconds include those of a process
that no wait of the test's can count (a grandchild in a session of its own, reparented to
init once its parent exits: as a rank forked by a fork server is nobody's waited child), and
a test that only waits costs next to none; in one process, and in pytest-xdist workers as
./kit test runs them (loadfile)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.cpu_profile import hierarchy, own_group

ROOT = Path(__file__).resolve().parent.parent

# The child forks and exits at once; the grandchild, in a new session, burns 1 CPU second and
# holds the pipe that the test reads to its end, so the test waits for it without waiting on it.
BURN = '''
import os, subprocess, sys, time
ORPHAN = """
import os, time
if os.fork():
    os._exit(0)
os.setsid()
t = time.process_time()
while time.process_time() - t < 1.0:
    pass
"""
def test_burns_a_cpu_second_in_an_orphaned_grandchild():
    child = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE)
    assert child.stdout.read() == b""  # the end: the grandchild has exited
    assert child.wait() == 0
def test_waits():
    time.sleep(1.0)
'''


def writable_cgroups() -> bool:
    """Whether --cpu may make its group here: inside this process's own cgroup."""
    try:
        root, controller = hierarchy()
    except OSError:
        return False
    return os.geteuid() == 0 and os.access(own_group(root, controller), os.W_OK)


@pytest.mark.skipif(not writable_cgroups(), reason="--cpu makes cgroups: root, writable mount")
@pytest.mark.parametrize("workers", [["-n", "0"], ["-n", "2", "--dist", "loadfile"]])
def test_the_cpu_of_an_orphaned_grandchild_is_its_tests_and_a_wait_costs_none(tmp_path, workers):
    (tmp_path / "test_burn.py").write_text(BURN)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tools.cpu_profile",
         *workers, "--cpu", "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU seconds (--cpu" in done.stdout, done.stdout
    used = {name: float(s) for s, name in re.findall(r"^\s+([\d.]+)  test_burn.py::(\w+)$",
                                                     done.stdout, re.MULTILINE)}  # fmt: skip
    assert 0.9 <= used["test_burns_a_cpu_second_in_an_orphaned_grandchild"] < 3.0, done.stdout
    assert used["test_waits"] < 0.3, done.stdout
