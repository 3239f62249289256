"""Traffic: where each load's bytes come from (DRAM, L2 or L1), given what earlier launches
left in L2 and the jobs resident at once; l2_hit is the hit fraction by reuse distance."""

from __future__ import annotations

from dataclasses import dataclass

from emmy.runtime.costmodel.constants import L1_REUSE_BYTES, L2_USABLE_FRACTION
from emmy.runtime.costmodel.work import Work
from emmy.schedule.targets import Target


def l2_hit(distance: float, usable: float) -> float:
    """Hit fraction of a re-read after `distance` bytes went through L2 (reuse distance):
    all hits up to the usable size, none from twice it, linear between (a pure LRU cache
    would fall off a cliff at the size; L2's hashing and replacement soften it)."""
    if distance <= usable:
        return 1.0
    return max(0.0, (2 * usable - distance) / usable) if usable else 0.0


def _window(work: Work, resident_jobs: int) -> float:
    """Bytes the resident jobs touch together: per-job rows times the jobs, shared rows once."""
    sizes: dict[str, float] = {}
    for g in work.groups:
        for ld in g.loads:
            n = min(ld.distinct, ld.per_job * resident_jobs) * ld.itemsize
            sizes[ld.buffer] = max(sizes.get(ld.buffer, 0.0), n)
    for s in work.stores:
        n = min(s.distinct, s.per_job * resident_jobs) * s.itemsize
        sizes[s.buffer] = sizes.get(s.buffer, 0.0) + n
    return sum(sizes.values())


class L2Residency:
    """Buffers earlier launches touched, least recent first: what L2 may still hold."""

    def __init__(self, usable_bytes: float):
        self.usable = usable_bytes
        self._recent: dict[str, int] = {}

    def hit(self, buffer: str, size: int) -> float:
        """Fraction of `buffer` still in L2, by the bytes touched since it was (`l2_hit`)."""
        if buffer not in self._recent:
            return 0.0
        names = list(self._recent)
        since = sum(self._recent[n] for n in names[names.index(buffer) + 1:])
        return l2_hit(since + size, self.usable)

    def touch(self, buffer: str, size: int) -> None:
        self._recent.pop(buffer, None)
        self._recent[buffer] = size


@dataclass(frozen=True, slots=True)
class _GroupTraffic:
    """One group's bytes by level, and what a lane keeps in flight beyond L1."""

    dram: float
    l2: float
    in_flight_per_lane: float       # bytes of this group's loads outstanding beyond L1


@dataclass(frozen=True, slots=True)
class Traffic:
    """A launch's bytes by level, given the L2 state and the jobs resident at once."""

    groups: tuple[_GroupTraffic, ...]
    dram_read: float
    l2_read: float
    write: float
    atomic: float                   # atomic read-modify-write bytes at L2
    atomic_chain: float             # most atomics to one address
    overfetch: float                # sector bytes moved at L2 beyond the useful ones
    touched: tuple[tuple[str, int], ...]


def classify(work: Work, resident_jobs: int, target: Target, l2: L2Residency) -> Traffic:
    """Where each load's bytes come from, in pass order (see the package docstring)."""
    usable = target.l2_bytes * L2_USABLE_FRACTION
    window = _window(work, resident_jobs)
    reread_hit = l2_hit(window, usable)
    overfetch_total = 0.0
    seen: set[str] = set()
    touched: dict[str, int] = {}
    out = []
    for g in work.groups:
        dram = l2_bytes = in_flight = overfetch = 0.0
        for ld in g.loads:
            A, F = ld.accesses * ld.itemsize, ld.distinct * ld.itemsize
            hit = reread_hit if ld.buffer in seen else l2.hit(ld.buffer, F)
            seen.add(ld.buffer)
            touched[ld.buffer] = max(touched.get(ld.buffer, 0), F)
            d, c = F * (1 - hit), F * hit
            extra = max(0.0, A - F)
            if F > L1_REUSE_BYTES:
                repeat_hit = l2_hit(F, usable)
                d, c = d + extra * (1 - repeat_hit), c + extra * repeat_hit
            dram, l2_bytes = dram + d, l2_bytes + c
            overfetch += (d + c) * (ld.overfetch - 1)
            in_flight += ld.in_flight * ((d + c) / A if A else 0.0)
        out.append(_GroupTraffic(dram, l2_bytes, in_flight))
        overfetch_total += overfetch
    write = atomic = 0.0
    chain = 0.0
    written: dict[str, float] = {}
    for s in work.stores:
        written[s.buffer] = written.get(s.buffer, 0) + s.distinct * s.itemsize
        if s.atomic:
            atomic += 2 * s.accesses * s.itemsize
            chain = max(chain, s.accesses / s.distinct)
    for name, size in written.items():
        write += size
        touched[name] = max(touched.get(name, 0), int(size))
    return Traffic(tuple(out), sum(g.dram for g in out), sum(g.l2 for g in out), write, atomic,
                   chain, overfetch_total, tuple(touched.items()))

