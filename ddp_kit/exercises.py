"""Check functions for the notebooks' exercises. Each prints a verdict and returns True/False
(None while the answer is still None), computing the right answer from real PyTorch objects.
(torch is imported inside the checks that need it: importing this module stays fast.)"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from .kernel.backend import choose_backend


def _number(answer: Any) -> float | None:
    """A numeric answer as a float: Python, numpy or a one-element tensor; None for anything
    else (a bool is not a number here: True is not the answer 1)."""
    if type(answer).__module__.startswith("torch") and hasattr(answer, "numel"):  # a tensor
        answer = answer.item() if answer.numel() == 1 else None
    if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, numbers.Real):
        return None
    return float(answer)


def _verdict(
    answer: Any,
    correct: Any,
    explain: str,
    close: bool = False,
    accept: Callable[[Any], bool] | None = None,
) -> bool | None:
    """Print and return whether `answer` is right: `accept`ed, or the same number (close to it
    with close=True, for floats), or equal."""
    if answer is None:
        print("Not answered yet: replace None with your answer and run the cell again.")
        return None
    if accept is not None:
        ok = bool(accept(answer))
    elif isinstance(correct, (int, float)) and not isinstance(correct, bool):
        number = _number(answer)
        ok = number is not None and (
            math.isclose(number, correct, rel_tol=1e-6) if close else number == correct
        )
    else:
        ok = answer == correct
    print(("Correct! " if ok else f"Not quite: you said {answer!r}. ") + explain)
    return ok


def _index_list(answer: Any) -> Any:
    """A list of indices as a list of ints, whatever held them; otherwise the answer as it is."""
    try:
        return [int(i) for i in answer]
    except (TypeError, ValueError):
        return answer


def check_rank_sum(world_size: int, answer: float | None) -> bool | None:
    """Intro: all_reduce(SUM) of each rank's own number: what does every rank print?"""
    correct = sum(range(world_size))
    return _verdict(answer, correct, f"0 + 1 + ... + {world_size - 1} = {correct} on every rank.")


def check_batch_count(size: int, batch_size: int, answer: int | None) -> bool | None:
    """Step 1: how many batches does a DataLoader make of `size` samples?"""
    from torch.utils.data import DataLoader

    correct = len(DataLoader(range(size), batch_size=batch_size))
    return _verdict(answer, correct, f"ceil({size} / {batch_size}) = {correct} batches.")


def check_shard(size: int, ranks: int, rank: int, answer: list[int] | None) -> bool | None:
    """Step 2: which indices does DistributedSampler (shuffle=False) give `rank`? The set is
    what counts; any order is accepted (the sampler's own order is said)."""
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(size), num_replicas=ranks, rank=rank, shuffle=False)
    correct = list(sampler)
    if answer is not None:
        answer = _index_list(answer)
    explain = (
        f"rank {rank} takes every {ranks}th index from {rank} on; the list is first padded "
        f"by repeating its start up to a multiple of the ranks. In the sampler's order: {correct}."
    )
    return _verdict(answer, correct, explain,
                    accept=lambda a: isinstance(a, list) and sorted(a) == sorted(correct))


def check_parameter_count(answer: int | None) -> bool | None:
    """Step 3: how many weights (numbers) does TinyNet have?"""
    from .toy import make_model

    correct = sum(p.numel() for p in make_model().parameters())
    return _verdict(answer, correct, "4x3 + 3 (hidden) + 3x1 + 1 (out) = 19.")


def check_broadcast_source(answer: int | None) -> bool | None:
    """Step 4: whose weights does every rank hold after DDP(model)?"""
    return _verdict(answer, 0, "DDP broadcasts rank 0's parameters and buffers when it wraps.")


def check_backend(nproc: int, gpus: int, answer: str | None) -> bool | None:
    """Step 5: which backend does ddp_kit choose for `nproc` ranks and `gpus` GPUs?"""
    choice = choose_backend(nproc, "auto", gpus=gpus)
    return _verdict(answer, choice.backend, choice.reason)


def check_global_batch(per_rank: int, ranks: int, answer: int | None) -> bool | None:
    """Step 6: how many samples go through the model per step, over all ranks?"""
    return _verdict(answer, per_rank * ranks, "batch_size is per rank: global = per rank x ranks.")


