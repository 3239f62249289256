// The emulator's runtime: what does not depend on the kernel (the scheduler of fibers, the
// launch over worker threads, the argument file), compiled once per compiler, flags and headers
// into the cache (run.py: prebuilt) and linked into every kernel's program, rather than compiled
// again with each kernel. emu_threads.h and emu_harness.h declare what is defined here.
#include "cuda_emulate.h"
#include "emu_harness.h"

namespace emmy_emu {

[[noreturn]] void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fputs("emmy-emulate: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
    std::fflush(stdout);
    std::_Exit(3);
}

[[noreturn]] void deadlock() {
    Cluster& c = cluster();
    if (c.blocks.size() == 1) {
        Block& b = block();
        unsigned at_barrier = b.arrived, at_warp = 0, at_group = 0;
        for (auto& w : b.warps) at_warp += w.arrived;
        for (auto& g : b.warpgroups) at_group += g.arrived;
        fail("deadlock in block (%u,%u,%u): %u threads wait at __syncthreads, %u at a warp "
             "collective, %u at a warpgroup collective, %u of %zu have exited (a barrier inside "
             "divergent code?)",
             blockIdx.x, blockIdx.y, blockIdx.z, at_barrier, at_warp, at_group,
             unsigned(b.fibers.size()) - b.live, b.fibers.size());
    }
    char text[4096] = "";
    size_t used = 0;
    for (const Block& b : c.blocks) {
        unsigned at_warp = 0, at_group = 0;
        for (auto& w : b.warps) at_warp += w.arrived;
        for (auto& g : b.warpgroups) at_group += g.arrived;
        const unsigned named = b.arrived + at_warp + at_group + b.cluster_arrived;
        if (used >= sizeof text) break;
        const int n = std::snprintf(
            text + used, sizeof text - used,
            "; block (%u,%u,%u) rank %u: %u threads wait at the cluster barrier, %u at "
            "__syncthreads, %u at a warp collective, %u at a warpgroup collective, %u elsewhere "
            "(an mbarrier), %u of %zu have exited",
            b.index.x, b.index.y, b.index.z, b.rank, b.cluster_arrived, b.arrived, at_warp,
            at_group, b.live > named ? b.live - named : 0u, unsigned(b.fibers.size()) - b.live,
            b.fibers.size());
        if (n > 0) used += size_t(n);
    }
    fail("deadlock in cluster (%u,%u,%u) of %zu blocks: no thread of any of its blocks can move "
         "on (a wait for another block's arrival or copy that never comes?)%s",
         c.index.x, c.index.y, c.index.z, c.blocks.size(), text);
}

static void thread_exit() {
    Block& b = block();
    Cluster& c = *b.cluster;
    Fiber& f = *b.current;
    Warp& w = warp();
    WarpGroup& g = warpgroup();
    async_wait(-1);
    f.async_mmas.clear();  // wgmma results nobody waited for die with the thread's registers
    if (!f.bulk_stores.empty())
        fail("thread %u of block (%u,%u,%u) exits with %zu TMA store(s) it never waited for "
             "(cp.async.bulk.wait_group 0 before exiting: the block's shared memory, which they "
             "read, goes with it)", f.linear, b.index.x, b.index.y, b.index.z,
             f.bulk_stores.size());
    f.done = true;
    b.live--;
    c.live--;
    w.live &= ~(1u << lane());
    g.live--;
    progress();
    if (b.arrived && b.arrived == b.live) release_block_barrier(b);
    if (w.arrived && w.arrived == warp_expected(w)) release_warp(w);
    if (g.arrived && g.arrived == g.live) release_warpgroup(g);
    if (c.arrived && c.arrived == c.live) release_cluster_barrier(c);
}

[[noreturn]] static void fiber_main() {
    cluster().body(cluster().body_context);
    thread_exit();
    Block& b = block();
    switch_context(b.current->context, b.cluster->scheduler);  // never resumed: it is done
    __builtin_unreachable();
}

#if defined(__x86_64__)
// emmy_emu_switch(save_sp, load_sp): pushes rbp, rbx, r12-r15 and the x87 and SSE control words
// (the callee-saved state of the System V ABI), stores the stack pointer in *save_sp, loads
// load_sp and pops the same from it. A frame is 64 bytes below its return address.
asm(R"(
    .text
    .globl emmy_emu_switch
    .type emmy_emu_switch, @function
emmy_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw (%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emmy_emu_switch, .-emmy_emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");

void start_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
    // a frame as emmy_emu_switch leaves one, returning into `entry` with the stack aligned as
    // a call leaves it (rsp + 8 a multiple of 16); the current control words, zeroed registers
    auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
    auto* frame = reinterpret_cast<uint64_t*>(top - 80);
    std::memset(frame, 0, 80);
    uint16_t fpu;
    asm volatile("fnstcw %0" : "=m"(fpu));
    frame[0] = fpu;
    frame[1] = __builtin_ia32_stmxcsr();
    frame[8] = reinterpret_cast<uint64_t>(entry);  // after r15..rbp (frame[2..7])
    c.sp = frame;
}
#else
void start_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;  // entry never returns
    makecontext(&c.uc, entry, 0);
}
#endif

// --- running a grid ------------------------------------------------------------------------

static void on_fault(int sig) {
    char msg[200];
    int n = std::snprintf(msg, sizeof msg,
                          "emmy-emulate: signal %d (invalid memory access or stack overflow) in "
                          "block (%u,%u,%u) thread (%u,%u,%u)\n",
                          sig, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                          threadIdx.z);
    if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
    signal(sig, SIG_DFL);
    raise(sig);
}

// Faults are reported with the block and thread; an alternate stack lets a fiber's stack
// overflow (into its guard page) be reported too.
static void install_fault_handler() {
    static thread_local std::vector<char> alt(1 << 16);
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
    struct sigaction sa{};
    sa.sa_handler = on_fault;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

static size_t env_size(const char* name, size_t fallback) {
    const char* v = std::getenv(name);
    return v && *v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : fallback;
}

static void map_stacks(Block& b, size_t threads) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    b.stack_bytes = (env_size("EMMY_EMU_STACK", 256 * 1024) + page - 1) / page * page;
    const size_t each = b.stack_bytes + page;  // a guard page below each stack
    b.mapped = each * threads;
    void* p = mmap(nullptr, b.mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("cannot map %zu bytes of fiber stacks", b.mapped);
    b.stacks = static_cast<char*>(p);
    for (size_t i = 0; i < threads; ++i) mprotect(b.stacks + i * each, page, PROT_NONE);
}

// Readies a block's barriers and fibers for a run (its index and rank are set).
static void start_block(Block& b) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const unsigned n = static_cast<unsigned>(b.fibers.size());
    b.live = n;
    b.arrived = 0;
    b.cluster_arrived = 0;
    for (unsigned i = 0; i < b.warps.size(); ++i) {
        const unsigned lanes = n - i * kWarp < kWarp ? n - i * kWarp : kWarp;
        b.warps[i].live = lanes == kWarp ? ~0u : (1u << lanes) - 1;
        b.warps[i].arrived = 0;
    }
    for (unsigned i = 0; i < b.warpgroups.size(); ++i) {
        const unsigned rest = n - i * kWarpGroup;
        b.warpgroups[i].live = rest < kWarpGroup ? rest : kWarpGroup;
        b.warpgroups[i].arrived = 0;
    }
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = b.fibers[i];
        f.done = false;
        f.async_copies.clear();
        f.async_groups = 0;
        f.async_mmas.clear();
        f.mma_groups = 0;
        f.mma_fenced = false;
        f.bulk_stores.clear();
        f.bulk_groups = 0;
        start_context(f.context, b.stacks + i * (b.stack_bytes + page) + page, b.stack_bytes,
                      fiber_main);
    }
}

