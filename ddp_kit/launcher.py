"""launch(): write the worker script, run it under torchrun on loopback, collect the result."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from . import diagnose
from .backend import choose_backend
from .errors import LaunchConfigError, LaunchTimeout, WorkerError
from .output import OUTPUT_MODES, RankOutput
from .processes import stop_tree
from .records import Records
from .result import RunResult
from .script import Worker, write_script

MAX_RANKS = 64
MAX_NODES = 8
POLL_SECONDS = 0.1


def launch(
    worker: Worker,
    nproc: int = 2,
    *,
    nnodes: int = 1,
    backend: str = "auto",
    timeout: float = 300.0,
    collective_timeout: float = 60.0,
    output: str = "ordered",
    env: Mapping[str, str] | None = None,
    keep_run_dir: bool = False,
    check: bool = True,
) -> RunResult:
    """Run `worker` (code text, a .py path or a function) on `nproc` ranks with torchrun.

    nnodes > 1 starts that many torchrun agents on this machine, as if each were a node of a
    cluster, all on 127.0.0.1. A failure raises WorkerError naming the rank (unless
    check=False); `timeout` bounds the whole run, `collective_timeout` each collective.
    """
    _validate(nproc, nnodes, timeout, collective_timeout, output)
    choice = choose_backend(nproc * nnodes, backend)
    if choice.fallback:
        print(f"[ddp_kit] {choice.reason}", file=sys.stderr)
    run_dir = Path(tempfile.mkdtemp(prefix="ddp_kit-run-"))  # mode 0700: private to this user
    try:
        script = write_script(run_dir, worker)
        for sub in ("records", "errors", "logs"):
            (run_dir / sub).mkdir()
        worker_env = _worker_env(run_dir, choice.backend, collective_timeout, env)
        commands = _torchrun_commands(script, nproc, nnodes, run_dir / "logs")
        log_roots = [run_dir / "logs" / f"node{n}" for n in range(nnodes)]
        shown = RankOutput(log_roots, nproc, output)
        start = time.perf_counter()
        returncode, agent_log, timed_out, interrupted = _run_agents(
            commands, worker_env, shown, timeout, nproc
        )
        duration = time.perf_counter() - start
        shown.finish()
        world = nproc * nnodes
        result = RunResult(
            nproc=nproc,
            nnodes=nnodes,
            backend=choice.backend,
            device=choice.device,
            returncode=returncode,
            duration=duration,
            stdout=[shown.text(r, "stdout") for r in range(world)],
            stderr=[shown.text(r, "stderr") for r in range(world)],
            records=Records.load(run_dir / "records", world),
            failures=diagnose.read_failures(run_dir / "errors"),
            timed_out=timed_out,
            interrupted=interrupted,
            script=script.read_text(),
            agent_log=agent_log,
            commands=commands,
            run_dir=run_dir if keep_run_dir else None,
        )
    finally:
        if not keep_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    if interrupted:
        raise KeyboardInterrupt(diagnose.explain(result, timeout))
    if check and not result.ok:
        error = LaunchTimeout if timed_out else WorkerError
        raise error(diagnose.explain(result, timeout), result)
    return result


def _validate(nproc: int, nnodes: int, timeout: float, collective: float, output: str) -> None:
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


def _worker_env(
    run_dir: Path, backend: str, collective_timeout: float, extra: Mapping[str, str] | None
) -> dict[str, str]:
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
    )
    env.update(extra or {})
    return env


def _torchrun_commands(script: Path, nproc: int, nnodes: int, log_dir: Path) -> list[list[str]]:
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
    agent = [sys.executable, "-m", "ddp_kit.agent", f"--nproc-per-node={nproc}"]
    return [
        [*agent, *rdzv, "--local-addr=127.0.0.1", "--redirects=3",
         f"--log-dir={log_dir / f'node{node}'}", "-m", "ddp_kit.runner", str(script)]
        for node, rdzv in enumerate(rendezvous)
    ]  # fmt: skip


def _run_agents(
    commands: list[list[str]], env: dict[str, str], shown: RankOutput, timeout: float, nproc: int
) -> tuple[int, str, bool, bool]:
    """Start the torchrun agents, show output until they end; stop everything on timeout."""
    agents, logs, readers = [], [], []
    timed_out = interrupted = False
    try:
        for node, command in enumerate(commands):
            node_env = dict(env, DDP_KIT_DEVICE_OFFSET=str(node * nproc))
            agent = subprocess.Popen(
                command,
                env=node_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log: list[str] = []
            reader = threading.Thread(target=_drain, args=(agent, log), daemon=True)
            reader.start()
            agents.append(agent)
            logs.append(log)
            readers.append(reader)
        deadline = time.monotonic() + timeout
        while any(a.poll() is None for a in agents):
            shown.poll()
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for agent in agents:
            if agent.poll() is None:  # timed out or interrupted: stop it and its workers
                stop_tree(agent.pid)
            agent.wait()
        for reader in readers:
            reader.join(timeout=5)
    codes = [a.returncode for a in agents]
    returncode = next((c for c in codes if c != 0), 0)
    agent_log = "".join("".join(log) for log in logs)
    return returncode, agent_log, timed_out, interrupted


def _drain(agent: subprocess.Popen, sink: list[str]) -> None:
    """Collect an agent's own log (its stdout and stderr) so its pipe never fills up."""
    assert agent.stdout is not None
    for line in iter(agent.stdout.readline, b""):
        sink.append(line.decode(errors="replace"))
