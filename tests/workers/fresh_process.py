"""What a rank sees of its process: printed as one line of JSON per rank, to compare a fast
start (forked by the fork server) with a plain one (a fresh Python).

    fresh_process.py [exit CODE | kill SIGNAL]   rank 1 ends so, after printing

(Words, not options: torchrun's parser rejects `--signal` as an ambiguous abbreviation of its
`--signals-to-handle`.)
"""

import json
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import psutil
import torch
import torch.distributed as dist

seen = {
    "name": __name__,
    "main_file": sys.modules["__main__"].__file__,
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "env": {
        k: os.environ.get(k)
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    },  # fmt: skip
    "master_port": os.environ["MASTER_PORT"].isdigit(),
    "stdout_write_through": sys.stdout.write_through,  # python -u
    "cuda_initialized": torch.cuda.is_initialized(),
    "process_group": dist.is_initialized(),
    "debug_level": str(dist.get_debug_level()),  # from TORCH_DISTRIBUTED_DEBUG
    "threads": sorted(t.name for t in threading.enumerate()),
    "os_threads": len(os.listdir("/proc/self/task")),
    "session_leader": os.getsid(0) == os.getpid(),
    "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "torch_seed": torch.initial_seed(),
    "random": random.random(),
    "numpy_random": float(np.random.rand()),
    "forked": "ddp_kit.rank.forkserver" in " ".join(psutil.Process().cmdline()),  # the server's
}
print(json.dumps(seen), flush=True)
print(f"stderr of rank {os.environ['RANK']}", file=sys.stderr, flush=True)
# Rank 1 ends only once rank 0 has printed: its end makes torchrun stop rank 0, maybe sooner.
printed = os.path.join(os.environ["DDP_KIT_RECORD_DIR"], "..", "rank0-printed")
if os.environ["RANK"] == "0":
    open(printed, "w").close()
elif sys.argv[1:2]:
    for _ in range(300):
        if os.path.exists(printed):
            break
        time.sleep(0.05)
if os.environ["RANK"] == "1" and sys.argv[1:2] == ["exit"]:
    sys.exit(int(sys.argv[2]))
if os.environ["RANK"] == "1" and sys.argv[1:2] == ["kill"]:
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
