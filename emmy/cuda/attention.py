"""Fused attention forward (FlashAttention-2 style) for mma.sync m16n8k16 on sm_80 and later.

out[bz, h, i, :] = sum_j softmax_j(q[bz, h, i, :] . k[bz, h/g, j, :] * scale + mask[i, j]) v[bz, h/g, j, :]

with mask[i, j] = -inf where j > i when `causal` (torch's is_causal: top-left aligned), else 0;
g the key/value heads' group (grouped-query attention: AttnOperand.group, else 1). Options
of the problem: q . k rounded to 16 bits first (`rounded`, where the program rounds it), and
an attn_mask tensor (`bias`: added to the scaled scores, or -inf where a bool mask hides a
score), read per score element (round_scores, bias_scores; both templates use them). q and
k share a head dimension d; v and out may have another (`v_dim`, MLA's), which this template
stages and reads at its own row length (the wgmma and simt templates refuse it).

Conventions are those of emmy.cuda.gemm_spec: the body is the inside of a kernel whose
signature the emitter prints, with `tid`, `bid`, the operands' buffers by name and, since the
body always uses shared memory, `emmy_smem` in scope. The template writes no output itself: it
calls `store(bz, h, row, col, value)` once per output element inside the bounds check.

The kernel
- Grid: one block per (batch, head, query block of `bq` rows); bid = (bz * heads + h) * qblocks
  + (qblocks - 1 - query block), so the query blocks of one head run together (their keys and
  values are read once from DRAM and then from L2) and, under a causal mask, the longest
  blocks start first.
- Shared memory holds the Q tile (bq rows) and `stages` K and V tiles (bkv rows each), each row
  of d 16-bit elements padded by 8 (16 bytes), which makes every ldmatrix conflict-free. Tiles
  are copied with 16-byte cp.async; rows past a ragged sequence are zero-filled.
- Warp w owns query rows [w * bq/warps, (w+1) * bq/warps) of the block, as 16-row mma tiles.
  Per key block it computes S = Q K^T with mma.sync (Q and K fragments by ldmatrix, Q re-read
  from shared memory at each step; K stored [key][dim] is the "col" B operand as it lies),
  masks S, updates each row's running max m and running sum l (online softmax in the log2
  domain: 2^(S * scale * log2(e) - m), one FFMA and one ex2.approx), rescales its O accumulator
  by exp2(m_old - m_new), and adds P V with mma.sync: the f32 S accumulators of two adjacent
  n8 tiles, rounded to 16 bits, are exactly one m16n8k16 A fragment, and V (stored
  [key][dim]) is read with ldmatrix.trans. At the end O / l is stored: NaN where l == 0 (all
  of a row's scores -inf), as the program computes it (exp(-inf - -inf)).
- stages == 1 loads a key block's K and V and waits for them before computing on them;
  stages == 2 loads key block kb + 1 into the other buffer while block kb is computed.
- Causal: a block stops after the last key block its last (in-range) query row can see, and a
  warp skips key blocks wholly above its rows. The -inf mask runs only from the first key
  block that crosses the warp's diagonal, or, for keys past a ragged sk, in the last block.
- Split-KV (`splits` > 1, FlashDecoding's scheme; emmy.cuda.attention_simt shares it): the
  key blocks of a query block are dealt out in runs of ceil(blocks / splits) to `splits`
  blocks, so a problem with few (batch, head, query block)s (a decode step: one query a head)
  still fills the GPU. Each writes its output normalized over its own keys and each row's
  log2-sum-exp2 (m + log2 l, -inf where it saw no key) to the f32 scratch `emmy_partial`
  ([splits][batch x heads][sq][d], then [splits][batch x heads][sq]); combine_body's kernel
  weighs the splits by 2^(lse - max lse) and stores out through `store`. With split_mode
  "last" there is no second kernel: each block then takes a ticket for its query block
  (`emmy_tickets`, one int per (batch x head, query block), zero before and after a run), and
  the block taking the last one combines the query block's rows in the same kernel
  (_Emitter.last_block; the fences and the vote as in emmy.cuda.gemm's split:S:last).

Registers and speed: a thread holds (bq / warps) * (d + bkv) / 32 f32 accumulators, and each
warp re-reads every K and V tile from shared memory, so 32 query rows a warp (bq 128, 4 warps)
halves that traffic against 16 rows and is the fastest shape measured on an H200 (batch 4,
32 heads, seq 4096; fraction of torch's flash scaled_dot_product_attention time):
  d 128:                      bq 128, bkv 32, 4 warps, 2 stages: 0.89 (0.83-0.88 causal)
  d 64, no mask:              bq 128, bkv 128, 4 warps, 2 stages: 1.00-1.04
  d 64, causal:               bq 128, bkv 64, 4 warps, 2 stages: 0.88-0.92
All three compile for sm_80 and sm_90a with no register spills (213-255 registers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from emmy.cuda.gemm_spec import ELEMENT_BYTES, TICKETS, Body, last_block_lines
from emmy.schedule.targets import get_target

# store(bz, h, row, col, value) -> C statements writing out[bz, h, row, col]; the arguments are C
# expressions: long long batch index, int head, int query row (< sq), int column (< d), float.
Store = Callable[[str, str, str, str, str], list[str]]

DTYPES = {"__half": ("mma_m16n8k16_f16f32", "pack_f16x2"),
          "__nv_bfloat16": ("mma_m16n8k16_bf16f32", "pack_bf16x2")}
PAD = 8                   # elements added to each shared-memory row (16 bytes)
MAX_D = 256
# Per-thread f32 accumulators (O and S) allowed: at 160 (d 128, 32 rows a warp, bkv 32) ptxas
# needs about 250 of its 255 registers; at 192 it spills some bytes or none; above, it must.
MAX_ACCUMULATORS = 192
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttnOperand:
    buffer: str                              # the kernel parameter's name
    ctype: str                               # "__half" | "__nv_bfloat16"
    strides: tuple[int, int, int, int]       # element strides of (batch, head, seq, dim)
    group: int = 1                           # read at head h // group: grouped-query k and v
    const: int = 0                           # elements before (0, 0, 0, 0): k and v of a packed
                                             # q|k|v projection start inside the buffer

    def head(self, h: str) -> str:
        """The C expression of this operand's head index for query head `h`."""
        return h if self.group == 1 else f"({h} / {self.group})"


