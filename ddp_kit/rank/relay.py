"""`python -u -m ddp_kit.rank.relay MODULE ARGS`: `python -u -m MODULE ARGS`, forked by the fork
server when it can (rank.forkserver: the protocol), run here when it cannot.

The relay is what torchrun (for a rank) or the kernel (for an agent; rank.remote on a host of
a launch over hosts) starts in a fast start.
It sends the fork server its command, environment, working directory and fds 0-2, then
stands in for the forked process, which is not its child:

- every signal it gets (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) goes on to it
  (to its process group once it has made one, to the process itself before); one that comes
  before the server's answer is kept, and ends the relay if the answer is "plain";
- it ends as the forked process ends: the same exit code, or killed by the same signal; if
  the server ends first, it exits 1 and says so;
- when the forked process asks to die with its parent (processes.die_with_parent), the relay
  arms that signal for its own parent and passes it on; its end of the connection closing
  ends the forked process (SIGKILL, sent by the server and by a thread in the process);
- no server (DDP_KIT_FORK_SERVER unset, no socket, the server ended or retired before it
  forked) or a "plain" answer: the relay replaces itself with the plain command (exec), so
  the process torchrun watches is the plain rank itself.

It imports nothing of torch, and little else: its start is the fast start's cost per process.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import sys

from ..shared.contract import FORK_SERVER, NO_PDEATHSIG

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)  # fmt: skip
WATCH_SECONDS = 0.5


def plain_command() -> list[str]:
    """The command this relay stands for: its own, without `-m ddp_kit.rank.relay`."""
    argv = list(sys.orig_argv)
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == __spec__.name:
            return [sys.executable, *argv[1:i], "-m", *argv[i + 2 :]]
    return [sys.executable, "-m", *sys.argv[1:]]


def run_plain(why: str) -> None:
    """Become the plain process (`why`: the reason, for a reader of this code and a debugger)."""
    command = plain_command()
    os.execv(command[0], command)


class Relay:
    """The connection to the fork server, and the forked process it stands for."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.pid: int | None = None
        self.pending: list[int] = []  # signals that came before the pid
        self.deathsig: int | None = None
        self.parent = os.getppid()
        self.buffer = b""

    def forward(self, sig: int, _frame=None) -> None:
        """Pass `sig` on to the forked process's group (torchrun signals a plain rank's group),
        or to the process alone while it has no group yet (it makes one first thing)."""
        if self.pid is None:
            self.pending.append(sig)
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def messages(self):
        """The server's and the child's messages, as they come; None at the end."""
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                yield json.loads(line)
            ready, _, _ = select.select([self.conn], [], [], WATCH_SECONDS)
            if not ready:
                self.check_parent()
                continue
            try:
                data = self.conn.recv(1 << 16)
            except OSError:  # reset: the server retired or ended with this request unread
                data = b""
            if not data:
                yield None
                return
            self.buffer += data

    def check_parent(self) -> None:
        """The portable watchdog: the parent is gone, so the death signal is due."""
        if self.deathsig is not None and os.getppid() != self.parent:
            self.parent = os.getppid()
            self.die_with_parent(self.deathsig)

    def die_with_parent(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            os.kill(os.getpid(), signal.SIGKILL)  # closes the connection: the child follows
        self.forward(sig)

    def arm(self, sig: int) -> None:
        """The child asked to get `sig` when its parent dies: arm it for this relay."""
        self.deathsig = sig
        if sys.platform.startswith("linux") and not os.environ.get(NO_PDEATHSIG):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != self.parent:
            self.die_with_parent(sig)

    def start_plain(self, why: str) -> None:
        """Become the plain process, unless a signal came first: then end by it, as the
        process would have."""
        if self.pending:
            end_by_signal(self.pending[0])
        run_plain(why)

    def run(self) -> None:
        for message in self.messages():
            if message is None:
                if self.pid is None:
                    self.start_plain("the fork server ended before it forked")
                print("ddp-kit relay: the fork server ended before the process did",
                      file=sys.stderr, flush=True)  # fmt: skip
                os._exit(1)
            if "plain" in message:
                self.start_plain(message["plain"])
            elif "pid" in message:
                self.pid = message["pid"]
                for sig in self.pending:
                    self.forward(sig)
                self.pending.clear()
            elif "deathsig" in message:
                self.arm(message["deathsig"])
            elif "signal" in message:
                end_by_signal(message["signal"])
            elif "exit" in message:
                os._exit(message["exit"])


def end_by_signal(sig: int) -> None:
    """End this process killed by `sig`, as the forked process was (without a core file of
    its own: the process's core, if any, is the one to keep)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their action cannot be changed
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is to go on


def main() -> None:
    path = os.environ.get(FORK_SERVER)
    if not path or len(sys.argv) < 2:
        run_plain("no fork server")
    module, *argv = sys.argv[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        request = {"module": module, "argv": argv, "orig_argv": plain_command(),
                   "env": dict(os.environ), "cwd": os.getcwd()}  # fmt: skip
        line = (json.dumps(request) + "\n").encode()
        sent = socket.send_fds(conn, [line], [0, 1, 2])
        conn.sendall(line[sent:])
    except OSError as error:
        conn.close()
        run_plain(f"the fork server is not there ({error})")
    relay = Relay(conn)
    for sig in FORWARDED:
        signal.signal(sig, relay.forward)
    relay.run()


if __name__ == "__main__":
    main()
