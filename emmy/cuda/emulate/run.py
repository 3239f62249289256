"""Run CUDA kernel source on the CPU: build it with g++ against cuda_emulate.h, launch, read back.

`build_and_run(source, kernel, grid, block, dynamic_smem, args, cluster=1)` writes a harness
around the source, compiles it into the on-disk cache (one program serves every `extern "C"`
kernel of a source and every shape: the launch and the arguments are read at run time), runs it
on the arguments (numpy arrays and scalars) and copies the arrays back in place; `cluster`
groups the blocks into thread-block clusters (sm_90), which the emulator runs together. A
compile error, a crash, a deadlock or a timeout comes back as an `EmulatorResult` with that
status, never as an exception. What no kernel changes is built once into the cache: the
runtime (emu_runtime.cpp: runtime_object), linked into every program, and the headers every
program includes first (emu_pch.h, precompiled: precompiled_dir).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Sequence

import numpy as np

from emmy.cuda.cache import (EMULATE_DIR, INCLUDE_DIR, DiskCache, content_key, folder_hash,
                             include_hash, mark_used, maybe_prune)

CXX = os.environ.get("CXX", "g++")
CXX_FLAGS = ("-std=c++20", "-O1", "-pthread", "-fno-strict-aliasing")
EXIT_EMULATOR_ERROR = 3          # the emulator's fail(): deadlock, __trap, bad arguments
_CACHE = DiskCache("emulate")
_FORMAT = "1"

Dim = int | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorMapArg:
    """A TMA tensor map over array argument `array` (its index among the arguments): what
    cuTensorMapEncodeTiled is given on a GPU. Dimension 0 is the contiguous one; `strides` are
    the byte strides of dimensions 1.. (dimension 0's is the element size). The kernel receives
    a pointer to the emulator's 128-byte map (emmy_emu::TensorMap)."""

    array: int
    elem_bytes: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 1            # 0 none, 1 128-byte, 2 64-byte, 3 32-byte
    offset_bytes: int = 0       # from the array's start to the tensor's first element

    def encode(self) -> bytes:
        rank = len(self.dims)
        if not 1 <= rank <= 4 or len(self.box) != rank or len(self.strides) != rank - 1:
            raise ValueError(f"a tensor map of rank 1..4 with matching box and strides: {self}")
        pad = (0,) * (4 - rank)
        return struct.pack("<IIIII4Q4Q4IQ", 3, self.array, rank, self.elem_bytes, self.swizzle,
                           *self.dims, *pad, self.elem_bytes, *self.strides, *pad,
                           *self.box, *pad, self.offset_bytes)


Arg = np.ndarray | int | float | bool | np.generic | TensorMapArg


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorResult:
    """The outcome of one emulated launch; `outputs` are the array arguments, updated."""

    status: str                  # ok | compile_error | crash | timeout | error
    log: str                     # the compiler's output, or what the program wrote to stderr
    stdout: str = ""             # the kernel's printf output
    outputs: tuple[np.ndarray, ...] = ()
    build_seconds: float = 0.0   # 0 when the binary came from the cache
    run_seconds: float = 0.0
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class Build:
    """A compiled emulator program, or the reason there is none."""

    binary: Path | None
    log: str
    seconds: float
    cached: bool


def build_and_run(source: str, kernel_name: str, grid: Dim, block: Dim, dynamic_smem: int = 0,
                  args: Sequence[Arg] = (), *, timeout: float = 60.0,
                  workers: int | None = None, cluster: Dim = 1) -> EmulatorResult:
    """Build `source` (cached), launch `kernel_name` on `args`, copy arrays back in place.
    `cluster`: blocks per thread-block cluster (sm_90), an int (along x) or up to three dims;
    the grid must be a multiple of it, and a cluster at most 8 blocks."""
    built = build(source, kernel_name)
    if built.binary is None:
        return EmulatorResult(status="compile_error", log=built.log,
                              build_seconds=built.seconds)
    declared = declared_cluster(source, kernel_name)
    if declared is not None:                 # on a GPU the declaration fixes the clusters
        if _dims(cluster) not in ((1, 1, 1), declared):
            return EmulatorResult(status="error", log=(
                f"emmy-emulate: {kernel_name} is declared with clusters of {declared} blocks "
                f"but launched with {_dims(cluster)}"))
        cluster = declared
    ran = _run(built.binary, kernel_name, grid, block, dynamic_smem, args, timeout=timeout,
               workers=workers, cluster=cluster)
    return EmulatorResult(status=ran.status, log=ran.log, stdout=ran.stdout, outputs=ran.outputs,
                          build_seconds=0.0 if built.cached else built.seconds,
                          run_seconds=ran.run_seconds, cached=built.cached)


def build(source: str, kernel_name: str) -> Build:
    """The emulator binary for `source` with `kernel_name` as its entry, from cache or g++."""
    text = harness_source(source, kernel_name)
    key = _program_key(text)
    final = _CACHE.path(key)
    if final.exists():
        mark_used(final)
        return Build(final, "", 0.0, cached=True)
    runtime, log = runtime_object()
    if runtime is None:
        return Build(None, log, 0.0, cached=False)
    out, proc, seconds = _compile(text, key, runtime)
    if out is None:
        return Build(None, _failure(proc), seconds, cached=False)
    os.replace(out, final)
    maybe_prune()
    return Build(final, proc.stderr, seconds, cached=False)


def build_together(sources: Sequence[tuple[str, str]]) -> int:
    """Build the programs for `sources` ((source, kernel name) pairs, as build() takes them)
    that the cache lacks in one g++ run: each source's code in a namespace of its own, one
    main() that dispatches on every kernel's name, the binary stored under each source's key
    (any of its kernels can run from it). A program's dozen kernels build in about a third of
    the time they take one by one (the precompiled headers read, the harness instantiated and
    the program linked once, not a dozen times). Where they cannot go together (an #include
    other than emmy's device headers, which the precompiled header has, or a kernel name
    twice) or g++ refuses the whole, nothing is stored: build() then builds each on its own
    and reports its own errors. Returns how many sources were built."""
    missing: dict[str, tuple[str, str]] = {}
    for source, name in sources:
        key = _program_key(harness_source(source, name))
        if key not in missing and not _CACHE.path(key).exists():
            missing[key] = (source, name)
    if len(missing) < 2:
        return 0
    bodies = [_DEVICE_INCLUDE.sub("", source) for source, _ in missing.values()]
    names = [k for source, name in missing.values() for k in entry_points(source, name)]
    if len(set(names)) < len(names) or any(_ANY_INCLUDE.search(_COMMENT.sub("", b))
                                           for b in bodies):
        return 0
    runtime, _ = runtime_object()
    if runtime is None:
        return 0
    units, calls = [], []
    for i, (body, (source, name)) in enumerate(zip(bodies, missing.values())):
        units.append(f'namespace emmy_unit_{i} {{\n#line 1 "kernel.cu"\n'
                     f"{rewrite_dynamic_shared(body)}\n}}  // namespace emmy_unit_{i}\n")
        calls += [_dispatch(k, f"emmy_unit_{i}::") for k in entry_points(source, name)]
    text = f'#include "{PCH_HEADER}"\n{"".join(units)}{_main(calls)}'
    keys = list(missing)
    out, _, _ = _compile(text, keys[0], runtime)
    if out is None:
        return 0
    for key in keys[1:]:
        link = _CACHE.temp_path(key)
        link.unlink()
        try:
            os.link(out, link)
        except OSError:
            shutil.copy(out, link)          # the file and its mode
        os.replace(link, _CACHE.path(key))
    os.replace(out, _CACHE.path(keys[0]))
    maybe_prune()
    return len(keys)


_DEVICE_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"emmy_\w+\.cuh"[ \t]*$', re.M)
_ANY_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b", re.M)


def _program_key(text: str) -> str:
    """The cache key of the program built from `text` (a harness_source)."""
    return content_key(_FORMAT, text, *_toolchain())


def _toolchain() -> tuple[str, ...]:
    """What every build depends on besides its source: flags, compiler, headers (read on each
    call, so an edited header is a new key)."""
    return (" ".join(CXX_FLAGS), compiler_version(), folder_hash(EMULATE_DIR), include_hash())


def _compile(text: str, key: str, runtime: Path):
    """g++ on `text` into a temporary path beside `key`'s entry: (that path or None on a
    failure, g++'s process, seconds)."""
    with tempfile.TemporaryDirectory(prefix="emmy-emu-") as tmp:
        src = Path(tmp) / "harness.cpp"
        src.write_text(text)
        out = _CACHE.temp_path(key)
        start = time.perf_counter()
        proc = subprocess.run(compile_command(src, out, runtime), capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        return None, proc, seconds
    return out, proc, seconds


def compile_command(src: Path, out: Path, runtime: Path) -> list[str]:
    """The g++ command that builds the program `src` (a harness_source) into `out`, linked with
    the `runtime` object (runtime_object)."""
    pch = precompiled_dir()
    return [CXX, *CXX_FLAGS, *([f"-I{pch}"] if pch else []), f"-I{EMULATE_DIR}",
            f"-I{INCLUDE_DIR}", *linker_flags(), "-o", str(out), str(src), str(runtime)]


@cache
def linker_flags() -> tuple[str, ...]:
    """`-fuse-ld=gold` where g++ links a C++ program with it (LINK_PROBE, built once per
    toolchain into the prebuilt folder): it links in a third of the default linker's time (0.05 s
    of a build's 0.4 s), the same program. Else nothing: some toolchains offer gold, but gold
    there cannot find their libstdc++."""
    try:
        probe, _ = _prebuilt("link_probe", ["-fuse-ld=gold", LINK_PROBE], [LINK_PROBE])
    except OSError:
        return ()
    return ("-fuse-ld=gold",) if probe else ()


PCH_HEADER = "emu_pch.h"         # in EMULATE_DIR: the headers every program includes first
RUNTIME_SOURCE = "emu_runtime.cpp"  # in EMULATE_DIR: what no kernel changes, compiled once
LINK_PROBE = "link_probe.cpp"    # in EMULATE_DIR: a program that needs libstdc++ (linker_flags)
_FAILED: dict[Path, str] = {}    # prebuilt files g++ could not build (this process): its log


def _prebuilt(name: str, args: Sequence[str],
              inputs: Sequence[str] = ()) -> tuple[Path | None, str]:
    """`name` in the prebuilt folder (one per compiler, flags and header contents, in the cache),
    built on first use by `g++ CXX_FLAGS -I.. args -o <tmp>` from a temporary folder holding
    copies of the EMULATE_DIR files `inputs` (args name them relative to it); each file is
    renamed into place, atomically, so concurrent builders all succeed. (path, "") or (None,
    g++'s log)."""
    key = content_key(_FORMAT, *_toolchain())
    folder = _CACHE.folder / "prebuilt" / key[:32]
    target = folder / name
    if target.exists():
        mark_used(target)
        return target, ""
    if target in _FAILED:
        return None, _FAILED[target]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
        for f in inputs:
            (Path(tmp) / f).write_bytes((EMULATE_DIR / f).read_bytes())
        proc = subprocess.run([CXX, *CXX_FLAGS, f"-I{EMULATE_DIR}", f"-I{INCLUDE_DIR}", *args,
                               "-o", name], cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            _FAILED[target] = _failure(proc)
            return None, _FAILED[target]
        for f in (*inputs, name):        # the inputs first: a .gch is read only beside its header
            os.replace(Path(tmp) / f, folder / f)
    return target, ""


def runtime_object() -> tuple[Path | None, str]:
    """emu_runtime.cpp compiled (the fiber scheduler, the launch over worker threads, the
    argument file: half of what g++ compiled for each kernel before), or None and g++'s log."""
    return _prebuilt("emu_runtime.o", ["-c", str(EMULATE_DIR / RUNTIME_SOURCE)])


def precompiled_dir() -> Path | None:
    """The prebuilt folder where it holds a copy of emu_pch.h and g++'s precompiled form of it
    (emu_pch.h.gch). Put before EMULATE_DIR on the include path, it makes each build read the
    headers' parsed form instead of parsing them again (a third of a build's time). None where
    g++ cannot precompile it: builds then parse the header in EMULATE_DIR, the same program."""
    gch, _ = _prebuilt(f"{PCH_HEADER}.gch", ["-x", "c++-header", PCH_HEADER], [PCH_HEADER])
    return gch.parent if gch else None


def _failure(proc: subprocess.CompletedProcess) -> str:
    """What a failed g++ run said, or (where it said nothing) its command and exit status."""
    return proc.stderr or f"`{' '.join(proc.args)}` exited with status {proc.returncode}"


@cache
def compiler_version() -> str:
    """`g++ --version`'s first line (part of the cache key)."""
    proc = subprocess.run([CXX, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.stdout else CXX


_EXTERN_SHARED = re.compile(
    r"(?:__align__\s*\(\s*\d+\s*\)\s+)?extern\s+"
    r"(?P<quals>(?:(?:__shared__|__align__\s*\(\s*\d+\s*\)|alignas\s*\(\s*\d+\s*\))\s+)+)"
    r"(?P<type>[A-Za-z_][\w:<>, ]*?)\s*(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*;")


def rewrite_dynamic_shared(source: str) -> str:
    """`extern __shared__ T name[];` -> a pointer to the block's dynamic shared memory."""
    def pointer(m: re.Match) -> str:
        if "__shared__" not in m.group("quals"):
            return m.group(0)
        t, name = m.group("type").strip(), m.group("name")
        return f"{t}* const {name} = reinterpret_cast<{t}*>(emmy_emu::dynamic_shared());"
    return _EXTERN_SHARED.sub(pointer, source)


_ATTRIBUTES = r"(?:(?:__launch_bounds__|__cluster_dims__|EMMY_CLUSTER_DIMS)\s*\([^)]*\)\s*)*"
_C_KERNEL = re.compile(
    rf'extern\s+"C"\s+__global__\s+{_ATTRIBUTES}void\s+'
    rf"{_ATTRIBUTES}(?P<name>[A-Za-z_]\w*)\s*\(")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def declared_cluster(source: str, kernel_name: str) -> tuple[int, int, int] | None:
    """The cluster dims in `kernel_name`'s declaration (EMMY_CLUSTER_DIMS or __cluster_dims__,
    which the GPU takes from there and the emulator from the launch), or None."""
    for m in _C_KERNEL.finditer(_COMMENT.sub("", source)):
        if m.group("name") == kernel_name:
            dims = _CLUSTER_DIMS.search(m.group(0))
            return tuple(int(d) for d in dims.groups()) if dims else None  # type: ignore
    return None


_CLUSTER_DIMS = re.compile(r"(?:__cluster_dims__|EMMY_CLUSTER_DIMS)\s*\(\s*(\d+)\s*,\s*(\d+)\s*,"
                           r"\s*(\d+)\s*\)")


def entry_points(source: str, kernel_name: str) -> tuple[str, ...]:
    """`kernel_name` and every `extern "C"` kernel in `source`: one binary serves them all."""
    found = _C_KERNEL.findall(_COMMENT.sub("", source))
    return tuple(sorted({kernel_name, *found}))


def harness_source(source: str, kernel_name: str) -> str:
    """The whole C++ program: emulation header, the kernel source, a main() that dispatches on
    the kernel's name."""
    calls = [_dispatch(k) for k in entry_points(source, kernel_name)]
    return (f'#include "{PCH_HEADER}"\n#line 1 "kernel.cu"\n{rewrite_dynamic_shared(source)}\n'
            + _main(calls))


def _dispatch(kernel: str, scope: str = "") -> str:
    return (f'    if (!std::strcmp(name, "{kernel}"))\n'
            f"        return emmy_emu::harness_main(argc, argv, &{scope}{kernel});\n")


def _main(calls: Sequence[str]) -> str:
    return (f"int main(int argc, char** argv) {{\n"
            f'    const char* name = argc > 3 ? argv[3] : "";\n{"".join(calls)}'
            f'    emmy_emu::fail("no kernel named `%s` in this program", name);\n}}\n')


@dataclass(frozen=True, slots=True)
class _Ran:
    status: str
    log: str
    stdout: str
    outputs: tuple[np.ndarray, ...]
    run_seconds: float


def _run(binary: Path, kernel_name: str, grid: Dim, block: Dim, dynamic_smem: int,
         args: Sequence[Arg], *, timeout: float, workers: int | None, cluster: Dim = 1) -> _Ran:
    """Run a built program on `args`; arrays are copied back in place when it succeeds."""
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    for a in arrays:
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError("array arguments must be C-contiguous and writeable")
    env = dict(os.environ)
    if workers is not None:
        env["EMMY_EMU_WORKERS"] = str(workers)
    with tempfile.TemporaryDirectory(prefix="emmy-emu-run-") as tmp:
        arg_file, out_file = Path(tmp) / "args.bin", Path(tmp) / "out.bin"
        arg_file.write_bytes(encode_args(grid, block, dynamic_smem, args, cluster))
        start = time.perf_counter()
        try:
            proc = subprocess.run([str(binary), str(arg_file), str(out_file), kernel_name],
                                  env=env, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            return _Ran("timeout", f"killed after {timeout:g} s\n{_text(e.stderr)}",
                        _text(e.stdout), tuple(arrays), time.perf_counter() - start)
        seconds = time.perf_counter() - start
        stdout, stderr = _text(proc.stdout), _text(proc.stderr)
        if proc.returncode != 0:
            status = "error" if proc.returncode == EXIT_EMULATOR_ERROR else "crash"
            why = stderr or f"exit status {proc.returncode}"
            return _Ran(status, why, stdout, tuple(arrays), seconds)
        decode_outputs(out_file.read_bytes(), arrays)
    return _Ran("ok", stderr, stdout, tuple(arrays), seconds)


def _dims(d: Dim) -> tuple[int, int, int]:
    t = (d,) if isinstance(d, int) else tuple(d)
    if not 1 <= len(t) <= 3:
        raise ValueError(f"a launch dimension has 1 to 3 entries, got {d!r}")
    return (*t, *(1,) * (3 - len(t)))  # type: ignore[return-value]


def encode_args(grid: Dim, block: Dim, dynamic_smem: int, args: Sequence[Arg],
                cluster: Dim = 1) -> bytes:
    """The argument file the program reads (emu_harness.h describes it)."""
    parts = [b"EMMYARG2", struct.pack("<9IQI", *_dims(grid), *_dims(block), *_dims(cluster),
                                      dynamic_smem, len(args))]
    for a in args:
        if isinstance(a, np.ndarray):
            parts += [struct.pack("<IQ", 0, a.nbytes), a.tobytes()]
        elif isinstance(a, TensorMapArg):
            parts.append(a.encode())
        elif isinstance(a, (bool, int, np.integer, np.bool_)):
            parts.append(struct.pack("<Iq", 1, int(a)))
        elif isinstance(a, (float, np.floating)):
            parts.append(struct.pack("<Id", 2, float(a)))
        else:
            raise TypeError(f"unsupported kernel argument of type {type(a).__name__}")
    return b"".join(parts)


def decode_outputs(data: bytes, arrays: Sequence[np.ndarray]) -> None:
    """Copy the program's output file back into `arrays`, in order."""
    pos = 0
    for a in arrays:
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        if n != a.nbytes:
            raise RuntimeError(f"emulator returned {n} bytes for an array of {a.nbytes}")
        np.copyto(a, np.frombuffer(data, dtype=a.dtype, count=a.size, offset=pos).reshape(a.shape))
        pos += n


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode(errors="replace")
