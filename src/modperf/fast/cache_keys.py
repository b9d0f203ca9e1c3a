"""What the persisted caches are keyed by, in the standard library only: the cache folder and
its switches (and whether it can be trusted: :mod:`modperf.fast.cache_trust`), a source file's
identity, a digest of code, and where the corpus package lies.

:mod:`modperf.data.keyed_cache` (keyed tables and grids), :mod:`modperf.data.scan_cache` (catalog scans) and
:mod:`modperf.fast.plans` (query plans) share these; the last runs in a process that has not
imported numpy, pathlib or json, so nothing here does either.
"""

from __future__ import annotations

import os
import sys

from .cache_trust import folder_problem, say_off

try:  # (hashlib's own import loads OpenSSL: ~2 ms of a cold process; blake2 is built in)
    from _blake2 import blake2b
except ImportError:  # pragma: no cover  (a Python without the builtin module)
    from hashlib import blake2b

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any

CACHE_DIR_ENV = "MODPERF_CACHE_DIR"
NO_CACHE_ENV = "MODPERF_NO_CACHE"
DATA_PACKAGE = "aiconfigurator-core"
DATA_ROOT_ENV = "MODPERF_DATA_ROOT"
MODEL_CONFIGS_ENV = "MODPERF_MODEL_CONFIGS"
#: The corpus package's folders, relative to its distribution base: the data root, the GPU
#: spec files, the model configs.
EMBEDDED_DATA = "aiconfigurator_core/systems/data"
EMBEDDED_SYSTEMS = "aiconfigurator_core/systems"
EMBEDDED_CONFIGS = "aiconfigurator_core/model_configs"
#: Where modperf.fast.plans keeps query plans in the cache folder, and their files' suffixes (the
#: plans, and what they depend on): modperf.data.keyed_cache lists and clears them.
PLANS_FOLDER, PLAN_SUFFIX, PLAN_DEPENDS_SUFFIX = "plans", ".mpq", ".mpd"
#: The folders of grid files (modperf.data.keyed_cache) and catalog scans (modperf.data.scan_cache) in it.
GRIDS_FOLDER, CATALOGS_FOLDER = "grids", "catalogs"
#: Every folder modperf keeps in the cache folder (each judged with it: modperf.fast.cache_trust).
CACHE_SUBFOLDERS = (PLANS_FOLDER, GRIDS_FOLDER, CATALOGS_FOLDER)


