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
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ..base import errors as E
from ..base.atomic import TMP_SUFFIX, is_live_temp
from ..base.errors import DataRootError, UnknownTableError
from ..base.limits import MAX_CONFIG_BYTES
from ..fast.cache_keys import DATA_ROOT_ENV, embedded_data_root
from .footer import constant_value

PARQUET_SUFFIX = "_perf.parquet"
CSV_SUFFIX = "_perf.txt"


def _is_yaml_error(exc: BaseException) -> bool:
    import yaml

    return isinstance(exc, yaml.YAMLError)


def resolve_data_root(data_root: str | os.PathLike[str] | None = None) -> Path:
    """Explicit argument, then ``MODPERF_DATA_ROOT``, then the embedded corpus."""
    chosen = data_root if data_root is not None else os.environ.get(DATA_ROOT_ENV) or None
    if chosen is None:
        return embedded_data_root()
    path = Path(chosen).expanduser()
    try:
        path.stat()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise DataRootError(f"cannot access the data root: {exc.strerror or exc}", values={"data_root": str(path)},
                            fix="make the data root and its parent folders searchable for this user") from None
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


#: Tables versioned by a collective library's release, not by a framework's: each lives in
#: ``{system}/comm/{library}/{release}/`` whatever framework image ran the benchmark (the stem is
#: the library's name; modperf.data.families.collective declares them, and a test keeps the two equal).
LIBRARY_TABLES = frozenset({"nccl", "oneccl"})
#: The family folder of the library tables.
LIBRARY_FAMILY_DIR = "comm"
#: The column in which a table's rows record the release that ran them.
RELEASE_COLUMN = "version"


def releases_of(values: Iterable[Any]) -> tuple[str, ...]:
    """The distinct releases a table's ``version`` values record, sorted (a missing value as
    ``'null'``: rows that record no release)."""
    return tuple(sorted({"null" if v is None else str(v) for v in values}))


def single_release(recorded: Sequence[str]) -> str | None:
    """The one release a library table's rows record, or None where they record none or
    several (or a row records none): such a table cannot be served by a release's slot."""
    return recorded[0] if len(recorded) == 1 and recorded[0] != "null" else None


@dataclass(frozen=True)
class Misplaced:
    """A collective library's table found outside ``{system}/comm/{library}/{release}/``, and
    what the catalog made of it (docs/families.md, "Library tables filed in a framework folder").

    Its rows record their release (``recorded``). With exactly one, it is read as that
    release's table: served in the slot (system, library, release) when nothing else claims it
    (``served_as``), otherwise not served: the slot has its own file (``held_by``: that file
    answers, nothing is merged) or other misplaced files record the same release (``rivals``:
    none of them is chosen)."""

    file: str  # the file, where it lies
    folder: str  # its version folder: {system}/{family}/{backend}/{version}
    library: str
    recorded: tuple[str, ...]  # releases its rows record (its version column); () when unreadable
    target: str  # the folder it belongs in: {system}/comm/{library}/{release} (<release> when unknown)
    served_as: str | None = None  # the slot it answers: {system}/{library}/{release}
    held_by: str | None = None  # the file that answers that slot instead
    rivals: tuple[str, ...] = ()  # other misplaced files recording the same release

    @property
    def release(self) -> str | None:
        return single_release(self.recorded)

    @property
    def note(self) -> str:
        """What every answer served from the file says."""
        return (f"served from {self.file}, filed in the framework folder {self.folder}/: read as {self.library} "
                f"release {self.release} (the release its rows record); it belongs in {self.target}/")

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "folder": self.folder, "library": self.library,
                "recorded_versions": list(self.recorded), "belongs_in": self.target, "served_as": self.served_as,
                "held_by": self.held_by, "rivals": list(self.rivals)}


@dataclass(frozen=True)
class TableRef:
    """One table as the catalog sees it.

    ``path`` is the file that answers for (system, backend, version, table). For a table that
    ``reuse.yaml`` declares reused, ``path`` is the donor's file and ``reuse`` says so.
    ``shadowed`` is set on a physical file that a reuse declaration in its own folder overrides.
    ``misplaced`` is set on a library table found in a framework folder: on its physical file
    (where it lies) and on the slot of the release its rows record, where it is served there.
    """

    table: str
    path: Path
    system: str | None = None
    family_dir: str | None = None
    backend: str | None = None
    version: str | None = None
    reuse: Reuse | None = None
    shadowed: bool = False
    misplaced: Misplaced | None = None

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
            "misplaced": self.misplaced.to_dict() if self.misplaced is not None else None,
        }




