"""The launcher on real torchrun jobs (gloo, CPU): ranks, output, records, failures."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from support import WORKERS

import ddp_kit
from ddp_kit import LaunchConfigError, WorkerError

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
    assert "failed too: ModuleNotFoundError" in message or len(caught.value.result.failures) == 1
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
    assert not result.ok and result.returncode != 0 and not result.failures
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
