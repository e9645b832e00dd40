"""ddp-kit benchmark: launch overhead vs bare torchrun, the fast start vs the plain start,
live ranks vs fresh launches, gloo all-reduce bandwidth and its alpha-beta fit, exposed
communication against bucket size (measured and modelled, on gloo and emulated links), scaling.

    ./kit bench                 # full run (several minutes on 2 cores)
    ./kit bench --smoke         # a minute: tiny sizes, 2 ranks, no notebook suite

Prints ratios and writes results.json and allreduce.png to --out (default artifacts/bench).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import ddp_kit
from ddp_kit import costmodel
from ddp_kit.kernel.diagnose import failure_signs as signs
from ddp_kit.kernel.torchrun import bare_torchrun as bare_torchrun_command
from ddp_kit.kernel.torchrun import loopback_interface

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "hosts"))
from netns import Shape, namespace_hosts, namespace_support, sshd_hosts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


BARE_FAILURES: list[str] = []  # bare torchrun runs that failed and were retried


def bare_command(script: Path, nproc: int, args: list[str]) -> tuple[list[str], dict]:
    """Plain torchrun on loopback: the command line and its environment."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME=loopback_interface(), OMP_NUM_THREADS="1")
    return bare_torchrun_command(script, nproc, args), env


def bare_torchrun(
    script: Path, nproc: int, args: list[str], attempts: int = 3
) -> tuple[float, str]:
    """Run `script` with plain torchrun on loopback; return (seconds, stdout).

    A script that leaves gloo's threads running at exit fails now and then as its ranks exit
    ("terminate called without an active exception"; the cause: docs/upstream.md, section 4).
    Under bare torchrun beside a CPU hog the trivial job aborted in 5 of 20 runs; after
    `del model` and importing torch.distributed.nn first, 0 of 30 (the model then freed only
    by the collector); it now imports torch._dynamo first, so `del model` frees it. A failed
    run is retried and counted in BARE_FAILURES, so the baseline's timing survives and its
    failures are reported.
    """
    command, env = bare_command(script, nproc, args)
    for _ in range(attempts):
        start = time.time()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode == 0:
            return time.time() - start, done.stdout
        BARE_FAILURES.append(f"exit {done.returncode}; signs: {signs(done.stdout + done.stderr)}")
    raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr)


def kit_launch(script: Path, nproc: int, args: list[str]) -> tuple[float, str]:
    """Run `script` through ddp_kit.launch; return (seconds, rank 0's stdout)."""
    start = time.time()
    result = ddp_kit.launch(script, nproc, output="quiet", args=args)
    return time.time() - start, result.stdout[0]


def bench_line(stdout: str) -> dict:
    """The JSON a benchmark worker prints on a line starting with BENCH."""
    line = next(x for x in stdout.splitlines() if x.startswith("BENCH "))
    return json.loads(line[len("BENCH ") :])


def launch_overhead(ranks: list[int], repeats: int) -> dict:
    """Median wall time of a trivial DDP job, bare torchrun vs ddp_kit (its fork server warm),
    with a breakdown."""
    script = WORKERS / "trivial_ddp.py"
    out = {}
    for nproc in ranks:
        rows = {"bare": [], "kit": []}
        phases = {"bare": [], "kit": []}
        kit_launch(script, nproc, [])  # the fork server warm, as after a kernel's first run
        for _ in range(repeats):
            for name, runner in (("bare", bare_torchrun), ("kit", kit_launch)):
                start = time.time()
                seconds, stdout = runner(script, nproc, [])
                rows[name].append(seconds)
                marks = bench_line(stdout)
                phases[name].append({
                    "torchrun start": marks["process_start"] - start,
                    "torch import": marks["imported"] - marks["process_start"],
                    "init_process_group": marks["initialized"] - marks["imported"],
                    "DDP construction": marks["wrapped"] - marks["initialized"],
                    "one step": marks["stepped"] - marks["wrapped"],
                    "teardown": start + seconds - marks["stepped"],
                })  # fmt: skip
        result = {}
        for name in rows:
            result[name] = statistics.median(rows[name])
            result[f"{name}_phases"] = {
                k: statistics.median(p[k] for p in phases[name]) for k in phases[name][0]
            }
        result["ratio"] = result["kit"] / result["bare"]
        result["added_s"] = result["kit"] - result["bare"]
        out[nproc] = result
    return out


