"""emmy: a PyTorch -> CUDA compiler with a multi-level IR."""

__version__ = "0.1.0"


def compile(model, *example_inputs, **options):  # noqa: A001 - the public name, like torch.compile
    """See `emmy.api.compile`."""
    from emmy.api import compile as _compile

    return _compile(model, *example_inputs, **options)
