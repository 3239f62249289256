// emmy_sm90.cuh: Hopper (sm_90a) matrix-product intrinsics: wgmma.mma_async with both operands in
// shared memory, its 64-bit shared-memory matrix descriptors, the proxy fence that makes
// ordinary shared-memory writes visible to it, and TMA copies completing on mbarriers. Sources
// that use them include this header after emmy_kernel.cuh (or emmy_intrinsics.cuh).
//
// As in emmy_intrinsics.cuh, each instruction has a device version (inline PTX, NVRTC/nvcc) and
// a CPU version (cuda_emulate.h, EMMY_EMULATE) that follows the PTX ISA: the emulated wgmma is
// collective over the warpgroup (4 consecutive warps, 128 threads, which must all issue the same
// instruction with the same descriptors), finds each A and B element in shared memory through
// the descriptor exactly as the hardware does (core matrices, leading / stride byte offsets,
// the 32/64/128-byte swizzles), and writes each thread's accumulators in the documented D
// fragment layout. It runs at the wgmma.wait_group that covers it, so reading accumulators
// before the wait, or overwriting operands the wgmma still reads, gives wrong results there too.
//
//   addresses    sm90_smem_addr(p): p's shared-window address (the emulator: offset in the
//                block's dynamic shared memory, where descriptor operands must lie)
//   descriptors  wgmma_desc(addr, lbo, sbo, swizzle), WGMMA_SWIZZLE_{NONE,128B,64B,32B}
//   wgmma        wgmma_m64k16<N, BF16, TransA, TransB>(d, desc_a, desc_b, scale_d),
//                N in {64, 128, 256}; f16 or bf16 inputs, f32 accumulators
//   ordering     wgmma_fence, wgmma_commit, wgmma_wait<N>, wgmma_fence_acc(d),
//                fence_proxy_async_shared
//   TMA          EmmyTensorMap, tma_map_acquire, tma_load_3d; mbarriers: mbar_init, mbar_init_fence,
//                mbar_arrive, mbar_arrive_expect_tx, mbar_wait
//   TMA stores   tma_store_3d, tma_store_fence, tma_store_commit, tma_store_wait_read<N>,
//                tma_store_wait<N>; warpgroup_bar(g) (a named barrier over warpgroup g)
//   registers    setmaxnreg_dec<R>(), setmaxnreg_inc<R>()
//   wgmma, A in registers: wgmma_m64k16_rs<N, BF16, TransB>(d, a[4], desc_b, scale_d),
//                wgmma_fence_a(a)
//   clusters     EMMY_CLUSTER_DIMS(x, y, z), cluster_ctarank, cluster_sync[_after_init],
//                mbar_arrive_cluster(bar, cta), tma_load_3d_multicast(..., bar, cta_mask)
#pragma once
#include "emmy_intrinsics.cuh"

// ---------------------------------------------------------------------------------------------
// Shared-memory addresses. The descriptor holds bits 4..17 of a shared-window address.
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
EMMY_FN unsigned sm90_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#else
inline unsigned sm90_smem_addr(const void* p) {
    const auto* c = static_cast<const unsigned char*>(p);
    const unsigned char* base = emmy_emu::dynamic_shared();
    if (c < base || c > base + emmy_emu::dynamic_shared_bytes())
        emmy_emu::fail("sm90_smem_addr: %p is not in the block's dynamic shared memory (the "
                       "emulator gives addresses to dynamic shared memory only)", p);
    return static_cast<unsigned>(c - base);
}
#endif

// ---------------------------------------------------------------------------------------------
// The shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"), 64 bits:
//   bits  0..13  start address >> 4       bits 16..29  leading dimension byte offset >> 4
//   bits 32..45  stride dimension byte offset >> 4
//   bits 49..51  base offset (0: every swizzle pattern starts at its own boundary, 1024 bytes
//                for 128B; the only value emmy uses and the emulator accepts)
//   bits 62..63  swizzle: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
// How an element is found, for 16-bit elements (mn: row of A or column of B; k in 0..15),
// W = the swizzle width in bytes:
//   K-major,  no swizzle: start + (mn/8)*SBO + (k/8)*LBO + (mn%8)*16 + (k%8)*2
//   K-major,  W swizzle:  start + (mn/8)*SBO + (mn%8)*W + k*2                   (LBO unused)
//   MN-major, no swizzle: start + (mn/8)*SBO + (k/8)*LBO + (k%8)*16 + (mn%8)*2
//   MN-major, W swizzle:  start + (2mn/W)*LBO + (k/8)*SBO + (k%8)*W + (2mn)%W
// and a W swizzle then XORs address bits 4.. (the 16-byte chunk) with bits 7.. (the row in
// the 8-row pattern): 1, 2 or 3 bits for W = 32, 64, 128. The pattern follows the absolute
// address, so moving `start` by 32 bytes steps K by 16 inside a 128-byte swizzled row.
// ---------------------------------------------------------------------------------------------
enum : int { WGMMA_SWIZZLE_NONE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2,
             WGMMA_SWIZZLE_32B = 3 };

EMMY_FN uint64_t wgmma_desc(unsigned smem_addr, unsigned lbo_bytes, unsigned sbo_bytes,
                            int swizzle) {
    return uint64_t((smem_addr & 0x3FFFFu) >> 4) | uint64_t((lbo_bytes & 0x3FFFFu) >> 4) << 16 |
           uint64_t((sbo_bytes & 0x3FFFFu) >> 4) << 32 | uint64_t(swizzle & 3) << 62;
}

