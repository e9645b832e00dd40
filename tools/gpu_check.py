"""`./kit gpu-check`'s Python half: the offline wheelhouse, and the check itself.

    python tools/gpu_check.py prepare [--python-version 3.12] [--wheelhouse wheelhouse-gpu]
    python tools/gpu_check.py run --out DIR [--deadline-at EPOCH] [--jobs N] [--cpu] ...

prepare (on a machine with PyPI): pip downloads, for the GPU machine's Python, every wheel the
check needs beyond torch (REQUIREMENTS, the kit's own runtime needs without torch and
jupyterlab, with all their dependencies) and builds the kit's own wheel, so that the GPU
machine installs everything with no network and no build backend. The folder must fit what one
device run may carry (CARRY_LIMIT).

run (in .venv-gpu, where everything is installed): the machine's facts (torch, CUDA, NCCL, GPUs),
then, with a GPU, the GPU tests (`pytest -m gpu tests`) and every notebook under nbval in lax
mode (errors only, no output comparison), several notebooks at a time, each in its own pytest
with a timeout, all within an overall deadline. With fewer GPUs than 4 every notebook runs a
second time in the shared GPU mode (DDP_KIT_SHARED_GPU=1, ddp_kit.kernel.backend: gloo with
the ranks sharing the GPUs), so that every lesson's device placement runs on CUDA. A notebook
that needs a newer torch than this one is skipped with the reason (NEEDS). The summary,
summary.json and summary.md under --out, is rewritten after every result, so a run cut short
still leaves what it found. Without a GPU it stops once everything imports (exit NO_GPU), unless
--cpu runs the whole check on CPU (a rehearsal).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY_LIMIT = 64 * 2**20  # what one device run carries, all paths together
NO_GPU = 3  # run's exit status when everything is installed but there is no CUDA GPU
SETUP_FAILED = 2

# What the check imports beyond torch and the kit: the test tools, and the kit's own runtime
# needs (pyproject's dependencies without torch, which the machine has, and jupyterlab, which
# the check never starts). Versions as pyproject.toml asks.
TEST_REQUIREMENTS = ["pytest>=8", "nbval>=0.11", "nbclient", "nbformat", "ipykernel"]
NOT_NEEDED = {"torch", "jupyterlab"}
IMPORTS = ["pytest", "nbval", "nbclient", "nbformat", "ipykernel", "ipywidgets", "IPython",
           "matplotlib", "numpy", "psutil", "ddp_kit", "ddp_kit.kernel.launch"]  # fmt: skip
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"]  # fmt: skip


def kit_requirements() -> list[str]:
    """pyproject.toml's runtime dependencies that the check needs (all but NOT_NEEDED)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml: no dependencies list"
    names = re.findall(r'^\s*"([^"]+)"', block.group(1), re.M)
    return [r for r in names if re.split(r"[<>=!~ ;\[]", r)[0] not in NOT_NEEDED]


def requirements() -> list[str]:
    """Everything the wheelhouse must hold (the kit's own wheel aside)."""
    return kit_requirements() + TEST_REQUIREMENTS


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def working_tree_bytes() -> int:
    """What a device run copies besides the carried paths: tracked and unignored files."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                                capture_output=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return 0
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return sum(p.stat().st_size for p in paths if p.is_file())


def prepare(wheelhouse: Path, python_version: str) -> int:
    """Download the wheels for `python_version` on x86_64 Linux and build the kit's wheel."""
    begin = time.monotonic()
    if wheelhouse.exists():
        shutil.rmtree(wheelhouse)
    wheelhouse.mkdir(parents=True)
    needs = requirements()
    (wheelhouse / "requirements.txt").write_text("\n".join(needs) + "\n")
    (wheelhouse / "target.json").write_text(json.dumps({"python_version": python_version}))
    abi = "cp" + python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheelhouse),
               "--only-binary=:all:", "--implementation", "cp", "--python-version",
               python_version, "--abi", abi, "--abi", "abi3", "--abi", "none",
               *(f"--platform={p}" for p in PLATFORMS), *needs]  # fmt: skip
    print(f"gpu-check --prepare: wheels for CPython {python_version} into {wheelhouse}/")
    subprocess.run(command, check=True)
    with tempfile.TemporaryDirectory() as scratch:  # a copy: build/ would keep stale files
        source = Path(scratch) / "source"
        skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
        for folder in ("ddp_kit", "notebooks", "examples"):
            shutil.copytree(ROOT / folder, source / folder, ignore=skip)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, source / name)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--wheel-dir", str(wheelhouse), str(source)], check=True)  # fmt: skip
    size, tree = folder_bytes(wheelhouse), working_tree_bytes()
    wheels = len(list(wheelhouse.glob("*.whl")))
    print(f"gpu-check --prepare: {wheels} wheels, {size / 2**20:.1f} MiB (with the working "
          f"tree's {tree / 2**20:.1f} MiB: {(size + tree) / 2**20:.1f} MiB), in "
          f"{time.monotonic() - begin:.0f} s")  # fmt: skip
    if size + tree > CARRY_LIMIT:
        print(f"gpu-check --prepare: {wheelhouse}/ and the working tree are "
              f"{(size + tree) / 2**20:.1f} MiB, over the {CARRY_LIMIT // 2**20} MiB a device "
              "run carries.", file=sys.stderr)  # fmt: skip
        return 1
    print(f"gpu-check --prepare: carry {wheelhouse} to the GPU machine, then ./kit gpu-check")
    return 0


