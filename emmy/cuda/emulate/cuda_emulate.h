// cuda_emulate.h: compile CUDA kernel source with g++ and run it on the CPU.
//
//     g++ -std=c++20 -O1 -pthread -fno-strict-aliasing -include cuda_emulate.h kernel.cu ...
//
// The same source that NVRTC compiles builds here: the CUDA keywords are defined away, the
// built-in variables are thread-locals switched per emulated thread, and the device functions
// the emitter uses have CPU versions. It is for correctness on machines without a GPU, on small
// shapes; it says nothing about speed. Parts:
//   emu_types.h    vector types, dim3, software __half / __nv_bfloat16
//   emu_math.h     fast-math intrinsics, min/max, bit tricks, atomics
//   emu_threads.h  blocks as fibers, __syncthreads, shuffles and votes, thread-block clusters
//                  (a cluster's blocks run together; cluster_sync, each block's shared memory
//                  reachable by the others), launch() / launch_cluster()
//
// One thing the preprocessor cannot do: `extern __shared__ T name[];` (dynamic shared memory).
// The driver (run.py) rewrites it to `T* name = (T*)emmy_emu::dynamic_shared();`, which is
// valid inside a function body, where the emitter declares it.
#pragma once

#define EMMY_EMULATE 1

#define __global__
#define __device__
#define __host__
#define __constant__ static
#define __shared__ static thread_local
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__
#define __CUDA_EMULATED__ 1

#include "emu_types.h"
#include "emu_math.h"
#include "emu_threads.h"

// NVRTC has no <math.h> macros; refuse them here too so that what builds here builds there.
#undef INFINITY
#undef NAN
