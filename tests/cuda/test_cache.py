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
