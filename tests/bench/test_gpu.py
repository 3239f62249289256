"""The GPU runtime: what the CPU can check (detection never raises, cubin padding), and on a GPU
the same verdicts as the emulator (honest, unwritten element, input written)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import torch

from emmy.frontend.workload import Workload, load_expr
from emmy.pipeline import Options, compile_to
from emmy.runtime.gpu import elf_image, gpu_available


def test_gpu_available_answers_without_raising():
    assert gpu_available() in (True, False)


def test_inputs_start_16_byte_aligned():
    """A view into the middle of a tensor is copied once, so that vector loads, cp.async and TMA
    copies (which assume cudaMalloc's alignment) see an aligned input; an aligned one is used as
    it is."""
    import torch

    from emmy.dtypes import DType
    from emmy.runtime.gpu import _as_device_tensor

    x = torch.randn(65, dtype=torch.float16)
    view = x[1:]
    assert view.data_ptr() % 16
    got = _as_device_tensor(view, (8, 8), DType.F16, "cpu")
    assert got.data_ptr() % 16 == 0 and torch.equal(got, view.reshape(8, 8))
    aligned = x[:64]
    assert _as_device_tensor(aligned, (8, 8), DType.F16, "cpu").data_ptr() == aligned.data_ptr()


def test_elf_image_restores_stripped_trailing_zeros():
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.schedule.targets import get_target

    prog = compile_to(load_expr("nn.ReLU()(torch.randn(8, 32))"), "cuda")["cuda"]
    cubin = compile_cuda(prog.units[0].source, get_target("sm_90a")).cubin
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    declared = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    image = elf_image(cubin)
    assert len(image) == max(declared, len(cubin)) and image.startswith(cubin)
    assert elf_image(image) == image
    assert elf_image(b"not an elf") == b"not an elf"


@pytest.fixture(scope="module")
def relu():
    w = load_expr("nn.ReLU()(torch.randn(64, 256))")
    stages = compile_to(w, "cuda")
    return w, stages["torch"], stages["cuda"]


def _edit(prog, old, new):
    unit = prog.units[0]
    return dataclasses.replace(prog, units=(dataclasses.replace(
        unit, source=unit.source.replace(old, new, 1)),))


@pytest.mark.gpu
def test_gpu_run_matches_the_emulator(relu):
    import torch

    from emmy.runtime.cpu import run_program
    from emmy.runtime.gpu import run_program_gpu

    w, graph, prog = relu
    x = torch.randn(64, 256)
    (got,) = run_program_gpu(prog, {"input": x.cuda()})
    cpu = run_program(prog, {"input": x})
    assert cpu.ok
    assert torch.equal(got.cpu(), torch.from_numpy(cpu.outputs[0]))


@pytest.mark.gpu
def test_gpu_harness_gives_the_same_verdicts(relu):
    from emmy.bench.harness import check_program

    w, graph, prog = relu
    ok = check_program(w, graph, prog, device="gpu")
    assert ok.verdict == "ok" and len(ok.cases) == 6
    skip = _edit(prog, "const int tid = threadIdx.x;",
                 "const int tid = threadIdx.x;\n  if (tid == 0) return;")
    bad = check_program(w, graph, skip, device="gpu", seeds=(0,))
    assert bad.verdict == "incorrect" and bad.errors[0].unwritten > 0
    writes = _edit(prog, "em_vstore(out0",
                   "const_cast<float*>(input)[e] = 0.5f;\n    em_vstore(out0")
    bad = check_program(w, graph, writes, device="gpu", seeds=(0,))
    assert bad.verdict == "incorrect" and any("input `input`" in r for r in bad.reasons)


def _illegal_access(_item):
    """Runs in a worker: a kernel that writes far outside its buffer."""
    from emmy.bench.harness import GpuExecutor, make_cases

    w = load_expr("nn.ReLU()(torch.randn(64, 256))")
    stages = compile_to(w, "cuda")
    prog = _edit(stages["cuda"], "em_vstore(out0 + (", "em_vstore(out0 + (1LL << 40) + (")
    (case,) = make_cases(w, stages["torch"], seeds=(0,), device="cuda")
    run = GpuExecutor(prog)
    done = run(case.inputs)
    return done.status, done.log


@pytest.mark.gpu
def test_an_illegal_address_is_a_crash_reported_by_the_worker():
    from emmy.bench.worker import run_each

    (out,) = run_each(_illegal_access, [0], timeout=240)
    assert out.status in ("ok", "crash", "error")
    if out.ok:
        assert out.value[0] == "crash", out.value


def _passes_the_gpu_harness(w, kernel: str, row: str):
    """`w` with `row` for `kernel` ("" for the only one) through the GPU harness: 2 seeds x 3
    input distributions, all ok; the compiled stages."""
    from emmy.bench.harness import check_program

    stages = compile_to(w, "cuda", Options(rows={kernel: row}))
    assert row in [u.row for u in stages["cuda"].units]
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result
    return stages


@pytest.mark.gpu
@pytest.mark.parametrize("row", [
    "WORK=warps:4 TILE=flash:128x32 REDUCE=serial STAGE=async:2",
    "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=async:2:overlap",
    "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=tma:2",
])
def test_gpu_hand_written_attention_passes_the_harness(row):
    """Attention written out by hand (scores rounded to f16 as eager rounds them, a tril mask);
    the x100 inputs overflow scores to inf (rows NaN in eager too)."""
    from emmy.frontend.workload import load_file

    _passes_the_gpu_harness(load_file("examples/attention_manual.py", (("seq_len", 200),)),
                            "", row)


@pytest.mark.gpu
@pytest.mark.parametrize("row", [
    "WORK=warps:4 TILE=flash:128x32 REDUCE=serial STAGE=async:2",
    "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=tma:2:overlap",
])
def test_gpu_grouped_query_attention_passes_the_harness(row):
    """8 query heads over 2 key/value heads (k and v read at head h // 4; their TMA maps have
    2 heads), causal."""
    w = load_expr("(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, "
                  "enable_gqa=True))(torch.randn(2, 8, 200, 64).half(), "
                  "torch.randn(2, 2, 200, 64).half(), torch.randn(2, 2, 200, 64).half())")
    stages = _passes_the_gpu_harness(w, "", row)
    assert stages["tile"].program.kernels[0].attention.k.group == 4


@pytest.mark.gpu
@pytest.mark.parametrize("row", [
    "WORK=warps:4 TILE=flash:128x32 REDUCE=serial STAGE=async:2",
    "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=tma:2",
])
def test_gpu_attention_block_passes_the_harness(row):
    """minGPT's block: projection, flash attention reading q, k, v inside the packed projection
    (TMA maps starting at an offset) and the mask buffer, projection."""
    from emmy.frontend.workload import load_file

    _passes_the_gpu_harness(load_file("examples/attention_block.py", (("seq_len", 200),)),
                            "k1_cast", row)


@pytest.mark.gpu
@pytest.mark.parametrize("row", [
    "WORK=warps:4 TILE=simt:64x32 REDUCE=serial STAGE=async:2",
    "WORK=warps:4 TILE=simt:128x32 REDUCE=serial STAGE=smem",
])
def test_gpu_f32_attention_passes_the_harness(row):
    """f32 attention on CUDA cores (emmy.cuda.attention_simt), causal, ragged sequence."""
    from emmy.frontend.workload import load_file

    _passes_the_gpu_harness(load_file("examples/attention.py", (("seq_len", 200),
                                                                ("head_dim", 64))), "", row)


@pytest.mark.gpu
@pytest.mark.parametrize("sets, row", [
    ((), "WORK=warps:4 TILE=flash:64x64 REDUCE=split:16:combine STAGE=async:2"),
    ((("dtype", "float32"),), "WORK=warps:4 TILE=simt:32x32 REDUCE=split:8:combine STAGE=async:2"),
    ((), "WORK=warps:4 TILE=flash:64x64 REDUCE=split:8:last STAGE=async:2"),
    ((("dtype", "float32"),), "WORK=warps:4 TILE=simt:32x32 REDUCE=split:8:last STAGE=async:2"),
])
def test_gpu_split_decode_attention_passes_the_harness(sets, row):
    """A Llama-3-8B decoding step's attention (one query a head, 32 heads over 8 key/value
    heads, 4,096 cached tokens), split-KV: partial kernel and combine, or one kernel whose
    last block of each query block combines."""
    from emmy.frontend.workload import load_file

    _passes_the_gpu_harness(load_file("examples/decode_attention.py", (
        ("batch_size", 1), ("n_heads", 32), ("n_kv_heads", 8), ("cache_len", 4096),
        ("head_dim", 128), *sets)), "", row)


@pytest.mark.gpu
def test_gpu_masked_decode_attention_passes_the_harness():
    """The same step under a padding mask over the keys: the 4 query heads of a key/value head
    as its query rows, each reading its own head's mask, split-KV by the default row."""
    from emmy.bench.harness import check_program

    w = load_expr("(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, "
                  "enable_gqa=True))(torch.randn(1, 32, 1, 128).half(), torch.randn(1, 8, "
                  "4096, 128).half(), torch.randn(1, 8, 4096, 128).half(), "
                  "torch.rand(1, 1, 1, 4096) > 0.1)")
    stages = compile_to(w, "cuda")
    (unit,) = stages["cuda"].units
    assert "REDUCE=split:" in unit.row
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result


