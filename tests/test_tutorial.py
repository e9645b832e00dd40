"""The PyTorch DDP tutorial's demos (tests/workers/tutorial.py, CPU-adapted only) run the way a
class runs them, with no hang: as cells on live ranks, 20 times over, and as the tutorial's main
(init, destroy, init again in one process) through launch. Under bare torchrun on this machine
the same code hangs in about 1 run in 2 (docs/upstream.md has the stacks and the counts).

Also here: the torch-only reproductions of both hangs, and a wait with no end of its
own (a rendezvous store that never answers) ended after its timeout, saying what waited."""

from __future__ import annotations

import re
import sys
import textwrap
import threading
import weakref
from datetime import timedelta
from pathlib import Path

import pytest
from support import WORKERS, kit_frames

import ddp_kit
from ddp_kit.kernel import diagnose
from ddp_kit.kernel.session import RESTARTED_AFTER_STALL, Session
from ddp_kit.rank import waits
from ddp_kit.shared.contract import STALLED_WAIT
from ddp_kit.shared.errors import CellError, WorkerError
from ddp_kit.shared.failures import RankFailure

TUTORIAL = (WORKERS / "tutorial.py").read_text()
DEFINITIONS = TUTORIAL.split('\nif __name__ == "__main__":')[0]
RUNS = 20

# A rendezvous store that never answers a read: init_process_group then waits with no timeout
# of its own (as gloo's connectFullMesh can, up to 5 x the timeout).
SILENT_STORE = """
import os, time
import torch.distributed as dist

class SilentStore(dist.Store):
    def set(self, key, value):
        pass

    def get(self, key):
        while True:
            time.sleep(1)

    def wait(self, keys, timeout=None):
        while True:
            time.sleep(1)

dist.init_process_group("gloo", store=SilentStore(), rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]))
"""
STALL = re.compile(
    r"Rank \d failed with StalledWait: init: init_process_group\(\) did not return within "
    r"\d+ s \(its timeout \+ 5 s\), so ddp_kit ended the wait: gloo was connecting this rank"
)


def gloo_threads() -> str:
    """A cell's code: how many threads this rank's process has (gloo's are C++ threads), once
    the models left in reference cycles are collected."""
    return "import gc, os\ngc.collect()\nthreads = len(os.listdir('/proc/self/task'))\n"


@pytest.mark.torchrun
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_the_tutorial_demos_run_20_times_as_cells_on_live_ranks():
    with Session(2, collective_timeout=20, cell_timeout=60, output="quiet") as session:
        session.run(DEFINITIONS)
        session.run("run_demo(demo_basic)\nrun_demo(demo_checkpoint)\n")
        session.run(gloo_threads())
        before = session.pull("threads")
        for _ in range(RUNS):
            basic = session.run("run_demo(demo_basic)")
            checkpoint = session.run("run_demo(demo_checkpoint)")
            assert basic.stdout == [f"Running basic DDP example on rank {r}.\n" for r in (0, 1)]
            assert checkpoint.stdout[1] == "Running DDP checkpoint example on rank 1.\n"
        session.run(
            gloo_threads()
            + "import torch.distributed.distributed_c10d as c10d\n"
            + "from ddp_kit.rank import groups\n"
            + "worlds, kept = c10d._world.group_count, groups.kept()\n"
        )
        # every world of the process had a name of its own (torch would reuse "0")
        assert session.pull("worlds") == [2 + 2 * RUNS] * 2
        # and every destroyed group was freed after its cell: no gloo thread is left over
        assert session.pull("kept") == [0, 0]
        assert session.pull("threads") == before


@pytest.mark.torchrun
def test_the_tutorial_main_inits_destroys_and_inits_again_through_launch():
    for _ in range(2):
        result = ddp_kit.launch(WORKERS / "tutorial.py", nproc=2, output="quiet")
        for rank in (0, 1):
            assert f"Running basic DDP example on rank {rank}." in result.stdout[rank]
            assert f"Running DDP checkpoint example on rank {rank}." in result.stdout[rank]


@pytest.mark.torchrun
def test_the_world_made_and_destroyed_20_times_in_one_process():
    result = ddp_kit.launch(WORKERS / "reinit.py", nproc=2, output="quiet")
    expected = "".join(f"world {n}: {n}, sum 2\n" for n in range(20))  # a name of its own each
    assert result.stdout == [expected, expected]


@pytest.mark.torchrun
def test_freeing_a_group_right_after_a_ddp_step_does_not_deadlock():
    result = ddp_kit.launch(WORKERS / "free_after_step.py", nproc=2, args=["60"], output="quiet")
    # out.sum()'s bias gradient is the batch size, 20, on every rank: so is its average
    assert result.stdout[0] == "rounds: 60; last bias grad: [20.0, 20.0, 20.0, 20.0, 20.0]\n"
    assert result.stdout[1] == result.stdout[0]


