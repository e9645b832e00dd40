"""Hosts for tests: a few Linux network namespaces on one machine, joined like real hosts.

Issue #39 wants launches on several hosts (OpenSSH, SLURM) tested in CI on real network hosts.
This module makes them on one Linux machine, as root, with the standard library only:

* ``namespace_hosts(3)`` makes hosts h0, h1, h2: one network namespace each, with lo up and one
  veth (``veth-h1``) holding one address (10.213.0.11/24), all joined by a bridge that lives in
  a namespace of its own. The addresses exist only inside these namespaces: the machine's own
  namespace gets no address and no route to them, so no test traffic can leave them.
  ``shape={"h2": Shape("100mbit")}`` puts a ``tc tbf`` qdisc on both ends of one host's link
  (netem is not in every kernel; tbf is).
* ``sshd_hosts(net)`` runs Debian's ``/usr/sbin/sshd`` in each host, listening on that host's
  address only, with host keys, a client key, an sshd_config and an ssh_config made per run:
  ``net.run("h0", *ssh.argv("h1", "hostname"))`` is a real ssh login from h0 to h1.
* ``slurm_cluster(net)`` runs munged, slurmctld (on h0) and one slurmd per node host (h1, h2),
  with a munge key and a slurm.conf made per run; ``net.run("h0", *slurm.env_argv(), "srun",
  ...)`` runs a job step on the nodes.

Every context manager stops what it started, by pid, and every process still inside one of its
namespaces is killed before that namespace is deleted: nothing is left running. Several runs
may overlap (pytest-xdist): each run's namespaces carry a random tag, and since the hosts of one
run see only each other, every run can use the same addresses and ports.

The hosts share one filesystem (like a cluster's shared filesystem: /work/main/.venv is the
same path everywhere) and the machine's hostname (which /etc/hosts maps to 127.0.0.1):
hostnames do not tell the hosts apart, so everything here uses addresses, and torchrun needs
``--local-addr`` (README.md).

``namespace_support()`` says whether this machine can do it, for a test's skip reason;
``ensure_packages()`` installs openssh-server, slurm-wlm and munge the way .ci/run could.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213.0"  # a /24: host i gets SUBNET.(10 + i), only inside its namespace
PREFIX = "ddpk"  # namespaces are PREFIX-TAG-h0 ..., PREFIX-TAG-br
SSHD = "/usr/sbin/sshd"  # sshd must be started by its absolute path (it re-executes itself)


class HostsError(RuntimeError):
    """A command that sets up hosts failed; the message has its stderr."""


def sh(argv: Sequence[str], *, timeout: float = 60, check: bool = True,
       **kwargs) -> subprocess.CompletedProcess:
    """Run argv, capture its text output; if check, raise HostsError with stderr on failure."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(argv)} -> exit {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()}")
    return done


# ---------------------------------------------------------------------------------- packages

def ensure_packages(packages: Iterable[str]) -> float:
    """apt-get install the Debian packages not installed yet; the seconds it took (0 if none).

    Debian's postinst scripts would start sshd on 0.0.0.0:22 and slurmctld/munged with the
    machine's own config; where /usr/sbin/policy-rc.d exists and exits 101 (Docker images,
    this VM) they start nothing, otherwise one is written for the install and removed after."""
    missing = [p for p in packages
               if sh(["dpkg-query", "-W", "-f=${Status}", p], check=False).stdout
               != "install ok installed"]
    if not missing:
        return 0.0
    start = time.monotonic()
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        sh(["apt-get", "update", "-q"], timeout=300, env=env)
        sh(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
           timeout=600, env=env)
    finally:
        if ours:
            policy.unlink()
    return time.monotonic() - start


# -------------------------------------------------------------------------------- namespaces

@dataclass(frozen=True)
class Shape:
    """A token bucket on a link (``tc qdisc add ... tbf``), put on both of its ends."""

    rate: str = "100mbit"
    burst: str = "64kb"
    latency: str = "50ms"  # how long a packet may wait for tokens before it is dropped

    def tc_args(self) -> list[str]:
        return ["tbf", "rate", self.rate, "burst", self.burst, "latency", self.latency]