def children_cpu() -> float:
    """CPU seconds of this process's ended and waited-for descendants, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kit_kernel(nproc: int, jobs: int, fast: bool) -> tuple[dict, float]:
    """A fresh kernel (workers/kit_kernel.py) that runs `jobs` trivial DDP jobs and then a live
    session until DDP is built, with the fast start on or off: its timings, and the CPU
    seconds of its whole process tree."""
    env = dict(os.environ, DDP_KIT_FAST_START="1" if fast else "0")
    command = [sys.executable, str(WORKERS / "kit_kernel.py"), str(nproc), str(jobs)]
    before = children_cpu()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return bench_line(done.stdout), children_cpu() - before


def fast_start(ranks: list[int], repeats: int, jobs: int, session_alone: bool = True) -> dict:
    """The fast start against the plain start and bare torchrun, interleaved in one run: a
    trivial DDP job's wall and CPU seconds (the fork server warm: the kernel's later jobs),
    the first job of a fresh kernel, a fresh kernel's live session until DDP is built, and
    the idle fork server's memory.

    A job's CPU seconds in a kernel: the CPU of a kernel that ran `jobs` jobs and a session,
    less that of a kernel that ran the session alone, over `jobs`. session_alone=False (the
    smoke run) skips the kernels that run the session alone: the CPU is then the whole
    kernel's over `jobs` (an upper bound), and a fresh kernel's session is not timed."""
    script = WORKERS / "trivial_ddp.py"
    out = {}
    for nproc in ranks:
        rows: dict[str, list] = {}
        for _ in range(repeats):
            before = children_cpu()
            seconds, _ = bare_torchrun(script, nproc, [])
            rows.setdefault("bare_job_s", []).append(seconds)
            rows.setdefault("bare_job_cpu_s", []).append(children_cpu() - before)
            for mode, fast in (("plain", False), ("fast", True)):
                timings, cpu = kit_kernel(nproc, jobs, fast)
                alone, cpu_alone = kit_kernel(nproc, 0, fast) if session_alone else ({}, 0.0)
                rows.setdefault(f"{mode}_first_job_s", []).append(timings["jobs_s"][0])
                rows.setdefault(f"{mode}_job_s", []).extend(timings["jobs_s"][1:])
                rows.setdefault(f"{mode}_job_cpu_s", []).append((cpu - cpu_alone) / jobs)
                if session_alone:
                    rows.setdefault(f"{mode}_session_ready_s", []).append(alone["session_ready_s"])
                rows.setdefault(f"{mode}_session_ready_after_a_job_s", []).append(
                    timings["session_ready_s"]
                )
                if timings["server"]:
                    rows.setdefault("server_rss_mib", []).append(timings["server"]["rss_mib"])
                    rows.setdefault("server_uss_mib", []).append(timings["server"]["uss_mib"])
        result = {name: statistics.median(values) for name, values in rows.items()}
        result["fast_to_bare"] = result["fast_job_s"] / result["bare_job_s"]
        result["plain_to_bare"] = result["plain_job_s"] / result["bare_job_s"]
        out[nproc] = result
    return out


def across_hosts(net, rate: str, repeats: int, sizes: list[int], fast: bool = True) -> dict:
    """A launch over two network hosts against one (workers/hosts_kernel.py, run as a kernel
    on host h0 of `net`, tests/hosts/netns.py): the trivial DDP job on h1 and h2 x 2 ranks
    against the same 4 ranks on h1 alone, and a DDP step as a live cell the same two ways,
    as ratios; and busbw of a 2-rank all-reduce across h2's link, shaped to `rate` (tc tbf,
    "100mbit") meanwhile, against that rate and against 2 ranks within h1. The largest size
    gives the busbw. The link stays shaped for every measurement: the two-host jobs and
    cells cross it too. fast: the fast start on the hosts (a fork server on each), or every
    agent and rank a fresh Python (DDP_KIT_FAST_START=0)."""
    net.shape("h2", Shape(rate))
    try:
        command = [sys.executable, str(WORKERS / "hosts_kernel.py"), "h1", "h2", str(repeats),
                   *map(str, sizes)]  # fmt: skip
        env = dict(os.environ, DDP_KIT_SSH_OPTIONS=f"-F {net.ssh.config}", DDP_KIT_PROGRESS="0",
                   DDP_KIT_FAST_START="1" if fast else "0")  # fmt: skip
        proc = net.popen("h0", *command, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)  # fmt: skip
        out, err = proc.communicate(timeout=600)
    finally:
        net.unshape("h2")
    if proc.returncode != 0:
        raise RuntimeError(f"the hosts' kernel failed:\n{err[-3000:]}")
    line = bench_line(out)
    rate_bytes = link_rate(rate)[1]
    across = float(costmodel.busbw(sizes[-1], line["across_s"][-1], 2))
    within = float(costmodel.busbw(sizes[-1], line["within_s"][-1], 2))
    two, one = statistics.median(line["two_hosts_s"]), statistics.median(line["one_host_s"])
    step_two, step_one = line["two_hosts_step_s"], line["one_host_step_s"]
    return {"two_hosts_s": two, "one_host_s": one, "ratio": two / one, "bytes": sizes[-1],
            "two_hosts_step_s": step_two, "one_host_step_s": step_one,
            "step_ratio": step_two / step_one,
            "link_rate": rate_bytes, "across_busbw": across, "within_busbw": within,
            "across_to_rate": across / rate_bytes}  # fmt: skip


def link_rate(text: str) -> tuple[str, float]:
    """A rate as tc writes it in bits per second ("100mbit", "1gbit", "12500kbit"; SI
    prefixes, as tc's): the text, and its bytes per second."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", text.strip().lower())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r}: give a rate in bits per second as tc "
                                         "writes it: 100mbit, 1gbit, 12500kbit")  # fmt: skip
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[found[2]]
    return text.strip().lower(), float(found[1]) * scale / 8


