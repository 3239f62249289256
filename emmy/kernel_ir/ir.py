"""Kernel IR: a kernel as hardware primitives (thread indices, strided lane loops, vector
accesses, warp shuffles, shared memory, barriers, cp.async, atomics), ready to print as CUDA.

Scalar values are C-typed names; index arithmetic is `Lin` over names in scope (the decoded
grid coordinates, lane loop counters). Element-wise arithmetic keeps the Loop IR's op names,
and the CUDA emitter maps each to a device function of the intrinsics header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from emmy.symbolic import Lin
from emmy.tensor_ir.ir import ReduceOp


@dataclass(frozen=True, slots=True)
class Let:
    """`ctype name = op(args)`; op is an EwOp value, "cast", "copy" or "literal" (args[0] is C text)."""

    name: str
    ctype: str
    op: str
    args: tuple[str, ...]
    mutable: bool = False


@dataclass(frozen=True, slots=True)
class Index:
    """`int name = expr` (a coordinate or offset)."""

    name: str
    expr: Lin
    wide: bool = False  # 64-bit


@dataclass(frozen=True, slots=True)
class Fold:
    """acc = combine(acc, value) for one reduce op; argmax/argmin also carry `position`."""

    acc: str
    op: ReduceOp
    value: str
    position: Lin | None = None


@dataclass(frozen=True, slots=True)
class Set:
    """name = other (assign an existing mutable name)."""

    name: str
    value: str


@dataclass(frozen=True, slots=True)
class For:
    var: str
    start: Lin
    stop: Lin
    step: int
    body: tuple["KStmt", ...]
    unroll: bool = False


@dataclass(frozen=True, slots=True)
class If:
    cond: str            # C condition over names in scope
    body: tuple["KStmt", ...]


@dataclass(frozen=True, slots=True)
class GlobalLoad:
    """names[i] = buffer[offset + i] for i < len(names), one vector access when len > 1."""

    names: tuple[str, ...]
    ctype: str           # the compute type the elements are converted to
    buffer: str
    offset: Lin


@dataclass(frozen=True, slots=True)
class GlobalStore:
    buffer: str
    elem: str                 # the buffer's element type
    offset: Lin
    values: tuple[str, ...]   # one vector access when len > 1
    explicit: bool = False    # the vector as one explicit st.global (em_vstore_st): for the
                              # template epilogues, whose stores the kernel never reads back


@dataclass(frozen=True, slots=True)
class SharedArray:
    """A carve-out of the block's dynamic shared memory: `ctype name[count]` at byte `start`."""

    name: str
    ctype: str
    count: int
    start: int


@dataclass(frozen=True, slots=True)
class SharedLoad:
    names: tuple[str, ...]
    ctype: str
    array: str
    index: Lin


@dataclass(frozen=True, slots=True)
class SharedStore:
    array: str
    elem: str                 # the array's element type
    index: Lin
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CpAsync:
    """Copy len(count) elements global -> shared without registers (cp.async, 4/8/16 bytes)."""

    array: str
    index: Lin
    buffer: str
    offset: Lin
    count: int


@dataclass(frozen=True, slots=True)
class CpAsyncWaitAll:
    pass


@dataclass(frozen=True, slots=True)
class Barrier:
    scope: str           # "block" (__syncthreads), "warp" (__syncwarp) or "cluster" (cluster_sync)


