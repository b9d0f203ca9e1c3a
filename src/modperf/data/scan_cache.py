"""The catalog scan of a data root, remembered across processes (issue 10: a process that asks
one thing should not list ~900 folders and parse every ``reuse.yaml`` first).

**What is kept.** One file per data root (``<cache folder>/catalogs/<digest>.mpc``): the
version folders the scan found (their table files, reuse declarations and the releases that a
library table filed in a framework folder records) and what that depended on: every folder it
listed, with the ``stat`` taken *before* listing it (device, inode, mode, ``mtime_ns``,
``ctime_ns``), a digest of the bytes of every ``reuse.yaml`` it parsed, and the identity (size,
``mtime_ns``, footer digest) of every table file whose rows it read, taken before reading.

**Never stale.** A later process uses the record only when every one of those folders still
stats the same, every ``reuse.yaml`` still holds the same bytes and every table file read has
the same identity; otherwise it scans again (so where a misplaced library table is served
follows its file, its release's folder and every other claimant).
A folder's mtime and ctime change whenever an entry is added, removed or renamed in it (and
ctime on a permission change; neither can be put back: ``os.utime`` sets ctime to now), and
every part of the catalog but the sidecars comes from folder listings. What a listing cannot
vouch for makes the scan unrecorded: a symbolic link among the folders or table files (its
meaning depends on where it points), a temporary file (whether its writer still runs), any
problem the scan found (check reports those; the record would hide them), and a folder changed
within :data:`RACY_NS` of the scan (a timestamp has a granularity: a change in the same tick as
the scan could leave it unchanged). The record holds modperf's version and a digest of the
scan's code, and a BLAKE2b digest of all of its bytes: a record of another release, truncated or
altered is scanned again and replaced.

**GPU spec documents.** A query's grid reads its system's GPU spec file (YAML, through
:func:`modperf.specs.roofline.gpu_spec`). The record keeps the parsed document of each system's spec
file with a digest of its text; a process served by the record hands a document to gpu_spec
only while the file still holds that text (read and compared once per process), so it needs no
YAML parser; a changed file is parsed as always.

Failures degrade like the keyed-table cache's (:mod:`modperf.fast.persist` frames, reads, writes
and bounds both): a record that cannot be read is a scan, one that cannot be written is a note.
A record is read only from a trusted cache folder and only when the opened file is the user's
and no one else can write it, and is written as the cache's files are
(:mod:`modperf.fast.cache_trust`); it is JSON (plain data). The cache's switches turn this off
too (``cache=False``, ``--no-cache``, ``MODPERF_NO_CACHE``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import jsonio
from ..base.errors import ModperfError
from ..base.meta import __version__
from ..fast import persist
from ..fast.cache_keys import (
    CATALOGS_FOLDER,
    cache_folder,
    content_digest,
    embedded_systems_dir,
    package_sources,
    scan_unchanged,
    source_digest,
    table_key,
)
from ..fast.cache_trust import read_owned
from ..specs.roofline import known_document, spec_document
from .catalog import Catalog, Reuse, VersionFolder, resolve_data_root, scan_folders

FORMAT = 1
MAGIC = b"MODPERF-CATALOG\x01"
SUFFIX = ".mpc"
FOLDER = CATALOGS_FOLDER
#: A record is not written while a folder it lists changed this recently (nanoseconds): a change
#: within one timestamp tick of the scan would leave the folder's times as the record holds them.
RACY_NS = 2_000_000_000
#: The records kept (one per data root); past it the one used longest ago is removed.
MAX_RECORDS = 32
#: The code whose behaviour a record stands for.
_SOURCES = ("data/catalog.py", "data/scan_cache.py", "fast/cache_keys.py", "fast/persist.py", "data/footer.py",
            "data/reader.py", "base/atomic.py", "base/limits.py", "specs/roofline.py", "base/jsonio.py", "base/meta.py")


@functools.cache
def code_fingerprint() -> str:
    return source_digest(f"{__version__}\0{FORMAT}\0", package_sources(*_SOURCES))


def _sidecar_digest(data: bytes) -> str:
    return content_digest(data)


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_mode, st.st_mtime_ns, st.st_ctime_ns]


class Recorder:
    """A :class:`modperf.data.catalog.ScanWatch` that keeps what a scan depended on."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.started_ns = time.time_ns()
        self.folders: list[tuple[str, list[int]]] = []
        self.sidecars: list[tuple[str, str]] = []
        self.tables: list[tuple[str, list[Any]]] = []
        self.why_not: str | None = None

    def _relative(self, path: Path) -> str:
        text = str(path)
        if text == self.root:
            return ""
        if text.startswith(self.root + os.sep):  # how a scan builds its paths
            return text[len(self.root) + 1:]
        return os.path.relpath(text, self.root)

    def folder(self, path: Path) -> None:
        try:
            st = os.stat(path)
        except OSError:
            self.why_not = self.why_not or f"cannot stat {path}"
            return
        if max(st.st_mtime_ns, st.st_ctime_ns) > self.started_ns - RACY_NS:
            self.why_not = self.why_not or f"{path} changed just now"
        self.folders.append((self._relative(path), _stat_key(st)))

    def sidecar(self, path: Path, data: bytes | None) -> None:
        if data is None:
            if os.path.islink(path):  # a link to nothing: what it points at may appear
                self.untrusted(path)
            return
        self.sidecars.append((self._relative(path), _sidecar_digest(data)))

    def untrusted(self, path: Path) -> None:
        self.why_not = self.why_not or f"{path} is a symbolic link or a temporary file"

    def table(self, path: Path) -> None:
        key = table_key(str(path))  # taken before the scan reads it, as a folder's stat before its listing
        if key is None:
            self.why_not = self.why_not or f"cannot read {path}"
            return
        if key[1] > self.started_ns - RACY_NS:
            self.why_not = self.why_not or f"{path} changed just now"
        self.tables.append((self._relative(path), key))


