"""Find perf tables under a data root.

A data root is laid out ``{system}/{family}/{backend}/{version}/{table}_perf.parquet``
(legacy ``{table}_perf.txt`` CSV files are recognised too). A version folder may hold
``reuse.yaml``, declaring that some of its tables are answered by another version of the same
system/family/backend (the donor), and ``collection_meta.yaml``, describing the collection.

The default root is the data folder of the installed ``aiconfigurator-core`` wheel, located
through its distribution metadata; that package is never imported.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import DataRootError, UnknownTableError

DATA_PACKAGE = "aiconfigurator-core"
DATA_ROOT_ENV = "MODPERF_DATA_ROOT"
PARQUET_SUFFIX = "_perf.parquet"
CSV_SUFFIX = "_perf.txt"


def _package_dir(relative: str) -> Path:
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
    return _package_dir("aiconfigurator_core/systems/data")


def embedded_systems_dir() -> Path:
    """The ``systems`` folder (GPU spec YAML files live here)."""
    return _package_dir("aiconfigurator_core/systems")


def embedded_model_configs() -> Path:
    return _package_dir("aiconfigurator_core/model_configs")


def resolve_data_root(data_root: str | os.PathLike[str] | None = None) -> Path:
    """Explicit argument, then ``MODPERF_DATA_ROOT``, then the embedded corpus."""
    chosen = data_root if data_root is not None else os.environ.get(DATA_ROOT_ENV) or None
    if chosen is None:
        return embedded_data_root()
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise DataRootError(
            "data root is not a folder",
            values={"data_root": str(path)},
            fix="pass a folder laid out {system}/{family}/{backend}/{version}/{table}_perf.parquet",
        )
    return path


def table_stem(path: Path) -> str | None:
    name = path.name
    for suffix in (PARQUET_SUFFIX, CSV_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


@dataclass(frozen=True)
class Reuse:
    """A version folder's declaration that a table is answered by a donor version."""

    from_version: str
    reason: str | None = None
    approved_by: str | None = None


@dataclass(frozen=True)
class TableRef:
    """One table as the catalog sees it.

    ``path`` is the file that answers for (system, backend, version, table). For a table that
    ``reuse.yaml`` declares reused, ``path`` is the donor's file and ``reuse`` says so.
    ``shadowed`` is set on a physical file that a reuse declaration in its own folder overrides.
    """

    table: str
    path: Path
    system: str | None = None
    family_dir: str | None = None
    backend: str | None = None
    version: str | None = None
    reuse: Reuse | None = None
    shadowed: bool = False

    @property
    def provenance(self) -> str | None:
        """``provenance`` of the answering folder's collection_meta.yaml (collected, legacy...)."""
        value = _collection_meta(self.path.parent).get("provenance")
        return str(value) if value is not None else None

    @property
    def status(self) -> str | None:
        """``tables.<table>_perf.status`` of the answering folder's collection_meta.yaml."""
        tables = _collection_meta(self.path.parent).get("tables")
        entry = tables.get(f"{self.table}_perf") if isinstance(tables, dict) else None
        return entry.get("status") if isinstance(entry, dict) else None

    @property
    def format(self) -> str:
        return "csv" if self.path.name.endswith(CSV_SUFFIX) else "parquet"

    @property
    def slot(self) -> tuple[str | None, str | None, str | None, str]:
        return (self.system, self.backend, self.version, self.table)

    @property
    def label(self) -> str:
        if self.system is None:
            return str(self.path)
        return f"{self.system}/{self.family_dir}/{self.backend}/{self.version}/{self.table}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "family_dir": self.family_dir,
            "backend": self.backend,
            "version": self.version,
            "table": self.table,
            "path": str(self.path),
            "format": self.format,
            "reused_from": self.reuse.from_version if self.reuse else None,
            "reuse_reason": self.reuse.reason if self.reuse else None,
            "provenance": self.provenance,
            "status": self.status,
            "shadowed_by_reuse": self.shadowed,
        }


#: libyaml's loader when present: the corpus has ~450 sidecar files and the pure-Python
#: loader makes a scan several times slower.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise DataRootError(
            f"cannot parse {path.name}: {exc}", file=path, fix="repair the YAML or remove the file"
        ) from exc
    return data if isinstance(data, dict) else {}


@functools.cache
def _collection_meta(folder: Path) -> dict[str, Any]:
    """collection_meta.yaml of a version folder, read on first use (a scan does not need the
    ~450 sidecars of the corpus, and parsing them is most of a scan's cost)."""
    return _read_yaml(folder / "collection_meta.yaml")


@dataclass
class _VersionFolder:
    path: Path
    system: str
    family_dir: str
    backend: str
    version: str
    files: dict[str, Path] = field(default_factory=dict)
    reuse: dict[str, Reuse] = field(default_factory=dict)


