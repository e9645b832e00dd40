"""Every test must leave no process of the kit behind (this run's own: tests/support.py).

A topic test file names the worker it proves and the numbers of ranks to run it at:

    WORKER = "join.py"        # a file in tests/workers/
    RANKS = [2, 4]            # optional, default [2]
    WORKER_ARGS = [...]       # optional: the worker's command-line arguments

and its tests take `run`, that worker's real torchrun run, launched once per number of ranks
(such tests carry the `torchrun` marker)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support import WORKERS, wait_until_gone

sys.path.insert(0, str(Path(__file__).resolve().parent / "hosts"))
from netns import (  # noqa: E402
    namespace_hosts,
    namespace_support,
    our_namespaces,
    slurm_cluster,
    sshd_hosts,
)

import ddp_kit


def pytest_generate_tests(metafunc):
    if "run" in metafunc.fixturenames and hasattr(metafunc.module, "WORKER"):
        ranks = getattr(metafunc.module, "RANKS", [2])
        ids = [f"{n}ranks" for n in ranks]
        metafunc.parametrize("run", ranks, ids=ids, indirect=True, scope="module")
        metafunc.definition.add_marker(pytest.mark.torchrun)


def pytest_collection_modifyitems(config, items):
    """The marker added above stays on the definition, not on the items parametrize makes:
    mark the items themselves, so `-m "not torchrun"` leaves out every WORKER file's runs."""
    for item in items:
        module = getattr(item, "module", None)
        if "run" in getattr(item, "fixturenames", ()) and hasattr(module, "WORKER"):
            item.add_marker(pytest.mark.torchrun)


@pytest.fixture(scope="module")
def run(request):
    """The test file's WORKER, run under torchrun at this parameter's number of ranks."""
    args = [str(a) for a in getattr(request.module, "WORKER_ARGS", [])]
    worker = WORKERS / request.module.WORKER
    return ddp_kit.launch(worker, nproc=request.param, args=args, output="quiet")


@pytest.fixture(autouse=True)
def no_orphan_processes(request):
    """Fail a test that leaves any agent or rank of this run running.

    Tests using a module-wide live session (fixture `live`) are checked when it closes."""
    yield
    if "live" in request.fixturenames:
        return
    left = wait_until_gone()
    assert not left, f"processes left running: {left}"


# -- network hosts (tests/hosts/netns.py): each test file that asks gets hosts of its own, so
# the files tests/test_hosts*.py run at once in different workers ------------------------


@pytest.fixture(scope="module")
def net():
    ok, why = namespace_support()
    for tool, package in (("/usr/sbin/sshd", "openssh-server"), ("/usr/sbin/slurmd", "slurm-wlm"),
                          ("/usr/sbin/munged", "munge")):  # fmt: skip
        if ok and not Path(tool).exists():
            ok, why = False, f"no {tool} (Debian's {package}; .ci/run installs it)"
    if not ok:
        if os.environ.get("DDP_KIT_REQUIRE_HOSTS"):
            pytest.fail(f"DDP_KIT_REQUIRE_HOSTS is set, but {why}")
        pytest.skip(why)
    with namespace_hosts(3) as hosts, sshd_hosts(hosts) as ssh:
        hosts.ssh = ssh
        yield hosts
    assert not set(hosts.namespaces()) & set(our_namespaces()), "namespaces left behind"


@pytest.fixture(scope="module")
def slurm(net):
    """A real SLURM: slurmctld on h0, slurmd on h1 and h2 (munge keys made per run)."""
    with slurm_cluster(net, controller="h0", nodes=("h1", "h2")) as cluster:
        net.slurm_daemons = {daemon.pid for daemon in cluster.daemons.values()}
        yield cluster
        net.slurm_daemons = set()