class ScanWatch(Protocol):
    """What a scan depended on, told as it goes (:mod:`modperf.data.scan_cache` records it, so that a
    later process can tell whether a scan now would find the same)."""

    def folder(self, path: Path) -> None:
        """``path`` is about to be listed."""

    def sidecar(self, path: Path, data: bytes | None) -> None:
        """The bytes of a sidecar the scan parsed (None: there was no such file)."""

    def untrusted(self, path: Path) -> None:
        """What the scan made of ``path`` depends on more than its folder's listing (a symbolic
        link, a temporary file of a write that may still be running)."""

    def table(self, path: Path) -> None:
        """The rows of table file ``path`` are about to be read (the release a library table in
        a framework folder records): what the scan made of it depends on the file's content."""


def _read_yaml(path: Path, watch: ScanWatch | None = None) -> tuple[dict[str, Any], E.ModperfError | None]:
    """A sidecar as a dict ({} when absent), and the failure that made it unusable, if any
    (never raised: a malformed sidecar is a failure of the data root, reported by check)."""
    fix = "repair the YAML (a mapping at the top level) or remove the file"
    try:
        if not path.is_file():
            if watch is not None:
                watch.sidecar(path, None)
            return {}, None
        import yaml  # on use: most folders hold no sidecar

        # libyaml's loader when present: the corpus has ~450 sidecar files and the pure-Python
        # loader makes a scan several times slower
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return {}, E.SidecarError(f"{path.name} is larger than a sidecar can be", file=path, fix=fix)
        raw = path.read_bytes()
        if watch is not None:
            watch.sidecar(path, raw)
        data = yaml.load(raw, Loader=loader)
    except OSError as exc:
        return {}, E.SidecarError(f"cannot read {path.name}: {exc.strerror or exc}", file=path, fix=fix)
    except Exception as exc:
        if not _is_yaml_error(exc):
            raise
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        return {}, E.SidecarError(f"cannot parse {path.name}: {getattr(exc, 'problem', None) or 'invalid YAML'}{at}",
                                  file=path, fix=fix)
    except (RecursionError, ValueError, TypeError) as exc:
        return {}, E.SidecarError(f"cannot parse {path.name}: {type(exc).__name__}", file=path, fix=fix)
    if data is None:
        return {}, None
    if not isinstance(data, dict):
        return {}, E.SidecarError(f"{path.name} holds a {type(data).__name__}, not a mapping", file=path, fix=fix)
    return data, None


@functools.cache
def _collection_meta_checked(folder: Path) -> tuple[dict[str, Any], E.ModperfError | None]:
    """collection_meta.yaml of a version folder, read on first use (a scan does not need the
    ~450 sidecars of the corpus, and parsing them is most of a scan's cost)."""
    return _read_yaml(folder / "collection_meta.yaml")


def _collection_meta(folder: Path) -> dict[str, Any]:
    return _collection_meta_checked(folder)[0]


def sidecar_problems(folders: Iterable[Path], *, reuse: bool = True) -> list[E.ModperfError]:
    """The failures of these version folders' sidecars: collection_meta.yaml (every command reads
    a malformed one as empty, the same with or without --json; the audits report it) and, with
    ``reuse``, the shape of reuse.yaml (a catalog scan reports that one itself)."""
    out: list[E.ModperfError] = []
    for folder in sorted(set(folders)):
        problem = _collection_meta_checked(folder)[1]
        if problem is not None:
            out.append(problem)
        if reuse:
            _read_reuse(VersionFolder(folder, "", "", "", ""), folder / "reuse.yaml", out)
    return out


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (links resolved) lies inside ``root`` (resolved)."""
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a link loop
        return False


def _listing(folder: Path, root: Path, problems: list[E.ModperfError], watch: ScanWatch | None = None) -> list[Path]:
    """A folder's entries, sorted; a folder that cannot be listed is a failure, not an empty folder."""
    if watch is not None:
        watch.folder(folder)
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        problems.append(E.UnreadableFolderError(
            f"cannot list folder: {exc.strerror or exc}", file=folder,
            fix="make it readable (and searchable) for this user, or move it out of the data root"))
        return []