# -- the check -------------------------------------------------------------------------------

# notebook -> (what it needs, whether this torch has it); checked by feature, named by version
NEEDS = {
    "14_sharding_zero_fsdp": (
        "torch >= 2.13: it counts FSDP2's all_gather_single / reduce_scatter_single, which "
        "fully_shard calls from 2.13 on (older torch: all_gather_into_tensor, "
        "reduce_scatter_tensor)",
        lambda dist: hasattr(dist, "all_gather_single"),
    ),
    "27_torch_compile": (
        "torch >= 2.13: it asserts the graph breaks, graph sizes and error text of torch 2.13's "
        "dynamo, which change between releases",
        lambda dist: hasattr(dist, "all_gather_single"),   # new in 2.13, as for notebook 14
    ),
}


@dataclass
class Task:
    """One unit of the check: the GPU tests, or one notebook in one mode."""

    name: str  # "gpu-tests" or the notebook's stem
    mode: str  # "tests", "auto" or "shared-gpu"
    placement: str = ""  # where its ranks run, by rank count: "2 ranks: nccl on cuda; ..."
    status: str = "pending"  # pending, running, ok, failed, unfinished (deadline), skipped
    reason: str = ""  # a skip's reason, a failure's first error line
    seconds: float = 0.0
    log: str = ""
    tests: dict[str, str] = field(default_factory=dict)  # GPU tests: test -> outcome


@dataclass
class Check:
    out: Path
    facts: dict
    tasks: list[Task]
    started: float = field(default_factory=time.time)
    state: str = "running"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self) -> None:
        """summary.json and summary.md, each replaced whole (a reader never sees half)."""
        with self.lock:
            data = {"state": self.state, "seconds": round(time.time() - self.started, 1),
                    **self.facts, "results": [asdict(t) for t in self.tasks]}  # fmt: skip
            for name, text in (("summary.json", json.dumps(data, indent=1)),
                               ("summary.md", self.markdown(data))):  # fmt: skip
                part = self.out / f".{name}.part"
                part.write_text(text + "\n")
                part.replace(self.out / name)

    @staticmethod
    def markdown(data: dict) -> str:
        counts: dict[str, int] = {}
        for t in data["results"]:
            counts[t["status"]] = counts.get(t["status"], 0) + 1
        lines = [f"# gpu-check: {data['state']} ({data['seconds']} s)", ""]
        lines += [f"- {key}: {data[key]}" for key in
                  ("python", "torch", "cuda", "nccl", "gpus", "gpu_names", "kit")]  # fmt: skip
        lines += [f"- results: {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}", ""]
        lines += ["| what | mode | status | s | placement / reason |", "|---|---|---|---|---|"]
        for t in data["results"]:
            detail = t["reason"] or t["placement"]
            lines.append(f"| {t['name']} | {t['mode']} | {t['status']} | {t['seconds']:.0f} | "
                         f"{detail.replace('|', '/')} |")  # fmt: skip
            for test, outcome in t["tests"].items():
                lines.append(f"| - {test} | | {outcome.replace('|', '/')} | | |")
        return "\n".join(lines)


def machine_facts() -> dict:
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = None
    if torch.version.cuda and dist.is_nccl_available():  # the library's own, no GPU needed
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception as error:  # noqa: BLE001 - the summary says what went wrong
            nccl = f"unknown ({type(error).__name__}: {error})"
    return {
        "python": f"{platform.python_version()} ({sys.executable})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "cpu_cores": os.cpu_count(),
    }


def kit_source() -> str:
    """Where ddp_kit comes from, and whether its modules are the checkout's."""
    import ddp_kit

    installed = Path(ddp_kit.__file__).resolve().parent
    if installed == ROOT / "ddp_kit":
        return f"the checkout ({installed})"
    differ = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ddp_kit").rglob("*.py")
                    if not (installed / p.relative_to(ROOT / "ddp_kit")).exists()
                    or (installed / p.relative_to(ROOT / "ddp_kit")).read_bytes()
                    != p.read_bytes())  # fmt: skip
    if differ:
        return (f"STALE wheel at {installed}: differs from the checkout in {', '.join(differ)} "
                "(run ./kit gpu-check --prepare again)")  # fmt: skip
    return f"a wheel equal to the checkout ({installed})"