@contextlib.contextmanager
def network_hosts():
    """Hosts h0-h2 as Linux network namespaces, each with its own sshd (tests/hosts/netns.py;
    root, and Debian's openssh-server)."""
    ok, why = namespace_support()
    if not ok:
        raise SystemExit(f"bench --hosts: {why}")
    with namespace_hosts(3) as net, sshd_hosts(net) as ssh:
        net.ssh = ssh
        yield net


def memcpy_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes per second of one large tensor copy on this machine (one core)."""
    torch.set_num_threads(1)
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return nbytes / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def allreduce(ranks: list[int], sizes: list[int]) -> dict:
    """gloo all-reduce time per message size, with nccl-tests' algbw and busbw."""
    script = WORKERS / "allreduce.py"
    out = {}
    for nproc in ranks:
        _, stdout = kit_launch(script, nproc, [str(s) for s in sizes])
        times = bench_line(stdout)["seconds"]
        out[nproc] = [
            {"bytes": size, "seconds": t, "algbw": float(costmodel.algbw(size, t)),
             "busbw": float(costmodel.busbw(size, t, nproc))}
            for size, t in zip(sizes, times, strict=True)
        ]  # fmt: skip
    return out


def alpha_beta(rows_per_ranks: dict) -> dict:
    """The alpha-beta model fitted to the all-reduce times of each rank count (notebook 21)."""
    out = {}
    for nproc, rows in rows_per_ranks.items():
        fit = costmodel.fit([r["bytes"] for r in rows], [r["seconds"] for r in rows])
        worst = max(abs(fit.seconds(r["bytes"]) / r["seconds"] - 1) for r in rows)
        out[nproc] = {"alpha_s": fit.alpha, "beta_s_per_byte": fit.beta,
                      "bandwidth_bytes_s": fit.bandwidth, "worst_relative_error": worst,
                      "text": str(fit)}  # fmt: skip
    return out


def measure_bucket_sweep(caps: list[float], steps: int) -> dict:
    """Exposed communication against bucket_cap_mb on 2 ranks, on gloo alone and on the
    emulated links, with the model's prediction, in one run (notebook 22)."""
    _, stdout = kit_launch(WORKERS / "bucket_sweep.py", 2, [str(steps), *map(str, caps)])
    return bench_line(stdout)