// ---------------------------------------------------------------------------------------------
// fence.proxy.async.shared::cta: shared memory written by ordinary stores or cp.async (the
// generic proxy) is read by wgmma through the async proxy; each writing thread fences after
// its writes land and before the barrier that hands them to the warpgroup.
// wgmma.fence: before the first wgmma.mma_async, and between other accesses to accumulator
// registers and a wgmma that uses them. commit_group closes the group of wgmmas issued since
// the last commit; wait_group N returns once at most N committed groups are still running.
// wgmma_fence_acc: an empty asm per accumulator register, so the compiler keeps its accesses
// on their side of the wgmma instructions (it cannot see that they write the registers late).
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
EMMY_FN void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
EMMY_FN void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
EMMY_FN void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> EMMY_FN void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
template <int R> EMMY_FN void wgmma_fence_acc(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
#else
namespace emmy_emu {
// What each thread of a warpgroup brings to a wgmma instruction; all 128 must agree.
struct WgmmaCall {
    uint64_t desc_a = 0, desc_b = 0;
    unsigned what = 0;  // the instruction (and its shape, types, layouts)
    int value = 0;      // scale-d, or wait_group's N
};

inline void wgmma_collective(const char* name, const WgmmaCall& mine) {
    if (warpgroup().live != kWarpGroup)
        fail("%s: only %u of the warpgroup's 128 threads are running; wgmma instructions "
             "need all", name, warpgroup().live);
    const WgmmaCall* all = warpgroup_exchange(mine);
    for (unsigned t = 0; t < kWarpGroup; ++t)
        if (std::memcmp(&all[t], &mine, sizeof mine) != 0)
            fail("%s: threads %u and %u of one warpgroup (block (%u,%u,%u)) reach different "
                 "wgmma instructions or operands at once (.aligned needs all 128 alike)",
                 name, t, warpgroup_rank(), blockIdx.x, blockIdx.y, blockIdx.z);
}

inline void wgmma_wait(int newest_pending) {
    wgmma_collective("wgmma.wait_group", WgmmaCall{0, 0, 3, newest_pending});
    Fiber& f = *block().current;
    wait_groups(f.async_mmas, f.mma_groups, newest_pending, [](const AsyncMma& op) { op.run(op); });
}
}  // namespace emmy_emu

inline void fence_proxy_async_shared() {}
inline void wgmma_fence() {
    emmy_emu::wgmma_collective("wgmma.fence", emmy_emu::WgmmaCall{0, 0, 1, 0});
    emmy_emu::block().current->mma_fenced = true;
}
inline void wgmma_commit() {
    emmy_emu::wgmma_collective("wgmma.commit_group", emmy_emu::WgmmaCall{0, 0, 2, 0});
    emmy_emu::block().current->mma_groups++;
}
template <int N> inline void wgmma_wait() { emmy_emu::wgmma_wait(N); }
template <int R> inline void wgmma_fence_acc(float (&)[R]) {}
#endif

// ---------------------------------------------------------------------------------------------
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}: D(64xN) = A(64x16) B(16xN)
// (+ D when scale_d != 0), A and B in shared memory through descriptors; TransA / TransB: 0
// K-major, 1 MN-major (M-contiguous A, N-contiguous B). Thread t of the warpgroup (warp w =
// t/32, g = lane/4, q = lane%4) holds N/2 accumulators; d[4i + 2h + c] is
//   D[16w + g + 8h][8i + 2q + c]        (i < N/8, h and c in {0, 1})
// ---------------------------------------------------------------------------------------------
#if !defined(__CUDACC__)
namespace emmy_emu {
// The byte offset in shared memory of operand element (mn, k), per the table above.
inline unsigned wgmma_element_offset(uint64_t desc, bool mn_major, unsigned mn, unsigned k) {
    const unsigned start = unsigned(desc & 0x3FFF) << 4;
    const unsigned lbo = unsigned(desc >> 16 & 0x3FFF) << 4;
    const unsigned sbo = unsigned(desc >> 32 & 0x3FFF) << 4;
    const unsigned mode = unsigned(desc >> 62);
    if (desc >> 49 & 7) fail("wgmma: a descriptor with a non-zero base offset is not emulated");
    const unsigned width = mode == 0 ? 0 : 256u >> mode;  // swizzle width W in bytes
    unsigned addr;
    if (width == 0 && !mn_major)
        addr = start + mn / 8 * sbo + k / 8 * lbo + mn % 8 * 16 + k % 8 * 2;
    else if (width == 0)
        addr = start + mn / 8 * sbo + k / 8 * lbo + k % 8 * 16 + mn % 8 * 2;
    else if (!mn_major)
        addr = start + mn / 8 * sbo + mn % 8 * width + k * 2;
    else
        addr = start + 2 * mn / width * lbo + k / 8 * sbo + k % 8 * width + 2 * mn % width;
    if (width) addr ^= (addr >> 7 & (width / 16 - 1)) << 4;
    if (addr + 2 > dynamic_shared_bytes())
        fail("wgmma reads shared memory at byte %u, past the block's %zu bytes of dynamic "
             "shared memory", addr, dynamic_shared_bytes());
    return addr;
}

// This thread's part of one wgmma: its two rows of A, its N/4 columns of B, products summed
// in double and rounded once.
template <int N, float (*ToFloat)(uint16_t), int TransA, int TransB>
inline void wgmma_run(const AsyncMma& op) {
    const unsigned t = warpgroup_rank(), g = t % 32 / 4, q = t % 4;
    const unsigned char* smem = dynamic_shared();
    auto element = [&](uint64_t desc, bool mn_major, unsigned mn, unsigned k) {
        uint16_t bits;
        std::memcpy(&bits, smem + wgmma_element_offset(desc, mn_major, mn, k), 2);
        return double(ToFloat(bits));
    };
    double a[2][16];
    for (unsigned h = 0; h < 2; ++h)
        for (unsigned k = 0; k < 16; ++k)
            a[h][k] = element(op.desc_a, TransA, 16 * (t / 32) + g + 8 * h, k);
    for (unsigned i = 0; i < unsigned(N) / 8; ++i)
        for (unsigned c = 0; c < 2; ++c) {
            double b[16];
            for (unsigned k = 0; k < 16; ++k) b[k] = element(op.desc_b, TransB, 8 * i + 2 * q + c, k);
            for (unsigned h = 0; h < 2; ++h) {
                float& d = op.acc[4 * i + 2 * h + c];
                double sum = op.scale_d ? double(d) : 0.0;
                for (unsigned k = 0; k < 16; ++k) sum += a[h][k] * b[k];
                d = float(sum);
            }
        }
}
}  // namespace emmy_emu
#else
// The accumulators as "+f" operands, 8 at a time.
#define EMMY_F8(i)                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define EMMY_F32(i) EMMY_F8(i), EMMY_F8(i + 8), EMMY_F8(i + 16), EMMY_F8(i + 24)
#define EMMY_WGMMA_D64 EMMY_F32(0)
#define EMMY_WGMMA_D128 EMMY_F32(0), EMMY_F32(32)
#define EMMY_WGMMA_D256 EMMY_F32(0), EMMY_F32(32), EMMY_F32(64), EMMY_F32(96)
#define EMMY_WGMMA_IN "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
// Operands: N/2 accumulators, desc-a, desc-b, scale-d (to a predicate), trans-a, trans-b;
// imm-scale-a = imm-scale-b = 1 (no negation).
#define EMMY_WGMMA_PRED64 "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
#define EMMY_WGMMA_REGS64 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
    "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
    "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
