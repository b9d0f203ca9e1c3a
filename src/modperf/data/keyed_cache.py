"""The persisted cache of keyed tables: what loading and keying a table file builds
(:class:`modperf.data.buckets.KeyedTable`), stored once in the user's cache folder so that the next
process answers from it instead of reading, validating and keying the file again.

**Where.** ``$MODPERF_CACHE_DIR``, else ``$XDG_CACHE_HOME/modperf``, else ``~/.cache/modperf``.
``MODPERF_NO_CACHE=1`` (the CLI's ``--no-cache``) or ``modperf.open(cache=False)`` turn it off.

**One entry, one file** (``<digest>.mpk``): a header (JSON: the entry's identity, the keyed
table's plain fields, and where each array lies), the arrays (raw bytes, 64-byte aligned), and
a BLAKE2b digest of everything before it. The file name is a digest of the entry's identity,
so entries of different model-config sets or modperf versions sit side by side.

**Never stale, never corrupt.** An entry is served only when every part of its identity equals
the one computed now:

* the source file's absolute path, size and ``mtime_ns``, and a content digest: for parquet,
  the file's footer (its metadata: the schema, every row group's row count, every column
  chunk's offsets, sizes and statistics), for anything else the whole file. The footer is
  enough beside size and mtime: a rewrite that changes any value changes a chunk's
  statistics, sizes or offsets (which the footer records) or, failing that, the file's mtime;
  reading the footer costs one small read where hashing the data would cost reading it all;
* modperf's version and a digest of the source of the keying pipeline (every family
  declaration, the reader, validation, conventions, keying and the keyed guards);
* the model configs the load resolves models against (each config file's path, size and
  mtime): a table's native buckets come from them.

Reading an entry checks its digest over every byte first, so a truncated or altered file is
rebuilt, never served. Entries are written through :mod:`modperf.base.atomic` (a temporary file
beside it, fsync, rename), so a reader sees a whole old entry or a whole new one; two processes
filling the cache at once each write a complete entry and the last rename wins. A source that
changes while it is being keyed (its stat differs before and after) is not stored.

**Grids beside the entries.** A table's grids (:class:`modperf.query.interp.Grid`: the lattice of one
group and its fill) are built on first use per group; what the fill computes is kept in
``grids/<digest>.mpg`` (one file per grid, the same layout and digest as an entry), so that the
next process restores the grid instead of filling it again. A grid file is used only when its
identity equals the one computed now: the identity of the table's entry (all of the above), the
group's key, the system and its GPU spec (the roofline), the grid's axes and extrapolation
limit, numpy's version, and a digest of the code that builds grids (:data:`_GRID_CODE`, beside
the keying pipeline's). A grid file is written only for a table that came from (or went to)
its entry, without fsync: a file torn by a crash fails its digest and is rebuilt. Grid files
are bounded apart from the entries, by the same size bound.

**Only the user's own files.** The cache is used only where its folder tree is the user's and
no one else can write it, and each file is read only when the opened file is the user's and no
one else can write it (:mod:`modperf.fast.cache_trust`); otherwise the cache is off for the process,
said once on stderr and by ``modperf cache info``. Entries are written as temporary files
created exclusively without following a link (mode 0600) and renamed into place; folders are
made 0700. A header is JSON and an array is read with ``numpy.frombuffer`` from a numeric
dtype only (no object dtype, no pickle): an entry loads plain data.

**Failures degrade.** A cache folder that cannot be created or written (read-only, full disk)
or an entry that cannot be read means no cache for that table: the table is loaded from its
file as without a cache, and a note says why (:data:`modperf.fast.persist.NOTES`, ``modperf cache
info``). Framing, reading, writing and the size bound are :mod:`modperf.fast.persist`'s.
Nothing here raises past :func:`load_keyed` except the loader's own errors.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..base.jsonio import dumps, tagged, untagged
from ..base.meta import __version__
from ..fast import persist
from ..fast.cache_keys import (
    GRIDS_FOLDER,
    cache_folder,
    package_sources,
    source_digest,
    source_identity,
)
from ..fast.cache_trust import open_owned, read_owned
from .buckets import Agreement, BucketColumns, KeyedTable

if TYPE_CHECKING:
    from ..specs.models import ModelRegistry
    from .catalog import TableRef

#: The format of an entry; bumped when the layout changes (part of every entry's identity).
FORMAT = 2  # 2: axes and source counts stored in their narrowest integer types
MAGIC = b"MODPERF-KEYED\x00\x00\x02"
SUFFIX = ".mpk"
_ALIGN = 64
_LEN = struct.Struct("<Q")
#: The kinds of dtype an array of an entry or a grid file may have (booleans and numbers:
#: plain bytes, never objects).
_ARRAY_KINDS = frozenset("biuf")

def cache_dir() -> Path:
    """The cache folder (it may not exist yet; :func:`modperf.fast.cache_keys.cache_folder`)."""
    return Path(cache_folder())


# --- identity ---------------------------------------------------------------------------------

#: Modules whose code decides what a keyed table holds (besides every family declaration).
_PIPELINE = ("data/reader.py", "data/validate.py", "data/conventions.py", "data/buckets.py", "data/keyed_guards.py",
             "data/codes.py", "specs/models.py", "base/limits.py", "data/keyed_cache.py", "base/meta.py",
             "data/families")


@functools.cache
def pipeline_fingerprint() -> str:
    """A digest of modperf's version and the source of the keying pipeline and of every family
    declaration: a change to any of them (an edited declaration, another release) makes every
    entry a miss."""
    return source_digest(f"{__version__}\0{FORMAT}\0", package_sources(*_PIPELINE))


def registry_fingerprint(models: ModelRegistry) -> str:
    """A digest of the model configs a registry resolves (id, file, size, mtime)."""
    h = hashlib.blake2b(digest_size=16)
    for model_id, path in sorted(models._paths.items()):
        try:
            st = path.stat()
            h.update(f"{model_id}\0{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{model_id}\0{path}\0?\n".encode())
    return h.hexdigest()


def _entry_name(source: dict[str, Any], registry_fp: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{source['path']}\0{pipeline_fingerprint()}\0{registry_fp}".encode())
    return h.hexdigest() + SUFFIX


# --- encoding ---------------------------------------------------------------------------------


def _arrays(keyed: KeyedTable) -> dict[str, np.ndarray]:
    out = {"offsets": keyed.offsets, "latency": keyed.latency, "sources": keyed.sources,
           "bucket_native": keyed.bucket_native, "bucket_local": keyed.bucket_local}
    for name, values in keyed.axes.items():
        out[f"axis:{name}"] = values
    if keyed.duplicate_spread is not None:
        out["duplicate_spread"] = keyed.duplicate_spread
    if keyed.bucket_columns is not None:
        for name, codes in keyed.bucket_columns.codes.items():
            out[f"codes:{name}"] = codes
    return out


def _meta(keyed: KeyedTable) -> dict[str, Any]:
    agreement = keyed.agreement
    return tagged({
        "table": keyed.ref.table, "key_names": keyed.key_names, "axes": tuple(keyed.axes),
        "bucket_models": keyed.bucket_models, "model_native": keyed.model_native,
        "model_geometry": keyed.model_geometry, "rows_read": keyed.rows_read,
        "duplicates_merged": keyed.duplicates_merged, "alias_duplicate_points": keyed.alias_duplicate_points,
        "agreement": None if agreement is None else (agreement.natives, agreement.shared_keys, agreement.median,
                                                      agreement.p95, agreement.max),
        "missing_optional": keyed.missing_optional, "natives_seen": keyed.natives_seen,
        "recorded_versions": keyed.recorded_versions, "rows_stored": keyed.rows_stored,
        "bucket_values": None if keyed.bucket_columns is None else keyed.bucket_columns.values,
        "bucket_keys_plain": keyed.bucket_columns is None,
        "bucket_keys": keyed.bucket_keys if keyed.bucket_columns is None else None,
        "n_buckets": keyed.n_buckets,
    })


def encode(keyed: KeyedTable, identity: dict[str, Any]) -> list[bytes | memoryview]:
    """An entry's bytes, in pieces (header, arrays, digest)."""
    return _frame(MAGIC, {"identity": identity, "meta": _meta(keyed)}, _arrays(keyed))


