"""Print Kernel IR: launches, then each function's primitives as indented pseudo-code."""

from __future__ import annotations

from emmy.kernel_ir import ir as K
from emmy.symbolic import render

INDENT = "  "


def print_program(p: K.KProgram) -> str:
    lines = [f"kernel {p.name}: {len(p.launches)} launch(es)"]
    lines += [f"{INDENT}temporary {n}: {c}[{count}]"
              f"{' (zero, and left zero by every run)' if n in p.zeroed else ''}"
              for n, c, count in p.temporaries]
    lines += [f"{INDENT}zero {n} before the first launch" for n in p.zero_fill]
    for f in p.functions:
        lines.append("")
        lines.append(f"function {f.name}  grid {f.grid} × block {f.threads}, dynamic shared "
                     f"{f.shared_bytes} B  # row: {f.row}")
        params = ", ".join(f"{'out ' if q.is_output else ''}{q.name}: {q.ctype}*" for q in f.params)
        lines.append(f"{INDENT}params {params}")
        _block(f.body, 1, lines)
    return "\n".join(lines) + "\n"


def _block(stmts, depth: int, lines: list[str]) -> None:
    for s in stmts:
        _stmt(s, depth, lines)


def _stmt(s: K.KStmt, depth: int, lines: list[str]) -> None:
    pad = INDENT * depth
    match s:
        case K.For(var=v, start=a, stop=b, step=st, body=body):
            lines.append(f"{pad}for {v} in {render(a)}..{render(b)} step {st}")
            _block(body, depth + 1, lines)
        case K.If(cond=c, body=body):
            lines.append(f"{pad}if {c}")
            _block(body, depth + 1, lines)
        case K.LastBlock(tickets=t, slot=slot, count=n, body=body):
            lines.append(f"{pad}last_block of {n} (ticket {t}[{render(slot)}], fenced; reset "
                         f"after)")
            _block(body, depth + 1, lines)
        case K.Template(summary=summary):
            lines.extend(pad + line for line in summary)
        case _:
            lines.append(pad + _line(s))


def _line(s: K.KStmt) -> str:
    match s:
        case K.Index(name=n, expr=e):
            return f"{n} = {render(e)}"
        case K.Let(name=n, ctype=c, op=op, args=args):
            return f"{n} = {op}({', '.join(args)}) : {c}"
        case K.Set(name=n, value=v):
            return f"{n} := {v}"
        case K.Fold(acc=a, op=op, value=v, position=p):
            at = f" @ {render(p)}" if p is not None else ""
            return f"{a} <- {op}({a}, {v}{at})"
        case K.GlobalLoad(names=names, buffer=b, offset=off):
            return f"{', '.join(names)} = load.global.v{len(names)} {b}[{render(off)}]"
        case K.GlobalStore(buffer=b, offset=off, values=vals):
            return f"store.global.v{len(vals)} {b}[{render(off)}] = {', '.join(vals)}"
        case K.SharedArray(name=n, ctype=c, count=count, start=start):
            return f"shared {n}: {c}[{count}] at byte {start}"
        case K.SharedLoad(names=names, array=a, index=i):
            return f"{', '.join(names)} = load.shared.v{len(names)} {a}[{render(i)}]"
        case K.SharedStore(array=a, index=i, values=vals):
            return f"store.shared.v{len(vals)} {a}[{render(i)}] = {', '.join(vals)}"
        case K.CpAsync(array=a, index=i, buffer=b, offset=off, count=n):
            return f"cp.async {a}[{render(i)}] <- {b}[{render(off)}] × {n}"
        case K.CpAsyncWaitAll():
            return "cp.async.wait_all"
        case K.Barrier(scope=scope):
            return f"barrier.{scope}"
        case K.LaneCombine(accs=accs, lanes=lanes, method=m, cluster=c):
            names = ", ".join(f"{n}: {op}" for n, op, _ in accs)
            across = f", then across a cluster of {c} blocks" if c > 1 else ""
            if c > 1 and s.cluster_prefix:
                across += " (each block: the blocks before it)"
            return f"lane_combine({names}) over {lanes} lanes by {m}{across}"
        case K.ScanLanes(value=v, op=op, carry=c, incl=i, excl=e, lanes=lanes):
            return f"{i}, {e} = {'block' if lanes > 32 else 'warp'}_scan.{op}({v}, carry {c})"
        case K.AtomicAdd(buffer=b, offset=off, value=v):
            return f"atomic.add {b}[{render(off)}] += {v}"
        case K.Comment(text=t):
            return f"# {t}"
    raise AssertionError(f"unprintable {s!r}")
