"""A launch over several hosts (kernel.hosts), on real network hosts: Linux network namespaces
joined by a bridge, each with its own address and a real sshd (tests/hosts/netns.py). The kernel
runs in host h0 (a Python started there), the job on h1 and h2: 2 hosts x 2 ranks, over the
system's ssh, meeting at torchrun's c10d rendezvous on h1.

The addresses (10.213.0.0/24) exist only inside the namespaces: no test traffic leaves them.
The machine must let root make namespaces and have Debian's openssh-server (.ci/run installs
it); otherwise the tests skip with the reason, and DDP_KIT_REQUIRE_HOSTS=1 (set by CI) turns
that skip into a failure. Every test ends with no process of its own on any host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "hosts"))
from netns import (  # noqa: E402
    Shape,
)

from ddp_kit.kernel.hosts import CONNECT_SECONDS  # noqa: E402

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
LESSON = ROOT / "notebooks" / "28_two_machines.ipynb"


def ours(net, host: str) -> list[int]:
    """The processes of a test on `host`: all in its namespace but the daemons (sshd, slurmd)."""
    daemons = {d.pid for d in net.ssh.daemons.values()} | getattr(net, "slurm_daemons", set())
    return [p for p in net.pids(host) if p not in daemons]


def nothing_left(net, seconds: float = 15.0) -> dict[str, list[int]]:
    """Wait up to `seconds` for every host to hold no process of the test's; what is left."""
    deadline = time.monotonic() + seconds
    while True:
        left = {h: ours(net, h) for h in ("h1", "h2")}
        if not any(left.values()) or time.monotonic() > deadline:
            return {h: pids for h, pids in left.items() if pids}
        time.sleep(0.2)


def kernel(net, code: str, slurm=None, linger: int = 0, **popen) -> subprocess.Popen:
    """A kernel on h0: Python running `code`, ssh told where the hosts' keys are; with `slurm`,
    inside an allocation of both nodes (salloc), as a kernel on a cluster's login node, which
    the allocation outlives by `linger` seconds."""
    env = {**os.environ, "DDP_KIT_SSH_OPTIONS": f"-F {net.ssh.config}", "DDP_KIT_PROGRESS": "0"}
    allocation = []
    if slurm is not None:
        env["SLURM_CONF"] = str(slurm.conf)
        allocation = ["salloc", "--nodes=2", "--quiet"]
        if linger:
            allocation += ["sh", "-c", f'"$@"; sleep {linger}', "kernel"]
    return net.popen("h0", *allocation, PYTHON, "-c", code, env=env, cwd=ROOT, text=True,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)  # fmt: skip


def answer(net, code: str, timeout: float = 180, slurm=None) -> dict:
    """Run `code` in a kernel on h0; the JSON it printed last."""
    proc = kernel(net, code, slurm)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


JOB = """
import os
import psutil
import torch
import torch.distributed as dist
from ddp_kit.worker import backend, record
dist.init_process_group(backend())
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
forked = "ddp_kit.rank.forkserver" in " ".join(psutil.Process().cmdline())  # the server's
record("seen", [dist.get_rank(), os.environ["GLOO_SOCKET_IFNAME"], total.item(), forked])
print("sum", total.item())
dist.destroy_process_group()
"""


def test_two_hosts_two_ranks_each_are_one_job_over_ssh(net):
    # h2 first: its agent serves the rendezvous, but torchrun numbers the nodes by address
    seen = answer(net, f"""
import json, ddp_kit
run = ddp_kit.launch({JOB!r}, nproc=2, hosts=["h2", "h1"], launcher="ssh", output="quiet")
print(json.dumps({{"seen": [run.records.get("seen", 0, r) for r in range(4)], "hosts": run.hosts,
                   "stdout": run.stdout, "commands": run.commands}}))
""")
    assert seen["hosts"] == ["h1", "h1", "h2", "h2"]
    # every rank: its own rank, its host's interface, 1 + 2 + 3 + 4
    # (and each was forked by its host's fork server: the fast start, kernel.fast_start)
    assert seen["seen"] == [[0, "veth-h1", 10.0, True], [1, "veth-h1", 10.0, True],
                            [2, "veth-h2", 10.0, True], [3, "veth-h2", 10.0, True]]  # fmt: skip
    assert seen["stdout"] == ["sum 10.0\n"] * 4
    h2, h1 = seen["commands"]
    assert h2[0] == "ssh" and "h2" in h2 and "--rdzv-backend=c10d" in h2[-1]
    assert "is_host=1" in h2[-1] and "is_host=0" in h1[-1]
    assert "--rdzv-endpoint=10.213.0.12:" in h1[-1] and "--local-addr=10.213.0.11" in h1[-1]
    assert nothing_left(net) == {}


