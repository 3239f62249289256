"""Load a workload: a KernelBench-style Python file, or a `-c` expression."""

from __future__ import annotations

import ast
import builtins
import hashlib
import sys
import traceback
import types
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
    init_args = _call_user(namespace["get_init_inputs"], path, "get_init_inputs()") \
        if callable(namespace.get("get_init_inputs")) else []
    model = _call_user(lambda: model_cls(*init_args), path, "Model(*get_init_inputs())")
    model.eval()
    make_inputs = namespace["get_inputs"]
    inputs = tuple(_call_user(make_inputs, path, "get_inputs()"))
    return Workload(name=path.stem, model=model, inputs=inputs, source=source, origin=str(path),
                    sets=sets, make_inputs=lambda: tuple(make_inputs()), tf32=tf32)


# torch's tensor factories: in a -c expression, each call of one (with any dtype conversions
# chained on it) is an input of the workload, made again for every fresh set of inputs
_FACTORIES = frozenset({"randn", "rand", "randint", "randperm", "normal", "ones", "zeros",
                        "full", "empty", "arange", "linspace", "eye", "tensor", "as_tensor"})
_CASTS = frozenset({"to", "half", "float", "double", "bfloat16", "int", "long", "short", "bool",
                    "contiguous"})
_MODULE_MODES = frozenset({"eval", "train"})   # methods returning the module itself
_OPERATORS = {ast.MatMult: "matmul", ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul",
              ast.Div: "div", ast.Pow: "pow"}
_BUILTINS = frozenset(dir(builtins))
_EXPR_FILE = "<expr>"   # the name the forward's code carries (and Workload.origin)