#define EMMY_WGMMA_PRED128 "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
#define EMMY_WGMMA_REGS128 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
    "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, " \
    "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
    "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
#define EMMY_WGMMA_PRED256 "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
#define EMMY_WGMMA_REGS256 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
    "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, " \
    "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
    "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, " \
    "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
    "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
    "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, " \
    "%124, %125, %126, %127" \
    "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
#define EMMY_WGMMA(N, T)                                                                     \
    asm volatile(EMMY_WGMMA_PRED##N "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T "." #T \
                 " " EMMY_WGMMA_REGS##N : EMMY_WGMMA_D##N : EMMY_WGMMA_IN)
#endif

template <int N, bool BF16, int TransA, int TransB>
EMMY_FN void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_m64k16: N is 64, 128 or 256");
    static_assert((TransA == 0 || TransA == 1) && (TransB == 0 || TransB == 1),
                  "wgmma_m64k16: TransA / TransB are 0 (K-major) or 1 (MN-major)");
#if defined(__CUDACC__)
    if constexpr (N == 64 && !BF16) EMMY_WGMMA(64, f16);
    if constexpr (N == 64 && BF16) EMMY_WGMMA(64, bf16);
    if constexpr (N == 128 && !BF16) EMMY_WGMMA(128, f16);
    if constexpr (N == 128 && BF16) EMMY_WGMMA(128, bf16);
    if constexpr (N == 256 && !BF16) EMMY_WGMMA(256, f16);
    if constexpr (N == 256 && BF16) EMMY_WGMMA(256, bf16);
#else
    using namespace emmy_emu;
    const unsigned what = 0x1000u | unsigned(N) | unsigned(BF16) << 9 | unsigned(TransA) << 10 |
                          unsigned(TransB) << 11;
    wgmma_collective("wgmma.mma_async", WgmmaCall{desc_a, desc_b, what, scale_d != 0});
    Fiber& f = *block().current;
    if (!f.mma_fenced) fail("wgmma.mma_async before any wgmma.fence");
    constexpr auto to_float = BF16 ? bf16_bits_to_f32 : f16_bits_to_f32;
    f.async_mmas.push_back(AsyncMma{&wgmma_run<N, to_float, TransA, TransB>, d, desc_a, desc_b,
                                    scale_d != 0, f.mma_groups});
#endif
}

// ---------------------------------------------------------------------------------------------
// mbarrier (a 64-bit object in shared memory) and TMA (cp.async.bulk.tensor, the copy engine).
// A phase of an mbarrier completes when its expected arrivals have all arrived and the bytes
// announced with arrive.expect_tx have all landed (complete_tx); then the next phase starts
// with the same expected count. try_wait.parity(P) succeeds once the phase of parity P is over:
// on a fresh barrier (phase 0 running) parity 1 passes at once, parity 0 waits.
//   mbar_init(bar, count)            by one thread, then mbar_init_fence() and a block barrier
//   mbar_arrive(bar) / mbar_arrive_expect_tx(bar, bytes) / mbar_wait(bar, parity)
//   tma_load_3d(dst, map, c0, c1, c2, bar): the box of `map` at element coordinates (c0
//   innermost, c1, c2) into shared memory at dst (128-byte aligned; 1024 for the 128-byte
//   swizzle, which places the box exactly as the wgmma layouts above expect), zeros outside
//   the tensor, then complete_tx(box bytes) on bar. The tensor map lives in global memory,
//   written before the launch (cuTensorMapEncodeTiled on a GPU, emu_harness.h here).
//   tma_map_acquire(map): before a thread's first copy through `map`. The copy engine reads
//   the map through the tensormap proxy, which a kernel's start does not order after the
//   host's (generic-proxy) write of it (PTX ISA, memory consistency model: "the tensormap-proxy
//   ... must be acquired explicitly"), so a map rewritten at a reused address could be seen
//   stale: fence.proxy.tensormap::generic.acquire.gpu over its 128 bytes, then
//   prefetch.tensormap. CPU: checks that `map` is one.
// CPU: the mbarrier's state is packed into its 8 bytes (pending arrivals, expected arrivals,
// pending bytes, phase parity); a TMA copy lands when it is issued.
// ---------------------------------------------------------------------------------------------
struct alignas(64) EmmyTensorMap {
    unsigned char opaque[128];
};

