"""Turn a failed run or cell into a message a student can act on."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..shared import contract
from ..shared.failures import HANG_SIGNS, PROCESS_ENDED, RankFailure, earliest, fault_file
from .output import span
from .result import RunResult

# Every failure sign that the stress run and the benchmark count launches by.
FAILURE_SIGNS = (*HANG_SIGNS, "terminate called", "connectFullMesh", "SIGABRT", "Segmentation",
                 "SIGSEGV")  # fmt: skip

# Raised by init_process_group when gloo cannot connect every pair of ranks ("Gloo
# connectFullMesh failed with ... Connection closed by peer"): rare, never twice in a row
# (docs/reliability.md, "Gloo fails to connect the ranks").
CONNECT_SIGN = "connectFullMesh"

# A rank's TCPStore client that found nobody at the rendezvous address (c10d's message).
STORE_SIGN = re.compile(r"while trying to connect to \(([^,]+), (\d+)\)")
# gloo, when GLOO_SOCKET_IFNAME names no interface with an address on the rank's host
# (gloo/transport/tcp/device.cc; the same words for a host name it cannot resolve, rarer)
INTERFACE_SIGN = re.compile(r"Unable to find address for: (\S+)")

# An entry of torchrun's failure summary ("Failures:" / "Root Cause (first observed failure):"):
#   time      : 2026-12-07_03:45:07
#   host      : localhost
#   rank      : 1 (local_rank: 1)
#   exitcode  : -11 (pid: 18670)  (SIGSEGV)
SUMMARY_ENTRY = re.compile(
    r"time\s*:\s*(\S+)\s*\n.*?rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n"
    r"\s*exitcode\s*:\s*(-?\d+)",
    re.DOTALL,
)
ROOT_CAUSE = "Root Cause"
# What torchrun's agent logs (torch.distributed.elastic.multiprocessing.api) each time a rank of
# its node fails, before it restarts them (--max-restarts) or gives up: the first failure.
ATTEMPT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: \d+\)")
# Signals torchrun sends to stop the other ranks once one has failed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGKILL)
FAULT_FRAME = re.compile(r'\s*File "(.+)", line (\d+) in (.+)')

SOURCE_TAG = re.compile(r"\[(?:\.\.)?/\S+:\d+\] ")  # gloo's "[/path/to/file.cc:78] " prefix

# torch 2.13 (CPU build, seen on gloo): DistributedDataParallel(model) on a process group made
# under TORCH_DISTRIBUTED_DEBUG=DETAIL kills the rank with SIGSEGV, in
# c10d::Logger::set_env_variables (called by DDP's constructor); docs/upstream.md.
DETAIL_CRASH = (
    "Under `--debug detail` (TORCH_DISTRIBUTED_DEBUG=DETAIL) torch 2.13 crashes a rank that "
    "builds DistributedDataParallel on a gloo group made under it (SIGSEGV in "
    "c10d::Logger::set_env_variables, DDP's constructor). Use `--debug info` with DDP models "
    "(DDP then still names the parameters that got no gradient); keep detail for checking "
    "plain collectives."
)

HANG_HELP = (
    "A collective (all_reduce, barrier, DDP's gradient sync...) waited for ranks that never "
    "joined it. Usual causes: a collective inside `if rank == 0:`, ranks with different numbers "
    "of batches (a DistributedSampler gives every rank the same number; for uneven inputs, "
    "Join), a `break` that only some ranks take, or another rank that crashed. Every rank must "
    "call the same collectives in the same order. If the job is only slow, raise "
    "collective_timeout= (`--collective-timeout` on %%torchrun and %ranks start)."
)


@dataclass(frozen=True)
class Explanation:
    """What failed (summary), what to do (advice) and the failing rank's traceback."""

    summary: str
    advice: str = ""
    traceback: str = ""
    rank: int | None = None

    @property
    def message(self) -> str:
        """Everything, as one text: the error's str()."""
        parts = [self.summary, self.advice]
        if self.traceback:
            parts.append(f"Traceback of rank {self.rank}:\n{self.traceback}")
        return "\n\n".join(p for p in parts if p)

    def rendered(self, kind: str) -> list[str]:
        """What a notebook shows: the rank's traceback (cell line numbers) ends with its
        error, so the summary is not repeated above it, and no frame of the kit is shown."""
        if not self.traceback:
            return [f"{kind}: {self.message}"]
        head = f"{kind}: rank {self.rank} failed; its traceback (your code's line numbers):"
        lines = [head, "", self.traceback.rstrip("\n")]
        return lines + (["", self.advice] if self.advice else [])