def load_expr(expr: str) -> Workload:
    """A -c expression: `nn.RMSNorm(2048)(torch.randn(32, 2048))`, `F.softmax(torch.randn(8,
    100), dim=-1)`, `torch.randn(64, 32) @ torch.randn(32, 16)`. Each tensor factory call
    (torch.randn, torch.randint, ... with dtype conversions chained on it) is an input; each
    module built in the expression (`nn.RMSNorm(2048)`) is built once, a submodule of the
    workload's model; the rest is its forward."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    text = expr.strip()
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise UserError(f"-c: syntax error in expression: {e.msg}") from None
    scope = {"torch": torch, "nn": nn, "F": F}
    _check_names(tree, scope)
    name = _expr_name(tree.body)
    split = _SplitExpr(scope)
    body = split.visit(tree.body)   # (in place)
    if isinstance(body, ast.Attribute) and body.attr in split.module_texts:
        raise UserError(f"-c: `{text}` builds a module but does not call it; write a module "
                        "call such as `nn.RMSNorm(2048)(torch.randn(32, 2048))`")
    if not split.input_texts:
        raise UserError("-c: the expression has no tensor input; make each one with a torch "
                        "factory, e.g. `nn.ReLU()(torch.randn(4, 4))` or "
                        "`F.softmax(torch.randn(8, 100), dim=-1)`")
    if isinstance(body, ast.Name):
        raise UserError(f"-c: `{text}` only makes an input; apply something to it, e.g. "
                        f"`torch.exp({text})`")
    torch.manual_seed(0)
    modules = [_eval_user(t, scope) for t in split.module_texts.values()]
    inputs = tuple(_eval_user(t, scope) for t in split.input_texts)
    for t, value in zip(split.input_texts, inputs):
        if not isinstance(value, torch.Tensor):
            raise UserError(f"-c: `{t}` is not a tensor ({type(value).__name__})")
    params = [f"x{i}" for i in range(len(inputs))]
    # `x`, as in a module's forward, unless a comprehension around the input binds `x`
    if params == ["x0"] and "x" not in _stored_names(tree):
        body, params = _Rename({"x0": "x"}).visit(body), ["x"]
    if _calls_one_module(body, split, params):   # `nn.RMSNorm(2048)(torch.randn(...))`
        (model,) = modules   # is that module, its parameters named as its own
    else:
        model = _expr_module(body, dict(zip(split.module_texts, modules)), params, scope)
    model.eval()
    _call_expr(model, inputs, text)

    def fresh_inputs():
        return tuple(_eval_user(t, scope) for t in split.input_texts)

    return Workload(name=name, model=model, inputs=inputs, source=expr,
                    origin=_EXPR_FILE, make_inputs=fresh_inputs)


def expr_name(expr: str) -> str:
    """The name load_expr gives the workload of `expr` ("expr" when it cannot tell)."""
    try:
        return _expr_name(ast.parse(expr.strip(), mode="eval").body)
    except SyntaxError:
        return "expr"


class _SplitExpr(ast.NodeTransformer):
    """Replaces the inputs of a -c expression by names x0, x1, ... and the modules it builds
    by attributes of the model named after their class (self.linear, self.linear_1, ...),
    recording the text of each."""

    def __init__(self, scope: dict):
        self.scope = scope
        self.input_texts: list[str] = []
        self.module_texts: dict[str, str] = {}

    def visit_Lambda(self, node: ast.Lambda) -> ast.Lambda:
        return node   # a function's body is the forward's own: `(lambda x: x * torch.ones(4))`

    def visit_Call(self, node: ast.Call) -> ast.expr:
        if _is_input(node):
            return self._input(node)
        if _builds_module(node, self.scope):
            name = _module_name(node, self.module_texts)
            self.module_texts[name] = ast.unparse(node)
            return ast.Attribute(ast.Name("self", ast.Load()), name, ast.Load())
        if not isinstance(node.func, ast.Lambda):
            return self.generic_visit(node)
        # a function's arguments computed from factories alone are inputs as a whole: the
        # mask of `(lambda q, k, v, m: ...)(..., torch.rand(2, 24, 24) < 0.7)`
        node.args = [self._input(a) if self._is_data(a) else self.visit(a) for a in node.args]
        for kw in node.keywords:
            kw.value = self._input(kw.value) if self._is_data(kw.value) else self.visit(kw.value)
        return node

    def _input(self, node: ast.expr) -> ast.Name:
        self.input_texts.append(ast.unparse(node))
        return ast.Name(f"x{len(self.input_texts) - 1}", ast.Load())   # renamed below

    def _is_data(self, node: ast.expr) -> bool:
        """Built from tensor factories and constants alone (no module, no function)."""
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp,
                             ast.GeneratorExp)):
            return False   # the tensors in it may be inputs, one by one
        nodes = list(ast.walk(node))
        return (any(_is_input(n) for n in nodes)
                and not any(isinstance(n, (ast.Lambda, ast.Starred)) for n in nodes)
                and not any(_builds_module(n, self.scope) for n in nodes)
                and all(n.id in self.scope or n.id in _BUILTINS for n in nodes
                        if isinstance(n, ast.Name)))


def _module_name(node: ast.Call, taken) -> str:
    """`nn.Linear(64, 32).half()` -> "linear" (then "linear_1", ...)."""
    import torch.nn as nn

    base = _expr_name(node)
    name, n = base, 0
    while name in taken or hasattr(nn.Module, name):   # `eval`, `float`, ... are its methods
        n += 1
        name = f"{base}_{n}"
    return name


def _stored_names(tree: ast.AST) -> set[str]:
    """The names the expression assigns: comprehension variables (and `:=` targets)."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and not isinstance(n.ctx, ast.Load)}


def _check_names(tree: ast.Expression, scope: dict) -> None:
    bound = _stored_names(tree) | {a.arg for n in ast.walk(tree) if isinstance(n, ast.Lambda)
                                   for a in n.args.args}
    unknown = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                      and n.id not in scope and n.id not in bound and n.id not in _BUILTINS})
    if unknown:
        raise UserError(f"-c: `{unknown[0]}` is not defined; the expression sees torch, nn and "
                        "F, and makes its inputs with torch factories such as torch.randn(4, 4)")