def _frame(magic: bytes, header_fields: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[bytes | memoryview]:
    """The bytes of an entry or a grid file, in pieces (:func:`modperf.fast.persist.frame`):
    ``magic``, the header's length, the JSON header (``header_fields`` and where each array
    lies), the arrays 64-byte aligned (from the start of the file), and the digest."""
    layout = []
    contiguous = {}
    offset = 0
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        contiguous[name] = arr
        layout.append([name, arr.dtype.str, list(arr.shape), offset, arr.nbytes])
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    header = dumps({**header_fields, "arrays": layout}, separators=(",", ":")).encode()
    head = _LEN.pack(len(header)) + header
    head += b"\0" * (-(len(magic) + len(head)) % _ALIGN)
    body: list[bytes | memoryview] = [head]
    for arr in contiguous.values():
        nbytes = int(arr.nbytes)
        body.append(arr.view(np.uint8).reshape(-1).data if nbytes else b"")
        body.append(b"\0" * (-nbytes % _ALIGN))
    return persist.frame(magic, body)


def _unframe(buf: bytearray, magic: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(header, arrays) of :func:`_frame`'s bytes, or None when they are not a whole, unaltered
    frame of ``magic`` (the digest over every byte is checked first). The arrays are views into
    ``buf`` (no copy)."""
    view = persist.unframe(buf, magic)
    if view is None or len(view) < len(magic) + _LEN.size:
        return None
    (n,) = _LEN.unpack_from(view, len(magic))
    start = len(magic) + _LEN.size
    header = json.loads(bytes(view[start:start + n]))
    data = start + n + (-(start + n) % _ALIGN)
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset, nbytes in header["arrays"]:
        dt = np.dtype(dtype)
        if dt.kind not in _ARRAY_KINDS or dt.hasobject or dt.fields is not None or dt.subdtype is not None:
            raise ValueError(f"array {name!r} of dtype {dtype!r}: not numbers")
        count = nbytes // dt.itemsize if dt.itemsize else 0
        arrays[name] = np.frombuffer(buf, dtype=dt, count=count, offset=data + offset).reshape(shape)
    return header, arrays


def read_header(path: Path) -> dict[str, Any] | None:
    """An entry's header (its identity and layout) without reading its arrays; None when the
    file is not an entry."""
    fd = open_owned(path)
    if fd is None:
        return None
    try:
        with open(fd, "rb") as f:
            start = f.read(len(MAGIC) + _LEN.size)
            if len(start) < len(MAGIC) + _LEN.size or start[:len(MAGIC)] != MAGIC:
                return None
            (n,) = _LEN.unpack(start[len(MAGIC):])
            if n > 1 << 30:
                return None
            header: dict[str, Any] = json.loads(f.read(n))
            return header
    except (OSError, ValueError):
        return None


def decode(buf: bytearray, ref: TableRef) -> tuple[dict[str, Any], KeyedTable] | None:
    """(identity, keyed table) from an entry's bytes, or None when the bytes are not a whole,
    unaltered entry. The arrays are views into ``buf`` (no copy)."""
    from .families import family_of

    framed = _unframe(buf, MAGIC)
    if framed is None:
        return None
    header, arrays = framed
    meta = untagged(header["meta"])
    family = family_of(ref.table)
    if family is None or meta["table"] != ref.table:
        return None
    key_names = tuple(meta["key_names"])
    values = meta["bucket_values"]
    columns = None
    if values is not None:
        codes = {name: arrays[f"codes:{name}"] for name in key_names}
        columns = BucketColumns(codes, values)
        decoded = [np.asarray(values[name], dtype=object)[codes[name]].tolist() if len(values[name]) else []
                   for name in key_names]
        bucket_keys = list(zip(*decoded)) if decoded else [()] * meta["n_buckets"]
    else:
        bucket_keys = [tuple(k) for k in meta["bucket_keys"]]
    agreement = None
    if meta["agreement"] is not None:
        natives, shared, median, p95, top = meta["agreement"]
        agreement = Agreement(tuple(natives), shared, median, p95, top)
    keyed = KeyedTable(
        ref=ref, family=family, spec=family.spec(ref.table), key_names=key_names, bucket_keys=bucket_keys,
        offsets=arrays["offsets"], axes={a: arrays[f"axis:{a}"] for a in meta["axes"]},
        latency=arrays["latency"], sources=arrays["sources"], bucket_models=[tuple(m) for m in meta["bucket_models"]],
        bucket_native=arrays["bucket_native"], bucket_local=arrays["bucket_local"],
        model_native=meta["model_native"], model_geometry=meta["model_geometry"], rows_read=meta["rows_read"],
        duplicates_merged=meta["duplicates_merged"], alias_duplicate_points=meta["alias_duplicate_points"],
        agreement=agreement, missing_optional=tuple(meta["missing_optional"]),
        natives_seen=tuple(meta["natives_seen"]), duplicate_spread=arrays.get("duplicate_spread"),
        recorded_versions=tuple(meta["recorded_versions"]), rows_stored=meta["rows_stored"],
        bucket_columns=columns)
    return header["identity"], keyed


# --- the cache --------------------------------------------------------------------------------


def load_keyed(ref: TableRef, models: ModelRegistry, build: Callable[[TableRef, ModelRegistry], KeyedTable],
               *, registry_fp: str | None = None, folder: Path | None = None) -> KeyedTable:
    """The keyed table of ``ref``: from its cache entry when that entry is whole and its
    identity is today's, else ``build(ref, models)`` (stored for next time when it can be)."""
    source = source_identity(ref.path)
    if source is None:
        return build(ref, models)
    registry_fp = registry_fp or registry_fingerprint(models)
    identity = {"format": FORMAT, "pipeline": pipeline_fingerprint(), "models": registry_fp, "source": source}
    folder = folder or cache_dir()
    entry = folder / _entry_name(source, registry_fp)
    buf = read_owned(entry)
    if buf is not None:
        try:
            found = decode(buf, ref)
        except (ValueError, KeyError, TypeError, IndexError):
            found = None
        if found is not None and found[0] == identity:
            with contextlib.suppress(OSError):
                os.utime(entry)  # used now: the size bound removes the entries used longest ago
            found[1].cache_home = _home(folder, identity)
            found[1].cache_source = source
            return found[1]
    keyed = build(ref, models)
    if source_identity(ref.path) == source and store(entry, keyed, identity):  # unchanged while keyed
        keyed.cache_home = _home(folder, identity)
        keyed.cache_source = source
    return keyed


def store(entry: Path, keyed: KeyedTable, identity: dict[str, Any]) -> bool:
    """Write one entry (fsynced: costly to build again); False (with a note) when it cannot be
    written."""
    if not persist.write(entry, encode(keyed, identity), durable=True, failed="cache not written"):
        return False
    persist.evict(entry.parent, SUFFIX, keep=entry)
    return True


# --- grids ------------------------------------------------------------------------------------

#: The folder of grid files inside the cache folder.
GRIDS = GRIDS_FOLDER
#: The format of a grid file; bumped when its layout changes (part of every grid's identity).
GRID_FORMAT = 1
GRID_MAGIC = b"MODPERF-GRID\x00\x00\x00\x01"
GRID_SUFFIX = ".mpg"
#: Modules whose code decides what a grid holds, beside the keying pipeline (its lattice and
#: fill, the roofline it extrapolates with, and the choice of a group's points).
_GRID_CODE = ("query/interp.py", "specs/roofline.py", "query/engine.py")


@functools.cache
def grid_fingerprint() -> str:
    """A digest of the keying pipeline's fingerprint, numpy's version (the fill's arithmetic)
    and the source of the modules that build grids."""
    return source_digest(f"{pipeline_fingerprint()}\0{GRID_FORMAT}\0{np.__version__}\0",
                         package_sources(*_GRID_CODE))


def _home(folder: Path, identity: dict[str, Any]) -> tuple[str, str]:
    """(cache folder, digest of an entry's identity): where a keyed table's grids are kept."""
    text = dumps(identity, sort_keys=True, separators=(",", ":"))
    return str(folder), hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def grid_identity(home: tuple[str, str], group: tuple[Any, ...], system: str | None, gpu: Any,
                  axes: tuple[str, ...], heads_axis: str | None, limit: float) -> dict[str, Any]:
    """Everything one group's grid is built from, beside the table's entry (see module doc)."""
    return {"format": GRID_FORMAT, "code": grid_fingerprint(), "table": home[1], "group": tagged(group),
            "system": system, "gpu": repr(gpu), "axes": list(axes), "heads_axis": heads_axis,
            "limit": repr(float(limit))}


def _grid_path(home: tuple[str, str], identity: dict[str, Any]) -> Path:
    text = dumps(identity, sort_keys=True, separators=(",", ":"))
    return Path(home[0]) / GRIDS / (hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + GRID_SUFFIX)


def encode_grid(identity: dict[str, Any], parts: dict[str, np.ndarray]) -> list[bytes | memoryview]:
    """A grid file's bytes, in pieces (header, arrays, digest): an entry's layout."""
    return _frame(GRID_MAGIC, {"identity": identity}, parts)


def decode_grid(buf: bytearray) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(identity, arrays) from a grid file's bytes, or None when they are not a whole,
    unaltered grid file. The arrays are views into ``buf``."""
    framed = _unframe(buf, GRID_MAGIC)
    return None if framed is None else (framed[0]["identity"], framed[1])


def load_grid(home: tuple[str, str], identity: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The stored parts of the grid of ``identity`` (:meth:`modperf.query.interp.Grid.fill_parts`),
    or None when there is no whole grid file of exactly that identity."""
    path = _grid_path(home, identity)
    buf = read_owned(path)
    if buf is None:
        return None
    try:
        found = decode_grid(buf)
    except (ValueError, KeyError, TypeError, IndexError):
        found = None
    if found is None or found[0] != identity:
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used now (the size bound)
    return found[1]


def store_grid(home: tuple[str, str], identity: dict[str, Any], parts: dict[str, np.ndarray]) -> bool:
    """Write one grid file (not fsynced: a torn file fails its digest); False (with a note)
    when it cannot be written."""
    path = _grid_path(home, identity)
    if not persist.write(path, encode_grid(identity, parts), durable=False, failed="grid not written"):
        return False
    persist.evict(path.parent, GRID_SUFFIX, keep=path)
    return True


__all__ = [
    "FORMAT",
    "GRIDS",
    "GRID_FORMAT",
    "GRID_SUFFIX",
    "MAGIC",
    "SUFFIX",
    "cache_dir",
    "decode",
    "decode_grid",
    "encode",
    "encode_grid",
    "grid_fingerprint",
    "grid_identity",
    "load_grid",
    "load_keyed",
    "pipeline_fingerprint",
    "read_header",
    "registry_fingerprint",
    "store",
    "store_grid",
]