# --- the record -------------------------------------------------------------------------------


def _identity(root: Path) -> dict[str, Any]:
    # the root as an absolute path (a relative one names another folder from another working
    # folder); the catalog's paths stay as the caller gave the root, as a scan's do
    return {"format": FORMAT, "code": code_fingerprint(), "root": os.path.abspath(root)}


def record_path(root: Path, folder: Path | None = None) -> Path:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{os.path.abspath(root)}\0{code_fingerprint()}".encode())
    return (folder or Path(cache_folder())) / FOLDER / (h.hexdigest() + SUFFIX)


def _exact_json(value: Any) -> bool:
    """Whether JSON gives ``value`` back as it is (types included)."""
    kind = type(value)
    if value is None or kind in (str, bool, int):
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list:
        return all(_exact_json(v) for v in value)
    if kind is dict:
        return all(type(k) is str and _exact_json(v) for k, v in value.items())
    return False


def _spec_documents(systems: set[str]) -> list[list[Any]]:
    """[file, digest of its text, document] of the GPU spec file of each system (what
    :func:`modperf.specs.roofline.gpu_spec` reads), each document tagged so that it comes back as it
    was (integer keys, tuples; :func:`modperf.base.jsonio.tagged`) where JSON can hold it exactly."""
    try:
        folder = embedded_systems_dir()
    except Exception:  # no embedded corpus: gpu_spec reads no file either
        return []
    out = []
    for system in sorted(systems):
        path = folder / f"{system}.yaml"
        try:
            if not path.is_file():
                continue
            text = path.read_text()
        except (OSError, ValueError):
            continue
        tagged = jsonio.tagged(spec_document(text))
        if _exact_json(tagged):
            out.append([str(path), _sidecar_digest(text.encode()), tagged])
    return out


def _hand_over_documents(documents: list[list[Any]]) -> None:
    """Give gpu_spec the remembered documents whose files still hold the same text."""
    for file, digest, tagged in documents:
        try:
            text = Path(file).read_text()
        except (OSError, ValueError):
            continue
        if _sidecar_digest(text.encode()) == digest:
            known_document(text, jsonio.untagged(tagged))


def encode(catalog_folders: list[VersionFolder], recorder: Recorder, root: Path) -> bytes:
    versions = []
    for f in catalog_folders:
        versions.append([f.system, f.family_dir, f.backend, f.version,
                         sorted([stem, path.name] for stem, path in f.files.items()),
                         sorted([stem, r.from_version, r.reason, r.approved_by] for stem, r in f.reuse.items()),
                         sorted([stem, list(recorded)] for stem, recorded in f.releases.items())])
    documents = _spec_documents({f.system for f in catalog_folders})
    body = jsonio.dumps({"identity": _identity(root), "folders": recorder.folders, "sidecars": recorder.sidecars,
                         "tables": recorder.tables, "versions": versions, "documents": documents},
                        separators=(",", ":")).encode()
    return b"".join(persist.frame(MAGIC, [body]))


def _current(doc: dict[str, Any], root: Path) -> bool:
    """Whether a scan of ``root`` now would depend on the same folders, sidecars and tables."""
    return scan_unchanged(str(root), doc["folders"], doc["sidecars"], doc["tables"])