def notebook_ranks(path: Path) -> list[int]:
    """The rank counts a notebook launches (-n N, nproc=N in its code cells)."""
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return sorted({int(n) for n in re.findall(r"(?:-n|--nproc|nproc=)\s*(\d+)", code)})


def places_on_device(path: Path) -> bool:
    """Whether a notebook's code puts anything on worker.device() (or passes device_ids)."""
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return bool(re.search(r"\bdevice\(\)|\bdevice_ids\b", code))


def placement(ranks: list[int], gpus: int, shared: bool) -> str:
    from ddp_kit.kernel.backend import choose_backend

    parts = []
    for n in ranks:
        choice = choose_backend(n, "auto", gpus=gpus, shared_gpu=shared)
        parts.append(f"{n} ranks: {choice.backend} on {choice.device}")
    return "; ".join(parts)


def first_error(junit: Path, log: str) -> str:
    """The first line that names an error: from pytest's JUnit report, else from its log."""
    texts = []
    if junit.exists():
        try:
            for node in ET.parse(junit).iter():
                if node.tag in ("failure", "error"):
                    texts.append((node.get("message") or "") + "\n" + (node.text or ""))
        except ET.ParseError:
            pass
    texts.append(log)
    pattern = re.compile(r"^\s*(?:E\s+)?([\w.]*(?:Error|Exception|Timeout|Interrupted)\b.*)$", re.M)
    for text in texts:
        clean = re.sub(r"\x1b\[[0-9;]*m", "", text)
        match = pattern.search(clean)
        if match:
            return match.group(1).strip()[:300]
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()[:300]
    return ""


