"""Print Kernel IR as CUDA C++: one `extern "C" __global__` function per Kernel IR function.

The source includes `emmy_kernel.cuh` (device functions by name, over the intrinsics header),
so the same text compiles with NVRTC for the GPU and with g++ against the CPU emulation header.
"""

from __future__ import annotations

from emmy.cuda.gemm_spec import last_block_lines
from emmy.dtypes import e4m3_overflow_is_nan
from emmy.kernel_ir import ir as K
from emmy.symbolic import Lin, render
from emmy.tensor_ir.ir import ReduceOp

_INFIX = {"add": "+", "sub": "-", "multiply": "*", "divide": "/", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||",
          "bitand": "&", "bitor": "|", "bitxor": "^"}
_FUNCS = {"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "floor",
          "ceil", "round", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
          "atanh", "atan2", "fmod", "lgamma", "digamma", "erfinv", "sigmoid", "reciprocal", "abs",
          "sign", "maximum", "minimum", "pow", "shl", "shr",
          "fast_exp", "fast_sigmoid"}   # emmy/kernel_ir/fastmath.py
_INTEGERS = {"long long", "int", "short", "signed char", "unsigned char"}   # a divide truncates
_OPS = {ReduceOp.SUM: "EmSum", ReduceOp.PROD: "EmProd", ReduceOp.MAX: "EmMax",
        ReduceOp.MIN: "EmMin", ReduceOp.LOGADDEXP: "EmLogAddExp"}
_ARG = {ReduceOp.ARGMAX: "true", ReduceOp.ARGMIN: "false"}


def emit_program(p: K.KProgram) -> str:
    """The CUDA source of every function a kernel's row launches. A kernel that rounds values to
    e4m3 does it as the installed torch does (e4m3_overflow_is_nan)."""
    body = [emit_function(f) for f in p.functions]
    nan = any("__nv_fp8_e4m3" in b for b in body) and e4m3_overflow_is_nan()
    head = [f"// emmy: kernel {p.name}", '#include "emmy_kernel.cuh"',
            *(f'#include "{h}"' for h in p.headers),
            *(["template <> struct EmE4m3Nan<0> { static constexpr bool value = true; };"]
              if nan else []), ""]
    return "\n".join(head + body)


def emit_function(f: K.KFunction) -> str:
    params = ", ".join(
        f"{p.ctype}* __restrict__ {p.name}" if p.is_output else f"const {p.ctype}* __restrict__ {p.name}"
        for p in f.params)
    lines = [f"// row: {f.row}",
             f"// launch: grid {f.grid}{_persistent(f)}, block {f.threads}, dynamic shared memory "
             f"{f.shared_bytes} B",
             f'extern "C" __global__ void __launch_bounds__({_bounds(f)}){_cluster(f)} '
             f'{f.name}({params}) {{',
             "  const int tid = threadIdx.x;",
             "  const long long bid = blockIdx.x;"]
    if f.shared_bytes:
        lines.append("  extern __shared__ __align__(16) unsigned char emmy_smem[];")
    lines += _block(f.body, 1)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _bounds(f: K.KFunction) -> str:
    return f"{f.threads}, {f.min_blocks}" if f.min_blocks else str(f.threads)


def _persistent(f: K.KFunction) -> str:
    return " (persistent: at most this many, as many as the GPU holds at once)" \
        if f.persistent else ""


def _cluster(f: K.KFunction) -> str:
    """Thread-block clusters along x (emmy_sm90.cuh: __cluster_dims__ on the GPU; the emulator
    takes them from the launch)."""
    return f" EMMY_CLUSTER_DIMS({f.cluster}, 1, 1)" if f.cluster > 1 else ""


def _block(stmts, depth: int) -> list[str]:
    out: list[str] = []
    for s in stmts:
        out += [("  " * depth) + line for line in _stmt(s, depth)]
    return out


def _ix(e: Lin) -> str:
    return render(e)


