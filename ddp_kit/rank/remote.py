"""`python -m ddp_kit.rank.remote COMMAND...`: what ssh (or srun) runs on each host of a launch
over several hosts (kernel.hosts). It starts COMMAND (the host's torchrun agent) and stands in
for it:

- it exits with COMMAND's exit code once COMMAND ends (128 + N for a death by signal N);
- `--per-node JSON` (under srun, one task per node): COMMAND is JSON[SLURMD_NODENAME];
- `--fork-server` (the fast start, kernel.fast_start, on a CPU host): before COMMAND, it
  starts a fork server (rank.forkserver) on this host for this launch, and COMMAND's relays
  (`-m ddp_kit.rank.relay`) have it fork the agent and the ranks: torch is imported once on
  the host, not once per process. Its environment is the agent's, less DDP_KIT_NODE
  (`fork_server`). The server retires when COMMAND ends and ends
  with the last process it forked, or is stopped SERVER_END_SECONDS later; if it does not
  come up, the relays start their processes plain;
- when its stdin ends, it stops COMMAND with its ranks and exits. The kernel holds the other end
  of that stdin, through ssh (or srun, which gives every task its stdin), and never writes to
  it: the kernel stopping the launch, or the kernel killed, close it, and nothing is left
  running on the host. Over ssh, a connection lost without a word closes it only once sshd
  notices (ClientAliveInterval); under srun, when SLURM ends the step. (Without a terminal,
  sshd sends a remote command no SIGHUP when the connection goes.)
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading

from ..shared.contract import FORK_SERVER, NODE
from ..shared.processes import stop_tree
from .forkserver import ForkServer

HANG_UP = 129  # the exit code of a command ended by SIGHUP, as a shell reports it
FORK_SERVER_FLAG = "--fork-server"
SERVER_END_SECONDS = 10.0  # after the agent: its forked processes are ending, or end now


def main() -> None:
    command = sys.argv[1:]
    fast = command[:1] == [FORK_SERVER_FLAG]
    if fast:
        command = command[1:]
    if command[:1] == ["--per-node"]:  # srun: one task per node, each runs its node's line
        command = json.loads(command[1])[os.environ["SLURMD_NODENAME"]]
    ending = threading.Lock()  # held by whichever way out comes first: the other waits
    server: ForkServer | None = None
    child: subprocess.Popen | None = None

    def watch_stdin() -> None:
        while sys.stdin.buffer.read1(4096):
            pass
        with ending:
            if child is not None and child.poll() is None:
                stop_tree(child.pid)
            end_server(server)
            leave(HANG_UP)

    threading.Thread(target=watch_stdin, daemon=True).start()
    # The stdin's end may come while the server starts: this process exits, and the server,
    # with nothing forked yet, retires as its own stdin closes. Not while the agent starts.
    server = fork_server(command) if fast else None
    with ending:
        if server is not None:  # `env FORK_SERVER=... NAME=VALUE ... AGENT...`
            command = [command[0], f"{FORK_SERVER}={server.socket}", *command[1:]]
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    code = child.wait()
    with ending:  # a signal's death (-N) as a shell reports it, 128 + N
        end_server(server)
        leave(128 - code if code < 0 else code)


def fork_server(command: list[str]) -> ForkServer | None:
    """A fork server for `command` (`env NAME=VALUE ... AGENT...`): in the agent's
    environment, this process's with the variables the command sets, but for DDP_KIT_NODE:
    lose_this_node() kills the processes whose environment, as /proc shows it, carries it,
    which are then the relays, not the server (it asks the server to end what it forked for
    the node), as in a fast start on one host. None if it did not come up, or this host is
    not Linux (kernel.fast_start: a fast start is Linux's alone)."""
    if command[:1] != ["env"] or not sys.platform.startswith("linux"):
        return None
    assigned = itertools.takewhile(lambda word: "=" in word, command[1:])
    env = {**os.environ, **dict(word.split("=", 1) for word in assigned)}
    env.pop(NODE, None)
    return ForkServer.start(env)


def end_server(server: ForkServer | None) -> None:
    """Retire the launch's fork server and wait for it to end with its forked processes;
    after SERVER_END_SECONDS, what it still runs is stopped, so nothing is left on the host."""
    if server is not None:
        server.stop(SERVER_END_SECONDS)


def leave(code: int) -> None:
    """Exit now: not sys.exit, which would wait for the thread that reads stdin."""
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
