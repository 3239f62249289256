// The CUDA execution model on the CPU: blocks, threads, barriers, warp collectives, launch.
// Included by cuda_emulate.h.
//
// How it runs a grid:
//   * The grid is cut into thread-block clusters (sm_90: `cluster` dims given with the launch,
//     default 1x1x1, i.e. every block its own cluster). Clusters are shared out to a few worker
//     OS threads (EMMY_EMU_WORKERS, default: the number of cores); each worker runs one cluster
//     at a time, to completion, all of its blocks together.
//   * Inside a worker, each CUDA thread of the cluster's blocks is a fiber with its
//     own stack (EMMY_EMU_STACK bytes, default 256 KiB, reserved lazily, with a guard page); one
//     scheduler resumes the fibers of all the cluster's blocks in turn. Fibers switch only at
//     __syncthreads, warp collectives, mbarrier / cluster waits and exit, so a cluster runs
//     deterministically, and code that forgot a barrier reads stale data instead of racing.
//     The scheduler switches blockIdx, threadIdx, the current block (tl_block) and its dynamic
//     shared memory (tl_dynamic_shared) with each fiber, so every intrinsic sees its own block.
//   * Dynamic shared memory is one buffer per block of a cluster (per worker). `__shared__` is
//     `static thread_local`: one copy per worker, so the blocks of a cluster would share it;
//     cluster kernels (cluster dims > 1) must keep their shared memory in dynamic shared memory
//     (emmy's do). With clusters of one block it is the running block's own.
//   * Threads that have exited count as arrived at later barriers (as on the hardware); when no
//     thread of the cluster can move on, the emulator reports a deadlock and exits with code 3.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

// The built-in index variables: per worker OS thread, switched with each fiber.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace emmy_emu {

constexpr unsigned kWarp = 32;
constexpr unsigned kWarpGroup = 128;              // sm_90 wgmma: 4 consecutive warps
constexpr size_t kSlotBytes = 32;                 // largest value one lane can exchange
constexpr size_t kMaxDynamicShared = 227 * 1024;  // sm_90a opt-in limit

// Prints "emmy-emulate: " and the message to stderr, exits with code 3 (run.py: an emulator
// error such as a deadlock or a bad launch).
[[noreturn]] void fail(const char* fmt, ...);

// A cp.async copy in flight: the source was read at issue, the shared memory is written when a
// cp.async.wait_group covers its group (the latest moment the hardware may land it).
struct AsyncCopy {
    void* dst;
    unsigned char data[16];
    unsigned bytes;
    unsigned group;
};

// A wgmma.mma_async in flight (emmy_sm90.cuh): it reads shared memory and writes the thread's
// accumulators when a wgmma.wait_group covers its group (the latest moment the hardware may
// finish it), so reading the accumulators early, or overwriting its operands before the wait,
// shows up as wrong values. `run` computes this thread's part on the thread's own fiber.
struct AsyncMma {
    void (*run)(const AsyncMma&);
    float* acc;
    uint64_t desc_a, desc_b;
    int scale_d;
    unsigned group;
    // wgmma with A in registers: the A fragment registers of the four threads of this thread's
    // quad (lanes 4g..4g+3 of its warp; thread 4g+j's register r at [4j + r]), captured when
    // the instruction was issued. Unused by the shared-memory form.
    uint32_t a_regs[16] = {};
};

// The emulator's CUtensorMap (128 bytes, 64-byte aligned, in global memory): what
// cuTensorMapEncodeTiled is told on a GPU. emu_harness.h fills it from a tensor-map argument;
// the TMA emulation in emmy_sm90.cuh reads it. Dimension 0 is the contiguous one.
struct TensorMap {
    static constexpr uint64_t kMagic = 0x50414d524f534e45ull;  // "ENSORMAP"
    uint64_t magic;
    const unsigned char* base;    // the tensor's first element
    uint32_t rank, elem_bytes;
    uint32_t swizzle;             // 0 none, 1 128-byte, 2 64-byte, 3 32-byte
    uint32_t box[4];              // elements per dimension that one copy moves
    uint64_t dims[4];             // elements per dimension; outside them a copy reads zeros
    uint64_t strides[4];          // bytes from one index to the next (strides[0]: elem_bytes)
};
static_assert(sizeof(TensorMap) <= 128, "a tensor map is 128 bytes");