#if defined(__CUDACC__)
EMMY_FN void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n"
                 :: "r"(sm90_smem_addr(bar)), "r"(count) : "memory");
}
EMMY_FN void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
EMMY_FN void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
                 :: "r"(sm90_smem_addr(bar)) : "memory");
}
EMMY_FN void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(sm90_smem_addr(bar)), "r"(bytes) : "memory");
}
// A wait that has not succeeded after EMMY_MBAR_TIMEOUT_NS (default 4 s: no phase of these
// kernels takes a thousandth of that) traps, so that a barrier that never completes fails the
// launch (the driver reports an illegal instruction) instead of hanging the device.
#ifndef EMMY_MBAR_TIMEOUT_NS
#define EMMY_MBAR_TIMEOUT_NS 4000000000ull
#endif
EMMY_FN uint64_t emmy_globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
// The slow path of a long wait, out of line: the wait's start (0: not yet taken), trapping past
// the timeout. Inline, its __trap() made ptxas allocate a warp-specialized kernel's consumers
// within the entry register count despite setmaxnreg (spills, and C7512: every wgmma
// serialized for want of registers); a call on the slow path leaves the fast path alone.
__device__ __noinline__ uint64_t emmy_mbar_slow_wait(uint64_t start) {
    const uint64_t now = emmy_globaltimer_ns();
    if (start == 0) return now;
    if (now - start > EMMY_MBAR_TIMEOUT_NS) __trap();
    return start;
}
EMMY_FN void mbar_wait(uint64_t* bar, unsigned parity) {
    const unsigned addr = sm90_smem_addr(bar);
    uint64_t start = 0;
    for (unsigned tries = 1;; ++tries) {
        unsigned done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(addr), "r"(parity) : "memory");
        if (done) return;
        if (tries % 4096 == 0) start = emmy_mbar_slow_wait(start);   // a long wait
    }
}
EMMY_FN void tma_map_acquire(const EmmyTensorMap* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n"
                 "prefetch.tensormap [%0];\n" :: "l"(map) : "memory");
}
EMMY_FN void tma_load_3d(void* dst, const EmmyTensorMap* map, int c0, int c1, int c2,
                         uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(sm90_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2),
                    "r"(sm90_smem_addr(bar)) : "memory");
}
#else
namespace emmy_emu {
// bits 0..20 pending arrivals, 21..41 expected arrivals, 42..62 pending bytes (signed), 63 the
// running phase's parity.
struct MbarState {
    unsigned pending, expected;
    long long bytes;
    unsigned parity;
};

// The state of the mbarrier at `bar`, which may lie in any block of the cluster.
inline MbarState mbar_read(const uint64_t* bar) {
    const uint64_t v = *bar;
    long long bytes = (long long)(v >> 42 & 0x1FFFFF);
    if (bytes >= (1 << 20)) bytes -= 1 << 21;
    return MbarState{unsigned(v & 0x1FFFFF), unsigned(v >> 21 & 0x1FFFFF), bytes, unsigned(v >> 63)};
}

// The state of the mbarrier at `bar`, which must lie in the block's own shared memory.
inline MbarState mbar_load(const uint64_t* bar) {
    sm90_smem_addr(bar);  // fails unless the barrier is in dynamic shared memory
    return mbar_read(bar);
}

// Stores the state, first completing the phase when nothing is pending.
inline void mbar_store(uint64_t* bar, MbarState s) {
    if (s.pending == 0 && s.bytes == 0) {
        s.pending = s.expected;
        s.parity ^= 1u;
    }
    if (s.bytes >= (1 << 20) || s.bytes < -(1 << 20))
        fail("mbarrier: %lld bytes pending, more than the emulator's 20 bits", s.bytes);
    *bar = uint64_t(s.pending) | uint64_t(s.expected) << 21 |
           uint64_t(s.bytes & 0x1FFFFF) << 42 | uint64_t(s.parity) << 63;
    progress();  // a waiting thread of the cluster may now pass
}

// An arrival, announcing `bytes` more, on the mbarrier at `bar` (in any block of the cluster).
inline void mbar_arrive_on(uint64_t* bar, long long bytes) {
    MbarState s = mbar_read(bar);
    if (s.pending == 0) fail("mbarrier: more arrivals than its count %u in one phase", s.expected);
    s.pending--;
    s.bytes += bytes;
    mbar_store(bar, s);
}

inline void mbar_arrive(uint64_t* bar, long long bytes) {
    sm90_smem_addr(bar);  // fails unless the barrier is in dynamic shared memory
    mbar_arrive_on(bar, bytes);
}

// Visits each element of the box of `map` at `coord` whose bytes lie at byte `offset` of a
// block's dynamic shared memory: visit(its swizzled shared-memory offset, its address in global
// memory or nullptr outside the tensor).
template <class Visit>
inline void tma_box_walk(unsigned offset, const TensorMap* map, const int* coord, const char* what,
                         Visit visit) {
    if (offset % 128) fail("%s: the shared-memory box must be 128-byte aligned", what);
    size_t total = map->elem_bytes;
    for (unsigned d = 0; d < map->rank; ++d) total *= map->box[d];
    if (offset + total > dynamic_shared_bytes())
        fail("%s: a %zu-byte box at %u overruns dynamic shared memory", what, total, offset);
    const unsigned width = map->swizzle ? 256u >> map->swizzle : 0;
    unsigned index[4] = {0, 0, 0, 0};
    for (size_t e = 0, at = 0; e < total / map->elem_bytes; ++e, at += map->elem_bytes) {
        size_t rest = e;
        bool inside = true;
        const unsigned char* global = map->base;
        for (unsigned d = 0; d < map->rank; ++d) {
            index[d] = unsigned(rest % map->box[d]);
            rest /= map->box[d];
            const long long c = (long long)coord[d] + index[d];
            inside = inside && c >= 0 && (unsigned long long)c < map->dims[d];
            global += c * (long long)map->strides[d];
        }
        unsigned addr = unsigned(offset + at);
        if (width) addr ^= (addr >> 7 & (width / 16 - 1)) << 4;
        visit(addr, inside ? global : nullptr);
    }
}

// One TMA copy into the dynamic shared memory `smem` of some block of the cluster: the box of
// `map` at `coord` lands at byte `offset`, then complete_tx(box bytes) on the mbarrier at `bar`
// (in the same block's shared memory).
inline void tma_copy(unsigned char* smem, unsigned offset, const TensorMap* map, const int* coord,
                     uint64_t* bar) {
    const size_t bytes = map->elem_bytes;
    long long total = 0;
    tma_box_walk(offset, map, coord, "tma", [&](unsigned addr, const unsigned char* src) {
        if (src) std::memcpy(smem + addr, src, bytes);
        else std::memset(smem + addr, 0, bytes);
        total += (long long)bytes;
    });
    MbarState s = mbar_read(bar);
    s.bytes -= total;
    mbar_store(bar, s);
}

inline void tma_load(unsigned char* dst, const TensorMap* map, const int* coord, uint64_t* bar) {
    if (map->magic != TensorMap::kMagic) fail("tma: %p is not a tensor map", (const void*)map);
    const unsigned offset = sm90_smem_addr(dst);
    sm90_smem_addr(bar);  // fails unless the barrier is in dynamic shared memory
    tma_copy(dynamic_shared(), offset, map, coord, bar);
}
}  // namespace emmy_emu