def check_average(local_values: list[float], answer: float | None) -> bool | None:
    """Step 7: the value of one gradient entry after DDP's all-reduce."""
    correct = float(np.mean(np.asarray(local_values, dtype=np.float64)))
    explain = "DDP averages: sum over the ranks, divided by their number."
    return _verdict(answer, correct, explain, close=True)


def check_no_repeats(
    parts: list[list[int]], size: int, ranks: int = 4, options: dict | None = None
) -> bool | None:
    """Shards: the `ranks` samplers of the `size`-sample dataset give equal parts and no sample
    in two of them, leaving out exactly size % ranks samples (drop_last=True does it). With
    `options`, the parts must be what DistributedSampler gives with them on that dataset (so
    that only the options were changed, not the dataset or the samplers)."""
    sizes = [len(part) for part in parts]
    everything = [int(i) for part in parts for i in part]
    repeats = len(everything) - len(set(everything))
    left_out = size - len(set(everything) & set(range(size)))
    print(f"samples per rank: {sizes}; repeated: {repeats}; left out: {left_out}")
    problems = []
    if len(parts) != ranks:
        problems.append(f"{len(parts)} parts, not one for each of the {ranks} ranks")
    if any(not 0 <= i < size for i in everything):
        problems.append(f"indices outside the {size}-sample dataset")
    if len(set(sizes)) > 1 or repeats:
        problems.append("parts of different sizes or samples given twice")
    elif left_out != size % ranks:
        problems.append(f"{left_out} samples left out, not {size % ranks} ({size} % {ranks})")
    if options is not None and not problems:
        from torch.utils.data.distributed import DistributedSampler

        samplers = [DistributedSampler(range(size), num_replicas=ranks, rank=r, **options)
                    for r in range(ranks)]  # fmt: skip
        if [[int(i) for i in part] for part in parts] != [list(s) for s in samplers]:
            problems.append(f"these are not the parts DistributedSampler gives the {ranks} "
                            f"ranks of the {size}-sample dataset with {options}")  # fmt: skip
    if not problems:
        print("Correct! drop_last leaves the tail out instead of repeating the start (a different "
              "tail each epoch when shuffled).")  # fmt: skip
    else:
        print("Not yet: " + "; ".join(problems) + ". Keep the dataset and the four samplers; "
              "look at DistributedSampler's options for the tail of the dataset.")  # fmt: skip
    return not problems


def check_hand_average(grads: Any, ddp_grad: Any) -> bool | None:
    """All-reduce by hand: all_reduce(SUM) then divide by the number of ranks is DDP's, on
    every rank. `grads`: every rank's gradient (one per rank, as session.pull gives them)."""
    per_rank = [np.asarray(g) for g in grads]
    ddp_grad = np.asarray(ddp_grad)
    wrong = {r: g for r, g in enumerate(per_rank) if not np.allclose(g, ddp_grad, atol=1e-6)}
    if not wrong:
        print(f"Correct! Sum over ranks, then divide by their number: DDP's average, on all "
              f"{len(per_rank)} ranks.")  # fmt: skip
        return True
    ratios = ", ".join(
        f"rank {r}: {float(np.dot(g, ddp_grad) / np.dot(ddp_grad, ddp_grad)):.2f} x DDP's"
        for r, g in wrong.items())  # fmt: skip
    print(f"Not yet ({ratios}). Every rank must hold the average: what does DDP do after the "
          "sum, and on which ranks?")  # fmt: skip
    return False


def check_linear_lr(base_lr: float, ranks: int, answer: float | None) -> bool | None:
    """Step 10: the linear scaling rule for the learning rate with `ranks` times the batch."""
    explain = "Linear rule: lr x (global batch / base batch)."
    return _verdict(answer, base_lr * ranks, explain, close=True)


