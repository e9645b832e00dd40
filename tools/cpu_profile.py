"""`./kit test --cpu`: the CPU seconds each test costs, with everything it started.

On 2 cores the suite is CPU-bound: its wall time is close to its CPU seconds over the cores,
whatever the waits. `--durations` shows wall time, which a busy neighbour inflates; this shows
the CPU that a test's processes used: its ranks, agents, fork servers, kernels, sshd and
slurmd on the namespace hosts, and its own.

How: each pytest process (the controller, each xdist worker) moves itself into a cgroup of its
own, made inside the one it was in, and every process it starts lands there too, however far
it is detached (a new session, a double fork, a process reparented to init). A test's CPU is
the group's CPU from its setup to its teardown: a process left from an earlier test (a fork
server) is counted in whichever test runs meanwhile, and what runs between tests (collection,
the controller) in none. It needs Linux cgroups that this user may write (root, where the
cgroup mount is not read-only: not in an unprivileged container): cgroup v2 (cpu.stat) or v1's
cpuacct controller (cpuacct.usage).

The workers send each test's seconds to the controller in its teardown report
(user_properties; a --junitxml report shows them as a property); the controller prints the
15 costliest tests, the 15 costliest files, and the total against the wall time and the cores.
A whole-suite `./kit test --cpu` runs pytest twice (docs/testing.md), so it prints two such
sections: the parallel phase's, then the timing phase's.
"""

from __future__ import annotations

import os
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from ddp_kit.kernel.torchrun import available_cores

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/cpuacct")
KEY = "cpu_s"  # in a teardown report's user_properties: the test's CPU seconds
SHOWN = 15
REMOVE_SECONDS = 5.0
CPU_AT_SETUP = pytest.StashKey[float]()


def own_group(root: Path, controller: str) -> Path:
    """The cgroup this process is in now, under the hierarchy mounted at `root`
    (/proc/self/cgroup: "0::/path" for v2, "N:cpuacct:/path" or "N:cpu,cpuacct:/path" for
    v1's controller)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return root / path.lstrip("/")
    return root


def hierarchy() -> tuple[Path, str]:
    """The cgroup hierarchy that counts CPU here, and its controller's name as
    /proc/self/cgroup writes it ("" for v2); OSError if there is none."""
    if (V2 / "cgroup.controllers").exists():
        return V2, ""
    if (V1 / "cpuacct.usage").exists():
        return V1, "cpuacct"
    raise OSError("no cgroup v2 and no cgroup v1 cpuacct under /sys/fs/cgroup")


def make_group(name: str) -> tuple[Path, Path, Callable[[], float]]:
    """A new cgroup inside this process's own, with this process moved into it: the group,
    the one it left, and the reader of the group's CPU seconds."""
    root, controller = hierarchy()
    left = own_group(root, controller)
    group = left / name

    def cpu_seconds() -> float:
        if controller == "cpuacct":
            return int((group / "cpuacct.usage").read_text()) / 1e9
        for line in (group / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return 0.0

    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        group.rmdir()
        raise
    return group, left, cpu_seconds


class CpuProfile:
    """This pytest process's group, and the CPU seconds of each test (in the controller, of
    every worker's tests)."""

    def __init__(self, config) -> None:
        # An xdist worker's config has its workerinput (not the environment: a pytest that a
        # test starts inherits the worker's PYTEST_XDIST_WORKER, and is a controller).
        self.worker = getattr(config, "workerinput", {}).get("workerid")
        worker = self.worker or "main"
        try:
            self.group, self.left, self.cpu_seconds = make_group(
                f"ddp-kit-cpu-{worker}-{os.getpid()}-{secrets.token_hex(3)}"
            )
        except OSError as error:
            raise pytest.UsageError(
                f"--cpu: {error}. It measures through a cgroup per pytest process: run it as "
                "root on Linux, where the cgroup mount is writable (not in an unprivileged "
                "container), or use --durations (wall time) instead."
            ) from error
        self.began = time.monotonic()
        self.per_test: dict[str, float] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item) -> None:
        item.stash[CPU_AT_SETUP] = self.cpu_seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.when == "teardown" and CPU_AT_SETUP in item.stash:
            report.user_properties.append((KEY, self.cpu_seconds() - item.stash[CPU_AT_SETUP]))
        return report

    def pytest_runtest_logreport(self, report) -> None:  # the controller gets every worker's
        if report.when == "teardown":
            for key, value in report.user_properties:
                if key == KEY:
                    self.per_test[report.nodeid] = value

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.worker is not None or not self.per_test:
            return
        wall = time.monotonic() - self.began
        total = sum(self.per_test.values())
        cores = available_cores()
        per_file: dict[str, float] = defaultdict(float)
        for nodeid, used in self.per_test.items():
            per_file[nodeid.split("::")[0]] += used
        write = terminalreporter.write_line
        terminalreporter.section("CPU seconds (--cpu: tools/cpu_profile.py)")
        write(f"{total:.0f} CPU-s in the tests, over {wall:.0f} s of wall time: "
              f"{total / wall / cores:.0%} of {cores} cores")  # fmt: skip
        for what, costs in (("tests", self.per_test), ("files", per_file)):
            write(f"the {SHOWN} costliest {what}:")
            ranked = sorted(costs.items(), key=lambda entry: entry[1], reverse=True)
            for name, used in ranked[:SHOWN]:
                write(f"{used:8.1f}  {name}")

    def pytest_unconfigure(self, config) -> None:
        """Back to the group this process came from, and its own removed once empty: a
        process still ending there (a kernel's fork server) gets REMOVE_SECONDS; one that
        outlives them keeps the group until it is removed by hand (rmdir)."""
        deadline = time.monotonic() + REMOVE_SECONDS
        try:
            (self.left / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return
        while True:
            try:
                self.group.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.1)


def pytest_addoption(parser) -> None:
    what = "the CPU seconds of each test and its processes (tools/cpu_profile.py)"
    parser.addoption("--cpu", action="store_true", help=what)


def pytest_configure(config) -> None:
    if config.getoption("--cpu"):
        config.pluginmanager.register(CpuProfile(config), "ddp_kit_cpu_profile")