def explain_failures(
    failures: Sequence[RankFailure], finished: Sequence[int] = (), work: str = "the cell"
) -> Explanation:
    """The earliest failure, with advice for hangs, and what the other ranks did.

    Another rank whose error is a lost or timed-out collective failed as a consequence (its
    peer was gone or never came); one with any other error failed too, on its own (every rank
    runs the same code, so an import error or a bug fails each of them). For a collective that
    timed out, the ranks in `finished` (they ended `work` without an error) are the ones that
    never joined it.
    """
    root = earliest(failures)  # every rank alike: rank 0's
    others = [f for f in sorted(failures, key=lambda f: f.rank) if f.rank != root.rank]
    absent = ""
    if is_hang(root) and finished:
        absent = f"{span(finished).capitalize()} finished {work} and never joined that collective."
    advice = [absent, rendezvous_help(root) or (HANG_HELP if is_hang(root) else ""),
              reinit_help(root), interface_help(root)]  # fmt: skip
    too = [f for f in others if not is_hang(f)]
    after = [f for f in others if is_hang(f)]
    if too:
        kinds = ", ".join(sorted({f.type for f in too}))
        advice.append(f"(Rank(s) {ranks_text(too)} failed too: {kinds}.)")
    if after:
        advice.append(f"(Rank(s) {ranks_text(after)} then failed in a collective, as a "
                      "consequence.)")  # fmt: skip
    if root.type == PROCESS_ENDED:  # no traceback: what it printed, and where, is advice
        advice.insert(0, root.traceback)
        return Explanation(root.message, "\n\n".join(a for a in advice if a), "", root.rank)
    return Explanation(
        f"Rank {root.rank} failed with {root.type}: {SOURCE_TAG.sub('', root.message)}",
        "\n\n".join(a for a in advice if a),
        root.traceback,
        root.rank,
    )


REINIT_SIGN = "trying to initialize the default process group twice"
REINIT_HELP = (
    "init_process_group was called while this rank's process group is still initialised (a "
    "cell or function run twice?). Call dist.destroy_process_group() first to make a new one, "
    "or init once: `if not dist.is_initialized(): dist.init_process_group(...)`."
)


def reinit_help(failure: RankFailure) -> str:
    """The fix for torch's error on a second init_process_group without a destroy."""
    return REINIT_HELP if REINIT_SIGN in failure.message else ""


def last_lines(rank: int, printed: str, count: int = 5) -> str:
    """The last `count` non-empty lines a rank printed, marked with its rank, or a word that
    it printed nothing."""
    last = [line for line in printed.splitlines() if line.strip()][-count:]
    if not last:
        return "It printed nothing."
    return "Its last lines:\n" + "\n".join(f"  [rank {rank}] {x}" for x in last)


def process_ends(
    agent_log: str,
    reported: Sequence[int],
    completed: Sequence[int],
    output: Mapping[int, str],
    error_dir: Path,
) -> list[RankFailure]:
    """A RankFailure (type PROCESS_ENDED) for each rank that torchrun's failure summary names
    and that neither reported a Python exception nor completed its script: it called
    os._exit, or died of a signal (a crash in C code, SIGKILL). Its message names the rank, the
    exit code or the signal, where it was (its faulthandler stack, for a fatal signal) and the
    last lines it printed (`output`: its stdout and stderr). A rank that torchrun itself
    stopped (SIGTERM, SIGKILL) once another had failed is left out."""
    ends = {}
    for section, entries in enumerate(agent_log.split(ROOT_CAUSE)):
        for when, rank, code in SUMMARY_ENTRY.findall(entries):
            if int(rank) not in reported and int(rank) not in completed:
                ends[int(rank)] = (int(code), when, section > 0)
    found = []
    for rank, (code, when, root) in sorted(ends.items()):
        stopped = -code in STOP_SIGNALS and (reported or len(ends) > 1) and not root
        if code == 0 or stopped:
            continue
        where = fault_frames(fault_text(error_dir, rank)) if code < 0 else ""
        details = [f"Where it was (Python's faulthandler, innermost last):\n{where}"] * bool(where)
        details.append(last_lines(rank, output.get(rank, "")))
        found.append(RankFailure(rank, PROCESS_ENDED, ended_text(rank, code),
                                 "\n\n".join(details), summary_time(when, root)))  # fmt: skip
    return found


