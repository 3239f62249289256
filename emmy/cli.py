"""`emmy`: compile a PyTorch workload, print any IR stage, run and check it.

Exit codes: 0 success, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from emmy.errors import UserError, unknown_kernel

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a UserError (exit 2, our format)."""

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message}", hint=f"`{self.prog} --help` lists the options")


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", help="workload file (class Model, get_inputs, get_init_inputs)")
    p.add_argument("-c", dest="expr", metavar="EXPR",
                   help='an expression over torch, nn and F whose torch.randn(...) (and other tensor '
                        'factory) calls are the inputs, e.g. "nn.RMSNorm(2048)(torch.randn(32, '
                        '2048))" or "F.softmax(torch.randn(8, 1000), dim=-1)"')
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                   help="override a module-level constant of the file (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    from emmy.pipeline import STAGE_NAMES

    parser = _Parser(prog="emmy", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    comp = sub.add_parser("compile", help="print an IR stage of a workload")
    _add_workload_args(comp)
    _add_schedule_args(comp)
    comp.add_argument("--ir", default="loop", choices=(*STAGE_NAMES, "ptx", "sass", "all"),
                      help="the stage to print (default: loop; all: every stage in order)")

    run = sub.add_parser("run", help="run a workload's compiled program")
    _add_workload_args(run)
    _add_schedule_args(run)
    run.add_argument("--check", action="store_true",
                     help="compare every output with PyTorch eager (exit 1 on a mismatch)")
    run.add_argument("--bench", action="store_true",
                     help="check on fresh inputs, then time: measured on a GPU, modeled elsewhere")
    run.add_argument("--json", dest="json_out", metavar="OUT", help="write the --bench report as JSON")
    run.add_argument("--engine", choices=("cuda", "loop"), default="cuda",
                     help="cuda: the emitted CUDA (CPU emulation without a GPU); loop: the Loop "
                          "IR reference interpreter")

    space = sub.add_parser("space", help="list each kernel's decision points and legal rows")
    _add_workload_args(space)
    space.add_argument("--kernel", metavar="K", help="only this kernel")
    space.add_argument("--target", default="sm_90a", help="sm_90a (H100/H200, default) or sm_80")
    space.add_argument("--sample", type=int, default=5, metavar="N", help="sample rows to show")
    space.add_argument("--json", action="store_true", help="print JSON")

    bench = sub.add_parser("bench", help="the GPU performance suites (needs a CUDA GPU)")
    bench.add_argument("--suite", required=True,
                       choices=("core", "matmul", "attention", "conv", "rows", "gather", "block", "all"))
    bench.add_argument("--json", dest="json_out", metavar="OUT", help="also write JSON here")
    bench.add_argument("--budget", type=float, default=400.0, metavar="S",
                       help="wall-clock seconds after which no new workload or row starts "
                            "(default 400)")
    bench.add_argument("--only", action="append", default=[], metavar="NAME",
                       help="only the workloads whose name starts with NAME (repeatable)")
    bench.add_argument("--row", action="append", default=[],
                       help='a schedule row to check and time besides the planned ones, '
                            '"ROW" (for every kernel it is legal for) or "KERNEL: ROW" '
                            '(repeatable)')

    sub.add_parser("ops", help="list the torch ops the compiler supports")

    cache = sub.add_parser("cache", help="the compile cache: its size, pruning, clearing")
    what = cache.add_mutually_exclusive_group()
    what.add_argument("--prune", action="store_true",
                      help="remove the least recently used artifacts down to the limit now")
    what.add_argument("--clear", action="store_true",
                      help="remove every artifact (the schedule database stays)")
    cache.add_argument("--max-mb", type=float, metavar="MB",
                       help="the limit --prune holds to (default: $EMMY_CACHE_MAX_MB or 2048)")
    return parser


def _add_schedule_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--row", action="append", default=[],
                   help='a schedule row, e.g. "WORK=block:256 TILE=v4x1 REDUCE=shuffle"; repeat '
                        'it as "KERNEL: ROW" to give several kernels their rows')
    p.add_argument("--kernel", metavar="K", help="the kernel --row is for (when there are several)")
    p.add_argument("--target", default="sm_90a", help="sm_90a (H100/H200, default) or sm_80")
    p.add_argument("--db", metavar="PATH", default="",
                   help="schedule database to take tuned rows from (default: the one "
                        "emmy-agent writes; --no-db to use none)")
    p.add_argument("--no-db", dest="db", action="store_const", const=None,
                   help="ignore the schedule database: default rows where --row gives none")