def check_hook_budget(records: Any, default_bytes: float, default_loss: float) -> bool | None:
    """Hooks: the student's "mine" run sends <= 1/4 of the default bytes per step in at least
    half of its steps (PowerSGD starts compressing at `start`) and ends no more than 10 % above the
    default's final loss."""
    if records is None:
        print("Not run yet: set `rank` in the cell above, run it, then run this cell again.")
        return None
    per_step = records["mine/sent"][:, 0].astype(float)
    sent = float(per_step[-1])
    compressed = int((per_step <= default_bytes / 4).sum())
    final = float(records["mine/loss"][-8:, 0].mean())
    cheap = sent <= default_bytes / 4 and 2 * compressed >= len(per_step)
    close = final <= 1.1 * default_loss
    print(f"your run: {sent:,.0f} bytes/step ({sent / default_bytes:.0%} of the default) in "
          f"{compressed} of {len(per_step)} steps, final loss {final:.3f} (default "
          f"{default_loss:.3f})")  # fmt: skip
    if cheap and close:
        print("Correct! Fewer bytes, and error feedback kept the loss close.")
    else:
        print("Not quite: " + ("too many bytes, or too few steps compressed (at least half); "
                               if not cheap else "") +
              ("the loss is more than 10 % above the default's." if not close else ""))  # fmt: skip
    return bool(cheap and close)


def check_fewer_gathers(mine: dict[str, int], measured: dict[str, int]) -> bool | None:
    """Sharding: with reshard_after_forward=False the Linear layers are all-gathered once per
    step instead of twice; the reduce-scatter stays."""
    gathered, before = mine.get("all_gather_single", 0), measured["all_gather_single"]
    ok = (
        2 * gathered == before
        and mine.get("reduce_scatter_single") == measured["reduce_scatter_single"]
    )
    print(f"all-gather payload per step: yours {gathered:,}, before {before:,}. " +
          ("Correct! One all-gather per layer: more memory held, less traffic." if ok else
           "Not yet: look for `reshard_after_forward` in help(fully_shard)."))  # fmt: skip
    return ok


def check_join_division(records: Any) -> bool | None:
    """Join: the last round (one rank left) gives that rank its own local gradient, divided
    by the one rank still training: DDP's built-in division with the option off, no hook.
    Reads the latest run's factor (each run of the cell records one more step)."""
    if "mine/last_factor" not in records:
        print('Not run yet: run the `train_uneven("mine/", ...)` cell first.')
        return None
    world = records.world_size
    factor = float(records["mine/last_factor"][-1, world - 1])
    ok = math.isclose(factor, 1.0, rel_tol=1e-4)
    verdict = "Correct!" if ok else "Not yet: which part of the run does the dividing?"
    print(f"last round: synced = {factor:.3f} x rank {world - 1}'s local gradient. {verdict}")
    return ok


def check_two_byte_gradients(sent_dtypes: list[str], weight_dtype: str) -> bool | None:
    """Mixed precision: the all-reduce sent 2-byte floats while the weights stayed float32."""
    two_byte = bool(sent_dtypes) and all(d in ("float16", "bfloat16") for d in sent_dtypes)
    ok = two_byte and weight_dtype == "torch.float32"
    if ok:
        print(f"Correct! Sent as {sent_dtypes}, weights {weight_dtype}.")
    elif not sent_dtypes:
        print("Not yet: the counter saw no all-reduce. Keep a hook registered: DDP's built-in "
              "all-reduce is not counted.")  # fmt: skip
    else:
        print(f"Not yet: sent as {sent_dtypes}, weights {weight_dtype}. A compressing hook "
              "casts only what it sends.")  # fmt: skip
    return ok


def check_unused_fix(session: Any) -> bool | None:
    """Pitfalls: the edited TwoHeads cell trains 3 steps and both ranks hold the same gradient.
    Reads the ranks' `error` and `grad`, which every run of the cell sets afresh."""
    errors = [error for error in session.pull("error") if error]
    if errors:
        print(f"Not yet: the run still fails: {errors[0]}")
        print("Use one of the three fixes of section 5 where the model is made.")
        return False
    grads = [np.asarray(grad) for grad in session.pull("grad")]
    ok = all((grad == grads[0]).all() for grad in grads)
    print("Correct! Three steps, and both ranks hold the same averaged gradient." if ok
          else "Not quite: the ranks' gradients differ, so they were not all-reduced.")  # fmt: skip
    return ok


