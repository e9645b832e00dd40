"""Inside the ranks: an emulated slow network link, as a DDP communication hook.

On one machine the ranks' all-reduces cross no wire: gloo copies through loopback sockets on
the same few cores, so for the lessons' models communication costs little next to backward,
and bucketing seems not to matter. To see what it does on a real network, `slow_link_hook`
makes each bucket's all-reduce take as long as it would on a named link, and no less:

1. it runs the REAL all-reduce (PyTorch's `allreduce_hook`: divide by the world size, sum), so
   the gradients are exactly those DDP computes without a hook when the world size is a power
   of two (otherwise they may differ in the last bit: DDP multiplies by 1/N, the hook divides);
2. it works out when the bucket would be through the link: the link carries one bucket at a
   time, so bucket k goes on the wire when it is launched or when bucket k-1 is through,
   whichever is later, and takes `EmulatedLink.model.seconds(bytes)` there;
3. a thread of the link's completes the bucket's future at that time, or when the real
   all-reduce is done if that is later. Until then DDP waits for it only at the end of
   backward: backward goes on computing the earlier layers' gradients meanwhile, which is the
   overlap that bucketing buys.

Emulated, not measured: the time on the wire is the alpha-beta model of a ring all-reduce
(costmodel.ring_link: 2(N-1) messages of S/N bytes per rank, each costing the link's latency),
added on top of a real all-reduce that is usually faster. A real network also has congestion,
other traffic, and protocol overheads (TCP, NCCL's channels) that this leaves out. Each rank
starts the link's clock at its own launch of the bucket, so a rank that launches a little
before the others may see the link through that much early (the real all-reduce still waits
for every rank). Times are time.time(), as GradientRecorder's, to be compared with them.
(No `from __future__ import annotations` here: DDP checks the hook's `bucket` annotation at run
time and needs the real dist.GradBucket class.)
"""

import queue
import threading
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .costmodel import AlphaBeta, ring_link

LINKS = {  # name -> (latency in seconds, bandwidth in bytes/s) of one link; round figures
    "1 Gbit/s Ethernet": (50e-6, 1e9 / 8),
    "10 Gbit/s Ethernet": (20e-6, 10e9 / 8),
    "1 Gbit/s, 1 ms away": (1e-3, 1e9 / 8),  # the same bandwidth, between data centres of a region
}


class EmulatedLink:
    """The state of `slow_link_hook`: a ring of the group's ranks over links of `latency`
    seconds and `bandwidth` bytes per second (see LINKS).

    `events` lists every bucket it carried, in launch order, as a dict: index, bytes, launched
    (time.time()), on_wire (when the link took it), through (when the model says it is through),
    reduced (when the real all-reduce was done) and done (when its future was completed).
    """

    def __init__(
        self, latency: float, bandwidth: float, process_group: dist.ProcessGroup | None = None
    ) -> None:
        self.process_group = process_group
        group = process_group or dist.group.WORLD
        self.model: AlphaBeta = ring_link(latency, bandwidth, dist.get_world_size(group))
        self.free_at = 0.0  # when the link is through with the last bucket given to it
        self.events: list[dict[str, Any]] = []
        self._due: queue.SimpleQueue = queue.SimpleQueue()
        # the thread holds the queue, not the link: when the link is collected, it is told to end
        threading.Thread(target=_complete, args=(self._due,), name="emulated-link",
                         daemon=True).start()  # fmt: skip
        weakref.finalize(self, self._due.put, None)

    def send(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Run the bucket's real all-reduce; return a future done when the link is through."""
        launched = time.time()
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        on_wire = max(launched, self.free_at)
        self.free_at = on_wire + float(self.model.seconds(nbytes))
        event = {"index": bucket.index(), "bytes": nbytes, "launched": launched,
                 "on_wire": on_wire, "through": self.free_at}  # fmt: skip
        self.events.append(event)
        real = default_hooks.allreduce_hook(self.process_group, bucket)
        delivered: torch.futures.Future = torch.futures.Future()
        self._due.put((event, real, delivered))
        return delivered


def _complete(due: queue.SimpleQueue) -> None:
    """A link's thread: complete each future once its bucket is through (in launch order, the
    order the link sends them in); end at None (the link was collected)."""
    while (item := due.get()) is not None:
        event, real, delivered = item
        try:
            value = real.wait()  # the real all-reduce (gloo's threads do it)
        except Exception as error:  # a failed all-reduce fails the step, as without a hook
            delivered.set_exception(error)
            continue
        event["reduced"] = time.time()
        time.sleep(max(0.0, event["through"] - time.time()))
        event["done"] = time.time()
        delivered.set_result(value)


def slow_link_hook(
    state: EmulatedLink, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the real all-reduce, done no sooner than the emulated link
    `state` would be through with it (`model.register_comm_hook(EmulatedLink(...),
    slow_link_hook)`)."""
    return state.send(bucket)
