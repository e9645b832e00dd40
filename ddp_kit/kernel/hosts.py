"""A launch over several hosts: one torchrun agent per host, started over ssh, the agents meeting
at torchrun's c10d rendezvous on the first host. (No protocol of the kit's own: torchrun's
rendezvous, OpenSSH, and the files of the run directory.)

    launch(script, nproc=2, hosts=["gpu1", "gpu2"], launcher="ssh")   # 2 hosts x 2 ranks
    %%torchrun -n 2 --hosts gpu1,gpu2 --launcher ssh
    Session(2, hosts=["gpu1", "gpu2"], launcher="ssh")   # live ranks (kernel.session)
    launch(script, nproc=2, launcher="slurm")   # inside an allocation: one node per node of it

Words (the package docstring defines the rest):
host      a machine that runs one node of the job: its torchrun agent and its `nproc` ranks,
          named as the kernel's ssh reaches it (a name in ~/.ssh/config, or an address).
launcher  how the agents start: "local" (every node on this machine, on 127.0.0.1), "ssh" (the
          system's OpenSSH client, one connection per host) or "slurm" (inside the kernel's
          allocation: one srun, one task per node; the hosts are the allocation's nodes,
          SLURM_JOB_NODELIST, or some of them, and each node's address the one it uses
          toward srun's host, SLURM_SRUN_COMM_HOST, an IP address).

What the hosts need, checked before anything starts (`probe`, one ssh per host, in parallel,
PROBE_SECONDS in all):
- ssh reaches each host with no question asked (keys, and host keys in known_hosts:
  BatchMode=yes); ssh tries to connect for CONNECT_SECONDS. DDP_KIT_SSH_OPTIONS adds options to
  every ssh, e.g. "-F path/ssh_config" (the kit's own `-o` options, in `ssh_argv`, come first:
  ssh keeps the first value of each). Under SLURM, srun starts the probe on every node.
- A filesystem that every host shares, with the same paths, as a cluster's home or project space:
  the run directory (made in the kernel's temporary folder: set TMPDIR to a shared folder
  before the kernel starts), the kernel's working directory and the script are read there,
  and the kit and Python must be at the same paths. The records, error reports and logs are
  written to the run directory, and the kernel reads them where they are: nothing is copied.
- The same Python (x.y.z) and torch build (2.13.0+cu128 is not 2.13.0+cpu), and the kit from
  the same folder (`python=` names the Python on the hosts, default the kernel's own path).
  The backend is chosen by the hosts' GPUs (the fewest any host has), not the kernel's.
- Each machine once: two names that answer from one address are refused.

What each host is given: the ranks' environment in the ssh command (`sent_env`: the kit's
variables, env=, and the kernel's FORWARDED settings of NCCL, gloo, torch and OpenMP), and
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME set to the interface whose network holds the first
host's address (else the interface the kernel reached the host on), unless env= names them.
Every host must reach every other at its address: gloo connects every pair of ranks.
torchrun's --local-addr is the host's address as the kernel reached it (under SLURM, the one
it uses toward srun's host): a host's name may resolve to a loopback address on the host
itself, as many do, and the kit never relies on resolving names. torchrun's rendezvous numbers
the nodes by that address (as text), not in the order of `hosts`: the result's `hosts` says
where each rank ran.

The fast start (kernel.fast_start) on each host: when a run would start fast on one machine
(gloo on CPU), each host's `ddp_kit.rank.remote` starts a fork server there for the launch,
which forks the host's agent and ranks behind their relays and retires when the agent ends:
torch is imported once per host and launch. (A server that does not come up: plain starts.)

How it ends: ssh (or srun) runs `python -m ddp_kit.rank.remote`, which stops the host's agent
and ranks when its stdin ends. The kernel holds that stdin and never writes to it, so stopping
the launch (timeout, interrupt) or the kernel killed end the host's processes. A host gone
silent: the kernel's ssh gives up after about 20 s; the host's processes run on until its sshd
notices (ClientAliveInterval, if set), or the job ends. (Under SLURM: when slurmctld marks the
node down, SLURM ends the step.)
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..rank.remote import FORK_SERVER_FLAG
from ..shared import contract, torch_build
from ..shared.errors import LaunchConfigError
from . import fast_start
from .torchrun import ranks_pythonpath

LAUNCHERS = ("local", "ssh", "slurm")
CONNECT_SECONDS = 10  # ssh's ConnectTimeout: how long it tries to reach a host
# The kernel's ssh gives up on a host silent for (ALIVE_COUNT + 1) x ALIVE_SECONDS, about 20 s
ALIVE_SECONDS, ALIVE_COUNT = 5, 3
PROBE_SECONDS = 60  # the whole probe of every host: ssh, then Python (torch imported on GPU hosts)
SSH_OPTIONS = "DDP_KIT_SSH_OPTIONS"
SSH_FAILED = 255  # ssh's exit code for its own errors (the remote command's code otherwise)
SOCKET_PATH_MAX = 107  # Linux's sun_path holds 108 bytes, the last one a NUL


@dataclass(frozen=True)
class Host:
    """One host of a launch, as the probe found it."""

    name: str  # as ssh reaches it
    address: str  # the host's address as the kernel reached it (torchrun's --local-addr)
    interface: str  # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on this host
    port: int  # a port free on the host: the first host's serves the rendezvous
    gpus: int  # CUDA GPUs the host's torch sees


def validate_hosts(
    hosts: Sequence[str] | str | None, launcher: str, nnodes: int, max_restarts: int = 0
) -> list[str]:
    """The hosts as a list (a string is split at commas), or refuse them, naming the fix."""
    if launcher not in LAUNCHERS:
        raise LaunchConfigError(f"launcher={launcher!r}: choose one of {', '.join(LAUNCHERS)}.")
    if not hosts and launcher == "slurm":
        hosts = slurm_nodes()
    if not hosts:
        if launcher != "local":
            raise LaunchConfigError(f'launcher="{launcher}" needs hosts: hosts=["host1", "host2"]'
                                    " (or %%torchrun --hosts host1,host2).")  # fmt: skip
        return []
    names = [h.strip() for h in hosts.split(",")] if isinstance(hosts, str) else list(hosts)
    if not all(isinstance(h, str) and h and not h.startswith("-") for h in names):
        raise LaunchConfigError(f"hosts={hosts!r}: give host names or addresses, as ssh takes "
                                'them: hosts=["host1", "host2"].')  # fmt: skip
    if len(set(names)) != len(names):
        raise LaunchConfigError(f"hosts={hosts!r} names a host twice: one agent per host; "
                                "more ranks on a host: nproc.")  # fmt: skip
    if launcher == "local":
        raise LaunchConfigError('hosts= starts agents on other machines: add launcher="ssh" '
                                "(or %%torchrun --launcher ssh).")  # fmt: skip
    if launcher == "slurm":
        outside = sorted(set(names) - set(slurm_nodes()))
        if outside:
            raise LaunchConfigError(
                f"hosts={hosts!r}: {outside[0]} is not a node of this SLURM allocation; leave "
                "hosts out to use all of its nodes."
            )
    if nnodes not in (1, len(names)):
        raise LaunchConfigError(f"nnodes={nnodes} with {len(names)} hosts: one node per host, "
                                "leave nnodes out.")  # fmt: skip
    if max_restarts:
        raise LaunchConfigError("max_restarts with hosts: torchrun's restarts across hosts are "
                                "not tested with the kit yet; leave max_restarts out, or run "
                                "on one machine.")  # fmt: skip
    return names


@dataclass(frozen=True)
class Machines:
    """Where a lesson over several machines runs (notebook 28): `hosts` reached by `launcher`,
    or, with no hosts, `nnodes` torchrun agents on this machine, on 127.0.0.1."""

    hosts: tuple[str, ...]
    launcher: str
    nnodes: int

    @property
    def flags(self) -> str:
        """The %%torchrun flags that run a cell there."""
        if not self.hosts:
            return f"--nnodes {self.nnodes}"
        return f"--hosts {','.join(self.hosts)} --launcher {self.launcher}"

    @property
    def launch_args(self) -> dict:
        """The launch() arguments that run a job there."""
        if not self.hosts:
            return {"nnodes": self.nnodes}
        return {"hosts": list(self.hosts), "launcher": self.launcher}

    def __str__(self) -> str:
        if self.launcher == "slurm":
            return (f"{self.nnodes} nodes of this SLURM allocation, {', '.join(self.hosts)}, "
                    "started with srun.")  # fmt: skip
        if self.hosts:
            return (f"{self.nnodes} hosts, {', '.join(self.hosts)}, started over ssh "
                    f"({contract.LESSON_HOSTS}).")  # fmt: skip
        return (f"no hosts given ({contract.LESSON_HOSTS} is not set): {self.nnodes} torchrun "
                "agents on this machine, each a node, all on 127.0.0.1. The cells are the same; "
                "only the link between the nodes is not a network.")  # fmt: skip


def lesson_machines(nnodes: int = 2) -> Machines:
    """The machines a lesson runs on: the first `nnodes` hosts of DDP_KIT_HOSTS ("box1,box2"),
    started over DDP_KIT_LAUNCHER ("ssh", the default, or "slurm": with DDP_KIT_HOSTS unset, the
    allocation's nodes); neither set: `nnodes` nodes on this machine."""
    launcher = os.environ.get(contract.LESSON_LAUNCHER, "ssh").strip() or "ssh"
    given = os.environ.get(contract.LESSON_HOSTS, "").strip()
    if launcher not in ("ssh", "slurm"):
        raise LaunchConfigError(f"{contract.LESSON_LAUNCHER}={launcher!r}: choose ssh or slurm.")
    if not given and launcher == "ssh":
        return Machines((), "local", nnodes)
    hosts = validate_hosts(given or None, launcher, 1)
    if len(hosts) < nnodes and not given:  # the allocation's nodes
        raise LaunchConfigError(f"This SLURM allocation has {len(hosts)} node(s); this lesson "
                                f"needs {nnodes}: start Jupyter inside `salloc --nodes "
                                f"{nnodes}`.")  # fmt: skip
    if len(hosts) < nnodes:
        raise LaunchConfigError(f"{contract.LESSON_HOSTS}={given!r} names {len(hosts)} host(s); "
                                f"this lesson needs {nnodes}: {contract.LESSON_HOSTS}="
                                f"{','.join(f'host{i + 1}' for i in range(nnodes))}.")  # fmt: skip
    return Machines(tuple(hosts[:nnodes]), launcher, nnodes)


def ssh_argv(host: str, line: str, extra: Sequence[str] = ()) -> list[str]:
    """The ssh command that runs the shell command `line` on `host`: asking nothing
    (BatchMode), giving up on an unreachable host after CONNECT_SECONDS and on a silent one
    after about (ALIVE_COUNT + 1) x ALIVE_SECONDS, 20 s, no terminal, IPv4, then the `extra`
    options (a live session's forward). ssh keeps an option's first value: the kit's come
    before DDP_KIT_SSH_OPTIONS, which adds others."""
    kit = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_SECONDS}",
           "-o", f"ServerAliveInterval={ALIVE_SECONDS}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
           "-o", "AddressFamily=inet", "-T", *extra]  # fmt: skip
    return ["ssh", *kit, *shlex.split(os.environ.get(SSH_OPTIONS, "")), host, "--", line]


