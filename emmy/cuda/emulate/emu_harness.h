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

#include <sys/mman.h>
#include <unistd.h>

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

inline unsigned char* guarded_alloc(uint64_t bytes) {
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

template <class T> inline T read_value(std::FILE* f) {
    T v{};
    if (std::fread(&v, sizeof v, 1, f) != 1) fail("argument file is truncated");
    return v;
}

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
    if (count != sizeof...(P))
        fail("the kernel takes %zu arguments, %u were given", sizeof...(P), count);
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
    launch_with(kernel, dim3(dims[0], dims[1], dims[2]), dim3(dims[3], dims[4], dims[5]),
                dim3(dims[6], dims[7], dims[8]), static_cast<size_t>(smem), args,
                std::index_sequence_for<P...>{});
    std::fflush(stdout);
    std::FILE* out = std::fopen(argv[2], "wb");
    if (!out) fail("cannot write %s", argv[2]);
    for (const auto& a : args) {
        if (a.kind != 0) continue;
        std::fwrite(&a.bytes, sizeof a.bytes, 1, out);
        std::fwrite(a.data, 1, a.bytes, out);
    }
    return std::fclose(out) == 0 ? 0 : 1;
}

}  // namespace emmy_emu
