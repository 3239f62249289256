"""Hopper thread-block clusters: the emulator runs a cluster's blocks together (emu_threads.h),
each with its own shared memory and blockIdx, and emmy_sm90.cuh's cluster intrinsics (rank,
cluster barrier, remote mbarrier arrive, multicast TMA) work across them there, as checked
against numpy; misuse and cross-block deadlocks are reported; clusters of one block behave as
before; and the device versions compile for sm_90a to the cluster instructions."""

from __future__ import annotations

import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from emmy.cuda.emulate.run import (TensorMapArg, _dims, build, build_and_run, declared_cluster,
                                   decode_outputs, entry_points)
from tests.cuda.test_emulate import SOURCE as BASICS

rng = np.random.default_rng(2090)

SOURCE = r"""
#include "emmy_kernel.cuh"
#include "emmy_sm90.cuh"

// Each block (32 threads, `size` blocks per cluster) notes its rank and blockIdx in its own
// shared memory, then multicasts row `block id` of `rows` (a map over rows_data, [blocks][32]
// floats) into slot `rank` of every block of the cluster and arrives on every block's `peers`
// barrier. After its copies and
// arrivals are in, it writes the `size` slots it received to got[block id] and its note, read
// back from its shared memory, to info[block id].
extern "C" __global__ void __launch_bounds__(32)
exchange(unsigned* info, float* got, const float* rows_data, const EmmyTensorMap* rows,
         int size) {
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + 1024);
    uint64_t* peers = full + 1;
    unsigned* note = reinterpret_cast<unsigned*>(smem + 1040);
    const int t = threadIdx.x;
    const unsigned rank = cluster_ctarank();
    const int id = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (t == 0) {
        note[0] = rank;
        note[1] = blockIdx.x;
        note[2] = blockIdx.y;
        note[3] = blockIdx.z;
        mbar_init(full, 1);
        mbar_init(peers, size);
        mbar_init_fence();
    }
    cluster_sync();   // every block's barriers are ready before anyone copies or arrives
    if (t == 0) {
        mbar_arrive_expect_tx(full, size * 128);
        tma_load_3d_multicast(smem + rank * 128, rows, 0, id, 0, full,
                              (unsigned short)((1u << size) - 1));
        for (int r = 0; r < size; ++r) mbar_arrive_cluster(peers, r);
    }
    __syncwarp();
    mbar_wait(full, 0);
    mbar_wait(peers, 0);
    const float* slots = reinterpret_cast<const float*>(smem);
    for (int i = t; i < size * 32; i += 32) got[id * size * 32 + i] = slots[i];
    if (t < 4) info[id * 4 + t] = note[t];
    cluster_sync();   // no block leaves while another may still reach its shared memory
}

// A producer / consumer ring over clusters of N blocks (along x), 96 threads each: warp 0's
// lane 0 produces, warps 1 and 2 consume. Round i's tile (8 rows of 32 floats) is
// tiles[cluster][i]; each block's producer multicasts its 8/N rows of it into stage i % 2 of
// every block of the cluster. A block's full barrier (one arrival: its own producer's
// expect_tx of the whole tile) completes when all N parts have landed; its empty barrier
// counts the consumer warps of all N blocks, since its producer writes into all of them. The
// consumers copy each tile to out[block][i], then arrive on every block's empty barrier.
template <int N>
__device__ void ring(float* out, const EmmyTensorMap* tiles, int rounds) {
    constexpr int kStages = 2, kRows = 8, kPart = kRows / N, kTile = kRows * 128;
    constexpr int kConsumerWarps = 2;
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kTile);
    uint64_t* empty = full + kStages;
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const unsigned rank = cluster_ctarank();
    const int cluster_id = blockIdx.x / N;
    if (t == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, N * kConsumerWarps);
        }
        mbar_init_fence();
    }
    cluster_sync();
    if (warp == 0) {
        if (lane == 0) {
            for (int i = 0; i < rounds; ++i) {
                const int s = i % kStages;
                mbar_wait(empty + s, ((i / kStages) & 1) ^ 1);   // round i - 2 consumed everywhere
                mbar_arrive_expect_tx(full + s, kTile);
                tma_load_3d_multicast(smem + s * kTile + rank * kPart * 128, tiles, 0,
                                      rank * kPart, cluster_id * rounds + i, full + s,
                                      (unsigned short)((1u << N) - 1));
            }
        }
        __syncwarp();
    } else {
        for (int i = 0; i < rounds; ++i) {
            const int s = i % kStages;
            mbar_wait(full + s, (i / kStages) & 1);
            const float* tile = reinterpret_cast<const float*>(smem + s * kTile);
            float* dst = out + ((long long)blockIdx.x * rounds + i) * kRows * 32;
            for (int e = t - 32; e < kRows * 32; e += 32 * kConsumerWarps) dst[e] = tile[e];
            __syncwarp();
            if (lane == 0) {
                for (int r = 0; r < N; ++r) {
                    if (r == int(rank)) mbar_arrive(empty + s);
                    else mbar_arrive_cluster(empty + s, r);
                }
            }
            __syncwarp();
        }
    }
    cluster_sync();
}

extern "C" __global__ void __launch_bounds__(96) EMMY_CLUSTER_DIMS(1, 1, 1)
ring1(float* out, const float*, const EmmyTensorMap* tiles, int rounds) {
    ring<1>(out, tiles, rounds);
}
extern "C" __global__ void __launch_bounds__(96) EMMY_CLUSTER_DIMS(2, 1, 1)
ring2(float* out, const float*, const EmmyTensorMap* tiles, int rounds) {
    ring<2>(out, tiles, rounds);
}
extern "C" __global__ void __launch_bounds__(96) EMMY_CLUSTER_DIMS(4, 1, 1)
ring4(float* out, const float*, const EmmyTensorMap* tiles, int rounds) {
    ring<4>(out, tiles, rounds);
}

// A multicast with the given mask (the tensor map is over the second argument).
extern "C" __global__ void multicast_mask(float* sink, const float*, const EmmyTensorMap* rows,
                                           int mask) {
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 128);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
    }
    cluster_sync();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 128);
        tma_load_3d_multicast(smem, rows, 0, 0, 0, bar, (unsigned short)mask);
    }
    mbar_wait(bar, 0);
    sink[threadIdx.x] = reinterpret_cast<const float*>(smem)[threadIdx.x];
    cluster_sync();
}

// Rank 0's threads wait for one arrival from rank 1, which first works through `rounds` steps
// of its own (an mbarrier phase and a __syncthreads each): a long wait for another block that
// can still move on, not a deadlock. done[block id] = 1 once through.
extern "C" __global__ void slow_peer(int* done, int rounds) {
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
    uint64_t* tick = bar + 1;
    const unsigned rank = cluster_ctarank();
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init(tick, 1);
        mbar_init_fence();
    }
    cluster_sync();
    if (rank == 0) {
        mbar_wait(bar, 0);
    } else {
        for (int i = 0; i < rounds; ++i) {
            if (threadIdx.x == 0) mbar_arrive(tick);
            mbar_wait(tick, i & 1);
            __syncthreads();
        }
        if (threadIdx.x == 0) mbar_arrive_cluster(bar, 0);
    }
    if (threadIdx.x == 0) done[blockIdx.x] = 1;
    cluster_sync();
}

// Deadlocks across a cluster of two. mode 0: each block waits for the other's arrival before
// giving its own. mode 1: rank 0 waits at the cluster barrier, rank 1 for an arrival that
// nobody gives.
extern "C" __global__ void cross_deadlock(int* done, int mode) {
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
    const unsigned rank = cluster_ctarank();
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
    }
    cluster_sync();
    if (mode == 1 && rank == 0) {
        cluster_sync();
    } else {
        mbar_wait(bar, 0);
        if (threadIdx.x == 0) mbar_arrive_cluster(bar, rank ^ 1u);
    }
    done[blockIdx.x] = 1;
}
"""

