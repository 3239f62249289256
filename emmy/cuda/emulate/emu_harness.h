// The main() of an emulated kernel run, generic over the kernel's signature, so one binary per
// kernel source serves every shape: the launch (grid, block, dynamic shared memory) and the
// arguments are read at run time.
//
//   ./program ARGS_FILE OUT_FILE KERNEL_NAME      (main() picks the kernel by name)
//
// ARGS_FILE (little endian): "EMMYARG2", grid u32[3], block u32[3], cluster u32[3] (blocks per
// thread-block cluster; the older "EMMYARG1" has no cluster: 1,1,1), dynamic_smem u64, count u32,
// then per argument a kind u32 and its value: 0 array (u64 byte count, bytes), 1 integer (i64),
// 2 float (f64), 3 tensor map (u32 array argument index, rank, element bytes, swizzle, then
// u64 dims[4], u64 byte strides[4], u32 box[4], u64 byte offset of the tensor in the array;
// the kernel gets a pointer to an emmy_emu::TensorMap over that array). OUT_FILE gets every
// array argument back, in order, as (u64 count, bytes).
// Arrays live in their own pages, 256-byte aligned (as cudaMalloc) and ending as close to an
// inaccessible page as that alignment allows, so most out-of-bounds accesses fault.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace emmy_emu {

struct HarnessArg {
    uint32_t kind = 0;
    unsigned char* data = nullptr;  // arrays
    uint64_t bytes = 0;
    int64_t integer = 0;
    double real = 0;
    TensorMap map{};            // tensor maps: base is set once every array is read
    uint32_t map_array = 0;     // the array argument it describes
    uint64_t map_offset = 0;    // bytes from that array's start to the tensor's first element
};

// What an argument file describes: the launch, and the arguments read (arrays copied into
// guarded pages, tensor maps pointed at their arrays). emu_runtime.cpp reads and writes it.
struct HarnessLaunch {
    dim3 grid, block, cluster;
    size_t smem = 0;
    std::vector<HarnessArg> args;
};

// The launch and arguments of ARGS_FILE (argv[1]) for a kernel of `params` parameters; fails
// (exit code 3) on a bad command line or file, or another number of arguments.
HarnessLaunch read_launch(int argc, char** argv, size_t params);

// Writes every array argument to `path` (OUT_FILE); the program's exit code.
int write_outputs(const char* path, const std::vector<HarnessArg>& args);

template <class P> inline P convert_arg(const HarnessArg& a, size_t index) {
    if constexpr (std::is_pointer_v<P>) {
        if (a.kind != 0 && a.kind != 3)
            fail("argument %zu: the kernel takes a pointer, got a scalar", index);
        return reinterpret_cast<P>(a.data);
    } else {
        if (a.kind == 0 || a.kind == 3)
            fail("argument %zu: the kernel takes a scalar, got an array", index);
        const double real = a.kind == 1 ? static_cast<double>(a.integer) : a.real;
        if constexpr (std::is_integral_v<P>)
            return a.kind == 1 ? static_cast<P>(a.integer) : static_cast<P>(real);
        else if constexpr (std::is_floating_point_v<P>)
            return static_cast<P>(real);
        else
            return P(static_cast<float>(real));  // __half, __nv_bfloat16
    }
}

template <class... P, size_t... I>
inline void launch_with(void (*kernel)(P...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                        const std::vector<HarnessArg>& args, std::index_sequence<I...>) {
    launch_cluster(kernel, grid, block, cluster, smem,
                   convert_arg<std::remove_cv_t<P>>(args[I], I)...);
}

template <class... P> inline int harness_main(int argc, char** argv, void (*kernel)(P...)) {
    const HarnessLaunch l = read_launch(argc, argv, sizeof...(P));
    launch_with(kernel, l.grid, l.block, l.cluster, l.smem, l.args,
                std::index_sequence_for<P...>{});
    std::fflush(stdout);
    return write_outputs(argv[2], l.args);
}

}  // namespace emmy_emu
