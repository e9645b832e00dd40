"""The fast start (kernel.fast_start): a rank forked by the fork server sees what a fresh rank
sees and ends as it would; DDP_KIT_FAST_START=0 gives the plain start; nothing outlives its
relay; a relay with no server starts plain; the server's reasons to refuse a fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import KERNEL_SIGINT, WORKERS, kit_roles, wait_until_gone

import ddp_kit
from ddp_kit.kernel import fast_start
from ddp_kit.shared import contract
from ddp_kit.shared.errors import WorkerError

pytestmark = pytest.mark.torchrun

PROBE = WORKERS / "fresh_process.py"
PLAIN = {contract.FAST_START: "0"}
DRAWN = ("random", "numpy_random", "torch_seed")  # drawn afresh in every process


def probe(env: dict | None = None) -> list[dict]:
    """What each rank of a 2-rank run of the probe saw."""
    result = ddp_kit.launch(PROBE, nproc=2, args=["--arg"], env=env, output="quiet")
    return [json.loads(out.splitlines()[0]) for out in result.stdout]


def test_a_forked_rank_sees_what_a_fresh_rank_sees():
    fast, again, plain = probe(), probe(), probe(PLAIN)
    assert [r["forked"] for r in fast] == [True, True]
    assert [r["forked"] for r in plain] == [False, False]
    # random, numpy and torch are seeded afresh in every forked process, as in a fresh one
    for key in DRAWN:
        assert len({fast[0][key], again[0][key], again[1][key]}) == 3
    for forked, fresh in zip(fast, plain, strict=True):
        for key in DRAWN:
            assert forked[key] != fresh[key]
            del forked[key], fresh[key]
        del forked["forked"], fresh["forked"]
        assert forked == fresh
    assert fast[0]["name"] == "__main__" and fast[0]["argv"] == [str(PROBE), "--arg"]
    assert fast[1]["env"]["RANK"] == "1" and fast[1]["env"]["WORLD_SIZE"] == "2"
    assert not fast[0]["cuda_initialized"] and not fast[0]["process_group"]


@pytest.mark.parametrize("ending", [["exit", "3"], ["kill", "SIGKILL"]])
def test_a_forked_rank_ends_and_is_reported_as_a_fresh_one(ending):
    messages = []
    for env in (None, PLAIN):
        with pytest.raises(WorkerError) as caught:
            ddp_kit.launch(PROBE, nproc=2, args=ending, env=env, output="quiet")
        result = caught.value.result
        assert result.stderr == ["stderr of rank 0\n", "stderr of rank 1\n"]
        # the same, but for the lines the rank printed (its probe's values differ)
        messages.append(str(caught.value).split("Its last lines:")[0])
    assert messages[0] == messages[1]


def test_a_debug_level_is_the_runs_own_and_needs_no_server_of_its_own():
    default = probe()
    server = fast_start.current()
    detail = probe({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert fast_start.current() is server  # debug= is per run (forkserver.PER_RUN)
    plain = probe({**PLAIN, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert [r["forked"] for r in detail] == [True, True]
    assert [r["debug_level"] for r in default] == ["DebugLevel.OFF"] * 2
    assert [r["debug_level"] for r in detail] == [r["debug_level"] for r in plain]
    assert [r["debug_level"] for r in detail] == ["DebugLevel.DETAIL"] * 2


def test_a_run_in_another_environment_gets_a_server_of_its_own():
    ddp_kit.launch("pass", nproc=1, output="quiet")
    first = fast_start.current()
    code = "import os\nprint(os.environ['DDP_KIT_TEST_EXTRA'], flush=True)"
    result = ddp_kit.launch(code, nproc=1, env={"DDP_KIT_TEST_EXTRA": "x"}, output="quiet")
    assert result.stdout == ["x\n"]  # DDP_KIT_ variables are per run: the same server
    assert fast_start.current() is first
    result = ddp_kit.launch(code.replace("DDP_KIT_TEST_EXTRA", "EXTRA"), nproc=1,
                            env={"EXTRA": "y"}, output="quiet")  # fmt: skip
    assert result.stdout == ["y\n"]
    assert fast_start.current() is not first  # EXTRA might change how torch starts
    first.proc.wait(timeout=10)  # retired, and with no process of its own left: ended
    assert not first.folder.exists()  # the server removed its folder as it ended


@pytest.mark.parametrize("ending", ["SIGKILL"])  # (an exit retires it: tested above)
def test_a_server_whose_kernel_ends_ends_and_removes_its_folder(tmp_path, ending):
    code = (
        "import os, signal, ddp_kit\nfrom ddp_kit.kernel import fast_start\n"
        "ddp_kit.launch('pass', nproc=1, output='quiet')\n"
        "print(fast_start.current().folder, fast_start.current().proc.pid, flush=True)\n"
        + ("os.kill(os.getpid(), signal.SIGKILL)" if ending == "SIGKILL" else "")
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == (-9 if ending == "SIGKILL" else 0), done.stderr
    folder, pid = done.stdout.split()
    deadline = time.monotonic() + 15
    while psutil.pid_exists(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(int(pid))
    assert not Path(folder).exists()


WHY_NOT_FORK = """
import os, threading
from ddp_kit.rank.forkserver import why_not_fork
started_in = dict(os.environ)
print(why_not_fork({"env": dict(os.environ, RANK="3", DDP_KIT_RECORD_DIR="/x")}, started_in))
print(why_not_fork({"env": dict(os.environ, OMP_NUM_THREADS="7")}, started_in))
threading.Thread(target=threading.Event().wait, daemon=True).start()
print(why_not_fork({"env": dict(os.environ)}, started_in))
"""


def test_the_server_forks_only_with_one_thread_and_the_same_environment():
    # in a fresh process: this test process has threads of its own
    done = subprocess.run([sys.executable, "-c", WHY_NOT_FORK], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.stdout.splitlines() == [
        "None",  # RANK and DDP_KIT_ variables are the run's own
        "the environment differs from the fork server's in OMP_NUM_THREADS",
        "the fork server has 2 threads; forking it is safe with one",
    ], done.stderr


def test_a_relay_without_a_server_runs_its_module_plainly():
    env = {**os.environ, contract.FORK_SERVER: "/nonexistent/socket"}
    command = [sys.executable, "-u", "-m", "ddp_kit.rank.relay", "platform", "--terse"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == __import__("platform").platform(
        terse=True
    )


def test_nccl_and_the_switch_start_plain():
    assert fast_start.wanted({contract.BACKEND: "gloo"}) == sys.platform.startswith("linux")
    assert not fast_start.wanted({contract.BACKEND: "nccl"})
    assert not fast_start.wanted({contract.BACKEND: "gloo", contract.FAST_START: "0"})


KERNEL = (
    KERNEL_SIGINT
    + """