def session_forward(socket_path: Path, port: int) -> list[str]:
    """The ssh options that carry a live session's channel from a host to the kernel: a Unix
    socket at `socket_path` on the host (made by the host's sshd, mode 0600: only this user can
    connect), forwarded through the ssh connection to the kernel's 127.0.0.1:`port`. ssh fails
    at once if the host refuses the forward (its sshd's AllowStreamLocalForwarding or
    DisableForwarding, or `restrict` / `no-port-forwarding` on the key). A path too long for
    a Unix socket (SOCKET_PATH_MAX bytes) is refused, naming the fix. (The socket file stays
    until the run directory goes, with the session.)"""
    if len(os.fsencode(socket_path)) > SOCKET_PATH_MAX:
        raise LaunchConfigError(
            f"Live ranks on hosts need a Unix socket in the run directory, and {socket_path} is "
            f"longer than a socket's path may be ({SOCKET_PATH_MAX} bytes): set TMPDIR to a "
            "shorter shared folder before starting the kernel."
        )
    return ["-R", f"{socket_path}:127.0.0.1:{port}", "-o", "ExitOnForwardFailure=yes"]


def interrupt_ranks(launcher: str, pids_by_host: Mapping[str, list[int]]) -> None:
    """SIGINT the ranks on each host (by process id there): over ssh, or with srun inside the
    kernel's allocation (--overlap: beside the running step). Waits up to CONNECT_SECONDS + 5
    for the commands; a host that cannot be reached is left to the cell's own end."""
    commands = []
    for host, pids in pids_by_host.items():
        kill = ["kill", "-INT", *map(str, pids)]
        srun = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", *kill]
        commands.append(srun if launcher == "slurm" else ssh_argv(host, shlex.join(kill)))
    # each in its own session: the notebook's ^C (SIGINT to the kernel's group) spares them
    procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
             for c in commands]  # fmt: skip
    deadline = time.monotonic() + CONNECT_SECONDS + 5
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def probe(names: list[str], python: str, pythonpath: str, needed: list[str],
          launcher: str = "ssh") -> list[Host]:  # fmt: skip
    """Ask every host, in parallel, what `ddp_kit.rank.probe` tells (with the ranks' PYTHONPATH),
    and whether it sees the paths in `needed`; refuse hosts that cannot run the job, naming the
    host and what differs. PROBE_SECONDS bounds it all. ssh: one connection per host; slurm:
    one srun, each node saying its address toward srun's host."""
    command = ["env", f"PYTHONPATH={pythonpath}", python, "-m", "ddp_kit.rank.probe", *needed]
    if launcher == "slurm":
        asked = {"srun": _start(srun_argv(names, command))}
    else:
        asked = {name: _start(ssh_argv(name, shlex.join(command))) for name in names}
    deadline = time.monotonic() + PROBE_SECONDS
    try:
        if launcher == "slurm":
            answers = _srun_answers(names, asked["srun"], deadline)
        else:
            answers = {name: _answer(name, proc, deadline) for name, proc in asked.items()}
    finally:
        for proc in asked.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    check_alike(answers, needed)
    first = answers[names[0]]["address"]
    if len(names) > 1 and ipaddress.ip_address(first).is_loopback:
        raise LaunchConfigError(
            f"Host {names[0]} was reached at {first}, a loopback address: the other hosts could "
            "not reach its rendezvous there. Name it by an address, or a name, that they reach."
        )
    return [Host(name, a["address"], interface_for(name, a["interfaces"], a["address"], first),
                 a["port"], a["gpus"])
            for name, a in answers.items()]  # fmt: skip


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _answer(name: str, proc: subprocess.Popen, deadline: float) -> dict:
    """One host's answer to the probe, or a refusal naming the host and what it said."""
    return _parsed(f"Host {name}", _finished(f"Host {name}", proc, deadline))