@dataclass(frozen=True)
class AttnBias:
    """A bias added to the scaled scores ("add"), or a mask keeping them where it is true
    ("keep") or false ("hide"), read at base + const + the strides of (batch, head, query,
    key) (0: broadcast)."""
    kind: str
    buffer: str
    ctype: str
    strides: tuple[int, int, int, int]
    const: int = 0
    rounded: bool = False        # "add" in the scores' 16-bit type: the sum rounded to it


@dataclass(frozen=True)
class AttentionProblem:
    batch: int
    heads: int
    sq: int                                  # query rows
    sk: int                                  # keys (and values)
    d: int                                   # head dimension of q, k, v and out
    q: AttnOperand
    k: AttnOperand
    v: AttnOperand
    scale: float                             # multiplies q . k before the softmax
    causal: bool                             # key j visible to query i iff j <= i
    rounded: str | None = None               # q . k rounded to this 16-bit type first, as a
                                             # program computing it in f16/bf16 does
    bias: AttnBias | None = None             # attn_mask: added to, or masking, scale * q . k
    query_heads: int = 1                     # > 1: the program's one query a head, with this
                                             # many query heads per key/value head, given as
                                             # that many query rows of one head (`heads` are
                                             # then the key/value heads; the caller's store
                                             # maps a row back to its head)
    v_dim: int = 0                           # head dimension of v and out (0: d; MLA's
                                             # differ: q . k over 192, v and out 128)
    zero_empty: bool = False                 # a row with no visible key gives 0 (torch's
                                             # attention under a mask), not O / l = 0 / 0

    @property
    def dv(self) -> int:
        """The head dimension of v and the output."""
        return self.v_dim or self.d

    @property
    def scaled_first(self) -> bool:
        """Whether S is multiplied by scale * log2(e) before the softmax (a scale <= 0, or a
        bias to add to the scaled scores) rather than inside its exponent."""
        return self.scale <= 0 or self.bias is not None

    @property
    def flops(self) -> int:
        """Matrix-product FLOPs of QK^T and PV (halved, as torch counts, when causal)."""
        full = 2 * self.batch * self.heads * self.sq * self.sk * (self.d + self.dv)
        return full // 2 if self.causal else full


@dataclass(frozen=True)
class AttentionConfig:
    bq: int                                  # query rows per block
    bkv: int                                 # keys per step
    warps: int                               # each owns bq / warps query rows (a multiple of 16)
    stages: int                              # 1: synchronous K/V loads; 2: cp.async double buffer
    inst: str = "mma"                        # "mma": this template (mma.sync); "wgmma": the
                                             # sm_90a one (emmy.cuda.attention_sm90)
    splits: int = 1                          # > 1: split-KV (flash-decoding): the key blocks
                                             # dealt out to this many blocks per query block,
                                             # whose partial outputs combine_body merges
    split_mode: str = "combine"              # splits > 1: "combine" (a second kernel) or
                                             # "last" (each query block's last block combines)

    @property
    def threads(self) -> int:
        return 32 * self.warps


def round_scores(p: AttentionProblem, element: str, loops: list[str]) -> list[str]:
    """Where the program rounds q . k to its 16-bit type: `element` rounded so inside the
    `loops` (for-headers, outermost first), before the scale and the mask."""
    if p.rounded is None:
        return []
    to, back = _ROUND[p.rounded]
    return _unrolled(loops, f"{element} = {back}({to}({element}));")


_ROUND = {"__half": ("__float2half_rn", "__half2float"),
          "__nv_bfloat16": ("__float2bfloat16_rn", "__bfloat162float")}


def _unrolled(loops: list[str], statement: str) -> list[str]:
    """`statement` inside the for-headers `loops` (outermost first), each unrolled."""
    lines = []
    for depth, header in enumerate(loops):
        lines += ["  " * depth + "#pragma unroll", "  " * depth + header]
    return lines + ["  " * len(loops) + statement]


def bias_scores(p: AttentionProblem, prefix: str, element: str, loops: list[str], row: str,
                key: str) -> list[str]:
    """Where the program adds a bias or masks by a tensor (attn_mask): `element` (query `row`,
    key `key`, inside `loops`; S already scaled, in the log2 domain) gets log2(e) * bias, or
    -inf where the mask hides it. Rows past sq and keys past sk read nothing (the keys are
    masked and the rows not stored anyway). `prefix`_bz and `prefix`_h: the batch and head."""
    b = p.bias
    if b is None:
        return []
    s0, s1, s2, s3 = b.strides
    read = f"{prefix}_bp[(long long)({row}) * {s2}LL + ({key}) * {s3}LL]"
    true = read if b.ctype == "bool" else f"(em_cvt<float>({read}) != 0.f)"   # a mask's truth
    apply = {"add": f"{element} += em_log2e_bias(em_cvt<float>({read}));",
             "keep": f"if (!{true}) {element} = -EMMY_INF_F32;",
             "hide": f"if ({true}) {element} = -EMMY_INF_F32;"}[b.kind]
    lines = [f"const {b.ctype}* const {prefix}_bp = {b.buffer} + {b.const}LL + {prefix}_bz * "
             f"{s0}LL + {prefix}_h * {s1}LL;   // the {'bias' if b.kind == 'add' else 'mask'} "
             f"of this (batch, head)"]
    lines += _unrolled(loops, f"if ({row} < {p.sq} && {key} < {p.sk}) {apply}")
    if b.rounded and p.rounded:
        # eager adds the bias in the scores' 16-bit type: scale * S + bias rounded to it, as
        # the program's cast back to f32 reads it (a row masked by finfo(f16).min everywhere
        # is then every score alike, as in eager, not softmax of the scores)
        to, back = _ROUND[p.rounded]
        lines += _unrolled(loops, f"{element} = {_float(LOG2E)} * {back}({to}({element} * "
                                  f"{_float(1 / LOG2E)}));")
    return ["{", *_indent(lines, 1), "}"]


def mask_keys(p: AttentionProblem, bkv: int, prefix: str, kb: str, element: str,
              loops: list[str], setup: list[str], key: str, row: str) -> list[str]:
    """From key block `prefix`_kmask on (`kb`: the block), -inf for `element` (inside `loops`)
    where its key is past sk (when sk is ragged) and, when causal, after its query. `setup`
    defines `prefix`_kl (the lane's first key in the block) and `prefix`_kq (that key minus the
    lane's first row); `key` and `row` are the element's offsets from them, so each test is one
    comparison with a constant once the loops are unrolled. The test of `kb` is warp-uniform,
    so blocks before run no mask code."""
    hidden = []
    if p.sk % bkv:
        hidden.append(f"{prefix}_kl + {key} >= {prefix.upper()}_SK")
    if p.causal:
        hidden.append(f"{prefix}_kq + {key} > {row}")
    if not hidden:
        return []
    test = f"if ({' || '.join(hidden)}) {element} = -EMMY_INF_F32;"
    return [f"if ({kb} >= {prefix}_kmask) {{", *_indent([*setup, *_unrolled(loops, test)], 1),
            "}"]