def _cannot_inspect(path: Path, exc: OSError) -> E.UnreadableFolderError:
    return E.UnreadableFolderError(
        f"cannot inspect: {exc.strerror or exc}", file=path,
        fix="make its folder searchable for this user, or move it out of the data root")


def _subfolders(folder: Path, root: Path, problems: list[E.ModperfError], watch: ScanWatch | None = None) -> list[Path]:
    out = []
    for p in _listing(folder, root, problems, watch):
        try:
            link = p.is_symlink()
            if link and watch is not None:
                watch.untrusted(p)
            if link and p.is_dir() and not _inside(p, root):
                problems.append(_outside(p, root))
            elif p.is_dir():
                out.append(p)
        except OSError as exc:
            problems.append(_cannot_inspect(p, exc))
    return out


def _outside(path: Path, root: Path) -> E.LinkOutsideRootError:
    return E.LinkOutsideRootError(
        "symbolic link to outside the data root: not read", file=path, values={"data_root": str(root)},
        fix="copy the table into the data root, or point the link at a file inside it")


def _not_a_file(path: Path) -> E.UnreadableTableError:
    return E.UnreadableTableError("named like a table but is a folder, not a file", file=path,
                                  fix="rename or remove the folder")


def _stale_temp(path: Path) -> E.StaleTempFileError:
    return E.StaleTempFileError(
        "temporary file of an interrupted modperf write", file=path,
        fix="run the write again (it removes temporary files of its own killed runs on this host), or delete "
            "the file once no modperf process is writing here")


@dataclass
class VersionFolder:
    """One ``{system}/{family}/{backend}/{version}`` folder as a scan found it: its table files
    by stem and its reuse declarations."""

    path: Path
    system: str
    family_dir: str
    backend: str
    version: str
    files: dict[str, Path] = field(default_factory=dict)
    reuse: dict[str, Reuse] = field(default_factory=dict)
    #: Per library table filed in this (framework) folder: the releases its rows record.
    releases: dict[str, tuple[str, ...]] = field(default_factory=dict)


def scan_folders(root: Path, problems: list[E.ModperfError], watch: ScanWatch | None = None) -> Iterator[VersionFolder]:
    """The version folders under ``root``, in order; what cannot be read goes to ``problems``."""
    real_root = root.resolve()
    for system in _subfolders(root, real_root, problems, watch):
        for family_dir in _subfolders(system, real_root, problems, watch):
            for backend in _subfolders(family_dir, real_root, problems, watch):
                for version in _subfolders(backend, real_root, problems, watch):
                    folder = VersionFolder(version, system.name, family_dir.name, backend.name, version.name)
                    for entry in _listing(version, real_root, problems, watch):
                        try:
                            _add_entry(folder, entry, real_root, problems, watch)
                        except OSError as exc:
                            problems.append(_cannot_inspect(entry, exc))
                    _read_reuse(folder, version / "reuse.yaml", problems, watch)
                    for stem, path in folder.files.items():
                        if stem in LIBRARY_TABLES and folder.backend != stem:
                            if watch is not None:
                                watch.table(path)
                            folder.releases[stem] = _read_releases(path)
                    yield folder


def _read_releases(path: Path) -> tuple[str, ...]:
    """The releases a table file's rows record (:func:`releases_of`); () when it has no
    version column or cannot be read (loading it reports why). Where the parquet footer's
    statistics show one release on every row (the usual case), no more is read: a scan does not
    import pyarrow for it (:mod:`modperf.data.footer`)."""
    only = constant_value(path, RELEASE_COLUMN)
    if only is not None:
        return releases_of([only])
    from .reader import read_table  # on use: a footer that does not tell (several releases, a CSV)

    try:
        table = read_table(path, columns=[RELEASE_COLUMN])
    except E.UnreadableTableError:
        return ()
    if RELEASE_COLUMN not in table.column_names:
        return ()
    return releases_of(table.column(RELEASE_COLUMN).to_pylist())


def _misplaced(path: Path, system: str, family_dir: str, backend: str, version: str, stem: str,
               recorded: tuple[str, ...]) -> Misplaced:
    release = single_release(recorded)
    return Misplaced(str(path), f"{system}/{family_dir}/{backend}/{version}", stem, recorded,
                     f"{system}/{LIBRARY_FAMILY_DIR}/{stem}/{release or '<release>'}")