// Runs the cluster's blocks together: one scheduler resumes every unfinished fiber of every
// block in turn, switching the built-in indices, the current block and its shared memory.
static void run_cluster(Cluster& c) {
    c.live = 0;
    c.arrived = 0;
    c.stalled = 0;
    for (Block& b : c.blocks) {
        start_block(b);
        c.live += b.live;
    }
    for (unsigned remaining = c.live; remaining;) {
        for (Block& b : c.blocks) {
            tl_block = &b;
            tl_dynamic_shared = b.dynamic_shared;
            blockIdx = b.index;
            for (Fiber& f : b.fibers) {
                if (f.done) continue;
                b.current = &f;
                threadIdx = f.index;
                switch_context(c.scheduler, f.context);
                remaining -= f.done;
            }
        }
    }
}

static void* run_worker(void* arg) {
    Launch& l = *static_cast<Launch*>(arg);
    install_fault_handler();
    const dim3 g = l.grid_dim, k = l.block_dim, cd = l.cluster_dim;
    const unsigned n = k.x * k.y * k.z, size = cd.x * cd.y * cd.z;
    Cluster c;
    c.body = l.body;
    c.body_context = l.body_context;
    c.dims = cd;
    c.blocks.resize(size);
    for (unsigned r = 0; r < size; ++r) {
        Block& b = c.blocks[r];
        b.cluster = &c;
        b.rank = r;
        b.fibers.resize(n);
        b.warps.resize((n + kWarp - 1) / kWarp);
        b.warpgroups.resize((n + kWarpGroup - 1) / kWarpGroup);
        for (unsigned i = 0; i < n; ++i) {
            b.fibers[i].index = {i % k.x, (i / k.x) % k.y, i / (k.x * k.y)};
            b.fibers[i].linear = i;
        }
        map_stacks(b, n);
        // poison: uninitialised floats are NaN
        b.shared_buffer.assign(l.dynamic_bytes + 128, 0xff);
        b.dynamic_shared = reinterpret_cast<unsigned char*>(
            (reinterpret_cast<uintptr_t>(b.shared_buffer.data()) + 127) & ~uintptr_t(127));
    }
    tl_dynamic_shared = c.blocks[0].dynamic_shared;
    tl_dynamic_shared_bytes = l.dynamic_bytes;
    tl_block = &c.blocks[0];
    gridDim = g;
    blockDim = k;
    const dim3 cg(g.x / cd.x, g.y / cd.y, g.z / cd.z);  // the grid of clusters
    const size_t total = size_t(cg.x) * cg.y * cg.z;
    for (size_t i; (i = __atomic_fetch_add(&l.next_cluster, 1, __ATOMIC_SEQ_CST)) < total;) {
        c.index = {unsigned(i % cg.x), unsigned(i / cg.x % cg.y),
                   unsigned(i / (size_t(cg.x) * cg.y))};
        for (Block& b : c.blocks)
            b.index = {c.index.x * cd.x + b.rank % cd.x, c.index.y * cd.y + b.rank / cd.x % cd.y,
                       c.index.z * cd.z + b.rank / (cd.x * cd.y)};
        run_cluster(c);
    }
    tl_block = nullptr;
    tl_dynamic_shared = nullptr;
    for (Block& b : c.blocks) munmap(b.stacks, b.mapped);
    return nullptr;
}

