"""Stress launches and count every failure by its message (not part of the test run).

    ./kit stress --runs 300 --nproc 4              # idle machine
    ./kit stress --runs 300 --nproc 4 --hogs 2     # with two busy-looping CPU hogs
    ./kit stress --runs 100 --bare                 # the same job under bare torchrun

Each run is the trivial DDP job of the benchmark (init_process_group, DDP, one backward,
destroy_process_group). Prints a table of outcomes and writes stress-<label>.json to --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from bench import bare_command, signs

import ddp_kit

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "workers" / "trivial_ddp.py"


def normalise(text: str) -> str:
    """A failure message with the numbers that differ run to run (ports, pids, times) hidden."""
    text = re.sub(r"\[/\S+:\d+\] ", "", text)
    return re.sub(r"\d+", "N", text).strip()[:160]


def kit_run(nproc: int) -> str:
    """One launch through ddp_kit; the outcome as one line."""
    result = ddp_kit.launch(SCRIPT, nproc, output="quiet", check=False)
    if result.ok:
        return "ok" + "".join(f" (note: {normalise(n)})" for n in getattr(result, "notes", []))
    if result.failures:
        root = result.root_cause
        return f"rank failed: {root.type}: {normalise(root.message.splitlines()[0])}"
    output = "".join([*result.stderr, result.agent_log])
    return f"exit {result.returncode}, no rank raised; signs: {signs(output)}"


def bare_run(nproc: int) -> str:
    """One launch under bare torchrun on loopback; the outcome as one line."""
    command, env = bare_command(SCRIPT, nproc, [])
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode == 0:
        return "ok"
    return f"exit {done.returncode}; signs: {signs(done.stdout + done.stderr)}"


def start_hogs(count: int) -> list[subprocess.Popen]:
    """`count` processes that keep one core busy each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Stress launches; count failures by message.")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--hogs", type=int, default=0, help="busy-looping processes meanwhile")
    parser.add_argument("--bare", action="store_true", help="bare torchrun instead of the kit")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "stress")
    args = parser.parse_args(argv)
    label = f"{'bare' if args.bare else 'kit'}-{args.nproc}ranks-{args.hogs}hogs"
    outcomes: collections.Counter[str] = collections.Counter()
    hogs = start_hogs(args.hogs)
    start = time.time()
    try:
        for run in range(args.runs):
            outcome = (bare_run if args.bare else kit_run)(args.nproc)
            outcomes[outcome] += 1
            if outcome != "ok":
                print(f"run {run}: {outcome}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    summary = {"label": label, "runs": args.runs, "seconds": time.time() - start,
               "outcomes": dict(outcomes.most_common())}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"stress-{label}.json").write_text(json.dumps(summary, indent=2))
    print(f"== {label}: {args.runs} runs in {summary['seconds']:.0f} s ==")
    for outcome, count in outcomes.most_common():
        print(f"{count:5d}  {outcome}")
    return summary


if __name__ == "__main__":
    main()