def _finished(name: str, proc: subprocess.Popen, deadline: float) -> str:
    """What `proc` (a probe of `name`: a host, or srun) printed, once it ended well."""
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise LaunchConfigError(f"{name} did not answer within {PROBE_SECONDS} s (the start, "
                                "then Python asking torch there).") from None  # fmt: skip
    if proc.returncode != 0:
        said = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise LaunchConfigError(f"{name} cannot start the job: {said}")
    return out


def _srun_answers(names: list[str], proc: subprocess.Popen, deadline: float) -> dict[str, dict]:
    """Each node's answer, from the lines srun printed (one per task)."""
    lines = _finished(f"srun on {','.join(names)}", proc, deadline).strip().splitlines()
    answers = {}
    for line in lines:
        answer = _parsed("A node", line)
        answers[answer["node"]] = answer
    missing = [name for name in names if name not in answers]
    if missing:
        raise LaunchConfigError(f"Node {missing[0]} gave srun no answer to the probe.")
    return {name: answers[name] for name in names}


def _parsed(name: str, out: str) -> dict:
    """The probe's line of JSON in `out` (its last line), or a refusal naming `name`."""
    tail = (out.strip().splitlines() or [""])[-1]
    try:
        answer = json.loads(tail)
        assert isinstance(answer, dict) and ANSWER <= answer.keys()
    except (ValueError, AssertionError):
        raise LaunchConfigError(
            f"{name} answered the probe with {tail[-200:]!r}, not the line of JSON that "
            "ddp_kit.rank.probe prints."
        ) from None
    return answer