void run_grid(Launch& l) {
    const dim3 g = l.grid_dim, k = l.block_dim, cd = l.cluster_dim;
    const size_t threads = size_t(k.x) * k.y * k.z;
    if (threads == 0 || threads > 1024 || k.z > 64)
        fail("invalid block (%u,%u,%u): 1 to 1024 threads, z at most 64", k.x, k.y, k.z);
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535)
        fail("invalid grid (%u,%u,%u)", g.x, g.y, g.z);
    if (l.dynamic_bytes > kMaxDynamicShared)
        fail("%zu bytes of dynamic shared memory > %zu", l.dynamic_bytes, kMaxDynamicShared);
    if (cd.x == 0 || cd.y == 0 || cd.z == 0 ||
        size_t(cd.x) * cd.y * cd.z > kMaxClusterBlocks)
        fail("invalid cluster dims (%u,%u,%u): 1 to %u blocks per cluster (the portable limit; "
             "the launch fails on the hardware)", cd.x, cd.y, cd.z, kMaxClusterBlocks);
    if (g.x % cd.x || g.y % cd.y || g.z % cd.z)
        fail("the grid (%u,%u,%u) is not a multiple of the cluster dims (%u,%u,%u) (the launch "
             "fails on the hardware)", g.x, g.y, g.z, cd.x, cd.y, cd.z);
    const size_t total = size_t(g.x / cd.x) * (g.y / cd.y) * (g.z / cd.z);  // clusters
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t workers = env_size("EMMY_EMU_WORKERS", cores > 0 ? size_t(cores) : 1);
    workers = workers < total ? workers : total;
    if (workers <= 1) {
        run_worker(&l);
        return;
    }
    std::vector<pthread_t> pool(workers);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 16 << 20);  // room for large __shared__ thread-locals
    for (auto& t : pool)
        if (pthread_create(&t, &attr, run_worker, &l) != 0) fail("cannot start a worker thread");
    for (auto& t : pool) pthread_join(t, nullptr);
    pthread_attr_destroy(&attr);
}