def _stmt(s: K.KStmt, depth: int) -> list[str]:
    match s:
        case K.Index(name=n, expr=e, wide=wide):
            return [f"const {'long long' if wide else 'int'} {n} = {_ix(e)};"]
        case K.Let():
            return _let(s)
        case K.Set(name=n, value=v):
            return [f"{n} = {v};"]
        case K.Fold():
            return [_fold(s)]
        case K.For(var=v, start=a, stop=b, step=st, body=body, unroll=unroll):
            head = ["#pragma unroll"] if unroll else []
            return head + [f"for (int {v} = {_ix(a)}; {v} < {_ix(b)}; {v} += {st}) {{",
                           *_inner(body, depth), "}"]
        case K.If(cond=c, body=body):
            return [f"if ({c}) {{", *_inner(body, depth), "}"]
        case K.GlobalLoad(names=names, ctype=c, buffer=b, offset=off):
            return _load(c, names, b, off)
        case K.GlobalStore(buffer=b, elem=t, offset=off, values=vals, explicit=explicit):
            if len(vals) == 1:
                return [f"{b}[{_ix(off)}] = em_cvt<{t}>({vals[0]});"]
            store = "em_vstore_st" if explicit else "em_vstore"
            return [f"{store}({b} + ({_ix(off)}), {', '.join(vals)});"]
        case K.SharedArray(name=n, ctype=c, start=start):
            return [f"{c}* {n} = reinterpret_cast<{c}*>(emmy_smem + {start});"]
        case K.SharedLoad(names=names, ctype=c, array=a, index=i):
            # a staged row's V elements: one vector access (16-byte aligned arrays, V | index)
            return _load(c, names, a, i)
        case K.SharedStore(array=a, elem=t, index=i, values=vals):
            if len(vals) == 1:
                return [f"{a}[{_ix(i)}] = em_cvt<{t}>({vals[0]});"]
            return [f"em_vstore({a} + ({_ix(i)}), {', '.join(vals)});"]
        case K.CpAsync(array=a, index=i, buffer=b, offset=off, count=n):
            return [f"em_cp_async<sizeof({b}[0]) * {n}>({a} + ({_ix(i)}), {b} + ({_ix(off)}));"]
        case K.CpAsyncWaitAll():
            return ["em_cp_async_wait_all();"]
        case K.Barrier(scope=scope):
            return [{"block": "__syncthreads();", "warp": "__syncwarp();",
                     "cluster": "cluster_sync();"}[scope]]
        case K.LaneCombine():
            return _combine(s)
        case K.ScanLanes(value=v, op=op, ctype=c, carry=carry, incl=incl, excl=excl,
                         lanes=lanes, scratch=scratch):
            block = f", {scratch}, {lanes}" if lanes > 32 else ""
            return [f"{c} {incl}, {excl};", f"em_{'block' if block else 'warp'}_scan<{_OPS[op]}>"
                                            f"({v}, {carry}, {incl}, {excl}{block});"]
        case K.AtomicAdd(buffer=b, elem=t, offset=off, value=v):
            return [f"atomicAdd({b} + ({_ix(off)}), em_cvt<{t}>({v}));"]
        case K.LastBlock(tickets=t, slot=slot, count=n, body=body):
            return [*last_block_lines(t, _ix(slot), n),
                    "{   // the last block: the job's partials", *_inner(body, depth), "}"]
        case K.Comment(text=t):
            return [f"// {t}"]
        case K.Template(lines=lines):
            return list(lines)
    raise AssertionError(f"no CUDA for {s!r}")


def _load(c: str, names: tuple[str, ...], base: str, index: Lin) -> list[str]:
    """names[j] = base[index + j] converted to `c`: one vector access when there are several."""
    if len(names) == 1:
        return [f"const {c} {names[0]} = em_cvt<{c}>({base}[{_ix(index)}]);"]
    return [f"{c} {', '.join(names)};", f"em_vload({base} + ({_ix(index)}), {', '.join(names)});"]


def _inner(body, depth: int) -> list[str]:
    return ["  " + line for line in _block(body, 0)]


