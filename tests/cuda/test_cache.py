"""The content-addressed disk cache: keys, atomic writes, the cache folder setting."""

from __future__ import annotations

import threading

from emmy.cuda.cache import DiskCache, cache_root, content_key, folder_hash


def test_content_key_separates_parts():
    assert content_key("ab", "c") != content_key("a", "bc")
    assert content_key("a", b"b") == content_key(b"a", "b")
    assert len(content_key("x")) == 64


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("EMMY_CACHE_DIR")
    assert cache_root().parts[-2:] == (".cache", "emmy")


def test_put_get_and_miss():
    cache = DiskCache("test-basic")
    key = content_key("put-get")
    assert cache.get(key) is None
    path = cache.put(key, b"payload")
    assert cache.get(key) == b"payload" and path.read_bytes() == b"payload"
    cache.put_json(key, {"a": 1})
    assert cache.get_json(key) == {"a": 1}


def test_concurrent_writers_leave_one_whole_entry():
    cache = DiskCache("test-concurrent")
    key = content_key("race")
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=cache.put, args=(key, p)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.get(key) in payloads
    assert [p.name for p in cache.path(key).parent.iterdir()] == [key]   # no temp files left


def test_folder_hash_changes_with_contents(tmp_path):
    (tmp_path / "a.h").write_text("int x;")
    before = folder_hash(tmp_path)
    assert folder_hash(tmp_path) == before
    (tmp_path / "a.h").write_text("int y;")
    assert folder_hash(tmp_path) != before


# ---- size: least recently used artifacts go, the schedule database stays ------------------

def _artifact(root, rel: str, size: int, used: float):
    import os

    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (used, used))
    return path


def test_prune_removes_the_least_recently_used_down_to_90_percent(tmp_path):
    from emmy.cuda.cache import prune

    now = 1_000_000.0
    old = [_artifact(tmp_path, f"nvrtc/ab/old{i}.json", 100, now - 9000 + i) for i in range(5)]
    new = [_artifact(tmp_path, f"emulate/cd/new{i}", 100, now - 3000 + i) for i in range(5)]
    db = _artifact(tmp_path, "schedules.json", 5000, now - 99999)
    assert prune(1000, now=now, root=tmp_path) == (0, 0)          # 1000 bytes fit
    assert prune(700, now=now, root=tmp_path) == (4, 400)         # down to 630: 600 left
    assert [p.exists() for p in old] == [False] * 4 + [True]
    assert all(p.exists() for p in new) and db.exists()


def test_prune_spares_what_was_used_in_the_last_ten_minutes(tmp_path):
    from emmy.cuda.cache import prune

    now = 1_000_000.0
    recent = [_artifact(tmp_path, f"emulate/cd/r{i}", 100, now - 60) for i in range(3)]
    stale = _artifact(tmp_path, "emulate/cd/stale", 100, now - 7200)
    assert prune(100, now=now, root=tmp_path) == (1, 100)
    assert not stale.exists() and all(p.exists() for p in recent)


def test_reading_an_entry_marks_it_used(tmp_path, monkeypatch):
    import os

    from emmy.cuda.cache import entries, prune

    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path))
    cache = DiskCache("nvrtc")
    a, b = content_key("a"), content_key("b")
    for key in (a, b):
        os.utime(cache.put(key, b"y" * 100), (1000.0, 1000.0))
    assert cache.get(a) == b"y" * 100                              # a is used now
    assert {e.path.name for e in entries()} == {a, b}
    assert prune(150, grace_s=0) == (1, 100)
    assert cache.get(a) is not None and cache.get(b) is None


def test_a_prebuilt_folder_goes_whole(tmp_path):
    from emmy.cuda.cache import entries, prune

    now = 1_000_000.0
    _artifact(tmp_path, "emulate/prebuilt/k1/emu_pch.h", 10, now - 5000)
    _artifact(tmp_path, "emulate/prebuilt/k1/emu_pch.h.gch", 500, now - 4000)
    _artifact(tmp_path, "emulate/prebuilt/k2/emu_runtime.o", 100, now - 100)
    found = {e.path.name: e for e in entries(tmp_path)}
    assert set(found) == {"k1", "k2"} and found["k1"].bytes == 510
    assert found["k1"].used == now - 4000
    assert prune(200, now=now, root=tmp_path, grace_s=0) == (1, 510)
    assert not (tmp_path / "emulate/prebuilt/k1").exists()
    assert (tmp_path / "emulate/prebuilt/k2/emu_runtime.o").exists()


def test_writers_prune_at_most_hourly(tmp_path, monkeypatch):
    import os
    import time

    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMMY_CACHE_MAX_MB", "0.0001")             # 104 bytes
    stale = _artifact(tmp_path, "nvrtc/ab/stale", 1000, time.time() - 7200)
    cache = DiskCache("nvrtc")
    cache.put(content_key("first"), b"z")                         # prunes: the mark is new
    assert not stale.exists() and (tmp_path / ".pruned").exists()
    stale = _artifact(tmp_path, "nvrtc/ab/stale", 1000, time.time() - 7200)
    cache.put(content_key("second"), b"z")                        # pruned a moment ago
    assert stale.exists()
    os.utime(tmp_path / ".pruned", (time.time() - 4000,) * 2)
    cache.put(content_key("third"), b"z")
    assert not stale.exists()


def test_emmy_cache_reports_prunes_and_clears(tmp_path, monkeypatch, capsys):
    import re
    import time

    from emmy.cli import main

    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path))
    for i in range(4):
        _artifact(tmp_path, f"nvrtc/ab/e{i}.json", 400_000, time.time() - 9000 + i)
    _artifact(tmp_path, "emulate/cd/bin", 300_000, time.time() - 9000)
    db = _artifact(tmp_path, "schedules.json", 10, time.time())
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"nvrtc +4 artifact\(s\) +1.5 MB", out) and "limit 2048 MB" in out
    assert main(["cache", "--prune", "--max-mb", "1"]) == 0
    assert "removed 3 artifact(s), 1.0 MB" in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 2 artifact(s)" in out and re.search(r"total +0 artifact\(s\) +0.0 MB", out)
    assert db.exists()


def test_emmy_cache_refuses_a_bad_limit(monkeypatch, capsys):
    from emmy.cli import main

    assert main(["cache", "--max-mb", "5"]) == 2
    assert "--max-mb is the limit --prune holds to" in capsys.readouterr().err
    monkeypatch.setenv("EMMY_CACHE_MAX_MB", "lots")
    assert main(["cache"]) == 2
    assert "EMMY_CACHE_MAX_MB='lots'" in capsys.readouterr().err