def _options(args):
    from emmy.pipeline import Options

    if args.kernel and not args.row:
        raise UserError("--kernel names the kernel a --row is for; give --row too")
    return Options(target=args.target, rows=parse_row_args(args.row, args.kernel), db=args.db)


def split_row_arg(text: str) -> tuple[str | None, str]:
    """A --row value, "ROW" or "KERNEL: ROW", as (kernel name or None, row text)."""
    import re

    m = re.fullmatch(r"\s*([A-Za-z_]\w*):\s+(\S.*)", text)
    return (m[1], m[2]) if m else (None, text)


def parse_row_args(values: list[str], kernel: str | None) -> dict[str, str]:
    """--row values ("ROW" or "KERNEL: ROW") as rows by kernel name ("" = the only kernel)."""
    rows: dict[str, str] = {}
    for text in values:
        named, row = split_row_arg(text)
        name = named if named is not None else kernel or ""
        if named is not None and kernel:
            raise UserError(f"--row {text!r} names its kernel; --kernel is for a row without one")
        if name in rows:
            raise UserError(f"two rows for kernel `{name or 'the only kernel'}`: give one --row "
                            f"per kernel")
        rows[name] = row
    return rows


def load_workload(args):
    from emmy.frontend.workload import load_expr, load_file, parse_sets

    if bool(args.file) == bool(args.expr):
        raise UserError("give a workload FILE or -c EXPR (exactly one)")
    if args.expr:
        if args.sets:
            raise UserError("--set overrides constants of a workload file; it does not apply to -c")
        return load_expr(args.expr)
    return load_file(args.file, parse_sets(args.sets))


def cmd_compile(args) -> int:
    from emmy.pipeline import STAGE_NAMES, compile_to, show

    workload = load_workload(args)
    options = _options(args)
    if args.ir in ("ptx", "sass"):
        return _print_ptx(compile_to(workload, "cuda", options)["cuda"], sass=args.ir == "sass")
    last = STAGE_NAMES[-1] if args.ir == "all" else args.ir
    row_stage = "tile"  # the first stage a row changes
    ahead = STAGE_NAMES.index(last) < STAGE_NAMES.index(row_stage)
    results = compile_to(workload, row_stage if options.rows and ahead else last, options)
    if options.rows and ahead:  # the row was checked (an illegal one is refused above)
        print(f"note: a row applies from the {row_stage} stage on; the {last} IR is the same "
              f"without it (--ir {row_stage} or later shows its effect)", file=sys.stderr)
    stages = STAGE_NAMES[: STAGE_NAMES.index(last) + 1] if args.ir == "all" else (last,)
    for i, stage in enumerate(stages):
        if args.ir == "all":
            print(("\n" if i else "") + f"== {stage} IR ==")
        sys.stdout.write(show(stage, results[stage]))
    return EXIT_OK


def _print_ptx(program, *, sass: bool = False) -> int:
    """Each kernel's PTX (NVRTC), or its SASS (the cubin through cuobjdump)."""
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import disassemble
    from emmy.schedule.targets import get_target

    target = get_target(program.target)
    for unit in program.units:
        result = compile_cuda(unit.source, target, ptx=not sass)
        if not result.ok:
            print(f"emmy: error: NVRTC failed on kernel {unit.kernel}:\n{result.log}", file=sys.stderr)
            return EXIT_CHECK_FAILED
        print(f"// kernel {unit.kernel}  row: {unit.row}  ({target.name})")
        print(disassemble(result.cubin) if sass else result.ptx)
    return EXIT_OK