def scaling(ranks: list[int], global_batch: int, steps: int) -> dict:
    """Training steps per second of the notebooks' TinyNet at a fixed global batch."""
    script = WORKERS / "train_steps.py"
    out = {}
    for nproc in ranks:
        _, stdout = kit_launch(script, nproc, [str(global_batch // nproc), str(steps)])
        out[nproc] = bench_line(stdout)["steps_per_second"]
    return out


LIVE_SETUP = """
import torch
import torch.distributed as dist
from ddp_kit.worker import backend
dist.init_process_group(backend())
"""
LIVE_DDP = """
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_kit.toy import make_model
model = DDP(make_model())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randn(8, 1)
"""
LIVE_STEP = """
optimizer.zero_grad()
torch.nn.functional.mse_loss(model(x), y).backward()
optimizer.step()
"""


def live_ranks(ranks: list[int], cells: int, launches: int) -> dict:
    """Live ranks: session start, a trivial cell and a DDP step cell (medians of `cells`),
    the first DDP construction, and the same step as a fresh launch()."""
    from ddp_kit.kernel.session import Session

    out = {}
    for nproc in ranks:
        start = time.perf_counter()
        with Session(nproc, output="quiet") as session:
            started = time.perf_counter() - start
            session.run(LIVE_SETUP)
            first_ddp = _timed(lambda s=session: s.run(LIVE_DDP))
            trivial = [_timed(lambda s=session: s.run("pass")) for _ in range(cells)]
            printing = [_timed(lambda s=session: s.run("print(1)")) for _ in range(cells)]
            step = [_timed(lambda s=session: s.run(LIVE_STEP)) for _ in range(cells)]
        fresh = [
            _timed(
                lambda n=nproc: ddp_kit.launch(LIVE_SETUP + LIVE_DDP + LIVE_STEP, n, output="quiet")
            )  # fmt: skip
            for _ in range(launches)
        ]
        out[nproc] = {
            "session_start_s": started,
            "first_ddp_s": first_ddp,
            "trivial_cell_ms": 1e3 * statistics.median(trivial),
            "printing_cell_ms": 1e3 * statistics.median(printing),
            "ddp_step_cell_ms": 1e3 * statistics.median(step),
            "fresh_launch_s": statistics.median(fresh),
            "speedup": statistics.median(fresh) / statistics.median(step),
        }
    return out


SPEEDUP = """
import torch.distributed as dist
from ddp_kit.speedup import epoch_seconds, first_ranks_groups
from ddp_kit.toy import make_dataset, make_model, make_wide_dataset, make_wide_model
from ddp_kit.worker import backend
dist.init_process_group(backend())
models = {
    "wide MLP, 256 per rank": (lambda: make_wide_model(hidden=1024), make_wide_dataset(2048), 256),
    "TinyNet, 2 per rank": (make_model, make_dataset(512), 2),
}
timings = {}
for n, group in first_ranks_groups(SIZES).items():
    for name, (make, data, batch) in models.items():
        best = min(epoch_seconds(make, data, batch, group) or 0 for _ in range(3))
        local = min(epoch_seconds(make, data, batch, group, sync=False) or 0 for _ in range(3))
        timings[f"{name} | {n}"] = (best, local)
"""


def speedup(ranks: list[int]) -> dict:
    """Notebook 17's measurement (best of 3 epochs): seconds per epoch on the first n ranks,
    with and without the all-reduce, and the speedup over one rank."""
    from ddp_kit.kernel.session import Session

    with Session(max(ranks), output="quiet") as session:
        session.run(f"SIZES = {ranks!r}\n" + SPEEDUP)
        timings = session.pull("timings", ranks=[0])[0]
    out: dict = {}
    for key, (synced, local) in timings.items():
        name, n = key.split(" | ")
        out.setdefault(name, {})[int(n)] = {"epoch_s": synced, "no_sync_epoch_s": local}
    for per_model in out.values():
        for r in per_model.values():
            r["speedup"] = per_model[1]["epoch_s"] / r["epoch_s"]
            r["allreduce_share"] = max(r["epoch_s"] - r["no_sync_epoch_s"], 0) / r["epoch_s"]
    return out


def notebook_suite() -> float:
    """Wall time of the nbval notebook suite (as the tests run it)."""
    command = [sys.executable, "-m", "pytest", "-q", "notebooks"]  # the README's test command
    start = time.time()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return time.time() - start


def plot_allreduce(results: dict, memcpy: float, path: Path) -> None:
    """Bus bandwidth against message size, with the memory-copy bandwidth for scale."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.add_subplot()
    for nproc, rows in results.items():
        ax.plot([r["bytes"] for r in rows], [r["busbw"] / 1e9 for r in rows], "o-",
                label=f"gloo busbw, {nproc} ranks")  # fmt: skip
    ax.axhline(memcpy / 1e9, color="black", ls="--", label="memory copy (1 core)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title("gloo all-reduce on 127.0.0.1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(res: dict) -> str:
    """The human-readable summary."""
    lines = ["== launch overhead (median wall time of a trivial DDP job) =="]
    for nproc, r in res["launch"].items():
        lines.append(f"{nproc} ranks: bare torchrun {r['bare']:.2f} s, ddp_kit {r['kit']:.2f} s, "
                     f"ratio {r['ratio']:.3f} (+{r['added_s']:.2f} s)")  # fmt: skip
        for phase, seconds in r["kit_phases"].items():
            lines.append(f"    {phase:20s} {seconds:6.2f} s (bare {r['bare_phases'][phase]:.2f} s)")
    for failure in res.get("bare_failures", []):
        lines.append(f"    a bare torchrun run failed and was retried: {failure}")
    lines.append("== fast start: fork server vs plain start vs bare torchrun (medians) ==")
    for nproc, r in res["fast_start"].items():
        lines.append(
            f"{nproc} ranks, trivial DDP job: bare torchrun {r['bare_job_s']:.2f} s "
            f"({r['bare_job_cpu_s']:.1f} CPU s), kit plain {r['plain_job_s']:.2f} s "
            f"({r['plain_job_cpu_s']:.1f} CPU s), kit fast {r['fast_job_s']:.2f} s "
            f"({r['fast_job_cpu_s']:.1f} CPU s): fast/bare {r['fast_to_bare']:.2f}"
        )
        lines.append(
            f"    a fresh kernel's first job: plain {r['plain_first_job_s']:.2f} s, "
            f"fast {r['fast_first_job_s']:.2f} s (the fork server's imports included)"
        )
        fresh = (
            f"fresh kernel plain {r['plain_session_ready_s']:.2f} s, fast "
            f"{r['fast_session_ready_s']:.2f} s; "
            if "fast_session_ready_s" in r
            else ""
        )
        lines.append(
            f"    live session until DDP is built: {fresh}after a job plain "
            f"{r['plain_session_ready_after_a_job_s']:.2f} s, fast "
            f"{r['fast_session_ready_after_a_job_s']:.2f} s"
        )  # fmt: skip
        lines.append(f"    idle fork server: {r['server_rss_mib']:.0f} MiB resident, "
                     f"{r['server_uss_mib']:.0f} MiB its own (USS)")  # fmt: skip
    lines.append(f"== gloo all-reduce (memory copy {res['memcpy'] / 1e9:.2f} GB/s) ==")
    for nproc, rows in res["allreduce"].items():
        for r in rows:
            lines.append(f"{nproc} ranks {r['bytes']:>10d} B: {r['seconds'] * 1e3:9.3f} ms  "
                         f"algbw {r['algbw'] / 1e9:7.3f} GB/s  busbw {r['busbw'] / 1e9:7.3f} GB/s  "
                         f"busbw/memcpy {r['busbw'] / res['memcpy']:.3f}")  # fmt: skip
    lines.append("== the alpha-beta model fitted to those times (notebook 21) ==")
    for nproc, r in res["alpha_beta"].items():
        lines.append(f"{nproc} ranks: {r['text']}; worst point off the fit by "
                     f"{r['worst_relative_error']:.0%}")  # fmt: skip
    lines.append("== exposed communication per step against bucket_cap_mb, 2 ranks, 12-layer "
                 "MLP (notebook 22): measured / model ==")  # fmt: skip
    for link, points in res["bucket_sweep"].items():
        cells = []
        for p in points:
            model = "" if p["model_s"] is None else f" / {p['model_s'] * 1e3:.1f}"
            cells.append(f"{p['cap_mb']:g} MiB {p['exposed_s'] * 1e3:.1f}{model} ms")
        lines.append(f"{link:22s} " + ", ".join(cells))
    lines.append("== live ranks (Session): the same DDP step as a cell vs a fresh launch ==")
    for nproc, r in res["live"].items():
        lines.append(f"{nproc} ranks: session start {r['session_start_s']:.2f} s, first DDP "
                     f"{r['first_ddp_s']:.3f} s, trivial cell {r['trivial_cell_ms']:.1f} ms, "
                     f"printing cell {r['printing_cell_ms']:.1f} ms, "
                     f"DDP step cell {r['ddp_step_cell_ms']:.1f} ms, fresh launch "
                     f"{r['fresh_launch_s']:.2f} s: x{r['speedup']:.0f}")  # fmt: skip
    for key, start in (("hosts", "fast start"), ("hosts_plain", "plain start")):
        if key not in res:
            continue
        r = res[key]
        lines.append(f"== two hosts (network namespaces, over ssh) against one, {start} ==")
        lines.append(f"trivial DDP job, 2 hosts x 2 ranks {r['two_hosts_s']:.2f} s, 1 host x 4 "
                     f"ranks {r['one_host_s']:.2f} s: ratio {r['ratio']:.2f}")  # fmt: skip
        lines.append(f"DDP step as a live cell, 2 hosts x 2 ranks "
                     f"{r['two_hosts_step_s'] * 1e3:.1f} ms, 1 host x 4 ranks "
                     f"{r['one_host_step_s'] * 1e3:.1f} ms: "
                     f"ratio {r['step_ratio']:.2f}")  # fmt: skip
        lines.append(f"all-reduce of {r['bytes'] >> 20} MiB, 2 ranks: busbw across the link "
                     f"{r['across_busbw'] / 1e6:.1f} MB/s = {r['across_to_rate']:.2f} x its "
                     f"rate ({r['link_rate'] / 1e6:.1f} MB/s); within one host "
                     f"{r['within_busbw'] / 1e6:.0f} MB/s")  # fmt: skip
    lines.append("== TinyNet steps per second at a fixed global batch ==")
    base = res["scaling"][min(res["scaling"])]
    for nproc, sps in res["scaling"].items():
        lines.append(f"{nproc} ranks: {sps:8.1f} steps/s  (x{sps / base:.2f} of 1 rank)")
    lines.append("== when DDP pays off: seconds per epoch on the first n ranks (notebook 17) ==")
    for name, per_ranks in res["speedup"].items():
        for nproc, r in per_ranks.items():
            lines.append(f"{name:24s} {nproc} ranks: {r['epoch_s']:.3f} s, "
                         f"x{r['speedup']:.2f} of 1 rank, "
                         f"all-reduce share {r['allreduce_share']:.0%}")  # fmt: skip
    if res.get("notebooks_s") is not None:
        lines.append(f"== notebook suite (nbval): {res['notebooks_s']:.0f} s ==")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--smoke", action="store_true", help="tiny, fast run (for tests)")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "bench")
    parser.add_argument("--launch-only", action="store_true", help="only the launch overhead")
    parser.add_argument("--repeats", type=int, default=3, help="launches per measurement")
    parser.add_argument("--hosts", action="store_true",
                        help="also a launch over two network-namespace hosts against one host, "
                        "and busbw across a link shaped to --link-rate (root; sshd)")  # fmt: skip
    parser.add_argument("--link-rate", default="100mbit", type=lambda text: link_rate(text)[0],
                        help="the shaped link's rate, as tc writes it (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.hosts and not namespace_support()[0]:  # before any measurement, not after
        parser.error(f"--hosts: {namespace_support()[1]}")
    if args.launch_only:
        res = launch_overhead([2, 4], args.repeats)
        print(json.dumps(res, indent=2))
        return res
    ranks = [2] if args.smoke else [2, 4]
    sizes = [1 << 10, 1 << 22] if args.smoke else [1 << k for k in range(10, 27, 2)]
    res = {
        "machine": f"{os.cpu_count()} CPU cores, torch {torch.__version__}, gloo on 127.0.0.1",
        "launch": launch_overhead(ranks, repeats=1 if args.smoke else args.repeats),
        "fast_start": fast_start(
            ranks,
            1 if args.smoke else args.repeats,
            2 if args.smoke else 3,
            session_alone=not args.smoke,
        ),
        "memcpy": memcpy_bandwidth(),
        "allreduce": allreduce(ranks, sizes),
        "bucket_sweep": measure_bucket_sweep(
            [0.5, 25] if args.smoke else [0.25, 0.5, 1, 2, 25], 2 if args.smoke else 6
        ),
        "live": live_ranks(ranks, 5 if args.smoke else 30, 1 if args.smoke else 3),
        "scaling": scaling([1, 2] if args.smoke else [1, 2, 4], 64, 20 if args.smoke else 300),
        "speedup": speedup([1, 2] if args.smoke else [1, 2, 4]),
        "notebooks_s": None if args.smoke else notebook_suite(),
    }
    if args.hosts:
        with network_hosts() as net:
            for key, fast in (("hosts", True), ("hosts_plain", False)):
                res[key] = across_hosts(net, args.link_rate, args.repeats, [1 << 10, 1 << 24],
                                        fast)  # fmt: skip
    res["alpha_beta"] = alpha_beta(res["allreduce"])
    res["bare_failures"] = list(BARE_FAILURES)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(res, indent=2))
    plot_allreduce(res["allreduce"], res["memcpy"], args.out / "allreduce.png")
    print(res["machine"])
    print(report(res))
    return res


if __name__ == "__main__":
    main()