def cache_folder() -> str:
    """The cache folder (it may not exist yet): ``$MODPERF_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/modperf`` (an absolute one), else ``~/.cache/modperf``."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return os.path.expanduser(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(os.path.expanduser(xdg)):
        return os.path.join(os.path.expanduser(xdg), "modperf")
    return os.path.join(os.path.expanduser("~"), ".cache", "modperf")


def switched_on(requested: bool | None = None) -> bool:
    """Whether the cache is asked for: ``requested`` when given, else on unless
    ``MODPERF_NO_CACHE`` is set to something other than ``0`` or empty."""
    if requested is not None:
        return requested
    return os.environ.get(NO_CACHE_ENV, "").strip() in ("", "0")


#: modperf's package folder: code fingerprints name its source files relative to it.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_sources(*names: str, skip: Sequence[str] = ()) -> list[str]:
    """modperf's source files ``names`` (relative to the package folder): a ``.py`` file as
    named, a folder as every ``.py`` file under it (in name order, ``skip`` folders left out)."""
    files: list[str] = []
    for name in names:
        path = os.path.join(PACKAGE_DIR, name)
        if not os.path.isdir(path):
            files.append(path)
            continue
        for folder, dirs, found in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d not in skip)
            files += [os.path.join(folder, n) for n in sorted(found) if n.endswith(".py")]
    return files


def trust_problem() -> str | None:
    """What keeps the cache folder from being trusted (:mod:`modperf.fast.cache_trust`: owned by
    the user, not writable by others, and so every folder above it), or None."""
    return folder_problem(cache_folder(), CACHE_SUBFOLDERS)


def usable_folder() -> str | None:
    """The cache folder where it can be trusted; else None, said once on stderr
    (``cache off: <folder> is writable by others (fix: ...)``)."""
    folder = cache_folder()
    problem = folder_problem(folder, CACHE_SUBFOLDERS)
    if problem is None:
        return folder
    say_off(problem)
    return None


def enabled(requested: bool | None = None) -> bool:
    """Whether to use the cache: it is switched on (:func:`switched_on`) and its folder can be
    trusted (:func:`usable_folder`, which says once on stderr why not)."""
    return switched_on(requested) and usable_folder() is not None


def source_digest(prefix: str, files: Sequence[str | os.PathLike[str]]) -> str:
    """A digest of ``prefix`` and the name (relative to the package folder) and bytes of each
    source file (a file that cannot be read counts as such): what a cached thing's code
    fingerprint is made of (:func:`package_sources` lists the files)."""
    h = blake2b(digest_size=16)
    h.update(prefix.encode())
    for path in files:
        h.update(os.path.relpath(path, PACKAGE_DIR).encode() + b"\0")
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"?")
    return h.hexdigest()


def content_digest(data: bytes) -> str:
    """The digest a cache keeps of some bytes (a sidecar, a spec file)."""
    return blake2b(data, digest_size=16).hexdigest()


def is_digits(value: str) -> bool:
    """Whether ``value`` is ASCII digits only (the command line's integers)."""
    return value.isascii() and value.isdigit()


def config_folders(embedded: str, extra: Sequence[str | os.PathLike[str]] | None) -> list[str]:
    """The model-config folders of a default registry, in order (later folders win): the
    corpus's, then ``MODPERF_MODEL_CONFIGS`` (``os.pathsep``-separated), then ``extra``."""
    folders = [embedded]
    env = os.environ.get(MODEL_CONFIGS_ENV)
    if env:
        folders += [os.path.expanduser(p) for p in env.split(os.pathsep) if p]
    return folders + [os.path.expanduser(os.fspath(p)) for p in (extra or [])]


def source_identity(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """(absolute path, size, mtime_ns, content digest) of a table file; None when it cannot be
    read (the loader then reports it). The content digest is the parquet footer's (its
    metadata: schema, row groups, every column chunk's offsets, sizes and statistics; see
    :mod:`modperf.data.keyed_cache`), or the whole file's for anything else."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            h = blake2b(digest_size=16)
            if os.path.splitext(path)[1] == ".parquet" and size >= 12:
                f.seek(size - 8)
                tail = f.read(8)
                footer_len = int.from_bytes(tail[:4], "little")
                if tail[4:] == b"PAR1" and 0 < footer_len <= size - 12:
                    f.seek(size - 8 - footer_len)
                    h.update(f.read(footer_len))
                else:  # not a parquet footer: the whole file
                    f.seek(0)
                    h.update(f.read())
            else:
                h.update(f.read())
    except OSError:
        return None
    return {"path": os.path.realpath(path), "size": size, "mtime_ns": st.st_mtime_ns, "content": h.hexdigest()}


def scan_unchanged(root: str, folders: Sequence[Any], sidecars: Sequence[Any], tables: Sequence[Any] = ()) -> bool:
    """Whether a scan of ``root`` now would depend on the same folders, sidecars and table
    contents: every folder (relative to the root) stats the same (device, inode, mode,
    ``mtime_ns``, ``ctime_ns``), every ``reuse.yaml`` holds bytes of the same digest, and every
    table file whose rows the scan read (a library table in a framework folder: the release it
    records) has the same size, ``mtime_ns`` and footer digest (:func:`source_identity`)
    (:mod:`modperf.data.scan_cache`'s rule, which :mod:`modperf.fast.plans` keeps too)."""
    join = os.path.join
    try:
        for rel, key in folders:
            st = os.stat(join(root, rel) if rel else root)
            if [st.st_dev, st.st_ino, st.st_mode, st.st_mtime_ns, st.st_ctime_ns] != list(key):
                return False
        for rel, digest in sidecars:
            with open(join(root, rel), "rb") as f:
                if content_digest(f.read()) != digest:
                    return False
        for rel, key in tables:
            if table_key(join(root, rel)) != list(key):
                return False
    except (OSError, TypeError, ValueError):
        return False
    return True


def table_key(path: str) -> list[Any] | None:
    """[size, mtime_ns, content digest] of a table file (:func:`source_identity`); None when it
    cannot be read."""
    identity = source_identity(path)
    return None if identity is None else [identity["size"], identity["mtime_ns"], identity["content"]]


_BASE: list[str | None] = []


def distribution_base() -> str | None:
    """Where the installed corpus package's files are relative to: the folder holding its
    ``.dist-info`` metadata, found the way ``importlib.metadata`` finds it (the first entry of
    ``sys.path`` that holds one), without importing ``importlib.metadata`` (tens of ms)."""
    if _BASE:
        return _BASE[0]
    prefix = DATA_PACKAGE.replace("-", "_").lower() + "-"
    found = None
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        if any(name.lower().startswith(prefix) and name.endswith(".dist-info") for name in names):
            found = entry or "."
            break
    _BASE.append(found)
    return found


def _embedded_folder(relative: str) -> Path:
    """A folder of the installed corpus package (``relative`` to its distribution base), or a
    DataRootError saying how to install it or point elsewhere."""
    from pathlib import Path

    from ..base.errors import DataRootError

    base = distribution_base()
    if base is not None:
        path = Path(base) / relative
    else:  # installed some other way (an egg, a zip): ask importlib.metadata
        import importlib.metadata

        try:
            dist = importlib.metadata.distribution(DATA_PACKAGE)
        except importlib.metadata.PackageNotFoundError as exc:
            raise DataRootError(
                f"the embedded corpus package {DATA_PACKAGE!r} is not installed",
                fix=f"pip install {DATA_PACKAGE}==0.12.0, or pass --data-root DIR / set {DATA_ROOT_ENV}",
            ) from exc
        path = Path(str(dist.locate_file(relative)))
    if not path.is_dir():
        raise DataRootError(
            f"{DATA_PACKAGE} is installed but has no {relative!r} folder",
            values={"looked_in": str(path)},
            fix=f"reinstall {DATA_PACKAGE}==0.12.0, or pass --data-root DIR",
        )
    return path


def embedded_data_root() -> Path:
    """The ``systems/data`` folder of the installed aiconfigurator-core wheel."""
    return _embedded_folder(EMBEDDED_DATA)


def embedded_systems_dir() -> Path:
    """The ``systems`` folder (GPU spec YAML files and ``silicon_sample.csv`` live here)."""
    return _embedded_folder(EMBEDDED_SYSTEMS)


def embedded_model_configs() -> Path:
    """The ``model_configs`` folder (the bundled HF configs)."""
    return _embedded_folder(EMBEDDED_CONFIGS)


__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_SUBFOLDERS",
    "CATALOGS_FOLDER",
    "DATA_PACKAGE",
    "DATA_ROOT_ENV",
    "EMBEDDED_CONFIGS",
    "EMBEDDED_DATA",
    "EMBEDDED_SYSTEMS",
    "GRIDS_FOLDER",
    "MODEL_CONFIGS_ENV",
    "NO_CACHE_ENV",
    "PACKAGE_DIR",
    "cache_folder",
    "config_folders",
    "content_digest",
    "distribution_base",
    "embedded_data_root",
    "embedded_model_configs",
    "embedded_systems_dir",
    "enabled",
    "is_digits",
    "package_sources",
    "scan_unchanged",
    "source_digest",
    "source_identity",
    "switched_on",
    "table_key",
    "trust_problem",
    "usable_folder",
]