@pytest.mark.torchrun
def test_a_wait_with_no_timeout_ends_after_its_timeout_saying_what_waited():
    with pytest.raises(WorkerError) as launched:
        ddp_kit.launch(SILENT_STORE, nproc=2, collective_timeout=2, timeout=120, output="quiet")
    assert STALL.search(str(launched.value)), str(launched.value)
    # both ranks stall at the same timeout; torchrun stops the second if the first ends first.
    # At least one rank is named; when both reported, both are
    failures, first = launched.value.result.failures, launched.value.result.root_cause.rank
    assert 1 <= len(failures) <= 2 and first in (0, 1)
    assert str(launched.value).startswith(f"Rank {first} failed with StalledWait: ")
    if len(failures) == 2:
        assert sorted(f.rank for f in failures) == [0, 1]
        assert f"(Rank(s) {1 - first} failed too: StalledWait.)" in str(launched.value)
    assert "consequence" not in str(launched.value)
    assert 'dist.init_process_group("gloo", store=SilentStore()' in str(launched.value)
    assert kit_frames(str(launched.value)) == []

    with Session(2, collective_timeout=2, cell_timeout=120, output="quiet") as session:
        session.run("kept = 1")
        old = set(session.pids.values())
        with pytest.raises(CellError) as cell:
            session.run(SILENT_STORE)
        assert STALL.search(str(cell.value)) and RESTARTED_AFTER_STALL in str(cell.value)
        assert kit_frames(str(cell.value)) == []
        assert not old & set(session.pids.values())  # replaced: the old main threads were stuck
        assert session.run("1 + 1").stdout == ["2\n", "2\n"]


def test_the_watch_finds_the_innermost_wait_and_its_own_timeout():
    release = threading.Event()
    seen: dict = {}

    code = textwrap.dedent("""
        def init_process_group(timeout=None):
            release.wait(10)
        init_process_group(timeout=timeout)
    """)
    fake = Path("torch/distributed/distributed_c10d.py")
    namespace = {"release": release, "timeout": timedelta(seconds=7)}
    thread = threading.Thread(target=exec, args=(compile(code, str(fake), "exec"), namespace))
    thread.start()
    try:
        for _ in range(100):
            frame = sys._current_frames().get(thread.ident)
            found = waits.waiting_in(frame)
            if found:
                seen["wait"], frame = found
                seen["limit"] = waits.limit(frame, timedelta(seconds=60))
                break
            threading.Event().wait(0.01)
    finally:
        release.set()
        thread.join()
    assert seen == {"wait": waits.INIT, "limit": 7 + waits.GRACE}


def test_the_watch_keeps_no_frame_of_a_wait_that_ended():
    # A frame kept would keep the wait's locals and its callers' (the groups that
    # destroy_process_group removed, the caller's DDP model) alive after the cell, to be freed
    # later on the watch's thread.
    code = textwrap.dedent("""
        def release(held):
            go.wait(10)
        release(Held())
    """)
    fake = Path("ddp_kit/rank/groups.py")
    go, alive = threading.Event(), []
    held = type("Held", (), {"__init__": lambda self: alive.append(weakref.ref(self))})
    thread = threading.Thread(target=exec, args=(compile(code, str(fake), "exec"),
                                                 {"go": go, "Held": held}))  # fmt: skip
    watch = waits.Watch(0, timedelta(seconds=60), on_stall=lambda failure: None)
    thread.start()
    watch.main = thread.ident  # the thread stands for a rank's main thread
    watch.thread.start()
    try:
        threading.Event().wait(3 * waits.POLL)  # seen in release() twice or more
        go.set()
        thread.join()
        threading.Event().wait(3 * waits.POLL)  # looked again, and found no wait
        assert alive[0]() is None
    finally:
        watch.stopped.set()


def test_ranks_that_each_stalled_failed_too_never_as_a_consequence():
    def stall(rank: int, at: float) -> RankFailure:
        message = f"init: init_process_group() did not return within 7 s (rank {rank})"
        return RankFailure(rank, STALLED_WAIT, message, "", at)

    explanation = diagnose.explain_failures([stall(1, 2.0), stall(0, 1.0), stall(3, 3.0)])
    assert explanation.message.startswith("Rank 0 failed with StalledWait: init:")
    assert "(Rank(s) 1, 3 failed too: StalledWait.)" in explanation.message
    assert "consequence" not in explanation.message and "collective" not in explanation.advice