def _add_entry(folder: VersionFolder, entry: Path, root: Path, problems: list[E.ModperfError],
               watch: ScanWatch | None = None) -> None:
    if entry.name.endswith(TMP_SUFFIX):
        if watch is not None:  # whether its writer still runs is not in the listing
            watch.untrusted(entry)
        if not is_live_temp(entry):
            problems.append(_stale_temp(entry))
        return
    stem = table_stem(entry)
    if stem is None:
        return
    link = entry.is_symlink()
    if link and watch is not None:  # what it means depends on where it points
        watch.untrusted(entry)
    if entry.is_dir():
        problems.append(_not_a_file(entry))
        return
    if link and not _inside(entry, root):
        problems.append(_outside(entry, root))
        return
    # a parquet file wins over a legacy CSV of the same table; a dangling link is kept, so that
    # reading it fails loudly
    if (entry.is_file() or link) and (stem not in folder.files or entry.name.endswith(PARQUET_SUFFIX)):
        folder.files[stem] = entry


def _read_reuse(folder: VersionFolder, path: Path, problems: list[E.ModperfError],
                watch: ScanWatch | None = None) -> None:
    doc, problem = _read_yaml(path, watch)
    if problem is not None:
        problems.append(problem)
        return
    items = doc.get("reuse")
    if items is None:
        return
    if not isinstance(items, list):
        problems.append(E.SidecarError(f"reuse.yaml: 'reuse' holds a {type(items).__name__}, not a list", file=path,
                                       fix="list one {table, from_version} mapping per reused table"))
        return
    for i, item in enumerate(items):
        if not (isinstance(item, dict) and isinstance(item.get("table"), (str, int, float))
                and isinstance(item.get("from_version"), (str, int, float))):
            problems.append(E.SidecarError(f"reuse.yaml: entry {i} is not a {{table, from_version}} mapping",
                                           file=path, values={"entry": i},
                                           fix="give each entry a table and a from_version"))
            continue
        stem = str(item["table"]).removesuffix("_perf")
        reason, approved = item.get("reason"), item.get("approved_by")
        folder.reuse[stem] = Reuse(str(item["from_version"]), str(reason) if reason is not None else None,
                                   str(approved) if approved is not None else None)