inline void mbar_init(uint64_t* bar, unsigned count) {
    sm90_smem_addr(bar);
    if (count == 0 || count >= (1u << 20)) emmy_emu::fail("mbarrier.init: count %u", count);
    *bar = uint64_t(count) | uint64_t(count) << 21;
}
inline void mbar_init_fence() {}
inline void mbar_arrive(uint64_t* bar) { emmy_emu::mbar_arrive(bar, 0); }
inline void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
    emmy_emu::mbar_arrive(bar, bytes);
}
inline void mbar_wait(uint64_t* bar, unsigned parity) {
    if (emmy_emu::mbar_load(bar).parity != (parity & 1u)) return;
    emmy_emu::wait_until([&] { return emmy_emu::mbar_load(bar).parity != (parity & 1u); });
}
inline void tma_map_acquire(const EmmyTensorMap* map) {
    const auto* m = reinterpret_cast<const emmy_emu::TensorMap*>(map);
    if (m->magic != emmy_emu::TensorMap::kMagic)
        emmy_emu::fail("tma_map_acquire: %p is not a tensor map", (const void*)map);
}
inline void tma_load_3d(void* dst, const EmmyTensorMap* map, int c0, int c1, int c2,
                        uint64_t* bar) {
    const int coord[3] = {c0, c1, c2};
    const auto* m = reinterpret_cast<const emmy_emu::TensorMap*>(map);
    if (m->rank != 3) emmy_emu::fail("tma_load_3d with a rank-%u tensor map", m->rank);
    emmy_emu::tma_load(static_cast<unsigned char*>(dst), m, coord, bar);
}
#endif

// ---------------------------------------------------------------------------------------------
// setmaxnreg.{dec,inc}.sync.aligned.u32 R: the warpgroup gives registers back to the block's
// pool (dec) or takes them from it (inc), so that a producer warpgroup that only issues copies
// leaves its registers to the consumers that hold accumulators. R is a multiple of 8 in
// 24..256; all threads of the warpgroup execute it together. The compiler honours it only when
// the kernel has a register cap at entry (__launch_bounds__(threads, 1)) and each warpgroup's
// role is one branch of an if/else. CPU: registers are not modelled; nothing to do.
// ---------------------------------------------------------------------------------------------
template <int R> EMMY_FN void setmaxnreg_dec() {
    static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: R is a multiple of 8 in 24..256");
#if defined(__CUDACC__)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R));
#endif
}
template <int R> EMMY_FN void setmaxnreg_inc() {
    static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: R is a multiple of 8 in 24..256");
#if defined(__CUDACC__)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R));
#endif
}

// ---------------------------------------------------------------------------------------------
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} with A in registers:
//   wgmma.mma_async... d, {a0, a1, a2, a3}, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-b
// (PTX ISA: the register form has no imm-trans-a). D(64xN) = A(64x16) B(16xN) (+ D when
// scale_d != 0); B in shared memory through its descriptor (TransB: 0 K-major, 1 N-contiguous).
// A: each thread of the warpgroup holds four .f16x2 / .bf16x2 registers, the mma.sync
// m16n8k16 A fragment of its warp's 16 rows (PTX ISA "Register Fragments", matrix A of
// wgmma .m64nNk16; CUTLASS's ALayout_64x16 says the same): with w = warp in the warpgroup,
// g = lane/4, q = lane%4, register r holds A[16w + g + 8(r%2)][2q + 8(r/2) + {0 (low half),
// 1 (high half)}]. D as wgmma_m64k16 above. The hardware reads the A registers asynchronously:
// they must not change until the wgmma.wait_group that covers the instruction
// (wgmma_fence_a(a) after that wait keeps the compiler from reusing them earlier).
//   wgmma_m64k16_rs<N, BF16, TransB>(d, a, desc_b, scale_d), N in {64, 128, 256}
// CPU: at issue, the four threads of each quad exchange their A registers, so each thread
// keeps the two rows of A its accumulators need (as the register values were at issue); the
// product runs at the covering wgmma.wait_group, as the shared-memory form does.
// ---------------------------------------------------------------------------------------------
#if !defined(__CUDACC__)
namespace emmy_emu {
// A[16w + g + 8h][k] of this thread's rows from its quad's registers, as a 16-bit pattern.
inline uint16_t wgmma_rs_a_bits(const AsyncMma& op, unsigned h, unsigned k) {
    const uint32_t reg = op.a_regs[4 * (k % 8 / 2) + h + 2 * (k / 8)];
    return uint16_t(k % 2 ? reg >> 16 : reg & 0xFFFFu);
}

template <int N, float (*ToFloat)(uint16_t), int TransB>
inline void wgmma_rs_run(const AsyncMma& op) {
    const unsigned q = warpgroup_rank() % 4;
    const unsigned char* smem = dynamic_shared();
    double a[2][16];
    for (unsigned h = 0; h < 2; ++h)
        for (unsigned k = 0; k < 16; ++k) a[h][k] = double(ToFloat(wgmma_rs_a_bits(op, h, k)));
    for (unsigned i = 0; i < unsigned(N) / 8; ++i)
        for (unsigned c = 0; c < 2; ++c) {
            double b[16];
            for (unsigned k = 0; k < 16; ++k) {
                uint16_t bits;
                std::memcpy(&bits, smem + wgmma_element_offset(op.desc_b, TransB,
                                                               8 * i + 2 * q + c, k), 2);
                b[k] = double(ToFloat(bits));
            }
            for (unsigned h = 0; h < 2; ++h) {
                float& d = op.acc[4 * i + 2 * h + c];
                double sum = op.scale_d ? double(d) : 0.0;
                for (unsigned k = 0; k < 16; ++k) sum += a[h][k] * b[k];
                d = float(sum);
            }
        }
}

struct WgmmaRegsA {
    uint32_t r[4];
};
}  // namespace emmy_emu
#else
#define EMMY_WGMMA_RS_PRED64 "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
#define EMMY_WGMMA_RS_REGS64 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
    "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
