"""Random torch programs through the whole compiler: each one a `-c` expression (elementwise
ops with broadcasting, reductions, top-k, sort, k-th values and medians, norms, softmax,
scans, layout ops, gathers and embeddings, matrix products, SwiGLU-like pairs of products and
rotations of one, attention, convolutions, round trips through 8- to 32-bit integers with bit
operations, writes at positions: scatter_add, index_add, scatter_reduce, index_put), compiled
with its default rows and with sampled legal rows of each kernel, and checked on the CPU
emulator against PyTorch (CPU only: g++ and NVRTC, no GPU).

    .venv/bin/python bench/fuzz.py [--programs 50] [--seed 0] [--rows 1] [--time-limit S]
        [--half 0.2] [--show]

Prints a line per program (kernels, rows checked, verdict); a failing program is printed with
the command that reproduces it. A program the compiler refuses (an op it does not lower) is
counted, not a failure; an internal error, a compile error or a wrong result is. Exit code 1
when something failed, 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emmy.check import check_cuda_program  # noqa: E402
from emmy.errors import UserError  # noqa: E402
from emmy.frontend.workload import load_expr  # noqa: E402
from emmy.pipeline import compile_to  # noqa: E402
from emmy.verify import verify_rows  # noqa: E402

DIMS = (1, 3, 8, 17, 32, 64, 100)
MAX_ELEMENTS = 8192           # per tensor: the emulator runs one host thread per CUDA thread


@dataclass(frozen=True)
class Node:
    code: str
    shape: tuple[int, ...]


class Gen:
    """Random well-shaped expressions over fresh inputs `torch.randn(...)`."""

    def __init__(self, rng: random.Random, cast: str, dims: tuple[int, ...] = DIMS,
                 max_elements: int = MAX_ELEMENTS):
        self.rng, self.cast, self.dims, self.max_elements = rng, cast, dims, max_elements

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        while True:
            rank = rank or self.rng.randint(1, 3)
            shape = tuple(self.rng.choice(self.dims) for _ in range(rank))
            n = 1
            for d in shape:
                n *= d
            if n <= self.max_elements:
                return shape

    def leaf(self, shape: tuple[int, ...] | None = None) -> Node:
        shape = shape or self.shape()
        return Node(f"torch.randn{shape if len(shape) > 1 else f'({shape[0]},)'}{self.cast}",
                    shape)

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against `shape`: some axes 1, some leading axes dropped."""
        out = [1 if self.rng.random() < 0.3 else d for d in shape]
        drop = self.rng.randint(0, len(shape) - 1)
        return tuple(out[drop:])

    def program(self, depth: int) -> Node:
        start = self.rng.random()
        x = (self.attention() if start < 0.1 else self.conv() if start < 0.2
             else self.embedding() if start < 0.27 else self.leaf())
        for _ in range(depth):
            x = self.rng.choice(self.OPS)(self, x)
        return x

    def attention(self) -> Node:
        """scaled_dot_product_attention of fresh q, k, v (batch, heads, sequence, head dim):
        causal or under a mask tensor (added, or bool over at least 17 keys, so that no row
        is likely to see none; some axes broadcast), some with grouped k and v heads, some
        with v over another head dimension than q and k."""
        b, h = self.rng.choice([1, 2]), self.rng.choice([1, 2, 3, 4])
        sq, sk = self.rng.choice([1, 17, 32, 70]), self.rng.choice([1, 17, 32, 70])
        d = self.rng.choice([16, 32, 64])
        dv = d if self.rng.random() < 0.8 else self.rng.choice([16, 32, 64])   # MLA's differ
        kv = self.rng.choice([x for x in (1, 2) if h % x == 0 and x < h] or [h])
        kv = kv if self.rng.random() < 0.4 else h
        causal = self.rng.random() < 0.5 and sq == sk
        q, k, v = self.leaf((b, h, sq, d)), self.leaf((b, kv, sk, d)), self.leaf((b, kv, sk, dv))
        extra = [", is_causal=True"] if causal else []
        if not causal and self.rng.random() < 0.4:
            shape = tuple(n if self.rng.random() < 0.5 else 1 for n in (b, h, sq)) + (sk,)
            mask = (f"torch.rand{shape} > 0.3" if sk >= 17 and self.rng.random() < 0.5
                    else self.leaf(shape).code)
            extra.append(f", attn_mask={mask}")
        if kv != h:
            extra.append(", enable_gqa=True")
        return Node(f"F.scaled_dot_product_attention({q.code}, {k.code}, {v.code}"
                    f"{''.join(extra)})", (b, h, sq, dv))

    def conv(self) -> Node:
        """conv2d of a fresh (n, c, h, w) input and weight, with padding and stride."""
        n, c, o = self.rng.choice([1, 2]), self.rng.choice([1, 3, 8]), self.rng.choice([4, 8, 16])
        hw, kk = self.rng.choice([5, 8, 13]), self.rng.choice([1, 3])
        pad, stride = self.rng.choice([0, 1]), self.rng.choice([1, 2])
        x, w = self.leaf((n, c, hw, hw)), self.leaf((o, c, kk, kk))
        out = (hw + 2 * pad - kk) // stride + 1
        return Node(f"F.conv2d({x.code}, {w.code}, padding={pad}, stride={stride})",
                    (n, o, out, out))

    def embedding(self) -> Node:
        """Rows of a fresh table at random positions (a token embedding)."""
        rows, dim = self.rng.choice(self.dims[2:]), self.rng.choice(self.dims[1:])
        at = self.shape(self.rng.randint(1, 2))
        if math.prod(at) * dim > self.max_elements:
            return self.leaf()
        table = self.leaf((rows, dim))
        return Node(f"F.embedding({self._positions(0, rows, at)}, {table.code})", at + (dim,))

    def _positions(self, lo: int, hi: int, shape: tuple[int, ...]) -> str:
        return f"torch.randint({lo}, {hi}, {shape if len(shape) > 1 else f'({shape[0]},)'})"

    # --- the ops: each takes a node and returns a new one ------------------------------------

    def unary(self, x: Node) -> Node:
        f = self.rng.choice(["torch.exp({} * 0.3)", "torch.tanh({})", "torch.sigmoid({})",
                             "F.gelu({})", "F.silu({})", "torch.relu({})", "torch.abs({})",
                             # sin of a bounded value: of a large f16/bf16 one, a rounding
                             # step in its argument moves it past any output tolerance
                             "torch.sin(torch.tanh({}) * 3)", "-{}", "({} * {})",
                             "torch.log({}.abs() + 1)",
                             "torch.sqrt({}.abs())", "F.softplus({})", "({} * 0.5 + 1)",
                             "torch.clamp({}, -1, 1)", "F.leaky_relu({}, 0.1)",
                             "torch.digamma({}.abs() + 0.5)", "torch.erfinv(torch.tanh({}) * 0.9)"])
        return Node(f.format(x.code, x.code), x.shape)   # ("{} * {}" takes it twice)

    def binary(self, x: Node) -> Node:
        y = self.leaf(self.broadcastable(x.shape))
        forms = (["({} + {})", "({} - {})", "({} * {})", "torch.maximum({}, {})",
                  "({} / ({}.abs() + 1))", "torch.where({0} > 0, {0}, {1})",
                  "torch.fmax({}, {})"]
                 if self.rng.random() < 0.5 else   # or the broadcast operand first
                 ["({1} + {0})", "({1} * {0})", "torch.minimum({1}, {0})"])
        return Node(self.rng.choice(forms).format(x.code, y.code), x.shape)

    def reduce(self, x: Node) -> Node:
        d = self.rng.randrange(len(x.shape))
        rest = x.shape[:d] + x.shape[d + 1:]
        keep = x.shape[:d] + (1,) + x.shape[d + 1:]
        same = [("torch.softmax({}, {})", x.shape), ("F.log_softmax({}, {})", x.shape),
                ("torch.cumsum({}, {})", x.shape), ("F.normalize({}, dim={})", x.shape)]
        fewer = [("{}.sum({})", rest), ("{}.mean({})", rest), ("{}.amax({})", rest),
                 ("{}.var({})", rest), ("torch.logsumexp({}, {})", rest),
                 ("{}.sum({}, keepdim=True)", keep), ("{}.amax({}, keepdim=True)", keep),
                 ("({} > 0.5).any({}).float()", rest), ("({} > -1).all({}).float()", rest)]
        if len(x.shape) == 1:
            fewer = [f for f in fewer if "keepdim" in f[0]]   # keep the result a tensor
        if x.shape[d] == 1:
            fewer = [f for f in fewer if "var" not in f[0]]   # no NaN from one sample
        k = self.rng.randint(1, min(x.shape[d], 5))
        top = x.shape[:d] + (k,) + x.shape[d + 1:]
        # the k largest (smallest) values (not their positions: values a rounding apart may
        # rank otherwise in eager, and positions read on compare exactly)
        anywhere = self.rng.randint(1, x.shape[d])   # past 32 rounds of top-k: ranked
        picks = [(f"torch.topk({{}}, {k}, {{}}).values", top),
                 (f"{{}}.topk({k}, {{}}, largest=False).values", top),
                 ("torch.sort({}, {}).values", x.shape),
                 (f"torch.kthvalue({{}}, {k}, {{}}).values", rest),
                 (f"torch.kthvalue({{}}, {anywhere}, {{}}).values", rest),
                 ("torch.median({}, {}).values", rest),
                 ("torch.nanmedian({}, {}).values", rest)]
        if not rest:
            picks = picks[:3]
        n = math.prod(x.shape)
        if n > 1024:        # a long row: merge-sorted, and its top k past 32 rounds selected
            many = self.rng.randint(33, 64)
            picks += [("torch.sort({}.reshape(-1), descending=True).values", (n,)),
                      (f"{{}}.reshape(-1).topk({many}).values", (many,))]
        f, shape = self.rng.choice(same + fewer + picks)
        return Node(f.format(x.code, d), shape)

    def norm(self, x: Node) -> Node:
        last = x.shape[-1]
        forms = [f"F.layer_norm({{}}, ({last},))", f"F.rms_norm({{}}, ({last},))",
                 "({0} - {0}.mean(-1, keepdim=True))"]
        if last == 1:    # x / sqrt(x^2 + eps) is a sign function: a rounding apart at 0 is +-1
            forms.remove(forms[1])
        f = self.rng.choice(forms)
        return Node(f.format(x.code), x.shape)

    def layout(self, x: Node) -> Node:
        r = len(x.shape)
        choice = self.rng.randrange(7)
        if choice == 0 and r >= 2:
            a, b = self.rng.sample(range(r), 2)
            s = list(x.shape)
            s[a], s[b] = s[b], s[a]
            return Node(f"{x.code}.transpose({a}, {b})", tuple(s))
        if choice == 1:
            d = self.rng.randrange(r)
            return Node(f"{x.code}.flip({d})", x.shape)
        if choice == 2 and x.shape[-1] > 2:
            k = self.rng.randint(1, x.shape[-1] - 1)
            step = self.rng.choice([1, 2])
            return Node(f"{x.code}[..., {k // 2}:{k + 1}:{step}]",
                        x.shape[:-1] + (len(range(k // 2, k + 1, step)),))
        if choice == 3:
            d = self.rng.randrange(r)
            y = self.leaf(x.shape[:d] + (self.rng.choice(self.dims[:4]),) + x.shape[d + 1:])
            return Node(f"torch.cat([{x.code}, {y.code}], {d})",
                        x.shape[:d] + (x.shape[d] + y.shape[d],) + x.shape[d + 1:])
        if choice == 5 and x.shape[-1] > 1:
            d = r - 1 if self.rng.random() < 0.5 else self.rng.randrange(r)
            if x.shape[d] > 1:
                return Node(f"torch.diff({x.code}, dim={d})",
                            x.shape[:d] + (x.shape[d] - 1,) + x.shape[d + 1:])
        if choice == 6:
            d = self.rng.randrange(r)
            size = self.rng.randint(1, min(x.shape[d], 4))
            step = self.rng.randint(1, 3)
            windows = (x.shape[d] - size) // step + 1
            shape = x.shape[:d] + (windows,) + x.shape[d + 1:] + (size,)
            if math.prod(shape) <= self.max_elements:
                return Node(f"{x.code}.unfold({d}, {size}, {step})", shape)
        n = 1
        for s in x.shape:
            n *= s
        return Node(f"{x.code}.reshape(-1)", (n,))

    def matmul(self, x: Node) -> Node:
        """x @ w, the weight and the result within max_elements like the inputs."""
        rows = math.prod(x.shape[:-1])
        fits = [n for n in self.dims[1:] if max(x.shape[-1], rows) * n <= self.max_elements]
        if len(x.shape) < 2 or not fits:
            return self.unary(x)
        n = self.rng.choice(fits)
        w = self.leaf((x.shape[-1], n))
        code = f"({x.code} @ {w.code} * {1 / max(1, x.shape[-1]) ** 0.5:.4f})"
        return Node(code, x.shape[:-1] + (n,))

    def window(self, x: Node) -> Node:
        """Pools, padding and resizing over the trailing axes (as (N, C, H, W) or (N, C, L))."""
        if len(x.shape) < 3 or min(x.shape[-2:]) < 2:
            return self.unary(x)
        *lead, h, w = x.shape
        choice = self.rng.randrange(4)
        if choice == 0:
            k = self.rng.choice([2, 3]) if min(h, w) >= 3 else 2
            return Node(f"F.max_pool2d({x.code}, {k}, 2)",
                        (*lead, (h - k) // 2 + 1, (w - k) // 2 + 1))
        if choice == 1:
            return Node(f"F.avg_pool2d({x.code}, 2, 2, ceil_mode=True)",
                        (*lead, -(-h // 2), -(-w // 2)))
        if choice == 2:
            mode = self.rng.choice(["constant", "reflect", "replicate"])
            return Node(f"F.pad({x.code}, (1, 1, 1, 1), mode='{mode}')", (*lead, h + 2, w + 2))
        if len(x.shape) == 3:   # (N, C, L): one axis to resize
            return Node(f"F.interpolate({x.code}, scale_factor=2, mode='linear')",
                        (*lead, h, 2 * w))
        return Node(f"F.interpolate({x.code}, scale_factor=2, mode='nearest')",
                    (*lead, 2 * h, 2 * w))

    def batched(self, x: Node) -> Node:
        """A batched product (bmm-like), or a permutation with a broadcast axis."""
        if len(x.shape) != 3:
            return self.layout(x)
        if self.rng.random() < 0.5:
            n = self.rng.choice(self.dims[1:])
            y = self.leaf((x.shape[0], x.shape[2], n))
            return Node(f"torch.bmm({x.code}, {y.code})", (x.shape[0], x.shape[1], n))
        perm = self.rng.sample(range(3), 3)
        return Node(f"{x.code}.permute({', '.join(map(str, perm))})",
                    tuple(x.shape[i] for i in perm))

    def gather(self, x: Node) -> Node:
        """Reads at positions known at run time: rows by index (negative ones wrap), an
        index_select, a gather along an axis, or each row's largest element."""
        r, d = len(x.shape), self.rng.randrange(len(x.shape))
        m = self.rng.choice(self.dims[:5])
        choice = self.rng.randrange(4)
        if choice == 0:
            shape = (m,) + x.shape[1:]
            code = f"{x.code}[{self._positions(-x.shape[0], x.shape[0], (m,))}]"
        elif choice == 1:
            shape = x.shape[:d] + (m,) + x.shape[d + 1:]
            code = (f"torch.index_select({x.code}, {d}, "
                    f"{self._positions(0, x.shape[d], (m,))})")
        elif choice == 2:
            shape = x.shape[:d] + (m,) + x.shape[d + 1:]
            code = f"torch.gather({x.code}, {d}, {self._positions(0, x.shape[d], shape)})"
        else:
            shape = x.shape[:d] + (1,) + x.shape[d + 1:]
            code = f"(lambda t: t.gather({d}, t.argmax({d}, keepdim=True)))({x.code})"
        if math.prod(shape) > self.max_elements or r == 0:
            return self.unary(x)
        return Node(code, shape)

    def glu(self, x: Node) -> Node:
        """Products inside a model: two projections of one input combined (SwiGLU), or a
        projection read at its own and at the rotated columns (a rotary embedding)."""
        k = x.shape[-1] if x.shape else 0
        n = self.rng.choice(self.dims[1:])
        shape = x.shape[:-1] + (2 * n,)
        if len(x.shape) < 2 or math.prod(shape) > self.max_elements:
            return self.unary(x)
        s = f"{1 / max(1, k) ** 0.5:.4f}"
        if self.rng.random() < 0.5:
            a, b = self.leaf((k, 2 * n)), self.leaf((k, 2 * n))
            return Node(f"(lambda t, a, b: F.silu(t @ a * {s}) * (t @ b * {s}))"
                        f"({x.code}, {a.code}, {b.code})", shape)
        w = self.leaf((k, 2 * n))
        return Node(f"(lambda t: t * 0.5 + torch.cat((-t[..., {n}:], t[..., :{n}]), -1) * 0.25)"
                    f"({x.code} @ {w.code} * {s})", shape)

    def integer(self, x: Node) -> Node:
        """A fresh input into 8-, 16- or 32-bit integers, with bit operations, shifts and
        wrapping arithmetic, added on as floats. Clamped into the type first (a float out of
        an integer type's range converts to whatever the hardware gives), and rounded right
        after one multiply of an input: a value several fused ops computed is rounded to its
        type once, where eager rounds after each op, and a step function of it (round) could
        land on the other side of a half."""
        f = self.rng.choice([
            "((({} * 30).round().clamp(-128, 127).to(torch.int8).int() >> 1) ^ 5)",
            "(torch.bitwise_and((({} * 40).round().clamp(-128, 127).to(torch.int16) + 128)"
            ".to(torch.uint8), 0xF0) >> 4)",
            "(({} * 100).round().clamp(-8000, 8000).to(torch.int16) << 2)",
            "(({} * 50).round().clamp(0, 255).to(torch.uint8) * 3)",
            "(~({} * 9).round().clamp(-99, 99).int() | 3)",
        ])
        bits = f.format(self.leaf(x.shape).code)
        return Node(f"({x.code} + {bits}{self.cast or '.float()'})", x.shape)

    def scatter(self, x: Node) -> Node:
        """Writes at positions known at run time, repeats among them, sometimes past the 32 a
        row that are unrolled: scatter_add, index_add, scatter_reduce (with or without the
        tensor's own values) or a write through two index tensors. Sums of many halves are
        left out (eager rounds after each add, emmy once)."""
        d = self.rng.randrange(len(x.shape))
        m = self.rng.choice(self.dims)
        at = x.shape[:d] + (m,) + x.shape[d + 1:]
        if math.prod(at) > self.max_elements:
            return self.unary(x)
        idx, src = self._positions(0, x.shape[d], at), self.leaf(at).code
        half = bool(self.cast) and self.cast != ".float()"
        choice = self.rng.randrange(4)
        if choice == 0 and not half:
            code = f"{x.code}.scatter_add({d}, {idx}, {src})"
        elif choice == 1 and not half:
            code = (f"{x.code}.index_add({d}, {self._positions(0, x.shape[d], (m,))}, {src}, "
                    f"alpha={self.rng.choice([1, 0.5, -2])})")
        elif choice == 2 or len(x.shape) < 2:
            how = self.rng.choice(["amax", "amin"] if half else ["amax", "amin", "mean", "sum"])
            code = (f"{x.code}.scatter_reduce({d}, {idx}, {src}, {how!r}, "
                    f"include_self={self.rng.random() < 0.5})")
        elif not half and self.rng.random() < 0.5:
            rows = self._positions(-x.shape[0], x.shape[0], (m,))
            cols = self._positions(0, x.shape[1], (m,))
            value = self.leaf((m,) + x.shape[2:]).code
            code = f"{x.code}.index_put(({rows}, {cols}), {value}, accumulate=True)"
        else:
            # distinct positions: where one repeats, eager's order of writes is undefined (it
            # differs from run to run), so no order is right
            r, c = x.shape[0], x.shape[1]
            m = min(m, r * c)
            value = self.leaf((m,) + x.shape[2:]).code
            code = (f"(lambda t, p, v: t.index_put((p // {c} - {r}, p % {c}), v))"
                    f"({x.code}, torch.randperm({r * c})[:{m}], {value})")
        return Node(code, x.shape)

    OPS = [unary, unary, binary, binary, reduce, norm, layout, matmul, window, batched, gather,
           glu, integer, scatter]


def run(args) -> int:
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    counts = {"ok": 0, "refused": 0, "failed": 0}
    for i in range(args.programs):
        if args.time_limit and time.perf_counter() - t0 > args.time_limit:
            print(f"time limit reached after {i} programs")
            break
        cast = rng.choice([".half()", ".bfloat16()"]) if rng.random() < args.half else ""
        gen = Gen(rng, cast, args.dims, args.max_elements)
        expr = gen.program(rng.randint(1, args.depth)).code
        if args.show:
            print(f"   {expr}")
        verdict, detail, rows, kernels = _check(expr, args.rows, args.seed + i)
        counts["ok" if verdict == "ok" else "refused" if verdict == "refused" else "failed"] += 1
        print(f"{i:4d} {verdict:<14} kernels {kernels:2d}  rows {rows:3d}  {len(expr):4d} chars",
              flush=True)
        if verdict not in ("ok", "refused"):
            print(f"     {detail}\n     reproduce: .venv/bin/emmy run --check -c \"{expr}\"",
                  flush=True)
        elif verdict == "refused" and args.show:
            print(f"     {detail}")
    print(f"programs: ok {counts['ok']}, refused {counts['refused']}, failed {counts['failed']}"
          f"  ({time.perf_counter() - t0:.0f} s)")
    return 1 if counts["failed"] else 0


def _check(expr: str, rows: int, seed: int):
    """(verdict, detail, rows checked, kernels) of one program: its default rows, then
    sampled ones."""
    try:
        w = load_expr(expr)
        results = compile_to(w, "cuda")
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    except UserError as e:
        return "refused", str(e).splitlines()[0], 0, 0
    except Exception as e:  # a compiler bug: say where
        return "internal_error", f"{type(e).__name__}: {e} " + _where(e), 0, 0
    kernels = len(results["tile"].program.kernels)
    if report is None:
        return failed.status, failed.log[-600:].replace("\n", " | "), 1, kernels
    if not report.ok:
        bad = [o for o in report.outputs if not o.ok]
        return ("incorrect", f"default rows: {bad[0].name} max abs err {bad[0].max_abs:.3g}", 1,
                kernels)
    if not rows:
        return "ok", "", 1, kernels
    try:
        sampled = verify_rows(w, per_kernel=rows, seed=seed, targets=("sm_90a",))
    except Exception as e:
        return ("internal_error", f"sampling rows: {type(e).__name__}: {e} " + _where(e), 1,
                kernels)
    bad = [r for r in sampled if r.verdict != "ok"]
    if bad:
        r = bad[0]
        return (r.verdict, f"{r.kernel} --row \"{r.kernel}: {r.row}\": {r.detail[:400]}",
                1 + len(sampled), kernels)
    return "ok", "", 1 + len(sampled), kernels


def _where(e: Exception) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    last = frames[-1] if frames else None
    return f"({Path(last.filename).name}:{last.lineno})" if last else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, default=5, help="most ops per program (default 5)")
    ap.add_argument("--rows", type=int, default=1,
                    help="legal rows sampled per kernel besides the defaults (default 1)")
    ap.add_argument("--half", type=float, default=0.2,
                    help="share of programs in f16 or bf16 (default 0.2)")
    ap.add_argument("--dims", default=",".join(map(str, DIMS)), metavar="N,N,...",
                    help=f"axis sizes to draw from, smallest first (default {','.join(map(str, DIMS))})")
    ap.add_argument("--max-elements", type=int, default=MAX_ELEMENTS, metavar="N",
                    help=f"most elements of an input (default {MAX_ELEMENTS}; the emulator runs "
                         "a host thread per CUDA thread)")
    ap.add_argument("--time-limit", type=float, metavar="S")
    ap.add_argument("--show", action="store_true", help="print each program")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        args.dims = tuple(sorted(int(d) for d in args.dims.split(",")))
    except ValueError:
        args.dims = ()
    if (args.programs < 1 or args.depth < 1 or args.rows < 0 or not 0 <= args.half <= 1
            or len(args.dims) < 4 or args.dims[0] < 1 or args.max_elements < args.dims[-1]):
        print("fuzz: --programs and --depth take a positive count, --rows a count >= 0, "
              "--half a share in [0, 1], --dims four or more positive sizes, --max-elements "
              "at least the largest", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