// A TMA store in flight (cp.async.bulk.tensor shared -> global, emmy_sm90.cuh): it reads its
// box from shared memory and writes global memory when a cp.async.bulk.wait_group covers its
// bulk group (the latest moment the copy engine may read), so overwriting the shared-memory
// box before that wait shows up as wrong values.
struct BulkStore {
    const TensorMap* map;
    int coord[4];
    unsigned offset;  // the box's byte offset in the block's dynamic shared memory
    unsigned group;
};

// A suspended fiber (or the scheduler). On x86-64, its stack pointer: the switch
// (emmy_emu_switch, emu_runtime.cpp) pushes the callee-saved registers and the x87/SSE control
// words on the stack it leaves and pops them from the one it enters, a few nanoseconds where
// swapcontext makes two system calls (the signal mask) per switch. Elsewhere, a ucontext.
struct Context {
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

#if defined(__x86_64__)
extern "C" void emmy_emu_switch(void** save_sp, void* load_sp);
#endif

// Suspends the running code in `from` and resumes `to`.
inline void switch_context(Context& from, Context& to) {
#if defined(__x86_64__)
    emmy_emu_switch(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
}

// Makes `c` start `entry` (which must never return) on `bytes` of stack at `stack` when first
// switched to.
void start_context(Context& c, char* stack, size_t bytes, void (*entry)());

struct Fiber {
    Context context;
    uint3 index;          // threadIdx
    unsigned linear = 0;  // x + y*Dx + z*Dx*Dy
    bool done = false;
    std::vector<AsyncCopy> async_copies;
    unsigned async_groups = 0;  // cp.async.commit_group count: the uncommitted group's id
    std::vector<AsyncMma> async_mmas;
    unsigned mma_groups = 0;    // wgmma.commit_group count: the uncommitted group's id
    bool mma_fenced = false;    // a wgmma.fence came before the first wgmma.mma_async
    std::vector<BulkStore> bulk_stores;
    unsigned bulk_groups = 0;   // cp.async.bulk.commit_group count: the uncommitted group's id
};

struct Warp {
    unsigned live = 0;        // lanes that exist and have not exited
    unsigned mask = 0;        // the mask named by the collective being gathered
    unsigned arrived = 0;
    unsigned generation = 0;  // bumped when a collective completes
    alignas(16) unsigned char slots[2][kWarp * kSlotBytes];  // by generation parity
};

// Threads 128g .. 128g+127 of a block (4 warps): the wgmma instructions are collective over them.
struct WarpGroup {
    unsigned live = 0;        // threads that exist and have not exited
    unsigned arrived = 0;
    unsigned generation = 0;  // bumped when a collective completes
    alignas(16) unsigned char slots[2][kWarpGroup * kSlotBytes];  // by generation parity
};

struct Cluster;

// One block of a worker's cluster: its fibers, barrier state, stacks and shared memory.
struct Block {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    std::vector<WarpGroup> warpgroups;
    Cluster* cluster = nullptr;
    Fiber* current = nullptr;
    uint3 index{0, 0, 0};    // blockIdx
    unsigned rank = 0;       // %cluster_ctarank: x fastest within the cluster
    unsigned live = 0, arrived = 0, generation = 0;  // __syncthreads
    int counts[2] = {0, 0};                          // __syncthreads_count, by generation parity
    unsigned cluster_arrived = 0;  // its threads waiting at the cluster barrier
    char* stacks = nullptr;
    size_t stack_bytes = 0, mapped = 0;
    std::vector<unsigned char> shared_buffer;
    unsigned char* dynamic_shared = nullptr;  // 128-byte aligned, in shared_buffer
};

// The blocks of one thread-block cluster, run together by one worker.
struct Cluster {
    std::vector<Block> blocks;  // by rank
    dim3 dims;                  // blocks per cluster in x, y, z
    uint3 index{0, 0, 0};       // the cluster's position in the grid of clusters
    Context scheduler;
    void (*body)(const void*) = nullptr;  // runs the kernel on the current thread
    const void* body_context = nullptr;
    unsigned live = 0;                    // threads of all its blocks that have not exited
    unsigned arrived = 0, generation = 0; // the cluster barrier
    unsigned stalled = 0;  // resumes in a row, of any of its threads, that found their wait
                           // unfinished
};

inline thread_local Block* tl_block = nullptr;
inline thread_local unsigned char* tl_dynamic_shared = nullptr;
inline thread_local size_t tl_dynamic_shared_bytes = 0;  // the launch's dynamic shared memory

inline unsigned char* dynamic_shared() { return tl_dynamic_shared; }
inline size_t dynamic_shared_bytes() { return tl_dynamic_shared_bytes; }
inline Block& block() { return *tl_block; }
inline Cluster& cluster() { return *tl_block->cluster; }
inline unsigned lane() { return block().current->linear % kWarp; }
inline Warp& warp() { return block().warps[block().current->linear / kWarp]; }
inline unsigned warpgroup_rank() { return block().current->linear % kWarpGroup; }
inline WarpGroup& warpgroup() { return block().warpgroups[block().current->linear / kWarpGroup]; }

inline void yield() {
    Block& b = block();
    switch_context(b.current->context, b.cluster->scheduler);
}

// Something changed that a waiting thread of the cluster may be waiting for (an arrival, a
// barrier's release, an exit, an mbarrier's new state): the stall count starts again.
inline void progress() { cluster().stalled = 0; }

// Reports what the cluster's threads wait for, and exits (fail).
[[noreturn]] void deadlock();

// Yield until `done()`; arriving counts as progress, a resume that finds nothing changed not.
// The count is over the whole cluster: a thread may wait for another block of it.
template <class Done> inline void wait_until(Done done) {
    Cluster& c = cluster();
    c.stalled = 0;
    yield();
    while (!done()) {
        if (++c.stalled > 2 * c.live + 2) deadlock();
        yield();
    }
    c.stalled = 0;
}

inline void release_block_barrier(Block& b) {
    b.counts[(b.generation + 1) & 1] = 0;
    b.arrived = 0;
    b.generation++;
    progress();
}

inline void release_warp(Warp& w) {
    w.arrived = 0;
    w.generation++;
    progress();
}

inline unsigned warp_expected(const Warp& w) { return __builtin_popcount(w.mask & w.live); }

inline void release_warpgroup(WarpGroup& g) {
    g.arrived = 0;
    g.generation++;
    progress();
}

inline void release_cluster_barrier(Cluster& c) {
    for (Block& b : c.blocks) b.cluster_arrived = 0;
    c.arrived = 0;
    c.generation++;
    progress();
}

// __syncthreads_count: the barrier, returning how many threads passed a non-zero predicate.
inline int sync_block(int predicate) {
    Block& b = block();
    const unsigned gen = b.generation;
    b.counts[gen & 1] += predicate != 0;
    if (++b.arrived == b.live) release_block_barrier(b);
    else wait_until([&] { return b.generation != gen; });
    return b.counts[gen & 1];
}

// Every lane in `mask` puts `value` in its slot; returns all 32 slots once all have arrived.
// The slots stay valid until this lane's next collective (they are double buffered).
template <class T> inline const T* warp_exchange(unsigned mask, const T& value) {
    static_assert(sizeof(T) <= kSlotBytes, "value too large for a warp exchange slot");
    Warp& w = warp();
    const unsigned me = lane(), gen = w.generation;
    if (!(mask >> me & 1u))
        fail("lane %u calls a warp collective with mask %#x that omits it", me, mask);
    if (w.arrived == 0) w.mask = mask;
    else if (w.mask != mask)
        fail("lanes of one warp call collectives with masks %#x and %#x at once; not emulated",
             w.mask, mask);
    T* slots = reinterpret_cast<T*>(w.slots[gen & 1]);
    std::memcpy(&slots[me], &value, sizeof(T));
    if (++w.arrived == warp_expected(w)) release_warp(w);
    else wait_until([&] { return w.generation != gen; });
    return slots;
}

// Every live thread of the caller's warpgroup puts `value` in its slot; returns all 128 slots
// (indexed by warpgroup_rank()) once all have arrived. Threads that have exited count as
// arrived; their slots hold stale bytes. The slots stay valid until this thread's next
// warpgroup collective (they are double buffered).
template <class T> inline const T* warpgroup_exchange(const T& value) {
    static_assert(sizeof(T) <= kSlotBytes, "value too large for a warpgroup exchange slot");
    WarpGroup& g = warpgroup();
    const unsigned gen = g.generation;
    T* slots = reinterpret_cast<T*>(g.slots[gen & 1]);
    std::memcpy(&slots[warpgroup_rank()], &value, sizeof(T));
    if (++g.arrived == g.live) release_warpgroup(g);
    else wait_until([&] { return g.generation != gen; });
    return slots;
}

// A barrier over the caller's warpgroup (what the .aligned wgmma instructions imply).
inline void warpgroup_sync() { warpgroup_exchange(0); }

// --- thread-block clusters (sm_90) -----------------------------------------------------------
// The caller's rank in its cluster (%cluster_ctarank: x fastest), the cluster's block count,
// and the dynamic shared memory of the cluster's block of rank `rank` (the same offsets as the
// caller's: what mapa.shared::cluster maps an address to).
inline unsigned cluster_rank() { return block().rank; }
inline unsigned cluster_size() { return unsigned(cluster().blocks.size()); }
inline unsigned char* cluster_dynamic_shared(unsigned rank) {
    Cluster& c = cluster();
    if (rank >= c.blocks.size())
        fail("block (%u,%u,%u) names block rank %u of its cluster, which has %zu blocks",
             blockIdx.x, blockIdx.y, blockIdx.z, rank, c.blocks.size());
    if (c.blocks[rank].live == 0)
        fail("block (%u,%u,%u) reaches the shared memory of block rank %u of its cluster, whose "
             "threads have all exited (a block must not exit while others may still arrive on "
             "its barriers or copy into its shared memory: end with cluster_sync())",
             blockIdx.x, blockIdx.y, blockIdx.z, rank);
    return c.blocks[rank].dynamic_shared;
}

// A barrier over every thread of every block of the cluster (barrier.cluster.arrive then
// barrier.cluster.wait); threads that have exited count as arrived.
inline void cluster_sync() {
    Cluster& c = cluster();
    const unsigned gen = c.generation;
    block().cluster_arrived++;
    if (++c.arrived == c.live) release_cluster_barrier(c);
    else wait_until([&] { return c.generation != gen; });
}

// cp.async on the CPU: issue reads the source now (zero-filling past `src_bytes`) ...
inline void async_copy(void* dst, const void* src, unsigned bytes, unsigned src_bytes) {
    Fiber& f = *block().current;
    AsyncCopy c{dst, {}, bytes, f.async_groups};
    if (src_bytes) std::memcpy(c.data, src, src_bytes < bytes ? src_bytes : bytes);
    f.async_copies.push_back(c);
}

inline void async_commit() { block().current->async_groups++; }

// ... and wait_group N lands every copy except those of the newest N committed groups
// (N < 0: every copy, committed or not, as cp.async.wait_all does).
inline void async_wait(int newest_pending) {
    Fiber& f = *block().current;
    const unsigned keep = newest_pending < 0 ? 0 : unsigned(newest_pending);
    const unsigned limit =
        newest_pending < 0 ? ~0u : (f.async_groups > keep ? f.async_groups - keep : 0);
    size_t kept = 0;
    for (const AsyncCopy& c : f.async_copies) {
        if (c.group < limit) std::memcpy(c.dst, c.data, c.bytes);
        else f.async_copies[kept++] = c;
    }
    f.async_copies.resize(kept);
}

// A wait_group N over ops issued in numbered groups (wgmma's, TMA stores'): runs `run` on each
// op of the committed groups but the newest N (`groups` committed so far), in issue order, and
// keeps the others in order.
template <class Op, class Run>
inline void wait_groups(std::vector<Op>& ops, unsigned groups, int newest_pending, Run run) {
    const unsigned keep = unsigned(newest_pending);
    const unsigned limit = groups > keep ? groups - keep : 0;
    size_t kept = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
        const Op op = ops[i];
        if (op.group < limit) run(op);
        else ops[kept++] = op;
    }
    ops.resize(kept);
}

// What every worker of one launch shares.
struct Launch {
    dim3 grid_dim, block_dim, cluster_dim;
    size_t dynamic_bytes;
    void (*body)(const void*);
    const void* body_context;
    size_t next_cluster;  // taken with __atomic_fetch_add
};

constexpr unsigned kMaxClusterBlocks = 8;  // the portable cluster size

// Runs the kernel of `l` over its grid on worker threads (emu_runtime.cpp); fails on a launch
// the hardware refuses.
void run_grid(Launch& l);

// launch_cluster(kernel, grid, block, cluster, dynamic_smem, args...): run `kernel(args...)`
// on every thread, the blocks grouped in clusters of `cluster` blocks (the grid a multiple).
template <class... Params, class... Args>
inline void launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 blk, dim3 cluster_dims,
                           size_t dynamic_bytes, Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "wrong number of kernel arguments");
    const auto call = [kernel, args...] { kernel(args...); };  // each thread gets copies
    using Call = decltype(call);
    Launch l{grid, blk, cluster_dims, dynamic_bytes,
             [](const void* c) { (*static_cast<const Call*>(c))(); }, &call, 0};
    run_grid(l);
}

