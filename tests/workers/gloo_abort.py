"""Does a gloo group's abort() or shutdown() end a collective that is waiting? Rank 0 waits in
an all_reduce that rank 1 never joins (rank 1 stays alive, its connections open); 1 s in,
another thread of rank 0 calls the group's abort(), then shutdown(). Rank 0 prints when the
calls returned and when the wait ended, and how (argv[1]: the collective timeout in seconds)."""

import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

timeout = float(sys.argv[1])
dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
start = time.monotonic()
if dist.get_rank() == 0:
    group = dist.group.WORLD

    def end_it() -> None:
        time.sleep(1)
        group.abort()
        group.shutdown()
        print(f"abort and shutdown returned at {time.monotonic() - start:.1f} s", flush=True)

    threading.Thread(target=end_it, daemon=True).start()
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError as error:
        print(f"the wait ended at {time.monotonic() - start:.1f} s: {'Timed out' in str(error)}")
else:
    time.sleep(timeout + 2)
