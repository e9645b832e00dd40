"""Live ranks: real torchrun sessions (gloo, CPU): DDP cell by cell, interrupts, killed kernels,
two sessions, the channel's key and the magics."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from multiprocessing.connection import Client, Listener

import numpy as np
import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell
from support import KERNEL_SIGINT, SETUP, kit_frames, kit_roles, wait_until_gone

import ddp_kit
from ddp_kit.kernel.channel import accept_ranks
from ddp_kit.kernel.session import Session
from ddp_kit.shared import contract
from ddp_kit.shared.contract import Hello, send_at_once
from ddp_kit.shared.errors import LaunchConfigError, SessionError

pytestmark = pytest.mark.torchrun


def test_a_rank_stuck_in_a_collective_makes_the_session_restart():
    with Session(2, collective_timeout=60, cell_timeout=2, output="quiet") as session:
        session.run(SETUP + "kept = 1\n")
        old = set(session.pids.values())
        with pytest.raises(SessionError, match="did not come back within 5 s.*was restarted"):
            session.run("if rank == 0:\n    dist.all_reduce(torch.ones(1))\n")
        assert session.running and not old & set(session.pids.values())
        assert session.run("1 + 1").stdout == ["2\n", "2\n"]
    assert wait_until_gone(5) == []


STEPS = 3
TRAIN_SETUP = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from ddp_kit.toy import make_dataset, make_model
from ddp_kit.worker import backend

dist.init_process_group(backend())
data = make_dataset(24)
loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=True, seed=3))
model = DDP(make_model(seed=dist.get_rank()))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = iter(loader)
"""
FORWARD = (
    "x, y = next(batches)\noptimizer.zero_grad()\nloss = torch.nn.functional.mse_loss(model(x), y)"
)
BACKWARD = "loss.backward()"
STEP = "optimizer.step()\nweights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])"


def test_ddp_walked_cell_by_cell_equals_the_same_training_in_one_launch():
    with Session(4, output="quiet") as session:
        session.run(TRAIN_SETUP)
        session.run("total = torch.tensor([dist.get_rank() + 1.0])\ndist.all_reduce(total)")
        assert [t.item() for t in session.pull("total")] == [10.0] * 4  # 1 + 2 + 3 + 4
        for _ in range(STEPS):
            for cell in (FORWARD, BACKWARD, STEP):
                session.run(cell)
        walked = np.stack(session.pull("weights"))
    script = TRAIN_SETUP + f"for _ in range({STEPS}):\n"
    script += textwrap.indent("\n".join([FORWARD, BACKWARD, STEP]), "    ")
    script += "\nfrom ddp_kit.worker import record\nrecord('weights', weights)\n"
    launched = ddp_kit.launch(script, nproc=4, output="quiet").records["weights"][0]
    assert np.array_equal(walked, launched)  # bit for bit
    assert all(np.array_equal(walked[r], walked[0]) for r in range(4))


KERNEL = """
import sys, time
from ddp_kit.kernel.session import Session
session = Session(2, output="quiet")
print("READY", flush=True)
try:
    session.run("import os, pathlib, time\\n"
                "if 'RUNNING_MARKS' in os.environ:\\n"  # the test waits for both ranks' marks
                "    pathlib.Path(os.environ['RUNNING_MARKS'], os.environ['RANK']).touch()\\n"
                "time.sleep(60)")
except KeyboardInterrupt as stop:
    print("INTERRUPTED", stop, flush=True)
    print("ALIVE", session.run("1 + 1").stdout, flush=True)
    session.close()
    sys.exit(0)
time.sleep(60)
"""


def start_kernel(code: str, env: dict | None = None) -> subprocess.Popen:
    """A separate Python process standing in for a notebook kernel; waits for READY."""
    import os

    kernel = subprocess.Popen([sys.executable, "-c", KERNEL_SIGINT + code],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, **(env or {})})  # fmt: skip
    assert kernel.stdout.readline().strip() == "READY"
    return kernel


def test_interrupting_the_kernel_interrupts_the_ranks_and_keeps_the_session(tmp_path):
    kernel = start_kernel(KERNEL, {"RUNNING_MARKS": str(tmp_path)})
    deadline = time.monotonic() + 60  # the cell runs on both ranks (not a guessed second)
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    kernel.send_signal(signal.SIGINT)  # Jupyter's stop button
    out, _ = kernel.communicate(timeout=60)
    assert "INTERRUPTED The cell was interrupted; ranks 0-1 were interrupted." in out
    assert "The session is still running" in out and "ALIVE ['2\\n', '2\\n']" in out
    assert wait_until_gone(5) == []