@dataclass(frozen=True)
class Host:
    """One host: a network namespace with lo and one veth holding one address."""

    name: str  # "h1": what ssh_config and slurm.conf call it
    netns: str  # "ddpk-3fa2-h1"
    addr: str  # "10.213.0.11"
    ifname: str  # "veth-h1": its one interface, what GLOO_SOCKET_IFNAME names

    def argv(self, *command: str) -> list[str]:
        """command, run inside this host's namespace.

        ``ip netns exec`` also gives command a mount namespace of its own with a fresh /sys
        (and /etc/netns/NETNS/* over /etc/*): /sys/fs/cgroup is empty there."""
        return ["ip", "netns", "exec", self.netns, *command]

    def net_argv(self, *command: str) -> list[str]:
        """command, in this host's network namespace only (the machine's mounts, /sys/fs/cgroup
        included: what slurmd needs)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *command]


@dataclass
class Network:
    """The hosts of one namespace_hosts() run, and the processes started in them."""

    hosts: list[Host]
    bridge_netns: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __getitem__(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def namespaces(self) -> list[str]:
        return [self.bridge_netns, *(h.netns for h in self.hosts)]

    def run(self, host: str, *command: str, timeout: float = 120,
            check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """command inside host, to its end; stdout and stderr captured as text."""
        return sh(self[host].argv(*command), timeout=timeout, check=check, **kwargs)

    def popen(self, host: str, *command: str, net_only: bool = False,
              **kwargs) -> subprocess.Popen:
        """command started inside host; stopped (by pid) when the hosts are torn down.

        ``ip netns exec`` (or nsenter, if net_only) enters the namespace and execs the command:
        the pid is the command's."""
        h = self[host]
        proc = subprocess.Popen(h.net_argv(*command) if net_only else h.argv(*command),
                                **kwargs)
        self.processes.append(proc)
        return proc

    def pids(self, host: str) -> list[int]:
        """Every process inside host's namespace (sshd, its sessions, agents, ranks ...)."""
        out = sh(["ip", "netns", "pids", self[host].netns], check=False).stdout
        return [int(p) for p in out.split()]

    def shape(self, host: str, shape: Shape) -> None:
        """Put a tbf qdisc on both ends of host's link (replacing any)."""
        h = self[host]
        sh(["tc", "-n", h.netns, "qdisc", "replace", "dev", h.ifname, "root", *shape.tc_args()])
        sh(["tc", "-n", self.bridge_netns, "qdisc", "replace", "dev", f"br-{h.name}", "root",
            *shape.tc_args()])

    def unshape(self, host: str) -> None:
        """Take the tbf qdiscs off both ends of host's link."""
        h = self[host]
        sh(["tc", "-n", h.netns, "qdisc", "del", "dev", h.ifname, "root"], check=False)
        sh(["tc", "-n", self.bridge_netns, "qdisc", "del", "dev", f"br-{h.name}", "root"],
           check=False)

    def stop_processes(self, grace: float = 3.0) -> None:
        """SIGTERM what popen() started, SIGKILL what is left after grace seconds."""
        stop_by_pid([p.pid for p in self.processes if p.poll() is None], grace)
        for proc in self.processes:
            proc.wait(timeout=5)


def stop_by_pid(pids: Iterable[int], grace: float = 3.0) -> None:
    """SIGTERM these pids, then SIGKILL those still alive after grace seconds."""
    pids = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:  # reap it if it is our child, so a zombie does not count as alive
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def delete_namespace(netns: str) -> None:
    """Kill every process inside netns (by pid), then delete it. `ip netns del` alone would
    leave a namespace with processes in it alive, unnamed, until they end."""
    pids = sh(["ip", "netns", "pids", netns], check=False).stdout.split()
    stop_by_pid([int(p) for p in pids], grace=2.0)
    sh(["ip", "netns", "del", netns], check=False)


def our_namespaces() -> list[str]:
    """Namespaces named by this module (any run's): what a test checks is empty at the end."""
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{PREFIX}-")]


