"""The %%torchrun cell magic in a real IPython shell."""

from __future__ import annotations

import inspect

import pytest
from IPython.core.interactiveshell import InteractiveShell
from support import kit_frames

import ddp_kit
from ddp_kit import LaunchConfigError, WorkerError

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="module")
def shell():
    ipython = InteractiveShell.instance()
    ipython.run_line_magic("load_ext", "ddp_kit")
    return ipython


def test_cell_body_runs_on_every_rank(shell, capfd):
    shell.run_cell_magic(
        "torchrun",
        "-n 2 --result hello",
        "from ddp_kit.worker import rank, record\nprint('hi from', rank())\nrecord('r', rank())\n",
    )
    result = shell.user_ns["hello"]
    assert result.ok and result.records["r"].tolist() == [[0, 1]]
    assert capfd.readouterr().out == "[rank 0] hi from 0\n[rank 1] hi from 1\n"


def test_failure_raises_and_keeps_the_result(shell):
    with pytest.raises(WorkerError, match="Rank 0 failed with ZeroDivisionError"):
        shell.run_cell_magic("torchrun", "-n 1 --output quiet", "1 / 0\n")
    assert shell.user_ns["last_run"].root_cause.type == "ZeroDivisionError"


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("-n two", "argument -n/--nproc: invalid int value: 'two'"),
        ("--nprocs 2", "unrecognized arguments: --nprocs 2"),
        ("--time 5", "unrecognized arguments: --time 5"),  # never taken for --timeout
        ("-n 0", "nproc=0"),
        ("--output loud", "invalid choice: 'loud'"),
        ("--result 1x", "is not a variable name"),
    ],
)
def test_bad_flags_get_a_clear_error(shell, line, match):
    with pytest.raises(LaunchConfigError, match=match):
        shell.run_cell_magic("torchrun", line, "print('never runs')\n")


def test_help_is_generated_from_the_flags(shell):
    doc = shell.find_cell_magic("torchrun").__doc__
    for flag in (
        "--nproc",
        "--nnodes",
        "--backend",
        "--timeout",
        "--collective-timeout",
        "--output",
        "--result",
    ):
        assert flag in doc, flag
    assert "(default: 300.0)" in doc and "(default: 60.0)" in doc  # launch()'s own defaults


def test_a_failure_renders_as_the_rank_traceback_without_kit_frames(shell):
    with pytest.raises(WorkerError) as caught:
        shell.run_cell_magic("torchrun", "-n 1 --output quiet", "x = 1\nraise KeyError('gone')\n")
    rendered = "\n".join(caught.value._render_traceback_())
    assert rendered.startswith("WorkerError: rank 0 failed; its traceback")
    assert 'script.py", line 2, in <module>' in rendered
    assert kit_frames(rendered) == []
    assert rendered.count("KeyError: 'gone'") == 1


def test_launch_and_session_share_their_run_options_and_defaults():
    """%%torchrun and %ranks share one flag table, so the options they share mean the same."""
    launch_options = inspect.signature(ddp_kit.launch).parameters
    session_options = inspect.signature(ddp_kit.Session).parameters
    shared = ["nnodes", "backend", "collective_timeout", "output", "debug", "env"]
    for name in shared:
        assert launch_options[name].default == session_options[name].default, name
        assert launch_options[name].annotation == session_options[name].annotation, name


@pytest.mark.parametrize(("magic", "line"), [("torchrun", "-n abc"), ("ranks", "start -n abc")])
def test_a_flag_error_shows_the_usage_once(shell, magic, line):
    with pytest.raises(LaunchConfigError) as caught:
        if magic == "torchrun":
            shell.run_cell_magic(magic, line, "print('never runs')\n")
        else:
            shell.run_line_magic(magic, line)
    message = str(caught.value)
    assert "invalid int value: 'abc'. Usage: %" in message and message.lower().count("usage") == 1


def test_stopping_when_no_ranks_run_says_there_were_none(shell, capsys):
    shell.run_line_magic("ranks", "stop")
    assert capsys.readouterr().out == (
        "[ddp_kit] no live ranks to stop (start them with %ranks start -n 4)\n"
    )