ANSWER = {"python", "torch", "kit", "executable", "address", "interfaces", "missing", "port",
          "gpus", "node"}  # fmt: skip


def probe_for(names: list[str], python: str, script: object, launcher: str) -> list[Host]:
    """probe() for a launch of `script`: every host must see a file made now in this kernel's
    temporary folder (where the run directory will be), its working directory and, for a .py
    file, the script."""
    from .script import _is_path

    made, check = tempfile.mkstemp(prefix="ddp_kit-probe-")
    os.close(made)
    needed = [check, os.getcwd()]
    if _is_path(script):
        needed.append(str(Path(str(script).strip()).resolve()))
    try:
        return probe(names, python, ranks_pythonpath(), needed, launcher)
    finally:
        os.unlink(check)


# What a host's ranks get of the kernel's own environment, beyond the kit's variables and env=:
# the settings of the libraries under DDP (the rest, PATH and HOME among them, is the host's).
# (Not CUDA_VISIBLE_DEVICES: a host's GPUs are its own, as the probe counted them.)
FORWARDED = ("NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "OMP_", "MKL_",
             "DDP_KIT_", "PYTHONHASHSEED")  # fmt: skip


def sent_env(ranks: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """The variables a host's ranks are sent (in the ssh command): those the kit set or
    changed, those given with env=, and the kernel's FORWARDED ones."""
    return {k: v for k, v in ranks.items()
            if os.environ.get(k) != v or k in given or k.startswith(FORWARDED)}  # fmt: skip


def check_alike(answers: Mapping[str, dict], needed: list[str]) -> None:
    """Refuse hosts whose Python, torch or kit differ from the kernel's, that do not see a path
    of `needed`, that did not say their address, or that are one machine under two names."""
    mine = {"python": sys.version.split()[0], "torch": torch_build.version(),
            "kit": str(Path(__file__).resolve().parent.parent)}  # fmt: skip
    for name, answer in answers.items():
        for key, value in mine.items():
            if answer[key] != value:
                fix = ("give the hosts the same, or name it with python=" if key != "kit" else
                       "the hosts must import the kit from the same folder (a shared filesystem)")
                raise LaunchConfigError(
                    f"Host {name} runs {key} {answer[key]} (from {answer['executable']}), the "
                    f"kernel {value}: {fix}."
                )
        if answer["missing"]:
            raise LaunchConfigError(
                f"Host {name} does not see {answer['missing'][0]}: the hosts need a filesystem "
                "they share with this machine, at the same paths (the run directory is made in "
                "TMPDIR: set it to a shared folder before starting the kernel)."
            )
        if not answer["address"]:
            raise LaunchConfigError(f"Host {name} did not say its address (no SSH_CONNECTION).")
    first_named: dict[str, str] = {}  # address -> the first host that answered from it
    for name, answer in answers.items():
        other = first_named.setdefault(answer["address"], name)
        if other != name:
            raise LaunchConfigError(
                f"Hosts {other} and {name} are one machine: both answered from "
                f"{answer['address']}. One agent per host: name it once; more ranks on it: nproc."
            )


def interface_for(name: str, interfaces: Mapping[str, list], own: str, first: str) -> str:
    """The host's interface whose network holds `first` (the first host's address), the one
    that holds `own` (where the kernel reached the host) first; else the one that holds `own`."""
    target = ipaddress.ip_address(first)
    holds_own = [n for n, found in interfaces.items() if any(a == own for a, _ in found)]
    reaching = [n for n, found in interfaces.items()
                if any(target in ipaddress.ip_network(f"{a}/{mask}", strict=False)
                       for a, mask in found)]  # fmt: skip
    for choice in ([n for n in holds_own if n in reaching], reaching, holds_own):
        if choice:
            return choice[0]
    raise LaunchConfigError(f"Host {name} has no IPv4 interface holding {own}, where the "
                            "kernel reached it.")  # fmt: skip


def remote_commands(hosts: list[Host], agent: list[str], runner: list[str], log_dir: Path,
                    env: Mapping[str, str], run_id: str, join_timeout: float,
                    launcher: str = "ssh", given: Mapping[str, str] | None = None,
                    node_env: Sequence[Mapping[str, str]] = (),
                    ssh_extra: Sequence[Sequence[str]] = (),
                    ) -> list[list[str]]:  # fmt: skip
    """ssh: one command per host. slurm: one srun, one task per node, each task picking its own
    line by its node's name (SLURMD_NODENAME). Each line runs the host's agent under
    `ddp_kit.rank.remote`, in the kernel's working directory, with `env` and the host's
    interface, at the rendezvous on the first host. `env` is the ranks' whole environment, of
    which each host is sent what `sent_env` says (with `given`, env=). `node_env` adds
    variables to each host's line, `ssh_extra` options to each host's ssh (a live session's
    channel). A run that starts fast on one host (fast_start.wanted: gloo on CPU) starts fast
    on each host too: the wrapper starts a fork server there, for this launch, and the lines
    run relays (rank.remote)."""
    fast = fast_start.wanted(env)
    env = sent_env(env, given or {})
    lines = node_lines(hosts, agent, runner, log_dir, env, run_id, join_timeout, given, node_env)
    remote = ["env", f"PYTHONPATH={env['PYTHONPATH']}", agent[0], "-m", "ddp_kit.rank.remote"]
    if fast:
        lines = [fast_start.relay_command(line) for line in lines]
        remote.append(FORK_SERVER_FLAG)
    if launcher == "slurm":  # srun's task is the wrapper, its child the node's line
        per_node = json.dumps({host.name: line for host, line in zip(hosts, lines, strict=True)})
        return [srun_argv([h.name for h in hosts], [*remote, "--per-node", per_node])]
    cd = f"cd {shlex.quote(os.getcwd())} && exec "
    extra = list(ssh_extra) or [()] * len(hosts)
    return [ssh_argv(host.name, cd + shlex.join([*remote, *line]), options)
            for host, line, options in zip(hosts, lines, extra, strict=True)]  # fmt: skip


def node_lines(hosts: list[Host], agent: list[str], runner: list[str], log_dir: Path,
               env: Mapping[str, str], run_id: str, join_timeout: float,
               given: Mapping[str, str] | None = None,
               node_env: Sequence[Mapping[str, str]] = ()) -> list[list[str]]:  # fmt: skip
    """Each host's command line: `env VARIABLES AGENT...` (the agent's own environment). The
    interface variables are the host's, unless env= (`given`) names them."""
    first = hosts[0]
    commands = []
    for node, host in enumerate(hosts):
        interfaces = {"GLOO_SOCKET_IFNAME": host.interface, "NCCL_SOCKET_IFNAME": host.interface}
        interfaces.update({k: v for k, v in (given or {}).items() if k in interfaces})
        host_env = {**env, **interfaces, contract.NODE: str(node),
                    **(node_env[node] if node_env else {})}  # fmt: skip
        rendezvous = [
            f"--nnodes={len(hosts)}", "--rdzv-backend=c10d", f"--rdzv-id={run_id}",
            f"--rdzv-endpoint={first.address}:{first.port}",
            f"--rdzv-conf=is_host={int(node == 0)},join_timeout={max(1, math.ceil(join_timeout))}",
            f"--local-addr={host.address}",
        ]  # fmt: skip
        line = [*agent, *rendezvous, "--redirects=3", f"--log-dir={log_dir / f'node{node}'}",
                *runner]  # fmt: skip
        variables = [f"{k}={v}" for k, v in sorted(host_env.items())]
        commands.append(["env", *variables, *line])
    return commands


def srun_argv(names: list[str], command: list[str]) -> list[str]:
    """srun running `command` once on each node of `names` (in the kernel's allocation), in the
    kernel's working directory, with the kernel's environment (srun's default, --export=ALL);
    one failed task ends them all at once (--kill-on-bad-exit). srun gives every task its
    stdin."""
    return ["srun", f"--nodes={len(names)}", f"--ntasks={len(names)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(names)}", "--kill-on-bad-exit=1", "--input=all",
            *command]  # fmt: skip


def slurm_nodes() -> list[str]:
    """The nodes of the kernel's SLURM allocation (SLURM_JOB_NODELIST, as scontrol expands it),
    or a refusal outside one."""
    if "SLURM_JOB_NODELIST" not in os.environ:
        raise LaunchConfigError('launcher="slurm" runs inside a SLURM allocation, and this kernel '
                                "is not in one (no SLURM_JOB_NODELIST): start Jupyter inside "
                                '`salloc --nodes 2`, or use launcher="ssh".')  # fmt: skip
    return _scontrol("show", "hostnames", os.environ["SLURM_JOB_NODELIST"]).split()


def _scontrol(*words: str) -> str:
    done = subprocess.run(["scontrol", *words], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise LaunchConfigError(f"scontrol {' '.join(words)}: {done.stderr.strip()}")
    return done.stdout
