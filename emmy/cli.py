"""`emmy`: compile a PyTorch workload, print any IR stage, run and check it.

Exit codes: 0 success, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from emmy.errors import UserError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a UserError (exit 2, our format)."""

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message}", hint=f"`{self.prog} --help` lists the options")


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", help="workload file (class Model, get_inputs, get_init_inputs)")
    p.add_argument("-c", dest="expr", metavar="EXPR",
                   help='a module call, e.g. "nn.RMSNorm(2048)(torch.randn(32, 2048))"')
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                   help="override a module-level constant of the file (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    from emmy.pipeline import STAGE_NAMES

    parser = _Parser(prog="emmy", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    comp = sub.add_parser("compile", help="print an IR stage of a workload")
    _add_workload_args(comp)
    comp.add_argument("--ir", default="loop", choices=(*STAGE_NAMES, "all"),
                      help="the stage to print (default: loop; all: every stage in order)")

    run = sub.add_parser("run", help="run a workload's compiled program")
    _add_workload_args(run)
    run.add_argument("--check", action="store_true",
                     help="compare every output with PyTorch eager (exit 1 on a mismatch)")

    sub.add_parser("ops", help="list the torch ops the compiler supports")
    return parser


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
    last = STAGE_NAMES[-1] if args.ir == "all" else args.ir
    results = compile_to(workload, last)
    stages = STAGE_NAMES[: STAGE_NAMES.index(last) + 1] if args.ir == "all" else (last,)
    for i, stage in enumerate(stages):
        if args.ir == "all":
            print(("\n" if i else "") + f"== {stage} IR ==")
        sys.stdout.write(show(stage, results[stage]))
    return EXIT_OK


def cmd_run(args) -> int:
    from emmy.check import check_loop_program
    from emmy.pipeline import compile_to

    workload = load_workload(args)
    results = compile_to(workload, "loop")
    lp = results["loop"]
    print(f"{workload.name}: {len(lp.kernels)} kernel(s): "
          + ", ".join(k.name for k in lp.kernels))
    if not args.check:
        print("nothing to do without --check (the GPU runtime and --bench come with the CUDA backend)")
        return EXIT_OK
    report = check_loop_program(workload, results["torch"], lp)
    print("check: Loop IR on the CPU (numpy reference executor) vs PyTorch eager")
    for o in report.outputs:
        verdict = "ok" if o.ok else "MISMATCH"
        print(f"  {o.name}: {o.dtype}[{','.join(map(str, o.shape))}]  max abs err {o.max_abs:.3g}"
              f"  max rel err {o.max_rel:.3g}  (atol {o.atol:g}, rtol {o.rtol:g})  {verdict}")
    print("PASS" if report.ok else "FAIL")
    return EXIT_OK if report.ok else EXIT_CHECK_FAILED


def cmd_ops(args) -> int:
    from emmy.tensor_ir.lower import SUPPORTED_OPS

    print("\n".join(SUPPORTED_OPS))
    return EXIT_OK


COMMANDS = {"compile": cmd_compile, "run": cmd_run, "ops": cmd_ops}


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
    except Exception:
        traceback.print_exc()
        print("emmy: internal error (a bug in emmy, not in your input); please report it with the "
              "traceback above", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
