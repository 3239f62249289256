"""A content-addressed on-disk cache for compiled artifacts (NVRTC results, emulator binaries).

Keys are sha256 digests of everything that determines the artifact, so an upgrade of the
compiler, a header or an option changes the key and stale entries are simply never read.
Writers write a temporary file in the same folder and rename it into place, which is atomic
on POSIX: concurrent writers of one key both succeed and readers never see a partial file.

Each folder under the cache root holds one kind of artifact; files at the root (the schedule
database, emmy.schedule.db) are not artifacts and are never removed here. The artifacts are
held to a size ($EMMY_CACHE_MAX_MB, default 2048; 0: no limit): reading an entry marks it used,
and at most once an hour a writer removes the least recently used entries until they fit in 90%
of it (`prune`). An entry used in the last ten minutes stays: another process may be about to
read it. A folder of prebuilt emulator parts (emulate/prebuilt/<key>) goes or stays whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "EMMY_CACHE_DIR"
MAX_ENV = "EMMY_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048
GRACE_S = 600.0          # an entry used this recently is never removed
PRUNE_EVERY_S = 3600.0   # writers prune at most this often
PRUNED_MARK = ".pruned"  # at the root: its mtime is the last prune
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
        """The stored bytes (the entry marked used), or None on a miss."""
        path = self.path(key, suffix)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        mark_used(path)
        return data

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
        maybe_prune()
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


# ---- size -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One artifact (a file, or a folder of prebuilt parts kept or removed whole)."""

    path: Path
    kind: str             # the folder under the root it lives in
    bytes: int
    used: float           # when last written or read (mtime; the newest file of a folder)


def mark_used(path: Path) -> None:
    """Record that `path` (an entry, or a file in a prebuilt folder) was just used."""
    try:
        os.utime(path)
    except OSError:
        pass


def max_bytes() -> int | None:
    """The artifacts' size limit ($EMMY_CACHE_MAX_MB), None for no limit. A value that is not
    a number of megabytes >= 0 is a UserError."""
    from emmy.errors import UserError

    text = os.environ.get(MAX_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_MB << 20
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        raise UserError(f"{MAX_ENV}={text!r}: give the cache's size limit in megabytes "
                        f"(0: no limit)")
    return int(mb * (1 << 20)) or None


def entries(root: Path | None = None) -> list[Entry]:
    """Every artifact under the cache root (files at the root itself are not artifacts)."""
    root = root or cache_root()
    found = []
    try:
        kinds = [d for d in root.iterdir() if d.is_dir()]
    except OSError:
        return []
    for folder in kinds:
        for path, dirs, files in os.walk(folder):
            here = Path(path)
            if here.name == "prebuilt" and here.parent == folder:
                for d in dirs:                        # one entry per prebuilt folder
                    found.append(_folder_entry(here / d, folder.name))
                dirs.clear()
            for f in files:
                try:
                    st = (here / f).stat()
                except OSError:
                    continue
                found.append(Entry(here / f, folder.name, st.st_size, st.st_mtime))
    return found


def _folder_entry(folder: Path, kind: str) -> Entry:
    size, used = 0, 0.0
    for path in folder.rglob("*"):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            size += st.st_size
        used = max(used, st.st_mtime)
    return Entry(folder, kind, size, used or folder.stat().st_mtime)


def prune(limit: int | None, *, grace_s: float = GRACE_S, now: float | None = None,
          root: Path | None = None) -> tuple[int, int]:
    """Remove the least recently used artifacts until they fit in 90% of `limit` bytes (none
    used in the last `grace_s` seconds); (entries removed, bytes freed)."""
    if limit is None:
        return 0, 0
    found = entries(root)
    total = sum(e.bytes for e in found)
    if total <= limit:
        return 0, 0
    now = time.time() if now is None else now
    victims, left = [], total
    for e in sorted(found, key=lambda e: e.used):
        if left <= 0.9 * limit or now - e.used < grace_s:
            break                          # small enough, or the rest were used more recently
        victims.append(e)
        left -= e.bytes
    return _remove(victims)


def clear(root: Path | None = None) -> tuple[int, int]:
    """Remove every artifact (the schedule database stays); (entries removed, bytes freed)."""
    return _remove(entries(root))


def maybe_prune() -> None:
    """Prune to max_bytes() if no one has in the last PRUNE_EVERY_S seconds (a writer calls
    this after adding an entry); a bad limit or an unwritable mark skips it."""
    from emmy.errors import UserError

    mark = cache_root() / PRUNED_MARK
    try:
        if time.time() - mark.stat().st_mtime < PRUNE_EVERY_S:
            return
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
        prune(max_bytes())
    except (OSError, UserError):
        return


def _remove(victims: list[Entry]) -> tuple[int, int]:
    """Remove the entries (files, or prebuilt folders); (entries removed, bytes freed)."""
    removed = freed = 0
    for e in victims:
        try:
            if e.path.is_dir():
                shutil.rmtree(e.path)
            else:
                e.path.unlink()
        except OSError:
            continue
        removed += 1
        freed += e.bytes
    return removed, freed