#define EMMY_WGMMA_RS_PRED128 "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
#define EMMY_WGMMA_RS_REGS128 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
#define EMMY_WGMMA_RS_PRED256 "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
#define EMMY_WGMMA_RS_REGS256 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
    "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
#define EMMY_WGMMA_RS_IN \
    "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
#define EMMY_WGMMA_RS(N, T)                                                                  \
    asm volatile(EMMY_WGMMA_RS_PRED##N "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #T   \
                 "." #T " " EMMY_WGMMA_RS_REGS##N : EMMY_WGMMA_D##N : EMMY_WGMMA_RS_IN)
#endif

template <int N, bool BF16, int TransB>
EMMY_FN void wgmma_m64k16_rs(float (&d)[N / 2], const unsigned (&a)[4], uint64_t desc_b,
                             int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_m64k16_rs: N is 64, 128 or 256");
    static_assert(TransB == 0 || TransB == 1,
                  "wgmma_m64k16_rs: TransB is 0 (K-major) or 1 (N-contiguous)");
#if defined(__CUDACC__)
    if constexpr (N == 64 && !BF16) EMMY_WGMMA_RS(64, f16);
    if constexpr (N == 64 && BF16) EMMY_WGMMA_RS(64, bf16);
    if constexpr (N == 128 && !BF16) EMMY_WGMMA_RS(128, f16);
    if constexpr (N == 128 && BF16) EMMY_WGMMA_RS(128, bf16);
    if constexpr (N == 256 && !BF16) EMMY_WGMMA_RS(256, f16);
    if constexpr (N == 256 && BF16) EMMY_WGMMA_RS(256, bf16);
#else
    using namespace emmy_emu;
    const unsigned what = 0x2000u | unsigned(N) | unsigned(BF16) << 9 | unsigned(TransB) << 11;
    wgmma_collective("wgmma.mma_async (A in registers)",
                     WgmmaCall{0, desc_b, what, scale_d != 0});
    Fiber& f = *block().current;
    if (!f.mma_fenced) fail("wgmma.mma_async before any wgmma.fence");
    const WgmmaRegsA* all = warpgroup_exchange(WgmmaRegsA{{a[0], a[1], a[2], a[3]}});
    constexpr auto to_float = BF16 ? bf16_bits_to_f32 : f16_bits_to_f32;
    AsyncMma op{&wgmma_rs_run<N, to_float, TransB>, d, 0, desc_b, scale_d != 0, f.mma_groups};
    const unsigned quad = warpgroup_rank() / 4 * 4;
    for (unsigned j = 0; j < 4; ++j)
        for (unsigned r = 0; r < 4; ++r) op.a_regs[4 * j + r] = all[quad + j].r[r];
    f.async_mmas.push_back(op);
#endif
}

// Keeps the compiler from moving accesses to the A registers of register-A wgmmas across the
// wgmma instructions (an empty asm per register, as wgmma_fence_acc does for accumulators).
template <int R> EMMY_FN void wgmma_fence_a(unsigned (&a)[R]) {
#if defined(__CUDACC__)
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i]) :: "memory");
#endif
}

// ---------------------------------------------------------------------------------------------
// tma_load_4d(dst, map, c0, c1, c2, c3, bar): cp.async.bulk.tensor.4d, as tma_load_3d with a
// rank-4 tensor map (the attention template's (head dim, sequence, head, batch) maps): the box
// at coordinates (c0, c1, c2, c3) lands at dst (1024-byte aligned for the 128-byte swizzle),
// zeros outside the tensor, its bytes completing on mbarrier `bar`.
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
EMMY_FN void tma_load_4d(void* dst, const EmmyTensorMap* map, int c0, int c1, int c2, int c3,
                         uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(sm90_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                    "r"(sm90_smem_addr(bar)) : "memory");
}
#else
inline void tma_load_4d(void* dst, const EmmyTensorMap* map, int c0, int c1, int c2, int c3,
                        uint64_t* bar) {
    const int coord[4] = {c0, c1, c2, c3};
    const auto* m = reinterpret_cast<const emmy_emu::TensorMap*>(map);
    if (m->rank != 4) emmy_emu::fail("tma_load_4d with a rank-%u tensor map", m->rank);
    emmy_emu::tma_load(static_cast<unsigned char*>(dst), m, coord, bar);
}
#endif

// ---------------------------------------------------------------------------------------------
// TMA stores (cp.async.bulk.tensor, shared -> global) and named barriers: a warpgroup writes
// an output tile into shared memory in the layout a tensor map names, and one thread has the
// copy engine store it while the warpgroup goes on.
//   tma_store_3d(map, c0, c1, c2, src)  the box of `map` at element coordinates (c0 innermost,
//                                   c1, c2) from shared memory at src (1024-byte aligned for the
//                                   128-byte swizzle, laid out as tma_load_3d would place it);
//                                   elements outside the tensor are not written. Added to the
//                                   thread's open bulk group.
//   tma_store_fence()               fence.proxy.async.shared::cta: this thread's shared-memory
//                                   writes are visible to the copy engine (the async proxy);
//                                   each writing thread, before the barrier that precedes the
//                                   store
//   tma_store_commit()              cp.async.bulk.commit_group: closes the thread's open group
//   tma_store_wait_read<N>()        cp.async.bulk.wait_group.read N: every committed group but
//                                   the newest N has read its shared memory (which may then be
//                                   overwritten)
//   tma_store_wait<N>()             cp.async.bulk.wait_group N: ... and has written global
//                                   memory; a thread waits for all its stores (N = 0) before
//                                   it exits, as the block's shared memory goes with it
//   warpgroup_bar(g)                bar.sync 1 + g, 128: a barrier over warpgroup g of the block
//                                   (named barrier 1 + g; 0 is __syncthreads)
// CPU: a store runs when a wait covers its group (the latest moment the copy engine may read
// its box), so a box overwritten before the wait stores the wrong values; a thread that exits
// with stores it never waited for fails the launch. warpgroup_bar is a barrier over the
// caller's warpgroup (each warpgroup names its own barrier, as the generated code does).
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
EMMY_FN void tma_store_3d(const EmmyTensorMap* map, int c0, int c1, int c2, const void* src) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(sm90_smem_addr(src)) : "memory");
}
EMMY_FN void tma_store_fence() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
EMMY_FN void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> EMMY_FN void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
template <int N> EMMY_FN void tma_store_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory");
}
EMMY_FN void warpgroup_bar(unsigned g) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(1u + g) : "memory");
}
#else
namespace emmy_emu {
// Runs the thread's stores of every committed bulk group but the newest `newest_pending`.
inline void bulk_wait(int newest_pending) {
    Fiber& f = *block().current;
    wait_groups(f.bulk_stores, f.bulk_groups, newest_pending, [](const BulkStore& st) {
        const unsigned char* smem = dynamic_shared();
        const size_t bytes = st.map->elem_bytes;
        tma_box_walk(st.offset, st.map, st.coord, "tma store",
                     [&](unsigned addr, const unsigned char* dst) {
                         if (dst) std::memcpy(const_cast<unsigned char*>(dst), smem + addr, bytes);
                     });
    });
}
}  // namespace emmy_emu

