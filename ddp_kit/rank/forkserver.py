"""`python -u -m ddp_kit.rank.forkserver SOCKET KERNEL_PID`: the fork server of the fast start.

A plain run imports torch in every process: the agent, then each rank (and DDP's first use
imports torch._dynamo, about another second on this machine). The fork server imports all of
it once, then forks an agent or a rank for each relay (rank.relay) that asks. torchrun still
starts every rank: what it starts is a relay, which hands its command, environment, working
directory and standard streams to this server, and stands in for the forked process: it
passes signals on, and ends as the forked process ends. The kernel starts a server for the
environment of its runs (kernel.fast_start). On a host of a launch over several hosts,
rank.remote stands in for the kernel: it starts a server for its launch (KERNEL_PID is its
own pid) and retires it when the agent ends; "the kernel" below is then rank.remote.

Protocol: a Unix socket in a private folder (0700), a connection per forked process, lines of
JSON

    relay -> server  {"module", "argv", "orig_argv", "env", "cwd"}, with the relay's fds 0-2
    server -> relay  {"pid": N}           N now runs `python -m module argv...` for the relay
                     {"plain": WHY}       not forked (WHY says why): the relay runs it itself
    child -> relay   {"deathsig": S}      the child asked to die with its parent (die_with_
                                          parent): the relay's parent, with signal S
    server -> relay  {"exit": C}          the child ended with exit code C,
                     {"signal": S}        or was killed by signal S: the relay ends the same way

    caller -> server {"end": {VAR: VALUE}, "spare": PID}
                                          SIGKILL, now, to each child whose environment has
                                          these values, but PID (worker.lose_this_node)
    server -> caller {"ended": [PIDS]}    sent once every one of them has been sent it

Messages may arrive in any order after the request. When a relay's end of the connection
closes (the relay died), the server sends its child SIGKILL (once it is not reading another
relay's request: REQUEST_SECONDS per receive, and a relay sends its request at once), and so
does a thread in the child
(processes.link_to_relay), which needs the GIL; the server does not. A process that
the child forks without exec is not watched (as with a plain rank's).

What a forked child is given, so that it sees what a fresh `python -u -m module` sees: its own
session (torchrun's start_new_session), the relay's fds 0-2, working directory, environment,
sys.argv and sys.orig_argv, a new `__main__` module for the run (runpy's, with alter_sys), the
default signal handlers, fresh seeds for `random`, numpy and torch, a fresh multiprocessing
authkey, c10d's debug level read from its own TORCH_DISTRIBUTED_DEBUG, and the variables the
preloaded imports set (as a fresh process that imports those modules has them). It differs in
what cannot be redone after start-up, among others: the string-hash seed (PYTHONHASHSEED) is
the server's; torch._dynamo is imported already (a plain rank imports it at its first
DDP(...)), so a TORCHDYNAMO_ or TORCHINDUCTOR_ variable the script sets comes too late
(TORCH_LOGS set in a script is too late in either start: the runner imports torch first); the
preloaded objects are out of the collector's reach (gc.freeze); os.getppid() is the server;
/proc/PID/cmdline reads the server's command.

The server forks only while it has a single thread and torch has not initialised CUDA (a
CUDA context does not survive a fork), and only for a relay whose environment equals its own
except for the variables a run sets (`PER_RUN`): otherwise it answers "plain". It retires when the
kernel writes "retire" on its stdin, when the stdin closes, or when its parent is no longer
the kernel (a fork of the kernel may hold the stdin), and exits once its last child has ended,
removing its folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

SERVER_MODULE = "ddp_kit.rank.forkserver"  # this module, as `python -m` names it

# Set per run by the kit or by torchrun for its workers; every other variable is read by
# Python or torch at start-up, or may be, so it must equal the server's.
PER_RUN_PREFIXES = ("DDP_KIT_", "TORCHELASTIC_")
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE is read by torchrun's c10d rendezvous when the agent joins
# a round, never at import (kernel.torchrun.RESTART_ENV sets it for runs with restarts).
# PYTEST_CURRENT_TEST: pytest sets it anew for every phase of every test, and nothing imported
# reads it; as a fixed variable it cost a kernel under pytest a new server (torch imported
# again: 3 CPU seconds) for nearly every test: 143 servers in one run of the suite (#40).
# TORCH_DISTRIBUTED_DEBUG (debug=): `import torch.distributed` reads it into c10d's debug level
# (set_debug_level_from_env), and a forked child reads it again from its own environment
# (_read_again); the rest of torch reads it when a group or DDP is made.
PER_RUN = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
           "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
           "PYTEST_CURRENT_TEST", "TORCH_DISTRIBUTED_DEBUG"}  # fmt: skip
# What the agent or a rank imports: torchrun (the agent), DDP and torch._dynamo, which DDP's
# constructor imports (the ranks), and what the kit's agent, runner and live-rank server
# import (not the agent and runner themselves: each runs as __main__).
PRELOAD = ("torch", "torch.distributed", "torch.distributed.run", "torch.nn.parallel",
           "torch._dynamo", "numpy", "ddp_kit.rank.server", "ddp_kit.shared.processes")  # fmt: skip
MAX_REQUEST = 1 << 22
REQUEST_SECONDS = 2.0  # a relay sends its request at once; the loop waits on no other


def per_run(name: str) -> bool:
    """Whether the variable `name` may differ between the server and a forked process."""
    return name in PER_RUN or name.startswith(PER_RUN_PREFIXES)


def fixed_environment(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that a forked process must share with its server."""
    return {k: v for k, v in env.items() if not per_run(k)}


