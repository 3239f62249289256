"""Compile CUDA C++ to a cubin (and PTX) for a target with NVRTC; no GPU needed.

`compile_cuda(source, target)` returns a `CompileResult`; a compile error is a result with
`ok=False` and the compiler's log, never an exception. `--ptxas-options=-v` is always on and
its report is parsed into `Resources` per kernel. Results are cached on disk by content.
NVRTC's automatic precompiled headers are on (in a per-process folder): the headers emitted
code includes first are parsed once per process, which halves the time of a small kernel and
leaves the cubin unchanged.
"""

from __future__ import annotations

import atexit
import base64
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import cache

from emmy.cuda.cache import INCLUDE_DIR, DiskCache, content_key, include_hash
from emmy.errors import UserError
from emmy.schedule.targets import Target

PROGRAM_NAME = "emmy_kernel.cu"
BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v")
_CACHE = DiskCache("nvrtc")
_CACHE_FORMAT = "2"  # 2: cubins kept byte for byte (1 stripped trailing zero bytes)


@dataclass(frozen=True, slots=True)
class Resources:
    """What ptxas reports for one kernel (shared_bytes is static shared memory only)."""

    registers: int
    shared_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileResult:
    """The outcome of one compile: the cubin, optional PTX, per-kernel resources and the log."""

    ok: bool
    cubin: bytes | None
    ptx: str | None
    resources: dict[str, Resources] = field(default_factory=dict)   # by (mangled) kernel name
    log: str
    seconds: float                     # NVRTC's own time when this result was made
    cached: bool = False

    def resources_of(self, kernel: str | None = None) -> Resources:
        """The resources of `kernel`, or of the only kernel when `kernel` is None."""
        if kernel is not None:
            return self.resources[kernel]
        if len(self.resources) != 1:
            raise KeyError(f"{len(self.resources)} kernels in this result; name one of "
                           f"{sorted(self.resources)}")
        return next(iter(self.resources.values()))

    @property
    def errors(self) -> list[str]:
        """The log's error lines, e.g. `emmy_kernel.cu(7): error: identifier "x" is undefined`."""
        return [line for line in self.log.splitlines() if "error" in line]

    def warnings_of(self, kernel: str) -> tuple[str, ...]:
        """ptxas's performance warnings for `kernel` (see performance_warnings)."""
        return performance_warnings(self.log).get(kernel, ())

    def report_of(self, kernel: str, dynamic_shared_bytes: int) -> dict:
        """What ptxas says of `kernel`, as the evaluator and `emmy run --bench` report it."""
        r = self.resources_of(kernel)
        return {"registers": r.registers, "shared_bytes": r.shared_bytes,
                "dynamic_shared_bytes": dynamic_shared_bytes,
                "spill_bytes": r.spill_store_bytes + r.spill_load_bytes,
                "ptxas_warnings": list(self.warnings_of(kernel))}


def compile_cuda(source: str, target: Target, *, ptx: bool = False,
                 options: tuple[str, ...] = (), use_cache: bool = True) -> CompileResult:
    """Compile `source` for `target` to a cubin (and PTX when `ptx`), through the cache."""
    opts = (target.arch_flag, *BASE_OPTIONS, *options, *include_options())
    key = content_key(_CACHE_FORMAT, source, "\0".join(opts), target.name,
                      nvrtc_version(), include_hash(), str(ptx))
    if use_cache and (hit := _CACHE.get_json(key)) is not None:
        return _from_json(hit)
    result = _compile(source, (*opts, *pch_options()), want_ptx=ptx)
    if use_cache:
        _CACHE.put_json(key, _to_json(result))
    return result


@cache
def nvrtc_version() -> str:
    """NVRTC's version as "major.minor"."""
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


@cache
def include_options() -> tuple[str, ...]:
    """-I options: emmy's headers, then the CUDA runtime and CCCL headers (cuda_fp16.h needs
    both), found by cuda-pathfinder in pip wheels, $CUDA_HOME or /usr/local/cuda."""
    from cuda import pathfinder

    dirs = [str(INCLUDE_DIR)]
    for lib in ("cudart", "cccl"):
        found = pathfinder.find_nvidia_header_directory(lib)
        if found is None:
            raise UserError(f"CUDA headers for `{lib}` not found; NVRTC needs cuda_fp16.h",
                            hint="install the CUDA toolkit, or the pip wheels "
                                 "nvidia-cuda-runtime and nvidia-cuda-cccl (13.0 line)")
        dirs.append(found)
    return tuple(f"-I{d}" for d in dirs)