def check_accumulation(grad: Any, big_grad: Any, calls: int, big_calls: int) -> bool | None:
    """no_sync: the accumulated gradient equals the one big batch's, with as many all-reduces."""
    same = bool(np.allclose(np.asarray(grad), np.asarray(big_grad), atol=1e-6))
    ok = same and calls == big_calls
    if ok:
        print(f"Correct! The big batch's gradient with {calls} all-reduce(s), not one per "
              "micro-batch.")  # fmt: skip
    elif not same:
        print("Not quite: the gradient differs from the one batch's. Divide each micro-batch's "
              "loss by their number, and keep every backward.")  # fmt: skip
    else:
        print(f"Not yet: the right gradient, but {calls} all-reduces where {big_calls} will do. "
              "Run all but the last backward under `with mine.no_sync():`.")  # fmt: skip
    return ok


def check_global_eval(run: Any, size: int) -> bool | None:
    """Evaluation: every rank's `yours` is the one-process mean loss of the untrained TinyNet
    over the `size` real samples (padding repeats left out)."""
    import torch

    from .toy import make_dataset, make_model

    x, y = make_dataset(size).tensors
    with torch.no_grad():
        truth = torch.nn.functional.mse_loss(make_model()(x), y).item()
    yours = np.asarray(run.records["yours"][0], dtype=float)
    same = bool(np.all(yours == yours[0]))
    ok = same and math.isclose(float(yours[0]), truth, rel_tol=1e-5)
    if ok:
        print(f"Correct! {yours[0]:.5f} on every rank: the mean over the {size} real samples.")
    elif not same:
        print(f"Not yet: the ranks report different values {yours.round(5).tolist()}: "
              "all-reduce the sums and counts.")  # fmt: skip
    else:
        print(f"Not yet: {yours[0]:.5f} on every rank, but one process gets {truth:.5f}: "
              "leave the padded repeats out of the sum and the count.")  # fmt: skip
    return ok


def check_early_stop(records: Any, target: float) -> bool | None:
    """Debugging: every rank stops training at the same step (the stopping rule decided on
    numbers every rank shares), with the same weights, at the first step where the loss over
    all ranks (their mean) is below `target` (a rule that stops at that same step, by chance,
    cannot be told apart). Reads what the last run of `train_until` and the cell after it
    recorded (at step 0, each run replacing the last)."""
    world = records.world_size
    stopped = [r for r in range(world) if "early/steps" in records.per_rank[r]]
    if not stopped:
        print("Not run yet: run the `train_until(...)` cell first.")
        return None
    if len(stopped) < world:
        print(f"Not quite: only rank(s) {stopped} got past the loop; the others waited in "
              "backward() for them. Where does a rank decide to stop, and on what?")  # fmt: skip
        return False
    steps = [int(records.get("early/steps", 0, r)) for r in range(world)]
    if len(set(steps)) > 1:
        print(f"Not quite: the ranks stopped after {steps} steps.")
        return False
    if "early/loss" not in records:
        print("Not checked yet: run the cell after `train_until` too.")
        return None
    found = str(records.get("early/divergence", 0, 0))
    loss = float(records.get("early/loss", 0, 0))
    if found != "None" or not loss < target:
        print(f"Not quite: first divergence {found}; loss over all ranks {loss:.3g}.")
        return False
    expected = _first_step_below(target, world)
    if steps[0] != expected:
        print(f"Not quite: the ranks stopped together after {steps[0]} steps, but the loss over "
              f"all ranks first fell below {target:g} at step {expected} (the mean of the "
              "ranks' losses, the same number on every rank).")  # fmt: skip
        return False
    print(f"Correct! Every rank stopped after {steps[0]} steps with the same weights, once "
          f"the loss over all ranks was below {target:g}.")  # fmt: skip
    return True


def _first_step_below(target: float, world: int, size: int = 1024, batch: int = 8,
                      lr: float = 0.1) -> int:
    """How many steps notebook 18's `train_until` takes when it stops at the first step whose
    loss over all ranks (the mean of their shards' losses) is below `target`: one process on
    the global batches gives the same losses (DDP averages the equal shards' gradients)."""
    from torch.utils.data.distributed import DistributedSampler

    from .reference import global_batches, single_process_run
    from .toy import make_dataset, make_model

    shards = [list(DistributedSampler(range(size), num_replicas=world, rank=r, shuffle=False))
              for r in range(world)]  # the notebook's sampler, without processes
    per_rank = [[shard[k : k + batch] for k in range(0, len(shard), batch)] for shard in shards]
    losses = single_process_run(make_model(), make_dataset(size), global_batches(per_rank),
                                lr).losses  # fmt: skip
    return next((k + 1 for k, loss in enumerate(losses) if loss < target), len(losses))


