"""Share an evaluation budget across a workload's kernels by the gain each is expected to give."""

from __future__ import annotations

import math


def expected_gains(ev, kernels, probe: int = 8, seed: int = 0) -> dict[str, float]:
    """Per kernel: the cost model's default time minus the best of a small sample (µs).

    Without a cost model every kernel's gain is the log of its space size: a bigger space has
    more to find.
    """
    gains: dict[str, float] = {}
    for k in kernels:
        default = _estimate(ev, k.name, k.default_row)
        if default is None:
            return {k.name: math.log2(k.count + 1) for k in kernels}
        rows = ev.sample_rows(k.name, probe, seed)
        times = [t for r in rows if (t := _estimate(ev, k.name, r)) is not None]
        gains[k.name] = max(default - min(times, default=default), 0.0) + 1e-3 * default
    return gains


def _estimate(ev, kernel: str, row: str) -> float | None:
    try:
        return ev.estimate_us(kernel, row)
    except Exception:
        return None


def allocate(total: int, gains: dict[str, float]) -> dict[str, int]:
    """Whole evaluations per kernel, proportional to gain, at least one each while they last."""
    order = sorted(gains, key=lambda k: -gains[k])
    if total <= len(order):
        return {k: int(i < total) for i, k in enumerate(order)}
    share = {k: 1 for k in order}
    rest = total - len(order)
    weights = gains if sum(gains.values()) > 0 else {k: 1.0 for k in order}
    total_weight = sum(weights.values())
    exact = {k: rest * weights[k] / total_weight for k in order}
    for k in order:
        share[k] += int(exact[k])
    left = total - sum(share.values())
    for k in sorted(order, key=lambda k: -(exact[k] - int(exact[k])))[:left]:
        share[k] += 1
    return share
