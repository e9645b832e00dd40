"""How the ranks' lines are shown (kernel.output's modes), on real launches and by the rules:
collapsed shows a line every rank printed at the same place once, and the rest rank by rank,
the same text whatever order the ranks' lines arrive in."""

from __future__ import annotations

import io
import random

import pytest
from support import WORKERS

import ddp_kit
from ddp_kit.kernel.output import RankPrinter

PRINTING = WORKERS / "printing.py"
COLLAPSED = """\
[ranks 0-3] start of the step
[ranks 0, 2] loss on this rank: 0
[ranks 1, 3] loss on this rank: 1
[ranks 0-3] after all_reduce every rank holds 4
[rank 0] saved a checkpoint
"""


def lines_of(rank: int) -> list[str]:
    """What tests/workers/printing.py prints on `rank` of 4."""
    own = ["saved a checkpoint"] if rank == 0 else []
    return ["start of the step", f"loss on this rank: {rank % 2}",
            "after all_reduce every rank holds 4", *own]  # fmt: skip


@pytest.mark.torchrun
@pytest.mark.parametrize(
    "mode, expected",
    [
        ("collapsed", COLLAPSED),
        ("rank0", "".join(f"[rank 0] {line}\n" for line in lines_of(0))),
        ("all", "".join(f"[rank {r}] {line}\n" for r in range(4) for line in lines_of(r))),
    ],
)
def test_a_launch_shows_its_lines_in_each_mode(mode, expected, capfd):
    result = ddp_kit.launch(PRINTING, nproc=4, output=mode)
    assert capfd.readouterr().out == expected
    assert result.stdout[3] == "".join(line + "\n" for line in lines_of(3))  # all of it is kept


def test_collapsed_text_does_not_depend_on_when_the_ranks_print():
    for seed in range(200):
        chance = random.Random(seed)
        pending = {rank: "".join(line + "\n" for line in lines_of(rank)) for rank in range(4)}
        out = io.StringIO()
        printer = RankPrinter(range(4), "collapsed", out, out)
        while any(pending.values()):  # random ranks, cut at random places, even mid-line
            rank = chance.choice([r for r, text in pending.items() if text])
            cut = chance.randint(1, len(pending[rank]))
            printer.write(rank, "stdout", pending[rank][:cut])
            pending[rank] = pending[rank][cut:]
        printer.show_rest()
        assert out.getvalue() == COLLAPSED, seed


def test_collapsed_shows_a_shared_line_as_soon_as_every_rank_printed_it():
    out = io.StringIO()
    printer = RankPrinter([0, 1], "collapsed", out, out)
    printer.write(0, "stdout", "epoch 0\nloss 0.5\n")
    assert out.getvalue() == ""  # rank 1 has not printed yet
    printer.write(1, "stdout", "epoch 0\nloss 0.7\n")
    assert out.getvalue() == "[ranks 0-1] epoch 0\n"  # the losses wait: they may go on
    printer.write(0, "stdout", "epoch 1\n")
    printer.write(1, "stdout", "epoch 1\n")
    assert out.getvalue().splitlines()[1:] == [
        "[rank 0] loss 0.5", "[rank 1] loss 0.7", "[ranks 0-1] epoch 1"]  # fmt: skip
    printer.write(1, "stderr", "a warning\n")
    printer.write(0, "stderr", "a warning\n")
    printer.show_rest()
    assert out.getvalue().endswith("[ranks 0-1] epoch 1\n[ranks 0-1] a warning\n")
