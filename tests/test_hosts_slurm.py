"""A launch and live ranks under a real SLURM, on network hosts (tests/hosts/netns.py): slurmctld
on h0, slurmd on h1 and h2, munge keys made per run; the kernel runs on h0 inside an allocation
(salloc). Its own hosts, apart from tests/test_hosts.py's, so both run at once. What the hosts
are and what a test leaves behind: tests/test_hosts.py."""

from __future__ import annotations

import psutil
import pytest
from test_hosts import (
    JOB,
    LONG,
    PYTHON,
    answer,
    kernel,
    nothing_left,
    run_lesson,
    session_code,
    started_training,
)

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]


def test_inside_a_slurm_allocation_srun_starts_one_node_per_host(net, slurm):
    seen = answer(net, f"""
import json, ddp_kit
run = ddp_kit.launch({JOB!r}, nproc=2, launcher="slurm", output="quiet")
print(json.dumps({{"seen": [run.records.get("seen", 0, r) for r in range(4)], "hosts": run.hosts,
                   "commands": run.commands}}))
""", slurm=slurm)
    assert seen["hosts"] == ["h1", "h1", "h2", "h2"]  # the allocation's nodes, by SLURM
    assert seen["seen"] == [[0, "veth-h1", 10.0, True], [1, "veth-h1", 10.0, True],
                            [2, "veth-h2", 10.0, True], [3, "veth-h2", 10.0, True]]  # fmt: skip
    (srun,) = seen["commands"]  # each node's task starts a fork server there, for the launch
    assert "--fork-server" in srun and '"ddp_kit.rank.relay", "ddp_kit.rank.agent"' in srun[-1]
    assert srun[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--nodelist=h1,h2", "--kill-on-bad-exit=1"]  # fmt: skip
    assert nothing_left(net) == {}


def test_the_two_machines_lesson_runs_on_the_nodes_of_a_slurm_allocation(net, slurm, tmp_path):
    said = run_lesson(net, tmp_path, {"DDP_KIT_LAUNCHER": "slurm", "SLURM_CONF": str(slurm.conf)},
                      ["salloc", "--nodes=2", "--quiet"])
    assert said["machines"] == "2 nodes of this SLURM allocation, h1, h2, started with srun."
    assert said["hosts"] == ["h1", "h1", "h2", "h2"]
    assert [e["GLOO_SOCKET_IFNAME"] for e in said["env"]] == ["veth-h1"] * 2 + ["veth-h2"] * 2
    assert [line[1] for line in said["commands"]] == ["--rdzv-backend=c10d"] * 2  # one per node
    across, within = said["busbw"]["across the nodes"], said["busbw"]["within a node"]
    assert 0.5 * 100e6 / 8 < across < 1.05 * 100e6 / 8 and within > 5 * across
    assert set(said["failed"]) <= {0, 1}  # srun ends node 0's tasks: some may not say a thing
    assert nothing_left(net) == {}


def test_live_ranks_on_the_nodes_of_an_allocation_run_cells_and_are_interrupted(net, slurm):
    """Session(launcher="slurm"): the kernel listens on its address toward the nodes (h0's,
    10.213.0.10), not on every interface; interrupts go by srun --overlap."""
    said = answer(net, session_code('launcher="slurm"'), slurm=slurm)
    assert said["hosts"] == ["h1", "h1", "h2", "h2"] and said["sums"] == [10.0] * 4
    assert all(a.startswith("10.213.0.10:") for a in said["addresses"])
    assert said["stopped"] == "The cell passed its cell_timeout of 4 s; ranks 0-3 were interrupted."
    assert said["told"] == [["slurm", ["h1", "h2"]]]  # by srun, not by a pid on this machine
    assert said["kept"] == [10.0] * 4
    assert nothing_left(net) == {}


def test_a_killed_kernel_in_an_allocation_leaves_no_process_on_any_node(net, slurm, tmp_path):
    # the allocation outlives the kernel (a shell waits after it): SLURM would end the steps
    # of an allocation it releases; here the kit's own stdin-end must end them
    proc = kernel(net, f"""
import ddp_kit
ddp_kit.launch({LONG!r}, nproc=2, launcher="slurm", output="quiet", args=[{str(tmp_path)!r}])
""", slurm=slurm, linger=120)
    started_training(proc, tmp_path)
    (python,) = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if p.cmdline()[:2] == [PYTHON, "-c"]]  # fmt: skip
    python.kill()  # SIGKILL: no cleanup of its own; srun sees its stdin end
    try:
        assert nothing_left(net, seconds=30) == {}
        assert proc.poll() is None  # the allocation still held all along
    finally:
        for waiting in psutil.Process(proc.pid).children(recursive=True):
            waiting.kill()  # the shell's sleep: salloc then gives the allocation back
        proc.communicate(timeout=60)