def cmd_run(args) -> int:
    from emmy.check import (SLOW_EMULATION_S, check_cuda_program, check_loop_program,
                            slow_emulation_note)
    from emmy.pipeline import compile_to

    workload = load_workload(args)
    options = _options(args)
    if args.engine == "loop" and args.row:
        raise UserError("--row schedules the CUDA kernels; the loop engine has no schedule")
    results = compile_to(workload, "loop" if args.engine == "loop" else "cuda", options)
    lp = results["loop"]
    count = len(results["cuda"].units) if args.engine == "cuda" else len(lp.kernels)
    print(f"{workload.name}: {count} kernel(s)")
    if args.engine == "cuda":
        for unit in results["cuda"].units:
            print(f"  {unit.kernel}: {unit.row}")
    if args.bench:
        return _bench(workload, results, args)
    if args.json_out:
        raise UserError("--json writes the --bench report; give --bench too")
    if not args.check:
        print("nothing to do without --check or --bench")
        return EXIT_OK
    if args.engine == "loop":
        report = check_loop_program(workload, results["torch"], lp)
        print("check: Loop IR on the CPU (numpy reference executor) vs PyTorch eager")
    else:
        started = time.perf_counter()
        report, failed = check_cuda_program(workload, results["torch"], results["cuda"])
        seconds = time.perf_counter() - started
        if seconds >= SLOW_EMULATION_S:
            print(f"note: {slow_emulation_note(seconds, 'the check')}", file=sys.stderr)
        if report is None:
            print(f"FAIL: {failed.failed}: {failed.status}\n{failed.log[-3000:]}")
            return EXIT_CHECK_FAILED
        print("check: emitted CUDA on the CPU (g++ + CUDA emulation; no GPU) vs PyTorch eager")
    graph = results["torch"]
    written = dict(zip(range(len(graph.returned), len(graph.outputs)), graph.updates))
    shown = set()
    for i, o in enumerate(report.outputs):
        verdict = ("ok" if o.reference == "eager" else f"ok (vs {o.reference})") if o.ok \
            else "MISMATCH" + (f" ({o.why})" if o.why else "")
        name = f"{o.name} ({graph.update_label(written[i])})" if i in written else \
            f"output {i} (the tensor {o.name} again)" if o.name in shown else o.name
        shown.add(o.name)       # the model may return one tensor at several positions
        print(f"  {name}: {o.dtype}[{','.join(map(str, o.shape))}]  max abs err {o.max_abs:.3g}"
              f"  max rel err {o.max_rel:.3g}  (atol {o.atol:g}, rtol {o.rtol:g})  {verdict}")
    print("PASS" if report.ok else "FAIL")
    return EXIT_OK if report.ok else EXIT_CHECK_FAILED


def _bench(workload, results, args) -> int:
    import json

    from emmy.bench.program import bench_program

    if args.engine != "cuda":
        raise UserError("--bench times the CUDA kernels; it does not apply to --engine loop")
    report = bench_program(workload, results)
    where = ("GPU, CUDA events" if report["device"] == "gpu"
             else "no GPU: correctness on the CPU emulator, times from the cost model")
    print(f"bench ({where}): verdict {report['verdict']}")
    for reason in report["reasons"]:
        print(f"  {reason}")
    for name, e in report["errors"].items():
        print(f"  {name}: max abs err {e['max_abs']:.3g}, max rel err {e['max_rel']:.3g}")
    for k in report["kernels"]:
        t = k.get("timing")
        timing = f"{t['median_us']:.2f} us {t['method']}" if t else "no time (check failed)"
        regs = ", ".join(f"{fn}: {r['registers']} regs, {r['dynamic_shared_bytes']} B smem, "
                         f"grid {r['grid']}" for fn, r in k["resources"].items())
        print(f"  {k['name']}: {timing}  [{regs}]  {k['row']}")
        for fn, r in k["resources"].items():   # what ptxas says costs time
            if r.get("spill_bytes"):
                print(f"    {fn}: {r['spill_bytes']} B of register spills (stores + loads)")
            for note in r.get("ptxas_warnings", ()):
                print(f"    {fn}: ptxas {note}")
    if "timing" in report:
        t = report["timing"]
        print(f"  total: {t['median_us']:.2f} us {t['method']}"
              + (f" (p10 {t['p10_us']:.2f}, p90 {t['p90_us']:.2f}, n={t['n']})"
                 if t["method"] == "measured" else ""))
    for name, speedup in report["speedups"].items():
        print(f"  speedup vs {name}: {speedup:.2f}x")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return EXIT_OK if report["verdict"] == "ok" else EXIT_CHECK_FAILED


def cmd_bench(args) -> int:
    from emmy.bench.suites import render_notes, run_suite
    from emmy.schedule.row import RowError, parse

    if args.budget <= 0:
        raise UserError(f"--budget must be a positive number of seconds, not {args.budget:g}")
    given = tuple(split_row_arg(text) for text in args.row)
    for text, (_, row) in zip(args.row, given):
        try:
            parse(row)
        except RowError as e:
            raise UserError(f"--row {text!r}: {e}") from None
    command = " ".join(["emmy bench --suite", args.suite]
                       + [f"--only {o}" for o in args.only]
                       + [f"--row '{r}'" for r in args.row]
                       + ([f"--budget {args.budget:g}"] if args.budget != 400.0 else [])
                       + ([f"--json {args.json_out}"] if args.json_out else []))
    report = run_suite(args.suite, args.json_out, budget_s=args.budget, only=tuple(args.only),
                       command=command, rows=given)
    print(report.table())
    print("\n".join(render_notes(report)))
    return EXIT_OK


