"""The launcher on real torchrun jobs (gloo, CPU): ranks, output, records, failures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from support import WORKERS

import ddp_kit
from ddp_kit import LaunchConfigError, WorkerError
from ddp_kit.kernel import torchrun
from ddp_kit.shared import contract

pytestmark = pytest.mark.torchrun

HELLO = """
import os
import torch
import torch.distributed as dist
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank} of {world}: RANK={os.environ['RANK']} LOCAL_RANK={os.environ['LOCAL_RANK']}")
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
record("total", total)
record("weights", torch.arange(3.0) * (rank + 1))
record("indices", list(range(rank, 12, world)))
record("who", f"rank-{rank}")
for step in range(3):
    record("loss", 10.0 * step + rank)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def hello4():
    return ddp_kit.launch(HELLO, nproc=4)


def test_every_rank_sees_its_rank_and_world_size(hello4):
    assert hello4.ok and hello4.world_size == 4 and hello4.backend == "gloo"
    for rank in range(4):
        assert hello4.stdout[rank] == f"rank {rank} of 4: RANK={rank} LOCAL_RANK={rank}\n"


def test_output_is_shown_rank_prefixed_in_rank_order(capfd):
    ddp_kit.launch(HELLO, nproc=2)
    out = capfd.readouterr().out
    assert out == (
        "[rank 0] rank 0 of 2: RANK=0 LOCAL_RANK=0\n[rank 1] rank 1 of 2: RANK=1 LOCAL_RANK=1\n"
    )


def test_records_round_trip_as_step_rank_arrays(hello4):
    records = hello4.records
    assert records.names == ["total", "weights", "indices", "who", "loss"]
    np.testing.assert_array_equal(records["total"], np.full((1, 4, 1), 10.0))
    assert records["weights"].shape == (1, 4, 3)
    np.testing.assert_array_equal(records["weights"][0, 2], [0.0, 3.0, 6.0])
    assert records["indices"][0].tolist() == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    assert records["who"][0].tolist() == ["rank-0", "rank-1", "rank-2", "rank-3"]
    assert records.steps("loss") == [0, 1, 2]
    np.testing.assert_array_equal(records["loss"][:, 3], [3.0, 13.0, 23.0])
    assert records.get("loss", 2, 1) == 21.0


def test_unknown_record_name_lists_what_exists(hello4):
    with pytest.raises(ddp_kit.RecordError, match="the workers recorded: total, weights"):
        hello4.records["lost"]


def test_failing_rank_is_named_with_its_traceback():
    code = (
        "import torch.distributed as dist\nfrom ddp_kit.worker import backend\n"
        "dist.init_process_group(backend())\nif dist.get_rank() == 1:\n"
        "    raise ValueError('rank one is broken')\ndist.barrier()\n"
    )
    with pytest.raises(WorkerError) as caught:
        ddp_kit.launch(code, nproc=2, output="quiet")
    message = str(caught.value)
    assert message.startswith("Rank 1 failed with ValueError: rank one is broken")
    assert "Traceback (most recent call last)" in message and "script.py" in message
    result = caught.value.result
    assert not result.ok and result.root_cause.rank == 1
    assert "ValueError: rank one is broken  (traceback in the launch error)" in result.stderr[1]


def test_the_same_error_on_every_rank_is_each_ranks_own():
    with pytest.raises(WorkerError) as caught:
        ddp_kit.launch("import no_such_module\n", nproc=2, output="quiet")
    message = str(caught.value)
    failures = caught.value.result.failures
    first = caught.value.result.root_cause.rank
    # at least one rank is named, with its own error
    assert 1 <= len(failures) <= 2 and first in (0, 1)
    assert message.startswith(f"Rank {first} failed with ModuleNotFoundError: No module named "
                              "'no_such_module'")  # fmt: skip
    # torchrun may stop the second rank before it reports; when both did, both are named
    if len(failures) == 2:
        assert sorted(f.rank for f in failures) == [0, 1]
        assert f"(Rank(s) {1 - first} failed too: ModuleNotFoundError.)" in message
    assert "consequence" not in message and "collective" not in message


def test_a_script_that_sets_its_own_master_port_is_told_it_missed_the_rendezvous():
    with socket.socket() as probe:  # a free port: nobody listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WorkerError) as caught:
        ddp_kit.launch(WORKERS / "master_port.py", nproc=2, args=[port], collective_timeout=3,
                       output="quiet")  # fmt: skip
    message = str(caught.value)
    assert f"could not reach the rendezvous store at localhost:{port}" in message
    assert "MASTER_PORT" in message and "A collective" not in message


