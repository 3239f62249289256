"""Time GPU work with CUDA events (GPU only).

Each repetition is bracketed by its own pair of events on torch's current stream, with the L2
flushed just before it: a buffer three times the L2 is *read* (clean lines, so no write-backs
land inside the next timed region). After a warm-up, repetitions come in chunks until the median
settles (the median of all samples and of the later half agree within `rtol`), `max_reps` is
reached, or the time budget is spent. The flush also gives the host a head start, so launch
latency from Python stays out of the events.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    method: str              # "measured" (this module) or "modeled" (the cost model)
    median_us: float
    p10_us: float
    p90_us: float
    n: int
    l2_flushed: bool = True
    note: str = ""

    def __str__(self) -> str:
        return (f"{self.median_us:.1f} us (p10 {self.p10_us:.1f}, p90 {self.p90_us:.1f}, "
                f"n={self.n}, {self.method})")


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values, q in [0, 100]."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def settled(samples: list[float], rtol: float) -> bool:
    """The median of all samples and the median of the later half agree within rtol."""
    if len(samples) < 4:
        return False
    full = percentile(sorted(samples), 50)
    late = percentile(sorted(samples[len(samples) // 2:]), 50)
    return abs(full - late) <= rtol * full


def summarize(samples_us: list[float], *, l2_flushed: bool, note: str = "") -> Timing:
    s = sorted(samples_us)
    return Timing("measured", percentile(s, 50), percentile(s, 10), percentile(s, 90), len(s),
                  l2_flushed, note)


class L2Flush:
    """Evicts the L2 by reading a buffer `factor` times its size."""

    def __init__(self, device=None, factor: int = 3):
        import torch

        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else device
        props = torch.cuda.get_device_properties(dev)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.bytes = factor * l2
        self.buffer = torch.ones(self.bytes // 4, dtype=torch.int32, device=dev)
        self._sum_dtype = torch.int64

    def __call__(self) -> None:
        self.buffer.sum(dtype=self._sum_dtype)


def time_cuda(fn: Callable[[], object], *, warmup_s: float = 0.05, min_reps: int = 10,
              max_reps: int = 1000, budget_s: float = 2.0, rtol: float = 0.01,
              flush_l2: bool = True, flush: L2Flush | None = None) -> Timing:
    """Median, p10 and p90 of `fn` (which only enqueues work on the current stream), in µs."""
    import torch

    flusher = (flush or L2Flush()) if flush_l2 else None
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    once = _chunk(fn, 1, flusher)[0]
    warm = min(max(1, int(warmup_s * 1e6 / max(once, 1.0))), 100)
    _chunk(fn, warm, flusher)
    chunk = max(1, min(50, int(0.02 * 1e6 / max(once, 1.0))))   # ~20 ms of work per chunk
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        samples += _chunk(fn, min(chunk, max_reps - len(samples)), flusher)
        if len(samples) >= max_reps:
            break
        if len(samples) >= min_reps and settled(samples, rtol):
            break
        if time.perf_counter() - start > budget_s and len(samples) >= 3:
            break
    note = "" if len(samples) >= min_reps else f"budget spent after {len(samples)} repetitions"
    return summarize(samples, l2_flushed=flusher is not None, note=note)


def _chunk(fn, n: int, flusher) -> list[float]:
    """n timed repetitions, each between its own events; µs each."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for begin, end in events:
        if flusher is not None:
            flusher()
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [begin.elapsed_time(end) * 1000.0 for begin, end in events]
