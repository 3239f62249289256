"""A content-addressed on-disk cache for compiled artifacts (NVRTC results, emulator binaries).

Keys are sha256 digests of everything that determines the artifact, so an upgrade of the
compiler, a header or an option changes the key and stale entries are simply never read.
Writers write a temporary file in the same folder and rename it into place, which is atomic
on POSIX: concurrent writers of one key both succeed and readers never see a partial file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "EMMY_CACHE_DIR"
INCLUDE_DIR = Path(__file__).parent / "include"
EMULATE_DIR = Path(__file__).parent / "emulate"


def cache_root() -> Path:
    """The cache folder: $EMMY_CACHE_DIR, else ~/.cache/emmy (read on each call)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "emmy"


def content_key(*parts: str | bytes) -> str:
    """sha256 of the parts, each length-prefixed so that ("ab", "c") != ("a", "bc")."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def folder_hash(folder: Path) -> str:
    """sha256 over the relative names and contents of every file under `folder`."""
    parts: list[str | bytes] = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".py":
            parts += [str(path.relative_to(folder)), path.read_bytes()]
    return content_key(*parts)


def include_hash() -> str:
    """Hash of emmy/cuda/include: the headers every emitted kernel includes."""
    return folder_hash(INCLUDE_DIR)


@dataclass(frozen=True, slots=True)
class DiskCache:
    """One kind of artifact (`kind` names a subfolder of the cache root)."""

    kind: str

    @property
    def folder(self) -> Path:
        return cache_root() / self.kind

    def path(self, key: str, suffix: str = "") -> Path:
        """Where the entry for `key` lives (two-character fan-out keeps folders small)."""
        return self.folder / key[:2] / f"{key}{suffix}"

    def get(self, key: str, suffix: str = "") -> bytes | None:
        """The stored bytes, or None on a miss."""
        try:
            return self.path(key, suffix).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def put(self, key: str, data: bytes, suffix: str = "") -> Path:
        """Store `data` atomically; returns the entry's path."""
        final = self.path(key, suffix)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return final

    def temp_path(self, key: str) -> Path:
        """A fresh temporary path beside the entry, for tools that write their own output."""
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        os.close(fd)
        return Path(tmp)

    def get_json(self, key: str) -> dict | None:
        """The stored JSON object, or None on a miss or an unreadable entry."""
        data = self.get(key, ".json")
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def put_json(self, key: str, obj: dict) -> Path:
        """Store a JSON object atomically."""
        return self.put(key, json.dumps(obj, sort_keys=True).encode(), ".json")
