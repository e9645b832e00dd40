"""Live ranks, one session for the whole module: state, output, errors, limits, records."""

from __future__ import annotations

import time

import psutil
import pytest
from support import SETUP, kit_frames, wait_until_gone

from ddp_kit import Session
from ddp_kit.shared.errors import CellError

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="module")
def live():
    session = Session(2, collective_timeout=3, cell_timeout=30, output="quiet")
    session.run(SETUP)
    yield session
    session.close()
    assert wait_until_gone(10) == []


def test_state_persists_across_cells_and_all_reduce_sums(live):
    live.run("mine = torch.tensor([float(rank + 1)])")
    result = live.run("dist.all_reduce(mine)\nprint('sum', mine.item())")
    assert result.ok and result.stdout == ["sum 3.0\n", "sum 3.0\n"]
    assert [value.tolist() for value in live.pull("mine")] == [[3.0], [3.0]]
    assert live.pull("rank") == [0, 1]


def test_a_cell_can_run_on_some_ranks_only(live):
    result = live.run("only = rank * 10\nprint('here', rank)", ranks=[1])
    assert result.ranks == [1] and result.stdout == ["", "here 1\n"]
    with pytest.raises(CellError, match="Rank 0 failed with NameError: name 'only'"):
        live.pull("only")
    assert live.pull("only", ranks=[1]) == [10]


def test_last_expression_is_shown_like_a_notebook_cell(live):
    assert live.run("rank + 40").stdout == ["40\n", "41\n"]


def test_a_cells_annotations_are_objects_as_in_a_notebook_and_a_hook_registers(live):
    code = (
        "def hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:\n"
        "    return default_hooks.allreduce_hook(state, bucket)\n"
        "print(hook.__annotations__['bucket'] is dist.GradBucket)\n"
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))\n"
        "ddp.register_comm_hook(None, hook)  # DDP refuses a hook annotated with a string"
    )
    assert live.run(code).stdout == ["True\n", "True\n"]


def test_an_exception_names_the_rank_and_the_session_stays_usable(live):
    with pytest.raises(CellError) as caught:
        live.run("x = 1\nif rank == 1:\n    raise ValueError('rank one is broken')\n")
    message = str(caught.value)
    assert message.startswith("Rank 1 failed with ValueError: rank one is broken")
    assert 'File "<cell' in message and "line 3, in <module>" in message
    assert kit_frames(message) == []
    rendered = "\n".join(caught.value._render_traceback_())
    assert rendered.count("ValueError: rank one is broken") == 1  # once: its traceback's end
    assert caught.value.result.failures[0].rank == 1
    assert live.run("print(x + rank)").stdout == ["1\n", "2\n"]


def test_records_are_read_back_as_in_a_launch(live):
    live.run("for step in range(3):\n    record('loss', 10.0 * step + rank)")
    records = live.records
    assert records["loss"][:, 1].tolist() == [1.0, 11.0, 21.0]


def test_a_cell_past_its_time_limit_is_interrupted_and_state_is_kept(live):
    live.run("kept = 7")
    live.cell_timeout = 2
    try:
        start = time.monotonic()
        timed_out = "passed its cell_timeout of 2 s; ranks 0-1 were interrupted"
        with pytest.raises(CellError, match=timed_out):
            live.run("time.sleep(60)")
        assert time.monotonic() - start < 10
    finally:
        live.cell_timeout = 30
    assert live.pull("kept") == [7, 7]


def test_a_diverged_collective_is_explained_and_its_groups_freed_keeping_the_variables(live):
    live.run("kept = rank + 10\nt = torch.ones(1)")
    pids = live.pids
    with pytest.raises(CellError) as caught:
        live.run("model = DDP(torch.nn.Linear(2, 1))\nif rank == 0:\n    dist.all_reduce(t)\n")
    message = str(caught.value)
    assert "Rank 0 failed with RuntimeError: Timed out waiting 3000ms" in message
    assert "a collective inside `if rank == 0:`" in message
    assert "every rank's process groups were destroyed" in message
    assert "Every rank's variables are kept" in message and "restarted" not in message
    assert live.pids == pids and live.pull("kept") == [10, 11]  # the same processes
    assert live.run("dist.is_initialized()").stdout == ["False\n"] * 2
    live.run(SETUP)  # a new world on the same ranks works, and so does a new DDP model
    step = "model = DDP(torch.nn.Linear(2, 1))\nmodel(torch.ones(3, 2)).sum().backward()\n"
    live.run(step + "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
    assert live.pull("t") == [2.0, 2.0]


def test_only_loopback_listens_and_the_kernel_listens_on_nothing_after_start(live):
    assert not [c for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]
    for pid in live.pids.values():
        for conn in psutil.Process(pid).net_connections("inet"):
            if conn.status == "LISTEN":
                assert conn.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1"), conn


def test_when_every_rank_fails_alike_rank_0s_traceback_is_shown(live):
    cell = "time.sleep(0.5 if rank == 0 else 0)\nraise ValueError('the same everywhere')\n"
    with pytest.raises(CellError) as caught:
        live.run(cell)
    failures = caught.value.result.failures
    assert min(failures, key=lambda f: f.time).rank == 1  # rank 1 failed first
    assert caught.value._render_traceback_()[0].startswith("CellError: rank 0 failed")
    assert str(caught.value).startswith("Rank 0 failed with ValueError: the same everywhere")
    assert "(Rank(s) 1 failed too: ValueError.)" in str(caught.value)