@pytest.mark.gpu
@pytest.mark.parametrize("row", [
    "WORK=warps:4 TILE=flash:128x32 REDUCE=serial STAGE=async:2",
    "WORK=warps:4 TILE=flash:64x64 REDUCE=split:2:combine STAGE=async:2",
])
def test_gpu_mla_attention_passes_the_harness(row):
    """q . k over 192 and v over 128 (DeepSeek's MLA), causal, 16 heads, 512 tokens."""
    w = load_expr("F.scaled_dot_product_attention(torch.randn(1, 16, 512, 192).half(), "
                  "torch.randn(1, 16, 512, 192).half(), torch.randn(1, 16, 512, 128).half(), "
                  "is_causal=True)")
    _passes_the_gpu_harness(w, "", row)


@pytest.mark.gpu
def test_gpu_moe_router_passes_the_harness():
    """DeepSeek-V3's router shape: a bf16 gate projection over 256 experts, softmax in f32,
    the top 8 (positions checked by the values they pick, against float64 on the GPU)."""
    from emmy.bench.harness import check_program
    from emmy.frontend.workload import load_file

    w = load_file("examples/moe_router.py", (("tokens", 4096), ("hidden", 7168),
                                              ("experts", 256), ("top_k", 8)))
    stages = compile_to(w, "cuda")
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result


