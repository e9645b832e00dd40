"""Desyncs found with torch's own tools, through the kit (#23): TORCH_DISTRIBUTED_DEBUG=DETAIL
(`debug="detail"`, `--debug detail`) names both shapes of a mismatched all_reduce,
`dist.monitored_barrier` names the rank that never came, and gloo's collectives are in torch's
flight recorder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
import solutions
from support import WORKERS

import ddp_kit
from ddp_kit import LaunchConfigError, WorkerError, exercises
from ddp_kit.kernel import diagnose
from ddp_kit.kernel.magic import session_parser, torchrun_parser
from ddp_kit.kernel.session import Session
from ddp_kit.shared.errors import CellError

pytestmark = pytest.mark.torchrun

MISMATCH = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(2 + dist.get_rank())   # rank 0 sends 2 numbers, rank 1 sends 3
dist.all_reduce(x)
"""

MONITORED = """
import time
from datetime import timedelta
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(10)                     # rank 1 is busy elsewhere
else:
    dist.monitored_barrier(timeout=timedelta(seconds=2))
"""

FLIGHT = """
import json, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
dist.init_process_group("gloo")
x = torch.ones(4)
dist.all_reduce(x)
dist.broadcast(x, src=0)
print(c10d._dump_fr_trace_json().decode())  # bytes of JSON
dist.destroy_process_group()
"""


def test_debug_detail_names_both_shapes_of_a_mismatched_all_reduce():
    with pytest.raises(WorkerError) as mismatch:
        ddp_kit.launch(MISMATCH, 2, debug="detail", collective_timeout=20, output="quiet")
    message = str(mismatch.value)
    assert "Detected mismatch between collectives on ranks" in message
    assert "TensorShape=[2]" in message and "TensorShape=[3]" in message
    assert torchrun_parser().parse_args(["--debug", "detail"]).debug == "detail"
    assert session_parser().parse_args([]).debug == "off"
    with pytest.raises(LaunchConfigError, match="debug='verbose': use one of off, info, detail"):
        ddp_kit.launch("pass", 2, debug="verbose")


def test_monitored_barrier_names_the_rank_that_never_came():
    with pytest.raises(WorkerError) as missing:
        ddp_kit.launch(MONITORED, 2, collective_timeout=20, output="quiet")
    assert "Rank 0 failed" in str(missing.value)
    assert "Rank 1 failed to pass monitoredBarrier in 2000 ms" in str(missing.value)


def test_gloo_collectives_are_in_the_flight_recorder():
    run = ddp_kit.launch(FLIGHT, 2, env={"TORCH_FR_BUFFER_SIZE": "100"}, output="quiet")
    for rank in (0, 1):
        trace = json.loads(run.stdout[rank].strip().splitlines()[-1])
        seen = [(e["collective_seq_id"], e["profiling_name"], e["input_sizes"])
                for e in trace["entries"]]  # fmt: skip
        # both collectives, in order, with their shapes ("retired" is set by gloo's thread after
        # the call returned: not yet, now and then); gloo fills no start or end times
        assert seen == [(1, "gloo:all_reduce", [[4]]), (2, "gloo:broadcast", [[4]])]
        assert trace["pg_status"]["0"]["last_enqueued_collective"] == "2"
        assert {e["time_discovered_completed_ns"] for e in trace["entries"]} == {0}


def test_debug_info_names_the_unused_parameters_and_detail_with_ddp_is_said_to_crash():
    run = ddp_kit.launch(WORKERS / "unused.py", 2, debug="info", output="quiet")
    for rank in (0, 1):
        assert run.stdout[rank] == (
            f"Parameters which did not receive grad for rank {rank}: unused.bias, unused.weight\n"
            f"Parameter indices which did not receive grad for rank {rank}: 2 3\n"
        )
    # torch 2.13: DDP's constructor on a group made under DETAIL kills the rank (SIGSEGV)
    with pytest.raises(WorkerError) as crashed:
        ddp_kit.launch(WORKERS / "unused.py", 2, debug="detail", output="quiet")
    assert "process was killed by SIGSEGV (signal 11)" in str(crashed.value)
    assert diagnose.DETAIL_CRASH in str(crashed.value)


NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "18_debugging_ddp.ipynb"
EXERCISE = solutions.exercise("18_debugging_ddp")
PLANTED, SOLUTION = EXERCISE.edit, EXERCISE.right


def test_the_debugging_exercise_hangs_as_planted_and_passes_with_its_solution(capsys):
    cells = [cell.source for cell in nbformat.read(NOTEBOOK, as_version=4).cells]
    body = [source.split("\n", 1)[1] for source in cells if source.startswith("%%ranks")]
    setup = body[0]
    exercise = next(i for i, source in enumerate(body) if "def train_until" in source)
    planted, after = body[exercise], body[exercise + 1]
    assert planted.count(PLANTED) == 1
    with Session(4, collective_timeout=3, output="quiet") as session:
        session.run(setup)
        with pytest.raises(CellError, match="Ranks? [0-9, -]+ finished the cell and never"):
            session.run(planted)
        session.run(after)
        assert exercises.check_early_stop(session.records, target=2.0) is False
        for text, wrong in EXERCISE.more_wrong:  # stop together, but not when it should
            assert planted.count(text) == 1
            session.run(planted.replace(text, wrong))
            session.run(after)
            assert exercises.check_early_stop(session.records, target=2.0) is False
        assert "Not quite: the ranks stopped together" in capsys.readouterr().out
        session.run(planted.replace(PLANTED, SOLUTION))
        session.run(after)
        assert exercises.check_early_stop(session.records, target=2.0) is True
    assert "Correct! Every rank stopped after 6 steps" in capsys.readouterr().out


def test_gloo_abort_and_shutdown_do_not_end_a_waiting_collective_its_timeout_does():
    run = ddp_kit.launch(WORKERS / "gloo_abort.py", 2, args=["4"], output="quiet")
    returned, ended = re.fullmatch(
        r"abort and shutdown returned at (\S+) s\nthe wait ended at (\S+) s: True\n", run.stdout[0]
    ).groups()
    assert float(returned) < 2.5 and float(ended) >= 3.5  # the collective timeout is 4 s