@pytest.mark.parametrize("start", ["fast", "plain"])
@pytest.mark.parametrize("guard", ["pdeathsig", "watchdog"])
def test_a_killed_kernel_leaves_no_process(guard, start):
    env = {"DDP_KIT_NO_PDEATHSIG": "1"} if guard == "watchdog" else {}
    if start == "plain":
        env["DDP_KIT_FAST_START"] = "0"
    kernel = start_kernel(KERNEL, env)
    try:
        roles = kit_roles()
        assert (roles["agent"], roles["rank"]) == (1, 2)
        assert roles["forked"] == (3 if start == "fast" else 0)  # behind the relays
    finally:
        kernel.kill()  # a crashed or restarted kernel: no chance to clean up
        kernel.wait()
    assert wait_until_gone(15) == []


def test_two_sessions_at_once_do_not_collide():
    with Session(2, output="quiet") as first, Session(2, output="quiet") as second:
        for session, tag in ((first, 1), (second, 2)):
            session.run(SETUP + f"t = torch.tensor([{tag}.0])\ndist.all_reduce(t)")
        assert [v.item() for v in first.pull("t")] == [2.0, 2.0]
        assert [v.item() for v in second.pull("t")] == [4.0, 4.0]
    assert wait_until_gone(5) == []


def test_a_connection_without_the_key_is_refused_before_anything_is_read():
    listener = Listener(("127.0.0.1", 0), family="AF_INET", authkey=b"right key")
    results = {}
    thread = threading.Thread(
        target=lambda: results.update(accepted=accept_ranks(listener, 1, lambda: True, 20))
    )
    thread.start()
    with pytest.raises(Exception, match="digest"):
        Client(listener.address, family="AF_INET", authkey=b"wrong key")
    good = Client(listener.address, family="AF_INET", authkey=b"right key")
    good.send(Hello(0, 1234))
    thread.join(20)
    listener.close()
    assert list(results["accepted"]) == [0] and results["accepted"][0][1] == 1234
    assert nagle_off(results["accepted"][0][0])  # the kernel's end sends each message at once
    assert not nagle_off(good) and nagle_off(send_at_once(good))  # and the rank's end
    good.close()


def nagle_off(connection) -> bool:
    """Whether TCP_NODELAY is set on the connection's socket."""
    with socket.socket(fileno=os.dup(connection.fileno())) as sock:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


@pytest.fixture
def shell():
    ipython = InteractiveShell.instance()
    ipython.run_line_magic("load_ext", "ddp_kit")
    yield ipython
    ipython.run_line_magic("ranks", "stop")


def test_the_magics_in_a_real_shell(shell, capsys):
    with pytest.raises(LaunchConfigError, match="No live ranks: start them first"):
        shell.run_cell_magic("ranks", "", "print(1)")
    shell.run_line_magic("ranks", "start -n 2")
    assert "[ddp_kit] 2 live ranks ready (gloo on cpu)" in capsys.readouterr().out
    with pytest.raises(LaunchConfigError, match="already running.*%ranks restart"):
        shell.run_line_magic("ranks", "start")
    shell.run_cell_magic("ranks", "", "from ddp_kit.worker import rank\nprint('hi', rank())")
    assert capsys.readouterr().out == "[rank 0] hi 0\n[rank 1] hi 1\n"
    shell.run_cell_magic("ranks", "--on 1 --result one", "print('only', rank())")
    assert capsys.readouterr().out == "[rank 1] only 1\n"
    assert shell.user_ns["one"].ranks == [1]
    shell.run_line_magic("ranks", "status")
    assert "2 live ranks, gloo on cpu" in capsys.readouterr().out
    assert isinstance(shell.user_ns["session"], Session)
    for line, match in [("--on x", "--on: 'x' is not a rank list"), ("--on 5", "ranks \\[5\\]")]:
        with pytest.raises((LaunchConfigError, SessionError), match=match):
            shell.run_cell_magic("ranks", line, "print(1)")
    with pytest.raises(LaunchConfigError, match="unknown command 'go'"):
        shell.run_line_magic("ranks", "go")
    with pytest.raises(LaunchConfigError, match="invalid int value: 'four'"):
        shell.run_line_magic("ranks", "start -n four")
    shell.run_line_magic("ranks", "stop")
    assert wait_until_gone(5) == []
    doc = shell.find_magic("ranks").__doc__
    for flag in ("--nproc", "--backend", "--collective-timeout", "--cell-timeout", "--on"):
        assert flag in doc


