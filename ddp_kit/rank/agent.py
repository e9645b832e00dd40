"""`python -m ddp_kit.rank.agent ARGS`: torchrun that ends with the kernel that started it."""

from __future__ import annotations

import signal
import sys

from ..shared.processes import die_with_parent


def main() -> None:
    """Run torchrun with `sys.argv`; SIGTERM it (it then stops its ranks) if its parent dies."""
    die_with_parent(signal.SIGTERM)
    from torch.distributed.run import main as torchrun_main

    sys.argv[0] = "torchrun"
    torchrun_main()


if __name__ == "__main__":
    main()