import ddp_kit
print("READY", flush=True)
# the ranks hold the GIL (a PyDLL call keeps it), so no thread of theirs can run
ddp_kit.launch("import ctypes\\nctypes.PyDLL(None).sleep(60)", nproc=2)
"""
)


def test_a_killed_relay_ends_its_forked_process():
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdout.readline().strip() == "READY"
        deadline = time.monotonic() + 60
        while kit_roles()["forked"] < 3:  # the agent and 2 ranks
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        server = next(p for p in psutil.Process(kernel.pid).children()
                      if "ddp_kit.rank.forkserver" in " ".join(p.cmdline()))  # fmt: skip
        forked = server.children()
        relays = [p for p in psutil.Process(kernel.pid).children(recursive=True)
                  if "ddp_kit.rank.relay" in p.cmdline()]  # fmt: skip
        agent_relay = next(p for p in relays if "ddp_kit.rank.agent" in p.cmdline())
        agent_relay.send_signal(signal.SIGKILL)
        _, alive = psutil.wait_procs(forked, timeout=10)
        # the agent on its relay's end, the ranks on theirs: the server ends each (a rank's
        # own watch thread cannot run while the rank holds the GIL)
        assert alive == []
    finally:
        kernel.kill()
        kernel.wait()
    assert wait_until_gone(15) == []


NODES_KERNEL = (
    KERNEL_SIGINT
    + """
import sys, ddp_kit
print("READY", flush=True)
# each rank leaves NODE-PID in the folder, then holds the GIL: no thread of its own can run
ddp_kit.launch("import ctypes, os, pathlib, sys\\n"
               "pathlib.Path(sys.argv[1], os.environ['DDP_KIT_NODE'] + '-' + str(os.getpid()))"
               ".touch()\\nctypes.PyDLL(None).sleep(60)", nproc=2, nnodes=2, args=[sys.argv[1]])
"""
)


def environ(process: psutil.Process) -> dict[str, str]:
    """A process's environment, or none if it ended meanwhile."""
    try:
        return process.environ()
    except psutil.Error:
        return {}


def test_the_server_ends_one_nodes_forked_processes_at_once_but_the_caller(tmp_path):
    """lose_this_node's request (forkserver.end_children): the node's forked agent and ranks
    get SIGKILL from the server before it answers, the caller is spared, the other node's stay."""
    from ddp_kit.rank.forkserver import end_children

    kernel = subprocess.Popen([sys.executable, "-c", NODES_KERNEL, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert kernel.stdout.readline().strip() == "READY"
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 4:
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        ranks = {}  # node -> its ranks' pids, the forked processes
        for path in tmp_path.iterdir():
            node, pid = path.name.split("-")
            ranks.setdefault(node, []).append(int(pid))
        server = next(p for p in psutil.Process(kernel.pid).children()
                      if "ddp_kit.rank.forkserver" in " ".join(p.cmdline()))  # fmt: skip
        agents = {p.pid for p in server.children()} - {*ranks["0"], *ranks["1"]}
        relay = next(p for p in psutil.Process(kernel.pid).children(recursive=True)
                     if environ(p).get(contract.NODE) == "1")  # fmt: skip
        node_1 = {k: relay.environ()[k] for k in (contract.NODE, contract.MARKER_DIR)}
        socket_path = relay.environ()[contract.FORK_SERVER]
        assert end_children(socket_path, {**node_1, contract.NODE: "7"}, spare=0) == []
        caller, other = ranks["1"]
        ended = end_children(socket_path, node_1, spare=caller)
        assert len(ended) == 2 and other in ended and set(ended) - {other} <= agents
        deadline = time.monotonic() + 5  # the server reaps them
        while any(map(psutil.pid_exists, ended)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(psutil.pid_exists, ended))
        # node 0's stay (the caller was not sent it, but its relay ends with node 1's agent)
        assert all(map(psutil.pid_exists, [*ranks["0"], *(agents - set(ended))]))
    finally:
        kernel.kill()
        kernel.wait()
    assert wait_until_gone(15) == []
    assert end_children(socket_path, node_1, spare=0) is None  # no server listens there now


def test_loading_the_extension_starts_the_server_that_a_default_run_uses():
    from IPython.core.interactiveshell import InteractiveShell

    fast_start.retire()
    ddp_kit.load_ipython_extension(InteractiveShell.instance())  # what %load_ext ddp_kit calls
    server = fast_start.current()
    assert server is not None  # started before any run
    ddp_kit.launch("pass", nproc=2, output="quiet")
    assert fast_start.current() is server  # and the first run used it