def _expr_module(body: ast.expr, modules: dict, params: list[str], scope: dict):
    """An nn.Module whose forward takes `params` and returns `body`, with `modules` as its
    submodules."""
    import linecache

    import torch.nn as nn

    source = f"def forward(self, {', '.join(params)}):\n    return {ast.unparse(body)}\n"
    # the forward's own line in torch's stack traces: errors point at it
    linecache.cache[_EXPR_FILE] = (len(source), None, source.splitlines(True), _EXPR_FILE)
    namespace = dict(scope)
    exec(compile(source, _EXPR_FILE, "exec"), namespace)  # noqa: S102 - the user's expression

    class Expr(nn.Module):
        forward = namespace["forward"]

    model = Expr()
    for attr, module in modules.items():
        if not isinstance(module, nn.Module):
            raise UserError(f"-c: `{attr}` is not a module ({type(module).__name__})")
        model.add_module(attr, module)
    return model


def _calls_one_module(body: ast.expr, split: "_SplitExpr", params: list[str]) -> bool:
    """Whether the expression is one module called on its inputs, in order."""
    return (isinstance(body, ast.Call) and isinstance(body.func, ast.Attribute)
            and len(split.module_texts) == 1 and body.func.attr in split.module_texts
            and not body.keywords
            and [getattr(a, "id", None) for a in body.args] == params)


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.names.get(node.id, node.id), node.ctx)


def _is_input(node: ast.expr) -> bool:
    """`torch.randn(...)`, `torch.randint(...).half()`, `torch.ones(...).to(torch.bfloat16)`."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    owner, attr = node.func.value, node.func.attr
    if isinstance(owner, ast.Name) and owner.id == "torch":
        return attr in _FACTORIES
    return attr in _CASTS and _is_input(owner)


def _builds_module(node: ast.expr, scope: dict) -> bool:
    """`nn.Linear(64, 32)`, `torch.nn.GELU()`, `nn.Linear(64, 32).eval().half()`: a call of
    an nn.Module class named by a dotted name, with any dtype conversions (and eval, train)
    chained on it."""
    import torch.nn as nn

    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if (isinstance(func, ast.Attribute) and func.attr in _CASTS | _MODULE_MODES
            and isinstance(func.value, ast.Call)):
        return _builds_module(func.value, scope)
    root = func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name) or root.id not in scope:
        return False
    try:
        value = eval(ast.unparse(func), scope)  # noqa: S307 - a dotted name under torch/nn/F
    except Exception:
        return False
    return isinstance(value, type) and issubclass(value, nn.Module)


def _call_expr(model, inputs, text: str) -> None:
    """Run the expression once on meta tensors (shapes and types only, no arithmetic), so that
    its mistakes are the user's messages, not torch export's."""
    from torch.func import functional_call

    state = {k: v.to("meta") for k, v in (*model.named_parameters(), *model.named_buffers())}
    try:
        functional_call(model, state, tuple(x.to("meta") for x in inputs))
    except NotImplementedError:
        pass   # an op without a meta kernel: torch.export will say what it finds
    except Exception as e:
        if "meta" in str(e):   # needs the data (`.item()`): torch.export will say what it finds
            return
        raise UserError(f"-c: evaluating `{text}` failed: {type(e).__name__}: {e}") from None


def _expr_name(node: ast.expr) -> str:
    """The workload's name: the outermost call's (`rmsnorm`, `softmax`) or operator's."""
    if isinstance(node, ast.BinOp):
        return _OPERATORS.get(type(node.op), "expr")
    if not isinstance(node, ast.Call):
        return "expr"
    func = node.func
    if isinstance(func, ast.Call):   # a module built and called: `nn.RMSNorm(2048)(x)`
        return _expr_name(func)
    if isinstance(func, ast.Attribute) and func.attr in _CASTS | _MODULE_MODES \
            and isinstance(func.value, ast.Call):
        return _expr_name(func.value)   # `nn.Linear(64, 32).half()`, `nn.GRU(8, 8).eval()`
    if isinstance(func, ast.Attribute):
        return func.attr.lower()
    if isinstance(func, ast.Name):
        return func.id.lower()
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
    # a module of its own, importable by name while it runs (torch.export imports the module of
    # a function it traces by name: flex_attention's score_mod)
    module = types.ModuleType("__emmy_workload__")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    namespace: dict = module.__dict__
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
