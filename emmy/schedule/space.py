"""The schedule space of a kernel: its decision points and the legal rows, built point by point.

Each key offers its candidate values; a value is kept only when every rule of that key passes
given the decisions already made, so the space never builds an illegal combination and
`check` refuses exactly the rows the space does not list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Iterator, Mapping

from emmy.memo import ByIdentity
from emmy.schedule import decisions as dec
from emmy.schedule.facts import Facts, facts
from emmy.schedule.row import Row, make_row
from emmy.schedule.rules import CHAIN_CUT_ROW, RULES, Ctx
from emmy.schedule.targets import Target
from emmy.tile_ir.ir import FoldKind, KernelKind, TileKernel

_POW2 = (32, 64, 128, 256, 512, 1024)
CLUSTER_SIZES = (2, 4, 8)       # portable thread-block cluster sizes
GRAMMAR: dict[str, tuple[str, ...]] = {
    "WORK": (*(f"thread:{t}" for t in _POW2), *(f"warp:{w}" for w in (1, 2, 4, 8, 16, 32)),
             *(f"block:{t}" for t in _POW2)),
    "TILE": tuple(f"v{v}x{n}" for v in (1, 2, 4, 8) for n in (1, 2, 4)),
    "REDUCE": ("serial", "shuffle", "smem",
               *(f"split:{k}:{how}" for k in (2, 4, 8, 16, 32, 64, 128)
                 for how in ("atomic", "combine", "last")),
               *(f"cluster:{c}" for c in CLUSTER_SIZES)),
    "STAGE": ("direct", "smem", "smem:async"),
    "PLACE": ("fuse", "cut"),
}
GRAMMAR_TEXT = {
    "WORK": "thread:T | warp:W | block:T  (T threads per block in 32..1024, W warps in 1..32)",
    "TILE": "vVxN  (V-element vector accesses, V in 1,2,4,8; N vectors per lane per step, 1,2,4)",
    "REDUCE": "serial | shuffle | smem | split:K:atomic | split:K:combine | split:K:last  (K "
              "blocks per job, 2..128; last: the job's last block to finish folds the partials, "
              "no second kernel) | cluster:C  (sm_90: a cluster of C blocks per job, 2, 4 or 8)",
    "STAGE": "direct | smem | smem:async",
    "PLACE": "fuse | cut",
}
_PREFERRED = {"WORK": ("block:256", "warp:4", "thread:256"), "TILE": ("v4x1", "v2x1", "v1x1"),
              "REDUCE": ("shuffle", "serial"), "STAGE": ("direct",), "PLACE": ("fuse",)}
SHORT_LANES = 8
SPLIT_GAIN = 0.9        # a template's default splits its reduction for a tenth less time
CAPPED_THREADS = 512    # blocks this large cap a thread's registers at 128 (1,024: 64)
FILL_MIN_S = 20e-6      # a product's default takes smaller tiles only past this (modeled)
SHARE_WORK = ("block:256", "block:512", "block:1024")   # a default sharing a job among blocks
SHARE_MIN_LAUNCHES = 3  # … only where its row takes this many launches' overhead (modeled)
CHAINED_REDUCES = 3     # a row kernel with more reductions a job has its WORK chosen by the model
_APPLY = {"WORK": "work", "TILE": "tile", "REDUCE": "reduce", "STAGE": "stage", "PLACE": "cut"}
_READ = {"WORK": dec.read_work, "TILE": dec.read_tile, "REDUCE": dec.read_reduce,
         "STAGE": dec.read_stage, "PLACE": lambda v: v == "cut"}


@dataclass(frozen=True)
class Refusal:
    rule: str
    key: str
    value: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}: {self.reason}  [{self.rule}]"


def keys_for(f: Facts) -> tuple[str, ...]:
    """The decision points that apply to a kernel of this shape."""
    if f.kind is KernelKind.MAP:
        return ("WORK", "TILE")
    keys = ["WORK", "TILE", "REDUCE"]
    if f.kind is KernelKind.ROW:
        if f.reused:
            keys.append("STAGE")
        if has_edge(f) or f.chain:
            keys.append("PLACE")
    return tuple(keys)


def has_edge(f: Facts) -> bool:
    """A reduce fold feeding a later map fold: the edge PLACE=cut splits."""
    kinds = f.fold_kinds
    return FoldKind.REDUCE in kinds and FoldKind.MAP in kinds[kinds.index(FoldKind.REDUCE):]


_SPACES = ByIdentity()
_DEFAULTS: dict[tuple[str, bool, str], Row] = {}   # (kernel identity, tf32, target) -> row
_DEFAULTS_KEPT = 4096


def space_of(kernel: TileKernel, target: Target) -> "Space":
    """The kernel's Space, built once per kernel object and target (a Space is immutable and
    computes its default row and counts once: rebuilding it per compile redid them)."""
    return _SPACES(kernel, target, lambda: Space(kernel, target))


def template_config(profile, kernel: TileKernel, row: Row, target: Target):
    """(problem, config) a template space's row gives its template: `profile` is the space's
    module (emmy.schedule.gemm, .flash, .b2b)."""
    ctx = profile.make_ctx(kernel, target)
    for key in profile.KEYS:
        ctx = replace(ctx, **{profile.FIELD[key]: profile.READ[key](row[key])})
    return ctx.problem, profile.config_of(ctx)


def _splits(row: Row) -> int:
    """The blocks a row's REDUCE shares each reduction among (split:S:...: S; else 1)."""
    value = row["REDUCE"]
    return int(value.split(":")[1]) if value.startswith("split:") else 1