@cache
def pch_options() -> tuple[str, ...]:
    """Automatic PCH in a folder of this process's own, removed at exit."""
    folder = tempfile.mkdtemp(prefix="emmy-nvrtc-pch-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return ("-pch", f"--pch-dir={folder}")


_PCH_NOTE = re.compile(r'^"[^"]*": .*(precompiled header|PCH).*$\n?', re.M)


def _compile(source: str, opts: tuple[str, ...], *, want_ptx: bool) -> CompileResult:
    from cuda.bindings import nvrtc

    start = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), PROGRAM_NAME.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        seconds = time.perf_counter() - start
        log = _text(_read(nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog, prog))
        log = _PCH_NOTE.sub("", log)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return CompileResult(ok=False, cubin=None, ptx=None, log=log, seconds=seconds)
        cubin = _read(nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, prog)
        text = _text(_read(nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, prog)) if want_ptx else None
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompileResult(ok=True, cubin=cubin, ptx=text, resources=parse_ptxas_log(log),
                         log=log, seconds=seconds)


def _read(size_fn, read_fn, prog) -> bytes:
    """The bytes NVRTC reports, exactly (a cubin may end in zero bytes that belong to it)."""
    err, size = size_fn(prog)
    _check(err, size_fn.__name__)
    buf = b" " * size
    _check(read_fn(prog, buf)[0], read_fn.__name__)
    return buf


def _text(buf: bytes) -> str:
    """NVRTC's logs and PTX are NUL-terminated C strings."""
    return buf.rstrip(b"\0").decode(errors="replace")


def _check(err, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


_LOSS = re.compile(r"\((C\d{4})\) Potential Performance Loss: (.*?)(?: in the function '([^']+)'"
                   r"| for the function '([^']+)')?\.?$")


def performance_warnings(log: str) -> dict[str, tuple[str, ...]]:
    """ptxas's "Potential Performance Loss" notes per entry function, as "C7512: wgmma.mma_async
    instructions are serialized due to insufficient register resources": every wgmma of the
    kernel waits for the one before (C751x), setmaxnreg ignored (C7508), ... A note that names
    no function is every entry's."""
    entries = set(_ENTRY.findall(log))
    found: dict[str, list[str]] = {}
    for line in log.splitlines():
        if m := _LOSS.search(line.strip()):
            named = m.group(3) or m.group(4)
            for name in [named] if named else entries:
                found.setdefault(name, []).append(f"{m.group(1)}: {m.group(2)}")
    return {name: tuple(notes) for name, notes in found.items()}


def parse_ptxas_log(log: str) -> dict[str, Resources]:
    """Resources per entry function from a `ptxas -v` report."""
    found: dict[str, dict[str, int]] = {}
    entry = current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = current = m.group(1)
            found[entry] = dict(registers=0, shared_bytes=0, spill_store_bytes=0,
                                spill_load_bytes=0, stack_bytes=0)
        elif m := _PROPERTIES.search(line):
            current = m.group(1)
        elif (m := _FRAME.search(line)) and current in found:
            found[current].update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                                  spill_load_bytes=int(m.group(3)))
        elif (m := _USED.search(line)) and entry in found:
            found[entry]["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                found[entry]["shared_bytes"] = int(s.group(1))
    return {name: Resources(**values) for name, values in found.items()}


def _to_json(r: CompileResult) -> dict:
    return dict(ok=r.ok, log=r.log, seconds=r.seconds, ptx=r.ptx,
                cubin=base64.b64encode(r.cubin).decode() if r.cubin is not None else None,
                resources={k: asdict(v) for k, v in r.resources.items()})


def _from_json(d: dict) -> CompileResult:
    return CompileResult(ok=d["ok"], log=d["log"], seconds=d["seconds"], ptx=d["ptx"],
                         cubin=base64.b64decode(d["cubin"]) if d["cubin"] is not None else None,
                         resources={k: Resources(**v) for k, v in d["resources"].items()},
                         cached=True)