def check_own_ddp(records: Any, mine: str, reference: str) -> bool | None:
    """Build DDP yourself, (b): the student's per-parameter version gives DDP's gradients bit
    for bit at every step, with one asynchronous all-reduce per parameter (async_op=True: it
    runs while backward goes on), the first started before backward had produced its last
    gradient (so, from a hook)."""
    if f"{mine}/grad" not in records:
        print("Not run yet: run the cell above (with your `launch`), then this one.")
        return None
    grads, wanted = records[f"{mine}/grad"], records[f"{reference}/grad"]  # [step, rank, n]
    if not np.array_equal(grads[:, 0], grads[:, -1]):
        print("Not yet: the ranks end with different gradients, so nothing was averaged. "
              "Start `dist.all_reduce(param.grad, async_op=True)` in `launch` and keep its handle "
              "in self.pending.")  # fmt: skip
        return False
    if not np.array_equal(grads, wanted):
        print(f"Not yet: the ranks agree, but not with DDP (max |diff| "
              f"{np.abs(grads - wanted).max():.3g}): divide by the number of ranks once, "
              "before the all-reduce, and make `finish` wait for every handle.")  # fmt: skip
        return False
    calls = int(records[f"{mine}/calls"][-1, 0])
    step = records.get(f"{mine}/buckets", records.steps(f"{mine}/buckets")[-1], 0)
    parameters = len(step["ready"])  # the timeline notes when each parameter's gradient was ready
    early = min(c["launched"] for c in step["buckets"]) < max(step["ready"].values())
    last_ready = max(step["ready"].values())
    blocking = sum(not c.get("async", True) or c.get("waited", math.inf) < last_ready
                   for c in step["buckets"])  # fmt: skip
    if calls != parameters or not early or blocking:
        problems = ([f"{calls} all-reduce call(s) per step, not one per parameter ({parameters})"]
                    if calls != parameters else [])  # fmt: skip
        if not early:
            problems.append("every all-reduce started after backward: start each from its hook")
        if blocking:
            problems.append(
                f"{blocking} all-reduce(s) blocked backward until they were done (a call "
                "without async_op=True, or its wait() inside the hook): start each with "
                "async_op=True, keep the handle and wait in `finish`"
            )
        print("Not yet: the gradients are right, but " + "; ".join(problems) + ".")
        return False
    print(
        f"Correct! DDP's gradients bit for bit, {calls} asynchronous all-reduces per step, the "
        "first one started while backward was still computing."
    )
    return True


def check_bucket_choice(
    cap: Any, measured: dict[float, float], predicted: dict[float, float]
) -> bool | None:
    """Buckets and overlap: the student's cap is the sweep's least exposed one (within 5 %);
    then what the model says of it."""
    if cap is None:
        print("Not answered yet: set `cap_mb` to one of the caps of the sweep.")
        return None
    if isinstance(cap, (bool, np.bool_)) or cap not in measured:  # True == 1: not a cap
        print(f"Not quite: {cap!r} is not one of the caps of the sweep: {sorted(measured)}.")
        return False
    best = min(measured, key=measured.get)
    ok = measured[cap] <= 1.05 * measured[best]
    print(f"Correct! {cap:g} MiB: {1e3 * measured[cap]:.1f} ms exposed, within 5 % of the "
          "sweep's least."
          if ok else f"Not quite: {cap:g} MiB exposed {1e3 * measured[cap]:.1f} ms; "
          f"{best:g} MiB exposed {1e3 * measured[best]:.1f} ms.")  # fmt: skip
    modelled = min(predicted, key=predicted.get)
    print(
        f"The model's pick: {modelled:g} MiB ({1e3 * predicted[modelled]:.1f} ms predicted; "
        f"for {cap:g} MiB it predicts {1e3 * predicted[cap]:.1f} ms)."
    )
    return ok


