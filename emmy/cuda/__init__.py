"""The CUDA backend's toolchain: NVRTC compilation, the compile cache, the intrinsics header and
the CPU emulation that runs the same CUDA source with g++."""
