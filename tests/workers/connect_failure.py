"""Rank 1's init_process_group fails where gloo raises when it cannot connect the ranks (the
ProcessGroupGloo constructor), with gloo's own message: the transient failure, on demand.

usage: connect_failure.py FOLDER MODE
       (in a live cell: total = main(FOLDER, MODE, keep_group=True))

MODE  once    rank 1 fails the first time only (FOLDER/failed remembers it)
      always  rank 1 fails every time
      print   as once, but rank 0 prints before init_process_group
Rank 0 appends its record directory to FOLDER/runs.txt, so the test counts the launches.
"""

import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddp_kit.worker import backend, rank, record

GLOO_MESSAGE = (
    "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/"
    "transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:22410"
)


def cannot_connect(*args, **kwargs):
    raise RuntimeError(GLOO_MESSAGE)


def main(folder: str, mode: str, keep_group: bool = False) -> torch.Tensor:
    folder = pathlib.Path(folder)
    if rank() == 0:
        with open(folder / "runs.txt", "a") as runs:
            runs.write(os.environ["DDP_KIT_RECORD_DIR"] + "\n")
        if mode == "print":
            print("rank 0 starts")
    if rank() == 1 and (mode == "always" or not (folder / "failed").exists()):
        (folder / "failed").touch()
        c10d.ProcessGroupGloo = cannot_connect
    dist.init_process_group(backend())
    total = torch.ones(1)
    dist.all_reduce(total)
    record("total", total)
    if not keep_group:  # a live cell keeps its process group, as in class
        dist.destroy_process_group()
    return total


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
