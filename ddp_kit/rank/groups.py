"""Process groups that a rank's code destroys are freed at a safe point, and a re-initialised
world gets a fresh name. Two torch behaviours otherwise can hang a rank that inits, destroys
and inits again (the PyTorch DDP tutorial's demos adapted to torchrun, tests/workers/tutorial.py,
run one after the other in one process or as cells on live ranks); docs/upstream.md has the
reproductions and the rates.

1. A deadlock freeing a group. Symptom (py-spy --native; no message, the rank just stops):
   the main thread in `pybind11_object_dealloc -> c10d::Reducer::~Reducer ->
   c10d::ProcessGroupGloo::~ProcessGroupGloo -> std::thread::join`, a gloo thread in
   `c10d::AsyncAllreduceWork::~AsyncAllreduceWork -> at::ThreadLocalState::~ThreadLocalState
   -> c10::SafePyObject -> pybind11::gil_scoped_acquire`. Every backward pass stashes a Python
   object (its `contextvars` context) in the thread-local state, and each collective DDP
   launches during backward keeps a copy of that state. When a gloo thread drops the last
   reference to such a finished work it needs the GIL, while the main thread, freeing the DDP
   model right after its step, holds the GIL and waits for that thread to end.
   The Reducer is bound to Python with a plain shared_ptr, so its destructor runs with the GIL
   held; a Python ProcessGroup is bound with IntrusivePtrNoGilDestructor, which releases the
   GIL before the group's destructor runs (both holders are in torch 2.13's libtorch_python).
   Fix: `destroy_process_group` keeps the Python ProcessGroup objects it removes, so a DDP
   model freed right after its step does not drop its group's last reference; `release()`
   drops them, and with them, GIL released, the groups: at the end of a live cell, or at the
   next destroy_process_group (a script that makes and destroys many groups keeps one
   generation); the last generation of a script is kept until the rank exits (runner.end_rank).
   A model that outlives that frees its group through the Reducer later:
   normally long after its last work, but that path is neither guarded nor watched.
2. A hang in the second `init_process_group`. Symptom: both ranks in
   `gloo::rendezvous::Context::connectFullMesh -> gloo::transport::tcp::Pair::waitUntilConnected`.
   Destroying the world resets torch's group counter, so the new world has the old one's name
   ("0") and its keys in torchrun's store; a rank can read the old world's addresses there
   before the other rank has replaced them. Fix: the counter is put back after the world is
   destroyed, so every world of the process has its own name (and its own keys).
3. A 5 s stall in some `init_process_group` calls (docs/upstream.md, section 5). Every
   init under torchrun opens a new connection to the agent's store, and torch formats the
   socket's addresses with a reverse DNS lookup of 127.0.0.1 (as ::ffff:127.0.0.1, which
   /etc/hosts does not name); where the DNS server drops one query, the resolver waits its
   5 s timeout. Fix: a rank opens that connection once and every later world of the process
   reuses it (each world's keys have their own prefix: 2.), so re-inits look nothing up.
"""

from __future__ import annotations

import functools
from typing import Any

_kept: list[Any] = []


def install() -> None:
    """Make torch.distributed's destroy_process_group keep the groups it removes."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    destroy = c10d.destroy_process_group
    if getattr(destroy, "__wrapped__", None) is not None:
        return  # installed already

    @functools.wraps(destroy)
    def destroy_process_group(group: Any = None) -> None:
        world = group is None or group is c10d.GroupMember.WORLD
        removed = list(c10d._world.pg_map) if world else [group]
        count = c10d._world.group_count
        release()  # the groups an earlier call kept
        destroy(group)
        _kept.extend(removed)
        if world:
            c10d._world.group_count = count  # the next world gets a name (and keys) of its own

    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group
    _reuse_agent_store()


_stores: dict[tuple, Any] = {}


def _reuse_agent_store() -> None:
    """Under torchrun, init_process_group's env:// rendezvous connects to the agent's store
    anew for every world; open that connection once per rank and reuse it (3. above)."""
    import sys

    import torch.distributed.rendezvous  # noqa: F401  (the package's `rendezvous` is a function)

    rendezvous = sys.modules["torch.distributed.rendezvous"]
    create = rendezvous._create_c10d_store
    if getattr(create, "__wrapped__", None) is not None:
        return

    @functools.wraps(create)
    def create_c10d_store(hostname, port, rank, world_size, timeout, *args, **kwargs):
        if not rendezvous._torchelastic_use_agent_store():  # a store of rank 0's: made anew
            return create(hostname, port, rank, world_size, timeout, *args, **kwargs)
        key = (hostname, port, world_size)
        if key not in _stores:
            _stores[key] = create(hostname, port, rank, world_size, timeout, *args, **kwargs)
        store = _stores[key]
        store.set_timeout(timeout)
        return store

    rendezvous._create_c10d_store = create_c10d_store


def kept() -> int:
    """How many destroyed groups wait to be freed."""
    return len(_kept)


def release() -> None:
    """Free the destroyed groups: their Python objects release the GIL while gloo's threads end
    (a DDP model still alive keeps its group until the model goes, long after its last work)."""
    _kept.clear()


def free_all() -> None:
    """Destroy every process group of this rank and free it (after a collective timed out,
    the groups cannot be trusted; the rank's variables are kept)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    release()