def ended_text(rank: int, code: int) -> str:
    """How rank `rank`'s process ended, given its exit code as torchrun reports it."""
    if code >= 0:
        return (f"Rank {rank}'s process ended with exit code {code} without a Python exception "
                "(os._exit(), or C code that called exit()).")  # fmt: skip
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    cause = {"SIGSEGV": "a crash in C or C++ code (torch, numpy, ctypes...)",
             "SIGBUS": "a crash in C or C++ code", "SIGFPE": "a crash in C or C++ code",
             "SIGABRT": "C or C++ code that aborted (\"terminate called\", a failed check)",
             "SIGKILL": "killed from outside (out of memory, or `kill -9`)"}  # fmt: skip
    return (f"Rank {rank}'s process was killed by {name} (signal {-code}), without a Python "
            f"exception: {cause.get(name, 'a signal sent to it')}.")


def fault_text(error_dir: Path, rank: int) -> str:
    try:
        return fault_file(error_dir, rank).read_text(errors="replace")
    except OSError:
        return ""


def fault_frames(text: str) -> str:
    """The frames of a faulthandler dump that are not the kit's or runpy's, innermost last."""
    kit = str(Path(__file__).resolve().parent.parent)
    frames = [line.strip() for line in text.splitlines() if FAULT_FRAME.match(line)]
    shown = [f"  {f}" for f in frames if kit not in f and "<frozen runpy>" not in f]
    return "\n".join(reversed(shown))


def summary_time(when: str, root: bool) -> float:
    """torchrun's time of a failure (to the second), as a time.time() value; the root cause's
    comes first among failures seen in the same second."""
    try:
        seen = time.mktime(time.strptime(when, "%Y-%m-%d_%H:%M:%S"))
    except ValueError:
        seen = time.time()
    return seen - (0.5 if root else 0.0)


def ranks_text(failures: Sequence[RankFailure]) -> str:
    return ", ".join(str(f.rank) for f in failures)


def interface_help(failure: RankFailure) -> str:
    """Advice for a rank whose gloo could not use the interface GLOO_SOCKET_IFNAME names."""
    found = INTERFACE_SIGN.search(failure.message)
    if not found:
        return ""
    return (f"GLOO_SOCKET_IFNAME={found.group(1)} names no network interface with an address "
            f"on rank {failure.rank}'s host, so gloo could not start there. Leave it out of "
            "env= (the kit chooses each host's interface), or name one that host has (`ip -br "
            "addr` lists them).")  # fmt: skip


def rendezvous_help(failure: RankFailure) -> str | None:
    """Advice for a rank that could not reach the rendezvous store (not a collective hang)."""
    found = STORE_SIGN.search(failure.message)
    if not found:
        return None
    host, port = found.groups()
    return (
        f"The ranks could not reach the rendezvous store at {host}:{port}: nothing answered "
        "there before the timeout. This is the rendezvous, not a collective. Under torchrun "
        "(and ddp_kit) every rank connects to the store of torchrun's agent, at the "
        "MASTER_ADDR and MASTER_PORT torchrun sets. A script that sets them itself (the PyTorch "
        "DDP tutorial's os.environ['MASTER_PORT'] = '12355', written for mp.spawn) sends the "
        "ranks where nobody listens: delete those lines when you run under torchrun."
    )


def is_hang(failure: RankFailure) -> bool:
    """Whether this failure is a collective that timed out (its process group is unusable)."""
    return any(sign in failure.message for sign in HANG_SIGNS)


def hung(failures: Sequence[RankFailure]) -> bool:
    """Whether any rank's collective timed out."""
    return any(is_hang(f) for f in failures)


def stalled(failures: Sequence[RankFailure]) -> bool:
    """Whether a rank was stuck in a wait with no end of its own, which the rank then ended
    (rank.waits): its main thread is still inside torch's C++."""
    return any(f.type == contract.STALLED_WAIT for f in failures)


def failure_signs(text: str) -> str:
    """The known failure signs found in a run's output, as one line ("none" if none)."""
    return ", ".join(sorted({s for s in FAILURE_SIGNS if s in text})) or "none"