static unsigned char* guarded_alloc(uint64_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t body = (bytes + 255) / 256 * 256;
    const size_t pages = (body + page - 1) / page + 1;
    auto* base = static_cast<unsigned char*>(mmap(nullptr, pages * page, PROT_READ | PROT_WRITE,
                                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED) fail("cannot allocate %llu bytes", (unsigned long long)bytes);
    unsigned char* guard = base + (pages - 1) * page;
    mprotect(guard, page, PROT_NONE);
    return guard - body;
}

template <class T> static T read_value(std::FILE* f) {
    T v{};
    if (std::fread(&v, sizeof v, 1, f) != 1) fail("argument file is truncated");
    return v;
}

HarnessLaunch read_launch(int argc, char** argv, size_t params) {
    if (argc != 4) fail("usage: %s ARGS_FILE OUT_FILE KERNEL_NAME", argv[0]);
    std::FILE* in = std::fopen(argv[1], "rb");
    if (!in) fail("cannot open %s", argv[1]);
    char magic[8];
    if (std::fread(magic, 1, 8, in) != 8 ||
        (std::memcmp(magic, "EMMYARG1", 8) != 0 && std::memcmp(magic, "EMMYARG2", 8) != 0))
        fail("%s is not an argument file", argv[1]);
    uint32_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};  // grid, block, cluster
    for (int i = 0; i < (magic[7] == '2' ? 9 : 6); ++i) dims[i] = read_value<uint32_t>(in);
    const auto smem = read_value<uint64_t>(in);
    const auto count = read_value<uint32_t>(in);
    if (count != params) fail("the kernel takes %zu arguments, %u were given", params, count);
    std::vector<HarnessArg> args(count);
    for (auto& a : args) {
        a.kind = read_value<uint32_t>(in);
        if (a.kind == 0) {
            a.bytes = read_value<uint64_t>(in);
            a.data = guarded_alloc(a.bytes);
            if (a.bytes && std::fread(a.data, 1, a.bytes, in) != a.bytes)
                fail("argument file is truncated");
        } else if (a.kind == 1) {
            a.integer = read_value<int64_t>(in);
        } else if (a.kind == 3) {
            a.map_array = read_value<uint32_t>(in);
            a.map.magic = TensorMap::kMagic;
            a.map.rank = read_value<uint32_t>(in);
            a.map.elem_bytes = read_value<uint32_t>(in);
            a.map.swizzle = read_value<uint32_t>(in);
            for (auto& d : a.map.dims) d = read_value<uint64_t>(in);
            for (auto& d : a.map.strides) d = read_value<uint64_t>(in);
            for (auto& d : a.map.box) d = read_value<uint32_t>(in);
            a.map_offset = read_value<uint64_t>(in);
        } else {
            a.real = read_value<double>(in);
        }
    }
    std::fclose(in);
    for (auto& a : args) {
        if (a.kind != 3) continue;
        if (a.map_array >= args.size() || args[a.map_array].kind != 0)
            fail("a tensor map names argument %u, which is not an array", a.map_array);
        if (a.map_offset % 16 || a.map_offset > args[a.map_array].bytes)
            fail("a tensor map starts %llu bytes into its array: a global address must be "
                 "16-byte aligned and inside the array", (unsigned long long)a.map_offset);
        a.map.base = static_cast<unsigned char*>(args[a.map_array].data) + a.map_offset;
        a.data = guarded_alloc(sizeof(TensorMap));  // 256-byte aligned, as a tensor map must be
        std::memcpy(a.data, &a.map, sizeof(TensorMap));
    }
    return {dim3(dims[0], dims[1], dims[2]), dim3(dims[3], dims[4], dims[5]),
            dim3(dims[6], dims[7], dims[8]), static_cast<size_t>(smem), std::move(args)};
}

int write_outputs(const char* path, const std::vector<HarnessArg>& args) {
    std::FILE* out = std::fopen(path, "wb");
    if (!out) fail("cannot write %s", path);
    for (const auto& a : args) {
        if (a.kind != 0) continue;
        std::fwrite(&a.bytes, sizeof a.bytes, 1, out);
        std::fwrite(a.data, 1, a.bytes, out);
    }
    return std::fclose(out) == 0 ? 0 : 1;
}


}  // namespace emmy_emu
