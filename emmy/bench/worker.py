"""Run items in a worker process, each under a time limit: a crash (a signal, an illegal memory
access that kills the process), a hang or an exception comes back as a failed `Outcome` and the
caller goes on with the next item in a fresh worker.

    outcomes = run_each(fn, items, timeout=60)

`fn` must be importable by name (a module-level function) and the items picklable. One worker
serves items in order until one fails; the parent reads each result as soon as it is written,
so it knows which item was in flight when the worker died or stopped answering.
The worker side is `python -m emmy.bench.worker REQUEST RESULTS`.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

POLL_S = 0.02
EXIT_GRACE_S = 30.0          # a worker that has answered everything gets this long to exit
_HEADER = struct.Struct("<Q")


@dataclass(frozen=True)
class Outcome:
    """What one item gave: its value when `status` is ok, else the reason in `log`."""

    status: str          # ok | error | crash | timeout | skipped
    value: Any = None
    log: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class RestartAfter(Exception):
    """Raised by an item function: `value` is the item's result, but this worker process must
    not serve another item (e.g. a CUDA error left its context unusable)."""

    def __init__(self, value: Any):
        super().__init__("restart the worker after this item")
        self.value = value


def run_each(fn: Callable[[Any], Any], items: Sequence[Any], *,
             timeout: float | Sequence[float] = 60.0, python: str | None = None,
             on_failure: Callable[[int, Outcome], Iterable[int]] | None = None) -> list[Outcome]:
    """`fn(item)` for every item in worker processes; one Outcome per item, in order.
    `on_failure(i, outcome)` may name later items not to run after item i failed; they come
    back as `skipped`."""
    items = list(items)
    limits = [float(timeout)] * len(items) if isinstance(timeout, (int, float)) else list(timeout)
    if len(limits) != len(items):
        raise ValueError("one timeout per item, or a single one for all")
    outcomes: list[Outcome | None] = [None] * len(items)
    while pending := [i for i, o in enumerate(outcomes) if o is None]:
        failed = _one_worker(fn, items, limits, pending, outcomes, python or sys.executable)
        for i in failed:
            for j in (on_failure(i, outcomes[i]) if on_failure else ()):
                if outcomes[j] is None:
                    outcomes[j] = Outcome("skipped", log=f"skipped: item {i} failed "
                                                         f"({outcomes[i].status})")
    return outcomes  # type: ignore[return-value]


def _one_worker(fn, items, limits, pending: list[int], outcomes, python) -> list[int]:
    """Serve the pending items in one process until it finishes, fails or is killed; fills
    `outcomes` and returns the indices of the items that failed."""
    with tempfile.TemporaryDirectory(prefix="emmy-worker-") as tmp:
        request, results, log = Path(tmp) / "request.pkl", Path(tmp) / "results", Path(tmp) / "log"
        request.write_bytes(pickle.dumps((fn, [(i, items[i]) for i in pending])))
        results.touch()
        with open(log, "wb") as log_file:
            proc = subprocess.Popen([python, "-m", "emmy.bench.worker", str(request), str(results)],
                                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                    env=_child_env(), start_new_session=True)
        reader = _FrameReader(results)
        pos, ready, since, failed = 0, False, time.monotonic(), []

        def settle(frames) -> None:
            nonlocal pos, ready, since
            for kind, payload in frames:
                if kind == "ready":
                    ready = True
                    continue
                i, outcome = payload
                outcomes[i] = outcome
                if not outcome.ok:
                    failed.append(i)
                pos, since = pending.index(i) + 1, time.monotonic()

        try:
            while True:
                settle(reader.frames())
                if pos == len(pending):
                    try:
                        proc.wait(timeout=EXIT_GRACE_S)   # else `finally` kills it: all is read
                    except subprocess.TimeoutExpired:
                        pass
                    return failed
                code = proc.poll()
                if code is not None:
                    settle(reader.frames())                  # written just before it exited
                    if pos == len(pending) or (code == 0 and pos > 0):
                        return failed                        # it stopped on purpose
                    why = f"worker {_describe_exit(code)}\n{_tail(log)}"
                    if not ready:                            # it never got to the first item
                        for i in pending[pos:]:
                            outcomes[i] = Outcome("crash", log=f"worker failed to start: {why}")
                        return failed + pending[pos:]
                    i = pending[pos]
                    outcomes[i] = Outcome("crash", log=why, seconds=time.monotonic() - since)
                    return failed + [i]
                i = pending[pos]
                if time.monotonic() - since > limits[i]:
                    _kill(proc)
                    outcomes[i] = Outcome(
                        "timeout", log=f"no result after {limits[i]:g} s; worker killed\n"
                                       f"{_tail(log)}", seconds=time.monotonic() - since)
                    return failed + [i]
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:
                _kill(proc)


def _child_env() -> dict[str, str]:
    """The parent's environment, with its import path, so `fn` imports the same way there."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _kill(proc: subprocess.Popen) -> None:
    """Kill the worker and everything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _tail(path: Path, n: int = 4000) -> str:
    try:
        text = path.read_bytes().decode(errors="replace")
    except OSError:
        return ""
    return text if len(text) <= n else "…" + text[-n:]


class _FrameReader:
    """Reads the length-prefixed pickled frames a worker appends; a partial frame waits."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def frames(self) -> list[tuple[str, Any]]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        out, pos = [], 0
        while pos + _HEADER.size <= len(data):
            (n,) = _HEADER.unpack_from(data, pos)
            if pos + _HEADER.size + n > len(data):
                break
            out.append(pickle.loads(data[pos + _HEADER.size: pos + _HEADER.size + n]))
            pos += _HEADER.size + n
        self.offset += pos
        return out


def _write(out, frame: tuple[str, Any]) -> None:
    data = pickle.dumps(frame)
    out.write(_HEADER.pack(len(data)) + data)
    out.flush()


def _serve(request: Path, results: Path) -> None:
    fn, items = pickle.loads(request.read_bytes())
    with open(results, "ab") as out:
        _write(out, ("ready", None))
        for index, item in items:
            t0 = time.perf_counter()
            stop = False
            try:
                outcome = Outcome("ok", fn(item), seconds=time.perf_counter() - t0)
            except RestartAfter as r:
                outcome, stop = Outcome("ok", r.value, seconds=time.perf_counter() - t0), True
            except BaseException:  # the item failed: report it, and start clean for the next
                outcome = Outcome("error", log=traceback.format_exc(),
                                  seconds=time.perf_counter() - t0)
                stop = True
            try:
                _write(out, ("item", (index, outcome)))
            except Exception:
                _write(out, ("item", (index, Outcome(
                    "error", log=f"the result could not be pickled:\n{traceback.format_exc()}",
                    seconds=outcome.seconds))))
                stop = True
            if stop:
                return


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.exit("usage: python -m emmy.bench.worker REQUEST RESULTS")
    _serve(Path(args[0]), Path(args[1]))


if __name__ == "__main__":
    # Run the module's own copy, not this `__main__` one: results pickle as
    # `emmy.bench.worker.Outcome`, and `RestartAfter` raised by items is the class caught here.
    from emmy.bench.worker import main as _main

    _main()