@dataclass
class Catalog:
    """Every table under one data root, physical files and reuse-resolved slots."""

    root: Path
    files: list[TableRef]  # every physical table file, once
    slots: list[TableRef]  # what answers each (system, backend, version, table)
    #: Parts of the data root that cannot be read or trusted: unreadable folders, malformed
    #: reuse.yaml, reuse declarations whose donor is missing, links out of the root, leftover
    #: temporary files. ``modperf check`` reports each as a failure.
    problems: list[E.ModperfError]
    #: What a remembered scan depended on (modperf.data.scan_cache: every listed folder's stat, every
    #: reuse.yaml's digest), when this catalog is a remembered scan's; None otherwise.
    watched: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def scan(cls, root: str | os.PathLike[str] | None = None, *, watch: ScanWatch | None = None) -> Catalog:
        """Every table under ``root`` (:func:`resolve_data_root`); ``watch`` is told what the
        scan depends on (:mod:`modperf.data.scan_cache`)."""
        root_path = resolve_data_root(root)
        problems: list[E.ModperfError] = []
        folders = list(scan_folders(root_path, problems, watch))
        return cls.of_folders(root_path, folders, problems)

    @classmethod
    def of_folders(cls, root_path: Path, folders: list[VersionFolder], problems: list[E.ModperfError]) -> Catalog:
        """The catalog of the version folders a scan found (in the scan's order): files, the
        slots reuse declarations resolve, and a problem for each declaration without a donor.
        A library table filed in a framework folder whose rows record one release is served
        in that release's slot where nothing else claims it (:class:`Misplaced`); one whose
        rows record none or several stays a slot where it lies, and loading it says why."""
        by_key = {(f.system, f.family_dir, f.backend, f.version): f for f in folders}
        files: list[TableRef] = []
        slots: list[TableRef] = []
        claims: dict[tuple[Any, ...], list[int]] = {}  # release slot -> indexes in files
        for folder in folders:
            for stem, path in sorted(folder.files.items()):
                recorded = folder.releases.get(stem)
                misplaced = None if recorded is None else _misplaced(
                    path, folder.system, folder.family_dir, folder.backend, folder.version, stem, recorded)
                ref = TableRef(
                    stem, path, folder.system, folder.family_dir, folder.backend, folder.version,
                    shadowed=stem in folder.reuse, misplaced=misplaced,
                )
                files.append(ref)
                if misplaced is not None and misplaced.release is not None and stem not in folder.reuse:
                    claims.setdefault((folder.system, stem, misplaced.release, stem), []).append(len(files) - 1)
                elif stem not in folder.reuse:
                    slots.append(ref)
            for stem, reuse in sorted(folder.reuse.items()):
                donor = by_key.get((folder.system, folder.family_dir, folder.backend, reuse.from_version))
                if donor is None or stem not in donor.files:
                    problems.append(E.SidecarError(
                        f"{stem} reuses version {reuse.from_version}, which has no such table",
                        file=folder.path / "reuse.yaml", fix="restore the donor table or correct reuse.yaml"))
                    continue
                slots.append(
                    TableRef(
                        stem, donor.files[stem], folder.system, folder.family_dir, folder.backend,
                        folder.version, reuse=reuse,
                    )
                )
        held = {r.slot: r for r in slots}
        for slot, claimants in claims.items():
            holder = held.get(slot)
            for i in claimants:
                ref = files[i]
                assert ref.misplaced is not None
                if holder is not None:
                    placed = replace(ref.misplaced, held_by=str(holder.path))
                elif len(claimants) > 1:
                    placed = replace(ref.misplaced, rivals=tuple(str(files[j].path) for j in claimants if j != i))
                else:
                    system, library, release, _ = slot
                    placed = replace(ref.misplaced, served_as=f"{system}/{library}/{release}")
                    slots.append(TableRef(ref.table, ref.path, system, LIBRARY_FAMILY_DIR, library, release,
                                          misplaced=placed))
                files[i] = replace(ref, misplaced=placed)
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

    def refuse_unknown(self, *, system: str | None = None, backend: str | None = None,
                       version: str | None = None, table: str | None = None) -> None:
        """An UnknownTableError where a filter names a system, a backend (of that system), a
        version (of those) or a table (of those) that nothing under the root has: a filter matching nothing is a
        typo, never an empty answer. The fix names the nearest names (:func:`suggest`)."""
        from .versions import version_key

        refs = [*self.files, *self.slots]
        given: dict[str, str] = {}
        for name, value in (("system", system), ("backend", backend), ("version", version), ("table", table)):
            if value is None:
                continue
            known = {str(getattr(r, name)) for r in refs if getattr(r, name) is not None}
            if value not in known:
                near = suggest(value, known)
                within = "".join(f" {k}={v}" for k, v in given.items())
                listed = sorted(known, key=version_key) if name == "version" else sorted(known)
                raise E.UnknownTableError(
                    f"no {name} {E.quote(value)} under {self.root}" + (f" for{within}" if within else ""),
                    values={**given, name: value},
                    fix=(f"did you mean {name} {', '.join(near)}? " if near else "")
                    + f"{name}s: {', '.join(listed[:16])}" + (" ..." if len(listed) > 16 else ""))
            given[name] = value
            refs = [r for r in refs if getattr(r, name) == value]

    def slot(self, system: str, backend: str, version: str, table: str) -> TableRef | None:
        # an index by slot (the first ref of each, as a scan would find), rebuilt when the list
        # of slots is replaced or changes length: every query asks, so a scan of ~600 refs
        # would cost more than the answer
        index = self.__dict__.get("_slot_index")
        if index is None or index[0] is not self.slots or index[1] != len(self.slots):
            by_slot: dict[tuple[Any, ...], TableRef] = {}
            for ref in self.slots:
                by_slot.setdefault(ref.slot, ref)
            index = (self.slots, len(self.slots), by_slot)
            self.__dict__["_slot_index"] = index
        return index[2].get((system, backend, version, table))


    def tables_by_version(self, system: str, backend: str) -> dict[str, set[str]]:
        """version -> the tables a system and backend hold at it (reuse-resolved slots); a
        system and backend the root holds nothing of is an UnknownTableError naming what it holds."""
        by_version: dict[str, set[str]] = {}
        for r in self.slots:
            if r.system == system and r.backend == backend:
                by_version.setdefault(str(r.version), set()).add(r.table)
        if not by_version:
            have = sorted({(str(r.system), str(r.backend)) for r in self.slots})
            raise UnknownTableError(
                f"no tables for system={system} backend={backend}", values={"system": system, "backend": backend},
                fix="available: " + ", ".join(f"{s}/{b}" for s, b in have))
        return by_version


