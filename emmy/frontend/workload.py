"""Load a workload: a KernelBench-style Python file, or a `-c` module-call expression."""

from __future__ import annotations

import ast
import hashlib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emmy.errors import UserError


@dataclass(frozen=True)
class Workload:
    name: str
    model: Any                          # the torch.nn.Module, in eval mode
    inputs: tuple[Any, ...]             # example inputs from get_inputs()
    source: str                         # the file's text, or the expression
    origin: str                         # the file path, or "<expr>"
    sets: tuple[tuple[str, Any], ...] = ()
    make_inputs: Any = field(default=None, compare=False, repr=False)  # fresh inputs on demand
    # the file set torch.set_float32_matmul_precision("high" | "medium"): its float32 products
    # may round their operands to tf32 (torch's own switch; emmy then offers tf32 tiles)
    tf32: bool = False

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def parse_sets(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """Parse `NAME=VALUE` overrides; VALUE is a Python literal (int, float, tuple, str, …)."""
    out = []
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UserError(f"--set expects NAME=VALUE with a Python name, got {item!r}")
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = text.strip()  # a bare word is taken as a string
        out.append((name, value))
    return tuple(out)


def load_file(path: str | Path, sets: tuple[tuple[str, Any], ...] = ()) -> Workload:
    """Run a workload file with its module-level constants overridden by `sets`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such workload file: {path}")
    source = path.read_text()
    try:
        ast.parse(source, filename=str(path))
    except SyntaxError as e:
        raise UserError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    _check_set_names(source, path, sets)
    import torch

    precision = torch.get_float32_matmul_precision()
    try:
        namespace = _exec_with_overrides(path, dict(sets))
        tf32 = torch.get_float32_matmul_precision() != "highest"
    finally:   # the file's setting belongs to its workload, not to this process
        torch.set_float32_matmul_precision(precision)
    model_cls = namespace.get("Model")
    if model_cls is None:
        raise UserError(f"{path} defines no `Model` class",
                        hint="a workload file defines class Model(nn.Module), get_inputs() and "
                             "get_init_inputs()")
    for fn in ("get_inputs",):
        if not callable(namespace.get(fn)):
            raise UserError(f"{path} defines no `{fn}()` function")
    init_args = namespace["get_init_inputs"]() if callable(namespace.get("get_init_inputs")) else []
    model = _call_user(lambda: model_cls(*init_args), path, "Model(*get_init_inputs())")
    model.eval()
    make_inputs = namespace["get_inputs"]
    inputs = tuple(_call_user(make_inputs, path, "get_inputs()"))
    return Workload(name=path.stem, model=model, inputs=inputs, source=source, origin=str(path),
                    sets=sets, make_inputs=lambda: tuple(make_inputs()), tf32=tf32)


def load_expr(expr: str) -> Workload:
    """`nn.RMSNorm(2048)(torch.randn(32, 2048))`: a module called on its example inputs."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise UserError(f"-c: syntax error in expression: {e.msg}") from None
    call = tree.body
    if not isinstance(call, ast.Call) or call.keywords:
        raise UserError("-c expects a module call such as `nn.RMSNorm(2048)(torch.randn(32, 2048))`")
    scope = {"torch": torch, "nn": nn, "F": F}
    module_text = ast.unparse(call.func)
    arg_texts = [ast.unparse(a) for a in call.args]
    module = _eval_user(module_text, scope)
    if isinstance(module, type):
        raise UserError(f"-c: `{expr.strip()}` builds a module but does not call it; write a "
                        "module call such as `nn.RMSNorm(2048)(torch.randn(32, 2048))`")
    torch.manual_seed(0)
    args = tuple(_eval_user(t, scope) for t in arg_texts)
    tensor_at = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    if not tensor_at:
        raise UserError("-c: the call takes no tensor; e.g. `nn.ReLU()(torch.randn(4, 4))`")
    if not isinstance(module, nn.Module):
        module = _wrap_function(module, module_text, args, tensor_at)
    elif len(tensor_at) != len(args):
        raise UserError("-c: a module's arguments must be tensors, e.g. torch.randn(32, 2048)")
    module.eval()
    inputs = tuple(args[i] for i in tensor_at)

    def fresh_inputs():
        again = tuple(_eval_user(t, scope) for t in arg_texts)
        return tuple(again[i] for i in tensor_at)

    name = _expr_name(call.func)
    return Workload(name=name, model=module, inputs=inputs, source=expr, origin="<expr>",
                    make_inputs=fresh_inputs)


def _wrap_function(fn, text, args, tensor_at):
    """A module calling `fn` with the tensors as inputs and the other arguments fixed."""
    import torch.nn as nn

    if not callable(fn):
        raise UserError(f"-c: `{text}` is neither a module nor a function")

    class Fn(nn.Module):
        def forward(self, *tensors):
            full = list(args)
            for i, t in zip(tensor_at, tensors):
                full[i] = t
            return fn(*full)

    return Fn()


def _expr_name(func: ast.expr) -> str:
    node = func.func if isinstance(func, ast.Call) else func
    if isinstance(node, ast.Attribute):
        return node.attr.lower()
    if isinstance(node, ast.Name):
        return node.id.lower()
    return "expr"


def _eval_user(text: str, scope: dict):
    try:
        return eval(text, scope)  # noqa: S307 - the user's own expression, as documented
    except Exception as e:  # the user's code failed: report it, no traceback
        raise UserError(f"-c: evaluating `{text}` failed: {type(e).__name__}: {e}") from None


def _check_set_names(source: str, path: Path, sets) -> None:
    names = _module_constants(source)
    for name, _ in sets:
        if name not in names:
            known = ", ".join(sorted(names)) or "none"
            raise UserError(f"--set {name}: {path} has no module-level constant `{name}`",
                            hint=f"module-level constants of {path.name}: {known}")


def _module_constants(source: str) -> set[str]:
    names: set[str] = set()
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Tuple):
                    names.update(e.id for e in target.elts if isinstance(e, ast.Name))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
    return names


def _exec_with_overrides(path: Path, overrides: dict) -> dict:
    """Execute the file; each overridden constant keeps its new value after its assignment."""
    import torch

    torch.manual_seed(0)
    namespace: dict = {"__name__": "__emmy_workload__", "__file__": str(path)}
    tree = ast.parse(path.read_text(), filename=str(path))
    # Run statement by statement so an override applies right after the assignment it replaces,
    # and later module-level code (derived sizes) sees the new value.
    for stmt in tree.body:
        mod = ast.Module(body=[stmt], type_ignores=[])
        try:
            exec(compile(mod, str(path), "exec"), namespace)  # noqa: S102 - the user's workload
        except Exception as e:
            raise UserError(f"{path}:{stmt.lineno}: running the file failed: "
                            f"{type(e).__name__}: {e}") from None
        for name, value in overrides.items():
            if name in _assigned_names(stmt):
                namespace[name] = value
    return namespace


def _assigned_names(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.Assign):
        out = set()
        for t in stmt.targets:
            out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        return out
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return {stmt.target.id}
    return set()


def _call_user(fn, path: Path, what: str):
    try:
        return fn()
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        line = next((f":{f.lineno}" for f in reversed(tb) if f.filename == str(path)), "")
        raise UserError(f"{path}{line}: {what} failed: {type(e).__name__}: {e}") from None
