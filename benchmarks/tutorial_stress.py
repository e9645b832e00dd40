"""Run the PyTorch DDP tutorial's demos again and again, three ways, and count the hangs by stack
(not part of the test run).

    ./kit stress-tutorial --runs 100                       # every demo, every way
    ./kit stress-tutorial --runs 30 --ways bare --demos both

The demos are tests/workers/tutorial.py (CPU-adapted: no `.to(rank)`, no `device_ids`, rank and
world size from torchrun). `basic` and `checkpoint` run one demo, `both` runs the tutorial's main
(init, destroy, init again in one process). The ways:

    live  a demo as a cell on 2 live ranks (one session; restarted after a hang)
    kit   the demo script as a %%torchrun cell's text, through ddp_kit.launch
    bare  the demo script under plain torchrun

A run still going after --hang seconds is a hang: py-spy (when installed) dumps every rank's
stack, and the hang is counted by the stack's signature (see SIGNATURES).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import bare_command

import ddp_kit
from ddp_kit.shared.processes import descendants, stop_tree

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "tests" / "workers" / "tutorial.py"
DEFINITIONS = TUTORIAL.read_text().split('\nif __name__ == "__main__":')[0]
CALLS = {"basic": ["demo_basic"], "checkpoint": ["demo_checkpoint"],
         "both": ["demo_basic", "demo_checkpoint"]}  # fmt: skip
SIGNATURES = {  # a C++ frame on some rank's stack -> what hung
    "c10d::ProcessGroupGloo::~ProcessGroupGloo": "teardown: ~ProcessGroupGloo joins a gloo thread "
    "that waits for the GIL",
    "gloo::transport::tcp::Pair::waitUntilConnected": "init: connectFullMesh waits for a pair",
    "c10d::TCPStore::doWait": "init: waiting in the store",
    "c10d::Work::wait": "a collective waits (after a second init: pairs of the old world)",
}


def demo_script(demo: str) -> str:
    """The tutorial as a script that runs `demo` (both: the tutorial's main)."""
    return DEFINITIONS + "\n\n" + "".join(f"run_demo({call})\n" for call in CALLS[demo])


def stacks(pids: list[int]) -> str:
    """Every pid's native stack (py-spy), or '' without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return ""
    dumps = [subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True,
                            text=True, timeout=30).stdout for pid in pids]  # fmt: skip
    return "\n".join(dumps)


def classify(stack: str) -> str:
    found = [what for frame, what in SIGNATURES.items() if frame in stack]
    return "hang: " + ("; ".join(found) if found else "stack not recognised" if stack else
                       "no stack (py-spy missing)")  # fmt: skip


def bare_run(demo: str, hang: float, work: Path) -> str:
    script = work / f"tutorial_{demo}.py"
    script.write_text(demo_script(demo))
    command, env = bare_command(script, 2, [])
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=hang)
    except subprocess.TimeoutExpired:
        outcome = classify(stacks([p.pid for p in descendants(proc.pid)]))
        stop_tree(proc.pid)
        proc.communicate()
        return outcome
    if proc.returncode == 0:
        return "ok"
    return (
        f"exit {proc.returncode}: "
        + next((line for line in err.splitlines() if "Error" in line or "terminate" in line), "")[
            :120
        ]
    )


def kit_run(demo: str, hang: float, work: Path) -> str:
    result = ddp_kit.launch(demo_script(demo), 2, timeout=hang, output="quiet", check=False)
    if result.ok:
        return "ok"
    if result.failures:
        root = result.root_cause
        return f"rank failed: {root.type}: {root.message.splitlines()[0][:120]}"
    return f"exit {result.returncode}: {''.join(result.stderr)[-200:]}"


class Live:
    """One 2-rank session; a hang is dumped (py-spy) from a timer while the cell waits."""

    def __init__(self, hang: float) -> None:
        self.hang = hang
        self.session = ddp_kit.Session(2, cell_timeout=hang, output="quiet")
        self.session.run(DEFINITIONS)

    def run(self, demo: str, hang: float, work: Path) -> str:
        import threading

        dump: list[str] = []
        timer = threading.Timer(hang * 0.8, lambda: dump.append(
            stacks(list(self.session.pids.values()))))  # fmt: skip
        timer.start()
        try:
            for call in CALLS[demo]:
                self.session.run(f"run_demo({call})")
            return "ok"
        except Exception as error:  # noqa: BLE001  a hang or a failure: counted, then go on
            timer.join()
            outcome = classify(dump[0]) if dump else f"{type(error).__name__}: {error}"[:160]
            self.session.restart()
            self.session.run(DEFINITIONS)
            return outcome
        finally:
            timer.cancel()

    def close(self) -> None:
        self.session.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="The DDP tutorial's demos, counted by stack.")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ways", nargs="+", default=["live", "kit", "bare"])
    parser.add_argument("--demos", nargs="+", default=list(CALLS))
    parser.add_argument("--hang", type=float, default=20.0, help="seconds that make a hang")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "stress")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for way in args.ways:
        live = Live(args.hang) if way == "live" else None
        run = live.run if live else {"kit": kit_run, "bare": bare_run}[way]
        for demo in args.demos:
            outcomes: collections.Counter[str] = collections.Counter()
            start = time.time()
            for i in range(args.runs):
                outcome = run(demo, args.hang, args.out)
                outcomes[outcome] += 1
                if outcome != "ok":
                    print(f"{way} {demo} run {i}: {outcome}", flush=True)
            label = f"{way}-{demo}"
            summary[label] = {"runs": args.runs, "seconds": round(time.time() - start),
                              "outcomes": dict(outcomes.most_common())}  # fmt: skip
            print(f"== {label}: {summary[label]}", flush=True)
        if live:
            live.close()
    (args.out / "stress-tutorial.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
