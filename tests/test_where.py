"""Where every live rank is while a cell runs (#23): a rank says where its cell is once it has
run 2 s (rank.where), Session.where() shows it from another thread while the cell runs, the
status line reads the same, and a collective that times out names the ranks that never came."""

from __future__ import annotations

import threading
import time

import pytest
from support import SETUP, wait_until_gone

from ddp_kit.kernel import progress
from ddp_kit.kernel.output import RankPrinter
from ddp_kit.kernel.session import Session
from ddp_kit.rank.where import describe
from ddp_kit.shared.contract import Busy
from ddp_kit.shared.errors import CellError, SessionError

ONE_RANK_ALL_REDUCE = "x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)\n"


@pytest.mark.torchrun
def test_where_names_the_waiting_rank_and_line_long_before_the_timeout():
    with Session(4, collective_timeout=7, cell_timeout=60, output="quiet") as session:
        session.run(SETUP)
        seen: dict[str, str] = {}

        def probe() -> None:
            time.sleep(4)  # ranks say where after 2 s; the collective times out at 7 s
            seen["where"] = session.where()

        prober = threading.Thread(target=probe)
        prober.start()
        with pytest.raises(CellError) as hung:
            session.run(ONE_RANK_ALL_REDUCE)
        prober.join()
        after = session.where()  # the session was restarted: the last cell's positions stay
    assert seen["where"].startswith("The running cell:\nrank 0, ")
    assert "cell line 3: dist.all_reduce(x)\n  in torch.distributed: all_reduce (" in seen["where"]
    assert seen["where"].endswith("ranks 1-3: done")
    assert after.startswith("The last cell; where its ranks last said they were:\nrank 0, ")
    assert "cell line 3: dist.all_reduce(x)" in after and after.endswith("ranks 1-3: done")
    assert "Ranks 1-3 finished the cell and never joined that collective." in str(hung.value)
    assert "`--collective-timeout` on %%torchrun and %ranks start" in str(hung.value)


def test_a_stack_is_described_by_its_cell_lines_and_the_torch_function_it_is_in():
    import linecache

    code = "def step():\n    return where()\nresult = step()\n"
    linecache.cache["<cell 7>"] = (len(code), None, code.splitlines(keepends=True), "<cell 7>")
    import sys

    namespace = {"where": lambda: describe(sys._getframe())}
    exec(compile(code, "<cell 7>", "exec"), namespace)
    line, stack = namespace["result"]
    assert line == "cell line 2: return where()"
    assert stack == "cell line 3: result = step()\ncell line 2: return where()"


def test_positions_group_ranks_at_one_place_and_name_those_done():
    busy = {r: Busy("<cell 2>", "cell line 3: dist.barrier() (in torch.distributed: barrier)",
                    "cell line 3: dist.barrier()", 12.4) for r in (0, 1)}  # fmt: skip
    line = progress.positions([0, 1, 2, 3], {0, 1, 2}, busy, stacks=False)
    assert line == (
        "ranks 0-1: cell line 3: dist.barrier() (in torch.distributed: barrier), 12 s · "
        "rank 2: running (a rank says where after 2 s) · rank 3: done · rank 3 finished the "
        "cell without that collective: is it under `if rank == ...`, or after a loop the ranks "
        "ran unequally?"
    )
    assert progress.span([0, 2]) == "ranks 0, 2"


def test_the_status_line_appears_only_once_a_rank_said_where(monkeypatch):
    shown = []

    class Handle:
        def update(self, line):
            shown.append(repr(line))

    def display(line, display_id):
        shown.append(repr(line))
        return Handle()

    monkeypatch.setattr("IPython.display.display", display)

    class Channel:
        running, busy = {0, 1}, {}

    status = progress.CellStatus(Channel, [0, 1], enabled=True, collective_timeout=60)
    status.update()
    assert shown == []  # nothing said yet: a short cell shows no line
    Channel.busy = {0: Busy("<cell 1>", "cell line 1: time.sleep(9)", "", 3.0)}
    status.update()
    status.finish()
    assert shown[0] == (
        "[ddp_kit] rank 0: cell line 1: time.sleep(9), 3 s · rank 1: running (a rank says "
        "where after 2 s)"
    )
    assert shown[1].startswith("[ddp_kit] the cell ran for ") and shown[1].endswith("on ranks 0-1")

    # rank 0 waits in a collective that rank 1, done with the cell, never joined
    Channel.running = {0}
    Channel.busy = {0: Busy("<cell 2>", "cell line 3: dist.all_reduce(x) (in torch.distributed: "
                            "all_reduce)", "", 5.0)}  # fmt: skip
    status = progress.CellStatus(Channel, [0, 1], enabled=True, collective_timeout=60)
    status.update()
    assert shown[2] == (
        "[ddp_kit] rank 0: cell line 3: dist.all_reduce(x) (in torch.distributed: all_reduce), "
        "5 s · rank 1: done · rank 1 finished the cell without that collective: is it under `if "
        "rank == ...`, or after a loop the ranks ran unequally? · " + progress.what_next(60)
    )
    assert "collective timeout (60 s)" in shown[2] and "keeps every variable" in shown[2]


def test_the_start_line_counts_the_ranks_that_connected(monkeypatch):
    shown = []

    class Handle:
        def update(self, line):
            shown.append(repr(line))

    monkeypatch.setattr("IPython.display.display", lambda line, display_id: shown.append(
        repr(line)) or Handle())  # fmt: skip
    start = progress.StartProgress(4, enabled=True)
    start.update(3)
    start.end("4 live ranks connected in 6.1 s")
    assert shown == [
        "[ddp_kit] starting 4 live ranks (torchrun, then `import torch` on each): 3/4 connected"
        " · 0 s",
        "[ddp_kit] 4 live ranks connected in 6.1 s",
    ]


@pytest.mark.torchrun
def test_an_idle_session_stops_itself_and_the_next_cell_says_so():
    session = Session(2, idle_timeout=3, output="quiet")
    try:
        assert "memory PSS " in session.status() and " MiB" in session.status()
        session.run("x = 1")
        time.sleep(2)
        session.run("x += 1")  # a cell restarts the clock
        time.sleep(2)
        assert session.running
        deadline = time.monotonic() + 20
        while session.running and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not session.running
        with pytest.raises(
            SessionError,
            match=r"stopped after 0\.\d min without a cell "
            r"\(idle_timeout=3 s\), to free their memory \(PSS \d\.\d\d GiB\)",
        ):
            session.run("x")  # fmt: skip
        session.start()
        assert session.run("print(2)").stdout == ["2\n", "2\n"]
    finally:
        session.close()
    assert wait_until_gone(5) == []


def test_in_plain_ipython_on_a_terminal_the_line_is_redrawn_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(progress, "shell_kind", lambda: progress.TERMINAL)
    start = progress.StartProgress(2, enabled=True)
    start.update(1)
    printer = RankPrinter([0, 1], "collapsed")
    printer.write(0, "stdout", "hello\n")
    printer.write(1, "stdout", "hello\n")  # output wipes the line first
    start.end("2 live ranks connected in 3.0 s")
    out, err = capsys.readouterr()
    assert out == "[ranks 0-1] hello\n"
    assert err == (
        "\r\033[K[ddp_kit] starting 2 live ranks (torchrun, then `import torch` on each): 1/2 "
        "connected · 0 s\r\033[K[ddp_kit] 2 live ranks connected in 3.0 s\n"
    )
