"""The torchrun plumbing that launches and sessions share: argument checks, the run directory,
loopback addresses, the ranks' environment, the torchrun commands, and the running agents.

The process chain (each link dies with the one above it: PDEATHSIG plus a watchdog):

    notebook kernel ── launch() / Session
      └─ agent, one per node: `python -m ddp_kit.rank.agent` = torchrun (c10d rendezvous, 127.0.0.1)
           └─ rank, one per process: `python -m ddp_kit.rank.runner SCRIPT` (bootstrap, then SCRIPT)

In a fast start (kernel.fast_start) each of these commands is started as a relay, `python -m
ddp_kit.rank.relay ddp_kit.rank.agent ...`, and the process behind it is forked by the
kernel's fork server (over hosts, by each host's: kernel.hosts); Agents holds the agents'
relays (over hosts, their ssh or srun).

The run directory's layout and the ranks' DDP_KIT_* variables are shared.contract's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
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

from ..shared import contract, failures
from ..shared.errors import LaunchConfigError
from ..shared.processes import stop_tree
from . import fast_start
from .output import validate_output
from .result import Attempt

MAX_RANKS = 64
MAX_NODES = 8
MAX_RESTARTS = 100
POLL_SECONDS = 0.05
# one node: a c10d rendezvous on port 0 (torchrun picks a free port itself), all on loopback
LOOPBACK_RENDEZVOUS = ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
                       "--local-addr=127.0.0.1"]  # fmt: skip


# A run with restarts (max_restarts > 0): rank 0 hosts a new store for init_process_group at
# every attempt. By default (torch 2.13) torchrun's c10d rendezvous hands the ranks of every
# attempt the same store, and the keys that init_process_group writes there are the same each
# attempt: a restarted rank can read the gloo address of a rank of the attempt before, and fail
# with "Gloo connectFullMesh failed with ... timed out connecting: SO_ERROR: Connection refused"
# or wait in init_process_group. Through the kit, 6 of 10 runs whose rank 1 raised at step 2
# (2 restarts allowed) needed a second restart or failed; with this setting, 10 of 10 resumed
# at the first restart (docs/upstream.md, section 6).
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

# debug= -> TORCH_DISTRIBUTED_DEBUG: "detail" checks before each collective that every rank calls
# the same one with the same shapes, and names both when they differ (torch's ProcessGroupWrapper).
DEBUG_LEVELS = {"off": "OFF", "info": "INFO", "detail": "DETAIL"}


def validate(
    nproc: int, nnodes: int, timeout: float, collective: float, output: str, debug: str = "off"
) -> None:
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
    validate_output(output)
    if debug not in DEBUG_LEVELS:
        raise LaunchConfigError(f"debug={debug!r}: use one of {', '.join(DEBUG_LEVELS)}.")


def validate_restarts(
    max_restarts: int, monitor_interval: float | None, timeout: float, nnodes: int
) -> None:
    """Refuse bad restart settings (torchrun's --max-restarts, --monitor-interval) early."""
    if (not isinstance(max_restarts, int) or isinstance(max_restarts, bool)
            or not 0 <= max_restarts <= MAX_RESTARTS):  # fmt: skip
        raise LaunchConfigError(
            f"max_restarts={max_restarts!r}: use a whole number from 0 to {MAX_RESTARTS}: how "
            "many times torchrun may restart every rank after one fails (0: the first failure "
            "ends the job)."
        )
    if max_restarts and nnodes > 1:
        raise LaunchConfigError(
            f"max_restarts={max_restarts} with nnodes={nnodes}: not supported. Several agents "
            "use torchrun's static rendezvous, whose ranks share one store across attempts: a "
            "restarted rank could read the addresses of the attempt before (docs/upstream.md, "
            "section 6). Use nnodes=1 (nproc ranks on one agent)."
        )
    if monitor_interval is None:
        return
    if (not isinstance(monitor_interval, (int, float)) or isinstance(monitor_interval, bool)
            or not 0 < monitor_interval < timeout):  # fmt: skip
        raise LaunchConfigError(
            f"monitor_interval={monitor_interval!r}: give the seconds between torchrun's checks "
            f"of its ranks, more than 0 and less than timeout ({timeout:g} s); torchrun's "
            "default is 0.1."
        )


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


_cores_said: set[tuple[int, int]] = set()


def cores_note(ranks: int) -> str | None:
    """A note, once per kernel for each number of ranks, when there are more ranks than CPU
    cores: it works, but the ranks take turns on the cores."""
    cores = available_cores()
    if ranks <= cores or (ranks, cores) in _cores_said:
        return None
    _cores_said.add((ranks, cores))
    return (f"{ranks} ranks on {cores} CPU cores: the ranks take turns on the cores, so the "
            f"start and each step take up to {ranks / cores:.2g}x as long as with a core per "
            "rank, and timings measure that sharing more than DDP.")  # fmt: skip


ARGS_HELP = (
    'give a list of strings, e.g. args=["5", "2"], or one string split as a shell would, '
    'e.g. args="5 2"'
)


def validate_args(args: object) -> list[str]:
    """A script's arguments as its sys.argv[1:]: a string is split into words as a shell
    would (shlex); a list or tuple of strings (or numbers, or paths) is taken word by word."""
    if isinstance(args, str):
        try:
            return shlex.split(args)
        except ValueError as error:  # an unclosed quote
            raise LaunchConfigError(f"args={args!r}: {error}; {ARGS_HELP}.") from None
    words = (str, int, float, os.PathLike)
    if isinstance(args, (list, tuple)) and all(
        isinstance(a, words) and not isinstance(a, bool) for a in args
    ):
        return [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    raise LaunchConfigError(f"args={args!r}: {ARGS_HELP}.")


def make_run_dir() -> Path:
    """A private run directory (mode 0700) laid out as shared.contract says, with its owner
    (this kernel) recorded in it; the run directories of kernels that are gone (killed: a
    kernel that ends removes its own) are removed first."""
    remove_stale_run_dirs()
    run_dir = Path(tempfile.mkdtemp(prefix=contract.RUN_DIR_PREFIX))
    (run_dir / contract.OWNER_FILE).write_text(owner_text(os.getpid()))
    for sub in (contract.LOGS, contract.RECORDS, contract.ERRORS, contract.MARKERS):
        (run_dir / sub).mkdir()
    return run_dir


def owner_text(pid: int) -> str:
    """ "PID START MACHINE": a process, its start time (a pid can be reused by a later process)
    and the machine it runs on (a temporary folder may be shared with other machines: a launch
    over several hosts asks for one)."""
    import psutil

    return f"{pid} {psutil.Process(pid).create_time():.3f} {this_machine()}\n"


def this_machine() -> str:
    """This machine, as long as it runs: Linux's boot id, else the host name (never resolved)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def owner_alive(text: str) -> bool:
    """Whether the process that an owner file names is still running (not a later process
    with the same pid). Unreadable, or on another machine: taken as alive, and left alone."""
    import psutil

    try:
        pid, started, *machine = text.split()
        if machine and machine != [this_machine()]:
            return True
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 1.0
    except psutil.NoSuchProcess:
        return False
    except (ValueError, psutil.Error):
        return True


def remove_stale_run_dirs(folder: Path | None = None) -> list[Path]:
    """Remove the run directories in `folder` (default: the temporary folder) that this kit
    made (a name with its prefix, an owner file in it), that this user owns, and whose owner
    kernel is gone (killed, so it could not remove them: a session's key is among what they
    hold). Returns those removed."""
    removed = []
    for run_dir in Path(folder or tempfile.gettempdir()).glob(f"{contract.RUN_DIR_PREFIX}*"):
        try:
            if run_dir.is_symlink() or run_dir.stat().st_uid != os.getuid():
                continue
            text = (run_dir / contract.OWNER_FILE).read_text()
        except OSError:  # not a directory of ours, or removed meanwhile
            continue
        if not owner_alive(text):
            shutil.rmtree(run_dir, ignore_errors=True)
            removed.append(run_dir)
    return removed


def log_roots(run_dir: Path, nnodes: int) -> list[Path]:
    """Where each node's torchrun agent writes its ranks' logs."""
    return [run_dir / contract.LOGS / f"node{node}" for node in range(nnodes)]


def read_attempts(
    run_dir: Path,
    nnodes: int,
    nproc: int,
    last_failures: list[failures.RankFailure],
    groups: dict[int, int] | None = None,
) -> list[Attempt]:
    """The attempts of a launch's job (one, unless torchrun restarted its ranks): each with
    what its ranks reported (errors/attempt<K>/, or `last_failures` for the last) and the
    error files that torch's @record wrote (logs/node<N>/<id>/attempt_<K>/<local>/error.json,
    torchrun's TORCHELASTIC_ERROR_FILE). groups: node -> torchrun's node rank, where they
    differ (a launch over several hosts)."""
    roots = log_roots(run_dir, nnodes)
    count = 1 + max((int(path.name.removeprefix("attempt_")) for root in roots
                     for path in root.glob("*/attempt_*")), default=0)  # fmt: skip
    attempts = []
    for number in range(count):
        earlier = Path(contract.earlier_attempt(run_dir / contract.ERRORS, number))
        reported = last_failures if number == count - 1 else failures.read_reports(earlier)
        files = {}
        for node, root in enumerate(roots):
            for path in root.glob(f"*/attempt_{number}/*/error.json"):
                with contextlib.suppress(OSError, ValueError):
                    group = (groups or {}).get(node, node)
                    files[group * nproc + int(path.parent.name)] = json.loads(path.read_text())
        attempts.append(Attempt(number, reported, dict(sorted(files.items()))))
    return attempts


STOP_SECONDS = 10  # how long the hosts' agents get to stop their ranks once ssh's stdin ends
# Once one node's agent has failed, the others' ranks have this long to end on their own (a
# collective with the lost ranks raises at once) before the kit stops them: torchrun would keep
# a finished node's agent in its exit barrier, waiting 300 s for the failed one.
NODE_FAILED_GRACE = 5.0


def loopback_interface() -> str:
    """The name of the loopback network interface ("lo" on Linux, "lo0" on macOS)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def bare_torchrun(script: Path | str, nproc: int, args: Sequence[str] = ()) -> list[str]:
    """Plain torchrun, no kit inside, as a student types it on one machine (loopback only):
    the baseline that the benchmark, the tests and the lessons compare the kit with."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            *LOOPBACK_RENDEZVOUS, str(script), *map(str, args)]  # fmt: skip


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ranks_pythonpath() -> str:
    """The ranks' PYTHONPATH: the folder that holds ddp_kit first, then the kernel's."""
    package_parent = str(Path(__file__).resolve().parent.parent.parent)
    return os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))


def rank_env(
    run_dir: Path,
    backend: str,
    collective_timeout: float,
    extra: Mapping[str, str] | None,
    debug: str = "off",
    device: str | None = None,
) -> dict[str, str]:
    """The environment of every agent and rank: loopback gloo, the backend and device kind
    (None: the backend's own, cuda for nccl, cpu for gloo), where to write results, and
    torch's distributed debug level (unless `extra` sets TORCH_DISTRIBUTED_DEBUG itself)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=ranks_pythonpath(),
        GLOO_SOCKET_IFNAME=loopback_interface(),
    )
    env.update({
        contract.BACKEND: backend,
        contract.DEVICE: device or ("cuda" if backend == "nccl" else "cpu"),
        contract.COLLECTIVE_TIMEOUT: str(collective_timeout),
        contract.RECORD_DIR: str(run_dir / contract.RECORDS),
        contract.ERROR_DIR: str(run_dir / contract.ERRORS),
        contract.MARKER_DIR: str(run_dir / contract.MARKERS),
    })  # fmt: skip
    if debug != "off":
        env["TORCH_DISTRIBUTED_DEBUG"] = DEBUG_LEVELS[debug]
    env.update(extra or {})
    return env


def torchrun_commands(
    script: Path,
    nproc: int,
    nnodes: int,
    log_dir: Path,
    args: Sequence[str] = (),
    *,
    max_restarts: int = 0,
    monitor_interval: float | None = None,
) -> list[list[str]]:
    """One torchrun command per node, all bound to 127.0.0.1; with torchrun's restarts
    (--max-restarts) and its interval between checks of the ranks (--monitor-interval) when
    they are asked for."""
    if nnodes == 1:
        rendezvous = [LOOPBACK_RENDEZVOUS[:2]]
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
    agent = agent_argv(sys.executable, nproc, max_restarts, monitor_interval)
    return [
        [*agent, *rdzv, "--local-addr=127.0.0.1", "--redirects=3",
         f"--log-dir={log_dir / f'node{node}'}", *runner_argv(script, args)]
        for node, rdzv in enumerate(rendezvous)
    ]  # fmt: skip


def agent_argv(
    python: str, nproc: int, max_restarts: int = 0, monitor_interval: float | None = None
) -> list[str]:
    """A node's torchrun agent (`ddp_kit.rank.agent`), before its rendezvous and logs."""
    agent = [python, "-m", "ddp_kit.rank.agent", f"--nproc-per-node={nproc}"]
    if max_restarts:
        agent.append(f"--max-restarts={max_restarts}")
    if monitor_interval is not None:
        agent.append(f"--monitor-interval={monitor_interval:g}")
    return agent


def runner_argv(script: Path, args: Sequence[str] = ()) -> list[str]:
    """What the agent runs on each rank: the kit's runner, then the script and its arguments."""
    return ["-m", "ddp_kit.rank.runner", str(script), *map(str, args)]


@dataclass
class Agents:
    """The running torchrun agents of one job (one per node), and their own log lines."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[list[str]] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)
    stopped: set[int] = field(default_factory=set)  # the nodes still running when stop() began

    @classmethod
    def start(
        cls, commands: list[list[str]], env: dict[str, str], nproc: int, *, remote: bool = False
    ) -> Agents:
        """Start one agent per command (node), each in its own session: the kernel's ^C
        reaches the kernel alone, which then stops the agents itself. A fast start
        (kernel.fast_start) starts relays of the same commands. remote: the commands are ssh
        connections to hosts (kernel.hosts), each given a stdin that stays open while it runs
        (its end stops the host's agent)."""
        agents = cls()
        if not remote:
            commands, env = fast_start.relayed(commands, env)
        for node, command in enumerate(commands):
            offset = {} if remote else {contract.DEVICE_OFFSET: str(node * nproc)}
            if len(commands) > 1 and not remote:  # a host's command sets it on the host
                offset[contract.NODE] = str(node)
            proc = subprocess.Popen(
                command,
                env={**env, **offset},
                stdin=subprocess.PIPE if remote else subprocess.DEVNULL,
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

    def first_failure(self) -> tuple[int, float] | None:
        """(node, now) if a node's agent has ended with an error while another still runs."""
        if len(self.procs) < 2 or not self.running():
            return None
        failed = [node for node, proc in enumerate(self.procs) if proc.poll()]
        return (failed[0], time.monotonic()) if failed else None


    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for every agent to end; whether they all did."""
        deadline = time.monotonic() + seconds
        while self.running() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        return not self.running()

    def stop(self) -> None:
        """Stop every agent still running, with its ranks; wait for all of them."""
        self.stopped = {node for node, proc in enumerate(self.procs) if proc.poll() is None}
        for proc in self.procs:
            if proc.stdin is not None:  # a host's: its end stops the host's agent and ranks
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        deadline = time.monotonic() + STOP_SECONDS
        for proc in self.procs:
            if proc.stdin is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
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


def _drain(agent: subprocess.Popen, sink: list[str]) -> None:
    """Collect an agent's own log (its stdout and stderr) so its pipe never fills up."""
    assert agent.stdout is not None
    for line in iter(agent.stdout.readline, b""):
        sink.append(line.decode(errors="replace"))
