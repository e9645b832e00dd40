"""`./kit test --cpu`: the CPU seconds each test costs, with everything it started.

On 2 cores the suite is CPU-bound: its wall time is its CPU seconds over the cores, whatever
the waits. `--durations` shows wall time, which a busy neighbour inflates; this shows the CPU
that a test's processes used: its ranks, agents, fork servers, kernels, sshd and slurmd on the
namespace hosts, and its own.

How: each pytest process (the controller, each xdist worker) moves itself into a cgroup of its
own, and every process it starts lands there too, however far it is detached (a new session, a
double fork). A test's CPU is the group's CPU from its setup to its teardown: a process left
from an earlier test (a fork server) is counted in whichever test runs meanwhile. It needs
Linux cgroups and the right to make a group (root, as CI runs): cgroup v2 (cpu.stat) or v1's
cpuacct controller (cpuacct.usage).

The workers send each test's seconds to the controller in its teardown report
(user_properties); the controller prints the 15 costliest tests, the 15 costliest files, and
the total against the wall time and the cores (docs/testing.md).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/cpuacct")
GROUP = "ddp-kit-cpu-profile"
KEY = "cpu_s"  # in a teardown report's user_properties: the test's CPU seconds
SHOWN = 15
STARTED = pytest.StashKey[float]()


def own_group(hierarchy: Path, controller: str) -> Path:
    """The cgroup this process is in now, in `hierarchy` (/proc/self/cgroup: "0::/path" for
    v2, "N:cpu,cpuacct:/path" for v1's controller)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return hierarchy / path.lstrip("/")
    return hierarchy


def make_group(name: str) -> tuple[Path, Path, Callable[[], float]]:
    """A cgroup for this process, with this process moved into it: the group, the one it left,
    and how to read the group's CPU seconds."""
    if (V2 / "cgroup.controllers").exists():
        left, group = own_group(V2, ""), V2 / GROUP / name

        def seconds() -> float:
            for line in (group / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return 0.0

    elif (V1 / "cpuacct.usage").exists():
        left, group = own_group(V1, "cpuacct"), V1 / GROUP / name

        def seconds() -> float:
            return int((group / "cpuacct.usage").read_text()) / 1e9

    else:
        raise OSError("no cgroup v2 and no cgroup v1 cpuacct under /sys/fs/cgroup")
    group.mkdir(parents=True, exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group, left, seconds


class CpuProfile:
    def __init__(self, config) -> None:
        self.config = config
        name = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
        try:
            self.group, self.left, self.seconds = make_group(name)
        except OSError as error:
            raise pytest.UsageError(
                f"--cpu: {error}. It measures through a cgroup per pytest process: run it as "
                "root on Linux (as CI does), or use --durations (wall time) instead."
            ) from error
        self.began = time.monotonic()
        self.per_test: dict[str, float] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        item.stash[STARTED] = self.seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when == "teardown" and STARTED in item.stash:
            used = self.seconds() - item.stash[STARTED]
            outcome.get_result().user_properties.append((KEY, used))

    def pytest_runtest_logreport(self, report) -> None:  # in the controller: every worker's
        if report.when == "teardown":
            for key, value in report.user_properties:
                if key == KEY:
                    self.per_test[report.nodeid] = value

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if "PYTEST_XDIST_WORKER" in os.environ or not self.per_test:
            return
        wall = time.monotonic() - self.began
        total = sum(self.per_test.values())
        cores = os.cpu_count() or 1
        files: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.per_test.items():
            files[nodeid.split("::")[0]] += seconds
        write = terminalreporter.write_line
        terminalreporter.section("CPU seconds (--cpu: tools/cpu_profile.py)")
        write(f"{total:.0f} CPU-s in the tests, over {wall:.0f} s of wall time: "
              f"{total / wall / cores:.0%} of {cores} cores")  # fmt: skip
        write(f"the {SHOWN} costliest tests:")
        for nodeid, seconds in sorted(self.per_test.items(), key=lambda x: -x[1])[:SHOWN]:
            write(f"{seconds:8.1f}  {nodeid}")
        write(f"the {SHOWN} costliest files:")
        for path, seconds in sorted(files.items(), key=lambda x: -x[1])[:SHOWN]:
            write(f"{seconds:8.1f}  {path}")

    def pytest_unconfigure(self, config) -> None:
        """Back to the group this process came from, and its own removed once empty (a
        process still in it keeps it)."""
        try:
            (self.left / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError:
            pass


def pytest_addoption(parser) -> None:
    parser.addoption("--cpu", action="store_true",
                     help="the CPU seconds of each test and its processes (tools/cpu_profile.py)")


def pytest_configure(config) -> None:
    if config.getoption("--cpu"):
        config.pluginmanager.register(CpuProfile(config), "ddp_kit_cpu_profile")