def _let(s: K.Let) -> list[str]:
    c, n, a = s.ctype, s.name, s.args
    const = "" if s.mutable else "const "
    match s.op:
        case "identity":
            op = ReduceOp(a[0])
            if op in _ARG:
                init = "em_lowest" if op is ReduceOp.ARGMAX else "em_highest"
                return [f"{c} {n}_v = {init}<{c}>();", f"long long {n}_p = -1;"]
            return [f"{const}{c} {n} = {_OPS[op]}::identity<{c}>();"]
        case "argpos":
            return [f"const long long {n} = {a[0]}_p < 0 ? 0 : {a[0]}_p;"]
        case "copy" | "literal":
            return [f"{const}{c} {n} = {a[0]};"]
        case "cast" | "index":
            return [f"{const}{c} {n} = static_cast<{c}>({a[0]});"]
        case "where":
            return [f"{const}{c} {n} = {a[0]} ? {_as(c, a[1])} : {_as(c, a[2])};"]
        case "neg":
            return [f"{const}{c} {n} = -{a[0]};"]
        case "not":
            return [f"{const}{c} {n} = !{a[0]};"]
        case "bitnot":
            return [f"{const}{c} {n} = ~{a[0]};"]
        case "bits":                        # an integer of a float: the operand as it is
            return [f"{const}{c} {n} = em_bits({a[0]});"]
        case "float_bits":                  # a float of an integer: the operand as it is
            return [f"{const}{c} {n} = em_float_bits({a[0]});"]
        case "signbit":                     # a bool of a float: the operand as it is
            return [f"{const}{c} {n} = em_signbit({a[0]});"]
        case "divide" if c in _INTEGERS:
            return [f"{const}{c} {n} = em_idiv<{c}>({_as(c, a[0])}, {_as(c, a[1])});"]
        case op if op in _INFIX:
            return [f"{const}{c} {n} = {_as(c, f'{a[0]} {_INFIX[op]} {a[1]}')};"]
        case op if op in _FUNCS:
            cast = [_as(c, x) for x in a]
            return [f"{const}{c} {n} = em_{op}({', '.join(cast)});"]
    raise AssertionError(f"no CUDA for op {s.op}")


def _as(ctype: str, x: str) -> str:
    """`x` converted to `ctype`: a functional cast, or static_cast for a two-word type such as
    `long long` (which a functional cast cannot name)."""
    return f"static_cast<{ctype}>({x})" if " " in ctype else f"{ctype}({x})"


def _fold(s: K.Fold) -> str:
    if s.op in _ARG:
        flag = _ARG[s.op]
        if s.position is None:  # merge another accumulator
            return f"em_arg_update<{flag}>({s.acc}_v, {s.acc}_p, {s.value}_v, {s.value}_p);"
        return f"em_arg_update<{flag}>({s.acc}_v, {s.acc}_p, {s.value}, (long long)({_ix(s.position)}));"
    return f"{s.acc} = {_OPS[s.op]}::apply({s.acc}, {s.value});"


def _combine(s: K.LaneCombine) -> list[str]:
    out = []
    for name, op, _ in s.accs:
        if op in _ARG:
            flag = _ARG[op]
            if s.lanes <= 32:
                out.append(f"em_warp_allreduce_arg<{flag}>({name}_v, {name}_p);")
            else:
                out.append(f"em_block_allreduce_arg<{flag}>({name}_v, {name}_p, "
                           f"{s.scratch}, {s.lanes});")
        elif s.lanes <= 32:
            out.append(f"{name} = em_warp_allreduce<{_OPS[op]}>({name});")
        else:
            fn = "em_block_tree" if s.method == "smem" else "em_block_allreduce"
            out.append(f"{name} = {fn}<{_OPS[op]}>({name}, {s.scratch}, {s.lanes});")
    if s.cluster > 1:
        out += _cluster_combine(s)
    return out


def _cluster_combine(s: K.LaneCombine) -> list[str]:
    """Each block's combined accs into its slots (16 bytes an acc: an argmax's value, then its
    position at +8), one cluster barrier, then every block folds all the blocks' slots."""
    puts, folds = [], []
    for i, (name, op, c) in enumerate(s.accs):
        slot = f"{s.cluster_scratch} + {s.cluster_slot + 16 * i}"
        if op in _ARG:
            puts += [f"*reinterpret_cast<{c}*>({slot}) = {name}_v;",
                     f"*reinterpret_cast<long long*>({slot} + 8) = {name}_p;"]
            folds.append(f"em_cluster_fold_arg<{_ARG[op]}>({name}_v, {name}_p, {slot}, "
                         f"{s.cluster});")
        else:
            puts.append(f"*reinterpret_cast<{c}*>({slot}) = {name};")
            if s.cluster_prefix:
                folds += [f"const {c} {name}_all = em_cluster_fold<{_OPS[op]}, {c}>({slot}, "
                          f"{s.cluster});",
                          f"{name} = em_cluster_prefix<{_OPS[op]}, {c}>({slot}, "
                          "cluster_ctarank());"]
                continue
            folds.append(f"{name} = em_cluster_fold<{_OPS[op]}, {c}>({slot}, {s.cluster});")
    return ["if (threadIdx.x == 0) {", *("  " + p for p in puts), "}", "cluster_sync();", *folds]
