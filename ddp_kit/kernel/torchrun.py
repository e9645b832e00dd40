"""launch(): run a script on N ranks under torchrun, on loopback, and collect what happened.

The process chain (each link dies with the one above it: PDEATHSIG plus a watchdog):

    notebook kernel ── launch() / Session
      └─ agent, one per node: `python -m ddp_kit.rank.agent` = torchrun (c10d rendezvous, 127.0.0.1)
           └─ rank, one per process: `python -m ddp_kit.rank.runner SCRIPT` (bootstrap, then SCRIPT)

Everything a run leaves goes into a private run directory (mode 0700), and three things are
read back from it:

    logs/     each rank's stdout/stderr (torchrun --redirects) -> output.RankOutput -> the cell
    records/  what record() saved, npz + JSON per rank          -> records.Records
    errors/   a report per rank that raised                    -> failures + diagnose -> errors
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..shared import failures
from ..shared.errors import LaunchConfigError, LaunchTimeout, WorkerError
from ..shared.markers import COMPLETED, ranks_marked
from ..shared.processes import stop_tree
from ..shared.records import Records
from . import diagnose
from .backend import choose_backend
from .output import OUTPUT_MODES, RankOutput
from .progress import LaunchProgress
from .progress import wanted as progress_wanted
from .result import RunResult
from .script import Script, write_script

MAX_RANKS = 64
MAX_NODES = 8
POLL_SECONDS = 0.1


def launch(
    script: Script,
    nproc: int = 2,
    *,
    args: Sequence[str] = (),
    nnodes: int = 1,
    backend: str = "auto",
    timeout: float = 300.0,
    collective_timeout: float = 60.0,
    output: str = "ordered",
    env: Mapping[str, str] | None = None,
    keep_run_dir: bool = False,
    check: bool = True,
) -> RunResult:
    """Run `script` (code text, a .py path or a function) on `nproc` ranks with torchrun.

    `args` are passed to the script (its sys.argv[1:]). nnodes > 1 starts that many torchrun
    agents on this machine, as if each were a node of a cluster, all on 127.0.0.1. A failure
    raises WorkerError naming the rank (unless check=False); `timeout` bounds the whole run,
    `collective_timeout` each collective. A job whose ranks failed only because gloo could not
    connect them in init_process_group, before any printed, runs once more, with a note.
    """
    validate(nproc, nnodes, timeout, collective_timeout, output)
    choice = choose_backend(nproc * nnodes, backend)
    if choice.fallback:
        print(f"[ddp_kit] {choice.reason}", file=sys.stderr)
    job = Job(script, nproc, nnodes, list(map(str, args)), choice.backend, choice.device,
              timeout, collective_timeout, output, dict(env or {}), keep_run_dir)  # fmt: skip
    result, shown = job.run()
    retry_note = diagnose.launch_retry_note(result)
    if retry_note:  # its stdout was empty and its stderr is not shown: the note says it all
        diagnose.say(retry_note)
        result, shown = job.run()
        result.notes.insert(0, retry_note)
    shown.finish()
    note = diagnose.teardown_note(result)
    if note:
        result.notes.append(note)
        diagnose.say(note)
    if result.interrupted:
        raise KeyboardInterrupt(diagnose.explain(result, timeout).message)
    if check and not result.ok:
        error = LaunchTimeout if result.timed_out else WorkerError
        explanation = diagnose.explain(result, timeout)
        raise error(explanation.message, result, explanation.rendered(error.__name__))
    return result


@dataclass(frozen=True)
class Job:
    """One launch's settings; run() starts it afresh (in a new run directory) each time."""

    script: Script
    nproc: int
    nnodes: int
    args: list[str]
    backend: str
    device: str
    timeout: float
    collective_timeout: float
    output: str
    env: dict[str, str]
    keep_run_dir: bool

    def run(self) -> tuple[RunResult, RankOutput]:
        """Run the job once. Returns its result and its output, of which only rank 0's
        stdout has been shown so far (in "ordered" mode): `finish()` it to show the rest."""
        run_dir = make_run_dir()
        try:
            path = write_script(run_dir, self.script)
            commands = torchrun_commands(path, self.nproc, self.nnodes, run_dir / "logs", self.args)
            shown = RankOutput(log_roots(run_dir, self.nnodes), self.nproc, self.output)
            world = self.nproc * self.nnodes
            enabled = self.output != "quiet" and progress_wanted()
            progress = LaunchProgress(shown, run_dir / "done", world, enabled)
            start = time.perf_counter()
            environment = worker_env(run_dir, self.backend, self.collective_timeout, self.env)
            agents = Agents.start(commands, environment, self.nproc)
            outcome = _wait(agents, shown, self.timeout, progress)
            duration = time.perf_counter() - start
            shown.read_rest()
            progress.finish(f"{world} ranks ran for {duration:.1f} s")
            result = RunResult(
                nproc=self.nproc,
                nnodes=self.nnodes,
                backend=self.backend,
                device=self.device,
                returncode=outcome.returncode,
                duration=duration,
                stdout=[shown.text(r, "stdout") for r in range(world)],
                stderr=[shown.text(r, "stderr") for r in range(world)],
                records=Records.load(run_dir / "records", world),
                failures=failures.read_reports(run_dir / "errors"),
                timed_out=outcome.timed_out,
                interrupted=outcome.interrupted,
                script=path.read_text(),
                agent_log=outcome.agent_log,
                commands=commands,
                run_dir=run_dir if self.keep_run_dir else None,
                completed=ranks_marked(run_dir / "done", COMPLETED),
            )
        finally:
            if not self.keep_run_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
        return result, shown


