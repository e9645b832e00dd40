"""The fast start: torch is imported once per kernel (and over hosts, once per host and launch),
not once per agent and rank.

A plain run starts a fresh Python for the agent and for every rank, and each imports torch
(and, at DDP's first use, torch._dynamo): on 2 cores, 4 ranks spend most of their start-up
doing the same imports side by side. In a fast start the kernel keeps a fork server
(rank.forkserver), which has imported them; the kernel starts the agent as a relay
(rank.relay), torchrun starts each rank as a relay, and the server forks a copy of itself to
stand behind each relay:

    kernel ─┬─ fork server: `python -u -m ddp_kit.rank.forkserver SOCKET KERNEL_PID`
            │    ├─ forked agent (torchrun) ── relay of each rank (torchrun's children)
            │    └─ forked rank, one behind each rank's relay: ddp_kit.rank.runner SCRIPT
            └─ relay of the agent (what Agents holds)

torchrun still starts every rank and watches its relay, which ends as the rank ends; the
rank gets the relay's environment, working directory, argv and streams (rank.forkserver lists
what it is given, and what differs from a fresh process).

When: on Linux, with the gloo backend on CPU, unless DDP_KIT_FAST_START=0. Otherwise (nccl,
gloo on shared GPUs, macOS, Windows) every process starts plain, as before. Over several hosts,
each host's rank.remote starts a server of its own for the launch, in the kernel's place
(kernel.hosts). A run on GPUs is
left plain because the fast start is untested on a GPU and a GPU run gains little from it
(the server itself imports no CUDA context: before each fork it checks that torch has not
initialised CUDA). A relay falls back
to the plain start by itself when the server cannot fork for it (the server's reason is not
shown; `why_not_fork` lists them).

One server at a time, for the environment of the runs: a run whose environment differs from
the one the server imported torch in (another variable, but for those a run sets itself,
`debug=`'s among them: rank.forkserver.PER_RUN) gets a new server, and the old one is
retired. A server retires when the kernel says so on its stdin, or the kernel is gone (the
stdin closes, or the server's parent changes), and ends once its last forked process has
ended.
"""

from __future__ import annotations

import atexit
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..rank.forkserver import ForkServer
from ..shared import contract

RELAY_MODULE = "ddp_kit.rank.relay"


def wanted(env: dict[str, str]) -> bool:
    """Whether a run with this environment starts fast (the module docstring says when)."""
    return (
        env.get(contract.FAST_START, "1") != "0"
        and env.get(contract.BACKEND) == "gloo"
        and env.get(contract.DEVICE, "cpu") == "cpu"
        and sys.platform.startswith("linux")
        and hasattr(socket, "send_fds")
    )


def relayed(commands: list[list[str]], env: dict[str, str]) -> tuple[list[list[str]], dict]:
    """The agents' commands and environment for a fast start, or both unchanged (plain)."""
    if not wanted(env):
        return commands, env
    server = server_for(env)
    if server is None:
        return commands, env
    return [relay_command(c) for c in commands], {**env, contract.FORK_SERVER: server.socket}


def relay_command(command: list[str]) -> list[str]:
    """`python -m ddp_kit.rank.X ...` becomes `python -m ddp_kit.rank.relay ddp_kit.rank.X ...`,
    at the agent and at the rank (torchrun's `-m MODULE`)."""
    relayed: list[str] = []
    for i, word in enumerate(command):
        relayed.append(word)
        if word == "-m" and i + 1 < len(command) and command[i + 1].startswith("ddp_kit.rank."):
            relayed.append(RELAY_MODULE)
    return relayed


_server: ForkServer | None = None
_lock = threading.Lock()


def server_for(env: dict[str, str]) -> ForkServer | None:
    """The kernel's fork server for a run with `env`: the current one, or a new one in `env`
    (retiring the current one) if it serves another environment or has ended."""
    global _server
    with _lock:
        if _server is not None and _server.serves(env):
            return _server
        if _server is not None:
            _server.retire()
        _server = ForkServer.start(env)
        return _server


def prestart() -> None:
    """Start the fork server before the first run (`%load_ext ddp_kit` does), in the
    environment of a run with the default settings: torch is imported while the student
    reads, and the first run finds the server ready. On a machine with a GPU for every rank,
    whose runs use nccl, it is not used (and costs its memory alone)."""
    from .torchrun import rank_env, remove_stale_run_dirs

    remove_stale_run_dirs()  # a killed kernel's, its session key among them
    env = rank_env(Path(tempfile.gettempdir()), "gloo", 60.0, None)
    if wanted(env):
        server_for(env)


def current() -> ForkServer | None:
    """The kernel's fork server, if one is running."""
    return _server if _server is not None and _server.alive() else None


def retire(wait: float = 5.0) -> None:
    """Retire the kernel's fork server, and give it `wait` seconds to end (the kernel is
    ending: its runs have ended, so the server has no process left and ends at once)."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.retire()
        try:
            server.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


atexit.register(retire)