def detail_crash_note(debug: str, exit_text: str) -> str | None:
    """DETAIL_CRASH if the ranks ran under debug="detail" and one died of SIGSEGV."""
    return DETAIL_CRASH if debug == "detail" and "SIGSEGV" in exit_text else None


def explain(result: RunResult, timeout: float, debug: str = "off") -> Explanation:
    """What failed in a launch, where, and what to do."""
    if result.interrupted:
        return Explanation(
            f"The run was interrupted; all {result.world_size} worker processes were stopped."
        )
    if result.timed_out:
        return Explanation(
            f"The run passed its time limit of {timeout:g} s and was stopped; all "
            f"{result.world_size} worker processes were ended. If the job is just slow, raise "
            "timeout=. If it hangs: " + HANG_HELP + stderr_tails(result.stderr)
        )
    if not result.failures:
        return Explanation(
            f"torchrun exited with code {result.returncode}, but no rank reported a Python "
            "exception and torchrun's log names no rank that ended badly."
            + stderr_tails(result.stderr),
            detail_crash_note(debug, result.agent_log) or "",
        )
    failed = {f.rank for f in result.failures}
    finished = [r for r in result.completed if r not in failed]
    explanation = explain_failures(result.failures, finished, "the script")
    root = explanation.rank
    exit_lines = ""  # sys.exit's reason is printed, not raised (argparse's usage and error)
    if any(f.type == "SystemExit" and f.rank == root for f in result.failures):
        exit_lines = last_lines(root, result.stdout[root] + result.stderr[root])
    note = detail_crash_note(debug, result.agent_log)
    ended = torchrun_root_cause(result, root) if explanation.traceback else ""  # else: said
    where = host_line(result.hosts, root)
    if exit_lines or note or ended or where:
        advice = "\n\n".join(filter(None, [where, exit_lines, explanation.advice, note, ended]))
        return Explanation(explanation.summary, advice, explanation.traceback, root)
    return explanation


def host_line(hosts: list[str], rank: int | None) -> str:
    """Where the failed rank ran, in a launch over several hosts (else nothing)."""
    if not hosts or rank is None:
        return ""
    mates = [r for r, host in enumerate(hosts) if host == hosts[rank]]
    return f"Rank {rank} ran on host {hosts[rank]} (ranks {', '.join(map(str, mates))})."


def torchrun_root_cause(result: RunResult, rank: int | None) -> str:
    """torchrun's own word on the failed rank `rank` (its failure summary: the exit code), the
    restarts it made before it gave up, and the rank its summary calls the root cause where
    that is another: it takes the failure with the earliest error-file time, in whole seconds
    (torch.distributed.elastic.multiprocessing.errors), so a rank that failed as a consequence
    in the same second can be named. "" when the summary does not name `rank`."""
    if ROOT_CAUSE not in result.agent_log:
        return ""
    failures_part, root_part = result.agent_log.split(ROOT_CAUSE, 1)
    codes = {int(r): int(code) for _, r, code in SUMMARY_ENTRY.findall(failures_part)}
    named = [(int(r), int(code)) for _, r, code in SUMMARY_ENTRY.findall(root_part)]
    codes.update(named)
    if rank not in codes:
        return ""
    tries = (f", after {result.restarts} restart(s) of every rank (max_restarts="
             f"{result.max_restarts})" if result.restarts else "")  # fmt: skip
    said = f"torchrun's summary: rank {rank} exited with code {codes[rank]}{tries}"
    if named and named[0][0] != rank:
        said += (f". It names rank {named[0][0]} as the root cause (\"first observed "
                 "failure\"): it orders the failures by the whole second of their error files")
    return said + ". The whole summary is in result.agent_log."