@pytest.mark.parametrize("start", ["fast", "plain"])  # plain: every process a fresh Python
def test_a_failed_rank_is_named_with_its_host(net, start):
    said = answer(net, """
import json, time, ddp_kit
from ddp_kit.shared.errors import WorkerError
start = time.monotonic()
try:
    failing = "from ddp_kit.worker import rank\\nif rank() == 3: raise ValueError('on purpose')"
    ddp_kit.launch(failing, nproc=2, hosts="h1,h2", launcher="ssh", output="quiet",
                   env={"DDP_KIT_FAST_START": "ONE_OR_ZERO"})
except WorkerError as error:
    print(json.dumps({"message": str(error), "notes": error.result.notes,
                      "seconds": time.monotonic() - start, "commands": error.result.commands}))
""".replace("ONE_OR_ZERO", "1" if start == "fast" else "0"))
    relayed = ["--fork-server" in word or "rank.relay" in word
               for command in said["commands"] for word in command]  # fmt: skip
    assert any(relayed) == (start == "fast")
    assert said["message"].startswith("Rank 3 failed with ValueError: on purpose")
    assert "Rank 3 ran on host h2 (ranks 2, 3)." in said["message"]
    # h1's ranks finished: its agent would wait in torchrun's exit barrier, 300 s
    assert said["notes"] == ["Host h2's agent ended first, with exit code 1: the job had failed, "
                             "so the kit stopped the other agents 5 s later (torchrun would keep "
                             "them waiting for it)."]  # fmt: skip
    assert said["seconds"] < 120
    assert nothing_left(net) == {}


REFUSED = """
import json, time, ddp_kit
from ddp_kit.shared.errors import LaunchConfigError
start = time.monotonic()
try:
    ddp_kit.launch("print('never runs')", nproc=2, hosts=["h1", "h2"], launcher="ssh")
except LaunchConfigError as error:
    print(json.dumps({"message": str(error), "seconds": time.monotonic() - start}))
"""


def test_an_unreachable_host_is_refused_in_bounded_time_naming_it_and_sshs_error(net):
    net.ssh.stop("h2")
    try:
        said = answer(net, REFUSED)
    finally:
        net.ssh.start("h2")
    assert said["message"] == ("Host h2 cannot start the job: ssh: connect to host 10.213.0.12 "
                               "port 22: Connection refused")  # fmt: skip
    assert said["seconds"] < CONNECT_SECONDS + 30  # ssh's bound, and h1's answer (torch import)
    assert nothing_left(net) == {}


def test_a_host_that_never_answers_is_given_up_after_sshs_connect_timeout(net):
    # h2 drops its answers to h0: a SYN arrives, no SYN-ACK leaves (no refusal, no ARP failure)
    blackhole = ["ip", "-n", net["h2"].netns, "route", "add", "blackhole", f"{net['h0'].addr}/32"]
    subprocess.run(blackhole, check=True)
    try:
        said = answer(net, REFUSED)
    finally:
        subprocess.run([*blackhole[:4], "del", *blackhole[5:]], check=True)
    assert said["message"] == ("Host h2 cannot start the job: ssh: connect to host 10.213.0.12 "
                               "port 22: Connection timed out")  # fmt: skip
    assert CONNECT_SECONDS - 1 < said["seconds"] < CONNECT_SECONDS + 30
    assert nothing_left(net) == {}


