"""A launch over several hosts: one torchrun agent per host, started over ssh, the agents meeting
at torchrun's c10d rendezvous on the first host. (No protocol of the kit's own: torchrun's
rendezvous, OpenSSH, and the files of the run directory.)

    launch(script, nproc=2, hosts=["gpu1", "gpu2"], launcher="ssh")   # 2 hosts x 2 ranks
    %%torchrun -n 2 --hosts gpu1,gpu2 --launcher ssh

Words (the package docstring defines the rest):
host      a machine that runs one node of the job: its torchrun agent and its `nproc` ranks,
          named as the kernel's ssh reaches it (a name in ~/.ssh/config, or an address).
launcher  how the agents start: "local" (every node on this machine, on 127.0.0.1) or "ssh"
          (the system's OpenSSH client, one connection per host).

What the hosts need, checked before anything starts (`probe`, one ssh per host, in parallel):
- ssh reaches each host with no question asked (keys and known hosts: BatchMode=yes), within
  CONNECT_SECONDS. DDP_KIT_SSH_OPTIONS adds options to every ssh, e.g. "-F path/ssh_config".
- A filesystem that every host shares, with the same paths, as a cluster's home or project space:
  the run directory (made where $TMPDIR points: set it to a shared folder), the script, the
  kit and Python itself are read there. The records, error reports and logs are written to
  the run directory, and the kernel reads them where they are: nothing is copied.
- The same Python and torch versions, and the kit from the same folder (`python=` names the
  Python on the hosts, default the kernel's own path).

What each host is given: the ranks' environment (the kit's variables and env=, in the ssh
command), and GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME set to the interface whose network holds
the first host's address (else the interface the kernel reached the host on). torchrun's
--local-addr is the host's address as the kernel reached it: a host's name may resolve to
127.0.0.1 on the host itself, as many do, and the kit never relies on resolving names.

How it ends: ssh runs `python -m ddp_kit.rank.remote`, which stops the host's agent and ranks
when its stdin ends. The kernel holds that stdin and never writes to it, so stopping the launch
(timeout, interrupt), the kernel killed or the connection lost all end the host's processes.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..shared import contract
from ..shared.errors import LaunchConfigError

LAUNCHERS = ("local", "ssh")
CONNECT_SECONDS = 10  # ssh's ConnectTimeout: an unreachable host is said within this
PROBE_SECONDS = 60  # the whole probe of every host: ssh, and Python importing torch
SSH_OPTIONS = "DDP_KIT_SSH_OPTIONS"
SSH_FAILED = 255  # ssh's exit code for its own errors (the remote command's code otherwise)


@dataclass(frozen=True)
class Host:
    """One host of a launch, as the probe found it."""

    name: str  # as ssh reaches it
    address: str  # the host's address as the kernel reached it (torchrun's --local-addr)
    interface: str  # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on this host
    port: int  # a port free on the host: the first host's serves the rendezvous


def validate_hosts(hosts: Sequence[str] | str | None, launcher: str, nnodes: int) -> list[str]:
    """The hosts as a list (a string is split at commas), or refuse them, naming the fix."""
    if launcher not in LAUNCHERS:
        raise LaunchConfigError(f"launcher={launcher!r}: choose one of {', '.join(LAUNCHERS)}.")
    if hosts is None or hosts == [] or hosts == "":
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
    if nnodes not in (1, len(names)):
        raise LaunchConfigError(f"nnodes={nnodes} with {len(names)} hosts: one node per host, "
                                "leave nnodes out.")  # fmt: skip
    return names


def ssh_argv(host: str, line: str) -> list[str]:
    """The ssh command that runs the shell command `line` on `host`, asking nothing
    (BatchMode) and giving up on an unreachable host after CONNECT_SECONDS."""
    options = shlex.split(os.environ.get(SSH_OPTIONS, ""))
    return ["ssh", *options, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_SECONDS}",
            host, "--", line]  # fmt: skip


def probe(names: list[str], python: str, run_dir: Path) -> list[Host]:
    """Ask every host, in parallel, what `ddp_kit.rank.probe` tells; refuse hosts that cannot
    run the job, naming the host and what differs."""
    line = shlex.join(["env", f"PYTHONPATH={kit_parent()}", python, "-m", "ddp_kit.rank.probe",
                       str(run_dir)])  # fmt: skip
    asked = {name: subprocess.Popen(ssh_argv(name, line), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in names}  # fmt: skip
    answers = {}
    for name, proc in asked.items():
        try:
            out, err = proc.communicate(timeout=PROBE_SECONDS)
        except subprocess.TimeoutExpired:
            for other in asked.values():
                other.kill()
            raise LaunchConfigError(f"Host {name} did not answer within {PROBE_SECONDS} s "
                                    "(ssh, then Python importing torch there).") from None
        if proc.returncode != 0:
            said = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            raise LaunchConfigError(f"Host {name} cannot start the job: {said}")
        answers[name] = json.loads(out.strip().splitlines()[-1])
    check_alike(answers, python, run_dir)
    first = answers[names[0]]["address"]
    return [Host(name, a["address"], interface_for(a["interfaces"], a["address"], first), a["port"])
            for name, a in answers.items()]  # fmt: skip


def kit_parent() -> str:
    """The folder that holds this ddp_kit package (the hosts import it from the same path)."""
    return str(Path(__file__).resolve().parent.parent.parent)


def check_alike(answers: Mapping[str, dict], python: str, run_dir: Path) -> None:
    """Refuse hosts whose Python, torch or kit differ from the kernel's, or that do not see the
    run directory."""
    import torch

    import ddp_kit

    mine = {"python": sys.version.split()[0], "torch": torch.__version__,
            "kit": os.path.dirname(ddp_kit.__file__)}  # fmt: skip
    for name, answer in answers.items():
        for key, value in mine.items():
            if answer[key] != value:
                raise LaunchConfigError(
                    f"Host {name} runs {key} {answer[key]} (from {answer['executable']}), the "
                    f"kernel {value}: give the hosts the same, or name it with python=."
                )
        if not answer["run_dir"]:
            raise LaunchConfigError(
                f"Host {name} does not see the run directory {run_dir}: the hosts need a "
                "filesystem they share with this machine, at the same paths. Set TMPDIR to a "
                "shared folder before starting the kernel."
            )
        if not answer["address"]:
            raise LaunchConfigError(f"Host {name} did not say its address (no SSH_CONNECTION).")


def interface_for(interfaces: Mapping[str, list], own: str, first: str) -> str:
    """The host's interface whose network holds `first` (the first host's address), else the
    one that holds `own` (where the kernel reached the host)."""
    target = ipaddress.ip_address(first)
    for name, addresses in interfaces.items():
        for address, netmask in addresses:
            if target in ipaddress.ip_network(f"{address}/{netmask}", strict=False):
                return name
    return next(name for name, addresses in interfaces.items()
                if any(address == own for address, _ in addresses))  # fmt: skip


def remote_commands(hosts: list[Host], agent: list[str], runner: list[str], log_dir: Path,
                    env: Mapping[str, str], run_id: str, join_timeout: float) -> list[list[str]]:
    """One ssh command per host: its agent, in the kernel's working directory, with `env` and
    the host's interface, at the rendezvous on the first host."""
    first = hosts[0]
    commands = []
    for node, host in enumerate(hosts):
        host_env = {**env, "GLOO_SOCKET_IFNAME": host.interface,
                    "NCCL_SOCKET_IFNAME": host.interface, contract.NODE: str(node)}  # fmt: skip
        rendezvous = [
            f"--nnodes={len(hosts)}", "--rdzv-backend=c10d", f"--rdzv-id={run_id}",
            f"--rdzv-endpoint={first.address}:{first.port}",
            f"--rdzv-conf=is_host={int(node == 0)},join_timeout={int(join_timeout)}",
            f"--local-addr={host.address}",
        ]  # fmt: skip
        line = [*agent, *rendezvous, "--redirects=3", f"--log-dir={log_dir / f'node{node}'}",
                *runner]  # fmt: skip
        variables = [f"{k}={v}" for k, v in sorted(host_env.items())]
        remote = ["env", *variables, agent[0], "-m", "ddp_kit.rank.remote", *line]
        shell = f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(remote)}"
        commands.append(ssh_argv(host.name, shell))
    return commands