// launch(kernel, grid, block, dynamic_smem, args...): the same without clusters.
template <class... Params, class... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 blk, size_t dynamic_bytes,
                   Args&&... args) {
    launch_cluster(kernel, grid, blk, dim3(1, 1, 1), dynamic_bytes, std::forward<Args>(args)...);
}

}  // namespace emmy_emu

// --- CUDA's names for the barrier and the warp collectives --------------------------------------
inline void __syncthreads() { emmy_emu::sync_block(0); }
inline int __syncthreads_count(int p) { return emmy_emu::sync_block(p); }
inline int __syncthreads_and(int p) {
    return emmy_emu::sync_block(p) == static_cast<int>(emmy_emu::block().live);
}
inline int __syncthreads_or(int p) { return emmy_emu::sync_block(p) != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emmy_emu::warp_exchange(mask, 0); }
inline unsigned __activemask() { return emmy_emu::warp().live; }
inline void __trap() {
    emmy_emu::fail("__trap() in block (%u,%u,%u) thread (%u,%u,%u)", blockIdx.x, blockIdx.y,
                   blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
}

// Shuffles, as PTX shfl.sync defines them for a `width`-lane segment: idx wraps within the
// segment; up/down give back the caller's value past the segment's start/end; xor may read an
// earlier segment but not a later one. CUDA declares them for int, unsigned, long, long long
// (and unsigned), float, double and the 16-bit float types only: a bool, char or short argument
// is promoted and an int comes back, so code that expects its own narrow type back fails to
// compile here as it does under NVRTC.
namespace emmy_emu {
template <class T> using shfl_t =
    std::conditional_t<std::is_integral_v<T> && (sizeof(T) < sizeof(int)), int, T>;
}
template <class T, class R = emmy_emu::shfl_t<T>>
inline R __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
    const R* all = emmy_emu::warp_exchange(mask, R(v));
    const unsigned me = emmy_emu::lane(), base = me & ~unsigned(width - 1);
    return all[base + (unsigned(src) & unsigned(width - 1))];
}
template <class T, class R = emmy_emu::shfl_t<T>>
inline R __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    const R* all = emmy_emu::warp_exchange(mask, R(v));
    const unsigned me = emmy_emu::lane(), base = me & ~unsigned(width - 1);
    return me - base >= delta ? all[me - delta] : R(v);
}
template <class T, class R = emmy_emu::shfl_t<T>>
inline R __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    const R* all = emmy_emu::warp_exchange(mask, R(v));
    const unsigned me = emmy_emu::lane(), base = me & ~unsigned(width - 1);
    return me - base + delta < unsigned(width) ? all[me + delta] : R(v);
}
template <class T, class R = emmy_emu::shfl_t<T>>
inline R __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    const R* all = emmy_emu::warp_exchange(mask, R(v));
    const unsigned me = emmy_emu::lane(), base = me & ~unsigned(width - 1);
    const unsigned src = me ^ unsigned(lane_mask);
    return src < base + unsigned(width) ? all[src] : R(v);
}