def test_one_machine_under_two_names_is_refused_before_anything_starts(net):
    said = answer(net, """
import json, ddp_kit
from ddp_kit.shared.errors import LaunchConfigError
try:
    ddp_kit.launch("print('never runs')", hosts=["h1", "10.213.0.11"], launcher="ssh")
except LaunchConfigError as error:
    print(json.dumps({"message": str(error)}))
""")["message"]
    assert said == ("Hosts h1 and 10.213.0.11 are one machine: both answered from 10.213.0.11. "
                    "One agent per host: name it once; more ranks on it: nproc.")
    assert nothing_left(net) == {}  # nothing started


def test_a_host_with_another_torch_is_refused_before_anything_starts(net, tmp_path):
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(  # a version, and no GPU
        "__version__ = '0.0.1'\nclass cuda:\n    device_count = staticmethod(lambda: 0)\n"
        "    is_available = staticmethod(lambda: False)\n"
    )
    python = tmp_path / "python"  # the same Python, finding another torch first
    python.write_text(f"#!/bin/sh\nPYTHONPATH={fake}:$PYTHONPATH exec {PYTHON} \"$@\"\n")
    python.chmod(0o755)
    said = answer(net, f"""
import json, ddp_kit
from ddp_kit.shared.errors import LaunchConfigError
try:
    ddp_kit.launch("print('never runs')", hosts=["h1", "h2"], launcher="ssh",
                   python={str(python)!r})
except LaunchConfigError as error:
    print(json.dumps({{"message": str(error)}}))
""")["message"]
    kernels = torch.__version__
    assert said.startswith(f"Host h1 runs torch 0.0.1 (from {PYTHON}), the kernel {kernels}")
    assert said.endswith("give the hosts the same, or name it with python=.")
    assert nothing_left(net) == {}  # nothing started


LONG = """
import sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from ddp_kit.worker import backend
dist.init_process_group(backend())
dist.all_reduce(torch.ones(1))
(Path(sys.argv[1]) / str(dist.get_rank())).touch()   # training: the test may strike
for _ in range(600):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
"""


def started_training(proc: subprocess.Popen, ready: Path, seconds: float = 90) -> None:
    """Wait until all 4 ranks train (each has done an all-reduce and left a file in `ready`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(list(ready.iterdir())) == 4:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("the ranks did not start")


def test_a_host_lost_mid_run_ends_the_job_within_the_collective_timeout(net, tmp_path):
    proc = kernel(net, f"""
import json, time, ddp_kit
start = time.monotonic()
run = ddp_kit.launch({LONG!r}, nproc=2, hosts=["h1", "h2"], launcher="ssh", output="quiet",
                     collective_timeout=10, check=False, args=[{str(tmp_path)!r}])
print(json.dumps({{"ok": run.ok, "seconds": time.monotonic() - start, "notes": run.notes,
                   "failed": sorted(f.rank for f in run.failures), "hosts": run.hosts}}))
""")
    started_training(proc, tmp_path)
    lost = time.monotonic()
    for pid in ours(net, "h2"):  # the host's agent and ranks, all at once: the host is gone
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile, as its parent died
            os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    ended = time.monotonic() - lost
    said = json.loads(out.strip().splitlines()[-1])
    assert not said["ok"] and set(said["failed"]) >= {0, 1}, (said, err[-3000:])
    assert ended < 10 + 30  # the collective timeout, and the agents' teardown
    assert said["hosts"] == ["h1", "h1", "h2", "h2"]
    assert said["notes"][0] == ("Host h2 was lost: its ssh connection ended with exit code 255, "
                                "ssh's own error (the host went down, or the network to it).")
    assert nothing_left(net) == {}


def test_a_killed_kernel_leaves_no_process_on_any_host(net, tmp_path):
    proc = kernel(net, f"""
import ddp_kit
ddp_kit.launch({LONG!r}, nproc=2, hosts=["h1", "h2"], launcher="ssh", output="quiet",
               args=[{str(tmp_path)!r}])