def smem_bytes(problem: AttentionProblem, config: AttentionConfig) -> int:
    """Dynamic shared memory of one block: the Q tile and `stages` K and V tiles, padded rows."""
    qk_rows, v_rows = config.bq + config.stages * config.bkv, config.stages * config.bkv
    return ((qk_rows * (problem.d + PAD) + v_rows * (problem.dv + PAD))
            * ELEMENT_BYTES[problem.q.ctype])


def accumulator_registers(problem: AttentionProblem, config: AttentionConfig) -> int:
    """f32 registers a thread holds for its O and S accumulators (the template's register
    floor: O is rows/warp x dv and S rows/warp x bkv, spread over the warp's 32 lanes)."""
    rows = config.bq // config.warps
    return rows * (problem.dv + config.bkv) // 32


def operand_refusals(p: AttentionProblem, ctypes: tuple[str, ...] = tuple(DTYPES)) -> list[str]:
    """What every attention template refuses in a problem: an empty one, operands that are not
    of one of `ctypes` (the template's: f16/bf16 for the tensor-core ones), all alike, with a
    contiguous head dimension and 16-byte aligned rows (cp.async copies them), a scale that is
    not finite."""
    why: list[str] = []
    if min(p.batch, p.heads, p.sq, p.sk) < 1:
        why.append(f"empty problem: batch {p.batch}, heads {p.heads}, sq {p.sq}, sk {p.sk}")
    for name, op in (("q", p.q), ("k", p.k), ("v", p.v)):
        if op.ctype not in ctypes:
            why.append(f"{name} is {op.ctype}: the template takes {' or '.join(ctypes)}")
        vec = 16 // ELEMENT_BYTES.get(op.ctype, 2)       # elements of a 16-byte copy
        if op.strides[3] != 1:
            why.append(f"{name}'s head dimension is not contiguous (stride {op.strides[3]}): "
                       f"cp.async copies 16-byte runs of it")
        elif any(s % vec for s in (*op.strides[:3], op.const)):
            why.append(f"{name}'s strides {op.strides} (and start {op.const}) are not all "
                       f"multiples of {vec} elements: its rows are not 16-byte aligned for "
                       f"cp.async")
    if not math.isfinite(p.scale):
        why.append(f"scale {p.scale} is not finite")
    if p.rounded is not None and p.rounded not in DTYPES:
        why.append(f"scores rounded to {p.rounded}: the template rounds to __half or "
                   f"__nv_bfloat16")
    for name, op in (("q", p.q), ("k", p.k), ("v", p.v)):
        if op.group < 1 or (name == "q" and op.group != 1):
            why.append(f"{name} is read at head h // {op.group}: only k and v may be grouped")
    if len({p.q.ctype, p.k.ctype, p.v.ctype}) > 1:
        why.append(f"q, k and v have different types ({p.q.ctype}, {p.k.ctype}, {p.v.ctype})")
    return why


def constraints(problem: AttentionProblem, config: AttentionConfig,
                target_name: str) -> list[str]:
    """Plain-English reasons `config` cannot be built for `problem` on the target (empty: OK)."""
    p, c = problem, config
    why: list[str] = []
    if c.inst != "mma":
        why.append(f"this template issues mma.sync; inst {c.inst!r} is another template's "
                   f"(wgmma: emmy.cuda.attention_sm90)")
    why += operand_refusals(p)
    for name, d in (("", p.d), (" of v", p.dv)):
        if d % 16 or not 16 <= d <= MAX_D:
            why.append(f"head dimension{name} {d} is not a multiple of 16 in 16..{MAX_D}")
    if c.warps < 1 or c.warps > 32:
        why.append(f"{c.warps} warps: a block has 1 to 32")
    elif c.bq < 16 or c.bq % (16 * c.warps):
        why.append(f"bq {c.bq} is not a multiple of 16 x {c.warps} warps "
                   f"(each warp owns a multiple of 16 query rows)")
    if c.bkv < 16 or c.bkv % 16:
        why.append(f"bkv {c.bkv} is not a positive multiple of 16")
    if c.stages not in (1, 2):
        why.append(f"stages {c.stages}: the template has 1 (synchronous) or 2 (double buffer)")
    if why:
        return why
    why += split_refusals(p, c.bkv, c.splits)
    why += shared_refusals(smem_bytes(p, c), target_name)
    if (regs := accumulator_registers(p, c)) > MAX_ACCUMULATORS:
        why.append(f"each thread would hold {regs} f32 accumulators (O and S tiles), over the "
                   f"{MAX_ACCUMULATORS} that leave room in 255 registers for the rest")
    return why


def shared_refusals(need: int, target_name: str) -> list[str]:
    """Why `need` bytes of shared memory do not fit a block of the target (empty: they do)."""
    limit = get_target(target_name).shared_per_block_optin
    if need <= limit:
        return []
    return [f"shared memory {need} B ({need / 1024:.1f} KiB) is over {target_name}'s "
            f"{limit // 1024} KiB per block"]


def attention_body(problem: AttentionProblem, config: AttentionConfig, store: Store) -> Body:
    """The kernel body (see the module docstring) and its launch: grid, threads, smem bytes."""
    if why := constraints(problem, config, "sm_90a"):
        raise ValueError("attention config cannot be built: " + "; ".join(why))
    return Body(lines=tuple(_Emitter(problem, config).lines(store)),
                grid=problem.batch * problem.heads * _qblocks(problem, config) * config.splits,
                threads=config.threads, smem_bytes=smem_bytes(problem, config))


