"""launch(): run a script on N ranks under torchrun, on loopback (or on several hosts over ssh:
kernel.hosts), and collect what happened.

Each run gets a private run directory (shared.contract gives its layout), and three things are
read back from it:

    logs/     each rank's stdout/stderr (torchrun --redirects) -> output.RankOutput -> the cell
    records/  what record() saved, npz + JSON per rank          -> shared.records.Records
    errors/   a report per rank that raised                    -> diagnose -> WorkerError
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..shared import contract, failures
from ..shared.errors import Interrupted, LaunchTimeout, WorkerError
from ..shared.markers import COMPLETED, node_groups, ranks_marked
from ..shared.records import Records
from . import diagnose
from . import hosts as hosts_module
from .backend import choose_backend, say_choice, say_fallback
from .hosts import SSH_FAILED
from .output import RankOutput
from .progress import LaunchProgress
from .progress import wanted as progress_wanted
from .result import RunResult
from .script import Script, write_script
from .torchrun import (
    NODE_FAILED_GRACE,
    POLL_SECONDS,
    RESTART_ENV,
    Agents,
    agent_argv,
    log_roots,
    make_run_dir,
    rank_env,
    read_attempts,
    runner_argv,
    torchrun_commands,
    validate,
    validate_args,
    validate_restarts,
)


def launch(
    script: Script,
    nproc: int = 2,
    *,
    args: Sequence[str] | str = (),
    nnodes: int = 1,
    backend: str = "auto",
    timeout: float = 300.0,
    collective_timeout: float = 60.0,
    output: str = "collapsed",
    debug: str = "off",
    env: Mapping[str, str] | None = None,
    keep_run_dir: bool = False,
    check: bool = True,
    max_restarts: int = 0,
    monitor_interval: float | None = None,
    hosts: Sequence[str] | str | None = None,
    launcher: str = "local",
    python: str | None = None,
) -> RunResult:
    """Run `script` (code text, a .py path or a function) on `nproc` ranks with torchrun.

    `args` are passed to the script (its sys.argv[1:]): a list of strings (numbers are turned
    into strings), or one string, split into words as a shell would (`args="5 2 --batch_size
    32"` is `["5", "2", "--batch_size", "32"]`; quote a word with spaces).

    nnodes > 1 starts that many torchrun
    agents on this machine, as if each were a node of a cluster, all on 127.0.0.1. A failure
    raises WorkerError naming the rank (unless check=False); `timeout` bounds the whole run,
    `collective_timeout` each collective. `debug` sets TORCH_DISTRIBUTED_DEBUG ("detail": each
    collective is checked to be the same on every rank). A job whose ranks failed only because
    gloo could not connect them in init_process_group, before any printed, runs once more, with
    a note.

    max_restarts=N lets torchrun restart every rank up to N times after one fails (torchrun's
    --max-restarts; a rank reads its attempt from TORCHELASTIC_RESTART_COUNT), checking its
    ranks every `monitor_interval` seconds (--monitor-interval; None: torchrun's 0.1 s). The
    result's `attempts` hold what each attempt's ranks reported.

    hosts=["a", "b"], launcher="ssh" runs one node per host, `nproc` ranks each, started over
    ssh and meeting at torchrun's c10d rendezvous on the first host; `python` is the Python
    on the hosts (default: this one's path). kernel.hosts says what the hosts need (ssh keys,
    a shared filesystem, the same versions), checked before anything starts. The result's
    `hosts` names the host of each rank.
    """
    names = hosts_module.validate_hosts(hosts, launcher, nnodes, max_restarts)
    nnodes = len(names) or nnodes
    validate(nproc, nnodes, timeout, collective_timeout, output, debug)
    validate_restarts(max_restarts, monitor_interval, timeout, nnodes)
    script_args = validate_args(args)
    found = (hosts_module.probe_for(names, python or sys.executable, script, launcher)
             if names else [])  # fmt: skip
    if found:  # each host runs nproc ranks on its own GPUs
        choice = choose_backend(nproc, backend, gpus=min(host.gpus for host in found))
        say_fallback(choice)
    else:
        choice = choose_backend(nproc * nnodes, backend)
        say_choice(choice, nproc * nnodes)
    job = Job(
        script=script,
        nproc=nproc,
        nnodes=nnodes,
        args=script_args,
        backend=choice.backend,
        device=choice.device,
        timeout=timeout,
        collective_timeout=collective_timeout,
        output=output,
        debug=debug,
        env=dict(env or {}),
        keep_run_dir=keep_run_dir,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        hosts=tuple(found),
        launcher=launcher,
        python=python or sys.executable,
    )
    result, ranks_output = job.run()
    retry_note = diagnose.launch_retry_note(result)
    if retry_note:  # its stdout was empty and its stderr is not shown: the note says it all
        diagnose.say(retry_note)
        result, ranks_output = job.run()
        result.notes.insert(0, retry_note)
    ranks_output.show_rest()
    for note in [*diagnose.restart_notes(result), diagnose.teardown_note(result)]:
        if note:
            result.notes.append(note)
            diagnose.say(note)
    if result.interrupted:
        raise Interrupted(diagnose.explain(result, timeout).message)
    if check and not result.ok:
        error = LaunchTimeout if result.timed_out else WorkerError
        explanation = diagnose.explain(result, timeout, debug)
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
    debug: str
    env: dict[str, str]
    keep_run_dir: bool
    max_restarts: int = 0
    monitor_interval: float | None = None
    hosts: tuple[hosts_module.Host, ...] = ()  # one node each, by ssh or srun (kernel.hosts)
    launcher: str = "local"
    python: str = sys.executable  # the hosts' Python

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def run(self) -> tuple[RunResult, RankOutput]:
        """Run the job once. Returns its result and its output, of which only rank 0's
        stdout has been shown so far (in "all" mode): `show_rest()` shows the rest."""
        run_dir = make_run_dir()
        try:
            path = write_script(run_dir, self.script)
            environment = rank_env(
                run_dir, self.backend, self.collective_timeout, self.env, self.debug, self.device
            )
            if self.max_restarts:
                environment = {**RESTART_ENV, **environment}
            markers = run_dir / contract.MARKERS
            if self.hosts:
                commands = self._host_commands(run_dir, path, environment)
                environment = dict(os.environ)  # ssh's own; the ranks' goes in its command
            else:
                commands = torchrun_commands(path, self.nproc, self.nnodes,
                                             run_dir / contract.LOGS, self.args,
                                             max_restarts=self.max_restarts,
                                             monitor_interval=self.monitor_interval)  # fmt: skip
            groups = (lambda: node_groups(markers, self.nproc)) if self.hosts else None
            output = RankOutput(log_roots(run_dir, self.nnodes), self.nproc, self.output,
                                max_restarts=self.max_restarts, groups=groups)  # fmt: skip
            enabled = self.output != "quiet" and progress_wanted()
            progress = LaunchProgress(output, markers, self.world_size, enabled)
            start = time.perf_counter()
            agents = Agents.start(commands, environment, self.nproc, remote=bool(self.hosts))
            outcome = self._watch(agents, output, progress)
            node_notes = self._node_notes(agents, outcome)
            for note in node_notes:
                diagnose.say(note)
            duration = time.perf_counter() - start
            output.read_rest()
            progress.end(f"{self.world_size} ranks ran for {duration:.1f} s")
            stdout = [output.text(r, "stdout") for r in range(self.world_size)]
            stderr = [output.text(r, "stderr") for r in range(self.world_size)]
            completed = ranks_marked(markers, COMPLETED)
            # host index -> torchrun's node rank: read once, and only for a launch over hosts
            # (on one machine the node index is the node rank)
            placed = node_groups(markers, self.nproc) if self.hosts else {}
            reports = failures.read_reports(run_dir / contract.ERRORS)
            if outcome.returncode and not (outcome.timed_out or outcome.interrupted):
                printed = {r: stdout[r] + stderr[r] for r in range(self.world_size)}
                reports += diagnose.process_ends(outcome.agent_log, [f.rank for f in reports],
                                                 completed, printed, run_dir / contract.ERRORS)
            result = RunResult(
                nproc=self.nproc,
                nnodes=self.nnodes,
                backend=self.backend,
                device=self.device,
                returncode=outcome.returncode,
                duration=duration,
                stdout=stdout,
                stderr=stderr,
                records=Records.load(run_dir / contract.RECORDS, self.world_size),
                failures=reports,
                timed_out=outcome.timed_out,
                interrupted=outcome.interrupted,
                script=path.read_text(),
                agent_log=outcome.agent_log,
                commands=commands,
                run_dir=run_dir if self.keep_run_dir else None,
                completed=completed,
                attempts=read_attempts(run_dir, self.nnodes, self.nproc, reports, placed),
                max_restarts=self.max_restarts,
                hosts=self._rank_hosts(placed),
            )
            result.notes += node_notes
        finally:
            if not self.keep_run_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
        return result, output

    def _host_commands(self, run_dir, script, environment: dict[str, str]) -> list[list[str]]:
        """The ssh command of each host: the ranks' environment as hosts_module.sent_env says."""
        agent = agent_argv(self.python, self.nproc, self.max_restarts, self.monitor_interval)
        return hosts_module.remote_commands(list(self.hosts), agent, runner_argv(script, self.args),
                                            run_dir / contract.LOGS, environment, run_dir.name,
                                            self.timeout, self.launcher, self.env)  # fmt: skip

    def _node_notes(self, agents: Agents, outcome: AgentsOutcome) -> list[str]:
        """Which host was lost (its ssh ended on its own with ssh's own error code), and which
        node's failure made the kit stop the others."""
        notes = [f"Host {self.hosts[node].name} was lost: its ssh connection ended with exit code "
                 f"{SSH_FAILED}, ssh's own error (the host went down, or the network to it)."
                 for node, proc in enumerate(agents.procs)
                 if self.launcher == "ssh" and proc.returncode == SSH_FAILED
                 and node not in agents.stopped]  # fmt: skip
        for node, proc in enumerate(agents.procs):
            killer = None if node in agents.stopped else self._killed_by(proc.returncode)
            if killer:
                where = f"Host {self.hosts[node].name}" if self.hosts else f"Node {node}"
                notes.append(f"{where}'s agent was killed by {killer}, not by the kit: its ranks "
                             "ended with it and left no report, as when a machine goes down.")
        if outcome.stopped_after is not None:
            node = outcome.stopped_after
            where = f"Host {self.hosts[node].name}" if self.hosts else f"Node {node}"
            notes.append(f"{where}'s agent ended first, with exit code "
                         f"{agents.procs[node].returncode}: the job had failed, so the kit "
                         f"stopped the other agents {NODE_FAILED_GRACE:g} s later (torchrun "
                         "would keep them waiting for it).")  # fmt: skip
        return notes

    def _killed_by(self, code: int | None) -> str | None:
        """The signal that killed a node's agent, from the exit code of the process the kernel
        started for it: the agent (or its relay) on this machine, -N; over ssh, rank.remote's
        128 + N (ssh's own error, 255, is a lost connection: the note above)."""
        if code is not None and not self.hosts and code < 0:
            number = -code
        elif code is not None and self.launcher == "ssh" and 128 < code < SSH_FAILED:
            number = code - 128
        else:
            return None
        try:
            return signal.Signals(number).name
        except ValueError:
            return None

    def _rank_hosts(self, groups: dict[int, int]) -> list[str]:
        """The host of each rank (empty for a launch on this machine, or where unknown)."""
        if not self.hosts or len(groups) != len(self.hosts):
            return []
        named = {group * self.nproc + local: self.hosts[node].name
                 for node, group in groups.items() for local in range(self.nproc)}  # fmt: skip
        return [named[rank] for rank in range(self.world_size)]

    def _watch(self, agents: Agents, output: RankOutput, progress: LaunchProgress) -> AgentsOutcome:
        """Show output and progress until the agents end; stop everything on timeout or
        interrupt."""
        timed_out = interrupted = False
        deadline = time.monotonic() + self.timeout
        failed: tuple[int, float] | None = None  # the first node whose agent failed, and when
        stopped_after = None
        try:
            while agents.running():
                output.poll()
                progress.update()
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                failed = failed or agents.first_failure()
                if failed and time.monotonic() > failed[1] + NODE_FAILED_GRACE:
                    stopped_after = failed[0]  # the others would wait in torchrun's exit barrier
                    break
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            agents.stop()
        failed_node = agents.procs[stopped_after] if stopped_after is not None else None
        code = agents.returncode if failed_node is None else failed_node.returncode
        return AgentsOutcome(code, agents.log, timed_out, interrupted, stopped_after)


@dataclass(frozen=True)
class AgentsOutcome:
    """How a launch's agents ended."""

    returncode: int
    agent_log: str
    timed_out: bool
    interrupted: bool
    stopped_after: int | None = None  # the node whose failure made the kit stop the others
