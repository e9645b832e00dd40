"""Session: live ranks that stay up between cells, so a class can stop between forward,
backward, all-reduce and the optimizer step and look at every rank's tensors.

    kernel: Session ── listens on 127.0.0.1:<free port>, random key per session
      └─ agent per node (torchrun, started by the launcher's pieces)
           └─ rank: ddp_kit.rank.runner -> ddp_kit.rank.server, connects back, authenticated

Each cell is sent to the chosen ranks and run there in one namespace per rank; output comes
back as it is printed and is shown like launch()'s (ordered or live). The student still calls
init_process_group and builds DDP in the cells: that is the lesson.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import Any

from ..rank.server import ADDRESS, KEY_FILE
from ..shared.errors import CellError, SessionError
from ..shared.failures import RankFailure
from ..shared.records import Records
from . import diagnose
from .backend import choose_backend
from .output import RankOutput, RankPrinter
from .script import write_script
from .torchrun import Agents, log_roots, make_run_dir, torchrun_commands, validate, worker_env

SERVER = "from ddp_kit.rank.server import serve\n\nserve()\n"
START_TIMEOUT = 180.0  # torchrun, `import torch` and DDP's imports on every rank
HELLO_TIMEOUT = 10.0
INTERRUPT_GRACE = 5.0  # how long interrupted ranks have to answer before a restart
CLOSE_GRACE = 15.0
POLL_SECONDS = 0.05


@dataclass
class CellResult:
    """What one cell did on the live ranks. stdout/stderr are indexed by rank."""

    ranks: list[int]
    stdout: list[str]
    stderr: list[str]
    failures: list[RankFailure] = field(default_factory=list)
    duration: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no rank raised."""
        return not self.failures

    @property
    def root_cause(self) -> RankFailure | None:
        """The first failure reported."""
        return min(self.failures, key=lambda f: f.time) if self.failures else None

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"FAILED on ranks {sorted(f.rank for f in self.failures)}"
        return f"<CellResult {status}: ranks {self.ranks}, {self.duration:.3f} s>"


RESTARTED = (
    "The session was restarted: fresh ranks, and every variable, model and process group of "
    "the old ones is lost. Run the set-up cells again."
)
RESTARTED_AFTER_HANG = (
    "A collective timed out, and a process group cannot be trusted after that. " + RESTARTED
)