def _qblocks(p: AttentionProblem, c: AttentionConfig) -> int:
    return -(-p.sq // c.bq)


def split_refusals(p: AttentionProblem, bkv: int, splits: int) -> list[str]:
    """Why `splits` blocks cannot deal out the key blocks of `bkv` keys (empty: they can):
    every split gets at least one block."""
    blocks = -(-p.sk // bkv)
    if splits < 1:
        return [f"splits {splits}: at least 1"]
    if splits == 1:
        return []
    run = -(-blocks // splits)
    if (splits - 1) * run >= blocks:
        return [f"{splits} splits of {blocks} key blocks ({bkv} keys each) leave the last "
                f"split{'s' if (splits - 1) * run - blocks >= run else ''} without keys "
                f"(runs of {run}); use fewer splits or fewer keys per step"]
    return []


def partial_floats(p: AttentionProblem, c: AttentionConfig) -> int:
    """The f32 scratch of a split-KV row: each split's outputs, then its rows' maxima m, then
    their log2 l (kept apart: m + log2 l would lose l where m is huge, as the finfo.min of a
    row whose every key is masked makes it, and the splits of such a row must still weigh
    by their key counts)."""
    return c.splits * p.batch * p.heads * p.sq * (p.dv + 2)


COMBINE_THREADS = 128


def combine_body(p: AttentionProblem, c: AttentionConfig, store: Store) -> Body:
    """The split-KV combine kernel (module docstring): one thread per output element."""
    total = p.batch * p.heads * p.sq * p.dv
    lines = [f"// flash split-KV combine: {c.splits} partial outputs of {p.batch}x{p.heads} heads "
             f"x {p.sq} queries x d {p.dv}",
             f"const long long fc_e = (long long)bid * {COMBINE_THREADS} + tid;",
             f"if (fc_e >= {total}LL) return;",
             f"const long long fc_r = fc_e / {p.dv};   // (batch x head, query row)",
             f"const int fa_col = int(fc_e % {p.dv}), fa_row = int(fc_r % {p.sq});",
             f"const long long fc_bh = fc_r / {p.sq};",
             f"const long long fa_bz = fc_bh / {p.heads};",
             f"const int fa_h = int(fc_bh % {p.heads});",
             *combine_element(p, c, store, "*")]
    return Body(tuple(lines), -(-total // COMBINE_THREADS), COMBINE_THREADS, 0)


def combine_element(p: AttentionProblem, c: AttentionConfig, store: Store, read: str
                    ) -> list[str]:
    """One output element of a split-KV row, fc_e of row fc_r of emmy_partial (fa_bz, fa_h,
    fa_row, fa_col in scope): out = sum_s w_s o_s / sum_s w_s, w_s = 2^(m_s - M + log2 l_s)
    with M the largest m (where every split saw no key, M = -inf: NaN, as the unsplit
    template gives 0 / 0, or 0 for a `zero_empty` problem), through `store`. `read`: the C
    function (or `*`) that reads a partial through its pointer."""
    rows = p.batch * p.heads * p.sq
    total = rows * p.dv
    return [f"const float* const fc_lm = emmy_partial + {c.splits * total}LL + fc_r;",
            f"const float* const fc_ll = fc_lm + {c.splits * rows}LL;",
            "float fc_m = -EMMY_INF_F32;",
            "#pragma unroll",
            f"for (int s = 0; s < {c.splits}; ++s) "
            f"fc_m = fmaxf(fc_m, {read}(fc_lm + s * {rows}LL));",
            "float fc_num = 0.f, fc_den = 0.f;",
            "#pragma unroll",
            f"for (int s = 0; s < {c.splits}; ++s) {{",
            f"  const float fc_w = exp2f({read}(fc_lm + s * {rows}LL) - fc_m + "
            f"{read}(fc_ll + s * {rows}LL));",
            f"  fc_num += fc_w * {read}(emmy_partial + s * {total}LL + fc_e);",
            "  fc_den += fc_w;",
            "}",
            "const float fa_val = fc_m == -EMMY_INF_F32 ? 0.f : fc_num / fc_den;"
            if p.zero_empty else "const float fa_val = fc_num / fc_den;",
            *store("fa_bz", "fa_h", "fa_row", "fa_col", "fa_val")]


class _Emitter:
    """Prints the body's C. Compile-time sizes become constexpr ints; every loop over register
    arrays has a constant trip count and is unrolled, so the arrays live in registers."""

    vec = 8                  # elements of one 16-byte copy
    pad = PAD                # elements added to each shared-memory row
    warp_rows = "FA_MT * 16"  # a warp's query rows (a C expression)

    def __init__(self, p: AttentionProblem, c: AttentionConfig):
        self.p, self.c = p, c
        self.t = p.q.ctype
        self.pitch = p.d + self.pad      # a shared tile row, in elements
        # v and out: named apart only where their head dimension is not q's and k's
        self.apart = p.dv != p.d
        self.vpitch = p.dv + self.pad
        self.fa_dv, self.fa_pv = ("FA_DV", "FA_PV") if self.apart else ("FA_D", "FA_P")
        if self.t in DTYPES:
            self.mma, self.pack = DTYPES[self.t]

    def lines(self, store: Store) -> list[str]:
        end = self.epilogue(store) if self.c.splits == 1 else self.partial_epilogue()
        last = self.last_block(store) if self.c.splits > 1 and self.c.split_mode == "last" \
            else []
        return [*self.prologue(), *self.key_loop(), *end, *last]

    def last_block(self, store: Store) -> list[str]:
        """split_mode "last": once a block has stored its partial outputs and row lse, it takes
        a ticket for its query block; the block taking the last one combines the query block's
        rows (combine_element; the splits in order, whichever block finishes last) and stores
        them, so no second kernel is launched. The fences order each block's partial stores
        before its ticket, and the last block's reads after the tickets; it reads through L2
        (__ldcg) and leaves the ticket at zero for the next launch."""
        p, c = self.p, self.c
        element = [f"const int fa_row = fa_q0 + fa_e / {p.dv}, fa_col = fa_e % {p.dv};",
                   f"const long long fc_r = fa_bh * {p.sq}LL + fa_row;",
                   f"const long long fc_e = fc_r * {p.dv}LL + fa_col;",
                   *combine_element(p, c, store, "__ldcg")]
        if p.sq % c.bq:
            element = [element[0], f"if (fa_row < {p.sq}) {{", *_indent(element[1:], 1), "}"]
        return [f"// split-KV, last block: the query block's {c.splits} partials combined by its "
                "last block",
                *last_block_lines(TICKETS, "fa_blk", c.splits),
                f"for (int fa_e = tid; fa_e < {c.bq * p.dv}; fa_e += {c.threads}) {{",
                *_indent(element, 1), "}"]

    @property
    def kb_range(self) -> tuple[str, str]:
        """The C expressions of the first key block this block visits and the one after its
        last: all of them, or this split's run."""
        return ("0", "fa_nkb") if self.c.splits == 1 else ("fa_kb0", "fa_kb1")

    def split_lines(self) -> list[str]:
        """Split-KV: this block's run of key blocks (after fa_nkb: causal blocks end sooner)."""
        if self.c.splits == 1:
            return []
        run = -(-(-(-self.p.sk // self.c.bkv)) // self.c.splits)   # ceil(ceil(sk/bkv)/S)
        return [f"const int fa_kb0 = fa_sp * {run};   // this split's run of key blocks",
                f"const int fa_kb1 = fa_kb0 + {run} < fa_nkb ? fa_kb0 + {run} : fa_nkb;"]

    def split_ids(self) -> list[str]:
        """Split-KV: the split of the keys this block takes (bid's fastest part); fa_blk, the
        rest of bid, is then what the unsplit kernel reads from bid."""
        s = self.c.splits
        if s == 1:
            return []
        return [f"const int fa_sp = int(bid % {s});   // this block's split of the keys",
                f"const long long fa_blk = bid / {s};"]

    def partial_rows(self) -> list[str]:
        """Split-KV: where this block's partial outputs and row lse go in emmy_partial."""
        p, s = self.p, self.c.splits
        bh, rows = p.batch * p.heads, p.batch * p.heads * p.sq
        return [
            "// split-KV: this split's output, normalized over its own keys, and each row's m",
            "// (-inf where it saw no key) and log2 l, for the combine",
            f"float* const fa_po = emmy_partial + (fa_sp * {bh}LL + fa_bh) * {p.sq * p.dv}LL;",
            f"float* const fa_pl = emmy_partial + {s * rows * p.dv}LL + (fa_sp * {bh}LL + fa_bh)"
            f" * {p.sq}LL;"]

    def partial_epilogue(self) -> list[str]:
        """Split-KV: the epilogue into emmy_partial (partial_rows): 1 / l taken as 0 where
        l == 0 (the combine weighs that split 0), each row's lse written once."""
        def store(bz, h, row, col, value):
            return [f"fa_po[{row} * {self.fa_dv} + {col}] = {value};"]
        return [*self.partial_rows(), *self.epilogue(store, partial=True)]

    def row_total(self, row: str, first_lane: str, m: str, partial: bool) -> list[str]:
        """After a row's l is summed over its lanes into fa_sum: its 1 / l (0 where l == 0
        when the problem is `zero_empty`); split-KV (`partial`), 0 where l == 0, and the
        row's m (-inf where l == 0) and log2 l written by the row's `first_lane` where `row` is
        inside sq."""
        if not partial:
            return ["fa_sum > 0.f ? 1.f / fa_sum : 0.f;" if self.p.zero_empty
                    else "1.f / fa_sum;"]
        rows = self.c.splits * self.p.batch * self.p.heads * self.p.sq
        return ["fa_sum > 0.f ? 1.f / fa_sum : 0.f;",
                f"if ({first_lane} && {row} < FA_SQ) {{",
                f"  fa_pl[{row}] = fa_sum > 0.f ? {m} : -EMMY_INF_F32;",
                f"  fa_pl[{row} + {rows}LL] = fa_sum > 0.f ? log2f(fa_sum) : 0.f;",
                "}"]

    def prologue(self) -> list[str]:
        """Constants, the block's (bz, h, query block), operand bases, shared tiles, Q's load
        (and, with two stages, key block 0's), and the per-row state m, l, O."""
        p, c, t = self.p, self.c, self.t
        qb = _qblocks(p, c)
        blk = "bid" if c.splits == 1 else "fa_blk"
        # causal: up to the key block of the last query row in range (and no further than sk)
        last = "(fa_q0 + FA_BQ < FA_SQ ? fa_q0 + FA_BQ : FA_SQ) - 1"
        causal_blocks = (f"FA_CAUSAL && ({last}) / FA_BKV + 1 < FA_KBLOCKS ? "
                         f"({last}) / FA_BKV + 1 : FA_KBLOCKS")
        out = [
            f"// attention: {p.batch}x{p.heads} heads, sq {p.sq}, sk {p.sk}, d {p.d}, "
            f"{'causal' if p.causal else 'no mask'}; bq {c.bq}, bkv {c.bkv}, {c.warps} warps, "
            f"{c.stages} stage(s)",
            f"constexpr int FA_SQ = {p.sq}, FA_D = {p.d}, FA_P = {self.pitch};   // P: smem row "
            f"pitch",
            *([f"constexpr int FA_DV = {p.dv}, FA_PV = {self.vpitch};   // v's and out's"]
              if self.apart else []),
            *([f"constexpr int FA_SK = {p.sk};"] if p.sk % c.bkv else []),
            f"constexpr int FA_BQ = {c.bq}, FA_BKV = {c.bkv};",
            *self.layout_constants(),
            f"constexpr int FA_KBLOCKS = {-(-p.sk // c.bkv)};",
            f"constexpr bool FA_CAUSAL = {'true' if p.causal else 'false'};",
            "// the softmax exponent's factor: scale * log2(e), or 1 where S is scaled first",
            f"constexpr float FA_C = {'1.f' if p.scaled_first else _float(p.scale * LOG2E)};",
            "const int fa_lane = tid % 32, fa_warp = tid / 32;",
            *self.lane_roles(),
            *self.split_ids(),
            f"const int fa_q0 = ({qb} - 1 - int({blk} % {qb})) * FA_BQ;",
            f"const long long fa_bh = {blk} / {qb};",
            f"const long long fa_bz = fa_bh / {p.heads};",
            f"const int fa_h = int(fa_bh % {p.heads});",
            "// this warp's query rows, in the block and in the sequence",
            f"const int fa_w0 = fa_warp * {self.warp_rows}, fa_wq0 = fa_q0 + fa_w0;",
            f"const int fa_nkb = {causal_blocks};   // key blocks this block visits",
            *self.split_lines(),
            *self.first_masked(),
        ]
        out += self.copy_lanes("fa_", p.d, "FA_P")
        if self.apart:
            out += self.copy_lanes("fa_v", p.dv, "FA_PV")
        for name, op in (("q", p.q), ("k", p.k), ("v", p.v)):
            s = op.strides
            cr, ce = (("fa_vcr", "fa_vce") if name == "v" and self.apart
                      else ("fa_cr", "fa_ce"))
            out.append(f"const {t}* const fa_{name}g = {op.buffer} + {op.const}LL"
                       f" + fa_bz * {s[0]}LL"
                       f" + {op.head('fa_h')} * {s[1]}LL + {cr} * {s[2]}LL + {ce};"
                       f"   // {name} at (0, {ce})"
                       f" of this thread's rows")
        kv, kv_v = c.bkv * self.pitch, c.bkv * self.vpitch
        out += [
            f"{t}* const fa_qs = reinterpret_cast<{t}*>(emmy_smem);",
            f"{t}* const fa_ks = fa_qs + FA_BQ * FA_P;   // [stages][bkv][P]",
            f"{t}* const fa_vs = fa_ks + {c.stages * kv};",
            *self.more_tiles(f"fa_vs + {c.stages * kv_v}"),
            *self.load("fa_qs", "q", "fa_q0", "FA_SQ" if p.sq % c.bq else None, c.bq),
        ]
        if c.stages == 2 and c.splits == 1:
            out += self.load_kv("0", "0")
        elif c.stages == 2:
            out += ["if (fa_kb0 < fa_kb1) {", *_indent(self.load_kv("fa_kb0", "fa_kb0 & 1"), 1),
                    "}"]
        return out + ["cp_async_commit();", *self.state()]

    def copy_lanes(self, prefix: str, d: int, pitch: str) -> list[str]:
        """Which 16-byte column chunk (`prefix`ce) of which tile rows (`prefix`cr + i * rows
        per pass) this thread copies, for rows of `d` elements; `prefix`so, its offset in a
        shared tile of row pitch `pitch`."""
        chunks = d // self.vec
        out = [f"// tile copies: this thread's 16-byte column chunk {prefix}ce of tile rows "
               f"{prefix}cr + i * {self.c.threads // chunks}",
               f"const int {prefix}cr = tid / {chunks}, {prefix}ce = tid % {chunks} * {self.vec};",
               f"const int {prefix}so = {prefix}cr * {pitch} + {prefix}ce;   // its offset in a "
               f"shared tile"]
        if self.c.threads % chunks:
            out.append(f"const bool {prefix}copies = tid < "
                       f"{self.c.threads // chunks * chunks};")
        return out

    def layout_constants(self) -> list[str]:
        """The constants of how the warps' lanes share the block's rows, keys and columns."""
        c = self.c
        return [f"constexpr int FA_MT = {c.bq // c.warps // 16};   // 16-row mma tiles per warp",
                f"constexpr int FA_NT = {c.bkv // 8}, FA_DT = {self.p.dv // 8};   // n8 tiles of S "
                f"and O"]

    def lane_roles(self) -> list[str]:
        return ["const int fa_g = fa_lane / 4, fa_t = fa_lane % 4;   // mma fragment row, "
                "column pair"]

    def more_tiles(self, start: str) -> list[str]:
        """Shared tiles after Q, K and V (from the C pointer `start`): none here."""
        return []

    def state(self) -> list[str]:
        """The per-row state: running max m, running sum l, output accumulator O."""
        return [
            "float fa_m[FA_MT][2], fa_l[FA_MT][2];   // rows g and g + 8 of each tile (log2 domain)",
            "float fa_o[FA_MT][FA_DT][4];",
            "#pragma unroll",
            "for (int mt = 0; mt < FA_MT; ++mt) {",
            "  fa_m[mt][0] = fa_m[mt][1] = -EMMY_INF_F32;",
            "  fa_l[mt][0] = fa_l[mt][1] = 0.f;",
            "  #pragma unroll",
            "  for (int dn = 0; dn < FA_DT; ++dn) fa_o[mt][dn][0] = fa_o[mt][dn][1] = "
            "fa_o[mt][dn][2] = fa_o[mt][dn][3] = 0.f;",
            "}",
        ]

    def first_masked(self) -> list[str]:
        """fa_kmask: the first key block where this warp needs a mask: the last one when sk is
        ragged; when causal, the first one holding a key after the warp's first row."""
        p, c = self.p, self.c
        ragged = p.sk % c.bkv != 0
        if p.causal and ragged:
            first = "(fa_wq0 + 1) / FA_BKV < FA_KBLOCKS - 1 ? (fa_wq0 + 1) / FA_BKV : FA_KBLOCKS - 1"
        elif p.causal:
            first = "(fa_wq0 + 1) / FA_BKV"
        elif ragged:
            first = "FA_KBLOCKS - 1"
        else:
            return []
        return [f"const int fa_kmask = {first};"]

    def load(self, dst: str, name: str, row0: str, limit: str | None, rows: int) -> list[str]:
        """cp.async of the `rows` sequence rows from `row0` of operand `name` into the padded
        shared tile `dst`. Thread tid copies column chunk tid % (d/8) of tile rows tid / (d/8)
        + i * (threads / (d/8)). `limit`: None where every tile row is inside the sequence,
        else the sequence length; rows past it are zero-filled, reading nothing."""
        op = getattr(self.p, name)
        v = name == "v" and self.apart            # v's own copy lanes (copy_lanes "fa_v")
        d, pitch, lanes = ((self.p.dv, self.vpitch, "fa_v") if v
                           else (self.p.d, self.pitch, "fa_"))
        rpi = self.c.threads // (d // self.vec)   # tile rows one pass of all threads copies
        passes = -(-rows // rpi)
        stride = op.strides[2]
        tests = []
        if self.c.threads % (d // self.vec):
            tests.append(f"{lanes}copies")
        if rows % rpi:
            tests.append(f"{lanes}cr + fa_i * {rpi} < {rows}")
        dst_at = f"{dst} + {lanes}so + fa_i * {rpi * pitch}"
        if limit is not None:
            copy = [f"const bool fa_in = {row0} + {lanes}cr + fa_i * {rpi} < {limit};",
                    f"cp_async_16_zfill({dst_at}, fa_{name}g + (fa_in ? {row0} + fa_i * {rpi} : "
                    f"-{lanes}cr) * {stride}LL, fa_in ? 16 : 0);"]
        else:
            copy = [f"cp_async_16({dst_at}, fa_{name}g + ({row0} + fa_i * {rpi}) * {stride}LL);"]
        if tests:
            copy = [f"if ({' && '.join(tests)}) {{", *_indent(copy, 1), "}"]
        return ["#pragma unroll", f"for (int fa_i = 0; fa_i < {passes}; ++fa_i) {{",
                *_indent(copy, 1), "}"]

    def load_kv(self, block: str, stage: str) -> list[str]:
        """Key block `block`'s K and V tiles into buffer `stage`."""
        kv, kv_v = self.c.bkv * self.pitch, self.c.bkv * self.vpitch
        row0 = f"({block}) * FA_BKV"
        limit = "FA_SK" if self.p.sk % self.c.bkv else None
        return [*self.load(f"fa_ks + ({stage}) * {kv}", "k", row0, limit, self.c.bkv),
                *self.load(f"fa_vs + ({stage}) * {kv_v}", "v", row0, limit, self.c.bkv)]

    def key_loop(self) -> list[str]:
        """The loop over key blocks: wait for block kb's K and V (with two stages, after
        starting block kb + 1's copies into the other buffer), then each warp's S = Q K^T,
        mask, online softmax and O += P V on it. Causal: a warp skips a block wholly above
        its rows."""
        c = self.c
        kv, kv_v = c.bkv * self.pitch, c.bkv * self.vpitch
        first, end = self.kb_range
        out = [f"for (int kb = {first}; kb < {end}; ++kb) {{"]
        if c.stages == 2:
            out += ["  // prefetch key block kb + 1 into the other buffer; wait for block kb",
                    f"  if (kb + 1 < {end}) {{",
                    *_indent(self.load_kv("kb + 1", "(kb + 1) & 1"), 2),
                    "  }",
                    "  cp_async_commit();",
                    "  cp_async_wait<1>();",
                    "  __syncthreads();",
                    f"  const {self.t}* const fa_kt = fa_ks + (kb & 1) * {kv};",
                    f"  const {self.t}* const fa_vt = fa_vs + (kb & 1) * {kv_v};"]
        else:
            out += [*_indent(self.load_kv("kb", "0"), 1),
                    "  cp_async_commit();",
                    "  cp_async_wait<0>();",
                    "  __syncthreads();",
                    f"  const {self.t}* const fa_kt = fa_ks;",
                    f"  const {self.t}* const fa_vt = fa_vs;"]
        work = [*self.scores(), *self.mask(), *self.softmax(), *self.pv()]
        if self.p.sq < c.bq:      # (one query block: every block has such warps)
            work = ["// a warp whose rows are all past sq computes nothing (warp-uniform)",
                    "if (fa_wq0 < FA_SQ) {", *_indent(work, 1), "}"]
        if self.p.causal:
            work = ["// skip a key block wholly above this warp's rows (warp-uniform)",
                    f"if (kb * FA_BKV <= fa_wq0 + {self.warp_rows} - 1) {{", *_indent(work, 1),
                    "}"]
        out += [*_indent(work, 1),
                "  __syncthreads();   // every warp is done with this buffer before it is refilled",
                "}"]
        return out

    def scores(self) -> list[str]:
        """S[mt][n8 tile][4] = Q K^T: per k16 step, one ldmatrix.x4 of Q per m tile and one of K
        per pair of n8 tiles (lane l addresses key l%8 + 8*(l/16), dims 8*((l/8)%2))."""
        return [
            "float fa_s[FA_MT][FA_NT][4];",
            "#pragma unroll",
            "for (int mt = 0; mt < FA_MT; ++mt)",
            "  #pragma unroll",
            "  for (int j = 0; j < FA_NT; ++j) "
            "fa_s[mt][j][0] = fa_s[mt][j][1] = fa_s[mt][j][2] = fa_s[mt][j][3] = 0.f;",
            "#pragma unroll",
            "for (int kk = 0; kk < FA_D / 16; ++kk) {",
            "  unsigned fa_a[FA_MT][4];",
            "  #pragma unroll",
            "  for (int mt = 0; mt < FA_MT; ++mt)",
            "    ldmatrix_x4(fa_a[mt], fa_qs + (fa_w0 + mt * 16 + fa_lane % 16) * FA_P"
            " + kk * 16 + fa_lane / 16 * 8);",
            "  #pragma unroll",
            "  for (int p = 0; p < FA_NT / 2; ++p) {",
            "    unsigned fa_b[4];",
            "    ldmatrix_x4(fa_b, fa_kt + (p * 16 + fa_lane % 8 + fa_lane / 16 * 8) * FA_P"
            " + kk * 16 + fa_lane / 8 % 2 * 8);",
            "    const unsigned fa_b0[2] = {fa_b[0], fa_b[1]}, fa_b1[2] = {fa_b[2], fa_b[3]};",
            "    #pragma unroll",
            "    for (int mt = 0; mt < FA_MT; ++mt) {",
            f"      {self.mma}(fa_s[mt][2 * p], fa_a[mt], fa_b0, fa_s[mt][2 * p]);",
            f"      {self.mma}(fa_s[mt][2 * p + 1], fa_a[mt], fa_b1, fa_s[mt][2 * p + 1]);",
            "    }",
            "  }",
            "}",
        ]

    def mask(self) -> list[str]:
        """S rounded to 16 bits where the program rounds it; with a scale <= 0 or a bias, S
        multiplied by scale * log2(e) here (softmax's FA_C is then 1), and the bias added or
        the mask tensor applied.
        Then, from key block fa_kmask on, -inf for keys past sk (when sk is ragged) and, when
        causal, for keys after the query; the test is warp-uniform, so blocks before run no
        mask code. Element i of n8 tile j is row
        g + 8*(i/2), key 8j + 2t + i%2 of the warp's m tile mt."""
        loops = ["for (int mt = 0; mt < FA_MT; ++mt)", "for (int j = 0; j < FA_NT; ++j)",
                 "for (int i = 0; i < 4; ++i)"]
        lines = round_scores(self.p, "fa_s[mt][j][i]", loops)
        lines += [] if not self.p.scaled_first else [
            "#pragma unroll",
            "for (int mt = 0; mt < FA_MT; ++mt)",
            "  #pragma unroll",
            "  for (int j = 0; j < FA_NT; ++j)",
            "    #pragma unroll",
            f"    for (int i = 0; i < 4; ++i) fa_s[mt][j][i] *= {_float(self.p.scale * LOG2E)};",
        ]
        lines += bias_scores(self.p, "fa", "fa_s[mt][j][i]", loops,
                             "fa_wq0 + fa_g + mt * 16 + i / 2 * 8",
                             "kb * FA_BKV + fa_t * 2 + j * 8 + i % 2")
        return lines + mask_keys(self.p, self.c.bkv, "fa", "kb", "fa_s[mt][j][i]", loops, [
            "// this lane's first key in the block, and that key minus the lane's first row:",
            "// each element's test is one comparison with a constant",
            "const int fa_kl = kb * FA_BKV + fa_t * 2, fa_kq = fa_kl - fa_wq0 - fa_g;"],
            "j * 8 + i % 2", "mt * 16 + i / 2 * 8")

    def softmax(self) -> list[str]:
        """Online softmax per row, P packed to 16 bits on the way: the row's new max over its
        quad (lanes 4g..4g+3), in the log2 domain; alpha = exp2(m_old - m_new) rescales l and
        O; P = exp2(S * FA_C - m_new) (one FFMA and one ex2 an element); l += this lane's
        part of the row sum (l stays a per-lane partial sum until the epilogue). P's packed
        registers are the m16n8k16 A fragments of O += P V: for 16 keys kk, register r (0, 1:
        rows g, g+8) holds n8 tile 2kk's pair of keys (2t, 2t+1) and register 2 + r tile
        2kk+1's. A row with no visible key yet keeps m = -inf and subtracts 0 instead, so no
        inf - inf appears."""
        pk = self.pack
        return [
            "unsigned fa_p[FA_MT][FA_NT / 2][4];",
            "#pragma unroll",
            "for (int mt = 0; mt < FA_MT; ++mt)",
            "  #pragma unroll",
            "  for (int r = 0; r < 2; ++r) {",
            "    float fa_mx = -EMMY_INF_F32;",
            "    #pragma unroll",
            "    for (int j = 0; j < FA_NT; ++j)",
            "      fa_mx = fmaxf(fa_mx, fmaxf(fa_s[mt][j][2 * r], fa_s[mt][j][2 * r + 1]));",
            "    fa_mx = fmaxf(fa_mx, __shfl_xor_sync(0xffffffffu, fa_mx, 1));",
            "    fa_mx = fmaxf(fa_mx, __shfl_xor_sync(0xffffffffu, fa_mx, 2));",
            "    const float fa_new = fmaxf(fa_m[mt][r], fa_mx * FA_C);",
            "    const float fa_base = fa_new == -EMMY_INF_F32 ? 0.f : fa_new;",
            "    const float fa_alpha = ex2_approx(fa_m[mt][r] - fa_base);",
            "    fa_m[mt][r] = fa_new;",
            "    float fa_sum = 0.f;",
            "    #pragma unroll",
            "    for (int kk = 0; kk < FA_NT / 2; ++kk) {",
            "      const float fa_p0 = ex2_approx(fmaf(fa_s[mt][2 * kk][2 * r], FA_C, -fa_base));",
            "      const float fa_p1 = ex2_approx(fmaf(fa_s[mt][2 * kk][2 * r + 1], FA_C, -fa_base));",
            "      const float fa_p2 = ex2_approx(fmaf(fa_s[mt][2 * kk + 1][2 * r], FA_C, -fa_base));",
            "      const float fa_p3 = ex2_approx(fmaf(fa_s[mt][2 * kk + 1][2 * r + 1], FA_C, "
            "-fa_base));",
            "      fa_sum += (fa_p0 + fa_p1) + (fa_p2 + fa_p3);",
            f"      fa_p[mt][kk][r] = {pk}(fa_p0, fa_p1);",
            f"      fa_p[mt][kk][2 + r] = {pk}(fa_p2, fa_p3);",
            "    }",
            "    fa_l[mt][r] = fa_l[mt][r] * fa_alpha + fa_sum;",
            "    #pragma unroll",
            "    for (int dn = 0; dn < FA_DT; ++dn) {",
            "      fa_o[mt][dn][2 * r] *= fa_alpha;",
            "      fa_o[mt][dn][2 * r + 1] *= fa_alpha;",
            "    }",
            "  }",
        ]

    def pv(self) -> list[str]:
        """O += P V: per 16 keys kk, V's B fragments for two n8 tiles of d come from one
        ldmatrix.x4.trans (lane l addresses key l%16, dims 8*(l/16)); P's are fa_p[mt][kk]."""
        return [
            "#pragma unroll",
            "for (int kk = 0; kk < FA_NT / 2; ++kk)",
            "  #pragma unroll",
            "  for (int dp = 0; dp < FA_DT / 2; ++dp) {",
            "    unsigned fa_b[4];",
            f"    ldmatrix_x4_trans(fa_b, fa_vt + (kk * 16 + fa_lane % 16) * {self.fa_pv}"
            " + dp * 16 + fa_lane / 16 * 8);",
            "    const unsigned fa_b0[2] = {fa_b[0], fa_b[1]}, fa_b1[2] = {fa_b[2], fa_b[3]};",
            "    #pragma unroll",
            "    for (int mt = 0; mt < FA_MT; ++mt) {",
            f"      {self.mma}(fa_o[mt][2 * dp], fa_p[mt][kk], fa_b0, fa_o[mt][2 * dp]);",
            f"      {self.mma}(fa_o[mt][2 * dp + 1], fa_p[mt][kk], fa_b1, fa_o[mt][2 * dp + 1]);",
            "    }",
            "  }",
        ]

    def epilogue(self, store: Store, partial: bool = False) -> list[str]:
        """Each row's l summed over its quad, then out = O / l (where l == 0, NaN as softmax
        gives, or 0 for a `zero_empty` problem) through `store` for the rows inside sq.
        Element i of O tile dn is row g + 8*(i/2), column 8dn + 2t + i%2. `partial`: split-KV's
        (partial_epilogue)."""
        stmts = store("fa_bz", "fa_h", "fa_row", "fa_col", "fa_val")
        inv, *lse = self.row_total("fa_wq0 + mt * 16 + fa_g + r * 8", "fa_t == 0",
                                   "fa_m[mt][r]", partial)
        return [
            "#pragma unroll",
            "for (int mt = 0; mt < FA_MT; ++mt) {",
            "  float fa_inv[2];",
            "  #pragma unroll",
            "  for (int r = 0; r < 2; ++r) {",
            "    float fa_sum = fa_l[mt][r];",
            "    fa_sum += __shfl_xor_sync(0xffffffffu, fa_sum, 1);",
            "    fa_sum += __shfl_xor_sync(0xffffffffu, fa_sum, 2);",
            f"    fa_inv[r] = {inv}",
            *("    " + line for line in lse),
            "  }",
            "  #pragma unroll",
            "  for (int dn = 0; dn < FA_DT; ++dn)",
            "    #pragma unroll",
            "    for (int i = 0; i < 4; ++i) {",
            "      const int fa_row = fa_wq0 + mt * 16 + fa_g + i / 2 * 8;",
            "      const int fa_col = dn * 8 + fa_t * 2 + i % 2;",
            "      const float fa_val = fa_o[mt][dn][i] * fa_inv[i / 2];",
            "      if (fa_row < FA_SQ) {",
            *["        " + s for s in stmts],
            "      }",
            "    }",
            "}",
        ]


def _indent(lines: list[str], depth: int) -> list[str]:
    return ["  " * depth + line for line in lines]


def _float(x: float) -> str:
    """`x` (finite) as a C float literal."""
    return f"{x!r}f"