""")
    started_training(proc, tmp_path)
    proc.kill()  # SIGKILL: no cleanup of its own; ssh sees its stdin end
    proc.communicate()
    assert nothing_left(net, seconds=30) == {}


# Appended to notebook 28's cells: what it measured and saw, for the test to read
LESSON_FACTS = """
import json
print(json.dumps({"machines": str(machines), "hosts": step.hosts, "env": env,
                  "commands": [rendezvous_flags(line) for line in lines],
                  "busbw": {name: costmodel.busbw(sizes[-1], t[-1], 2)
                            for name, t in seconds.items()},
                  "failed": failed, "notes": lost.notes, "lost_hosts": lost.hosts}))
"""


def run_lesson(net, tmp_path: Path, env: dict[str, str], allocation: list[str]) -> dict:
    """Notebook 28 executed by a kernel on h0 (inside `allocation`, if any), h2's link shaped
    to 100 Mbit/s meanwhile; what LESSON_FACTS printed."""
    copy = tmp_path / LESSON.name
    lesson = nbformat.read(LESSON, as_version=4)
    lesson.cells.append(nbformat.v4.new_code_cell(LESSON_FACTS))
    nbformat.write(lesson, copy)
    env = {**os.environ, "DDP_KIT_SSH_OPTIONS": f"-F {net.ssh.config}", "DDP_KIT_PROGRESS": "0",
           **env}  # fmt: skip
    net.shape("h2", Shape("100mbit"))
    try:
        proc = net.popen("h0", *allocation, PYTHON, ROOT / "tests" / "workers" /
                         "execute_notebooks.py", copy, env=env, cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        out, err = proc.communicate(timeout=300)
    finally:
        net.unshape("h2")
    assert proc.returncode == 0, err[-5000:]
    return json.loads(nbformat.read(copy, as_version=4).cells[-1].outputs[0]["text"])


SESSION = """
import json, os, stat, time, ddp_kit
from ddp_kit.shared.errors import CellError
from ddp_kit.kernel import hosts
told, interrupt_ranks = [], hosts.interrupt_ranks
def recorded(launcher, pids):  # the interrupts the session sends, kept to be checked
    told.append([launcher, sorted(pids)])
    interrupt_ranks(launcher, pids)
hosts.interrupt_ranks = recorded
session = ddp_kit.Session(2, {where}, output="quiet", cell_timeout=4, collective_timeout=10)
said = {{"hosts": session.rank_hosts, "status": session.status(), "told": told}}
session.run(SETUP)
said["sums"] = [float(t[0]) for t in session.pull("total")]
said["addresses"] = session.pull("address")
said["modes"] = session.pull("mode")
start = time.monotonic()
try:
    session.run(FOREVER)
except CellError as error:
    said["stopped"] = str(error).splitlines()[0]
said["interrupted_in"] = time.monotonic() - start
said["kept"] = [float(t[0]) for t in session.pull("total")]
session.close()
print(json.dumps(said))
"""
SESSION_CELLS = {
    "SETUP": """
import os, stat, torch, torch.distributed as dist
from ddp_kit.worker import backend
dist.init_process_group(backend())
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
address = os.environ["DDP_KIT_SESSION_ADDRESS"]
mode = oct(stat.S_IMODE(os.stat(address).st_mode)) if address.startswith("/") else None
""",
    "FOREVER": "import time\nwhile True:\n    time.sleep(0.1)\n",
}


def session_code(where: str) -> str:
    """A kernel's code: a session placed by `where`, its cells, what it saw as JSON."""
    cells = "".join(f"{name} = {code!r}\n" for name, code in SESSION_CELLS.items())
    return cells + SESSION.format(where=where)