@pytest.mark.gpu
def test_gpu_topk_over_a_vocabulary_passes_the_harness():
    """Top 50 of GPT-2's 50,257 logits over 8 rows: the k-th largest key selected a bit at a
    time (32 counts), the running counts a block a row (em_block_scan), the slots and their
    order (positions checked by the values they pick)."""
    from emmy.bench.harness import check_program

    w = load_expr("torch.topk(torch.randn(8, 50257), 50)")
    stages = compile_to(w, "cuda")
    assert any(u.row.startswith("WORK=block:") and "cumsum" in u.kernel
               for u in stages["cuda"].units)
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok", result


# fused rows of a weight-only quantized linear layer, 4096 -> 4096: a decoding batch's
# mma.sync rows (a raw ring at async:4, its K split summed by a combine kernel or by each tile's
# last block; one tile held at async:2) and a wgmma row
QUANTIZED_ROWS = [
    (16, "WORK=warps:2x4 TILE=mma:32x64x16 REDUCE=split:16:combine STAGE=async:4 RASTER=group:8 "
     "PLACE=fuse"),
    (16, "WORK=warps:2x4 TILE=mma:32x64x16 REDUCE=split:16:last STAGE=async:4 RASTER=group:8 "
     "PLACE=fuse"),
    (16, "WORK=warps:2x4 TILE=mma:32x64x64 REDUCE=split:16:last STAGE=async:4 RASTER=group:8 "
     "PLACE=fuse"),      # the default (k steps of 64)
    (16, "WORK=warps:2x2 TILE=mma:32x64x32 REDUCE=split:4:combine STAGE=async:2 RASTER=row "
     "PLACE=fuse"),
    (256, "WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=serial STAGE=async:4 RASTER=group:8 "
     "PLACE=fuse"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("batch,row", QUANTIZED_ROWS + [
    (16, "WORK=warps:2x2 TILE=mma:32x64x32 REDUCE=serial STAGE=smem RASTER=row PLACE=fuse"),
    (16, "WORK=warps:1x1 TILE=mma:32x32x16 REDUCE=serial STAGE=smem RASTER=row PLACE=cut"),
])
def test_gpu_int8_linear_passes_the_harness(batch, row):
    """A weight-only int8 linear layer, `batch` x 4096 -> 4096 (16 rows: a decoding batch): the
    weight dequantized inside the product as its tiles are copied (async:4: the raw bytes
    through their own cp.async ring; async:2: one tile's loads held in registers; smem; a
    wgmma row computing each tile into its swizzled stage), or stored first (PLACE=cut: a map
    kernel and the product, each on its default row)."""
    from emmy.bench.harness import check_program
    from emmy.frontend.workload import load_file

    w = load_file("examples/int8_linear.py", (("batch", batch), ("in_features", 4096),
                                               ("out_features", 4096)))
    if row.endswith("PLACE=fuse"):
        _passes_the_gpu_harness(w, "", row)
        return
    stages = compile_to(w, "cuda", Options(rows={"": row}))
    assert [u.kernel for u in stages["cuda"].units] == ["k0_int8_linear_cut0",
                                                        "k0_int8_linear_cut1"]
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result


@pytest.mark.gpu
@pytest.mark.parametrize("batch,row", QUANTIZED_ROWS)
def test_gpu_int4_linear_passes_the_harness(batch, row):
    """A weight-only int4 linear layer (examples/int4_linear.py), `batch` x 4096 -> 4096: two
    weights from each byte's nibbles on f16 pairs (em_4x2) inside mma.sync products (a raw
    ring; one tile held) and a wgmma product."""
    from emmy.frontend.workload import load_file

    _passes_the_gpu_harness(load_file("examples/int4_linear.py", (
        ("batch", batch), ("in_features", 4096), ("out_features", 4096))), "", row)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,row", QUANTIZED_ROWS)
def test_gpu_gptq_linear_passes_the_harness(batch, row):
    """GPTQ's checkpoint format (examples/gptq_linear.py: eight weights an int32 word along k,
    zero points packed along n), `batch` x 4096 -> 4096: the words' nibbles on f16 pairs, the
    group's zero point taken away with em_4x2's magic number."""
    from emmy.frontend.workload import load_file

    _passes_the_gpu_harness(load_file("examples/gptq_linear.py", (
        ("batch", batch), ("in_features", 4096), ("out_features", 4096))), "", row)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,row", QUANTIZED_ROWS)
def test_gpu_awq_linear_passes_the_harness(batch, row):
    """AWQ's checkpoint format (examples/awq_linear.py: eight weights an int32 word along n in
    AWQ's interleaved order, zero points packed the same way), `batch` x 4096 -> 4096: nibbles
    i and i + 4 of a word, neighbouring outputs, on f16 pairs (em_4x2_il), each pair's zero
    points in its bias."""
    from emmy.frontend.workload import load_file

    _passes_the_gpu_harness(load_file("examples/awq_linear.py", (
        ("batch", batch), ("in_features", 4096), ("out_features", 4096))), "", row)


class _ComplexMul(torch.nn.Module):
    def forward(self, z, w):
        return z * w.conj() / (w + 1), (z * w).abs()


@pytest.mark.gpu
def test_gpu_complex_rotary_and_complex_outputs_pass_the_harness():
    """Complex values as pairs of real ones on the GPU: the Llama reference's rotary embedding
    (examples/rotary_complex.py: a complex64 input read as its pairs) at Llama-3-8B's head
    sizes, and a program with complex inputs and a complex output, each through the GPU
    harness (six cases: the complex inputs drawn anew as pairs)."""
    from emmy.bench.harness import check_program
    from emmy.frontend.workload import Workload, load_file

    rotary = load_file("examples/rotary_complex.py", (("seq_len", 512), ("n_heads", 32),
                                                      ("n_kv_heads", 8), ("head_dim", 128)))
    z = torch.randn(64, 96, dtype=torch.complex64)
    product = Workload(name="cmul", model=_ComplexMul().eval(), inputs=(z, z.flip(0)),
                       source="", origin="<test>")
    for workload in (rotary, product):
        stages = compile_to(workload, "cuda", Options())
        result = check_program(workload, stages["torch"], stages["cuda"], device="gpu")
        assert result.verdict == "ok" and len(result.cases) == 6, result


@pytest.mark.gpu
@pytest.mark.parametrize("expr", [
    "torch.stft(torch.randn(4, 22050), 1024, hop_length=256, window=torch.hann_window(1024), "
    "return_complex=True).abs()",
    "torch.fft.irfft(torch.fft.rfft(torch.randn(8, 4096), n=8192) * "
    "torch.fft.rfft(torch.randn(8, 4096), n=8192), n=8192)[..., :4096]",
    "torch.fft.rfft2(torch.randn(4, 8, 64, 64)).abs()",
])
def test_gpu_fourier_transforms_pass_the_harness(expr):
    """Fourier transforms as sums of products against the DFT basis (a second of audio's STFT
    magnitudes at n_fft 1024; S4's FFT convolution; a 2-D spectrum) through the GPU harness."""
    from emmy.bench.harness import check_program

    workload = load_expr(expr)
    stages = compile_to(workload, "cuda", Options())
    result = check_program(workload, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result


@pytest.mark.gpu
@pytest.mark.parametrize("expr", [
    "(torch.randn(256, 512) * 300).to(torch.float8_e4m3fn)",
    "(torch.randn(256, 512) * 3e4).to(torch.float8_e5m2)",
    "torch.randn(256, 512).to(torch.float8_e4m3fn).float() * torch.rand(256, 1)",
    "fp8 linear",
])
def test_gpu_8_bit_floats_pass_the_harness(expr):
    """Casts to e4m3 (past 448) and e5m2 (past 57,344), fp8 reads widened, fp8 weights under a
    bf16 product, through the GPU harness: the device's conversions against torch's on CUDA."""
    from emmy.bench.harness import check_program
    from tests.tensor_ir.test_float8 import Fp8Linear

    workload = load_expr(expr) if expr != "fp8 linear" else Workload(
        "fp8_linear", Fp8Linear(256, 128), (torch.randn(64, 256).bfloat16(),), "", "<test>")
    stages = compile_to(workload, "cuda", Options())
    result = check_program(workload, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result


@pytest.mark.gpu
@pytest.mark.parametrize("expr", [
    "F.interpolate(torch.randn(2, 16, 64, 48), size=(24, 20), mode='bicubic', antialias=True)",
    "F.interpolate(torch.randn(2, 16, 64, 48), scale_factor=0.3, mode='bilinear', "
    "antialias=True)",
])
def test_gpu_antialiased_resizing_passes_the_harness(expr):
    """Antialiased resizing (a window of taps per axis, the weights computed in the kernel)
    through the GPU harness."""
    from emmy.bench.harness import check_program

    workload = load_expr(expr)
    stages = compile_to(workload, "cuda", Options())
    result = check_program(workload, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_finfo_min_padding_mask_attention_passes_the_harness(dtype):
    """Hugging Face's eager attention under a finfo.min padding mask, rows masked everywhere
    included (the bias held finite in the log2 domain; added in the 16-bit type where the
    program adds it there), with the default rows of each dtype."""
    from emmy.bench.harness import check_program
    from emmy.frontend.workload import Workload
    from tests.tensor_ir.conftest import Fn
    from tests.tile_ir.test_attention_lift import _FinfoMinMask

    t = getattr(torch, dtype)
    fn = _FinfoMinMask(t)
    mask = torch.zeros(1, 1, 256, 320, dtype=t)
    mask[..., :16, :] = torch.finfo(t).min
    mask[..., 16:, 300:] = torch.finfo(t).min
    w = Workload(name="finfo_mask", model=Fn(fn).eval(), source="", origin="<test>",
                 inputs=(torch.randn(2, 8, 256, 64).to(t), torch.randn(2, 8, 320, 64).to(t),
                         torch.randn(2, 8, 320, 64).to(t), mask))
    stages = compile_to(w, "cuda", Options())
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result
