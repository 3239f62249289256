// What every emulated kernel's program includes before its source: the emulation header, the
// device headers emitted kernels include (emmy_kernel.cuh, emmy_sm90.cuh: include guards make
// their own #include a no-op) and the harness's main(). One header, so that g++ can precompile
// it once (run.py: precompiled_dir) rather than parse it for every kernel.
#pragma once

#include "cuda_emulate.h"
#include "emmy_kernel.cuh"
#include "emmy_sm90.cuh"
#include "emu_harness.h"