def test_function_worker_and_check_false():
    def worker():
        import sys

        from ddp_kit.worker import rank

        print("function worker on rank", rank())
        sys.exit(3 if rank() == 1 else 0)

    result = ddp_kit.launch(worker, nproc=2, check=False, output="quiet")
    assert not result.ok and result.returncode != 0
    assert [(f.rank, f.type, f.message) for f in result.failures] == [(1, "SystemExit", "3")]
    assert result.stdout == ["function worker on rank 0\n", "function worker on rank 1\n"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nproc": 0}, "nproc=0: use a whole number of ranks from 1 to 64"),
        ({"nproc": -2}, "nproc=-2"),
        ({"nproc": 1000}, "nproc=1000"),
        ({"nproc": "4"}, "nproc='4'"),
        ({"nproc": 2, "backend": "mpi"}, "Unknown backend 'mpi'"),
        ({"nproc": 2, "output": "loud"}, "output='loud'"),
        ({"nproc": 2, "timeout": 0}, "timeout=0"),
        ({"nproc": 2, "nnodes": 0}, "nnodes=0"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_starts(kwargs, match):
    with pytest.raises(LaunchConfigError, match=match):
        ddp_kit.launch("print('never runs')", **kwargs)


def test_bad_workers_are_rejected(tmp_path):
    with pytest.raises(LaunchConfigError, match="does not exist"):
        ddp_kit.launch(str(tmp_path / "missing.py"))
    with pytest.raises(LaunchConfigError, match="syntax error"):
        ddp_kit.launch("def broken(:\n")
    with pytest.raises(LaunchConfigError, match="empty"):
        ddp_kit.launch("   ")


def test_live_output_shows_every_line_as_it_arrives(capfd):
    code = "import sys\nfrom ddp_kit.worker import rank\nprint('out', rank())\n"
    code += "print('err', rank(), file=sys.stderr)\n"
    result = ddp_kit.launch(code, nproc=2, output="live")
    captured = capfd.readouterr()
    assert sorted(captured.out.splitlines()) == ["[rank 0] out 0", "[rank 1] out 1"]
    assert sorted(captured.err.splitlines()) == ["[rank 0] err 0", "[rank 1] err 1"]
    assert result.stderr == ["err 0\n", "err 1\n"]


def test_worker_backend_helpers_follow_the_launcher(monkeypatch):
    from ddp_kit import worker
    from ddp_kit.shared import contract

    monkeypatch.setenv(contract.BACKEND, "gloo")
    assert (worker.backend(), str(worker.device()), worker.device_ids()) == ("gloo", "cpu", None)
    monkeypatch.setenv(contract.BACKEND, "nccl")
    assert worker.backend() == "cpu:gloo,cuda:nccl"


def test_markers_are_read_back_by_stage(tmp_path, monkeypatch):
    """A started marker is not a completed one (their names share a suffix), and ranks sort."""
    from ddp_kit.shared import contract, markers

    monkeypatch.setenv(contract.MARKER_DIR, str(tmp_path))
    for rank in (10, 2, 0):
        markers.mark(markers.STARTED, rank)
    markers.mark(markers.COMPLETED, 2)
    assert markers.ranks_marked(tmp_path, markers.STARTED) == [0, 2, 10]
    assert markers.ranks_marked(tmp_path, markers.COMPLETED) == [2]


ENDS = """
import os, signal, sys, time
from ddp_kit.worker import rank
print("started", rank(), flush=True)
def end():
    print("ending", flush=True)
    {end}
if rank() == 1:
    end()
time.sleep(3)
"""


@pytest.mark.parametrize("start", ["fast", "plain"])
@pytest.mark.parametrize(
    ("end", "said"),
    [
        ("sys.exit(3)", "SystemExit: 3"),
        ("os._exit(1)", "Rank 1's process ended with exit code 1 without a Python exception"),
        ("os.kill(os.getpid(), signal.SIGSEGV)",
         "Rank 1's process was killed by SIGSEGV (signal 11), without a Python exception"),
    ],
)  # fmt: skip
def test_a_rank_that_ends_without_raising_is_named_with_how_and_where(end, said, start):
    env = {"DDP_KIT_FAST_START": "0"} if start == "plain" else None
    with pytest.raises(WorkerError) as caught:
        ddp_kit.launch(ENDS.format(end=end), nproc=2, env=env, output="quiet")
    message, result = str(caught.value), caught.value.result
    assert said in message and [f.rank for f in result.failures] == [1]
    if end.startswith("sys.exit"):  # a Python exception: its traceback, as live ranks show it
        assert message.startswith("Rank 1 failed with SystemExit: 3")
        assert 'script.py", line 7, in end' in message
    else:
        assert "Its last lines:\n  [rank 1] started 1\n  [rank 1] ending" in message
    if "SIGSEGV" in end:  # where it was: the script's lines, innermost last, none of the kit's
        where = message.split("innermost last):\n")[1].split("\n\n")[0].splitlines()
        assert [line.split(", ")[1:] for line in where] == [
            ["line 9 in <module>"], ["line 7 in end"]
        ]


@pytest.mark.parametrize("args", ["5 2 'a b'", ["5", "2", "a b"], ("5", 2, "a b")])
def test_args_are_a_list_of_words_or_one_string_split_as_a_shell_would(args):
    code = "import sys\nprint(sys.argv[1:])\n"
    result = ddp_kit.launch(code, nproc=1, args=args, output="quiet")
    assert result.stdout == ["['5', '2', 'a b']\n"]


@pytest.mark.parametrize("args", [{"epochs": 5}, 5, b"5 2", [["5"]], "5 'unclosed"])
def test_other_args_are_refused_naming_both_forms(args):
    with pytest.raises(LaunchConfigError, match=r'list of strings.*args=\["5", "2"\].*args="5 2"'):
        ddp_kit.launch("print('never runs')", args=args)


def test_initialising_the_default_group_twice_is_told_the_fix():
    code = ("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "dist.init_process_group('gloo')\n")  # fmt: skip
    with pytest.raises(WorkerError) as caught:
        ddp_kit.launch(code, nproc=1, output="quiet")
    message = str(caught.value)
    assert "initialize the default process group twice" in message
    assert "dist.destroy_process_group() first" in message and "dist.is_initialized()" in message


def test_more_ranks_than_cores_is_said_once(monkeypatch, capfd):
    monkeypatch.delenv(contract.NOTES_FILE, raising=False)
    monkeypatch.setattr(torchrun, "available_cores", lambda: 1)
    monkeypatch.setattr(torchrun, "_cores_said", set())
    ddp_kit.launch("pass", nproc=2, output="quiet")
    assert "[ddp_kit] note: 2 ranks on 1 CPU cores: the ranks take turns" in capfd.readouterr().err
    ddp_kit.launch("pass", nproc=2, output="quiet")
    assert "CPU cores" not in capfd.readouterr().err  # once per kernel
    monkeypatch.setattr(torchrun, "available_cores", lambda: 2)
    monkeypatch.setattr(torchrun, "_cores_said", set())
    ddp_kit.launch("pass", nproc=2, output="quiet")
    assert "CPU cores" not in capfd.readouterr().err


def test_run_directories_of_a_gone_owner_are_removed_and_others_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"{contract.RUN_DIR_PREFIX}stale"
    stale.mkdir()
    (stale / contract.OWNER_FILE).write_text(f"{gone.pid} 1.0\n")
    (stale / contract.KEY_FILE).write_text("secret")
    reused = tmp_path / f"{contract.RUN_DIR_PREFIX}reused"  # this pid, another start time
    reused.mkdir()
    (reused / contract.OWNER_FILE).write_text(f"{os.getpid()} 1.0\n")
    mine = torchrun.make_run_dir()  # this kernel's: alive
    other = tmp_path / f"{contract.RUN_DIR_PREFIX}unowned"  # not made with an owner file
    other.mkdir()
    assert not stale.exists() and not reused.exists()
    ddp_kit.launch("pass", nproc=1, output="quiet")
    assert mine.exists() and other.exists()


def test_a_gloo_interface_that_the_host_lacks_is_named_with_the_fix():
    code = ("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "dist.all_reduce(torch.ones(1))\n")  # fmt: skip
    with pytest.raises(WorkerError) as caught:
        ddp_kit.launch(code, nproc=2, output="quiet", env={"GLOO_SOCKET_IFNAME": "ddpk-none0"})
    said = str(caught.value)
    assert "GLOO_SOCKET_IFNAME=ddpk-none0 names no network interface with an address" in said
    assert "Leave it out of env= (the kit chooses each host's interface)" in said