@contextmanager
def namespace_hosts(n: int = 3, *, shape: dict[str, Shape] | None = None,
                    subnet: str = SUBNET, tag: str | None = None) -> Iterator[Network]:
    """n hosts h0..h(n-1) joined by a bridge; everything torn down on exit.

    Per host: namespace PREFIX-TAG-hI, lo up, ``veth-hI`` with SUBNET.(10+I)/24, its peer
    ``br-hI`` a port of bridge ``br0`` in namespace PREFIX-TAG-br. Both ends of each veth are
    created straight inside their namespaces: the machine's namespace never holds either.
    A process started with ``ip netns exec`` (sshd, and so what ssh runs) sees
    /etc/netns/NETNS/hosts as /etc/hosts: the hosts' addresses by name, so that a reverse
    lookup of a peer (torch's store does one, to name it in its logs) answers at once instead
    of asking a DNS server that the namespaces cannot reach. Nothing here resolves a name."""
    tag = tag or secrets.token_hex(2)
    base = f"{PREFIX}-{tag}"
    hosts = [Host(f"h{i}", f"{base}-h{i}", f"{subnet}.{10 + i}", f"veth-h{i}") for i in range(n)]
    net = Network(hosts, f"{base}-br")
    made: list[str] = []
    try:
        br = net.bridge_netns
        sh(["ip", "netns", "add", br])
        made.append(br)
        sh(["ip", "-n", br, "link", "set", "lo", "up"])
        sh(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", br, "link", "set", "br0", "up"])
        for h in hosts:
            sh(["ip", "netns", "add", h.netns])
            made.append(h.netns)
            sh(["ip", "link", "add", h.ifname, "netns", h.netns, "type", "veth",
                "peer", "name", f"br-{h.name}", "netns", br])
            sh(["ip", "-n", br, "link", "set", f"br-{h.name}", "master", "br0", "up"])
            sh(["ip", "-n", h.netns, "link", "set", "lo", "up"])
            sh(["ip", "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", h.ifname])
            sh(["ip", "-n", h.netns, "link", "set", h.ifname, "up"])
        names = "".join(f"{h.addr} {h.name}\n" for h in hosts)
        for h in hosts:
            etc = Path("/etc/netns") / h.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        for name, s in (shape or {}).items():
            net.shape(name, s)
        yield net
    finally:
        net.stop_processes()
        for netns in reversed(made):
            delete_namespace(netns)
            shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)