def validate(nproc: int, nnodes: int, timeout: float, collective: float, output: str) -> None:
    """Refuse bad arguments before anything starts, naming the fix."""
    if not isinstance(nproc, int) or isinstance(nproc, bool) or not 1 <= nproc <= MAX_RANKS:
        raise LaunchConfigError(
            f"nproc={nproc!r}: use a whole number of ranks from 1 to {MAX_RANKS} "
            "(2 to 4 suit a laptop; each rank is a separate Python process)."
        )
    if not isinstance(nnodes, int) or not 1 <= nnodes <= MAX_NODES:
        raise LaunchConfigError(f"nnodes={nnodes!r}: use a whole number from 1 to {MAX_NODES}.")
    if nproc * nnodes > MAX_RANKS:
        raise LaunchConfigError(f"nproc x nnodes = {nproc * nnodes} ranks: at most {MAX_RANKS}.")
    for name, value in (("timeout", timeout), ("collective_timeout", collective)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise LaunchConfigError(f"{name}={value!r}: give a positive number of seconds.")
    if output not in OUTPUT_MODES:
        raise LaunchConfigError(f"output={output!r}: use one of {', '.join(OUTPUT_MODES)}.")


def make_run_dir() -> Path:
    """A private run directory (mode 0700) with records/, errors/, logs/ and done/ inside."""
    run_dir = Path(tempfile.mkdtemp(prefix="ddp_kit-run-"))
    for sub in ("records", "errors", "logs", "done"):
        (run_dir / sub).mkdir()
    return run_dir


def log_roots(run_dir: Path, nnodes: int) -> list[Path]:
    """Where each node's torchrun agent writes its ranks' logs."""
    return [run_dir / "logs" / f"node{node}" for node in range(nnodes)]


def loopback_interface() -> str:
    """The name of the loopback network interface ("lo" on Linux, "lo0" on macOS)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_env(
    run_dir: Path, backend: str, collective_timeout: float, extra: Mapping[str, str] | None
) -> dict[str, str]:
    """The environment of every agent and rank: loopback gloo, and where to write results."""
    package_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")])),
        GLOO_SOCKET_IFNAME=loopback_interface(),
        DDP_KIT_BACKEND=backend,
        DDP_KIT_COLLECTIVE_TIMEOUT=str(collective_timeout),
        DDP_KIT_RECORD_DIR=str(run_dir / "records"),
        DDP_KIT_ERROR_DIR=str(run_dir / "errors"),
        DDP_KIT_DONE_DIR=str(run_dir / "done"),
    )
    env.update(extra or {})
    return env


def torchrun_commands(
    script: Path, nproc: int, nnodes: int, log_dir: Path, args: Sequence[str] = ()
) -> list[list[str]]:
    """One torchrun command per node, all bound to 127.0.0.1."""
    if nnodes == 1:  # c10d rendezvous on port 0: torchrun picks a free port itself
        rendezvous = [["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0"]]
    else:  # static rendezvous, as on a cluster: node 0 hosts the store on a fixed port
        port = free_port()
        rendezvous = [
            [
                f"--nnodes={nnodes}",
                f"--node-rank={node}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
            ]
            for node in range(nnodes)
        ]
    agent = [sys.executable, "-m", "ddp_kit.rank.agent", f"--nproc-per-node={nproc}"]
    return [
        [*agent, *rdzv, "--local-addr=127.0.0.1", "--redirects=3",
         f"--log-dir={log_dir / f'node{node}'}", "-m", "ddp_kit.rank.runner", str(script),
         *map(str, args)]
        for node, rdzv in enumerate(rendezvous)
    ]  # fmt: skip


@dataclass
class Agents:
    """The running torchrun agents of one job (one per node), and their own log lines."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[list[str]] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, commands: list[list[str]], env: dict[str, str], nproc: int) -> Agents:
        """Start one agent per command (node), each in its own session: the kernel's ^C
        reaches the kernel alone, which then stops the agents itself."""
        agents = cls()
        for node, command in enumerate(commands):
            proc = subprocess.Popen(
                command,
                env=dict(env, DDP_KIT_DEVICE_OFFSET=str(node * nproc)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log: list[str] = []
            reader = threading.Thread(target=_drain, args=(proc, log), daemon=True)
            reader.start()
            agents.procs.append(proc)
            agents.logs.append(log)
            agents.readers.append(reader)
        return agents

    def running(self) -> bool:
        """Whether any agent is still running."""
        return any(proc.poll() is None for proc in self.procs)

    def stop(self) -> None:
        """Stop every agent still running, with its ranks; wait for all of them."""
        for proc in self.procs:
            if proc.poll() is None:
                stop_tree(proc.pid)
            proc.wait()
        for reader in self.readers:
            reader.join(timeout=5)

    @property
    def returncode(self) -> int:
        """The first non-zero exit code of an agent, else 0."""
        return next((p.returncode for p in self.procs if p.returncode), 0)

    @property
    def log(self) -> str:
        """Everything the agents themselves printed."""
        return "".join("".join(log) for log in self.logs)


@dataclass(frozen=True)
class AgentsOutcome:
    """How a launch's agents ended."""

    returncode: int
    agent_log: str
    timed_out: bool
    interrupted: bool


def _wait(
    agents: Agents, shown: RankOutput, timeout: float, progress: LaunchProgress
) -> AgentsOutcome:
    """Show output and progress until the agents end; stop everything on timeout or
    interrupt."""
    timed_out = interrupted = False
    deadline = time.monotonic() + timeout
    try:
        while agents.running():
            shown.poll()
            progress.update()
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        agents.stop()
    return AgentsOutcome(agents.returncode, agents.log, timed_out, interrupted)


def _drain(agent: subprocess.Popen, sink: list[str]) -> None:
    """Collect an agent's own log (its stdout and stderr) so its pipe never fills up."""
    assert agent.stdout is not None
    for line in iter(agent.stdout.readline, b""):
        sink.append(line.decode(errors="replace"))
