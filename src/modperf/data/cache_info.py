"""The cache folder as a whole: what it holds and clearing it (``modperf cache info|clear``).

Each kind of file has its own home -- keyed tables and grids (:mod:`modperf.data.keyed_cache`),
catalog scans (:mod:`modperf.data.scan_cache`), query plans (:mod:`modperf.fast.plans`) -- and
all of them go through :mod:`modperf.fast.persist`; this module only lists and removes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import WriteFailedError
from ..base.jsonio import untagged
from ..fast.cache_keys import (
    CACHE_SUBFOLDERS,
    NO_CACHE_ENV,
    PLAN_DEPENDS_SUFFIX,
    PLAN_SUFFIX,
    PLANS_FOLDER,
    switched_on,
)
from ..fast.cache_trust import folder_problem
from ..fast.persist import NOTES, remove_files
from .keyed_cache import GRID_SUFFIX, GRIDS, SUFFIX, cache_dir, read_header
from .scan_cache import Record, records
from .scan_cache import clear as clear_scans


@dataclass
class Entry:
    """One cache entry: its file, size, and the table file and rows it keys."""

    file: Path
    bytes: int
    source: str | None
    rows: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"file": str(self.file), "bytes": self.bytes, "source": self.source, "rows": self.rows}


@dataclass
class CacheInfo:
    """What a cache folder holds (``modperf cache info``)."""

    location: Path
    exists: bool
    enabled: bool
    entries: list[Entry]
    notes: list[str]
    #: The catalog scans remembered beside the entries (modperf.data.scan_cache), one per data root.
    catalogs: list[Record] = field(default_factory=list)
    #: The grid files kept beside the entries (their count and bytes).
    grids: int = 0
    grid_bytes: int = 0
    #: The persisted query plans (modperf.fast.plans) and what they depend on: count and bytes.
    plans: int = 0
    plan_bytes: int = 0
    #: What keeps the folder from being trusted (modperf.fast.cache_trust), None where nothing
    #: does; an untrusted folder is neither read nor written (nor listed here).
    trust_problem: str | None = None

    @property
    def trusted(self) -> bool:
        return self.trust_problem is None

    @property
    def off_reason(self) -> str | None:
        """Why the cache is not used, None where it is: switched off, or not trusted."""
        if self.enabled:
            return None
        if self.trust_problem is not None:
            return self.trust_problem
        return f"switched off ({NO_CACHE_ENV} or --no-cache)"

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    def to_dict(self) -> dict[str, Any]:
        return {"location": str(self.location), "exists": self.exists, "enabled": self.enabled,
                "off_reason": self.off_reason, "trusted": self.trusted, "trust_problem": self.trust_problem,
                "entries": [e.to_dict() for e in self.entries], "count": len(self.entries), "bytes": self.bytes,
                "notes": list(self.notes), "catalogs": [r.to_dict() for r in self.catalogs],
                "grids": {"count": self.grids, "bytes": self.grid_bytes},
                "plans": {"count": self.plans, "bytes": self.plan_bytes}}


def _entry_files(folder: Path, suffix: str = SUFFIX) -> Iterator[Path]:
    try:
        yield from sorted(p for p in folder.iterdir() if p.name.endswith(suffix) and p.is_file())
    except OSError:
        return


def info(folder: Path | None = None) -> CacheInfo:
    """What the cache holds: every entry with its size and the table file it keys, and the
    catalog scans it remembers; whether it is used, and why not (a folder that cannot be
    trusted is not looked into)."""
    folder = folder or cache_dir()
    problem = folder_problem(str(folder), CACHE_SUBFOLDERS)
    on = switched_on() and problem is None
    if problem is not None:
        return CacheInfo(folder, folder.is_dir(), on, [], list(NOTES), trust_problem=problem)
    entries = []
    for path in _entry_files(folder):
        header = read_header(path)
        source = header["identity"]["source"]["path"] if header else None
        rows = None
        if header:
            rows = untagged(header["meta"]).get("rows_stored")
        try:
            size = path.stat().st_size
        except OSError:
            continue
        entries.append(Entry(path, size, source, rows))
    grids = grid_bytes = 0
    for path in _entry_files(folder / GRIDS, GRID_SUFFIX):
        with contextlib.suppress(OSError):
            grid_bytes += path.stat().st_size
            grids += 1
    plans = plan_bytes = 0
    for path in _plan_files(folder):
        with contextlib.suppress(OSError):
            plan_bytes += path.stat().st_size
            plans += path.name.endswith(PLAN_SUFFIX)
    return CacheInfo(folder, folder.is_dir(), on, entries, list(NOTES), records(folder), grids, grid_bytes,
                     plans, plan_bytes)


def _plan_files(folder: Path) -> list[Path]:
    """The query plans and their dependency files (modperf.fast.plans) in a cache folder."""
    plans = folder / PLANS_FOLDER
    return [*_entry_files(plans, PLAN_SUFFIX), *_entry_files(plans, PLAN_DEPENDS_SUFFIX)]


def clear(folder: Path | None = None) -> CacheInfo:
    """Remove every entry, grid file and catalog scan (and leftover temporary files of
    entries); returns what was removed. A folder that cannot be trusted is not touched
    (WriteFailedError): whoever else can write it could have pointed a subfolder elsewhere."""
    folder = folder or cache_dir()
    removed = info(folder)
    if removed.trust_problem is not None:
        raise WriteFailedError(f"the cache folder is not used, so nothing was removed: {removed.trust_problem}",
                               file=folder, fix="fix the folder as said, then clear it, or remove it yourself")
    remove_files([e.file for e in removed.entries], "a cache entry", folder, SUFFIX)
    clear_scans(folder)
    remove_files(list(_entry_files(folder / GRIDS, GRID_SUFFIX)), "a cached grid", folder / GRIDS, GRID_SUFFIX)
    remove_files(_plan_files(folder), "a query plan", folder / PLANS_FOLDER, (PLAN_SUFFIX, PLAN_DEPENDS_SUFFIX))
    return removed


__all__ = ["CacheInfo", "Entry", "clear", "info"]
