"""Measurement: the correctness harness (CPU emulator or GPU), GPU timing, baselines, suites.

Submodules import torch, cupy and the compiler lazily; importing this package is cheap.
"""
