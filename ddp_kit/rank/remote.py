"""`python -m ddp_kit.rank.remote COMMAND...`: what ssh (or srun) runs on each host of a launch
over several hosts (kernel.hosts). It starts COMMAND (the host's torchrun agent) and stands in
for it:

- it exits with COMMAND's exit code once COMMAND ends (128 + N for a death by signal N);
- `--per-node JSON` (under srun, one task per node): COMMAND is JSON[SLURMD_NODENAME];
- when its stdin ends, it stops COMMAND with its ranks and exits. The kernel holds the other end
  of that stdin, through ssh (or srun, which gives every task its stdin), and never writes to
  it: the kernel stopping the launch, or the kernel killed, close it, and nothing is left
  running on the host. Over ssh, a connection lost without a word closes it only once sshd
  notices (ClientAliveInterval); under srun, when SLURM ends the step. (Without a terminal,
  sshd sends a remote command no SIGHUP when the connection goes.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from ..shared.processes import stop_tree

HANG_UP = 129  # the exit code of a command ended by SIGHUP, as a shell reports it


def main() -> None:
    command = sys.argv[1:]
    if command[:1] == ["--per-node"]:  # srun: one task per node, each runs its node's line
        command = json.loads(command[1])[os.environ["SLURMD_NODENAME"]]
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    ending = threading.Lock()  # held by whichever way out comes first: the other waits

    def watch_stdin() -> None:
        while sys.stdin.buffer.read1(4096):
            pass
        with ending:
            if child.poll() is None:
                stop_tree(child.pid)
            leave(HANG_UP)

    threading.Thread(target=watch_stdin, daemon=True).start()
    code = child.wait()
    with ending:  # a signal's death (-N) as a shell reports it, 128 + N
        leave(128 - code if code < 0 else code)


def leave(code: int) -> None:
    """Exit now: not sys.exit, which would wait for the thread that reads stdin."""
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
