"""Notebook 28's choice of machines (kernel.hosts.lesson_machines), from DDP_KIT_HOSTS and
DDP_KIT_LAUNCHER, and lose_this_node() refused outside a launch of several nodes. (The lesson
itself runs under nbval on two nodes of this machine, and on network hosts over ssh and SLURM
in tests/test_hosts_lesson.py and tests/test_hosts_slurm.py.)"""

from __future__ import annotations

import pytest
from support import bench_module

from ddp_kit import worker
from ddp_kit.kernel import hosts
from ddp_kit.kernel.hosts import Machines, lesson_machines
from ddp_kit.shared.errors import LaunchConfigError


@pytest.fixture(autouse=True)
def no_lesson_hosts(monkeypatch):
    for name in ("DDP_KIT_HOSTS", "DDP_KIT_LAUNCHER", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)


def test_with_no_hosts_the_lesson_runs_two_nodes_here_and_says_so():
    machines = lesson_machines(2)
    assert machines == Machines((), "local", 2)
    assert machines.flags == "--nnodes 2" and machines.launch_args == {"nnodes": 2}
    assert str(machines).startswith("no hosts given (DDP_KIT_HOSTS is not set): 2 torchrun agents")


def test_hosts_given_are_reached_over_ssh_the_first_two_of_them(monkeypatch):
    monkeypatch.setenv("DDP_KIT_HOSTS", " box1, box2 ,box3")
    machines = lesson_machines(2)
    assert machines.flags == "--hosts box1,box2 --launcher ssh"
    assert machines.launch_args == {"hosts": ["box1", "box2"], "launcher": "ssh"}
    assert str(machines) == "2 hosts, box1, box2, started over ssh (DDP_KIT_HOSTS)."


@pytest.mark.parametrize(
    ("hosts", "launcher", "said"),
    [
        ("box1", None, "DDP_KIT_HOSTS='box1' names 1 host(s); this lesson needs 2: "
                       "DDP_KIT_HOSTS=host1,host2."),
        ("box1,box1", None, "names a host twice"),
        ("box1,box2", "mpi", "DDP_KIT_LAUNCHER='mpi': choose ssh or slurm."),
        (None, "slurm", "this kernel is not in one (no SLURM_JOB_NODELIST)"),
    ],
)  # fmt: skip
def test_bad_lesson_hosts_are_refused_naming_the_fix(monkeypatch, hosts, launcher, said):
    if hosts is not None:
        monkeypatch.setenv("DDP_KIT_HOSTS", hosts)
    if launcher is not None:
        monkeypatch.setenv("DDP_KIT_LAUNCHER", launcher)
    with pytest.raises(LaunchConfigError, match=None) as refused:
        lesson_machines(2)
    assert said in str(refused.value)


def test_an_allocation_of_one_node_is_refused_naming_salloc(monkeypatch):
    monkeypatch.setenv("DDP_KIT_LAUNCHER", "slurm")
    monkeypatch.setattr(hosts, "slurm_nodes", lambda: ["node1"])
    with pytest.raises(LaunchConfigError) as refused:
        lesson_machines(2)
    assert str(refused.value) == ("This SLURM allocation has 1 node(s); this lesson needs 2: "
                                  "start Jupyter inside `salloc --nodes 2`.")


def test_lose_this_node_outside_a_launch_of_several_nodes_is_refused(monkeypatch):
    monkeypatch.delenv("DDP_KIT_NODE", raising=False)
    with pytest.raises(RuntimeError, match="launch with nnodes=2"):
        worker.lose_this_node()


def test_ranks_start_takes_the_hosts_flags_of_session():
    from ddp_kit.kernel.magic import session_parser

    args = session_parser().parse_args(["-n", "2", "--hosts", "a,b", "--launcher", "ssh",
                                        "--python", "/opt/py"])  # fmt: skip
    assert (args.hosts, args.launcher, args.python) == ("a,b", "ssh", "/opt/py")


def test_a_session_with_hosts_but_no_launcher_is_refused_before_anything_starts():
    from ddp_kit import Session

    with pytest.raises(LaunchConfigError, match='add launcher="ssh"'):
        Session(2, hosts=["a", "b"])


def test_a_run_directory_too_deep_for_a_unix_socket_is_refused_naming_tmpdir(tmp_path):
    deep = tmp_path / ("d" * 120) / "channel-0.sock"
    with pytest.raises(LaunchConfigError, match="set TMPDIR to a shorter shared folder"):
        hosts.session_forward(deep, 4242)
    assert hosts.session_forward(tmp_path / "channel-0.sock", 4242)[:2] == [
        "-R", f"{tmp_path / 'channel-0.sock'}:127.0.0.1:4242"]


def test_the_benchmarks_link_rate_is_read_as_tc_writes_it():
    bench = bench_module()
    assert bench.link_rate("100mbit") == ("100mbit", 12.5e6)
    assert bench.link_rate("1Gbit") == ("1gbit", 125e6)
    assert bench.link_rate("12500kbit") == ("12500kbit", 12500e3 / 8)
    with pytest.raises(Exception, match="as tc writes it"):
        bench.link_rate("100mbps")  # bytes per second, to tc
