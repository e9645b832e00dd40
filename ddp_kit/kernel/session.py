"""Session: live ranks that stay up between cells, so a class can stop between forward,
backward, all-reduce and the optimizer step and look at every rank's tensors.

    kernel: Session ── channel.Channel: 127.0.0.1:<free port>, a random key per session
      └─ agent per node (torchrun, as for a launch)
           └─ rank: ddp_kit.rank.runner -> ddp_kit.rank.server, connects back, authenticated

On other hosts (hosts=, launcher="ssh" or "slurm"; kernel.hosts): the agents start as a
launch's do. Over ssh, each host's ranks connect to a Unix socket that the host's ssh
forwards to the kernel's 127.0.0.1 port; under SLURM, to the kernel's address toward the
nodes. Interrupts go as SIGINT over ssh, or by srun.

Each cell is sent to the chosen ranks and run there in one namespace per rank; output comes
back as it is printed and is shown like launch()'s (kernel.output's modes). The student still calls
init_process_group and builds DDP in the cells: that is the lesson.

When something stops a cell (its time limit, the kernel's interrupt, a rank's process ending)
or a collective timed out, one policy, `_recover`, decides whether the ranks can be kept, and
the message says what happened and what is lost.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from ..rank.probe import address_toward
from ..shared import contract
from ..shared.contract import Exit, Flush, FreeGroups, Pull, PullFailed, RunCell
from ..shared.errors import CellError, Interrupted, LaunchConfigError, SessionError
from ..shared.failures import RankFailure
from ..shared.markers import node_groups
from ..shared.records import Records
from . import diagnose
from . import hosts as hosts_module
from .backend import choose_backend, say_choice, say_fallback
from .channel import INTERRUPT_GRACE, Channel, Stop
from .output import RankOutput, RankPrinter, span, validate_output
from .progress import CellStatus, StartProgress, positions
from .progress import wanted as status_wanted
from .result import CellResult
from .script import write_script
from .torchrun import (
    Agents,
    agent_argv,
    log_roots,
    make_run_dir,
    rank_env,
    runner_argv,
    torchrun_commands,
    validate,
)

SERVER = "from ddp_kit.rank.server import serve\n\nserve()\n"
START_TIMEOUT = 180.0  # torchrun, `import torch` and DDP's imports on every rank
CLOSE_GRACE = 15.0

RESTARTED = (
    "The session was restarted: fresh ranks, and every variable, model and process group of "
    "the old ones is lost. Run the set-up cells again."
)
RESTARTED_AFTER_HANG = (
    "A collective timed out, and a process group cannot be trusted after that. " + RESTARTED
)
FREED_AFTER_HANG = (
    "A collective timed out, and a process group cannot be trusted after that: every rank's "
    "process groups were destroyed. Every rank's variables are kept, but a DDP model built on "
    "the old group can no longer sync: call dist.init_process_group() again and wrap the "
    "models again (DDP(model))."
)
RESTARTED_AFTER_STALL = (
    "A rank was stuck inside torch, where it cannot be interrupted. " + RESTARTED
)
KEPT = "The session is still running; every rank's variables are kept."

__all__ = ["CellResult", "Session"]


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
        output: str = "collapsed",
        debug: str = "off",
        env: Mapping[str, str] | None = None,
        idle_timeout: float = 1800.0,
        hosts: Sequence[str] | str | None = None,
        launcher: str = "local",
        python: str | None = None,
    ) -> None:
        self.host_names = hosts_module.validate_hosts(hosts, launcher, nnodes)
        nnodes = len(self.host_names) or nnodes
        validate(nproc, nnodes, cell_timeout, collective_timeout, output, debug)
        if not isinstance(idle_timeout, (int, float)) or not idle_timeout > 0:
            raise LaunchConfigError(f"idle_timeout={idle_timeout!r}: give a positive number of "
                                    "seconds (the default, 1800, is 30 minutes).")  # fmt: skip
        self.nproc, self.nnodes = nproc, nnodes
        self.launcher, self.python = launcher, python or sys.executable
        self._backend_asked = backend
        # Over hosts the backend is chosen at start(), by the hosts' GPUs: here only its name
        # is checked (a login node without GPUs may start ranks on GPU hosts)
        self.choice = (choose_backend(nproc, backend, gpus=nproc) if self.host_names
                       else choose_backend(nproc * nnodes, backend))  # fmt: skip
        self.rank_hosts: list[str] = []  # each rank's host, over hosts
        self.collective_timeout = collective_timeout
        self.cell_timeout = cell_timeout
        self.output = output
        self.debug = debug
        self.env = dict(env or {})
        self.idle_timeout = idle_timeout
        self.idle_stopped = ""  # why the ranks were stopped for being idle, said at the next cell
        self._last_used = time.monotonic()
        self._busy = threading.Lock()  # held while a cell or a request runs
        # the last cell: its ranks, those that did not finish it, and where they said they were
        self._last_cell: tuple[list[int], set[int], dict] = ([], set(), {})
        self.cells_run = 0
        self._fresh = False  # no cell has run on these ranks yet
        self.started_at = 0.0
        self.start_seconds = 0.0
        self._channel = Channel()
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
    def backend(self) -> str:
        """The backend the kit chose for the ranks: "gloo" or "nccl" (as a launch's result says)."""
        return self.choice.backend

    @property
    def running(self) -> bool:
        """Whether the ranks are up."""
        return self._agents is not None and self._agents.running()

    @property
    def pids(self) -> dict[int, int]:
        """Every rank's process id."""
        return dict(self._channel.pids)

    def start(self) -> None:
        """Start torchrun with a rank server on every rank; wait until every rank connects."""
        if self._agents is not None:
            raise SessionError("This session is already running: close() or restart() it.")
        found = (hosts_module.probe_for(self.host_names, self.python, SERVER, self.launcher)
                 if self.host_names else [])  # fmt: skip
        if found:  # each host runs nproc ranks on its own GPUs
            self.choice = choose_backend(self.nproc, self._backend_asked,
                                         gpus=min(host.gpus for host in found))  # fmt: skip
            say_fallback(self.choice)
        else:
            say_choice(self.choice, self.world_size)
        begin = time.perf_counter()
        self._run_dir = run_dir = make_run_dir()
        self._channel = Channel()
        key_file = self._channel.write_key(run_dir / contract.KEY_FILE)
        # Over ssh the kernel listens on 127.0.0.1 (each host's ranks come through its ssh); under
        # SLURM, on its address toward the nodes, never on every interface
        toward = (address_toward(found[0].address)
                  if self.launcher == "slurm" else "127.0.0.1")  # fmt: skip
        listener = self._channel.listen(toward)
        host, port = listener.address
        script = write_script(run_dir, SERVER)
        env = rank_env(run_dir, self.choice.backend, self.collective_timeout, self.env, self.debug,
                       self.choice.device)
        env.update({contract.SESSION_ADDRESS: f"{host}:{port}",
                    contract.SESSION_KEY_FILE: str(key_file)})  # fmt: skip
        if found:
            try:
                commands = self._host_commands(found, run_dir, script, env, port)
            except BaseException:
                listener.close()
                self._discard()
                raise
            self._agents = agents = Agents.start(commands, dict(os.environ), self.nproc,
                                                 remote=True)  # fmt: skip
        else:
            commands = torchrun_commands(script, self.nproc, self.nnodes, run_dir / contract.LOGS)
            self._agents = agents = Agents.start(commands, env, self.nproc)
        progress = StartProgress(self.world_size, self.output != "quiet" and status_wanted())
        try:
            connected = self._channel.accept(listener, self.world_size, agents.running,
                                             START_TIMEOUT, progress.update)  # fmt: skip
        except BaseException:
            self._discard()
            raise
        finally:
            listener.close()
        if connected < self.world_size:
            progress.end(f"{connected}/{self.world_size} live ranks connected (see below)")
            why = self._startup_failure(connected)
            self._discard()
            raise SessionError(why)
        if found:
            self._place_on_hosts(found, run_dir)
        progress.end(f"{self.world_size} live ranks connected in "
                     f"{time.perf_counter() - begin:.1f} s")  # fmt: skip
        self.started_at = time.time()
        self.start_seconds = time.perf_counter() - begin
        self._fresh = True
        self._last_used = time.monotonic()
        self.idle_stopped = ""
        threading.Thread(target=self._stop_when_idle, args=(agents,), daemon=True,
                         name="ddp_kit-idle-watch").start()  # fmt: skip

    def _host_commands(self, found: list[hosts_module.Host], run_dir: Path, script: Path,
                       env: dict[str, str], port: int) -> list[list[str]]:  # fmt: skip
        """Each host's command (kernel.hosts): over ssh, with the forward that carries its ranks'
        channel to the kernel (a Unix socket per host in the run directory)."""
        node_env: list[dict[str, str]] = []
        ssh_extra: list[list[str]] = []
        if self.launcher == "ssh":
            for node in range(len(found)):
                socket_path = run_dir / f"channel-{node}.sock"
                node_env.append({contract.SESSION_ADDRESS: str(socket_path)})
                ssh_extra.append(hosts_module.session_forward(socket_path, port))
        agent = agent_argv(self.python, self.nproc)
        return hosts_module.remote_commands(found, agent, runner_argv(script),
                                            run_dir / contract.LOGS, env, run_dir.name,
                                            START_TIMEOUT, self.launcher, self.env,
                                            node_env, ssh_extra)  # fmt: skip

    def _place_on_hosts(self, found: list[hosts_module.Host], run_dir: Path) -> None:
        """Learn each rank's host (from the started markers: torchrun numbers the nodes by
        address), and interrupt the ranks there by their pids."""
        groups = node_groups(run_dir / contract.MARKERS, self.nproc)
        named = {group * self.nproc + local: found[node].name
                 for node, group in groups.items() for local in range(self.nproc)}  # fmt: skip
        self.rank_hosts = [named.get(rank, "?") for rank in range(self.world_size)]
        channel = self._channel

        def interrupt(ranks: list[int]) -> None:
            pids: dict[str, list[int]] = {}
            for rank in ranks:
                if self.rank_hosts[rank] != "?":  # no marker: its host is not known
                    pids.setdefault(self.rank_hosts[rank], []).append(channel.pids[rank])
            hosts_module.interrupt_ranks(self.launcher, pids)

        channel.interrupt = interrupt

    def close(self) -> None:
        """Stop every rank and agent (the ranks leave their process group first)."""
        if self._agents is None:
            return
        for rank in list(self._channel.conns):
            try:
                self._channel.send([rank], Exit())
            except OSError:
                pass
        self._agents.wait(CLOSE_GRACE)
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
        on = (lambda r: f"{self.rank_hosts[r]}/") if self.rank_hosts else (lambda r: "")
        pids = ", ".join(f"{r}: {on(r)}{p}" for r, p in sorted(self._channel.pids.items()))
        up = time.time() - self.started_at
        return (
            f"{self.world_size} live ranks, {self.choice.backend} on {self.choice.device}, "
            f"up {up:.0f} s, {self.cells_run} cells run; pids {{{pids}}}; memory "
            f"{self.memory_text()}; stops after {self.idle_timeout / 60:g} min idle"
        )

    def where(self) -> str:
        """Where each rank of the running cell is: its cell lines and the torch function it
        is in (a rank says so once its cell has run 2 s); its ranks that finished say done.
        Callable from another thread while a cell runs. With no cell running: where the last
        cell's ranks that did not finish it (they failed, or were stopped) last said they were,
        kept across the restart that may have followed."""
        channel = self._channel
        if channel.running:
            return "The running cell:\n" + positions(
                channel.targets, channel.running, channel.busy, stacks=True
            )
        if not self._last_cell[2]:
            return "No cell is running, and the last one ran too briefly to say where it was."
        return "The last cell; where its ranks last said they were:\n" + self._last_positions(True)

    def _last_positions(self, stacks: bool) -> str:
        """Where the last cell's unfinished ranks last said they were (the others: done)."""
        targets, unfinished, busy = self._last_cell
        return positions(targets, unfinished & set(busy), busy, stacks)

    def __repr__(self) -> str:
        state = "running" if self.running else "closed"
        return f"<Session {state}: {self.world_size} ranks, {self.choice.backend}>"

    # -- cells ------------------------------------------------------------------------------

    def run(
        self,
        code: str,
        ranks: Iterable[int] | None = None,
        *,
        check: bool = True,
        output: str | None = None,
        profile: str | None = None,
    ) -> CellResult:
        """Run `code` on `ranks` (default: all), each in its own persistent namespace; its
        output is shown in this cell's `output` mode (default: the session's). With `profile`,
        each rank records a torch.profiler trace of the cell under that name (ddp_kit.profiling;
        ddp_kit.tracing merges them).

        A rank that raises gives a CellError (unless check=False); the session stays up. A
        cell past cell_timeout, or interrupted, is interrupted on the ranks; ranks that do not
        come back within a few seconds make the session restart (and say so). If the first
        cell on fresh ranks failed only because gloo could not connect them, before any
        printed, the ranks are restarted and the cell runs once more, with a note.
        """
        mode = self.output if output is None else output
        validate_output(mode)
        with self._in_use():
            return self._run(code, ranks, check, mode, profile)

    def _run(
        self, code: str, ranks: Iterable[int] | None, check: bool, mode: str, profile: str | None
    ) -> CellResult:
        targets = self._targets(ranks)
        self.cells_run += 1
        cell = RunCell(f"<cell {self.cells_run}>", code, profile)
        compile(code, cell.name, "exec")  # a syntax error is shown here, before any rank runs it
        fresh, self._fresh = self._fresh, False
        result, stop, printer = self._run_once(cell, targets, mode)
        retry_note = None
        if fresh and stop is None and len(targets) == self.world_size:
            again = "the ranks were restarted and the cell run again"
            retry_note = diagnose.connect_retry_note(result.failures, any(result.stdout), again)
        if retry_note:  # fresh ranks lose nothing; the first try's output is not shown
            self.restart()
            diagnose.say(retry_note)
            self._fresh = False
            result, stop, printer = self._run_once(cell, targets, mode)
            result.notes.append(retry_note)
        printer.show_rest()
        notes = self._recover(stop, result.failures)
        if stop is not None and stop.kind == "interrupt":
            raise Interrupted("\n".join(notes))
        if stop is not None and (stop.stuck or stop.lost is not None):
            raise SessionError(" ".join(notes))
        if result.failures and (check or stop):
            failed = {f.rank for f in result.failures}
            finished = [r for r in targets if r not in failed and stop is None]
            explanation = diagnose.explain_failures(result.failures, finished)
            message = "\n\n".join([*notes, explanation.message])
            rendered = explanation.rendered("CellError") + ["", *notes]
            raise CellError(message, result, rendered)
        return result

    def pull(self, name: str, ranks: Iterable[int] | None = None) -> list[Any]:
        """The value of variable `name` on every rank (tensors as numpy arrays), rank order."""
        targets = self._targets(ranks)
        replies = self._request(targets, Pull(name))
        found = [RankFailure(**r.failure) for r in replies.values() if isinstance(r, PullFailed)]
        if found:
            explanation = diagnose.explain_failures(found)
            raise CellError(explanation.message, None, explanation.rendered("CellError"))
        return [replies[rank].value for rank in targets]

    @property
    def records(self) -> Records:
        """What record() saved on the ranks so far, as launch()'s RunResult.records."""
        self._request(self._targets(None), Flush())
        assert self._run_dir is not None
        return Records.load(self._run_dir / contract.RECORDS, self.world_size)

    # -- internals --------------------------------------------------------------------------

    def _run_once(
        self, cell: RunCell, targets: list[int], mode: str
    ) -> tuple[CellResult, Stop | None, RankPrinter]:
        """Run the cell once; what it printed is kept, and shown so far only as the output
        mode shows it live (the caller shows the rest)."""
        printer = RankPrinter(targets, mode)
        shown = mode != "quiet" and status_wanted()
        status = CellStatus(self._channel, targets, shown, self.collective_timeout)
        begin = time.perf_counter()
        self._channel.send(targets, cell)
        try:
            replies, stop = self._channel.collect(
                targets, printer.write, self.cell_timeout, on_poll=status.update
            )
        except BaseException:
            printer.show_rest()
            raise
        finally:
            status.finish()
        printer.end_lines()
        found = [RankFailure(**reply.failure) for reply in replies.values() if reply.failure]
        finished = {rank for rank, reply in replies.items() if not reply.failure}
        self._last_cell = (targets, set(targets) - finished, dict(self._channel.busy))
        result = CellResult(
            targets,
            [printer.text(r, "stdout") if r in targets else "" for r in range(self.world_size)],
            [printer.text(r, "stderr") if r in targets else "" for r in range(self.world_size)],
            sorted(found, key=lambda f: f.time),
            time.perf_counter() - begin,
        )
        return result, stop, printer

    def _recover(self, stop: Stop | None, found: list[RankFailure]) -> list[str]:
        """The one restart policy: ranks whose state cannot be trusted are replaced by fresh
        ones. Returns the notes that say what happened, where the ranks were when the cell
        stopped or hung (if it ran long enough for them to say), and what is kept or lost."""
        where = []
        if self._last_cell[2] and stop is not None:
            where = ["Where the ranks were: " + self._last_positions(stacks=False)]
        if stop is not None and stop.lost is not None:
            if self.rank_hosts:  # the other hosts' ranks serve on: the kit stops them
                codes = self._exit_codes(seconds=1.0)
                lost = (f"{stop.reason} on host {self.rank_hosts[stop.lost]} ({codes}); the kit "
                        "stopped every rank. ")  # fmt: skip
            else:
                codes = self._exit_codes()
                lost = f"{stop.reason} ({codes}); torchrun then stopped every rank. "
            self._replace_ranks(lost)
            return [lost + RESTARTED, *filter(None, [diagnose.detail_crash_note(self.debug,
                                                                                codes)])]
        if stop is not None and stop.stuck:
            said = (f"{stop.reason} {span(stop.stuck).capitalize()} did not come back within "
                    f"{INTERRUPT_GRACE:g} s (a rank blocked in a collective only returns at its "
                    "collective_timeout). ")  # fmt: skip
            self._replace_ranks(said)  # stuck ranks cannot answer an exit message
            return [said + RESTARTED, *where]
        notes = [stop.reason, *where] if stop is not None else where
        if diagnose.stalled(found):
            # the stalled rank is stuck inside torch: it cannot answer an exit message
            self._replace_ranks(" ".join(notes))
            return [*notes, RESTARTED_AFTER_STALL]
        if diagnose.hung(found):
            return [*notes, self._free_groups()]
        return [*notes, KEPT] if stop is not None else notes

    def _free_groups(self) -> str:
        """After a collective timed out: destroy every rank's process groups and keep the
        ranks; replace them only if that fails (a rank stuck freeing its group, rank.waits)."""
        everyone = sorted(self._channel.conns)
        self._channel.send(everyone, FreeGroups())
        quiet = RankPrinter(everyone, "quiet")
        replies, stop = self._channel.collect(everyone, quiet.write, self.cell_timeout)
        if stop is None and not any(reply.failure for reply in replies.values()):
            return FREED_AFTER_HANG
        self._replace_ranks("A collective timed out.")
        return RESTARTED_AFTER_HANG

    def _replace_ranks(self, said: str) -> None:
        """Stop the ranks at once (no exit message) and start fresh ones, after `said`; if the
        hosts refuse (one is down), say both, with the fix, as one SessionError."""
        self._discard()
        try:
            self.start()
        except LaunchConfigError as error:
            raise SessionError(f"{said.rstrip()} The ranks could not start again: {error} "
                               "Once every host answers: session.start(), or %ranks start "
                               "with the same -n, --hosts and --launcher.") from None  # fmt: skip

    def _targets(self, ranks: Iterable[int] | None) -> list[int]:
        if not self.running:
            if self._agents is not None:
                self._discard()
            if self.idle_stopped:
                raise SessionError(self.idle_stopped)
            raise SessionError("No live ranks: start them with `%ranks start -n 4` or Session().")
        targets = sorted(set(range(self.world_size) if ranks is None else ranks))
        bad = [r for r in targets if r not in self._channel.conns]
        if bad or not targets:
            raise SessionError(
                f"ranks {bad or '[]'}: choose ranks from 0 to {self.world_size - 1}."
            )
        return targets

    def _request(self, targets: list[int], message: tuple) -> dict[int, tuple]:
        """Send `message` to `targets` and return their replies (no output is shown)."""
        with self._in_use():
            return self._request_once(targets, message)

    def _request_once(self, targets: list[int], message: tuple) -> dict[int, tuple]:
        self._channel.send(targets, message)
        quiet = RankPrinter(targets, "quiet")
        replies, stop = self._channel.collect(targets, quiet.write, self.cell_timeout)
        if stop is None:
            return replies
        notes = " ".join(self._recover(stop, []))
        if stop.kind == "interrupt":
            raise Interrupted(notes)
        raise SessionError(notes)

    def _exit_codes(self, seconds: float = CLOSE_GRACE) -> str:
        """torchrun's exit code line, once the agents end (up to `seconds`)."""
        assert self._agents is not None
        self._agents.wait(seconds)
        log = self._agents.log
        if "exitcode" in log:
            lines = [" ".join(line.split()) for line in log.splitlines() if "exitcode" in line]
            return lines[-1][:200]  # torchrun's "exitcode  : 1 (pid: 5)", spaces made single
        return "torchrun's log names no exit code"

    def _startup_failure(self, connected: int) -> str:
        assert self._agents is not None and self._run_dir is not None
        logs = RankOutput(log_roots(self._run_dir, self.nnodes), self.nproc, "quiet")
        logs.show_rest()
        stderr = [logs.text(rank, "stderr") for rank in range(self.world_size)]
        agent_tail = "\n".join(self._agents.log.splitlines()[-5:])
        return (
            f"Only {connected} of {self.world_size} ranks connected back within "
            f"{START_TIMEOUT:g} s; the ranks were stopped.{diagnose.stderr_tails(stderr)}"
            + (f"\n--- torchrun ---\n{agent_tail}" if agent_tail else "")
        )

    @contextmanager
    def _in_use(self):
        """While a cell or a request runs: the idle watch waits, and the clock restarts."""
        with self._busy:
            self._last_used = time.monotonic()
            try:
                yield
            finally:
                self._last_used = time.monotonic()

    def _stop_when_idle(self, agents: Agents) -> None:
        """Stop these ranks once nothing has used them (a cell, a pull, records) for
        idle_timeout seconds (a 4-rank session holds hundreds of MiB); the next cell says
        so. Ends when the ranks are replaced."""
        while self._agents is agents:
            time.sleep(min(1.0, self.idle_timeout / 4))
            idle = time.monotonic() - self._last_used
            if idle < self.idle_timeout or not self._busy.acquire(blocking=False):
                continue
            try:
                if self._agents is agents:
                    held = (memory_text(self.memory(), short=True) if not self.rank_hosts
                            else "on their hosts")  # fmt: skip
                    self.close()
                    self.idle_stopped = (
                        f"The live ranks were stopped after {idle / 60:.1f} min without a cell "
                        f"(idle_timeout={self.idle_timeout:g} s), to free their memory "
                        f"({held}). Their variables are gone: start them again with "
                        "`%ranks start` (or session.start()) and rerun the set-up cells."
                    )
            finally:
                self._busy.release()
            return

    def memory(self) -> dict[int, dict[str, int]]:
        """Each rank's memory in bytes: "pss" (its proportional share: a page shared by n
        processes counts 1/n, so the sum is what the ranks hold together) and "uss" (its own
        pages, what ending it would free) where the OS gives them (Linux), else "rss" (resident
        pages, shared ones counted in every rank that maps them)."""
        sizes: dict[int, dict[str, int]] = {}
        if self.rank_hosts:  # the pids are other hosts': not measured from here
            return sizes
        for rank, pid in sorted(self._channel.pids.items()):
            try:
                sizes[rank] = rank_memory(psutil.Process(pid))
            except psutil.Error:
                pass
        return sizes

    def memory_text(self) -> str:
        """The ranks' memory in one line, saying which measure it is."""
        if self.rank_hosts:
            return "not measured (the ranks run on other hosts)"
        return memory_text(self.memory())

    def _discard(self) -> None:
        """Stop whatever is left of the processes; forget connections and the run directory."""
        if self._agents is not None:
            self._agents.stop()
        self._channel.close()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        self._agents, self._run_dir = None, None


def rank_memory(process: psutil.Process) -> dict[str, int]:
    """A process's PSS and USS in bytes (Linux), else its RSS (shared.processes' psutil)."""
    try:
        info = process.memory_full_info()
    except psutil.AccessDenied:
        info = None
    if info is not None and hasattr(info, "pss"):
        return {"pss": info.pss, "uss": info.uss}
    return {"rss": process.memory_info().rss}


def memory_text(sizes: dict[int, dict[str, int]], short: bool = False) -> str:
    """ "PSS 1.59 GiB in all (...); per rank PSS/USS ..." (RSS where PSS is missing); `short`:
    the total alone, "PSS 1.59 GiB"."""
    measure = "pss" if sizes and all("pss" in size for size in sizes.values()) else "rss"
    total = sum(size.get(measure, size.get("pss", 0)) for size in sizes.values()) / 2**30
    head = f"{measure.upper()} {total:.2f} GiB"
    if short:
        return head
    if measure == "pss":
        each = ", ".join(f"{rank}: {size['pss'] / 2**20:.0f}/{size['uss'] / 2**20:.0f} MiB"
                         for rank, size in sizes.items())  # fmt: skip
        return (f"{head} in all (PSS: a page that n processes share counts 1/n in each); per "
                f"rank PSS/USS (USS: the rank's own pages) {each}")
    each = ", ".join(f"{rank}: {size.get('rss', 0) / 2**20:.0f} MiB"
                     for rank, size in sizes.items())  # fmt: skip
    return (f"{head} in all (RSS: a page the ranks share counts in each, so this is more than "
            f"they hold together); per rank {each}")