def namespace_support() -> tuple[bool, str]:
    """(True, "") where this machine can make namespace hosts, else (False, why): for a skip.

    Tries what namespace_hosts() does, on a throwaway namespace: a veth pair inside it, lo up,
    an address and a tbf qdisc."""
    if os.geteuid() != 0:
        return False, "making network namespaces needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"no `{tool}` (Debian: iproute2)"
    probe = f"{PREFIX}-probe-{secrets.token_hex(2)}"
    try:
        sh(["ip", "netns", "add", probe])
        sh(["ip", "-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb"])
        sh(["ip", "-n", probe, "link", "set", "lo", "up"])
        sh(["ip", "-n", probe, "addr", "add", f"{SUBNET}.250/24", "dev", "va"])
        sh(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"])
        sh(["tc", "-n", probe, "qdisc", "add", "dev", "va", "root", *Shape().tc_args()])
    except (HostsError, OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot make a network namespace with a veth, bridge and tbf: {e}"
    finally:
        sh(["ip", "netns", "del", probe], check=False)
    return True, ""


# ------------------------------------------------------------------------------------- sshd

@dataclass
class SshHosts:
    """sshd in some hosts, and the client side: ``argv(host, *command)`` is an ssh command
    line to run inside another host (``net.run("h0", *ssh.argv("h1", "true"))``)."""

    net: Network
    dir: Path
    config: Path  # ssh_config: Host h1 -> HostName 10.213.0.11, keys, BatchMode ...
    key: Path  # the client's private key
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    def argv(self, host: str, *command: str, options: Sequence[str] = ()) -> list[str]:
        return ["ssh", "-F", str(self.config), *options, host, *command]

    def start(self, host: str, timeout: float = 10.0) -> float:
        """Start sshd in host (in the foreground, -D, logging to DIR/sshd-HOST.log); the
        seconds until it said it was listening."""
        h = self.net[host]
        log = self.dir / f"sshd-{host}.log"
        start = time.monotonic()
        with open(log, "w") as out:
            proc = self.net.popen(host, SSHD, "-D", "-e", "-f", str(self.dir / f"sshd-{host}"),
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.daemons[host] = proc
        ready = f"Server listening on {h.addr} port 22"
        while time.monotonic() - start < timeout:
            if ready in log.read_text():
                return time.monotonic() - start
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        raise HostsError(f"sshd in {host} did not start: {log.read_text().strip()}")

    def stop(self, host: str) -> None:
        proc = self.daemons.pop(host)
        stop_by_pid([proc.pid])
        proc.wait(timeout=5)


SSHD_CONFIG = """\
# sshd for host {name} of one test run (tests/hosts/netns.py): its address only, keys only.
ListenAddress {addr}:22
HostKey {dir}/{name}_host_ed25519_key
PidFile {dir}/sshd-{name}.pid
AuthorizedKeysFile {dir}/authorized_keys
# StrictModes would refuse the key: sshd checks every folder above AuthorizedKeysFile, and
# /tmp is world-writable ("bad ownership or modes for directory /tmp").
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding yes
GatewayPorts no
X11Forwarding no
PrintMotd no
PrintLastLog no
# no ClientAliveInterval (Debian's default, 0): the kit's own ending of a host's processes is
# what the tests see, not sshd's
LogLevel VERBOSE
"""

SSH_CONFIG_HOST = "Host {name}\n    HostName {addr}\n"
SSH_CONFIG_ALL = """\
Host *
    User root
    Port 22
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {dir}/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    ExitOnForwardFailure yes
    LogLevel ERROR
"""


def _keygen(path: Path, comment: str) -> str:
    sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_name(path.name + ".pub").read_text().strip()


@contextmanager
def sshd_hosts(net: Network, start: Iterable[str] | None = None,
               workdir: Path | None = None) -> Iterator[SshHosts]:
    """Keys and configs for every host, sshd started in the hosts named in start (default:
    all). Every sshd, and every session it runs, is stopped on exit."""
    if not Path(SSHD).exists():
        raise HostsError(f"no {SSHD}: apt-get install openssh-server")
    # sshd's privilege separation: "Missing privilege separation directory: /run/sshd"
    # where Debian's service never ran (its unit makes it); root's, mode 0755.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="ddpk-ssh-", dir=workdir))
    ssh = SshHosts(net, d, d / "ssh_config", d / "id_ed25519")
    try:
        (d / "authorized_keys").write_text(_keygen(ssh.key, "ddpk-client") + "\n")
        known, config = [], []
        for h in net.hosts:
            pub = _keygen(d / f"{h.name}_host_ed25519_key", f"ddpk-{h.name}")
            keytype, key = pub.split()[:2]
            known.append(f"{h.addr} {keytype} {key}\n")
            config.append(SSH_CONFIG_HOST.format(name=h.name, addr=h.addr))
            (d / f"sshd-{h.name}").write_text(SSHD_CONFIG.format(name=h.name, addr=h.addr, dir=d))
        (d / "known_hosts").write_text("".join(known))
        config.append(SSH_CONFIG_ALL.format(key=ssh.key, dir=d))
        ssh.config.write_text("".join(config))
        for name in ([h.name for h in net.hosts] if start is None else start):
            ssh.start(name)
        yield ssh
    finally:
        for name in list(ssh.daemons):
            ssh.stop(name)
        # sessions (and what they started) outlive their sshd: delete_namespace() kills them
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------ SLURM

SLURM_CONF = """\
# A SLURM cluster of one test run (tests/hosts/netns.py): slurmctld on {ctl.name}, one slurmd
# per node host, everything (state, spool, pid files, logs, munge socket) in {dir}.
ClusterName=ddpk
# slurmctld refuses to start where the hostname is not this name ("This host (vm/vm) not a
# valid controller"): every namespace shares the machine's hostname, so that is the name.
SlurmctldHost={hostname}({ctl.addr})
MailProg=/bin/true
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig={dir}/plugstack.conf
StateSaveLocation={dir}/ctld
SlurmctldPidFile={dir}/slurmctld.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdSpoolDir={dir}/slurmd.%n
SlurmdPidFile={dir}/slurmd.%n.pid
SlurmdLogFile={dir}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=10
{nodes}
PartitionName=main Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""
NODE_LINE = ("NodeName={h.name} NodeAddr={h.addr} NodeHostname={h.name} CPUs={cpus} "
             "RealMemory=1000 State=UNKNOWN")


@dataclass
class Slurm:
    """munged, slurmctld on one host and slurmd on the node hosts: ``env_argv()`` prefixes a
    client command (srun, sinfo, ...) with the environment that finds this cluster."""

    net: Network
    dir: Path
    conf: Path
    controller: str
    nodes: list[str]
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    def env_argv(self) -> list[str]:
        return ["env", f"SLURM_CONF={self.conf}"]

    def run(self, *command: str, host: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        """A client command inside host (default: the controller's)."""
        return self.net.run(host or self.controller, *self.env_argv(), *command,
                            timeout=timeout)

    def log(self, daemon: str) -> str:
        path = self.dir / f"{daemon}.log"
        return path.read_text() if path.exists() else ""


@contextmanager
def slurm_cluster(net: Network, controller: str = "h0", nodes: Sequence[str] = ("h1", "h2"),
                  start: Iterable[str] | None = None, cpus: int | None = None,
                  timeout: float = 30.0, workdir: Path | None = None) -> Iterator[Slurm]:
    """A real SLURM on the namespace hosts; every daemon stopped on exit.

    slurm.conf names every node in nodes; slurmd starts on those in start (default: all).

    munged runs in the machine's namespace (it serves a unix socket in the run's folder, which
    every namespace sees); slurmctld runs in controller, ``slurmd -N NAME`` in each node host.
    The started nodes are up (``sinfo``: idle) when this yields. Left behind for a moment
    after exit: zombie slurmstepd, reparented to PID 1 (slurmd double-forks them), until
    PID 1 reaps them."""
    for tool in ("munged", "slurmctld", "slurmd"):
        if shutil.which(tool) is None:
            raise HostsError(f"no {tool}: apt-get install slurm-wlm munge")
    cpus = cpus or os.cpu_count() or 1
    d = Path(tempfile.mkdtemp(prefix="ddpk-slurm-", dir=workdir))
    d.chmod(0o755)  # munged: clients of any user must reach its socket
    slurm = Slurm(net, d, d / "slurm.conf", controller, list(nodes))
    try:
        try:
            (d / "ctld").mkdir()
            (d / "plugstack.conf").write_text("")
            for name in nodes:
                (d / f"slurmd.{name}").mkdir()
            node_lines = "\n".join(NODE_LINE.format(h=net[n], cpus=cpus) for n in nodes)
            slurm.conf.write_text(SLURM_CONF.format(
                ctl=net[controller], hostname=socket.gethostname(), dir=d, ctld_port=6817,
                slurmd_port=6818, nodes=node_lines, names=",".join(nodes)))
            key = d / "munge.key"
            sh(["mungekey", "--create", "--keyfile", str(key)])
            key.chmod(0o600)
            slurm.daemons["munged"] = _start_daemon(
                net, None, d / "munged.out",
                ["munged", "--foreground", f"--key-file={key}", f"--socket={d}/munge.socket",
                 f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                 f"--seed-file={d}/munged.seed"])
            _wait(lambda: (d / "munge.socket").exists(), timeout, "munged", d / "munged.log")
            env = {**os.environ, "SLURM_CONF": str(slurm.conf)}
            slurm.daemons["slurmctld"] = _start_daemon(
                net, controller, d / "slurmctld.out",
                ["slurmctld", "-D", "-i", "-f", str(slurm.conf)], env=env)
            started = list(nodes if start is None else start)
            for name in started:
                slurm.daemons[f"slurmd.{name}"] = _start_daemon(
                    net, name, d / f"slurmd.{name}.out",
                    ["slurmd", "-D", "-N", name, "-f", str(slurm.conf)], env=env)

            def idle() -> bool:
                out = slurm.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10).stdout.split("\n")
                states = dict(line.split() for line in out if line.strip())
                return all(states.get(n) == "idle" for n in started)

            _wait(idle, timeout, "slurm nodes idle", d / "slurmctld.log")
        except HostsError as e:  # with what every daemon said: the error is in one of them
            raise HostsError(f"{e}\n{_tails(d)}") from None
        yield slurm
    finally:
        for name in reversed(list(slurm.daemons)):
            stop_by_pid([slurm.daemons[name].pid])
            slurm.daemons[name].wait(timeout=5)
        shutil.rmtree(d, ignore_errors=True)


def _tails(d: Path, n: int = 12) -> str:
    out = []
    for path in sorted([*d.glob("*.out"), *d.glob("slurmd*.log"), *d.glob("munged.log")]):
        lines = path.read_text(errors="replace").splitlines()[-n:]
        out.append(f"--- {path.name}:\n" + "\n".join(lines))
    return "\n".join(out)


def _start_daemon(net: Network, host: str | None, out: Path, argv: list[str],
                  **kwargs) -> subprocess.Popen:
    """argv in the foreground, in host's network namespace (None: the machine's), output to
    out. nsenter, not ip netns exec: slurmd needs the machine's /sys/fs/cgroup."""
    with open(out, "w") as f:
        kwargs.update(stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if host is None:
            return subprocess.Popen(argv, **kwargs)
        return net.popen(host, *argv, net_only=True, **kwargs)


def _wait(ready, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    text = log.read_text()[-2000:] if log.exists() else "(no log)"
    raise HostsError(f"{what}: not ready after {timeout} s; {log}:\n{text}")
