"""torch 2.13: torch.distributed.nn, imported after init_process_group, keeps that group alive.

Its functions take `group=group.WORLD` as a default argument, evaluated at import, so ten of
them hold the group that exists then; destroy_process_group cannot free it, and gloo's threads
run until the interpreter's teardown. DDP's constructor imports it (through torch._dynamo).
Prints the number of threads: alone, after a world, after a world that imported it, after
another world."""

import os

import torch.distributed as dist


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def world(then_import: bool) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if then_import:
        import torch.distributed.nn  # noqa: F401
    dist.destroy_process_group()


alone = threads()
world(then_import=False)
freed = threads()
world(then_import=True)
pinned = threads()
world(then_import=False)
print(alone, freed, pinned, threads())