def check_ring(result: Any, expected: Any, sent: Any, predicted: float) -> bool | None:
    """Ring all-reduce: the student's all-gather leaves in the tensor (summed in place through
    its chunks) dist.all_reduce's sums, bit for bit on whole numbers, on every rank. The bytes
    sent are shown, not judged: `exchange` counts them whatever the student does with them."""
    result, expected, sent = np.asarray(result), np.asarray(expected), np.asarray(sent)
    equal = np.array_equal(result, expected)
    if equal:
        print(f"Correct! dist.all_reduce's sums on every rank, in place; each rank sent "
              f"{int(sent.max()):,} bytes ({int(predicted):,} = 2(N-1)/N x S).")  # fmt: skip
    else:
        wrong = int((result != expected).any(axis=-1).sum())
        print(
            f"Not quite: {wrong} rank(s) do not hold the sum in the tensor. In the all-gather, "
            "`received` is a finished chunk: copy it into chunks[incoming], in place (adding "
            "would count again the ranks already summed in it; `chunks[incoming] = received` "
            "only changes the list, not the tensor the chunks are views of)."
        )
    return equal


def check_half_bandwidth(answer: Any, fit: Any) -> bool | None:
    """All-reduce cost: the size at which beta x S equals alpha (S = alpha / beta), from the
    run's own fit, within 5 %."""
    if not (fit.alpha > 0 and fit.beta > 0):
        print(f"This run's fit has no half-bandwidth size (alpha {fit.alpha:.3g} s, beta "
              f"{fit.beta:.3g} s/byte): run the measuring cell again.")  # fmt: skip
        return None
    correct = fit.alpha / fit.beta
    number = _number(answer)
    if answer is not None and number is not None:
        answer = number if abs(number - correct) > 0.05 * correct else correct
    return _verdict(answer, correct, "beta x S = alpha when S = alpha / beta: here "
                    f"{correct:,.0f} bytes. At that size the call takes 2 x alpha and moves S, "
                    "half the bandwidth it reaches for large sizes.")  # fmt: skip


def check_one_bucket_overlap(trace: dict) -> bool | None:
    """Profiler trace: the student's step has one all-reduce per rank (one bucket, launched once
    backward has made every gradient); its overlap shares are shown, not judged (a rank that
    launched first may show some: its gloo range includes waiting for the other)."""
    from . import tracing

    lanes = {rank: tracing.spans(trace, rank) for rank in tracing.ranks(trace)}
    calls = {rank: len(lane["communication"]) for rank, lane in lanes.items()}
    if set(calls.values()) != {1}:
        print(f"Not quite: all-reduces per rank: {calls}. One bucket must hold all 3.16 MB of "
              "gradients: bucket_cap_mb is in MiB.")  # fmt: skip
        return False
    shares = ", ".join(f"rank {rank} {tracing.overlap_share(**lane):.0%}"
                       for rank, lane in lanes.items())  # fmt: skip
    print("Correct! One all-reduce per rank, launched when backward had made every gradient: "
          f"little or nothing left to overlap with (overlap share: {shares}).")  # fmt: skip
    return True


def check_bucket_count(answer: Any, built: list[int]) -> bool | None:
    """DDP's knobs: how many buckets DDP built after the rebuild (`built`: their sizes, from
    DDP's logging data)."""
    sizes = " + ".join(f"{size:,}" for size in built)
    return _verdict(answer, len(built), f"DDP built {len(built)} bucket(s): {sizes} bytes. The "
                    "first closes as soon as it holds 1 MiB: the output layer and one 512 x 512 "
                    "layer; all the others fit in one bucket under 25 MiB.")  # fmt: skip


RESUMED_FROM = r"attempt 1: training from epoch (\d+) \(step (\d+)\)"


def check_restart_cost(run: Any, fault_step: int, answer: Any) -> bool | None:
    """Restarts: (the epoch that attempt 1 trained from, the steps done twice), read from what
    rank 0 of `run` printed: attempt 1 resumed at the step its checkpoint's epoch starts at,
    and the steps from there to the fault ran in both attempts."""
    import re

    found = re.findall(RESUMED_FROM, run.stdout[0])
    if not found:
        print("Not yet: that run made no restart. Give fault_step a step of the training "
              "(0 to 23) and run the cell again.")  # fmt: skip
        return False
    epoch, start = (int(number) for number in found[0])
    correct = (epoch, fault_step - start)
    explain = (f"The last checkpoint before step {fault_step} was saved at the end of epoch "
               f"{epoch - 1}, so attempt 1 trained from epoch {epoch} (step {start}): steps "
               f"{start} to {fault_step - 1} ran twice, {fault_step - start} steps.")  # fmt: skip

    def same(given: Any) -> bool:
        pair = list(given) if isinstance(given, (tuple, list)) else []
        return len(pair) == 2 and all(_number(g) == c for g, c in zip(pair, correct, strict=True))

    return _verdict(answer, correct, explain, accept=same)


