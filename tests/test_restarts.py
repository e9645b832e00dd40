"""torchrun's restarts (launch's max_restarts, %%torchrun --max-restarts) on real jobs: a rank
that fails on its first attempt, every rank started again, the training resumed from its
checkpoint, bit for bit the weights of a run that never failed; in the fast start and the
plain start (notebook 25)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import ddp_kit
from ddp_kit import LaunchConfigError, WorkerError
from ddp_kit.kernel.output import restart_line

pytestmark = pytest.mark.torchrun

# Trains 3 epochs of 4 steps (momentum, dropout: each rank its own draw), saves a checkpoint
# at each epoch's end (weights, optimizer, epoch, every rank's generator) and resumes from it.
# FAULT is how rank 1 fails at step 6 (epoch 1) while TORCHELASTIC_RESTART_COUNT < FAILING;
# when it ends its process without an exception, rank 0 waits outside any collective then, so
# that it cannot fail as a consequence before torchrun stops it (the note then names rank 1).
TRAIN = """
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_kit.worker import backend, device, device_ids
from ddp_kit.worker import record as keep

@record
def main(folder, fault_step, failing):
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group(backend())
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 1))
    model = DDP(model.to(device()), device_ids=device_ids())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(100 + rank)
    start, checkpoint = 0, folder / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location=device())
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"][rank])
        start = state["epoch"] + 1
    print(f"attempt {attempt}: from epoch {start}")
    for epoch in range(start, 3):
        for step in range(4 * epoch, 4 * epoch + 4):
            if step == fault_step and attempt < failing and rank == 1:
                FAULT
            if step == fault_step and attempt < failing and rank == 0 and NOT_RAISED:
                time.sleep(30)  # torchrun stops it first: rank 1's process is the one failure
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * world + rank))
            optimizer.zero_grad()
            model(x.to(device())).square().mean().backward()
            optimizer.step()
        rngs = [None] * world
        dist.all_gather_object(rngs, torch.get_rng_state())
        if rank == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                     "epoch": epoch, "rng": rngs}
            torch.save(state, folder / "partial.pt")
            os.replace(folder / "partial.pt", checkpoint)
        dist.barrier()
    keep("weights", torch.cat([p.detach().flatten() for p in model.module.parameters()]))
    dist.destroy_process_group()

main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
"""
FAULTS = {
    "raise": 'raise RuntimeError(f"injected fault at step {step}")',
    "os._exit(3)": "os._exit(3)",
}
PLAIN = {"DDP_KIT_FAST_START": "0"}


def train(folder, fault: str = "raise", fault_step: int = 6, failing: int = 1, **options):
    """A launch of TRAIN on 2 ranks, quiet; fault_step -1: no fault."""
    folder.mkdir()
    script = TRAIN.replace("FAULT", FAULTS[fault]).replace("NOT_RAISED", str(fault != "raise"))
    return ddp_kit.launch(script, nproc=2, args=[folder, fault_step, failing], output="quiet",
                          **options)  # fmt: skip


_uninterrupted: dict[str, np.ndarray] = {}


def uninterrupted(tmp_path, start: str) -> np.ndarray:
    """Rank 0's final weights of a run with no fault, in this start (one run per start)."""
    if start not in _uninterrupted:
        straight = train(
            tmp_path / "straight", fault_step=-1, env=PLAIN if start == "plain" else None
        )
        assert straight.ok and straight.restarts == 0 and straight.notes == []
        _uninterrupted[start] = straight.records["weights"][0, 0]
    return _uninterrupted[start]


# Both starts restart ranks the same way (the fork server forks the restarted ranks too); the
# plain start is run with one kind of fault, as it adds only start-up time to the other.
@pytest.mark.parametrize(
    ("fault", "start"), [("raise", "fast"), ("raise", "plain"), ("os._exit(3)", "fast")]
)
def test_a_rank_lost_on_the_first_attempt_is_restarted_and_resumes_bit_for_bit(
    tmp_path, fault, start
):
    env = PLAIN if start == "plain" else None
    resumed = train(tmp_path / "resumed", fault, max_restarts=2, env=env)
    assert resumed.ok and resumed.restarts == 1
    assert np.array_equal(resumed.records["weights"][0, 0], uninterrupted(tmp_path, start))
    assert np.array_equal(resumed.records["weights"][0, 0], resumed.records["weights"][0, 1])
    # what each rank printed: attempt 0 from epoch 0, the restart, attempt 1 from epoch 1
    assert (
        resumed.stdout
        == ["attempt 0: from epoch 0\n" + restart_line(1) + "attempt 1: from epoch 1\n"] * 2
    )
    first, last = resumed.attempts
    assert last.failures == [] and last.error_files == {}
    (note,) = resumed.notes
    if fault == "raise":  # the kit's report, and torch's @record error file, of rank 1
        assert any(f.rank == 1 and f.message == "injected fault at step 6" for f in first.failures)
        assert (
            first.error_files[1]["message"]["message"] == "RuntimeError: injected fault at step 6"
        )
        assert note.startswith("Attempt 0: rank 1 raised RuntimeError: injected fault at step 6. ")
    else:  # no report, no error file: torchrun's log names the rank and its exit code
        assert 1 not in first.error_files and all(f.rank != 1 for f in first.failures)
        assert note.startswith("Attempt 0: Rank 1's process ended with exit code 3 without")
    assert note.endswith(
        "torchrun stopped every rank and started all 2 again: restart 1 of at most 2, "
        "the ranks' TORCHELASTIC_RESTART_COUNT=1."
    )