def cmd_space(args) -> int:
    import json

    from emmy.pipeline import Options, compile_to
    from emmy.schedule.choose import with_cut_chains
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    workload = load_workload(args)
    target = get_target(args.target)
    results = compile_to(workload, "tile", Options(target=target.name))
    listed = with_cut_chains(results["tile"].program.kernels, results["loop"])
    kernels = [k for k in listed if not args.kernel or k.name == args.kernel]
    if not kernels:
        if not listed and not args.kernel:
            print(f"{workload.name}: no kernels (none of its outputs has an element)")
            return 0
        raise unknown_kernel(args.kernel, [k.name for k in listed])
    if args.sample < 0:
        raise UserError("--sample takes a count >= 0")
    report = []
    for k in kernels:
        space = Space(k, target)
        report.append({"name": k.name, "kind": str(k.kind), "target": target.name,
                       "count": space.count(),
                       "decision_points": {key: vals for key, vals in space.decision_points()},
                       "default": str(space.default()),
                       "rows": [str(r) for r in space.sample(args.sample)]})
    if args.json:
        print(json.dumps({"kernels": report}, indent=2))
        return EXIT_OK
    for r in report:
        print(f"kernel {r['name']}  ({r['kind']}, {r['target']}): {r['count']} legal rows")
        for key, vals in r["decision_points"].items():
            print(f"  {key:<7} {' '.join(vals)}")
        print(f"  default: {r['default']}")
        for row in r["rows"]:
            print(f"  sample:  {row}")
    return EXIT_OK


def cmd_ops(args) -> int:
    from emmy.tensor_ir.lower import SUPPORTED_OPS

    print("\n".join(SUPPORTED_OPS))
    print("# and the ops torch decomposes into these (torch._decomp's decompositions and the "
          "composite ops: diff, tile, outer, kron, tensordot, heaviside, nansum, F.unfold, ...; "
          "PT2E's quantized_decomposed quantize/dequantize/choose_qparams through their "
          "definitions); `emmy compile --ir tensor` shows what an op became; a constant sparse "
          "COO matrix times a dense one; complex64/complex128 values "
          "compute as pairs of real ones (arithmetic, products, views, sums, indexing, exp, "
          "log, sqrt, abs, angle, polar)", file=sys.stderr)
    return EXIT_OK


def cmd_cache(args) -> int:
    from emmy.cuda import cache

    if args.max_mb is not None and not (args.prune and args.max_mb > 0):
        raise UserError("--max-mb is the limit --prune holds to: give --prune and a number of "
                        "megabytes above 0")
    limit = int(args.max_mb * (1 << 20)) if args.max_mb is not None else cache.max_bytes()
    root = cache.cache_root()
    if args.clear or args.prune:
        removed, freed = cache.clear() if args.clear else cache.prune(limit)
        print(f"removed {removed} artifact(s), {freed / (1 << 20):.1f} MB")
    found = cache.entries()
    where = f"${cache.CACHE_ENV}" if os.environ.get(cache.CACHE_ENV) else "default"
    print(f"cache: {root} ({where})")
    for kind in sorted({e.kind for e in found}):
        mine = [e for e in found if e.kind == kind]
        print(f"  {kind:<10} {len(mine):6d} artifact(s) {sum(e.bytes for e in mine) / (1 << 20):9.1f} MB")
    total = sum(e.bytes for e in found) / (1 << 20)
    cap = "no limit" if limit is None else f"limit {limit / (1 << 20):.0f} MB"
    print(f"  {'total':<10} {len(found):6d} artifact(s) {total:9.1f} MB  ({cap}, "
          f"${cache.MAX_ENV})")
    print("over the limit, the least recently used artifacts go (checked at most hourly, none "
          "used in the last 10 minutes); the schedule database stays")
    return EXIT_OK


COMMANDS = {"compile": cmd_compile, "run": cmd_run, "space": cmd_space, "bench": cmd_bench,
            "ops": cmd_ops, "cache": cmd_cache}


def quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush into a closed pipe does
    not print an error on the way out."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if not args.command:
            build_parser().print_help()
            return EXIT_BAD_INPUT
        return COMMANDS[args.command](args)
    except UserError as e:
        if debug:
            traceback.print_exc()
        print(f"emmy: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # the reader went away (`emmy space ... | head`): nothing to say
        quiet_stdout()
        return EXIT_OK
    except Exception:
        traceback.print_exc()
        print("emmy: internal error (a bug in emmy, not in your input); please report it with the "
              "traceback above", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
