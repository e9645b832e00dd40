"""The seam between the two process worlds: everything that crosses from the kernel to the ranks
and back, named once. (Vocabulary: ddp_kit's package docstring, "Definitions".)

Environment variables, set by the kernel for every agent and rank
------------------------------------------------------------------
DDP_KIT_BACKEND             the run's backend choice, "gloo" or "nccl" (worker.backend() turns
                            it into init_process_group's string)
DDP_KIT_DEVICE              the run's device kind, "cpu" or "cuda" (worker.device() reads it; unset:
                            cuda under nccl, else cpu)
DDP_KIT_COLLECTIVE_TIMEOUT  seconds a collective waits for the other ranks before it raises
                            (the runner makes it init_process_group's default timeout)
DDP_KIT_DEVICE_OFFSET       the index of this node's first GPU (agents on one machine share it)
DDP_KIT_NODE                the index of this rank's host in a launch over several hosts
                            (kernel.hosts), or of its node among nnodes > 1 on this machine:
                            the runner writes it in its started marker; lose_this_node() finds
                            the node's processes by it
DDP_KIT_RECORD_DIR          where record() saves this run's records     (run directory/records)
DDP_KIT_ERROR_DIR           where a rank that raised writes its report  (run directory/errors)
DDP_KIT_MARKER_DIR          where the runner leaves a rank's markers    (run directory/markers)
DDP_KIT_SESSION_ADDRESS     host:port a live rank connects back to (sessions only); on a host
                            reached over ssh, the path of the Unix socket that ssh forwards
                            to the kernel's 127.0.0.1:port (kernel.hosts.session_forward)
DDP_KIT_SESSION_KEY_FILE    the file holding the session's key (sessions only)
DDP_KIT_FORK_SERVER         the fork server's socket, for the relays (fast start only)

Switches, set by a user or a test run, and read where they act
--------------------------------------------------------------
DDP_KIT_PROGRESS=0          no status line while a launch starts (kernel)
DDP_KIT_NOTES_FILE=PATH     notes go to this file instead of under the cell (kernel)
DDP_KIT_NO_PDEATHSIG=1      no Linux parent-death signal: the portable watchdog alone (ranks)
DDP_KIT_SHARED_GPU=1        with fewer GPUs than ranks (at least one), "auto" runs gloo on the GPUs,
                            shared: rank i on cuda:(i mod GPUs) (kernel.backend; ./kit gpu-check)
DDP_KIT_HOSTS=a,b           the hosts a lesson over several machines runs on (notebook 28;
                            kernel.hosts.lesson_machines); unset: nodes on this machine
DDP_KIT_LAUNCHER=ssh|slurm  how that lesson reaches them (default ssh) (kernel)
DDP_KIT_FAST_START=0        no fork server: every agent and rank starts as a fresh Python and
                            imports torch itself, as before the fast start (kernel)

The run directory: one per launch or session, private (mode 0700)
-----------------------------------------------------------------
$TMPDIR/ddp_kit-run-XXXXXXXX/ (RUN_DIR_PREFIX), removed by the kernel when its run ends, and by
the next run of any kernel if its kernel was killed (its owner file names a process that is gone)
owner            "PID START": the kernel that made it, and that process's start time
script.py        the code torchrun runs on every rank (unless launch() was given a .py file)
session.key      a session's key (mode 0600)
logs/node<N>/    torchrun's --log-dir of node N: <id>/attempt_<k>/<local rank>/{stdout,stderr}.log
records/         rank<R>.json and rank<R>.npz: what rank R recorded (shared.records)
errors/          rank<R>.json: rank R's uncaught exception, a RankFailure (shared.failures);
                 fault-rank<R>.txt: where R was if a fatal signal killed it (faulthandler);
                 attempt<K>/: both, of attempt K, moved there by rank R when torchrun
                 restarted it (--max-restarts; R's attempt: TORCHELASTIC_RESTART_COUNT)
markers/         started-rank<R>: R is bootstrapped and starts the script (it holds R's
                 DDP_KIT_NODE, if any: which host's agent started R);
                 completed-rank<R>: R's script returned and its records are saved (in the
                 last attempt: a restarted rank removes its own)

Messages of a live session: a multiprocessing connection on 127.0.0.1, authenticated both ways
with the session's key before anything is read
--------------------------------------------------------------------------------------------
kernel -> rank          rank -> kernel
                        Hello(rank, pid)               once, on connecting
RunCell(name, code,     Output(stream, text) ...       while the cell runs, as it prints
        profile)        (profile: None, or a record name: the rank records a torch.profiler
                        trace of the cell under it, ddp_kit.profiling)
                        Busy(cell, where, stack, seconds) ...
                                                       every second once the cell has run 2 s:
                                                       where it is (rank.where)
                        CellDone(failure)              failure: a RankFailure's fields, or None
                                                       (also sent unasked, for the running or
                                                       next cell, by a stalled wait: rank.waits)
Pull(name)              Value(value)                   tensors as numpy arrays
                        PullFailed(failure)            no such variable, or it cannot be sent
Flush()                 Flushed()                      the rank's records are on disk
FreeGroups()            CellDone(failure)              every process group destroyed and freed
                                                       (after a collective timed out)
Exit()                  (the connection closes)        the rank leaves its process group, ends
Both ends send each message at once (TCP_NODELAY, `send_at_once`).

A wait that the rank ended itself (rank.waits) is a RankFailure of type STALLED_WAIT; the kernel
then replaces the ranks.
"""