def decode(data: bytes | bytearray, root: Path) -> Catalog | None:
    """The catalog a record holds, when the record is whole, of this code and still current."""
    body = persist.unframe(data, MAGIC)
    if body is None:
        return None
    doc = json.loads(bytes(body[len(MAGIC):]))
    if doc["identity"] != _identity(root) or not _current(doc, root):
        return None
    folders = []
    backends: dict[tuple[str, str, str], Path] = {}  # the scan's paths, each parent built once
    for system, family_dir, backend, version, files, reuse, releases in doc["versions"]:
        parent = backends.get((system, family_dir, backend))
        if parent is None:
            parent = backends[system, family_dir, backend] = root / system / family_dir / backend
        path = parent / version
        folders.append(VersionFolder(path, system, family_dir, backend, version,
                                     files={stem: path / name for stem, name in files},
                                     reuse={stem: Reuse(*r) for stem, *r in reuse},
                                     releases={stem: tuple(recorded) for stem, recorded in releases}))
    catalog = Catalog.of_folders(root, folders, [])
    catalog.watched = (doc["folders"], doc["sidecars"], doc["tables"])
    _hand_over_documents(doc["documents"])
    return catalog


# --- the cache --------------------------------------------------------------------------------


def scan(root: str | os.PathLike[str] | None = None, *, folder: Path | None = None) -> Catalog:
    """The catalog of ``root`` (as :meth:`Catalog.scan`): from its record when that is whole and
    current, else scanned (and recorded when the scan can be trusted later)."""
    root_path = resolve_data_root(root)
    try:
        entry = record_path(root_path, folder)
    except Exception as exc:  # no cache folder (no home folder to put it in): a plain scan
        persist.note(f"catalog scan not recorded: {exc}")
        return Catalog.scan(root_path)
    data = read_owned(entry)
    if data is not None:
        try:
            found = decode(data, root_path)
        except (ValueError, KeyError, TypeError):
            found = None
        if found is not None:
            with contextlib.suppress(OSError):
                os.utime(entry)  # used now: the bound removes the records used longest ago
            return found
    recorder = Recorder(root_path)
    problems: list[ModperfError] = []
    folders = list(scan_folders(root_path, problems, recorder))
    catalog = Catalog.of_folders(root_path, folders, problems)
    if recorder.why_not is None and not catalog.problems:
        if store(entry, encode(folders, recorder, root_path)):
            catalog.watched = (recorder.folders, recorder.sidecars, recorder.tables)
    elif data is not None:  # a record that no longer holds: not read again by every process
        with contextlib.suppress(OSError):
            entry.unlink()
    return catalog


def store(entry: Path, data: bytes) -> bool:
    """Write one record (fsynced); False (with a note) when it cannot be written. At most
    :data:`MAX_RECORDS` are kept, the ones used longest ago going first."""
    if not persist.write(entry, [data], durable=True, failed="catalog scan not recorded"):
        return False
    persist.evict(entry.parent, SUFFIX, keep=entry, bound_files=MAX_RECORDS)
    return True


@dataclass
class Record:
    """One remembered scan: its file, size and data root."""

    file: Path
    bytes: int
    root: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"file": str(self.file), "bytes": self.bytes, "data_root": self.root}


def records(cache_folder: Path) -> list[Record]:
    """The scan records in a cache folder (``modperf cache info``)."""
    out = []
    for name in persist.files(cache_folder / FOLDER, SUFFIX):
        path = Path(name)
        data = read_owned(path)
        if data is None:  # (not the user's own file: listed, never read)
            with contextlib.suppress(OSError):
                out.append(Record(path, path.stat().st_size, None))
            continue
        root = None
        if data.startswith(MAGIC) and len(data) > len(MAGIC) + persist.DIGEST_SIZE:
            try:
                root = json.loads(data[len(MAGIC):-persist.DIGEST_SIZE])["identity"]["root"]
            except (ValueError, KeyError, TypeError):
                root = None
        out.append(Record(path, len(data), root))
    return out


def clear(cache_folder: Path) -> list[Record]:
    """Remove every scan record (and leftover temporary files of records)."""
    removed = records(cache_folder)
    persist.remove_files([r.file for r in removed], "a catalog scan record", cache_folder / FOLDER, SUFFIX)
    return removed


__all__ = ["FOLDER", "MAGIC", "RACY_NS", "SUFFIX", "Record", "Recorder", "clear", "records", "scan", "store"]