def test_live_ranks_on_two_hosts_over_ssh_run_cells_and_are_interrupted(net):
    """Session(hosts=, launcher="ssh"): each host's ranks reach the kernel through a Unix
    socket that its ssh forwards to the kernel's 127.0.0.1 (mode 0600); cells run on both
    hosts, a cell past cell_timeout is interrupted on both (SIGINT over ssh) and the ranks'
    variables are kept."""
    said = answer(net, session_code('hosts=["h2", "h1"], launcher="ssh"'))
    assert said["hosts"] == ["h1", "h1", "h2", "h2"] and said["sums"] == [10.0] * 4
    assert "pids {0: h1/" in said["status"] and "memory not measured" in said["status"]
    assert all(a.startswith("/") and a.endswith(".sock") for a in said["addresses"])
    assert len(set(said["addresses"])) == 2 and said["modes"] == ["0o600"] * 4
    assert said["stopped"] == "The cell passed its cell_timeout of 4 s; ranks 0-3 were interrupted."
    assert said["interrupted_in"] < 4 + 5  # the limit, and INTERRUPT_GRACE
    assert said["told"] == [["ssh", ["h1", "h2"]]]  # over ssh, not by a pid on this machine
    assert said["kept"] == [10.0] * 4
    assert nothing_left(net) == {}


def test_a_killed_kernel_with_live_ranks_on_hosts_leaves_no_process_on_any_host(net):
    proc = kernel(net, """
import ddp_kit, sys
session = ddp_kit.Session(2, hosts=["h1", "h2"], launcher="ssh", output="quiet")
print("up", flush=True)
sys.stdin.read()
""", stdin=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "up", proc.stderr.read()
    proc.kill()  # SIGKILL: each host's ssh sees its stdin end
    proc.communicate()
    assert nothing_left(net, seconds=30) == {}


def test_a_host_lost_mid_cell_is_named_and_a_restart_refused_says_why(net, tmp_path):
    """h2 goes down mid-cell (its sshd stopped, then every process of ours there killed): the
    cell ends at once naming the host, the kit stops every rank, and the restart's probe,
    refused by h2, is said in the same error with its fix."""
    proc = kernel(net, """
import json, time, ddp_kit
from ddp_kit.shared.errors import SessionError
session = ddp_kit.Session(2, hosts=["h1", "h2"], launcher="ssh", output="quiet",
                          collective_timeout=10)
session.run("import torch, torch.distributed as dist\\nfrom ddp_kit.worker import backend\\n"
            "dist.init_process_group(backend())")
print("up", flush=True)
start, said = time.monotonic(), {}
try:
    session.run("import time\\nfor _ in range(600):\\n    dist.all_reduce(torch.ones(1))\\n"
                "    time.sleep(0.1)")
except SessionError as error:
    said = {"error": str(error), "seconds": time.monotonic() - start,
            "running": session.running}
session.close()
print(json.dumps(said))
""")
    assert proc.stdout.readline().strip() == "up", proc.stderr.read()
    time.sleep(1)  # the cell's all-reduces are running
    net.ssh.stop("h2")
    try:
        for pid in ours(net, "h2"):  # its agent, ranks and ssh sessions, all at once
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        net.ssh.start("h2")
    assert out.strip(), err[-3000:]
    said = json.loads(out.strip().splitlines()[-1])
    assert said, err[-3000:]
    assert said["seconds"] < 10 + 30, said  # the collective timeout, the stop and the probe
    assert said["error"].startswith("Rank 2's process ended on host h2") or said[
        "error"].startswith("Rank 3's process ended on host h2"), said["error"]
    assert "the kit stopped every rank. The ranks could not start again: Host h2" in said["error"]
    assert said["error"].endswith("Once every host answers: session.start(), or %ranks start "
                                  "with the same -n, --hosts and --launcher.")
    assert not said["running"]
    assert nothing_left(net) == {}


def test_the_slurm_launcher_outside_an_allocation_is_refused_naming_the_fix(monkeypatch):
    import ddp_kit
    from ddp_kit.shared.errors import LaunchConfigError

    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(LaunchConfigError) as caught:
        ddp_kit.launch("print('never runs')", launcher="slurm")
    assert str(caught.value) == (
        'launcher="slurm" runs inside a SLURM allocation, and this kernel is not in one (no '
        'SLURM_JOB_NODELIST): start Jupyter inside `salloc --nodes 2`, or use launcher="ssh".'
    )

