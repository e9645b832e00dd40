"""`python -m ddp_kit.rank.probe PATH...`: what the kernel asks a host before a launch over several
hosts (kernel.hosts), in one line of JSON on stdout:

    python, torch, kit   the Python and torch versions and the kit's folder (its real path)
                         this host would run (they must equal the kernel's)
    executable           the Python that answered
    address              the host's address as the kernel reached it: over ssh, SSH_CONNECTION's
                         server side; under srun, the address this node uses toward srun's host
                         (SLURM_SRUN_COMM_HOST, an IP address); else null
    interfaces           {name: [[IPv4 address, netmask], ...]}: where the kernel chooses
                         GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, by the first host's address
    missing              the PATHs (a file the kernel made in its temporary folder, its working
                         directory, the script) this host does not see: the kit needs a
                         filesystem that every host shares (as clusters have), same paths
    port                 a TCP port free on `address` now (the first host's is the rendezvous's)
    gpus                 the CUDA GPUs this host's torch sees
                         (The probe imports torch only where a GPU may be: on a host with no
                         GPU device file, or with a torch built for CPU only, it answers from
                         torch/version.py (shared.torch_build), in a tenth of the time.)
    node                 the node's name under srun (SLURMD_NODENAME), else null
"""

from __future__ import annotations

import json
import os
import socket
import sys

from ..shared import torch_build


def address_toward(address: str) -> str:
    """This machine's own address on the way to `address` (the route's source address; a UDP
    socket sends nothing to learn it). The kernel uses it too (kernel.hosts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        return sock.getsockname()[0]


def own_address() -> str | None:
    """This host's address as the kernel reached it (see the module's docstring). Under srun,
    SSH_CONNECTION may be the kernel's own, sent along with its environment: srun comes first."""
    if os.environ.get("SLURMD_NODENAME") and os.environ.get("SLURM_SRUN_COMM_HOST"):
        return address_toward(os.environ["SLURM_SRUN_COMM_HOST"])
    connection = os.environ.get("SSH_CONNECTION", "").split()
    return connection[2] if len(connection) == 4 else None


def facts(paths: list[str]) -> dict:
    import psutil

    import ddp_kit

    address = own_address()
    interfaces = {name: [[a.address, a.netmask] for a in found if a.family == socket.AF_INET]
                  for name, found in psutil.net_if_addrs().items()}  # fmt: skip
    with socket.socket() as sock:
        sock.bind((address or "127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {
        "python": sys.version.split()[0],
        "torch": torch_build.version(),
        "kit": os.path.dirname(os.path.realpath(ddp_kit.__file__)),
        "executable": sys.executable,
        "address": address,
        "interfaces": {k: v for k, v in interfaces.items() if v},
        "missing": [path for path in paths if not os.path.exists(path)],
        "port": port,
        "gpus": torch_build.cuda_device_count(trust_device_files=True),
        "node": os.environ.get("SLURMD_NODENAME"),
    }


def main() -> None:
    print(json.dumps(facts(sys.argv[1:])), flush=True)


if __name__ == "__main__":
    main()