SLOT = 32  # floats per exchanged row


def rows_map(rows: int, array: int = 2) -> TensorMapArg:
    """A rank-3 tensor map over argument `array`, float32 [rows][32], one row a box (128
    bytes)."""
    return TensorMapArg(array, 4, (SLOT, rows, 1), (4 * SLOT, 4 * SLOT * rows), (SLOT, 1, 1),
                        swizzle=0)


def run(kernel, grid, block, smem, args, cluster, **kw):
    r = build_and_run(SOURCE, kernel, grid, block, smem, args, cluster=cluster, **kw)
    assert r.ok, f"{r.status}: {r.log}"
    return r


def cluster_members(grid, cluster):
    """By block id (x fastest): (rank, blockIdx, the block ids of its cluster by rank)."""
    g, c = _dims(grid), _dims(cluster)
    out = {}
    for z in range(g[2]):
        for y in range(g[1]):
            for x in range(g[0]):
                rank = x % c[0] + c[0] * (y % c[1] + c[1] * (z % c[2]))
                base = (x - x % c[0], y - y % c[1], z - z % c[2])
                members = [(base[0] + r % c[0]) + g[0] * ((base[1] + r // c[0] % c[1])
                                                          + g[1] * (base[2] + r // (c[0] * c[1])))
                           for r in range(c[0] * c[1] * c[2])]
                out[x + g[0] * (y + g[1] * z)] = (rank, (x, y, z), members)
    return out


# --- (a) ranks, own shared memory, multicast and remote arrivals ---------------------------------

@pytest.mark.parametrize("grid, cluster", [
    (4, 2),                    # two clusters of two
    (8, 4),                    # two clusters of four
    ((4, 2, 1), (2, 2, 1)),    # clusters of 2 x 2: rank is x fastest
    (3, 1),                    # clusters of one block: every block on its own
], ids=["2", "4", "2x2", "1"])
def test_blocks_of_a_cluster_exchange_rows(grid, cluster):
    g, c = _dims(grid), _dims(cluster)
    blocks, size = g[0] * g[1] * g[2], c[0] * c[1] * c[2]
    rows = rng.standard_normal((blocks, SLOT)).astype(np.float32)
    info = np.zeros((blocks, 4), np.uint32)
    got = np.full((blocks, size, SLOT), np.nan, np.float32)
    run("exchange", grid, 32, 1056, [info, got, rows, rows_map(blocks), size], cluster)
    for block, (rank, index, members) in cluster_members(grid, cluster).items():
        assert tuple(info[block]) == (rank, *index), block
        np.testing.assert_array_equal(got[block], rows[members])


def test_a_tensor_map_may_start_inside_its_array():
    """A map's tensor starts `offset_bytes` into its array (k of a packed q|k|v projection):
    block b's row b is the array's row b + 1; an address not 16-byte aligned is refused, as
    cuTensorMapEncodeTiled refuses it."""
    from dataclasses import replace

    rows = rng.standard_normal((4, SLOT)).astype(np.float32)
    info = np.zeros((3, 4), np.uint32)
    got = np.full((3, 1, SLOT), np.nan, np.float32)
    shifted = replace(rows_map(3), offset_bytes=4 * SLOT)
    run("exchange", 3, 32, 1056, [info, got, rows, shifted, 1], 1)
    np.testing.assert_array_equal(got[:, 0], rows[1:])
    r = build_and_run(SOURCE, "exchange", 3, 32, 1056,
                      [info, got, rows, replace(rows_map(3), offset_bytes=4), 1], cluster=1)
    assert not r.ok and "16-byte aligned" in r.log


# --- (b) a producer / consumer ring across the cluster ------------------------------------------

ROUNDS = 9   # two stages: each stage's barriers go through several phases


@pytest.mark.parametrize("n", [2, 4, 1])
def test_multicast_ring_matches_numpy(n):
    clusters = 2
    tiles = rng.standard_normal((clusters * ROUNDS, 8, SLOT)).astype(np.float32)
    tmap = TensorMapArg(1, 4, (SLOT, 8, clusters * ROUNDS), (4 * SLOT, 4 * SLOT * 8),
                        (SLOT, 8 // n, 1), swizzle=0)
    out = np.full((clusters * n, ROUNDS, 8, SLOT), np.nan, np.float32)
    run(f"ring{n}", clusters * n, 96, 2 * 1024 + 32, [out, tiles, tmap, ROUNDS], n)
    expected = tiles.reshape(clusters, ROUNDS, 8, SLOT)
    np.testing.assert_array_equal(out, np.repeat(expected, n, axis=0))


def test_a_long_wait_for_another_block_is_not_a_deadlock():
    """Rank 0 waits through ~100 scheduler rounds in which only rank 1 moves on: the stall count
    is the cluster's (counted per block, rank 0 would be reported deadlocked)."""
    done = np.zeros(4, np.int32)
    run("slow_peer", 4, 32, 64, [done, 100], 2)
    assert done.tolist() == [1, 1, 1, 1]


# --- (c) what the hardware refuses, and deadlocks ----------------------------------------------

def emulate_error(kernel, grid, block, smem, args, cluster):
    """The emulator's message when it refuses the launch (status "error": exit status 3)."""
    r = build_and_run(SOURCE, kernel, grid, block, smem, args, cluster=cluster)
    assert r.status == "error", f"{r.status}: {r.log}"
    return r.log


def test_grid_must_be_a_multiple_of_the_cluster():
    rows = np.zeros((3, SLOT), np.float32)
    log = emulate_error("exchange", 3, 32, 1056,
                        [np.zeros((3, 4), np.uint32), np.zeros((3, 2, SLOT), np.float32), rows,
                         rows_map(3), 2], 2)
    assert "grid (3,1,1) is not a multiple of the cluster dims (2,1,1)" in log


@pytest.mark.parametrize("cluster", [16, (3, 3, 1), (2, 0, 1)])
def test_cluster_size_is_1_to_8_blocks(cluster):
    log = emulate_error("slow_peer", (48, 3, 1), 32, 64, [np.zeros(144, np.int32), 1], cluster)
    assert "invalid cluster dims" in log and "1 to 8 blocks per cluster" in log


@pytest.mark.parametrize("mask, message", [
    (0b100, "the mask 0x4 names a block outside the cluster (the cluster has 2 blocks"),
    (0, "the mask 0 names no block"),
])
def test_multicast_mask_must_name_blocks_of_the_cluster(mask, message):
    rows = np.zeros((1, SLOT), np.float32)
    log = emulate_error("multicast_mask", 2, 32, 136,
                        [np.zeros(32, np.float32), rows, rows_map(1, 1), mask], 2)
    assert "tma multicast in block (0,0,0)" in log and message in log


def test_a_cycle_of_waits_across_blocks_is_a_deadlock():
    log = emulate_error("cross_deadlock", 2, 32, 64, [np.zeros(2, np.int32), 0], 2)
    assert "deadlock in cluster (0,0,0) of 2 blocks" in log
    assert "block (1,0,0) rank 1: 0 threads wait at the cluster barrier" in log
    assert "32 elsewhere (an mbarrier)" in log


def test_a_cluster_barrier_nobody_else_reaches_is_a_deadlock():
    log = emulate_error("cross_deadlock", 2, 32, 64, [np.zeros(2, np.int32), 1], 2)
    assert "deadlock in cluster (0,0,0) of 2 blocks" in log
    assert "block (0,0,0) rank 0: 32 threads wait at the cluster barrier" in log


# --- (d) clusters of one block: as before ------------------------------------------------------

def test_cluster_of_one_changes_nothing_for_plain_kernels():
    x = rng.standard_normal((6, 1000)).astype(np.float32)
    results = []
    for cluster in (None, 1, (1, 1, 1)):
        out = np.full(6, np.nan, np.float32)
        kw = {} if cluster is None else {"cluster": cluster}
        r = build_and_run(BASICS, "row_sum", 6, 256, 0, [out, x, 1000], **kw)
        assert r.ok, r.log
        results.append(out)
    np.testing.assert_allclose(results[0], x.sum(axis=1), rtol=1e-5, atol=1e-4)
    assert all(np.array_equal(results[0], o) for o in results)
    r = build_and_run(BASICS, "divergent_barrier", 1, 32, 0, [np.zeros(32, np.float32)],
                      cluster=1)
    assert r.status == "error" and "deadlock in block (0,0,0)" in r.log


def test_old_argument_files_still_run():
    """An "EMMYARG1" file (no cluster dims) launches clusters of one block."""
    binary = build(BASICS, "row_sum").binary
    x = rng.standard_normal((3, 100)).astype(np.float32)
    out = np.full(3, np.nan, np.float32)
    data = b"".join([b"EMMYARG1", struct.pack("<6IQI", 3, 1, 1, 64, 1, 1, 0, 3),
                     struct.pack("<IQ", 0, out.nbytes), out.tobytes(),
                     struct.pack("<IQ", 0, x.nbytes), x.tobytes(), struct.pack("<Iq", 1, 100)])
    with tempfile.TemporaryDirectory() as tmp:
        args, result = Path(tmp) / "args.bin", Path(tmp) / "out.bin"
        args.write_bytes(data)
        proc = subprocess.run([str(binary), str(args), str(result), "row_sum"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        decode_outputs(result.read_bytes(), [out, x])
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5, atol=1e-4)


def test_declared_clusters_are_the_launch_clusters():
    """As on a GPU, a kernel declared with EMMY_CLUSTER_DIMS runs in those clusters whatever the
    launch says (1 by default); a launch asking for other clusters is refused."""
    assert declared_cluster(SOURCE, "ring2") == (2, 1, 1)
    assert declared_cluster(SOURCE, "exchange") is None
    tiles = rng.standard_normal((2 * ROUNDS, 8, SLOT)).astype(np.float32)
    tmap = TensorMapArg(1, 4, (SLOT, 8, 2 * ROUNDS), (4 * SLOT, 4 * SLOT * 8), (SLOT, 4, 1),
                        swizzle=0)
    out = np.full((4, ROUNDS, 8, SLOT), np.nan, np.float32)
    run("ring2", 4, 96, 2 * 1024 + 32, [out, tiles, tmap, ROUNDS], 1)
    np.testing.assert_array_equal(out, np.repeat(tiles.reshape(2, ROUNDS, 8, SLOT), 2, axis=0))
    r = build_and_run(SOURCE, "ring2", 4, 96, 2 * 1024 + 32, [out, tiles, tmap, ROUNDS],
                      cluster=4)
    assert r.status == "error" and "declared with clusters of (2, 1, 1)" in r.log, r.log


def test_cluster_kernels_are_entry_points():
    assert {"ring1", "ring2", "ring4", "exchange", "cross_deadlock"} <= set(
        entry_points(SOURCE, "exchange"))


# --- (e) the device versions: PTX through NVRTC and ptxas, SASS -----------------------------------

def compiled(ptx=False):
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-bindings) not installed")
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.schedule.targets import get_target

    r = compile_cuda(SOURCE, get_target("sm_90a"), ptx=ptx)
    assert r.ok, r.log
    return r


def test_device_versions_compile_for_sm90a():
    r = compiled(ptx=True)
    for text in ("mov.u32 %r", "%cluster_ctarank", "barrier.cluster.arrive.release.aligned",
                 "barrier.cluster.wait.acquire.aligned", "mapa.shared::cluster.u32",
                 "mbarrier.arrive.shared::cluster.b64",
                 ".multicast::cluster", ".explicitcluster", ".reqnctapercluster 2, 1, 1"):
        assert text in r.ptx, text
    for kernel in ("ring2", "exchange"):
        res = r.resources_of(kernel)
        assert res.spill_store_bytes == 0 and res.stack_bytes == 0, (kernel, res)


def test_sass_has_the_cluster_instructions():
    from emmy.cuda.sass import cuobjdump, disassemble

    if cuobjdump() is None:
        pytest.skip("cuobjdump (and nvdisasm) not installed")
    sass = disassemble(compiled().cubin)
    for op in ("UTMALDG.3D.MULTICAST", "UCGABAR_ARV", "UCGABAR_WAIT", "S2UR", "SR_CgaCtaId",
               "SYNCS.ARRIVE.TRANS64.RED.A1T0"):
        assert op in sass, op
