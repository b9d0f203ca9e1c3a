"""The persisted-file helper: every file modperf keeps in its cache folder goes through here.

A file is ``MAGIC`` (its format's), a body, and a BLAKE2b digest of everything before it
(:func:`frame`, :func:`unframe`): a file torn by a crash or altered on disk fails its digest and
is a miss, never an answer. The digest is unkeyed: it catches accidents, not forgeries; the
ownership rule (:mod:`modperf.fast.cache_trust`) is what keeps others' files out.

* **Reading** (:func:`read`): through :func:`modperf.fast.cache_trust.read_owned` (no link
  followed; the user's own file, not writable by others, or nothing).
* **Writing** (:func:`write`): through the one write path, :mod:`modperf.base.atomic` (a
  temporary file created exclusively, no link followed, mode 0600, renamed into place), in a
  folder made 0700 where missing; ``durable`` files (keyed tables, catalog scans: costly to
  rebuild) are fsynced, the others (grids, plans) are not (a torn copy fails its digest). A file
  that cannot be written is a note, never an error.
* **The size bound** (:func:`evict`): the files of one kind used longest ago (by modification
  time, which a read refreshes) go first, past a bound in bytes (``MODPERF_CACHE_MAX_BYTES``,
  :func:`max_bytes`) or in files.
* **Notes** (:data:`NOTES`): why the cache was not used, as ``modperf cache info`` lists them.

The formats on top of it: keyed tables and their grids (:mod:`modperf.data.keyed_cache`: a
JSON header and 64-byte-aligned arrays), catalog scans (:mod:`modperf.data.scan_cache`: JSON)
and query plans with what they depend on (:mod:`modperf.fast.plans`: one ``marshal`` value).

The standard library only (a process answering from plans reads through here).
"""

from __future__ import annotations

import os
import threading

from .cache_keys import blake2b
from .cache_trust import make_folder, read_owned

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

#: Bytes of a file's digest.
DIGEST_SIZE = 32
#: ``MODPERF_CACHE_MAX_BYTES``: the bound on each kind of file, in bytes.
MAX_BYTES_ENV = "MODPERF_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 << 30

#: Why the cache was not used, most recent last (one line per distinct reason, at most 20).
NOTES: list[str] = []
_notes_lock = threading.Lock()


def note(message: str) -> None:
    """Keep why the cache was not used (``modperf cache info`` lists it)."""
    with _notes_lock:
        if message not in NOTES:
            NOTES.append(message)
            del NOTES[:-20]


def frame(magic: bytes, body: Iterable[bytes | memoryview]) -> list[bytes | memoryview]:
    """A file's bytes, in pieces: ``magic``, the ``body``'s pieces, and the digest of them all."""
    pieces: list[bytes | memoryview] = [magic, *body]
    h = blake2b(digest_size=DIGEST_SIZE)
    for piece in pieces:
        h.update(piece)
    pieces.append(h.digest())
    return pieces


def unframe(data: bytes | bytearray, magic: bytes) -> memoryview | None:
    """The body of a whole, unaltered file of ``magic``'s format (a view into ``data``: offsets
    in it count from the start of the file); None otherwise."""
    if len(data) < len(magic) + DIGEST_SIZE or data[:len(magic)] != magic:
        return None
    view = memoryview(data)
    if blake2b(view[:-DIGEST_SIZE], digest_size=DIGEST_SIZE).digest() != view[-DIGEST_SIZE:]:
        return None
    return view[:-DIGEST_SIZE]


def read(path: str | os.PathLike[str]) -> bytearray | None:
    """A cache file's bytes where it is the user's own (module doc); None otherwise."""
    return read_owned(path)


def write(path: str | os.PathLike[str], pieces: Sequence[bytes | memoryview], *, durable: bool, failed: str) -> bool:
    """Write a framed file (:func:`frame`) in place of ``path``; False where it cannot be
    written, with a note that starts ``failed`` (e.g. ``"grid not written"``)."""
    from ..base import atomic  # on use: a process that only reads never writes

    folder = os.path.dirname(os.fspath(path))
    try:
        make_folder(folder)
        if durable:
            def copy(handle: object) -> None:
                for piece in pieces:
                    handle.write(piece)  # type: ignore[attr-defined]

            from pathlib import Path

            atomic.write_atomically(Path(path), copy, overwrite=True, mode=0o600)
        else:
            atomic.replace_unsynced(path, pieces)
        return True
    except Exception as exc:  # a file that cannot be written is no cache, never an error
        note(f"{failed} ({folder}): {getattr(exc, 'detail', None) or exc}")
        return False


def max_bytes() -> int:
    """The size bound: ``MODPERF_CACHE_MAX_BYTES`` (a whole number of bytes; 0 keeps only the
    file just written), else :data:`DEFAULT_MAX_BYTES`."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    if text.isascii() and text.isdigit() and len(text) <= 20:
        return int(text)
    note(f"{MAX_BYTES_ENV}={text[:40]!r} is not a whole number of bytes; the bound stays {DEFAULT_MAX_BYTES}")
    return DEFAULT_MAX_BYTES


def files(folder: str | os.PathLike[str], suffixes: str | tuple[str, ...]) -> list[str]:
    """The regular files of a kind (by suffix) in one cache folder, in name order."""
    try:
        with os.scandir(folder) as found:
            return sorted(e.path for e in found if e.name.endswith(suffixes) and e.is_file(follow_symlinks=False))
    except OSError:
        return []


def evict(folder: str | os.PathLike[str], suffixes: str | tuple[str, ...], *,
          keep: str | os.PathLike[str] | None = None, bound_bytes: int | None = None,
          bound_files: int | None = None) -> int:
    """Remove the files of a kind used longest ago until the folder holds at most
    ``bound_bytes`` bytes of them (default :func:`max_bytes`) and, where given, at most
    ``bound_files`` of them; ``keep`` stays. Returns the bytes removed; never raises (a file
    that cannot be removed is left)."""
    bound = max_bytes() if bound_bytes is None else bound_bytes
    keep = None if keep is None else os.fspath(keep)
    found = []
    for path in files(folder, suffixes):
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        found.append((st.st_mtime_ns, st.st_size, path))
    total = sum(size for _, size, _ in found)
    count = len(found)
    removed = 0
    for _, size, path in sorted(found):
        if total <= bound and (bound_files is None or count <= bound_files):
            break
        if path == keep:
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        count -= 1
        removed += size
    return removed


def remove_files(files: Sequence[Path], what: str, folder: Path, suffix: str | tuple[str, ...]) -> None:
    """Remove cache files (one already gone is no failure; one that cannot be removed is a
    typed failure naming it), then the stale temporary files of such files in ``folder``
    (``modperf cache clear``)."""
    import contextlib

    from ..base import atomic
    from ..base.errors import WriteFailedError

    suffixes = (suffix,) if isinstance(suffix, str) else suffix
    for path in files:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise WriteFailedError(f"cannot remove {what}: {exc.strerror or exc}", file=path,
                                   fix="check the cache folder's permissions") from None
    with contextlib.suppress(OSError):
        for temp in atomic.temp_files(folder):
            if temp.name.startswith(".") and any(x in temp.name for x in suffixes) and atomic.is_stale_temp(temp):
                temp.unlink()


__all__ = ["DEFAULT_MAX_BYTES", "DIGEST_SIZE", "MAX_BYTES_ENV", "NOTES", "evict", "files", "frame", "max_bytes", "note",
           "read", "remove_files", "unframe", "write"]