@dataclass(frozen=True, slots=True)
class LaneCombine:
    """Combine `accs` across the `lanes` threads that share a job; every lane gets the result.

    method: "shuffle" (butterfly in each warp, then through shared memory across warps) or
    "smem" (a shared-memory tree). `scratch` names a SharedArray of at least `lanes` floats
    when lanes > 32 (both methods). argmax/argmin accs carry their position in `acc_pos`.
    With `cluster` > 1 the block's result is then combined across the blocks of its thread-block
    cluster (REDUCE=cluster:C): each block puts it in `cluster_scratch` from byte `cluster_slot`
    (16 bytes an acc, in dynamic shared memory), and after a cluster barrier every block folds
    all the blocks' values in rank order through distributed shared memory (the same result in
    each block). Successive combines alternate between two sets of slots, so one barrier each
    suffices; the kernel ends with a cluster barrier (no block exits while others read it).
    """

    accs: tuple[tuple[str, ReduceOp, str], ...]   # (name, op, ctype)
    lanes: int
    method: str
    scratch: str | None
    cluster: int = 1
    cluster_scratch: str | None = None
    cluster_slot: int = 0
    cluster_prefix: bool = False   # each block gets the fold of the blocks before it (a scan's
                                   # carry), and the fold of all of them as `<name>_all`


@dataclass(frozen=True, slots=True)
class ScanLanes:
    """Scan step of a warp (or a block of `lanes` threads, through `scratch`): `incl` =
    inclusive scan of `value` over the lanes, combined with `carry`; `excl` the exclusive one;
    `carry` becomes the last lane's `incl`."""

    value: str
    op: ReduceOp
    ctype: str
    carry: str
    incl: str
    excl: str
    lanes: int = 32
    scratch: str | None = None


@dataclass(frozen=True, slots=True)
class AtomicAdd:
    buffer: str
    elem: str
    offset: Lin
    value: str


@dataclass(frozen=True, slots=True)
class LastBlock:
    """The block's job is one of `count` slices (REDUCE=split:K:last): its stores so far fenced,
    it takes a ticket at tickets[slot]; every block but the one that takes the count-th
    returns, and that one fences again (the other blocks' stores are then visible to it),
    resets the ticket to zero for the next launch and runs `body` (a scope of its own)."""

    tickets: str
    slot: Lin
    count: int
    body: tuple["KStmt", ...]


@dataclass(frozen=True, slots=True)
class Comment:
    text: str


@dataclass(frozen=True, slots=True)
class Template:
    """A kernel body a template built (a tiled matrix product, flash attention): Kernel IR
    keeps its summary (what it computes, with the configuration) and its CUDA lines."""

    summary: tuple[str, ...]
    lines: tuple[str, ...]


KStmt = Union[Let, Index, Fold, Set, For, If, GlobalLoad, GlobalStore, SharedArray, SharedLoad,
              SharedStore, CpAsync, CpAsyncWaitAll, Barrier, LaneCombine, ScanLanes, AtomicAdd,
              LastBlock, Comment, Template]


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    ctype: str           # element type
    is_output: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class KFunction:
    name: str
    params: tuple[Param, ...]
    grid: int
    threads: int
    shared_bytes: int    # dynamic shared memory per block
    body: tuple[KStmt, ...]
    row: str             # the row it was built from (kept as a comment)
    tensor_maps: tuple = ()  # TMA tensor maps (emmy.cuda.program.TensorMapSpec) the launch passes
    min_blocks: int = 0      # > 0: __launch_bounds__(threads, min_blocks)
    cluster: int = 1         # > 1: thread-block clusters of this many blocks along x
    persistent: bool = False  # any grid up to `grid` (a multiple of the cluster) is correct


@dataclass(frozen=True, slots=True)
class Launch:
    function: str
    args: tuple[str, ...]   # buffer names, in parameter order


@dataclass(frozen=True, slots=True, kw_only=True)
class KProgram:
    name: str
    functions: tuple[KFunction, ...]
    launches: tuple[Launch, ...]            # in order
    temporaries: tuple[tuple[str, str, int], ...]  # (name, ctype, elements): scratch buffers
    zero_fill: tuple[str, ...]              # buffers to zero before the first launch
    zeroed: tuple[str, ...] = ()            # temporaries zero when allocated, which every run
                                            # leaves zero (split:S:last's tickets)
    headers: tuple[str, ...] = ()           # extra headers the source includes (emmy_sm90.cuh)
