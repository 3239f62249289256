"""emmy: a PyTorch -> CUDA compiler with a multi-level IR."""

__version__ = "0.1.0"
