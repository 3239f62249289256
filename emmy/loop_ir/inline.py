"""Express the elements of a kernel's stored tensors as one scalar expression DAG.

Starting from `T[o0, o1, …]`, each producer is inlined at the index it is read at: an input or
a tensor stored by another kernel becomes a load, an elementwise op or cast a scalar op, an
index_map a substitution of its index expressions, a gather a load at positions its index
tensors give (its source is always read from memory), an iota the value of an index, and a
reduction a node that folds its operand over fresh loop variables `r0, r1, …`. Each node knows
its free loop variables, which is what decides where the loop nest computes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Union

from emmy import symbolic
from emmy.dtypes import DType
from emmy.errors import InternalError
from emmy.loop_ir.dataflow import loop_vars
from emmy.symbolic import Lin
from emmy.tensor_ir.ir import (Cast, Elementwise, EwOp, Gather, IndexMap, Iota, Program, Reduce,
                               ReduceOp, Scalar, Scan, axis_var)


@dataclass(frozen=True, slots=True)
class NLoad:
    buffer: str
    index: tuple[Lin, ...]   # may name @k: the value of node dyn[k] (a gather's position)
    dtype: DType
    dyn: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NCompute:
    op: EwOp
    args: tuple[Union[int, Scalar], ...]  # node ids or literals
    dtype: DType


@dataclass(frozen=True, slots=True)
class NCast:
    arg: int
    dtype: DType


@dataclass(frozen=True, slots=True)
class NIndex:
    expr: Lin
    dtype: DType


@dataclass(frozen=True, slots=True, kw_only=True)
class NReduce:
    """Fold `value` over the loops (outermost first); argmax/argmin fold `position` too."""

    op: ReduceOp
    loops: tuple[tuple[str, int], ...]
    value: int
    position: Lin | None
    dtype: DType   # the type of the folded values
    source: str    # the Tensor IR definition, for notes


@dataclass(frozen=True, slots=True, kw_only=True)
class NScan:
    """The running value of a scan along output variable `var`."""

    op: ReduceOp
    var: str
    value: int
    reverse: bool
    exclusive: bool
    dtype: DType
    source: str


Node = Union[NLoad, NCompute, NCast, NIndex, NReduce, NScan]


class Dag:
    """Interned nodes (equal nodes share one id) with their free loop variables."""

    def __init__(self, extents: dict[str, int]):
        self.nodes: list[Node] = []
        self.free: list[frozenset[str]] = []
        self.extents = extents  # every loop variable's extent
        self._ids: dict[Node, int] = {}

    def add(self, node: Node, free: frozenset[str]) -> int:
        if node not in self._ids:
            self._ids[node] = len(self.nodes)
            self.nodes.append(node)
            self.free.append(free)
        return self._ids[node]

    def reductions(self, roots: list[int]) -> list[int]:
        """The reduction nodes reachable from `roots`, each once, in first-visit order."""
        seen: dict[int, None] = {}
        stack = list(reversed(roots))
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen[n] = None
            stack.extend(reversed(children(self.nodes[n])))
        return [n for n in seen if isinstance(self.nodes[n], NReduce)]


def children(node: Node) -> list[int]:
    """The nodes a node reads, in operand order."""
    match node:
        case NCompute():
            return [a for a in node.args if isinstance(a, int)]
        case NCast():
            return [node.arg]
        case NReduce() | NScan():
            return [node.value]
        case NLoad():
            return list(node.dyn)
    return []


class KernelTooLarge(Exception):
    """The DAG passed its budget; `uses` counts the instances of each definition so far."""

    def __init__(self, uses: Counter[str]):
        super().__init__(f"kernel over budget; most copied: {uses.most_common(3)}")
        self.uses = uses


class Inliner:
    """Builds the DAG of one kernel: `value(name, index)` is the node for `name[index]`.

    A definition read at n different indices is inlined n times; past `budget` nodes the
    inliner gives up with KernelTooLarge, so that the caller can store something instead.
    """

    def __init__(self, p: Program, loaded: dict[str, str], scan: str | None,
                 out_vars: tuple[str, ...], dag: Dag, budget: int | None = None):
        self.defs = {d.name: d for d in p.defs}
        self.loaded = loaded            # read from memory (inputs, other kernels' tensors) -> buffer
        self.scan = scan                # the scan this kernel runs, if any
        self.out_vars = out_vars
        self.dag = dag
        self.budget = budget
        self.uses: Counter[str] = Counter()
        self._memo: dict[tuple[str, tuple[Lin, ...]], int] = {}
        self._fresh = 0

    def value(self, name: str, index: tuple[Lin, ...]) -> int:
        """The node for `name[index]`, inlining what it reads first (depth first, by hand: a
        long chain of definitions must not exhaust Python's recursion limit)."""
        stack: list[tuple[str, tuple[Lin, ...], tuple | None]] = [(name, index, None)]
        while stack:
            at, where, plan = stack.pop()
            if (at, where) in self._memo:
                continue
            if plan is None:
                plan = self._plan(at, where)
                stack.append((at, where, plan))
                stack.extend((n, i, None) for n, i in reversed(plan[0]) if (n, i) not in self._memo)
                continue
            self.uses[at] += 1
            self._memo[at, where] = self._make(at, where, plan)
            if self.budget is not None and len(self.dag.nodes) > self.budget:
                raise KernelTooLarge(self.uses)
        return self._memo[name, index]

    def _plan(self, name: str, index: tuple[Lin, ...]) -> tuple[list, tuple]:
        """What `name[index]` reads, as (definition, index) pairs, and the loops it folds over."""
        d = self.defs[name]
        if name in self.loaded:
            return [], ()
        match d:
            case Elementwise():
                return [(a, index) for a in d.args if isinstance(a, str)], ()
            case Cast():
                return [(d.arg, index)], ()
            case IndexMap():
                env = {axis_var(i): e for i, e in enumerate(index)}
                return [(d.arg, tuple(symbolic.substitute(e, env, self.dag.extents)
                                      for e in d.index))], ()
            case Iota():
                return [], ()
            case Gather() if d.arg in self.loaded:
                return [(i, index) for i in d.indices], ()
            case Reduce():
                loops, inner, kept = [], [], iter(index)
                for axis, extent in enumerate(self.defs[d.arg].type.shape):
                    if axis in d.axes:
                        var = f"r{self._fresh}"
                        self._fresh += 1
                        self.dag.extents[var] = extent
                        loops.append((var, extent))
                        inner.append(symbolic.var(var))
                    else:
                        inner.append(next(kept))
                return [(d.arg, tuple(inner))], tuple(loops)
            case Scan() if name == self.scan:
                if index != tuple(symbolic.var(v) for v in self.out_vars):
                    raise InternalError(f"scan `{name}` read at {index}, not at its own positions")
                return [(d.arg, index)], ()
        raise InternalError(f"cannot inline `{name}` ({type(d).__name__}) into this kernel")

    def _make(self, name: str, index: tuple[Lin, ...], plan: tuple[list, tuple]) -> int:
        """The node for `name[index]`, once everything it reads has a node."""
        d, dag = self.defs[name], self.dag
        reads = [self._memo[r] for r in plan[0]]
        if name in self.loaded:
            free = frozenset().union(*(e.free_vars() for e in index))
            return dag.add(NLoad(self.loaded[name], index, d.type.dtype), free)
        match d:
            case Elementwise():
                it = iter(reads)
                args = tuple(next(it) if isinstance(a, str) else a for a in d.args)
                free = frozenset().union(*(dag.free[a] for a in reads))
                return dag.add(NCompute(d.op, args, d.type.dtype), free)
            case Cast():
                return dag.add(NCast(reads[0], d.type.dtype), dag.free[reads[0]])
            case IndexMap():
                return reads[0]
            case Iota():
                expr = index[d.axis]
                return dag.add(NIndex(expr, d.type.dtype), expr.free_vars())
            case Gather():
                env = {axis_var(i): e for i, e in enumerate(index)}
                where = tuple(symbolic.substitute(e, env, self.dag.extents) for e in d.index)
                free = frozenset().union(*(dag.free[r] for r in reads),
                                         *(loop_vars(e) for e in where))
                return dag.add(NLoad(self.loaded[d.arg], where, d.type.dtype, tuple(reads)),
                               free)
            case Reduce():
                return self._reduce(d, plan[1], reads[0])
            case Scan():
                return dag.add(NScan(op=d.op, var=self.out_vars[d.axis], value=reads[0],
                                     reverse=d.reverse, exclusive=d.exclusive,
                                     dtype=d.type.dtype, source=d.name),
                               frozenset(self.out_vars))
        raise InternalError(f"cannot inline `{name}` ({type(d).__name__}) into this kernel")

    def _reduce(self, d: Reduce, loops: tuple[tuple[str, int], ...], value: int) -> int:
        position = None
        if d.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            position = symbolic.lin(0)
            for var, extent in loops:  # the flat position, outermost loop first
                position = position * extent + symbolic.var(var)
        own = {v for v, _ in loops}
        free = (self.dag.free[value] | (position.free_vars() if position else frozenset())) - own
        arg_type = self.defs[d.arg].type.dtype
        node = self.dag.add(NReduce(op=d.op, loops=loops, value=value, position=position,
                                    dtype=arg_type, source=d.name), free)
        if position is None and d.type.dtype is not arg_type:
            node = self.dag.add(NCast(node, d.type.dtype), free)
        return node