def test_kit_messages_in_a_shell_are_one_short_message_with_no_kit_frame(shell, capsys):
    def shown(cell: str) -> str:
        shell.run_cell(cell)
        return capsys.readouterr().out

    no_ranks = shown("%%ranks\nprint(1)\n")
    no_session = "LaunchConfigError: No live ranks: start them first with `%ranks start -n 4`."
    assert no_session in no_ranks
    assert "File " not in no_ranks and "Traceback" not in no_ranks
    assert "unknown command 'go'" in shown("%ranks go") and kit_frames(no_ranks) == []
    shell.run_line_magic("ranks", "start -n 2")
    capsys.readouterr()
    syntax = shown("%%ranks\nx = (\n")
    assert 'File "<cell' in syntax and "SyntaxError: '(' was never closed" in syntax
    assert kit_frames(syntax) == [] and "magic.py" not in syntax

    # the stop button: SIGINT, which a kernel turns into KeyboardInterrupt while a cell runs
    # (even if this test run was started as a background job, with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        interrupted = shown("%%ranks\nimport time\ntime.sleep(30)\n")
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    stopped = "KeyboardInterrupt: The cell was interrupted; ranks 0-1 were interrupted."
    assert stopped in interrupted
    assert "Traceback" not in interrupted and kit_frames(interrupted) == []
    assert shown("%%ranks\nprint('still', 1)\n") == "[ranks 0-1] still 1\n"


def test_a_killed_kernels_run_directory_and_key_are_removed_by_the_next_run(tmp_path, monkeypatch):
    kernel = start_kernel(KERNEL, {"TMPDIR": str(tmp_path)})
    try:
        (run_dir,) = tmp_path.glob(f"{contract.RUN_DIR_PREFIX}*")
        assert (run_dir / contract.KEY_FILE).exists()
    finally:
        kernel.kill()  # no chance to clean up
        kernel.wait()
    assert wait_until_gone(15) == []
    assert (run_dir / contract.KEY_FILE).exists()  # left behind by the killed kernel
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ddp_kit.launch("pass", nproc=1, output="quiet")
    assert not run_dir.exists()
    assert list(tmp_path.glob(f"{contract.RUN_DIR_PREFIX}*")) == []  # and the launch's own


PERSISTENT_LOADER = """
import os
from torch.utils.data import DataLoader, Dataset
class Numbers(Dataset):  # defined in the cell, as in a notebook
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return i
loader = DataLoader(Numbers(), batch_size=4, num_workers=2, persistent_workers=True)
total = sum(int(batch.sum()) for batch in loader)
workers = [w.pid for w in loader._iterator._workers]
"""


def test_memory_is_pss_a_lost_rank_is_said_plainly_and_loader_workers_end_with_the_rank():
    with Session(2, output="quiet") as session:
        status = session.status()
        assert "memory PSS " in status and "per rank PSS/USS" in status
        sizes = session.memory()
        rss = sum(psutil.Process(pid).memory_info().rss for pid in session.pids.values())
        assert 0 < sum(size["pss"] for size in sizes.values()) < rss  # shared pages split
        assert all(0 < size["uss"] <= size["pss"] for size in sizes.values())
        with pytest.raises(SessionError) as lost:
            session.run("import os, time\nfrom ddp_kit.worker import rank\nif rank() == 1:\n"
                        "    os._exit(1)\ntime.sleep(5)\n")  # fmt: skip
        assert re.search(r"Rank 1's process ended \(exitcode : 1 \(pid: \d+\)\)", str(lost.value))
        begin = time.perf_counter()
    plain_close = time.perf_counter() - begin
    with Session(2, output="quiet") as session:
        session.run(PERSISTENT_LOADER)
        assert session.pull("total") == [120, 120]
        workers = [pid for pids in session.pull("workers") for pid in pids]
        assert len(workers) == 4 and all(psutil.pid_exists(pid) for pid in workers)
        begin = time.perf_counter()
    loader_close = time.perf_counter() - begin
    assert not [pid for pid in workers if psutil.pid_exists(pid)]
    assert loader_close < plain_close + 3, (loader_close, plain_close)  # it was 10 s more
    assert wait_until_gone(5) == []
