"""SASS, the machine code a row became: NVRTC's cubin disassembled by `cuobjdump`.

cuobjdump comes with the CUDA toolkit and as a pip wheel (`nvidia-cuda-cuobjdump`, which the
README's setup installs); it is looked for on PATH, then in that wheel, then in $CUDA_HOME.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from emmy.errors import UserError


@cache
def cuobjdump() -> str | None:
    """The cuobjdump executable, or None when there is none."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    roots = [Path(p) / "nvidia" for p in sys.path if p and Path(p, "nvidia").is_dir()]
    for root in roots:
        for candidate in sorted(root.glob("*/bin/cuobjdump")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidate = Path(home) / "bin" / "cuobjdump"
    return str(candidate) if os.access(candidate, os.X_OK) else None


def disassemble(cubin: bytes) -> str:
    """`cuobjdump --dump-sass` of a cubin."""
    tool = cuobjdump()
    if tool is None:
        raise UserError("--ir sass needs cuobjdump; none was found on PATH, in the "
                        "nvidia-cuda-cuobjdump wheel or in $CUDA_HOME",
                        hint='pip install "nvidia-cuda-cuobjdump>=13.0" (the README\'s setup '
                             "does), or put the CUDA toolkit's bin/ on PATH")
    with tempfile.TemporaryDirectory(prefix="emmy-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([tool, "--dump-sass", str(path)], capture_output=True, text=True,
                              timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def instructions(sass: str) -> list[str]:
    """The opcodes of a SASS listing, in order (`HMMA.16816.F32`, `LDSM.16.M88.4`, ...)."""
    out = []
    for line in sass.splitlines():
        if "/*" in line and ";" in line:
            code = line.split("*/", 1)[-1].split(";", 1)[0].strip()
            if code.startswith("@"):
                code = code.split(None, 1)[-1] if " " in code else code
            if code:
                out.append(code.split()[0])
    return out