class _Stop(Exception):
    """A cell was stopped; `reason` says why and which ranks were interrupted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _TimedOut(_Stop):
    """The cell passed cell_timeout."""


class _Interrupted(_Stop):
    """The kernel was interrupted (Jupyter's stop button) while the cell ran."""


def _hung(found: list[RankFailure]) -> bool:
    """Whether a rank's collective timed out (its process group is then unusable)."""
    return any(sign in f.message for f in found for sign in diagnose.HANG_SIGNS)


class Session:
    """Live ranks under torchrun: run cells on them, pull their variables, read records."""

    def __init__(
        self,
        nproc: int = 4,
        *,
        nnodes: int = 1,
        backend: str = "auto",
        collective_timeout: float = 60.0,
        cell_timeout: float = 300.0,
        output: str = "ordered",
        env: Mapping[str, str] | None = None,
    ) -> None:
        validate(nproc, nnodes, cell_timeout, collective_timeout, output)
        self.nproc, self.nnodes = nproc, nnodes
        self.choice = choose_backend(nproc * nnodes, backend)
        self.collective_timeout = collective_timeout
        self.cell_timeout = cell_timeout
        self.output = output
        self.env = dict(env or {})
        self.cells_run = 0
        self._fresh = False  # no cell has run on these ranks yet
        self.started_at = 0.0
        self.start_seconds = 0.0
        self._conns: dict[int, Connection] = {}
        self._pids: dict[int, int] = {}
        self._agents: Agents | None = None
        self._run_dir: Path | None = None
        atexit.register(self.close)
        self.start()

    # -- life cycle -------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """How many ranks the session has."""
        return self.nproc * self.nnodes

    @property
    def running(self) -> bool:
        """Whether the ranks are up."""
        return self._agents is not None and self._agents.running()

    def start(self) -> None:
        """Start torchrun with a rank server on every rank; wait until every rank connects."""
        if self._agents is not None:
            raise SessionError("This session is already running: close() or restart() it.")
        if self.choice.fallback:
            print(f"[ddp_kit] {self.choice.reason}", file=sys.stderr)
        begin = time.perf_counter()
        self._run_dir = run_dir = make_run_dir()
        key = secrets.token_bytes(32)
        key_file = run_dir / "session.key"
        key_file.touch(mode=0o600)
        key_file.write_bytes(key)
        listener = Listener(("127.0.0.1", 0), family="AF_INET", authkey=key, backlog=64)
        host, port = listener.address
        script = write_script(run_dir, SERVER)
        commands = torchrun_commands(script, self.nproc, self.nnodes, run_dir / "logs")
        env = worker_env(run_dir, self.choice.backend, self.collective_timeout, self.env)
        env.update({ADDRESS: f"{host}:{port}", KEY_FILE: str(key_file)})
        self._agents = Agents.start(commands, env, self.nproc)
        try:
            accepted = _accept_ranks(listener, self.world_size, self._agents, START_TIMEOUT)
        except BaseException:
            self._discard()
            raise
        finally:
            listener.close()
        if len(accepted) < self.world_size:
            for conn, _ in accepted.values():
                conn.close()
            why = self._startup_failure(len(accepted))
            self._discard()
            raise SessionError(why)
        self._conns = {rank: conn for rank, (conn, _) in accepted.items()}
        self._pids = {rank: pid for rank, (_, pid) in accepted.items()}
        self.started_at = time.time()
        self.start_seconds = time.perf_counter() - begin
        self._fresh = True

    def close(self) -> None:
        """Stop every rank and agent (the ranks leave their process group first)."""
        if self._agents is None:
            return
        for conn in self._conns.values():
            try:
                conn.send(("exit",))
            except OSError:
                pass
        deadline = time.monotonic() + CLOSE_GRACE
        while self._agents.running() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        self._discard()

    def restart(self) -> None:
        """Close and start again: fresh processes, every rank's state is gone."""
        self.close()
        self.start()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> str:
        """One line: how many ranks, backend, their pids, cells run."""
        if not self.running:
            return "No live ranks (start them with %ranks start, or Session())."
        pids = ", ".join(f"{r}: {p}" for r, p in sorted(self._pids.items()))
        up = time.time() - self.started_at
        return (
            f"{self.world_size} live ranks, {self.choice.backend} on {self.choice.device}, "
            f"up {up:.0f} s, {self.cells_run} cells run; pids {{{pids}}}"
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "closed"
        return f"<Session {state}: {self.world_size} ranks, {self.choice.backend}>"

    # -- cells ------------------------------------------------------------------------------

    def run(
        self, code: str, ranks: Iterable[int] | None = None, *, check: bool = True
    ) -> CellResult:
        """Run `code` on `ranks` (default: all), each in its own persistent namespace.

        A rank that raises gives a CellError (unless check=False); the session stays up. A
        cell past cell_timeout, or interrupted, is interrupted on the ranks; ranks that do not
        come back within a few seconds make the session restart (and say so). If the first
        cell on fresh ranks failed only because gloo could not connect them, before any
        printed, the ranks are restarted and the cell runs once more, with a note.
        """
        targets = self._targets(ranks)
        self.cells_run += 1
        name = f"<cell {self.cells_run}>"
        compile(code, name, "exec")  # a syntax error is shown here, before any rank runs it
        fresh, self._fresh = self._fresh, False
        result, stop, printer = self._run_cell(name, code, targets)
        retry_note = None
        if fresh and stop is None and len(targets) == self.world_size:
            again = "the ranks were restarted and the cell run again"
            retry_note = diagnose.connect_retry_note(result.failures, any(result.stdout), again)
        if retry_note:  # fresh ranks lose nothing; the first try's output is not shown
            self.restart()
            diagnose.say(retry_note)
            self._fresh = False
            result, stop, printer = self._run_cell(name, code, targets)
            result.notes.append(retry_note)
        printer.finish()
        notes = [stop.reason] if stop else []
        if _hung(result.failures):
            self.restart()
            notes.append(RESTARTED_AFTER_HANG)
        elif stop:
            notes.append("The session is still running; every rank's variables are kept.")
        if isinstance(stop, _Interrupted):
            raise KeyboardInterrupt("\n".join(notes))
        if result.failures and (check or stop):
            explanation = diagnose.explain_failures(result.failures, together=True)
            message = "\n\n".join([*notes, explanation.message])
            rendered = explanation.rendered("CellError") + ["", *notes]
            raise CellError(message, result, rendered)
        return result

    def _run_cell(
        self, name: str, code: str, targets: list[int]
    ) -> tuple[CellResult, _Stop | None, RankPrinter]:
        """Run the cell once; what it printed is kept, and shown so far only as the output
        mode shows it live (the caller finishes the printer)."""
        printer = RankPrinter(targets, self.output)
        begin = time.perf_counter()
        for rank in targets:
            self._conns[rank].send(("run", name, code))
        try:
            replies, stop = self._collect(targets, printer)
        except BaseException:
            printer.finish()
            raise
        printer.end_lines()
        found = [RankFailure(**reply[1]) for reply in replies.values() if reply[1] is not None]
        result = CellResult(
            targets,
            [printer.text(r, "stdout") if r in targets else "" for r in range(self.world_size)],
            [printer.text(r, "stderr") if r in targets else "" for r in range(self.world_size)],
            sorted(found, key=lambda f: f.time),
            time.perf_counter() - begin,
        )
        return result, stop, printer

    def pull(self, name: str, ranks: Iterable[int] | None = None) -> list[Any]:
        """The value of variable `name` on every rank (tensors as numpy arrays), rank order."""
        targets = self._targets(ranks)
        replies = self._request(targets, ("pull", name))
        found = [RankFailure(**r[1]) for r in replies.values() if r[0] == "done"]
        if found:
            explanation = diagnose.explain_failures(found)
            raise CellError(explanation.message, None, explanation.rendered("CellError"))
        return [replies[rank][1] for rank in targets]

    @property
    def records(self) -> Records:
        """What record() saved on the ranks so far, as launch()'s RunResult.records."""
        self._request(self._targets(None), ("flush",))
        assert self._run_dir is not None
        return Records.load(self._run_dir / "records", self.world_size)

    # -- internals --------------------------------------------------------------------------

    def _targets(self, ranks: Iterable[int] | None) -> list[int]:
        if not self.running:
            if self._agents is not None:
                self._discard()
            raise SessionError("No live ranks: start them with `%ranks start -n 4` or Session().")
        targets = sorted(set(range(self.world_size) if ranks is None else ranks))
        bad = [r for r in targets if r not in self._conns]
        if bad or not targets:
            raise SessionError(
                f"ranks {bad or '[]'}: choose ranks from 0 to {self.world_size - 1}."
            )
        return targets

    def _request(self, targets: list[int], message: tuple) -> dict[int, tuple]:
        """Send `message` to `targets` and return their replies (no output is shown)."""
        for rank in targets:
            self._conns[rank].send(message)
        replies, stop = self._collect(targets, RankPrinter(targets, "quiet"))
        if isinstance(stop, _Interrupted):
            raise KeyboardInterrupt(stop.reason)
        if stop:
            raise SessionError(stop.reason)
        return replies

    def _collect(
        self, targets: list[int], printer: RankPrinter
    ) -> tuple[dict[int, tuple], _Stop | None]:
        """Each target's reply, showing output meanwhile. At the time limit or an interrupt,
        the busy ranks are interrupted; if they do not answer, the session restarts."""
        pending = {self._conns[rank]: rank for rank in targets}
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + self.cell_timeout
        try:
            while pending:
                self._receive(pending, replies, printer)
                if time.monotonic() > deadline:
                    raise _TimedOut(f"The cell passed its cell_timeout of {self.cell_timeout:g} s")
        except (KeyboardInterrupt, _TimedOut) as caught:
            stop = (
                caught
                if isinstance(caught, _TimedOut)
                else _Interrupted("The cell was interrupted")
            )
            busy = sorted(pending.values())
            for rank in busy:
                _interrupt(self._pids[rank])
            stop.reason += f"; ranks {busy} were interrupted."
            grace = time.monotonic() + INTERRUPT_GRACE
            try:
                while pending and time.monotonic() < grace:
                    self._receive(pending, replies, printer)
            except KeyboardInterrupt:
                pass
            if pending:
                printer.finish()
                self._restart_stuck(stop, sorted(pending.values()))
            return replies, stop
        return replies, None

    def _receive(
        self, pending: dict[Connection, int], replies: dict[int, tuple], printer: RankPrinter
    ) -> None:
        for conn in wait(list(pending), POLL_SECONDS):
            rank = pending[conn]
            try:
                message = conn.recv()
            except (EOFError, OSError):
                raise self._lost(rank) from None
            if message[0] == "out":
                printer.write(rank, message[1], message[2])
            else:
                replies[rank] = message
                del pending[conn]

    def _restart_stuck(self, stop: _Stop, stuck: list[int]) -> None:
        """Ranks that ignore the interrupt (blocked in a collective): start afresh, say so."""
        self._discard()  # they cannot answer an exit message: stop them straight away
        self.start()
        message = (
            f"{stop.reason} Ranks {stuck} did not come back within {INTERRUPT_GRACE:g} s (a "
            "rank blocked in a collective only returns at its collective_timeout). " + RESTARTED
        )
        if isinstance(stop, _Interrupted):
            raise KeyboardInterrupt(message)
        raise SessionError(message)

    def _lost(self, rank: int) -> SessionError:
        """A rank's process ended: torchrun stops the others, so start afresh and say so."""
        codes = self._exit_codes()
        self.restart()
        return SessionError(
            f"Rank {rank}'s process ended ({codes}); torchrun then stopped every rank. " + RESTARTED
        )

    def _exit_codes(self) -> str:
        assert self._agents is not None
        deadline = time.monotonic() + CLOSE_GRACE
        while self._agents.running() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        log = self._agents.log
        if "exitcode" in log:
            lines = [line.strip() for line in log.splitlines() if "exitcode" in line]
            return lines[-1][:200]
        return "torchrun's log names no exit code"

    def _startup_failure(self, connected: int) -> str:
        assert self._agents is not None and self._run_dir is not None
        logs = RankOutput(log_roots(self._run_dir, self.nnodes), self.nproc, "quiet")
        logs.finish()
        stderr = [logs.text(rank, "stderr") for rank in range(self.world_size)]
        agent_tail = "\n".join(self._agents.log.splitlines()[-5:])
        return (
            f"Only {connected} of {self.world_size} ranks connected back within "
            f"{START_TIMEOUT:g} s; the ranks were stopped.{diagnose.stderr_tails(stderr)}"
            + (f"\n--- torchrun ---\n{agent_tail}" if agent_tail else "")
        )

    def _discard(self) -> None:
        """Stop whatever is left of the processes; forget connections and the run directory."""
        if self._agents is not None:
            self._agents.stop()
        for conn in self._conns.values():
            conn.close()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        self._agents, self._run_dir, self._conns, self._pids = None, None, {}, {}


def _interrupt(pid: int) -> None:
    try:
        os.kill(pid, 2)  # SIGINT: a KeyboardInterrupt inside the cell
    except ProcessLookupError:
        pass


def _accept_ranks(
    listener: Listener, world: int, agents: Agents, timeout: float
) -> dict[int, tuple[Connection, int]]:
    """Accept authenticated connections until every rank said hello, torchrun ended, or the
    time is up. A connection without the key fails authentication and is dropped unread."""
    accepted: dict[int, tuple[Connection, int]] = {}
    done = threading.Event()

    def accept() -> None:
        while len(accepted) < world and not done.is_set():
            try:
                conn = listener.accept()  # the key is checked both ways here
            except Exception:  # AuthenticationError (a stranger), or the wake-up connection
                continue
            try:
                if done.is_set() or not conn.poll(HELLO_TIMEOUT):
                    raise EOFError
                kind, rank, pid = conn.recv()
            except Exception:
                conn.close()
                continue
            if kind == "hello" and isinstance(rank, int) and 0 <= rank < world:
                accepted[rank] = (conn, pid)

    thread = threading.Thread(target=accept, name="ddp_kit-accept", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while thread.is_alive() and agents.running() and time.monotonic() < deadline:
            thread.join(POLL_SECONDS)
    finally:
        if thread.is_alive():
            done.set()
            _wake(listener.address)
            thread.join(2)
    return accepted


def _wake(address: tuple[str, int]) -> None:
    """Unblock the accepting thread with a connection that will fail authentication."""
    try:
        with socket.create_connection(address, timeout=1):
            pass
    except OSError:
        pass