inline void tma_store_3d(const EmmyTensorMap* map, int c0, int c1, int c2, const void* src) {
    using namespace emmy_emu;
    const auto* m = reinterpret_cast<const TensorMap*>(map);
    if (m->magic != TensorMap::kMagic) fail("tma store: %p is not a tensor map", (const void*)m);
    if (m->rank != 3) fail("tma_store_3d with a rank-%u tensor map", m->rank);
    Fiber& f = *block().current;
    f.bulk_stores.push_back(BulkStore{m, {c0, c1, c2, 0}, sm90_smem_addr(src), f.bulk_groups});
}
inline void tma_store_fence() {}
inline void tma_store_commit() { emmy_emu::block().current->bulk_groups++; }
template <int N> inline void tma_store_wait_read() { emmy_emu::bulk_wait(N); }
template <int N> inline void tma_store_wait() { emmy_emu::bulk_wait(N); }
inline void warpgroup_bar(unsigned) { emmy_emu::warpgroup_sync(); }
#endif

// ---------------------------------------------------------------------------------------------
// Thread-block clusters (sm_90). The blocks of a cluster (at most 8, portably) run at once on
// the SMs of one GPC and can reach each other's shared memory: arrive on each other's mbarriers
// and have one TMA copy land in several of them (multicast), so that a tile two blocks both
// need is read from global memory once. A block's rank in its cluster (%cluster_ctarank) counts
// x fastest. The cluster dims are part of the launch: EMMY_CLUSTER_DIMS(x, y, z) in the kernel
// declaration (`__global__ void EMMY_CLUSTER_DIMS(2, 1, 1) k(...)`) fixes them at compile time
// (__cluster_dims__); the grid must be a multiple of them. An mbarrier that other blocks arrive
// on is initialised, then mbar_init_fence() (fence.mbarrier_init.release.cluster) and a
// cluster_sync() before any other block uses it; a block must not exit while others may still
// arrive on its barriers or copy into its shared memory (a final cluster_sync()).
//   cluster_ctarank()               mov.u32 %r, %cluster_ctarank
//   cluster_sync()                  barrier.cluster.arrive.release.aligned, then
//                                   barrier.cluster.wait.acquire.aligned: every thread of every
//                                   block of the cluster (shared-memory writes before it are
//                                   visible cluster-wide after it)
//   cluster_sync_after_init()       the same with a relaxed arrive, after mbarrier
//                                   initialisation whose mbar_init_fence() already released
//                                   it to the cluster (CUTLASS's cluster_arrive_relaxed +
//                                   cluster_wait): no GPU-wide fence at the kernel's start
//   mbar_arrive_cluster(bar, cta)   mapa.shared::cluster.u32 (the address of `bar`'s offset in
//                                   block `cta`), then mbarrier.arrive.shared::cluster.b64: one
//                                   arrival, no bytes, on that block's barrier (cta may be the
//                                   caller's own rank), with PTX's default .release.cta
//                                   semantics, as CUTLASS's ClusterBarrier::arrive(cta_id): the
//                                   arrival says "my reads of my own shared memory are done" (a
//                                   consumer freeing a slot the peer multicasts into), which
//                                   needs no cluster-scope release. SASS: PRMT (mapa),
//                                   SYNCS.ARRIVE.TRANS64.RED.A1T0 (a .release.cluster arrive
//                                   would add MEMBAR.ALL.CTA, MEMBAR.ALL.GPU, ERRBAR and
//                                   CGAERRBAR before each one, in the consumers' main loop)
//   tma_load_3d_multicast(dst, map, c0, c1, c2, bar, cta_mask)
//                                   cp.async.bulk.tensor.3d...multicast::cluster: as
//                                   tma_load_3d, but the box lands at dst's offset in the shared
//                                   memory of every block whose bit is set in cta_mask (16 bits,
//                                   bit r = rank r), and complete_tx(box bytes) is signalled on
//                                   the mbarrier at bar's offset in each of those blocks (each
//                                   announces the bytes it receives with its own expect_tx)
// CPU (cuda_emulate.h): the emulator takes the cluster dims from the launch, not from the
// declaration (EMMY_CLUSTER_DIMS is empty there), and runs a cluster's blocks together, one
// scheduler over all their threads, each block with its own dynamic shared memory; the remote
// arrive and each multicast destination are the emulated mbarrier arrive and TMA copy on that
// block's buffer, at the same offsets. A cluster kernel keeps all its shared memory in dynamic
// shared memory (static __shared__ would be shared by the emulated cluster's blocks). A mask
// that is empty or names a block outside the cluster fails the launch; so does a wait that no
// block of the cluster can ever end (a deadlock naming the cluster).
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
#define EMMY_CLUSTER_DIMS(x, y, z) __cluster_dims__(x, y, z)
EMMY_FN unsigned cluster_ctarank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}
EMMY_FN void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
EMMY_FN void cluster_sync_after_init() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
EMMY_FN void mbar_arrive_cluster(uint64_t* bar, unsigned cta) {
    asm volatile("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
                 :: "r"(sm90_smem_addr(bar)), "r"(cta) : "memory");
}
EMMY_FN void tma_load_3d_multicast(void* dst, const EmmyTensorMap* map, int c0, int c1, int c2,
                                   uint64_t* bar, unsigned short cta_mask) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
                 :: "r"(sm90_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2),
                    "r"(sm90_smem_addr(bar)), "h"(cta_mask) : "memory");
}
#else
#define EMMY_CLUSTER_DIMS(x, y, z)
inline unsigned cluster_ctarank() { return emmy_emu::cluster_rank(); }
inline void cluster_sync() { emmy_emu::cluster_sync(); }
inline void cluster_sync_after_init() { emmy_emu::cluster_sync(); }
inline void mbar_arrive_cluster(uint64_t* bar, unsigned cta) {
    const unsigned offset = sm90_smem_addr(bar);  // fails unless in dynamic shared memory
    auto* remote = reinterpret_cast<uint64_t*>(emmy_emu::cluster_dynamic_shared(cta) + offset);
    emmy_emu::mbar_arrive_on(remote, 0);
}
inline void tma_load_3d_multicast(void* dst, const EmmyTensorMap* map, int c0, int c1, int c2,
                                  uint64_t* bar, unsigned short cta_mask) {
    using namespace emmy_emu;
    const int coord[3] = {c0, c1, c2};
    const auto* m = reinterpret_cast<const TensorMap*>(map);
    if (m->magic != TensorMap::kMagic) fail("tma: %p is not a tensor map", (const void*)m);
    if (m->rank != 3) fail("tma_load_3d_multicast with a rank-%u tensor map", m->rank);
    const unsigned size = cluster_size();
    if (cta_mask == 0 || cta_mask >> size)
        fail("tma multicast in block (%u,%u,%u): the mask %#x names %s (the cluster has %u "
             "blocks, ranks 0..%u)", blockIdx.x, blockIdx.y, blockIdx.z, unsigned(cta_mask),
             cta_mask ? "a block outside the cluster" : "no block", size, size - 1);
    const unsigned offset = sm90_smem_addr(dst), bar_offset = sm90_smem_addr(bar);
    for (unsigned r = 0; r < size; ++r) {
        if (!(cta_mask >> r & 1u)) continue;
        unsigned char* smem = cluster_dynamic_shared(r);
        tma_copy(smem, offset, m, coord, reinterpret_cast<uint64_t*>(smem + bar_offset));
    }
}
#endif