def differences(env: dict[str, str], started_in: dict[str, str]) -> list[str]:
    """The names of the variables in which `env` and the server's start-up environment differ,
    leaving out the per-run ones and those the preloaded imports set (a process forked from
    the server has them: a relay that it started passes them on)."""
    imported = set_by_imports(started_in)
    mine = fixed_environment(started_in)
    theirs = {k: v for k, v in fixed_environment(env).items() if imported.get(k) != v}
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))


def set_by_imports(started_in: dict[str, str]) -> dict[str, str]:
    """The variables the preloaded imports set (torch's inductor sets TORCHINDUCTOR_CACHE_DIR):
    a fresh process sets them too when it imports the same modules."""
    return {k: v for k, v in os.environ.items() if started_in.get(k) != v}


def thread_count() -> int:
    """This process's threads, as the operating system counts them (Python's own count misses
    threads started by C libraries)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except FileNotFoundError:  # no /proc (macOS): Python's own count
        import threading

        return threading.active_count()


def why_not_fork(request: dict, started_in: dict[str, str]) -> str | None:
    """Why a request cannot be forked from this server, or None when it can."""
    threads = thread_count()
    if threads != 1:
        return f"the fork server has {threads} threads; forking it is safe with one"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the fork server"
    changed = differences(request["env"], started_in)
    if changed:
        return f"the environment differs from the fork server's in {', '.join(changed[:5])}"
    return None


def send(conn: socket.socket, message: dict) -> None:
    """One line of JSON; a relay that has gone away is not an error."""
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


REQUEST_KEYS = {"module", "argv", "orig_argv", "env", "cwd"}
END_KEYS = {"end", "spare"}


def receive_request(conn: socket.socket, fds: list[int]) -> dict:
    """The relay's request line; the fds sent with it go into `fds` (the caller closes them,
    whatever happens)."""
    data, received, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    fds.extend(received)
    while not data.endswith(b"\n"):
        if len(data) > MAX_REQUEST:
            raise ValueError("request too long")
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("the relay closed the connection")
        data += more
    request = json.loads(data)
    if not isinstance(request, dict) or (REQUEST_KEYS - request.keys() and
                                         END_KEYS - request.keys()):  # fmt: skip
        raise ValueError(f"a request needs {sorted(REQUEST_KEYS)} or {sorted(END_KEYS)}")
    return request


def end_children(path: str, match: dict[str, str], spare: int) -> list[int] | None:
    """Ask the server at `path` to SIGKILL each process it forked whose environment has the
    values in `match`, but `spare`: the pids it was sent to, or None if the server did not
    answer (not listening: retired, or ended)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(REQUEST_SECONDS)
            conn.connect(path)
            conn.sendall((json.dumps({"end": match, "spare": spare}) + "\n").encode())
            answer = b""
            while not answer.endswith(b"\n"):
                more = conn.recv(4096)
                if not more:
                    return None
                answer += more
        return json.loads(answer)["ended"]
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class Child:
    """A forked process, in the child: what to run, and the connection to its relay."""

    module: str
    argv: list[str]
    link: socket.socket

    def run(self) -> None:
        """Run the module as `python -m` would, as the process's main program."""
        import runpy

        from ..shared import processes

        processes.link_to_relay(self.link)
        sys.modules.pop(self.module, None)  # as in a fresh process: runs once, as __main__
        sys.argv = [self.module, *self.argv]
        runpy.run_module(self.module, run_name="__main__", alter_sys=True)