def _scan_folders(root: Path) -> Iterator[_VersionFolder]:
    for system in sorted(p for p in root.iterdir() if p.is_dir()):
        for family_dir in sorted(p for p in system.iterdir() if p.is_dir()):
            for backend in sorted(p for p in family_dir.iterdir() if p.is_dir()):
                for version in sorted(p for p in backend.iterdir() if p.is_dir()):
                    folder = _VersionFolder(version, system.name, family_dir.name, backend.name, version.name)
                    for entry in version.iterdir():
                        stem = table_stem(entry)
                        # a parquet file wins over a legacy CSV of the same table
                        if stem is not None and entry.is_file() and (
                                stem not in folder.files or entry.name.endswith(PARQUET_SUFFIX)):
                            folder.files[stem] = entry
                    reuse_doc = _read_yaml(version / "reuse.yaml")
                    for item in reuse_doc.get("reuse") or []:
                        if isinstance(item, dict) and item.get("table") and item.get("from_version"):
                            stem = str(item["table"]).removesuffix("_perf")
                            folder.reuse[stem] = Reuse(
                                str(item["from_version"]), item.get("reason"), item.get("approved_by")
                            )
                    yield folder


@dataclass
class Catalog:
    """Every table under one data root, physical files and reuse-resolved slots."""

    root: Path
    files: list[TableRef]  # every physical table file, once
    slots: list[TableRef]  # what answers each (system, backend, version, table)
    problems: list[str]  # reuse declarations whose donor is missing

    @classmethod
    def scan(cls, root: str | os.PathLike[str] | None = None) -> Catalog:
        root_path = resolve_data_root(root)
        folders = list(_scan_folders(root_path))
        by_key = {(f.system, f.family_dir, f.backend, f.version): f for f in folders}
        files: list[TableRef] = []
        slots: list[TableRef] = []
        problems: list[str] = []
        for folder in folders:
            for stem, path in sorted(folder.files.items()):
                ref = TableRef(
                    stem, path, folder.system, folder.family_dir, folder.backend, folder.version,
                    shadowed=stem in folder.reuse,
                )
                files.append(ref)
                if stem not in folder.reuse:
                    slots.append(ref)
            for stem, reuse in sorted(folder.reuse.items()):
                donor = by_key.get((folder.system, folder.family_dir, folder.backend, reuse.from_version))
                if donor is None or stem not in donor.files:
                    problems.append(
                        f"{folder.path}/reuse.yaml: {stem} reuses version {reuse.from_version}, "
                        "which has no such table"
                    )
                    continue
                slots.append(
                    TableRef(
                        stem, donor.files[stem], folder.system, folder.family_dir, folder.backend,
                        folder.version, reuse=reuse,
                    )
                )
        return cls(root_path, files, slots, problems)

    def select(
        self,
        *,
        system: str | None = None,
        backend: str | None = None,
        version: str | None = None,
        table: str | None = None,
        tables: Iterable[str] | None = None,
        physical: bool = True,
    ) -> list[TableRef]:
        wanted = set(tables) if tables is not None else None
        source = self.files if physical else self.slots
        return [
            r
            for r in source
            if (system is None or r.system == system)
            and (backend is None or r.backend == backend)
            and (version is None or r.version == version)
            and (table is None or r.table == table)
            and (wanted is None or r.table in wanted)
        ]

    def slot(self, system: str, backend: str, version: str, table: str) -> TableRef | None:
        for ref in self.slots:
            if ref.slot == (system, backend, version, table):
                return ref
        return None


def refs_for_paths(paths: Iterable[str | os.PathLike[str]]) -> list[TableRef]:
    """Table files named on a command line: files, or folders searched recursively.

    Where the path ends in the standard layout, system/family/backend/version come from it;
    elsewhere they stay unknown (the loader only needs the table stem).
    """
    refs: list[TableRef] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.is_file() and table_stem(p))
            if not candidates:
                raise UnknownTableError(
                    "folder holds no *_perf.parquet or *_perf.txt tables",
                    file=path,
                    fix="pass table files or a data-root folder",
                )
        elif path.is_file():
            if table_stem(path) is None:
                raise UnknownTableError(
                    "not a perf table file name",
                    file=path,
                    fix="perf tables are named {table}_perf.parquet (or legacy {table}_perf.txt)",
                )
            candidates = [path]
        else:
            raise UnknownTableError("no such file or folder", file=path, fix="check the path")
        for p in candidates:
            stem = table_stem(p)
            assert stem is not None
            layout = _layout_of(p, path if path.is_dir() else None)
            refs.append(TableRef(stem, p, *layout) if layout else TableRef(stem, p))
    return refs


def _layout_of(file: Path, searched: Path | None) -> tuple[str, str, str, str] | None:
    """(system, family, backend, version) when the file sits in the standard layout.

    Under a searched folder the relative path must be exactly
    ``system/family/backend/version/file``; for a file named on its own, the folder above it
    must look like a version (start with a digit), as every version folder in the corpus does.
    """
    if searched is not None:
        rel = file.relative_to(searched).parts
        if len(rel) == 5:
            return rel[0], rel[1], rel[2], rel[3]
        if len(rel) != 1:
            return _layout_of(file, None)
    parts = file.parts
    if len(parts) >= 5 and parts[-2][:1].isdigit():
        return parts[-5], parts[-4], parts[-3], parts[-2]
    return None
