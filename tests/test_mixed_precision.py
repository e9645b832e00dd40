"""bfloat16 autocast under DDP on a real 2-rank run."""

from __future__ import annotations

WORKER = "autocast.py"


def test_autocast_computes_in_bf16_and_all_reduces_float32(run):
    records = run.records
    assert records.get("autocast/out_dtype", 0, 0) == "torch.bfloat16"
    assert records.get("autocast/grad_dtype", 0, 0) == "torch.float32"
    assert records.get("autocast/sent_dtypes", 0, 0) == "float32"
    buckets = records.get("autocast/buckets", 0, 0)["buckets"]
    assert {b["dtype"] for b in buckets} == {"float32"}