class Space:
    """A kernel's legal rows. Contractions (matrix products) have their own decision points,
    grammar and rules (emmy.schedule.gemm); the other kinds share the ones in this module."""

    def __init__(self, kernel: TileKernel, target: Target):
        from emmy.schedule import b2b, flash, gemm

        self.kernel = kernel
        self.target = target
        self.facts = facts(kernel)
        self._modeled: dict[tuple[Row, bool], object] = {}   # _estimate's, by (row, nvrtc)
        profile = {KernelKind.CONTRACT: gemm, KernelKind.ATTENTION: flash,
                   KernelKind.CHAIN: b2b}.get(kernel.kind)
        self.template = profile is not None      # a template's space (rules in order)
        if profile is not None:
            self.keys = profile.keys_of(kernel) if hasattr(profile, "keys_of") else profile.KEYS
            self.grammar, self.grammar_text = profile.GRAMMAR, profile.GRAMMAR_TEXT
            self._rules, self._fields, self._read = profile.RULES, profile.FIELD, profile.READ
            self._preferred = profile.PREFERRED
            self._prefer = getattr(profile, "prefer", None)
            self._make_ctx = profile.make_ctx
        else:
            self.keys = keys_for(self.facts)
            self.grammar, self.grammar_text = GRAMMAR, GRAMMAR_TEXT
            self._rules, self._fields, self._read = RULES, _APPLY, _READ
            self._preferred = _PREFERRED
            self._prefer = None

    def _ctx(self):
        if self.template:
            return self._make_ctx(self.kernel, self.target)
        return Ctx(self.kernel.name, self.facts, self.target)

    def _apply(self, ctx, key: str, value: str):
        return replace(ctx, **{self._fields[key]: self._read[key](value)})

    def _refusals(self, ctx, key: str, value: str) -> list[Refusal]:
        out = []
        for r in self._rules:
            if r.key == key and (reason := r.check(ctx)) is not None:
                out.append(Refusal(r.name, key, value, reason))
                if self.template:   # a template space's rules run in order, its own check last
                    break
        return out

    def options(self, key: str, ctx) -> Iterator[tuple[str, object]]:
        """The values of `key` legal after the decisions in `ctx`, with the context they make."""
        for value in self.grammar[key]:
            nxt = self._apply(ctx, key, value)
            if not self._refusals(nxt, key, value):
                yield value, nxt

    def rows(self) -> Iterator[Row]:
        """Every legal row, depth first in key order."""
        def walk(i: int, ctx: Ctx, chosen: dict[str, str]):
            if i == len(self.keys):
                yield make_row(chosen)
                return
            key = self.keys[i]
            for value, nxt in self.options(key, ctx):
                yield from walk(i + 1, nxt, {**chosen, key: value})
        yield from walk(0, self._ctx(), {})

    @cached_property
    def all_rows(self) -> tuple[Row, ...]:
        return tuple(self.rows())

    def count(self) -> int:
        return len(self.all_rows)

    def sample(self, n: int, seed: int = 0, where=None) -> list[Row]:
        """n distinct legal rows drawn uniformly (all of them when there are fewer); `where`:
        only among the rows it accepts."""
        rows = [r for r in self.all_rows if where is None or where(r)]
        if n >= len(rows):
            return rows
        return random.Random(seed).sample(rows, n)

    def decision_points(self) -> list[tuple[str, list[str]]]:
        """Each key with the values some legal row takes."""
        seen: dict[str, list[str]] = {k: [] for k in self.keys}
        for row in self.all_rows:
            for k, v in row.items:
                if v not in seen[k]:
                    seen[k].append(v)
        return [(k, seen[k]) for k in self.keys]

    def check(self, row: Row) -> list[Refusal]:
        """Why the row is illegal for this kernel (empty when legal)."""
        out: list[Refusal] = []
        for k in row.keys:
            if k not in self.keys:
                out.append(Refusal("row.keys", k, row[k], f"{k} does not apply to kernel "
                                   f"`{self.kernel.name}`; its decision points are "
                                   f"{' '.join(self.keys)}"))
            elif row[k] not in self.grammar[k]:
                out.append(Refusal("row.grammar", k, row[k],
                                   f"not a {k} value; allowed: {self.grammar_text[k]}"))
        for k in self.keys:
            if k not in row.keys:
                out.append(Refusal("row.keys", k, "", f"missing; kernel `{self.kernel.name}` "
                                   f"decides {' '.join(self.keys)}"))
        if out:
            return out
        ctx = self._ctx()
        for key in self.keys:
            ctx = self._apply(ctx, key, row[key])
            out.extend(self._refusals(ctx, key, row[key]))
            if out and self.template:
                break    # a contraction's later rules assume the earlier decisions are legal
        return out

    def _preferences(self, key: str, ctx) -> tuple[str, ...]:
        """The default's order of values for `key`. A job whose lanes would spread over fewer
        than SHORT_LANES positions (a pooling window's rows) leaves most of a warp idle: one
        thread per job comes first there, once the jobs fill a block of 256 on every SM."""
        order = self._preferred[key]
        if self._prefer is not None:
            order = self._prefer(key, order, ctx)
        if key == "WORK" and not self.template and self.facts.axes and \
                max(n for _, n in self.facts.axes) < SHORT_LANES and \
                self.facts.jobs >= 256 * self.target.sm_count:
            order = ("thread:256", *order)
        return order

    def default(self) -> Row:
        """A reasonable legal row to use when none is given (the cost model refines this):
        at each key the first preferred value that still leads to a legal row, else the
        first legal value that does (depth first, so a late key can send an earlier back).
        A fused chain whose producer no template tiles (pooled features into a classifier, a
        convolution into a linear layer) is cut: fused, every output of the second half would
        recompute the first half (a hundredfold and more), which the cut stores once.
        A template's reduction (a product's K, attention's keys) is split where its blocks are
        fewer than the SMs and the cost model gives that a tenth less time (_cheapest_reduce);
        a product whose blocks are still too few takes a smaller tile on the same terms
        (_fill_the_gpu), and a row kernel chaining many reductions the WORK the model prefers
        (_cheapest_work), as a scan does (a warp a row, or a block for a few long rows); a row
        kernel over fewer jobs than SMs shares each job among blocks, split or in a cluster,
        where the model gives that a tenth less time (_share_few_jobs)."""
        return self._default

    @cached_property
    def _default(self) -> Row:
        """default(), found once per space, and once per kernel identity and target: kernels
        that compute the same thing on other buffers (an unrolled loop's iterations: Sinkhorn's,
        a Lovasz loss's per class) take the row the first found, which NVRTC's register
        reports may have had to confirm (a compile each)."""
        key = (self.kernel.identity, self.kernel.tf32, self.target.name)
        row = _DEFAULTS.get(key) if self.kernel.identity else None
        if row is None or self.check(row):
            row = _DEFAULTS[key] = self._found_default()
        if len(_DEFAULTS) > _DEFAULTS_KEPT:
            _DEFAULTS.clear()
        return row

    def _found_default(self) -> Row:
        if not self.template and self.facts.chain and "PLACE" in self.keys:
            values = {**CHAIN_CUT_ROW, "STAGE": "direct", "PLACE": "cut"}
            cut = make_row({k: values[k] for k in self.keys})
            if not self.check(cut):
                return cut
        row = self._preferred_row()
        if row is None:
            raise AssertionError(f"kernel {self.kernel.name}: no legal row")
        if self.template and self.facts.chain and row.get("PLACE") == "fuse":
            return self._fuse_or_cut(row)
        if self.template and "REDUCE" in self.keys:
            row = self._cheapest_reduce(row)
        if self.kernel.kind is KernelKind.CONTRACT and row.get("REDUCE", "").startswith("split"):
            row = self._cheapest_k_step(row)
        if self.kernel.kind is KernelKind.CONTRACT:
            row = self._fill_the_gpu(row)
            if row.get("PLACE") == "fuse":      # a computed operand (emmy.tile_ir.cut)
                row = self._fuse_or_cut(row)
        if not self.template and (self.facts.fold_kinds.count(FoldKind.REDUCE) > CHAINED_REDUCES
                                  or self.kernel.kind is KernelKind.SCAN):
            row = self._cheapest_work(row)
        if not self.template and self.kernel.kind in (KernelKind.ROW, KernelKind.SCAN) and \
                "REDUCE" in self.keys:
            row = self._share_few_jobs(row)
        return row

    def first_row(self, fixed: Mapping[str, str]) -> Row | None:
        """The first legal row in the default's order of preference with the values of
        `fixed` at its keys; None when there is none."""
        return self._preferred_row(fixed)

    def _preferred_row(self, fixed: Mapping[str, str] | None = None) -> Row | None:
        """The first legal row in preference order (depth first, so a late key can send an
        earlier back) whose values at the keys of `fixed` are those; None when there is none."""
        fixed = fixed or {}

        def walk(i: int, ctx, chosen: dict[str, str]) -> Row | None:
            if i == len(self.keys):
                return make_row(chosen)
            key = self.keys[i]
            options = dict(self.options(key, ctx))
            if key in fixed:
                order = [fixed[key]] if fixed[key] in options else []
            else:
                order = [v for v in self._preferences(key, ctx) if v in options]
                order += [v for v in options if v not in order]
            for value in order:
                row = walk(i + 1, options[value], {**chosen, key: value})
                if row is not None:
                    return row
            return None
        return walk(0, self._ctx(), {})

    def _estimate(self, row: Row, nvrtc: bool = False):
        """The cost model's estimate of `row` (with NVRTC's register report: None where there
        is no NVRTC here, or it refused the row), once per row: the default's steps ask again
        for the rows they share."""
        if (row, nvrtc) not in self._modeled:
            from emmy.runtime.costmodel.api import estimate_kernel

            try:
                self._modeled[row, nvrtc] = estimate_kernel(self.kernel, row, self.target,
                                                            nvrtc=nvrtc)
            except Exception:
                if not nvrtc:
                    raise
                self._modeled[row, nvrtc] = None      # no NVRTC here (or it refused one)
        return self._modeled[row, nvrtc]

    def _seconds(self, row: Row) -> float:
        return self._estimate(row).seconds

    def _compiled_seconds(self, row: Row) -> float | None:
        """The time with NVRTC's register report; None without NVRTC."""
        estimate = self._estimate(row, nvrtc=True)
        return None if estimate is None else estimate.seconds

    def _faster(self, a: Row, b: Row) -> bool:
        """Whether the cost model (no NVRTC) gives row `a` less time than row `b`."""
        return self._seconds(a) < self._seconds(b)

    def _cheapest_reduce(self, row: Row) -> Row:
        """`row`, or, where its blocks are fewer than the SMs, the legal row that differs from
        it in REDUCE alone that the cost model (no NVRTC) gives at least a tenth less time. A
        split pays off there when the reduction is long: a decoding step's matrix products (2
        rows x 4,096 x 4,096: 64 tiles) and its attention (one block per key/value head); a
        small problem pays the combine's launch and keeps one kernel. A grid of a wave or more
        keeps its row: what a split would change there (the last wave's balance) turns on how
        many blocks an SM holds, which only NVRTC's register count tells. Atomic splits are
        left to rows that ask for them: they add in whatever order the blocks finish, so a
        default row's results would vary run to run."""
        serial = self._estimate(row)
        if max(e.grid for e in serial.launches) >= self.target.sm_count:
            return row
        options = [make_row({**dict(row.items), "REDUCE": v}) for v in self.grammar["REDUCE"]
                   if v != row["REDUCE"] and not v.endswith(":atomic")]
        options = [r for r in options if not self.check(r)]
        # the fewest splits within 5% of the fastest: less scratch traffic and fewer blocks
        return self._cheaper(row, serial.seconds, options, prefer=_splits)

    def _share_few_jobs(self, row: Row) -> Row:
        """A row kernel's `row`, or, where its jobs are fewer than the SMs and it takes long
        enough to matter (SHARE_MIN_LAUNCHES launches' overhead, modeled), the row that shares
        each job among several blocks that the cost model (no NVRTC) gives at least a tenth less
        time. A pure reduction may split
        (REDUCE=split:K:combine: K blocks, then a combine kernel sums their partials, or
        split:K:last: the job's last block to finish sums them; never atomics, whose sums vary
        with the order blocks finish); on sm_90 a row or scan kernel
        may take a thread-block cluster (REDUCE=cluster:C: C blocks, one kernel, partial
        results combined through distributed shared memory; a scan's block continues from the
        totals of the blocks before it). Each in blocks of 256 to 1,024
        threads with the vector the row prefers, one or four a lane a step; among rows within 5%
        of the fastest, the fewest threads a job, then the fewest blocks. A loss's mean over
        a 4,096 x 4,096 batch is one job: one block reads all of it (5.9 ms modeled) where 64
        blocks and a combine take 37 us; a softmax over 8 rows of a 50,257-word vocabulary is
        8 blocks (132 us modeled) where clusters of 8 take 5.4 us."""
        serial = self._estimate(row)
        if max(e.grid for e in serial.launches) >= self.target.sm_count or \
                serial.seconds < SHARE_MIN_LAUNCHES * self.target.launch_overhead_s:
            return row
        # a job chaining many reductions keeps blocks under CAPPED_THREADS (see
        # _compiled_cheaper: the model without NVRTC does not see a capped thread spill)
        chained = self.facts.fold_kinds.count(FoldKind.REDUCE) > CHAINED_REDUCES
        works = [w for w in SHARE_WORK
                 if not chained or dec.read_work(w).threads < CAPPED_THREADS]
        options: dict[Row, None] = {}
        for reduce in self.grammar["REDUCE"]:
            if not (reduce.endswith((":combine", ":last")) or reduce.startswith("cluster:")):
                continue
            for work in works:
                found = self._preferred_row({"WORK": work, "REDUCE": reduce})
                if found is None:
                    continue
                options[found] = None
                vec = found["TILE"].split("x")[0]
                deeper = make_row({**dict(found.items), "TILE": f"{vec}x4"})
                if not self.check(deeper):
                    options[deeper] = None
        rows = list(options)

        def threads(r: Row) -> tuple[int, int]:
            blocks, each = dec.read_reduce(r["REDUCE"]).split, dec.read_work(r["WORK"]).threads
            return blocks * each, blocks
        return self._cheaper(row, serial.seconds, rows, prefer=threads)

    def _cheaper(self, row: Row, seconds_now: float, options, prefer=None) -> Row:
        """Of `options` (legal rows), the one `prefer` ranks lowest among those within 5% of
        the fastest (no NVRTC; without `prefer`, or between rows it ranks alike, the fastest),
        if it gives at least a tenth less time than `row`'s `seconds_now` (SPLIT_GAIN); else
        `row`."""
        if not options:
            return row
        seconds = {r: self._seconds(r) for r in options}
        near = [r for r in options if seconds[r] <= 1.05 * min(seconds.values())]
        best = min(near, key=lambda r: (prefer(r) if prefer else (), seconds[r]))
        return best if seconds[best] < SPLIT_GAIN * seconds_now else row

    def _cheapest_k_step(self, row: Row) -> Row:
        """A product split along K (a decoding batch's: few rows, a long K), or the row with
        the same tile and another k step (the rest as fixed, its WORK as preferred) that the
        cost model (no NVRTC) gives at least a tenth less time, the shortest step among those
        within 5% of the fastest, or, where the model's fastest gains less, NVRTC's register
        report gives it a tenth less time: each block's slice of K is then a few long steps
        (fewer barriers and waits a step) rather than many short ones. A quantized decoding
        layer (16 x 4,096 -> 4,096 int4 on sm_90a, split 16 ways) takes k steps of 64 for 16,
        10.0 against 11.5 us (17.4 us with NVRTC's register count: 40 a thread, 6 blocks an
        SM)."""
        inst, bm, bn, bk = _tile_dims(row["TILE"])
        fixed = {k: row[k] for k in ("REDUCE", "STAGE", "RASTER", "PLACE") if k in self.keys}
        options = {}
        for tile in self.grammar["TILE"]:
            t_inst, m, n, k = _tile_dims(tile)
            if (t_inst, m, n) == (inst, bm, bn) and k != bk and tile.count("x") == \
                    row["TILE"].count("x"):
                found = self._preferred_row({**fixed, "TILE": tile})
                if found is not None:
                    options[found] = None
        now = self._seconds(row)
        best = self._cheaper(row, now, list(options), prefer=lambda r: _tile_dims(r["TILE"])[3])
        fastest = min(options, key=self._seconds, default=None)
        if best is not row or fastest is None or self._seconds(fastest) >= now:
            return best
        # less than a tenth by the model, which assumes the registers leave the SM full:
        # NVRTC's count may say otherwise (an int8 decoding layer's steps of 16 take 40 a
        # thread, 6 blocks an SM and two waves: 17.4 us, against 10.5 us for steps of 64)
        now, then = self._compiled_seconds(row), self._compiled_seconds(fastest)
        if now is None or then is None:      # no NVRTC here: the model's word
            return row
        return fastest if then < SPLIT_GAIN * now else row

    def _fill_the_gpu(self, row: Row) -> Row:
        """A matrix product's `row`, or, where its blocks are still fewer than the SMs and it
        takes long enough to matter (FILL_MIN_S, modeled), the row with a smaller tile of the
        same instruction and k step (its warps as preferred; the same reduction, staging and
        raster) that the cost model (no NVRTC) gives at least a tenth less time: the preferred
        largest tile leaves most SMs idle on a skinny product (a router's 4,096 x 256 x
        7,168: 32 tiles of 128 x 256 on 132 SMs) where wgmma cannot split K. Among rows
        within 5% of the fastest, the largest tile."""
        serial = self._estimate(row)
        if max(e.grid for e in serial.launches) >= self.target.sm_count or \
                serial.seconds < FILL_MIN_S:
            return row
        inst, bm, bn, bk = _tile_dims(row["TILE"])
        fixed = {k: row[k] for k in ("REDUCE", "STAGE", "RASTER") if k in self.keys}
        options = {}
        for tile in self.grammar["TILE"]:
            t_inst, m, n, k = _tile_dims(tile)
            if t_inst == inst and k == bk and m * n < bm * bn and m <= bm and n <= bn:
                found = self._preferred_row({**fixed, "TILE": tile})
                if found is not None:
                    options[found] = None
        return self._cheaper(row, serial.seconds, list(options),
                             prefer=lambda r: -_tile_area(r["TILE"]))

    def _cheapest_work(self, row: Row) -> Row:
        """A row or scan kernel's `row`, or the row with other WORK (the rest as preferred) that
        the cost model (no NVRTC) gives at least a tenth less time. Where each job chains many
        reductions (a top-k's two a round), every reduction across a block waits on barriers,
        and one after another they make a block per row wait out most of its time, where a
        warp per row exchanges by shuffles alone; a scan of a few long rows leaves the GPU
        idle with a warp a row, where a block a row scans a chunk of its threads at a time."""
        options = {}
        for work in self.grammar["WORK"]:
            found = self._preferred_row({"WORK": work})
            if found is not None and found != row:
                options[found] = None
        return self._compiled_cheaper(row, list(options))

    def _compiled_cheaper(self, row: Row, options: list[Row], tries: int = 4) -> Row:
        """Of `options`, the fastest by the cost model (no NVRTC) that gives at least a tenth
        less time than `row` (SPLIT_GAIN), trying them in the model's order (at most `tries`);
        a block of CAPPED_THREADS or more must have NVRTC's register report confirm it (else
        `row`). Without the report the model does not see spills, and such a block caps a
        thread's registers (1,024 threads: 64): a thread running a top-k's rounds (a row each)
        spills past them (64 rows of 28: 9 us modeled without the report, 259 us with it,
        against 19 us for a warp a row). Smaller blocks leave a thread 128 and more, and are
        taken on the model's word, as before, without compiling."""
        seconds, limit = {r: self._seconds(r) for r in options}, SPLIT_GAIN * self._seconds(row)
        ranked = sorted((r for r in options if seconds[r] < limit), key=seconds.__getitem__)[:tries]
        for r in ranked:
            if dec.read_work(r["WORK"]).threads < CAPPED_THREADS:
                return r
            now = self._compiled_seconds(row)
            then = self._compiled_seconds(r) if now is not None else None
            if then is None:       # no NVRTC here (or it refused one): the model's word
                return r
            if then < SPLIT_GAIN * now:
                return r
        return row

    def _fuse_or_cut(self, fused: Row) -> Row:
        """A chain a template tiles is fused unless the cost model says the cut is faster: fused,
        each row block computes its slice of the intermediate again for every column tile of
        the output, which is cheap when the output has a few column tiles (an MLP's 256 outputs)
        and ruinous when it has dozens (a Llama feed-forward's 4,096: its down projection would
        compute the 14,336-wide intermediate 64 times)."""
        cut = self.first_row({"PLACE": "cut"})
        return cut if cut is not None and self._faster(cut, fused) else fused


def _tile_dims(tile: str) -> tuple[str, int, int, int]:
    """(instruction, bm, bn, bk) of a product's TILE value (inst:BMxBNxBK[xWK])."""
    inst, dims = tile.split(":")
    bm, bn, bk = (int(d) for d in dims.split("x")[:3])
    return inst, bm, bn, bk


def _tile_area(tile: str) -> int:
    _, bm, bn, _ = _tile_dims(tile)
    return bm * bn
