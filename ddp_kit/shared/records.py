"""Per-rank records: written by workers as npz + JSON, read back without pickle.

Each rank writes ``rank<R>.json`` (a manifest) and ``rank<R>.npz`` (the arrays). The launcher
stacks them into arrays indexed ``[step, rank, ...]``.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import RecordError

FORMAT_VERSION = 1


def to_numpy(value: Any) -> Any:
    """A torch tensor (on any device) as a numpy array; anything else as it is."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return value


def to_storable(value: Any) -> tuple[str, Any]:
    """Return ("array", ndarray) for numbers/tensors, or ("json", value) for strings and dicts."""
    value = to_numpy(value)
    if isinstance(value, (str, dict)) or value is None:
        return "json", _json_ready(value)
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind in "USV":
        return "json", _json_ready(value)
    return "array", array


def _json_ready(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except TypeError as err:
        raise RecordError(
            f"Cannot record {type(value).__name__}: record tensors, numbers, lists of numbers, "
            "strings or JSON-style dicts."
        ) from err


class RecordWriter:
    """Collects one rank's records in memory and saves them atomically."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.values: dict[str, dict[int, tuple[str, Any]]] = {}

    def add(self, name: str, value: Any, step: int | None = None) -> int:
        """Store `value` under `name` at `step` (default: the next step for that name)."""
        if not isinstance(name, str) or not name:
            raise RecordError("A record name must be a non-empty string.")
        steps = self.values.setdefault(name, {})
        step = (max(steps) + 1 if steps else 0) if step is None else int(step)
        steps[step] = to_storable(value)
        return step

    def save(self) -> None:
        """Write rank<R>.npz and rank<R>.json (via temporary files, then rename)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        manifest: dict[str, Any] = {"version": FORMAT_VERSION, "rank": self.rank, "records": []}
        for name, steps in self.values.items():
            for step, (kind, value) in sorted(steps.items()):
                entry: dict[str, Any] = {"name": name, "step": step, "kind": kind}
                if kind == "array":
                    entry["key"] = f"a{len(arrays)}"
                    arrays[entry["key"]] = value
                else:
                    entry["value"] = value
                manifest["records"].append(entry)
        npz_path = self.directory / f"rank{self.rank}.npz"
        json_path = self.directory / f"rank{self.rank}.json"
        tmp_npz = npz_path.with_suffix(".tmp.npz")
        np.savez(tmp_npz, **arrays)
        os.replace(tmp_npz, npz_path)
        tmp_json = json_path.with_suffix(".tmp")
        tmp_json.write_text(json.dumps(manifest))
        os.replace(tmp_json, json_path)


def load_rank(directory: Path, rank: int) -> dict[str, dict[int, Any]]:
    """Read one rank's records as {name: {step: value}}; errors name the rank and file."""
    json_path = Path(directory) / f"rank{rank}.json"
    npz_path = Path(directory) / f"rank{rank}.npz"
    if not json_path.exists():
        return {}
    try:
        manifest = json.loads(json_path.read_text())
        entries = manifest["records"]
    except (ValueError, KeyError, TypeError) as err:
        raise RecordError(
            f"Record manifest of rank {rank} is corrupt: {json_path} ({err})."
        ) from err
    out: dict[str, dict[int, Any]] = {}
    try:
        with np.load(npz_path, allow_pickle=False) as arrays:
            for entry in entries:
                value = arrays[entry["key"]] if entry["kind"] == "array" else entry["value"]
                out.setdefault(entry["name"], {})[int(entry["step"])] = value
    except FileNotFoundError as err:
        raise RecordError(f"Record file of rank {rank} is missing: {npz_path}.") from err
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as err:
        raise RecordError(f"Record file of rank {rank} is corrupt: {npz_path} ({err}).") from err
    return out


class Records:
    """What every rank recorded. ``records["loss"]`` is an array indexed [step, rank, ...]."""

    def __init__(self, per_rank: list[dict[str, dict[int, Any]]]) -> None:
        self.per_rank = per_rank
        self.world_size = len(per_rank)

    @classmethod
    def load(cls, directory: Path, world_size: int) -> Records:
        """Load every rank's records from a run's record directory."""
        return cls([load_rank(directory, rank) for rank in range(world_size)])

    @property
    def names(self) -> list[str]:
        """Every record name, in first-recorded order."""
        seen: dict[str, None] = {}
        for rank_records in self.per_rank:
            seen.update(dict.fromkeys(rank_records))
        return list(seen)

    def __contains__(self, name: object) -> bool:
        return any(name in rank_records for rank_records in self.per_rank)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def steps(self, name: str) -> list[int]:
        """The steps at which any rank recorded `name`, sorted."""
        self._require(name)
        return sorted({s for r in self.per_rank for s in r.get(name, {})})

    def get(self, name: str, step: int, rank: int) -> Any:
        """One value: what `rank` recorded as `name` at `step`."""
        self._require(name)
        try:
            return self.per_rank[rank][name][step]
        except (KeyError, IndexError) as err:
            raise RecordError(f"Rank {rank} recorded no {name!r} at step {step}.") from err

    def at(self, name: str, step: int = -1) -> np.ndarray:
        """The values of all ranks at one step (default: the last), indexed [rank, ...]."""
        return self[name][step]

    def __getitem__(self, name: str) -> np.ndarray:
        self._require(name)
        steps = self.steps(name)
        rows = []
        for step in steps:
            row = []
            for rank in range(self.world_size):
                if step not in self.per_rank[rank].get(name, {}):
                    raise RecordError(
                        f"{name!r} cannot be stacked: rank {rank} recorded nothing at step {step}. "
                        f"Use records.get({name!r}, step, rank) for single values."
                    )
                row.append(self.per_rank[rank][name][step])
            rows.append(row)
        try:
            return np.array(rows) if _all_arrays(rows) else np.array(rows, dtype=object)
        except ValueError as err:
            raise RecordError(
                f"{name!r} has different shapes on different ranks or steps, so it cannot be "
                f"one array. Use records.get({name!r}, step, rank) instead."
            ) from err

    def _require(self, name: str) -> None:
        if name not in self:
            known = ", ".join(self.names) or "nothing"
            raise RecordError(f"No record named {name!r}; the workers recorded: {known}.")

    def __repr__(self) -> str:
        return f"Records({', '.join(self.names) or 'none'}; {self.world_size} ranks)"


def _all_arrays(rows: list[list[Any]]) -> bool:
    return all(isinstance(v, np.ndarray) for row in rows for v in row)
