"""SASS, the machine code a row became: NVRTC's cubin disassembled by `cuobjdump`.

cuobjdump comes with the CUDA toolkit and as pip wheels (`nvidia-cuda-cuobjdump`, and
`nvidia-cuda-nvdisasm`, which it runs to print SASS; the README's setup installs both); each is
looked for on PATH, then in those wheels, then in $CUDA_HOME.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from emmy.errors import UserError


@cache
def tool(name: str) -> str | None:
    """The executable `name` (cuobjdump, nvdisasm), or None when there is none."""
    found = shutil.which(name)
    if found:
        return found
    roots = [Path(p) / "nvidia" for p in sys.path if p and Path(p, "nvidia").is_dir()]
    for root in roots:
        for candidate in sorted(root.glob(f"*/bin/{name}")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidate = Path(home) / "bin" / name
    return str(candidate) if os.access(candidate, os.X_OK) else None


def cuobjdump() -> str | None:
    """cuobjdump, when it can print SASS (it needs nvidia's nvdisasm too); else None."""
    return tool("cuobjdump") if tool("nvdisasm") else None


def disassemble(cubin: bytes) -> str:
    """`cuobjdump --dump-sass` of a cubin."""
    missing = [n for n in ("cuobjdump", "nvdisasm") if tool(n) is None]
    if missing:
        raise UserError(f"--ir sass needs cuobjdump and nvdisasm; {' and '.join(missing)} "
                        f"{'was' if len(missing) == 1 else 'were'} found neither on PATH, in the "
                        "nvidia wheels nor in $CUDA_HOME",
                        hint='pip install "nvidia-cuda-cuobjdump>=13.0" "nvidia-cuda-nvdisasm>=13.0" '
                             "(the README's setup does), or put the CUDA toolkit's bin/ on PATH")
    env = {**os.environ, "NVDISASM_PATH": str(Path(tool("nvdisasm")).parent)}
    with tempfile.TemporaryDirectory(prefix="emmy-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([tool("cuobjdump"), "--dump-sass", str(path)], capture_output=True,
                              text=True, timeout=120, env=env)
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


def longest_loop(sass: str) -> list[str]:
    """The opcodes of a SASS listing's longest loop (from a backward branch's target to the
    branch): a matrix product's K loop, whose instruction count per K step says what
    computing an operand as its tiles are filled costs (emmy.runtime.costmodel.gemm)."""
    code = [(int(m[1], 16), m[2], line) for line in sass.splitlines()
            if (m := _ADDRESSED.search(line))]
    loops = [(int(m[1], 16), at) for at, text, _ in code
             if (m := _BRANCH.search(text)) and int(m[1], 16) < at]
    if not loops:
        return []
    lo, hi = max(loops, key=lambda lp: lp[1] - lp[0])
    return instructions("\n".join(line for at, _, line in code if lo <= at <= hi))


_ADDRESSED = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"\bBRA\s+(0x[0-9a-f]+)")
