"""Check a kernel's invariants; a failure is a compiler bug (InternalError), never the user's.

- every name is defined once, before it is read, in an enclosing scope;
- index expressions use only the variables of enclosing loops;
- loads read the kernel's inputs, stores write its outputs, with one index per axis;
- an accumulator is folded only inside reduce/scan loops opened after its Init (never across
  a parallel loop), with the op it was initialized with, and read inside its own loops only
  when they are scan loops.
"""

from __future__ import annotations

from emmy.errors import InternalError
from emmy.loop_ir.dataflow import defined, index_exprs, loop_vars, modified, reads
from emmy.loop_ir.ir import Accum, Init, Kernel, Load, Loop, LoopKind, Stmt, Store
from emmy.tensor_ir.ir import gather_var


def verify(k: Kernel) -> Kernel:
    """Raise InternalError naming the first broken invariant; return the kernel otherwise."""
    _Checker(k).block(k.body, scope=set(), loops=[])
    return k


class _Checker:
    def __init__(self, k: Kernel):
        self.k = k
        self.ranks = {b.name: len(b.type.shape) for b in k.inputs + k.outputs}
        self.inputs = {b.name for b in k.inputs}
        self.outputs = {b.name for b in k.outputs}
        self.seen: set[str] = set()
        self.inits: dict[str, tuple[Init, int]] = {}  # acc -> (its Init, loop depth there)

    def fail(self, s: Stmt, why: str) -> None:
        raise InternalError(f"kernel `{self.k.name}`: {why} (at {s!r})")

    def block(self, body: tuple[Stmt, ...], scope: set[str], loops: list[Loop]) -> None:
        scope = set(scope)
        bound = {l.var for l in loops}
        for s in body:
            for name in reads(s) if not isinstance(s, Loop) else ():
                if name not in scope:
                    self.fail(s, f"`{name}` is read outside the scope of its definition")
                self.check_read(s, name, loops)
            for e in index_exprs(s):
                if not loop_vars(e) <= bound:
                    self.fail(s, f"index uses {sorted(loop_vars(e) - bound)}, not enclosing loops")
                gathered = e.free_vars() - loop_vars(e)
                if not gathered <= {gather_var(k) for k in range(len(getattr(s, "dyn", ())))}:
                    self.fail(s, f"index uses {sorted(gathered)}, not values the load reads")
            match s:
                case Loop():
                    if s.var in bound or s.var in self.seen:
                        self.fail(s, f"loop variable `{s.var}` is bound twice")
                    self.seen.add(s.var)
                    self.block(s.body, scope, loops + [s])
                case Load() if s.buffer not in self.inputs:
                    self.fail(s, f"load from `{s.buffer}`, which is not an input")
                case Store() if s.buffer not in self.outputs:
                    self.fail(s, f"store to `{s.buffer}`, which is not an output")
                case Accum():
                    self.check_fold(s, scope, loops)
                case Init():
                    self.inits[s.acc] = (s, len(loops))
            if isinstance(s, (Load, Store)) and len(s.index) != self.ranks[s.buffer]:
                self.fail(s, f"{len(s.index)} indices for `{s.buffer}` of rank {self.ranks[s.buffer]}")
            name = defined(s)
            if name is not None:
                if name in self.seen:
                    self.fail(s, f"`{name}` is defined twice")
                self.seen.add(name)
                scope.add(name)

    def check_read(self, s: Stmt, name: str, loops: list[Loop]) -> None:
        if name in self.inits:
            _, depth = self.inits[name]
            if any(l.kind is LoopKind.REDUCE and name in modified(l) for l in loops[depth:]):
                self.fail(s, f"accumulator `{name}` is read inside a reduce loop that folds it")

    def check_fold(self, s: Accum, scope: set[str], loops: list[Loop]) -> None:
        if s.acc not in scope or s.acc not in self.inits:
            self.fail(s, f"fold into `{s.acc}`, which has no Init in scope")
        init, depth = self.inits[s.acc]
        if init.op is not s.op:
            self.fail(s, f"`{s.acc}` was initialized for {init.op}, folded with {s.op}")
        inner = loops[depth:]
        if not inner or any(l.kind is LoopKind.PARALLEL for l in inner):
            self.fail(s, f"`{s.acc}` must be folded in reduce/scan loops opened after its Init")