// ---------------------------------------------------------------------------------------------
// Reductions across a thread-block cluster (REDUCE=cluster:C: the C blocks of a cluster share
// one job, each folding its slice of the row).
//   cluster_load<T>(p, cta)         the T at p's offset in the dynamic shared memory of block
//                                   `cta` of the cluster: mapa.shared::cluster.u32, then
//                                   ld.shared::cluster.b32 / .b64 (T of at most 8 bytes, p 8-byte
//                                   aligned)
//   em_cluster_fold<Op, T>(slot, size), em_cluster_fold_arg<Max>(v, p, slot, size) (argmax /
//                                   argmin: the value at `slot`, its position at slot + 8),
//                                   em_cluster_prefix<Op, T>(slot, rank) (the blocks before
//                                   `rank` only: a scan's carry into its block's slice)
//                                   the T at `slot` (16 bytes of dynamic shared memory, at the
//                                   same offset in each block) of every block of the cluster,
//                                   folded in rank order, 0 first, so that every block gets the
//                                   same result. The caller's thread 0 has written its block's
//                                   value there, and a cluster_sync() has made every block's
//                                   visible (Kernel IR's LaneCombine with a cluster: each fold
//                                   uses the other of two sets of slots than the one before, so
//                                   one barrier a fold keeps a block from overwriting a slot
//                                   another still reads; a final cluster_sync() keeps any block
//                                   from exiting while another reads its slots)
// CPU: the slot of block `cta` in the emulated cluster's shared memory, at the same offset.
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
template <class T> EMMY_FN T cluster_load(const void* p, unsigned cta) {
    static_assert(sizeof(T) <= 8, "cluster_load reads at most 8 bytes");
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(remote) : "r"(sm90_smem_addr(p)), "r"(cta));
    if constexpr (sizeof(T) == 8) {
        unsigned long long bits;
        asm volatile("ld.shared::cluster.b64 %0, [%1];\n" : "=l"(bits) : "r"(remote) : "memory");
        return *reinterpret_cast<const T*>(&bits);
    } else {
        unsigned bits;
        asm volatile("ld.shared::cluster.b32 %0, [%1];\n" : "=r"(bits) : "r"(remote) : "memory");
        return *reinterpret_cast<const T*>(&bits);
    }
}
#else
template <class T> inline T cluster_load(const void* p, unsigned cta) {
    return *reinterpret_cast<const T*>(emmy_emu::cluster_dynamic_shared(cta) + sm90_smem_addr(p));
}
#endif

template <class Op, class T> EMMY_FN T em_cluster_fold(const unsigned char* slot, unsigned size) {
    T r = cluster_load<T>(slot, 0);
    for (unsigned c = 1; c < size; ++c) r = Op::apply(r, cluster_load<T>(slot, c));
    return r;
}
// The fold of the slots of the blocks ranked before `rank`, in rank order (identity for rank 0):
// where a block's scan of its slice starts.
template <class Op, class T> EMMY_FN T em_cluster_prefix(const unsigned char* slot, unsigned rank) {
    T r = Op::template identity<T>();
    for (unsigned c = 0; c < rank; ++c) r = Op::apply(r, cluster_load<T>(slot, c));
    return r;
}
// The same for argmax / argmin: each slot holds a block's value, and its position at +8.
template <bool Max, class T> EMMY_FN void em_cluster_fold_arg(T& v, long long& p,
                                                              const unsigned char* slot,
                                                              unsigned size) {
    v = cluster_load<T>(slot, 0);
    p = cluster_load<long long>(slot + 8, 0);
    for (unsigned c = 1; c < size; ++c)
        em_arg_update<Max>(v, p, cluster_load<T>(slot, c), cluster_load<long long>(slot + 8, c));
}
