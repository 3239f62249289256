"""`emmy-agent`: optimize a workload's schedules, replay a trace, propose a row, report.

Exit codes: 0 success, 1 a check failed (a row did not reproduce, a proposed row is not ok),
2 bad input (no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.evaluator import BadInput
from emmy.errors import UserError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BadInput(f"{self.prog}: {message} (`{self.prog} --help` lists the options)")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="emmy-agent", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    o = sub.add_parser("optimize", help="search a workload's schedules (LLM or built-in search)")
    o.add_argument("file", nargs="?", help="workload file (class Model, get_inputs, get_init_inputs)")
    _expr_arg(o)
    o.add_argument("--policy", choices=("llm", "search", "random"),
                   help="default: llm when OPENAI_API_KEY / OPENAI_BASE_URL / --base-url is set, "
                        "else search")
    o.add_argument("--model", help="model name for the llm policy (default $OPENAI_MODEL or gpt-4o-mini)")
    o.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://localhost:8000/v1")
    o.add_argument("--budget", type=_positive(int), default=20, metavar="N", help="evaluations (default 20)")
    o.add_argument("--max-turns", type=_positive(int), metavar="N",
                   help="LLM replies (or built-in policy steps)")
    o.add_argument("--max-tokens", type=_positive(int), metavar="N", help="LLM tokens, prompt + completion")
    o.add_argument("--time-limit", type=_positive(float), metavar="S", help="wall-clock seconds")
    o.add_argument("--trace", metavar="PATH", help="trace file (default traces/<time>-<workload>-<policy>.jsonl)")
    o.add_argument("--resume", metavar="TRACE", help="continue an interrupted run without repeating evaluations")
    o.add_argument("--seed", type=int, default=0, help="seed of the search and random policies")
    o.add_argument("--retry-backoff", type=_positive(float), default=1.0, metavar="S",
                   help="first wait before retrying the LLM server (doubles each time)")
    _common(o)

    r = sub.add_parser("replay", help="re-execute a trace's rows and report what changed")
    r.add_argument("trace", help="a trace file")
    r.add_argument("--render", action="store_true", help="show the run without executing anything")
    r.add_argument("--llm", action="store_true", help="re-drive the agent loop from the recorded LLM replies")
    r.add_argument("--trace-out", metavar="PATH", help="trace of the --llm re-drive")
    r.add_argument("--json", metavar="OUT", help="write the report as JSON ('-' for stdout)")

    pr = sub.add_parser("propose", help="evaluate a row you propose, through the same checks")
    pr.add_argument("file", nargs="?", help="workload file")
    _expr_arg(pr)
    pr.add_argument("--row", required=True, help='e.g. "WORK=block:256 TILE=v4x1 REDUCE=shuffle"')
    pr.add_argument("--kernel", metavar="K", help="the kernel the row is for (when there are several)")
    pr.add_argument("--trace", metavar="PATH", help="append to this trace (created when missing)")
    _common(pr)

    rep = sub.add_parser("report", help="chart best time against evaluations for traces")
    rep.add_argument("traces", nargs="+", metavar="TRACE")
    rep.add_argument("-o", dest="out", default="report.html", metavar="PICTURE",
                     help=".html (default report.html), .svg, or .png (needs matplotlib)")
    return p


def _expr_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", dest="expr", metavar="EXPR",
                   help='instead of a file, an expression as `emmy compile -c` takes it, e.g. '
                        '"F.softmax(torch.randn(256, 1024).half(), dim=-1)"')


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                   help="override a module-level constant of the workload file (repeatable)")
    p.add_argument("--target", default="sm_90a", help="sm_90a (H100/H200, default) or sm_80")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where rows run: auto (the GPU when there is one), cpu (times modeled), gpu")
    p.add_argument("--db", metavar="PATH", help="schedule database (default ~/.cache/emmy/schedules.json)")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON ('-' for stdout)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")


def _write_json(out: str | None, data: dict) -> None:
    if not out:
        return
    text = json.dumps(data, indent=2, default=str)
    if out == "-":
        print(text)
    else:
        Path(out).write_text(text + "\n")


def cmd_optimize(a) -> int:
    from agent.console import View
    from agent.run import RunConfig, optimize

    if not a.file and not a.expr and not a.resume:
        raise BadInput("give a workload FILE (or -c EXPR) to optimize, or --resume TRACE")
    if a.resume and (a.file or a.expr):
        raise BadInput("--resume continues the workload its trace records; drop the workload")
    if a.resume and a.trace:
        raise BadInput("--resume appends to the trace it continues; drop --trace")
    cfg = RunConfig(file=a.file, expr=a.expr, sets=a.sets, target=a.target, device=a.device,
                    policy=a.policy, model=a.model,
                    base_url=a.base_url, budget=a.budget, max_turns=a.max_turns,
                    max_tokens=a.max_tokens, time_limit=a.time_limit, trace=a.trace,
                    resume=a.resume, db=a.db, seed=a.seed, backoff=a.retry_backoff)
    out = optimize(cfg, lambda n: View(n, quiet=a.quiet, stderr=a.json == "-"))
    if not a.quiet:
        View(0, stderr=a.json == "-").summary(out.summary, str(out.trace))
        for e in out.kept:
            print(f"schedule database: kept {e.kernel} `{e.row}` ({e.median_us:.3f} µs {e.method})",
                  file=sys.stderr if a.json == "-" else sys.stdout)
    _write_json(a.json, {"trace": str(out.trace), "policy": out.policy, "model": out.model,
                         "device": out.device, **out.summary.model_dump(mode="json"),
                         "db_kept": [e.model_dump(mode="json") for e in out.kept]})
    return EXIT_OK if any(b.row for b in out.summary.best) else EXIT_FAILED


def cmd_replay(a) -> int:
    from agent import reproduce
    from agent.trace import Trace, default_path

    trace = Trace.read(a.trace)
    if a.render:
        print("\n".join(reproduce.render(trace)))
        return EXIT_OK
    ev = reproduce.open_for(trace)
    if a.llm:
        out = Path(a.trace_out or default_path(trace.header.workload.name, "replay"))
        session, problems = reproduce.redrive(trace, ev, out)
        for line in problems or ["the recorded LLM replies drive the same evaluations"]:
            print(line)
        print(f"trace: {out}")
        _write_json(a.json, {"trace": str(out), "problems": problems,
                             "evaluations": len(session.results)})
        return EXIT_FAILED if problems else EXIT_OK
    report = reproduce.rerun(trace, ev)
    for note in report.notes:
        print(f"note: {note}")
    for d in report.differences:
        mark = "CHANGED" if d.changes else "note"
        print(f"{mark} #{d.index} {d.kernel} `{d.row}`: " + "; ".join(d.changes + d.notes))
    changed = sum(1 for d in report.differences if d.changes)
    print(f"{report.checked - changed}/{report.checked} evaluations reproduce")
    _write_json(a.json, {"checked": report.checked, "reproduced": report.checked - changed,
                         "notes": report.notes,
                         "differences": [d.model_dump() for d in report.differences]})
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_propose(a) -> int:
    from agent.console import speedup_text, time_text
    from agent.models import EvaluationResult
    from agent.run import propose

    result, path, _ = propose(a.file, a.sets, a.target, a.kernel, a.row, a.trace, a.db,
                              device=a.device, expr=a.expr)
    _write_json(a.json, {"trace": str(path), **result.model_dump(mode="json")})
    if not isinstance(result, EvaluationResult):
        raise BadInput(f"{result.error}" + (f"\n  hint: {result.hint}" if result.hint else ""))
    if not a.quiet:
        print(f"{result.kernel} `{result.row}`: {result.verdict}"
              + (f", {time_text(result)}, {speedup_text(result.speedup_vs_default)} vs default"
                 if result.verdict == "ok" else ""))
        for reason in result.reasons:
            print(f"  - {reason}")
        print(f"trace: {path}")
    if result.verdict == "illegal":
        return EXIT_BAD_INPUT   # the row is refused, as `emmy run --row` refuses it
    return EXIT_OK if result.verdict == "ok" else EXIT_FAILED


def cmd_report(a) -> int:
    from agent import report
    from agent.trace import Trace

    traces = [Trace.read(t) for t in a.traces]
    out = report.write(traces, Path(a.out))
    for c in report.curves(traces):
        print(f"{c.label}: best {c.points[-1][1]:.3f} µs {c.method} after {c.points[-1][0]} "
              f"evaluations  `{c.best_row}`")
    print(f"wrote {out}")
    return EXIT_OK


COMMANDS = {"optimize": cmd_optimize, "replay": cmd_replay, "propose": cmd_propose,
            "report": cmd_report}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        if not args.command:
            build_parser().print_help()
            return EXIT_BAD_INPUT
        return COMMANDS[args.command](args)
    except Exception as e:
        if not isinstance(e, (BadInput, UserError)):
            raise
        print(f"emmy-agent: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("emmy-agent: interrupted; the trace holds everything so far (--resume it)",
              file=sys.stderr)
        return 130
    except BrokenPipeError:   # the reader went away (`emmy-agent replay ... | head`)
        from emmy.cli import quiet_stdout

        quiet_stdout()
        return EXIT_OK