def suggest(value: str, known: Iterable[str], count: int = 3) -> list[str]:
    """The known names a mistyped ``value`` probably meant (close spellings, nearest first):
    every "did you mean" about a system, backend, version or table."""
    import difflib  # on use: only an unknown name needs suggestions

    return difflib.get_close_matches(str(value), sorted(set(known)), n=count)


def _walk_tables(folder: Path, problems: list[E.ModperfError]) -> list[Path]:
    """Table files under ``folder``, recursively. Nothing is skipped silently: a sub-folder that
    cannot be listed, a link out of ``folder`` and a leftover temporary file are problems. A
    link to a folder inside ``folder`` is not followed (its tables are found where it points)."""
    real = folder.resolve()
    found: list[Path] = []
    stack = [folder]
    while stack:
        for p in _listing(stack.pop(), real, problems):
            try:
                if p.name.endswith(TMP_SUFFIX):
                    if not is_live_temp(p):
                        problems.append(_stale_temp(p))
                    continue
                if p.is_symlink():
                    if not _inside(p, real):
                        if p.is_dir() or table_stem(p):
                            problems.append(_outside(p, real))
                        continue
                    if p.is_dir():
                        continue
                if p.is_dir() and table_stem(p):
                    problems.append(_not_a_file(p))
                elif p.is_dir():
                    stack.append(p)
                elif table_stem(p) and (p.is_file() or p.is_symlink()):  # a dangling link fails to read, loudly
                    found.append(p)
            except OSError as exc:
                problems.append(_cannot_inspect(p, exc))
    return sorted(found)


def refs_for_paths(paths: Iterable[str | os.PathLike[str]],
                   problems: list[E.ModperfError] | None = None) -> list[TableRef]:
    """Table files named on a command line: files, or folders searched recursively.

    Where the path ends in the standard layout, system/family/backend/version come from it;
    elsewhere they stay unknown (the loader only needs the table stem). What a folder search
    cannot read goes to ``problems``; without a list to collect them, the first one (other
    than a leftover temporary file) is raised.
    """
    collected: list[E.ModperfError] = [] if problems is None else problems
    refs: list[TableRef] = []
    seen: set[str] = set()
    for raw in paths:
        path = Path(raw).expanduser()
        try:
            path.stat()
        except FileNotFoundError:
            pass  # "no such file or folder" below
        except OSError as exc:
            raise UnknownTableError(f"cannot access: {exc.strerror or exc}", file=path,
                                    fix="check the path and its folders' permissions") from None
        if path.is_dir():
            before = len(collected)
            candidates = _walk_tables(path, collected)
            if not candidates and len(collected) == before:
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
            # a file named twice (itself and inside a folder given too, or through a link) is one
            # file: checked, counted and migrated once
            identity = os.path.realpath(p)
            if identity in seen:
                continue
            seen.add(identity)
            stem = table_stem(p)
            assert stem is not None
            layout = _layout_of(p, path if path.is_dir() else None)
            ref = TableRef(stem, p, *layout) if layout else TableRef(stem, p)
            refs.append(_placed_alone(ref))
    if problems is None:
        blocking = [p for p in collected if not isinstance(p, E.StaleTempFileError)]
        if blocking:
            raise blocking[0]
    return refs


def _placed_alone(ref: TableRef) -> TableRef:
    """A library table named on the command line in a framework folder, with the release its
    rows record and whether that release's folder beside it already holds the table (a catalog
    scan of the whole data root decides the same, and also sees other misplaced claimants)."""
    if ref.table not in LIBRARY_TABLES or ref.backend is None or ref.backend == ref.table:
        return ref
    assert ref.system is not None and ref.family_dir is not None and ref.version is not None
    misplaced = _misplaced(ref.path, ref.system, ref.family_dir, ref.backend, ref.version, ref.table,
                           _read_releases(ref.path))
    release = misplaced.release
    if release is not None:
        folder = ref.path.parents[3] / LIBRARY_FAMILY_DIR / ref.table / release
        holder = next((f for f in (folder / (ref.table + PARQUET_SUFFIX), folder / (ref.table + CSV_SUFFIX))
                       if f.is_file()), None)
        misplaced = (replace(misplaced, held_by=str(holder)) if holder is not None
                     else replace(misplaced, served_as=f"{ref.system}/{ref.table}/{release}"))
    return replace(ref, misplaced=misplaced)


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
