"""Record files: safe round trip, and clear errors for missing or corrupt files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ddp_kit import RecordError, Records
from ddp_kit.shared.records import RecordWriter


def write(tmp_path, rank, **values):
    writer = RecordWriter(tmp_path, rank)
    for name, value in values.items():
        writer.add(name, value)
    writer.save()


def test_round_trip_of_tensors_numbers_lists_and_text(tmp_path):
    for rank in range(2):
        write(tmp_path, rank, grad=torch.ones(2, 2) * rank, lr=0.1, idx=[rank, rank + 2], tag="x")
    records = Records.load(tmp_path, 2)
    assert records["grad"].shape == (1, 2, 2, 2) and records["grad"][0, 1].sum() == 4
    assert records["lr"].tolist() == [[0.1, 0.1]]
    assert records["idx"][0].tolist() == [[0, 2], [1, 3]]
    assert records.get("tag", 0, 1) == "x"


def test_steps_default_to_the_next_one(tmp_path):
    writer = RecordWriter(tmp_path, 0)
    assert [writer.add("loss", v) for v in (3.0, 2.0)] == [0, 1]
    assert writer.add("loss", 1.0, step=10) == 10


def test_ragged_records_explain_how_to_read_them(tmp_path):
    write(tmp_path, 0, idx=[0, 1, 2])
    write(tmp_path, 1, idx=[3])
    records = Records.load(tmp_path, 2)
    with pytest.raises(RecordError, match="different shapes"):
        records["idx"]
    assert records.get("idx", 0, 1).tolist() == [3]


def test_corrupt_npz_names_rank_and_file(tmp_path):
    write(tmp_path, 0, a=np.zeros(3))
    (tmp_path / "rank0.npz").write_bytes(b"not a zip file")
    with pytest.raises(RecordError, match=r"Record file of rank 0 is corrupt: .*rank0\.npz"):
        Records.load(tmp_path, 1)


def test_missing_npz_names_rank_and_file(tmp_path):
    write(tmp_path, 1, a=np.zeros(3))
    (tmp_path / "rank1.npz").unlink()
    with pytest.raises(RecordError, match=r"Record file of rank 1 is missing: .*rank1\.npz"):
        Records.load(tmp_path, 2)


def test_corrupt_manifest_names_rank_and_file(tmp_path):
    write(tmp_path, 0, a=1.0)
    (tmp_path / "rank0.json").write_text("{truncated")
    with pytest.raises(RecordError, match=r"manifest of rank 0 is corrupt: .*rank0\.json"):
        Records.load(tmp_path, 1)


def test_pickled_arrays_are_refused(tmp_path):
    write(tmp_path, 0, a=1.0)
    np.savez(tmp_path / "rank0.npz", a0=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(RecordError, match="rank 0 is corrupt"):
        Records.load(tmp_path, 1)


def test_unrecordable_values_are_refused(tmp_path):
    with pytest.raises(RecordError, match="Cannot record object"):
        RecordWriter(tmp_path, 0).add("thing", object())