class Server:
    """The fork server's loop: accept relays, fork, report how the children end."""

    def __init__(self, path: str, kernel: int) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(128)
        self.path = path
        self.kernel = kernel
        self.children: dict[int, socket.socket] = {}
        self.environments: dict[int, dict[str, str]] = {}  # each child's, as its relay sent it
        self.selector = selectors.DefaultSelector()
        self.retired = False
        self.started_in = dict(os.environ)

    def serve(self) -> Child | None:
        """Serve until retired and childless (returns None), or return a forked child's Child
        (in the child, which then runs it)."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_write)
        selector = self.selector
        selector.register(self.listener, selectors.EVENT_READ, "relay")
        selector.register(sys.stdin, selectors.EVENT_READ, "kernel")
        selector.register(wake_read, selectors.EVENT_READ, "child ended")
        try:
            while not (self.retired and not self.children):
                for key, _ in selector.select(timeout=1.0):
                    if key.data == "relay" and not self.retired:
                        child = self._accept()
                        if child is not None:
                            selector.close()
                            for fd in (wake_read, wake_write):
                                os.close(fd)
                            return child
                    elif key.data == "kernel" and not self.retired:
                        said = os.read(0, 4096)  # "retire", or the end: the kernel is gone
                        if not said or b"retire" in said:
                            self._retire()
                    elif key.data == "child ended":
                        os.read(wake_read, 4096)
                    elif isinstance(key.data, int):
                        self._relay_closed(key.data, key.fileobj)
                if not self.retired and os.getppid() != self.kernel:
                    self._retire()  # the kernel is gone, though a fork of it holds our stdin
                self._reap()
        finally:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        return None

    def _retire(self) -> None:
        """The kernel is gone or wants a new server: take no more relays (a relay still
        waiting to be accepted finds its connection reset, and starts plain)."""
        self.retired = True
        self.selector.unregister(self.listener)
        self.selector.unregister(sys.stdin)
        self.listener.close()
        os.unlink(self.path)

    def _accept(self) -> Child | None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # no fd left: the relay waits, queued, until one is free
            time.sleep(0.1)  # rather than spin on a listener that stays readable
            return None
        fds: list[int] = []  # the relay's fds 0-2, as received
        answer = None  # to lose_this_node's end request, which forks nothing
        try:
            conn.settimeout(REQUEST_SECONDS)
            request = receive_request(conn, fds)
            conn.settimeout(None)
            if "end" in request:
                answer, pid = {"ended": self._end(request["end"], request["spare"])}, -1
            else:
                why = why_not_fork(request, self.started_in)
                if why is None and len(fds) != 3:
                    why = "the relay did not send its standard streams"
                pid = -1 if why is not None else os.fork()
        except Exception as error:  # a bad request: this relay starts plain, the server goes on
            why, pid = f"the fork server could not take the request: {error!r}", -1
        if pid == 0:
            try:
                return self._become_child(request, fds, conn)
            except BaseException:  # never back into the server's loop
                traceback.print_exc()
                os._exit(1)
        for fd in fds:
            os.close(fd)
        if pid == -1:
            send(conn, answer or {"plain": why})
            conn.close()
            return None
        self.children[pid] = conn
        self.environments[pid] = request["env"]
        self.selector.register(conn, selectors.EVENT_READ, pid)
        send(conn, {"pid": pid})
        return None

    def _relay_closed(self, pid: int, conn: socket.socket) -> None:
        """A relay's end of its connection closed (it sends nothing after its request): end
        its process now, as the process's own watch thread would if it could run."""
        self.selector.unregister(conn)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _end(self, match: dict[str, str], spare: int) -> list[int]:
        """SIGKILL to each child not yet reaped whose environment has the values in `match`
        (at least one), but `spare`: the pids it was sent to. SIGKILL is not caught: each ends
        with no report and no word to its peers, before it runs again."""
        ended = []
        if not match:
            return ended
        for pid, env in self.environments.items():
            if pid != spare and all(env.get(k) == v for k, v in match.items()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    ended.append(pid)
        return ended

    def _become_child(self, request: dict, fds: list[int], conn: socket.socket) -> Child:
        """In the forked child: become the process the relay would have started."""
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.listener.close()
        for other in self.children.values():
            other.close()
        self.children.clear()
        self.environments.clear()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        fds.clear()
        os.chdir(request["cwd"])
        imported = set_by_imports(self.started_in)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(imported)
        sys.orig_argv[:] = request["orig_argv"]
        sys.path[0] = os.getcwd()
        _reseed()
        _read_again()
        return Child(request["module"], request["argv"], conn)

    def _reap(self) -> None:
        """Tell each ended child's relay how it ended."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self.environments.pop(pid, None)
            if conn is None:
                continue
            try:
                self.selector.unregister(conn)
            except KeyError:  # its relay had closed already
                pass
            if os.WIFSIGNALED(status):
                send(conn, {"signal": os.WTERMSIG(status)})
            else:
                send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            conn.close()


def _reseed() -> None:
    """Fresh random state, as a fresh process draws it: torch's default generator and numpy's
    (`random` reseeds itself after a fork)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None:  # its authkey, drawn at import: the process's own
        multiprocessing.current_process().authkey = os.urandom(32)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _read_again() -> None:
    """What a preloaded import read from the environment and a run may set otherwise: c10d's
    debug level, from TORCH_DISTRIBUTED_DEBUG (PER_RUN)."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available():
        distributed.set_debug_level_from_env()


def preload() -> None:
    """Import what every process imports, then set it aside from the garbage collector
    (gc.freeze): a forked process's collections (the runner collects twice as a rank ends)
    then scan only the objects it made itself, not the hundreds of thousands imported."""
    import gc
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()


@dataclass
class ForkServer:
    """A handle on one fork server, for the process that starts it: the kernel
    (kernel.fast_start), or rank.remote on another host for the processes of one launch."""

    proc: subprocess.Popen
    folder: Path
    fixed_env: dict[str, str]

    @property
    def socket(self) -> str:
        return str(self.folder / "socket")

    @classmethod
    def start(cls, env: dict[str, str]) -> ForkServer | None:
        """Start a server in `env`, watching this process; None if it did not come up (the
        runs then start plain): its folder or process could not be made, or it ended before
        it listened."""
        try:
            folder = Path(tempfile.mkdtemp(prefix="ddp_kit-forkserver-"))
        except OSError:  # no writable temporary folder
            return None
        try:
            with open(folder / "server.log", "wb") as log:  # the server writes it
                proc = subprocess.Popen(
                    [sys.executable, "-u", "-m", SERVER_MODULE, str(folder / "socket"),
                     str(os.getpid())],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )  # fmt: skip
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        server = cls(proc, folder, fixed_environment(env))
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"listening":
            server.stop()
            return None
        return server

    def alive(self) -> bool:
        return self.proc.poll() is None

    def serves(self, env: dict[str, str]) -> bool:
        """Whether this server can fork the processes of a run with `env`."""
        return self.alive() and fixed_environment(env) == self.fixed_env

    def retire(self) -> None:
        """No more new processes: the server ends once its last forked process has ended
        (its folder is removed then, by a thread)."""
        self._say_retire()
        threading.Thread(target=self._clean_up, daemon=True).start()

    def stop(self, timeout: float | None = None) -> None:
        """Retire the server, wait for it to end, and remove its folder. With `timeout`: what
        it still runs after that many seconds (its forked processes, and theirs) is stopped
        (SIGTERM, then SIGKILL), so nothing is left."""
        self._say_retire()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            from ..shared.processes import stop_tree  # psutil's walk: only when it is due

            stop_tree(self.proc.pid)
        self._clean_up()

    def _say_retire(self) -> None:
        """Said on its stdin, not by closing it alone: a fork of the kernel may hold the pipe."""
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):  # it has ended already
                try:
                    stdin.write(b"retire\n")
                    stdin.flush()
                finally:
                    stdin.close()

    def _clean_up(self) -> None:
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def memory(self) -> dict[str, float]:
        """The server's own memory, in MiB: resident, and unique (what ending it would free)."""
        import psutil  # the kernel's question: imported when asked

        info = psutil.Process(self.proc.pid).memory_full_info()
        return {"rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20}


def main() -> None:
    path, kernel = sys.argv[1], int(sys.argv[2])
    server = Server(path, kernel)
    print("listening", flush=True)
    start = time.perf_counter()
    preload()
    print(f"ready {time.perf_counter() - start:.2f} s, {thread_count()} thread(s)", flush=True)
    child = server.serve()
    if child is not None:
        child.run()
    else:
        remove_folder(path)


def remove_folder(path: str) -> None:
    """The server ends: remove its private folder (the socket, gone already, and the log of its
    stderr), which the kernel made. The server does it, not the kernel: a kernel that ends
    before its server (its exit, a kill) would leave the folder in the temp directory."""
    folder = os.path.dirname(path)
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


if __name__ == "__main__":
    main()