from __future__ import annotations

import os
import socket
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

BACKEND = "DDP_KIT_BACKEND"
DEVICE = "DDP_KIT_DEVICE"
COLLECTIVE_TIMEOUT = "DDP_KIT_COLLECTIVE_TIMEOUT"
DEVICE_OFFSET = "DDP_KIT_DEVICE_OFFSET"
NODE = "DDP_KIT_NODE"
RECORD_DIR = "DDP_KIT_RECORD_DIR"
ERROR_DIR = "DDP_KIT_ERROR_DIR"
MARKER_DIR = "DDP_KIT_MARKER_DIR"
SESSION_ADDRESS = "DDP_KIT_SESSION_ADDRESS"
SESSION_KEY_FILE = "DDP_KIT_SESSION_KEY_FILE"
FORK_SERVER = "DDP_KIT_FORK_SERVER"

PROGRESS = "DDP_KIT_PROGRESS"
NOTES_FILE = "DDP_KIT_NOTES_FILE"
NO_PDEATHSIG = "DDP_KIT_NO_PDEATHSIG"
FAST_START = "DDP_KIT_FAST_START"
SHARED_GPU = "DDP_KIT_SHARED_GPU"
LESSON_HOSTS = "DDP_KIT_HOSTS"
LESSON_LAUNCHER = "DDP_KIT_LAUNCHER"

STALLED_WAIT = "StalledWait"

RUN_DIR_PREFIX = "ddp_kit-run-"
OWNER_FILE = "owner"
SCRIPT_FILE = "script.py"
KEY_FILE = "session.key"
LOGS, RECORDS, ERRORS, MARKERS = "logs", "records", "errors", "markers"
STARTED, COMPLETED = "started-rank", "completed-rank"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # torchrun's: the attempt a rank belongs to (0 first)


def earlier_attempt(error_dir: str | os.PathLike, attempt: int) -> str:
    """errors/attempt<K>: where each rank's reports of attempt K go once it is restarted."""
    return os.path.join(error_dir, f"attempt{attempt}")


def written_by_kit(script: str | os.PathLike) -> bool:
    """Whether a rank's `script` is its run directory's script file, which the kernel wrote
    from code text, a function or the live-rank server (rather than a .py file of the user's).
    The run directory is the one this rank records into."""
    record_dir = os.environ.get(RECORD_DIR)
    if record_dir is None:
        return False
    run_dir = os.path.dirname(os.path.abspath(record_dir))
    return os.path.abspath(script) == os.path.join(run_dir, SCRIPT_FILE)


# kernel -> rank
class RunCell(NamedTuple):
    name: str
    code: str
    profile: str | None = None


class Pull(NamedTuple):
    name: str


class Flush(NamedTuple):
    pass


class FreeGroups(NamedTuple):
    pass


class Exit(NamedTuple):
    pass


# rank -> kernel
class Hello(NamedTuple):
    rank: int
    pid: int


class Output(NamedTuple):
    stream: str  # "stdout" or "stderr"
    text: str


BUSY_AFTER = 2.0  # seconds a cell runs before its rank first says where it is (Busy)


class Busy(NamedTuple):
    cell: str  # the running cell's name
    where: str  # "cell line 3: dist.all_reduce(x) (in torch.distributed: all_reduce)"
    stack: str  # the cell's frames, innermost last, and the torch function they are in
    seconds: float  # how long the cell has run


class CellDone(NamedTuple):
    failure: dict[str, Any] | None


class Value(NamedTuple):
    value: Any


class PullFailed(NamedTuple):
    failure: dict[str, Any]


class Flushed(NamedTuple):
    pass


def send_at_once(connection: Connection) -> Connection:
    """Turn Nagle's algorithm off on a session connection, so each message leaves at once.

    With it on, a cell that prints sends Output then CellDone: the second small write waits for
    the first one's ACK, which the other end delays (Linux: up to 40 ms). Cells run back to back
    (Run All, nbval) then took 44 ms each instead of 2-3 ms.
    """
    with socket.socket(fileno=os.dup(connection.fileno())) as sock:  # the same socket
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection
