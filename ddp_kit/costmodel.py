"""The alpha-beta model of one collective, and what it says about DDP's gradient buckets.

Pure Python and numpy: usable inside the ranks and in the notebook alike.

Terms
-----
alpha     seconds per call, whatever its size: latency and fixed overhead.
beta      seconds per byte of payload; 1 / beta is the bandwidth (bytes per second).
payload   the bytes each rank hands to the all-reduce (S below).
bucket    a group of gradients DDP all-reduces in one call, once backward has produced them all.
exposed   communication time left after backward ends: what the step waits for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AlphaBeta:
    """t(bytes) = alpha + beta x bytes: one all-reduce's time as a function of its payload."""

    alpha: float  # seconds per call (latency and fixed overhead)
    beta: float  # seconds per byte of payload

    def seconds(self, nbytes):
        """The time of one call with `nbytes` of payload (a float or a numpy array)."""
        return self.alpha + self.beta * nbytes

    @property
    def bandwidth(self) -> float:
        """Bytes per second: 1 / beta."""
        return 1.0 / self.beta if self.beta else math.inf

    def __str__(self) -> str:
        return f"alpha = {_duration(self.alpha)}, 1/beta = {_rate(self.bandwidth)}"


def _duration(seconds: float) -> str:
    """`seconds` in us, ms or s, to 3 significant digits."""
    for unit, scale in (("us", 1e-6), ("ms", 1e-3)):
        if abs(seconds) < 1000 * scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def _rate(bytes_per_second: float) -> str:
    """`bytes_per_second` in GB/s, MB/s or kB/s (powers of 10), to 3 significant digits."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_second >= scale:
            return f"{bytes_per_second / scale:.3g} {unit}"
    return f"{bytes_per_second / 1e3:.3g} kB/s"


def ring_link(latency: float, bandwidth: float, ranks: int) -> AlphaBeta:
    """The all-reduce of a ring of `ranks` processes over links of `latency` seconds and
    `bandwidth` bytes/s: 2(N-1) steps, each a message of S/N bytes, so
    t = 2(N-1) x latency + 2(N-1)/N x S / bandwidth."""
    if ranks < 1:
        raise ValueError(f"a ring needs at least 1 rank, not {ranks}")
    steps = 2 * (ranks - 1)
    return AlphaBeta(alpha=steps * latency, beta=steps / ranks / bandwidth)


def fit(nbytes, seconds) -> AlphaBeta:
    """Least squares fit of t = alpha + beta x bytes to measured (size, time) points, weighted
    by 1/t: each point's relative error counts equally. (Sizes span 1 KiB..64 MiB; plain least
    squares would fit only the large ones.)"""
    x = np.asarray(nbytes, dtype=float).reshape(-1)
    t = np.asarray(seconds, dtype=float).reshape(-1)
    if x.shape != t.shape:
        raise ValueError(f"{x.size} sizes but {t.size} times")
    if np.unique(x).size < 2:
        raise ValueError("fitting alpha and beta needs measurements at 2 or more distinct sizes")
    if np.any(t <= 0):
        raise ValueError("every measured time must be positive")
    # (alpha + beta x) / t = 1 in the least squares sense; columns scaled to unit length
    columns = np.stack([1.0 / t, x / t], axis=1)
    scale = np.linalg.norm(columns, axis=0)
    solution, *_ = np.linalg.lstsq(columns / scale, np.ones_like(t), rcond=None)
    alpha, beta = solution / scale
    return AlphaBeta(alpha=float(alpha), beta=float(beta))


def algbw(nbytes, seconds):
    """Algorithm bandwidth, as nccl-tests reports it: payload / time, in bytes per second."""
    return np.asarray(nbytes, dtype=float) / seconds


def busbw(nbytes, seconds, ranks: int):
    """Bus bandwidth of an all-reduce, as nccl-tests reports it: algbw x 2(N-1)/N, the rate
    each rank's link carries in a ring (comparable to the link's own bandwidth, whatever N)."""
    return algbw(nbytes, seconds) * 2 * (ranks - 1) / ranks


def exposed_communication(
    bucket_bytes: Sequence[float], backward_seconds: float, link: AlphaBeta
) -> float:
    """Seconds of communication left after backward ends, per step (a generalisation of the
    overhead model Stanford CS336's assignment 2 asks for).

    Backward produces the gradients at a steady rate over `backward_seconds`, so bucket k (in
    launch order) is ready when its share of the bytes is done:
    ready_k = backward_seconds x (bytes of buckets 0..k) / total. The link sends one bucket at
    a time: done_k = max(ready_k, done_{k-1}) + link.seconds(bytes_k).
    Returns done_last - backward_seconds (at least link.seconds(last bucket)).
    """
    sizes = np.asarray(bucket_bytes, dtype=float).reshape(-1)
    if sizes.size == 0 or sizes.sum() <= 0:
        raise ValueError("exposed_communication needs at least one bucket of bytes")
    ready = backward_seconds * np.cumsum(sizes) / sizes.sum()
    done = 0.0
    for ready_k, size in zip(ready, sizes, strict=True):
        done = max(float(ready_k), done) + float(link.seconds(size))
    return done - backward_seconds


def model_sweep(
    total_bytes: float, bucket_caps: Sequence[float], backward_seconds: float, link: AlphaBeta
) -> dict[float, float]:
    """exposed_communication for each bucket cap (bytes): `total_bytes` cut into buckets of
    `cap` bytes, the last one holding the rest."""
    sweep = {}
    for cap in bucket_caps:
        count = max(1, math.ceil(round(total_bytes / cap, 9)))  # round: 4.0000000001 is 4
        sizes = [cap] * (count - 1) + [total_bytes - cap * (count - 1)]
        sweep[cap] = exposed_communication(sizes, backward_seconds, link)
    return sweep


def best_cap(sweep: dict[float, float]) -> float:
    """The cap of a model_sweep with the least exposed time (of equal ones, the largest)."""
    return min(sweep, key=lambda cap: (sweep[cap], -cap))