def test_with_no_restarts_the_first_failure_ends_the_job_naming_rank_step_and_exit_code(
    tmp_path,
):
    with pytest.raises(WorkerError) as caught:
        train(tmp_path / "run", max_restarts=0)
    message, result = str(caught.value), caught.value.result
    assert message.startswith("Rank 1 failed with RuntimeError: injected fault at step 6")
    quotes_torchruns_summary(message, result, "")
    assert result.restarts == 0 and result.returncode == 1 and "Root Cause" in result.agent_log


def quotes_torchruns_summary(message: str, result, tries: str) -> None:
    """The message says rank 1's exit code as torchrun's summary at the end of its log does.
    It is 1 as a rule; -15 when rank 0's lost collective ended first and torchrun sent the rest
    SIGTERM while rank 1 was still exiting (1 in 20 runs beside two CPU hogs; seen in CI too)."""
    said = re.search(r"torchrun's summary: rank 1 exited with code (-?\d+)" + re.escape(tries),
                     message)  # fmt: skip
    assert said, message
    summary = r"rank\s+: 1 \(local_rank: 1\)\s+exitcode\s+: (-?\d+)"  # torchrun's, at the end
    (entry,) = re.findall(summary, result.agent_log)
    assert said.group(1) == entry


def test_restarts_used_up_end_the_job_saying_how_many_were_made(tmp_path):
    with pytest.raises(WorkerError) as caught:
        train(tmp_path / "run", failing=2, max_restarts=1, monitor_interval=0.5)
    message, result = str(caught.value), caught.value.result
    quotes_torchruns_summary(message, result, ", after 1 restart(s) of every rank (max_restarts=1)")
    assert result.restarts == 1 and len(result.notes) == 1
    assert [a.number for a in result.attempts] == [0, 1]
    assert all(any(f.rank == 1 for f in a.failures) for a in result.attempts)
    agent = result.commands[0]
    assert "--max-restarts=1" in agent and "--monitor-interval=0.5" in agent


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"max_restarts": -1}, "max_restarts=-1: use a whole number from 0 to 100"),
        ({"max_restarts": True}, "max_restarts=True: use a whole number"),
        ({"max_restarts": 1.5}, "max_restarts=1.5: use a whole number"),
        ({"max_restarts": 101}, "max_restarts=101: use a whole number"),
        ({"monitor_interval": 0}, "monitor_interval=0: give the seconds between torchrun's"),
        ({"monitor_interval": "1"}, "monitor_interval='1': give the seconds"),
        ({"monitor_interval": 30, "timeout": 30}, "less than timeout (30 s)"),
        ({"max_restarts": 1, "nnodes": 2}, "max_restarts=1 with nnodes=2: not supported"),
    ],
)
def test_bad_restart_settings_are_refused_before_anything_starts(options, said):
    with pytest.raises(LaunchConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        ddp_kit.launch("print('never runs')", nproc=2, **options)


def test_the_magic_passes_max_restarts_and_monitor_interval_to_torchrun(tmp_path):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ddp_kit")
    cell = (
        "import os\n"
        "import torch.distributed as dist\n"
        "from ddp_kit.worker import backend\n"
        "dist.init_process_group(backend())\n"
        "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and dist.get_rank() == 1:\n"
        "    raise SystemExit(1)\n"
        "dist.barrier()  # rank 0 of attempt 0 waits here for rank 1, which is gone\n"
        "print('attempt', os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "dist.destroy_process_group()\n"
    )
    line = "-n 2 --max-restarts 1 --monitor-interval 0.2 --output quiet --result restarted"
    shell.run_cell_magic("torchrun", line, cell)
    result = shell.user_ns["restarted"]
    assert result.ok and result.restarts == 1
    assert result.stdout == [restart_line(1) + "attempt 1\n"] * 2
    with pytest.raises(LaunchConfigError, match="invalid int value: 'x'"):
        shell.run_cell_magic("torchrun", "-n 2 --max-restarts x", cell)
