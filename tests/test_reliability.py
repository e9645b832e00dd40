"""Classroom faults on real torchrun runs: hangs, timeouts, interrupts, kills, collisions."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import KERNEL_SIGINT, WORKERS, kit_processes, wait_until_gone

import ddp_kit
from ddp_kit import LaunchConfigError, LaunchTimeout, WorkerError

pytestmark = pytest.mark.torchrun

SLEEPER = "import time\ntime.sleep(120)\n"


def test_diverged_ranks_end_after_the_collective_timeout_with_an_explanation():
    code = textwrap.dedent("""
        import time, torch, torch.distributed as dist
        from ddp_kit.worker import backend
        dist.init_process_group(backend())
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))   # rank 1 never joins
        else:
            time.sleep(60)
        dist.destroy_process_group()
    """)
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        ddp_kit.launch(code, nproc=2, collective_timeout=2, output="quiet")
    assert time.monotonic() - start < 40
    message = str(caught.value)
    assert message.startswith("Rank 0 failed with RuntimeError")
    assert "Timed out waiting 2000ms" in message
    assert "a collective inside `if rank == 0:`" in message


def test_launch_timeout_stops_every_process():
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match="time limit of 4 s and was stopped"):
        ddp_kit.launch(SLEEPER, nproc=2, timeout=4, output="quiet")
    assert time.monotonic() - start < 20
    assert wait_until_gone(0.5) == []


def start_launcher(env: dict | None = None) -> subprocess.Popen:
    """A separate Python process (like a kernel) that launches 2 sleeping ranks."""
    code = f"{KERNEL_SIGINT}import ddp_kit\nddp_kit.launch({SLEEPER!r}, nproc=2)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})  # fmt: skip
    deadline = time.monotonic() + 60
    while sum("ddp_kit.rank.runner" in " ".join(p.cmdline()) for p in kit_processes()) < 2:
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.2)
    return proc


def test_interrupt_stops_the_whole_process_tree():
    launcher = start_launcher()
    launcher.send_signal(signal.SIGINT)  # what the kernel's interrupt button sends
    _, err = launcher.communicate(timeout=30)
    assert "Interrupted: The run was interrupted; all 2 worker processes were stopped" in err
    assert wait_until_gone(1) == []


@pytest.mark.parametrize("start", ["fast", "plain"])
@pytest.mark.parametrize("guard", ["pdeathsig", "watchdog"])
def test_killed_launcher_leaves_no_orphans(guard, start):
    # "watchdog": Linux's PR_SET_PDEATHSIG off, as on macOS; the portable watchdog alone
    env = {"DDP_KIT_NO_PDEATHSIG": "1"} if guard == "watchdog" else {}
    if start == "plain":  # no fork server (kernel.fast_start)
        env["DDP_KIT_FAST_START"] = "0"
    launcher = start_launcher(env)
    launcher.kill()  # a crashed or restarted kernel: no chance to clean up
    launcher.wait()
    assert wait_until_gone(10) == []


def test_two_launches_at_once_do_not_collide():
    code = (
        "import sys\nfrom ddp_kit.worker import rank, record\n"
        "record('tag', int(sys.argv[1]) * 10 + rank())\n"
    )
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda tag: ddp_kit.launch(code, nproc=2, args=[tag], output="quiet"),
                             [1, 2]))  # fmt: skip
    assert [r.records["tag"].tolist() for r in runs] == [[[10, 11]], [[20, 21]]]


def test_nccl_without_enough_gpus_is_refused_before_starting():
    if ddp_kit.kernel.backend.cuda_device_count() >= 64:
        pytest.skip("this machine has 64 GPUs")
    with pytest.raises(LaunchConfigError, match="backend='nccl' needs one CUDA GPU per rank"):
        ddp_kit.launch("print('never')", nproc=64, backend="nccl")


def test_workers_talk_over_loopback_only_and_run_dirs_are_private():
    code = textwrap.dedent("""
        import os, psutil, torch, torch.distributed as dist
        from ddp_kit.worker import backend, record
        dist.init_process_group(backend())
        dist.all_reduce(torch.ones(1))
        record("env", {k: os.environ[k] for k in ("MASTER_ADDR", "GLOO_SOCKET_IFNAME")})
        addresses = {c.laddr.ip for c in psutil.Process().net_connections("inet") if c.laddr}
        record("addresses", sorted(addresses))
        dist.destroy_process_group()
    """)
    run = ddp_kit.launch(code, nproc=2, keep_run_dir=True, output="quiet")
    try:
        assert stat.S_IMODE(run.run_dir.stat().st_mode) == 0o700
        for rank in range(2):
            assert run.records.get("env", 0, rank) == {
                "MASTER_ADDR": "127.0.0.1",
                "GLOO_SOCKET_IFNAME": ddp_kit.kernel.torchrun.loopback_interface(),
            }
            for address in run.records.get("addresses", 0, rank):
                ip = ipaddress.ip_address(address)
                assert (getattr(ip, "ipv4_mapped", None) or ip).is_loopback, address
        assert all("--rdzv-endpoint=127.0.0.1:0" in cmd for cmd in run.commands)
    finally:
        shutil.rmtree(run.run_dir)


def test_a_crash_after_the_script_completed_is_a_note_on_a_successful_result(capfd, monkeypatch):
    monkeypatch.delenv("DDP_KIT_NOTES_FILE", raising=False)  # notes go to stderr, not a file
    # Rank 1 aborts once rank 0 has completed too: torchrun answers its SIGABRT with SIGTERM to
    # the other ranks, and a rank 0 still running its script then failed (once in a CI run).
    code = textwrap.dedent("""
        import atexit, os, time
        from ddp_kit.shared.markers import COMPLETED, ranks_marked
        from ddp_kit.worker import rank, record
        record("value", rank() + 1)

        def abort_once_rank_0_completed():
            deadline = time.monotonic() + 60
            markers = os.environ["DDP_KIT_MARKER_DIR"]
            while 0 not in ranks_marked(markers, COMPLETED) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.abort()   # dies with SIGABRT as its process ends, work done

        if rank() == 1:
            atexit.register(abort_once_rank_0_completed)
    """)
    result = ddp_kit.launch(code, nproc=2, output="quiet")
    assert result.ok and result.returncode != 0 and result.completed == [0, 1]
    assert result.records["value"].tolist() == [[1, 2]]
    assert "a rank crashed while its process was ending" in result.notes[0]
    assert "[ddp_kit] note: torchrun exited with code" in capfd.readouterr().err


def test_a_completed_rank_keeps_its_destroyed_groups_until_it_exits():
    """A comm hook's future callback, on a gloo thread, may hold the last reference to the
    group; freeing the group there made its destructor join that thread ("Resource deadlock
    avoided", 22 of 60 launches of tests/workers/autocast.py beside a CPU hog). The rank's end
    keeps every destroyed group until os._exit: the exit handlers see them still kept."""
    code = textwrap.dedent("""
        import atexit, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from ddp_kit.observe import GradientRecorder
        from ddp_kit.rank import groups
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(4, 1))
        GradientRecorder(model)
        model(torch.randn(2, 4)).sum().backward()
        dist.destroy_process_group()
        atexit.register(lambda: print("kept", groups.kept(), flush=True))
    """)
    assert ddp_kit.launch(code, nproc=2, output="quiet").stdout == ["kept 1\n", "kept 1\n"]


def test_a_crash_before_the_script_completed_is_an_error():
    code = "import os\nfrom ddp_kit.worker import rank\nif rank() == 1:\n    os.abort()\n"
    with pytest.raises(WorkerError, match="Rank 1's process was killed by SIGABRT"):
        ddp_kit.launch(code, nproc=2, output="quiet")


def test_files_a_script_left_open_are_complete_after_the_run(tmp_path):
    path = tmp_path / "log.txt"
    code = f"log = open({str(path)!r}, 'w')\nlog.write('every line\\n' * 1000)\n"
    ddp_kit.launch(code, nproc=1, output="quiet")
    assert path.read_text() == "every line\n" * 1000


CONNECT_FAILURE = WORKERS / "connect_failure.py"


def launches(folder) -> int:
    return len(set((folder / "runs.txt").read_text().split()))


def test_a_connect_failure_in_init_is_launched_again_once_with_a_note(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("DDP_KIT_NOTES_FILE", raising=False)
    result = ddp_kit.launch(CONNECT_FAILURE, nproc=2, args=[tmp_path, "once"])
    assert result.ok and launches(tmp_path) == 2
    assert result.records["total"].tolist() == [[[2.0], [2.0]]]
    assert "rank 1 failed inside init_process_group" in result.notes[0]
    assert "connectFullMesh" in result.notes[0] and "launched again, once" in result.notes[0]
    err = capfd.readouterr().err
    assert err.count("[ddp_kit] note: rank 1 failed inside init_process_group") == 1
    assert "[rank 1]" not in err  # the first run's output is not shown: the note says it all


def test_a_connect_failure_every_time_is_an_error_after_one_retry(tmp_path, capfd, monkeypatch):
    notes = tmp_path / "notes.txt"
    monkeypatch.setenv("DDP_KIT_NOTES_FILE", str(notes))  # as in the test run: not in the cell
    with pytest.raises(WorkerError, match="Rank 1 failed with RuntimeError: Gloo connectFullMesh"):
        ddp_kit.launch(CONNECT_FAILURE, nproc=2, args=[tmp_path, "always"], output="quiet")
    assert launches(tmp_path) == 2
    said = notes.read_text()
    assert said.count(": rank 1 failed inside init_process_group") == 1
    assert said.startswith("[ddp_kit] note (tests/test_reliability.py::test_a_connect_failure")
    assert "[ddp_kit] note" not in capfd.readouterr().err


def test_a_connect_failure_after_the_script_printed_is_not_launched_again(tmp_path):
    with pytest.raises(WorkerError, match="connectFullMesh"):
        ddp_kit.launch(CONNECT_FAILURE, nproc=2, args=[tmp_path, "print"], output="quiet")
    assert launches(tmp_path) == 1


def test_a_connect_failure_in_a_fresh_session_restarts_it_and_runs_the_cell_again(
    tmp_path, monkeypatch
):
    notes = tmp_path / "notes.txt"
    monkeypatch.setenv("DDP_KIT_NOTES_FILE", str(notes))
    first_cell = (
        f"import sys\nsys.path.insert(0, {str(WORKERS)!r})\nfrom connect_failure import main\n"
        f"total = main({str(tmp_path)!r}, 'once', keep_group=True)\n"
    )
    with ddp_kit.Session(2, collective_timeout=3, cell_timeout=60, output="quiet") as session:
        result = session.run(first_cell)
        assert result.ok and launches(tmp_path) == 2
        assert "the ranks were restarted and the cell run again" in result.notes[0]
        assert notes.read_text().count("rank 1 failed inside init_process_group") == 1
        assert session.pull("total") == [[2.0], [2.0]]
        failed_later = session.run("dist.all_reduce(undefined)", check=False)
        assert not failed_later.ok and not failed_later.notes  # only a fresh session's cell


LOADER = """
import sys
from torch.utils.data import DataLoader, Dataset
class Numbers(Dataset):  # a class of the script's: the loader is freed by the collector
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return i
loader = DataLoader(Numbers(), batch_size=4, num_workers=2, persistent_workers=True)
print(sum(int(batch.sum()) for batch in loader))
if sys.argv[1:] == ["del"]:
    del loader
"""


def test_a_rank_ending_with_live_loader_workers_ends_as_fast_as_without():
    times = {}
    for args in (["del"], [], ["del"], []):  # the first, warming up, is not compared
        result = ddp_kit.launch(LOADER, nproc=2, args=args, output="quiet")
        assert result.stdout == ["120\n", "120\n"]
        times[tuple(args)] = result.duration
    assert times[()] < times[("del",)] + 3, times  # it was 10 s more: 5 s for each worker


REINITS = """
import torch, torch.distributed as dist
for _ in range(5):
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
"""


def test_a_rank_connects_to_torchruns_store_once_however_often_it_inits():
    """Each connection costs a reverse DNS lookup in torch (docs/upstream.md, section 5)."""
    result = ddp_kit.launch(REINITS, nproc=2, output="quiet", env={"TORCH_CPP_LOG_LEVEL": "INFO"})
    assert [text.count("The client socket has connected") for text in result.stderr] == [1, 1]