def check_rank_augmentation(rows: Any) -> bool | None:
    """Randomness: no two ranks' DataLoader workers share a seed (rows: per rank, (sample,
    worker, worker seed, shift) of one epoch). Reproducibility is the student's part: a
    generator seeded with a fixed number and the rank, not the clock."""
    seeds = [set(np.asarray(r)[:, 2].tolist()) for r in rows]
    shared = {s for a in range(len(seeds)) for b in range(a + 1, len(seeds))
              for s in seeds[a] & seeds[b]}  # fmt: skip
    if not shared:
        print("Correct! No two ranks' workers share a seed: each rank's augmentation is its own. "
              "If you seeded the generator with a fixed number plus the rank, it is also the "
              "same every run.")  # fmt: skip
        return True
    print(f"Not quite: the ranks' workers share {len(shared)} seed(s), so they make the same "
          "random choices. Seed the generator with something that differs per rank "
          "(the rank itself).")  # fmt: skip
    return False


def check_clip_after_sync(yours: Any, reference: Any) -> bool | None:
    """Clipping: the step of the student's accumulation loop equals the reference's (clipped once,
    after the last backward, whose all-reduce made every rank's gradient the same)."""
    mine, right = np.asarray(yours[0]), np.asarray(reference[0])
    same_ranks = all(np.array_equal(np.asarray(y), mine) for y in yours)
    ok = same_ranks and np.allclose(mine, right, rtol=1e-6, atol=0)
    if ok:
        print("Correct! Clipped once, after the all-reduce: every rank scaled the same averaged "
              "gradient by the same factor, as one process would for the whole batch.")  # fmt: skip
    else:
        print("Not quite: your weights differ from the reference's. Clip once, after the last "
              "backward (outside no_sync).")  # fmt: skip
    return ok


def check_eval_wait(job: Any, evaluation_seconds: float) -> bool | None:
    """Evaluation: the job whose rank 0 evaluated for `evaluation_seconds` while rank 1 waited at
    a barrier with a timeout of its own went on (rank 1 waited long enough)."""
    if job.ok:
        print(f"Correct! Rank 1 waited through rank 0's {evaluation_seconds:g} s evaluation. "
              "Leave a margin: an evaluation can take longer on a busy machine.")  # fmt: skip
        return True
    waited = [f for f in job.failures if "Timed out" in f.message]
    if waited:
        print(f"Not yet: rank 1 gave up before rank 0's {evaluation_seconds:g} s evaluation "
              "ended. Give the barrier a timeout longer than the evaluation takes.")  # fmt: skip
    else:
        root = job.root_cause
        said = f"{root.type}: {root.message}" if root else f"exit code {job.returncode}"
        print(f"Not yet: the job failed otherwise, on {said}")
    return False


def check_compiled_pieces(reports: Any) -> bool | None:
    """torch.compile: DDPOptimizer cut the compiled DDP model into exactly 3 pieces on every rank
    (reports: per rank, what compile_and_step returned: its graph breaks and graph sizes; None
    where the cell failed before its step)."""
    if any(r is None for r in reports):
        print("Not yet: the cell did not finish its step. Run it with a cap of 1 MiB or more "
              "(smaller ones are refused, as in section 2).")  # fmt: skip
        return False
    pieces = [len(r["graphs"]) for r in reports]
    if all(p == 3 for p in pieces):
        print("Correct! Three pieces, each compiled with a backward of its own. DDP's own "
              "buckets (once you set the cap, the first is that size too) need not line up "
              "with them.")  # fmt: skip
        return True
    print(f"Not quite: DDPOptimizer cut the model into {pieces[0]} piece(s). Counting from the "
          "head back, the first piece ends at 1 MiB whatever the cap, the others once their "
          "parameters reach your cap; each layer holds 1 MiB (and 2 KiB of bias).")  # fmt: skip
    return False