// Votes over the lanes in `mask` (lanes that have exited do not vote).
inline unsigned __ballot_sync(unsigned mask, int p) {
    const int* all = emmy_emu::warp_exchange(mask, p);
    unsigned bits = 0;
    for (unsigned l = 0; l < emmy_emu::kWarp; ++l)
        if ((mask & emmy_emu::warp().live) >> l & 1u) bits |= unsigned(all[l] != 0) << l;
    return bits;
}
inline int __all_sync(unsigned mask, int p) {
    return __ballot_sync(mask, p) == (mask & emmy_emu::warp().live);
}
inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }

namespace emmy_emu {
template <class T, class Op> inline T reduce_sync(unsigned mask, T v, Op op) {
    const T* all = warp_exchange(mask, v);
    const unsigned use = mask & warp().live;
    T r = v;
    bool first = true;
    for (unsigned l = 0; l < kWarp; ++l) {
        if (!(use >> l & 1u)) continue;
        r = first ? all[l] : op(r, all[l]);
        first = false;
    }
    return r;
}
}  // namespace emmy_emu

#define EMMY_EMU_REDUCE(NAME, EXPR)                                                            \
    inline unsigned NAME(unsigned m, unsigned v) {                                             \
        return emmy_emu::reduce_sync(m, v, [](unsigned a, unsigned b) { return EXPR; });       \
    }                                                                                          \
    inline int NAME(unsigned m, int v) {                                                       \
        return emmy_emu::reduce_sync(m, v, [](int a, int b) { return EXPR; });                 \
    }
EMMY_EMU_REDUCE(__reduce_add_sync, a + b)
EMMY_EMU_REDUCE(__reduce_min_sync, a < b ? a : b)
EMMY_EMU_REDUCE(__reduce_max_sync, a > b ? a : b)
#undef EMMY_EMU_REDUCE
