"""The worker isolates a crash, a hang and an exception; the caller keeps going."""

from __future__ import annotations

import os
import signal
import time

from emmy.bench.worker import RestartAfter, run_each


def behave(item):
    """An item function with every way of failing (module level: workers import it by name)."""
    if item == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if item == "hang":
        time.sleep(600)
    if item == "raise":
        raise ValueError("bad item")
    if item == "restart":
        raise RestartAfter("restarted")
    if item == "pid":
        return os.getpid()
    return item * 2


def test_items_run_in_order_in_one_worker():
    out = run_each(behave, [1, 2, 3, "pid", "pid"], timeout=60)
    assert [o.value for o in out[:3]] == [2, 4, 6]
    assert all(o.ok for o in out)
    assert out[3].value == out[4].value != os.getpid()


def test_crash_and_hang_are_reported_and_the_rest_still_run():
    start = time.monotonic()
    out = run_each(behave, [1, "segfault", 2, "hang", 3, "raise", 4],
                   timeout=[60, 60, 60, 3, 60, 60, 60])
    assert [o.status for o in out] == ["ok", "crash", "ok", "timeout", "ok", "error", "ok"]
    assert "SIGSEGV" in out[1].log
    assert "no result after 3 s" in out[3].log
    assert "ValueError: bad item" in out[5].log
    assert [out[i].value for i in (0, 2, 4, 6)] == [2, 4, 6, 8]
    assert time.monotonic() - start < 40


def test_restart_after_keeps_the_value_and_starts_a_fresh_worker():
    out = run_each(behave, ["pid", "restart", "pid"], timeout=60)
    assert [o.status for o in out] == ["ok", "ok", "ok"]
    assert out[1].value == "restarted"
    assert out[0].value != out[2].value


def test_a_worker_that_cannot_start_fails_every_item():
    out = run_each(behave, [1, 2], timeout=30, python="/bin/false")
    assert [o.status for o in out] == ["crash", "crash"]


def test_on_failure_skips_the_items_it_names():
    def skip_rest_of_group(i, outcome):
        return range(i + 1, 3) if i < 3 else ()

    out = run_each(behave, ["raise", 1, 2, 3, 4], timeout=60, on_failure=skip_rest_of_group)
    assert [o.status for o in out] == ["error", "skipped", "skipped", "ok", "ok"]
    assert "item 0 failed" in out[1].log
    assert [out[3].value, out[4].value] == [6, 8]
