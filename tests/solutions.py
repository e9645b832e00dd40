"""Every exercise's solution, and a wrong answer, as edits of the notebook's own cells.

Kept here, out of the package and so out of the students' workspace. tests/test_solutions.py
runs the cells an exercise needs in a fresh kernel, then the exercise with the wrong answer and
its check ("Not quite" / "Not yet"), then with the solution ("Correct!"): in that order, as a
student who first runs the cell as it is and then fixes it. Notebook 12's exercise is open (no
check), so it has none.

An exercise names its cells by index in the notebook: `setup`, the cells it needs run first (in
order); `cell`, the one a student edits; `check`, the ones run after it, the last of which
checks (none when the answer sits next to its check). `edit` is the text of `cell` that an
answer replaces; `more_wrong` holds other wrong answers (the outside reviews' among them), each
an edit of its own. Notebook 18's planted bug hangs its cell: tests/test_debugging.py runs that
exercise (`tested_in`), from the text here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    notebook: str
    setup: tuple[int, ...]
    cell: int
    edit: str
    right: str
    wrong: str
    check: tuple[int, ...] = ()
    tested_in: str = "tests/test_solutions.py"
    # more wrong answers, each an edit of the cell: (text, what replaces it), run before `right`
    more_wrong: tuple[tuple[str, str], ...] = ()

    @property
    def live(self) -> bool:
        """Whether it runs on live ranks (then its notebook gets a kernel of its own)."""
        return self.notebook.split("_")[0] in {
            "08",
            "09",
            "11",
            "13",
            "14",
            "15",
            "16",
            "18",
            "19",
            "20",
            "21",
            "22",
            "23",
            "24",
            "26",
            "27",
        }


def exercise(notebook: str) -> Exercise:
    """The one exercise of `notebook` (its file stem)."""
    (found,) = [e for e in EXERCISES if e.notebook == notebook]
    return found


def answer(value: str) -> dict[str, str]:
    """An `answer = None` exercise: the answer replaces None."""
    return {"edit": "answer = None", "right": f"answer = {value}"}


CLIP = "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)"  # notebook 26, exercise 2

EXERCISES = [
    Exercise("00_introduction", (4,), 10, **answer("3"), wrong="answer = 6"),
    Exercise("01_batches", (1,), 9, **answer("5"), wrong="answer = 4"),
    Exercise("02_shards", (1,), 10, **answer("[2, 6, 0]"), wrong="answer = [2, 6]"),
    Exercise("02_shards", (1,), 12, edit="options = dict(shuffle=True, seed=0)",
             right="options = dict(shuffle=True, seed=0, drop_last=True)",
             wrong="options = dict(shuffle=False, seed=0)",
             more_wrong=(("for r in range(4)", "for r in range(2)"),   # 2 of the 4 samplers
                         ("make_dataset(18)", "make_dataset(16)"))),   # a smaller dataset
    Exercise("03_model", (1,), 6, **answer("19"), wrong="answer = 16"),
    Exercise("04_replication", (1,), 10, **answer("0"), wrong="answer = 1"),
    Exercise("05_placement", (1,), 5, **answer('"gloo"'), wrong='answer = "nccl"'),
    Exercise("06_forward", (1,), 16, **answer("8"), wrong="answer = 2"),
    Exercise("07_backward", (1,), 13, **answer("0.5"), wrong="answer = 2.0"),
    Exercise("08_allreduce", (1, 2, 3, 5), 31, check=(32,),
             edit="# adds up the four ranks' gradients",
             right="# adds up the four ranks' gradients\n    p.grad /= dist.get_world_size()",
             wrong="# adds up the four ranks' gradients\n    p.grad /= 2",
             more_wrong=(("# adds up the four ranks' gradients",   # the average on rank 0 only
                          "# adds up\n    if dist.get_rank() == 0:\n        p.grad /= 4"),
                         ("dist.all_reduce(p.grad)", "dist.reduce(p.grad, dst=0); p.grad /= 4"))),
    Exercise("09_optimizer_step", (1, 2, 3, 11), 13, check=(14,),
             edit="        (mse(mine(x), y) / len(micro)).backward()",
             right="        last = i == len(micro) - 1\n"
                   "        with contextlib.nullcontext() if last else mine.no_sync():\n"
                   "            (mse(mine(x), y) / len(micro)).backward()",
             wrong="        with mine.no_sync():\n"
                   "            (mse(mine(x), y) / len(micro)).backward()"),
    Exercise("10_training_loop", (1,), 7, **answer("0.8"), wrong="answer = 0.1"),
    Exercise("10_training_loop", (1,), 9, check=(12,),
             edit="yours = totals[0] / totals[1]",
             right="real = rank + torch.arange(len(losses), device=device()) * world < len(data)\n"
                   "mine = torch.stack([losses[real].sum(), real.sum().float()])\n"
                   "dist.all_reduce(mine)\n"
                   "yours = mine[0] / mine[1]",
             wrong="yours = losses.mean()"),
    Exercise("11_pitfalls_and_clusters", (1, 9, 10), 24, check=(25,),
             edit="device_ids=device_ids())",
             right="device_ids=device_ids(), find_unused_parameters=True)",
             wrong="device_ids=device_ids(), gradient_as_bucket_view=True)"),
    Exercise("13_communication_hooks", (1, 2, 4, 9, 11), 20, check=(21,),
             edit="rank, start = None, 2", right="rank, start = 6, 24",
             wrong="rank, start = 8, 16",
             more_wrong=(("rank, start = None, 2", "rank, start = 1, 47"),)),  # 1 step compressed
    Exercise("14_sharding_zero_fsdp", (1, 2, 4, 6, 8, 14), 16, check=(17,),
             edit="fully_shard(layer)", right="fully_shard(layer, reshard_after_forward=False)",
             wrong="fully_shard(layer, reshard_after_forward=True)"),
    Exercise("15_uneven_inputs_join", (1, 6, 7), 17, check=(18,),
             edit='train_uneven("mine/", divide_by_initial_world_size=False)',
             right='train_uneven("mine/", hook=False, divide_by_initial_world_size=False)',
             wrong='train_uneven("mine/", hook=False)'),
    Exercise("16_mixed_precision", (1, 2, 3), 10, check=(11,),
             edit="default_hooks.allreduce_hook", right="default_hooks.fp16_compress_hook",
             wrong="default_hooks.allreduce_hook"),
    Exercise("18_debugging_ddp", (1, 2, 3), 37, check=(38, 39),
             edit="        if loss.item() < target:\n",
             right="        mean = loss.detach().clone()  # decide on the loss over all ranks\n"
                   "        dist.all_reduce(mean)\n"
                   "        if mean.item() / world < target:\n",
             wrong="        if loss.item() < target:\n", tested_in="tests/test_debugging.py",
             more_wrong=(("        if loss.item() < target:\n            break\n", ""),  # never
                         ("        if loss.item() < target:\n",   # the sum, not the mean
                          "        mean = loss.detach().clone()\n        dist.all_reduce(mean)\n"
                          "        if mean.item() < target:\n"))),
    Exercise("19_build_ddp_yourself", (1, 2, 4, 6), 14, check=(15,),
             edit="        pass  # your code: divide, start the all-reduce, keep its handle",
             right="        param.grad /= dist.get_world_size()\n"
                   "        self.pending.append(dist.all_reduce(param.grad, async_op=True))",
             wrong="        self.pending.append(dist.all_reduce(param.grad, async_op=True))",
             more_wrong=(("pass  # your code: divide, start the all-reduce, keep its handle",
                          "param.grad /= dist.get_world_size()\n"
                          "        dist.all_reduce(param.grad)"),   # blocking: no overlap
                         ("pass  # your code: divide, start the all-reduce, keep its handle",
                          "param.grad /= dist.get_world_size()\n"   # waited for at once
                          "        dist.all_reduce(param.grad, async_op=True).wait()"))),
    Exercise("22_buckets_and_overlap", (1, 2, 4, 6, 17, 18), 22,
             edit="cap_mb = None", right="cap_mb = min(measured, key=measured.get)",
             wrong="cap_mb = 25"),
    Exercise("20_ring_allreduce", (1, 2, 4, 6, 7, 9), 14, check=(15,),
             edit="        pass  # your code: what to do with `received`",
             right="        chunks[incoming].copy_(received)",
             wrong="        chunks[incoming] += received",
             more_wrong=(("        pass  # your code: what to do with `received`",
                          "        chunks[incoming] = received"),)),   # the list, not the tensor
    Exercise("21_allreduce_cost", (1, 2, 4, 5), 12,
             **answer("fits[4].alpha / fits[4].beta"), wrong="answer = 1024"),
    Exercise("23_profiler_trace", (1, 2, 4), 14, check=(15,),
             edit="cap_mb = 1   # your cap, in MiB", right="cap_mb = 25", wrong="cap_mb = 2"),
    Exercise("24_ddp_knobs", (1, 2, 4, 16), 17, **answer("2"), wrong="answer = 1"),
    Exercise("25_a_rank_dies", (1, 3), 9, **answer("(2, 5)"), wrong="answer = (1, 5)",
             more_wrong=(("answer = None", "answer = (2, 21)"),)),   # every step so far
    Exercise("26_what_ranks_share", (1, 2, 4, 7), 10, check=(11,),
             edit="generator = None   # your generator for the DataLoader",
             right="generator = torch.Generator().manual_seed(1234 + rank)",
             wrong="generator = torch.Generator().manual_seed(1234)",   # the same on every rank
             more_wrong=(("generator = None   # your generator for the DataLoader",
                          "generator = torch.Generator()"),)),   # its fixed default seed
    Exercise("26_what_ranks_share", (1, 2, 4, 13, 16), 19, check=(20,),
             edit=f"        {CLIP}\noptimizer.step()", right=f"{CLIP}\noptimizer.step()",
             wrong="optimizer.step()"),   # no clipping at all
    Exercise("26_what_ranks_share", (1, 25), 28,
             edit="seconds = 1   # how long rank 1's barrier waits",
             right="seconds = 30", wrong="seconds = 3"),   # less than the 6 s evaluation
    Exercise("27_torch_compile", (1, 2, 4, 6), 20, check=(21,),
             edit="bucket_cap_mb = 1   # your cap, in MiB", right="bucket_cap_mb = 2",
             wrong="bucket_cap_mb = 1",   # one piece per layer: 4
             more_wrong=(("bucket_cap_mb = 1   # your cap, in MiB", "bucket_cap_mb = 25"),)),  # 2
]  # fmt: skip
