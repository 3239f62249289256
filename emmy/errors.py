"""Two families of errors: the user's (bad input; exit code 2, no traceback) and ours (a broken
invariant inside the compiler; a bug to report)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a wrong file, flag, row or an unsupported op. The message says what would be
    accepted. The command line prints it and exits with code 2."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n  hint: {self.hint}" if self.hint else base


def unknown_kernel(name, kernels, note: str = "") -> UserError:
    """The error for a kernel name the program does not have; `kernels`: the names it has."""
    names = ", ".join(kernels)
    listed = f"the kernels are {names}" if names else \
        "the program has no kernels (none of its outputs has an element)"
    return UserError(f"no kernel `{name}`; {listed}" + (f" ({note})" if note else ""))


class UnsupportedOp(UserError):
    """An op the compiler cannot lower (names the op and, when known, the source line)."""

    def __init__(self, op: str, *, source: str | None = None, detail: str | None = None):
        where = f" at {source}" if source else ""
        why = f": {detail}" if detail else ""
        # an op emmy lowers but not with these arguments is in `emmy ops`: pointing there would
        # send the user to a list that names it
        hint = None if detail else "`emmy ops` lists the supported ops"
        super().__init__(f"unsupported op `{op}`{where}{why}", hint=hint)
        self.op = op
        self.source = source


class WorkloadFails(UserError):
    """The model itself fails in eager PyTorch on its inputs (an index out of range, say): no
    row is to blame, and nothing can be checked against it."""


class InternalError(Exception):
    """A broken invariant inside the compiler: a bug in emmy, not in the input."""
