"""CPU emulation of CUDA kernels: cuda_emulate.h and the g++ build-and-run driver (run.py)."""
