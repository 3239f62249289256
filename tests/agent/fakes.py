"""A fake Evaluator with deterministic numbers, for policy and session tests."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

from agent.models import WorkloadRecord
from emmy.evaluate import Evaluation as FakeEvaluation
from emmy.evaluate import KernelInfo as FakeKernel
from emmy.schedule.row import RowError, make_row, parse

FAKE_WORKLOAD = WorkloadRecord(name="fake", path="fake.py", source="# fake\n", sha256="0" * 64)

WORK = ("block:32", "block:64", "block:128", "block:256")
TILE = ("v1x1", "v2x1", "v4x1")
REDUCE = ("serial", "shuffle", "smem")


class FakeEvaluator:
    """Two kernels: k0_norm (WORK TILE REDUCE) and, when two=True, k1_map (WORK TILE)."""

    workload_name = "fake"
    target = "sm_90a"

    def __init__(self, *, two: bool = False, device: str = "cpu", cost_model: bool = True,
                 programs: bool = False):
        self.device = device
        self.cost_model = cost_model
        # programs=True: as emmy's Evaluator, a row whose program (every kernel's row, the
        # others at their defaults) was evaluated before reuses that check and time
        self.programs: dict[tuple, FakeEvaluation] | None = {} if programs else None
        self.keys = {"k0_norm": ("WORK", "TILE", "REDUCE")}
        if two:
            self.keys["k1_map"] = ("WORK", "TILE")
        self.evaluated: list[tuple[str, str]] = []

    def _options(self, key: str) -> tuple[str, ...]:
        return {"WORK": WORK, "TILE": TILE, "REDUCE": REDUCE}[key]

    def _illegal(self, d: dict) -> list[str]:
        if d.get("WORK") == "block:32" and d.get("REDUCE") == "smem":
            return ["REDUCE=smem: a shared-memory tree needs at least 64 threads  [reduce.smem]"]
        return []

    def kernels(self):
        return [FakeKernel(k, "row" if "REDUCE" in keys else "map", f"id-{k}", keys,
                           len(self.all_rows(k)), self.default(k)) for k, keys in self.keys.items()]

    def default(self, kernel: str) -> str:
        d = {"WORK": "block:256", "TILE": "v1x1", "REDUCE": "shuffle"}
        return str(make_row({k: d[k] for k in self.keys[kernel]}))

    def all_rows(self, kernel: str) -> list[str]:
        keys = self.keys[kernel]
        rows = []
        for values in itertools.product(*(self._options(k) for k in keys)):
            d = dict(zip(keys, values))
            if not self._illegal(d):
                rows.append(str(make_row(d)))
        return rows

    def first_row(self, kernel: str, fixed: dict[str, str]) -> str | None:
        return next((r for r in self.all_rows(kernel)
                     if all(f"{k}={v}" in r.split() for k, v in fixed.items())), None)

    def grammar_text(self, kernel: str) -> dict[str, str]:
        from emmy.schedule.space import GRAMMAR_TEXT

        return {k: GRAMMAR_TEXT[k] for k in self.keys[kernel]}

    def decision_points(self, kernel: str):
        return [(k, list(self._options(k))) for k in self.keys[kernel]]

    def sample_rows(self, kernel: str, n: int, seed: int = 0) -> list[str]:
        rows = self.all_rows(kernel)
        return rows if n >= len(rows) else random.Random(seed).sample(rows, n)

    def check(self, kernel: str, row: str) -> list[str]:
        try:
            d = dict(parse(row).items)
        except RowError as e:
            return [str(e)]
        out = [f"{k}: missing" for k in self.keys[kernel] if k not in d]
        out += [f"{k}: does not apply" for k in d if k not in self.keys[kernel]]
        out += [f"{k}={v}: not an option" for k, v in d.items()
                if k in self.keys[kernel] and v not in self._options(k)]
        return out or self._illegal(d)

    def time_us(self, kernel: str, row: str) -> float:
        """Faster with more threads and wider vectors; shuffle beats smem beats serial."""
        d = dict(parse(row).items)
        threads = int(d["WORK"].split(":")[1])
        vec = int(d["TILE"][1])
        red = {"serial": 3.0, "shuffle": 1.0, "smem": 1.5}.get(d.get("REDUCE", "shuffle"))
        return round(100.0 / threads * 8 / vec + red + (0.5 if kernel == "k1_map" else 0), 6)

    def estimate_us(self, kernel: str, row: str) -> float | None:
        return self.time_us(kernel, row) if self.cost_model else None

    def evaluate(self, kernel: str, row: str) -> FakeEvaluation:
        if self.programs is None:
            return self._evaluate(kernel, row)
        key = tuple(row if k == kernel else self.default(k) for k in self.keys)
        if key in self.programs:
            same = self.programs[key]
            return replace(same, kernel=kernel, row=row,
                           same_program_as=f"{same.kernel}: {same.row}")
        self.programs[key] = result = self._evaluate(kernel, row)
        return result

    def _evaluate(self, kernel: str, row: str) -> FakeEvaluation:
        self.evaluated.append((kernel, row))
        reasons = self.check(kernel, row)
        if reasons:
            return FakeEvaluation(kernel, row, "illegal", tuple(reasons), f"id-{kernel}")
        d = dict(parse(row).items)
        if d["TILE"] == "v2x1" and d.get("REDUCE") == "serial":
            return FakeEvaluation(kernel, row, "incorrect", ("out0: max abs err 0.5",), "h-bad",
                                  max_abs_error=0.5)
        us = self.time_us(kernel, row)
        method = "measured" if self.device == "gpu" else "modeled"
        timing = {"method": method, "median_us": us, "p10_us": us * 0.98, "p90_us": us * 1.02,
                  "n": 50 if method == "measured" else 1}
        baselines = {"eager": {"method": "measured", "median_us": 20.0, "p10_us": 19.0,
                               "p90_us": 21.0, "n": 50}} if method == "measured" else {}
        return FakeEvaluation(kernel, row, "ok", (), f"h-{kernel}-{row}",
                              {"registers": 32, "shared_bytes": 0, "spill_bytes": 0},
                              1e-7, 1e-7, timing, baselines)

    def read_ir(self, stage: str, kernel: str | None = None, row: str | None = None) -> str:
        return f"{stage} IR of {kernel or 'all kernels'}" + (f" with {row}" if row else "")