def kill_tree(proc: subprocess.Popen) -> None:
    """End a pytest and everything below it (kernels start their own sessions; ranks theirs)."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def run_task(task: Task, check: Check, args: argparse.Namespace, deadline: float) -> None:
    left = deadline - time.time()
    if left < 20:
        task.status, task.reason = "skipped", "the overall deadline came first"
        check.write()
        return
    logs = check.out / "logs"
    label = f"{task.mode}-{task.name}"
    junit = logs / f"{label}.xml"
    env = dict(os.environ, DDP_KIT_CPU_KERNELS="native",
               DDP_KIT_NOTES_FILE=str(logs / f"{label}.notes.txt"))  # fmt: skip
    env.pop("DDP_KIT_TEST_RUN", None)  # each pytest its own marker: orphans are counted apart
    common = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
              f"--junitxml={junit}"]  # fmt: skip
    if task.mode == "tests":
        command, limit = [*common, "-m", "gpu", "tests"], args.tests_timeout
    else:
        env["DDP_KIT_SHARED_GPU"] = "1" if task.mode == "shared-gpu" else "0"
        command = [*common, "--nbval-lax", f"--nbval-cell-timeout={args.cell_timeout}",
                   f"notebooks/{task.name}.ipynb"]  # fmt: skip
        limit = args.notebook_timeout
    limit = min(limit, left - 10)
    task.status, task.log = "running", str((logs / f"{label}.log").relative_to(check.out))
    check.write()
    begin = time.monotonic()
    with open(logs / f"{label}.log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(limit)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            code = None
    task.seconds = round(time.monotonic() - begin, 1)
    text = (logs / f"{label}.log").read_text(errors="replace")
    if task.mode == "tests":
        task.tests = junit_outcomes(junit)
    if code is None:
        cut = limit < (args.tests_timeout if task.mode == "tests" else args.notebook_timeout)
        task.status = "unfinished" if cut else "failed"
        why = "cut at the overall deadline" if cut else "timed out"
        task.reason = f"{why} after {limit:.0f} s; last line: {last_line(text)}"
    elif code == 0:
        task.status = "ok"
    else:
        task.status, task.reason = "failed", first_error(junit, text) or f"pytest exit {code}"
    check.write()
    print(f"gpu-check: {task.mode:10} {task.name:28} {task.status:7} {task.seconds:6.0f} s "
          f"{task.reason[:120]}", flush=True)  # fmt: skip


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else "(no output)"


def junit_outcomes(junit: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    if not junit.exists():
        return outcomes
    try:
        cases = list(ET.parse(junit).iter("testcase"))
    except ET.ParseError:
        return outcomes
    for case in cases:
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed: " + (child.get("message") or "").splitlines()[0][:200]
            elif child.tag == "skipped":
                outcome = "skipped: " + (child.get("message") or "")[:200]
        outcomes[name] = outcome
    return outcomes


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    deadline = args.deadline_at or time.time() + args.budget
    missing = []
    for module in IMPORTS:
        try:
            __import__(module)
        except Exception as error:  # noqa: BLE001 - any failure to import is the finding
            missing.append(f"{module}: {type(error).__name__}: {error}")
    facts = {"python": sys.version.split()[0], "torch": None, "cuda": None, "nccl": None,
             "gpus": 0, "gpu_names": [], "kit": None}  # fmt: skip
    try:
        facts.update(machine_facts())
        facts["kit"] = kit_source()
    except Exception as error:  # noqa: BLE001
        missing.append(f"facts: {type(error).__name__}: {error}")
    check = Check(out, facts, [])
    print("gpu-check: " + ", ".join(f"{k} {facts[k]}" for k in
                                    ("python", "torch", "cuda", "nccl", "gpus", "gpu_names")))
    print(f"gpu-check: ddp_kit is {facts['kit']}")
    if missing:
        check.state = "setup failed: " + "; ".join(missing)
        check.write()
        print(f"gpu-check: {check.state}", file=sys.stderr)
        return SETUP_FAILED
    gpus = facts["gpus"]
    if gpus == 0 and not args.cpu:
        check.state = "no GPU: everything is installed and imports; nothing was run"
        check.write()
        print(f"gpu-check: no GPU. torch {facts['torch']} sees no CUDA device. Everything the "
              "check needs is installed and imports; nothing was run.")  # fmt: skip
        return NO_GPU
    import torch.distributed as dist

    modes = ["auto"] + (["shared-gpu"] if 0 < gpus < 4 and not args.no_shared else [])
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.notebooks:
        notebooks = [p for p in notebooks if any(p.name.startswith(n) for n in args.notebooks)]
    tasks = [Task("gpu-tests", "tests")] if not args.no_tests else []
    for mode in modes:
        for path in notebooks:
            task = Task(path.stem, mode)
            task.placement = placement(notebook_ranks(path), gpus, mode == "shared-gpu")
            need = NEEDS.get(path.stem)
            if need and not need[1](dist):
                task.status, task.reason = "skipped", f"needs {need[0]}"
            elif mode == "shared-gpu" and not places_on_device(path):
                task.status = "skipped"
                task.reason = "places nothing with device()/device_ids: the auto run covers it"
            tasks.append(task)
    check.tasks = tasks
    check.write()
    jobs = args.jobs or max(1, min(6, (os.cpu_count() or 4) // 4))
    print(f"gpu-check: {len(tasks)} tasks, {jobs} at a time, modes {', '.join(modes)}; "
          f"{deadline - time.time():.0f} s left; summary: {out}/summary.md", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        for task in tasks:
            if task.status == "pending":
                pool.submit(run_task, task, check, args, deadline)
    failed = [t for t in tasks if t.status not in ("ok", "skipped")]
    check.state = "failed" if failed else "passed"
    check.write()
    print(f"gpu-check: {check.state}: {sum(t.status == 'ok' for t in tasks)} ok, "
          f"{len(failed)} failed, {sum(t.status == 'skipped' for t in tasks)} skipped; "
          f"{out}/summary.md")  # fmt: skip
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="build the offline wheelhouse (needs PyPI)")
    prep.add_argument("--wheelhouse", default=str(ROOT / "wheelhouse-gpu"))
    prep.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    commands.add_parser("requirements", help="print what the wheelhouse holds, one a line")
    check = commands.add_parser("run", help="run the check (in .venv-gpu)")
    check.add_argument("--out", default=str(ROOT / "artifacts" / "gpu"))
    check.add_argument("--deadline-at", type=float, default=0.0,
                       help="epoch seconds by which everything has ended")
    check.add_argument("--budget", type=float, default=420.0,
                       help="seconds from now, without --deadline-at")
    check.add_argument("--jobs", type=int, default=0, help="notebooks at once (cores / 4)")
    check.add_argument("--notebook-timeout", type=float, default=240.0)
    check.add_argument("--cell-timeout", type=float, default=180.0)
    check.add_argument("--tests-timeout", type=float, default=240.0)
    check.add_argument("--notebooks", nargs="*", help="only these (name prefixes: 08 14_)")
    check.add_argument("--no-tests", action="store_true", help="no GPU tests")
    check.add_argument("--no-shared", action="store_true", help="no shared-GPU pass")
    check.add_argument("--cpu", action="store_true",
                       help="without a GPU, run the check on CPU anyway (a rehearsal)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(Path(args.wheelhouse), args.python_version)
    if args.command == "requirements":
        print("\n".join(requirements()))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