def restart_notes(result: RunResult) -> list[str]:
    """A note for each attempt that torchrun restarted (launch's max_restarts): the rank that
    failed on its own and what it raised, or, if none reported an exception of its own, the
    rank that torchrun's log names as its first failure (the earliest whole second) and its
    exit code; then that every rank started again. (A rank whose collective lost its peer
    failed as a consequence.)"""
    logged = ATTEMPT_FAILED.findall(result.agent_log) if result.nnodes == 1 else []
    notes = []
    for attempt in result.attempts[:-1]:
        own = [failure for failure in attempt.failures if not is_hang(failure)]
        reported = {failure.rank for failure in attempt.failures}
        first = logged[attempt.number : attempt.number + 1]  # [(exit code, rank)]
        ended = [(int(code), int(rank)) for code, rank in first if int(rank) not in reported]
        if own:
            root = earliest(own)
            what = f"rank {root.rank} raised {root.type}: {first_line(root.message)}"
        elif ended:
            what = ended_text(ended[0][1], ended[0][0]).removesuffix(".")
        elif attempt.failures:  # torchrun's log named a rank that failed as a consequence
            root = earliest(attempt.failures)
            what = (f"rank {root.rank} lost its peer ({first_line(root.message)}): another "
                    "rank's process had ended without a Python exception")  # fmt: skip
        else:
            what = "a rank failed (torchrun's log: result.agent_log)"
        notes.append(f"Attempt {attempt.number}: {what}. " + restarted(result, attempt.number))
    return notes


def restarted(result: RunResult, attempt: int) -> str:
    """What torchrun did after attempt `attempt` failed, with restarts left."""
    return (f"torchrun stopped every rank and started all {result.world_size} again: restart "
            f"{attempt + 1} of at most {result.max_restarts}, the ranks' "
            f"TORCHELASTIC_RESTART_COUNT={attempt + 1}.")  # fmt: skip


def first_line(text: str) -> str:
    """The first line of `text` (an exception's message can run to many)."""
    return text.strip().splitlines()[0] if text.strip() else text


def teardown_note(result: RunResult) -> str | None:
    """A note for a run whose every script completed but whose exit code says a rank crashed
    as its process ended: the work and records are complete, and the crash is said."""
    if result.returncode == 0 or not result.all_completed or result.failures:
        return None
    return (
        f"torchrun exited with code {result.returncode}, but only after every rank's script "
        "had completed and saved its records: a rank crashed while its process was ending. "
        "The results are complete." + stderr_tails(result.stderr, lines=1)
    )


def launch_retry_note(result: RunResult) -> str | None:
    """connect_retry_note() for a launch that left nothing behind (no records, no rank
    completed, not stopped): launching it again then repeats nothing the user saw."""
    if result.ok or result.timed_out or result.interrupted or result.completed:
        return None
    if len(result.records):
        return None
    return connect_retry_note(result.failures, any(result.stdout), "the job was launched again")


def connect_retry_note(failures: Sequence[RankFailure], printed: bool, again: str) -> str | None:
    """A note if the ranks failed only because init_process_group could not connect them (the
    first failure is gloo's, the others happened while joining too) and nothing was printed:
    a rare transient failure, worth one more try (`again` says how). Else None: every other
    failure is the user's to see."""
    if printed or not failures:
        return None
    root = earliest(failures)
    joining = all("init_process_group" in f.traceback for f in failures)
    if CONNECT_SIGN not in root.message or not joining:
        return None
    first_line = SOURCE_TAG.sub("", root.message).splitlines()[0]
    return (
        f"rank {root.rank} failed inside init_process_group before any rank printed anything "
        f"({root.type}: {first_line}). Gloo could not connect the ranks on loopback, a rare "
        f"transient failure, so {again}, once; what follows is that second try."
    )


def say(note: str) -> None:
    """Show a note under the cell (stderr). With DDP_KIT_NOTES_FILE set (the test run) it is
    appended to that file instead, so compared notebook outputs stay the same; the test run
    prints the file at its end, with an origin: PYTEST_CURRENT_TEST as this process sees it (in
    a notebook kernel, the test during which the kernel started), else the working directory."""
    notes_file = os.environ.get(contract.NOTES_FILE)
    if notes_file:
        origin = os.environ.get("PYTEST_CURRENT_TEST") or f"a kernel in {os.getcwd()}"
        with open(notes_file, "a", encoding="utf-8") as sink:
            sink.write(f"[ddp_kit] note ({origin}): {note}\n")
    else:
        print(f"[ddp_kit] note: {note}", file=sys.stderr)


def stderr_tails(stderr: Sequence[str], lines: int = 5) -> str:
    """The last few non-empty stderr lines of every rank that wrote any."""
    parts = []
    for rank, text in enumerate(stderr):
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        if tail:
            parts.append(f"\n--- last stderr lines of rank {rank} ---\n" + "\n".join(tail))
    return "".join(parts)
