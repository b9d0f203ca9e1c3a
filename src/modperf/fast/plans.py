"""Persisted query plans: a process that asks one thing answers from disk without numpy.

A single query is a plan and a point (:mod:`modperf.query.engine`): the plan is everything resolved
from the fields but the axis values (slot, model, shard, defaults, the bucket group and its
grid); the point is the axis values. The query engine keeps plans in memory; this module keeps
each one also on disk, in the user's cache folder (:mod:`modperf.fast.persist`), so that the next
process asking with the same fields (any axis values) reads the plan instead of importing
numpy and pyarrow, scanning the data root and loading the table. What it reads is what a
single answer reads: the template answer, each axis's checks, and the grid's lattice as plain
lists (:class:`modperf.fast.lattice.Lattice`); it answers through the engine's own fast path
(:mod:`modperf.fast.answer`), so the answer is the engine's, bit for bit.

**One plan, one file** (``plans/<digest>.mpq``): :data:`MAGIC`, the plan as one ``marshal``
value, and a BLAKE2b digest of everything before it. The name is a digest of the code
fingerprint, the data root, the model-config folders and the fields that pick the plan (their
names in order, and each non-axis field's value and type, as the engine's plan cache keys it).

**Never stale.** A plan is used only when all that its answers depend on is as it was when it
was written; anything else (a mismatch, a missing or unreadable file, a field of an unusual
type) means the engine answers, as without this module:

* the file is whole (its digest), of this format, this Python's ``marshal``, and modperf's code
  (a digest of every module of the package but the CLI);
* numpy's version file holds the same bytes (grids are numpy's arithmetic);
* the data root's catalog: every folder the scan listed stats the same, every ``reuse.yaml``
  holds the same bytes and every table file whose rows the scan read (a misplaced library
  table: where it is served) has the same identity (the rule of :mod:`modperf.data.scan_cache`,
  whose record the plan was resolved under; kept once per scan in ``plans/scan-<digest>.mpd``);
* the model configs: every file in the config folders has the same name, size and mtime;
* every table file the plan was resolved from (the slot's file, any version the default
  version looked at, and where it keeps quality notes the files they compare with) has the
  identity its keyed table was cached under (path, size, mtime, footer digest;
  :mod:`modperf.data.keyed_cache`);
* the system's GPU spec file holds the same bytes (the roofline behind the grid's fill).

Those checks run once per process (per file); a plan read once is kept in memory.

**Whose files.** Plans are read only from a cache folder the user owns and no one else can
write, and a file only when the opened file is the user's and no one else can write it
(:mod:`modperf.fast.cache_trust`): the digest is unkeyed, and ``marshal`` is not safe against
crafted input, so the ownership rule is what keeps a forged plan out. What ``marshal`` gives
back is a builtin value; a plan is used only when every part of it is plain (None, bools,
ints, floats, strings, tuples, lists, dicts: :func:`plain`), so nothing it holds is code.
(Its dependency files are only compared with what is found now: a value of another type
there is a mismatch.)

**What a plan answers.** A point whose axis values are plain ints inside their ranges and
inside the grid's measured range: a measured cell, a blend between cells, a filled cell. A
point outside the measured range (the roofline projects it), a refused one, and a table whose
backend picks the kernel per shape (a lane rule) are left to the engine; so are quality notes
where the writer did not look them up (a plan keeps its group's notes, or that it has none,
once an answer with notes was asked). Plans are written by the engine's process after a plan's first
answer (:meth:`PlanStore.persist`), through a temporary file renamed into place
(:func:`modperf.base.atomic.replace_unsynced`: created exclusively, no link followed, mode 0600; a
torn file fails its digest); they share the cache's size bound and ``modperf cache clear``.

Imports: the standard library only, and of modperf :mod:`modperf.fast.cache_keys`,
:mod:`modperf.fast.cache_trust`, :mod:`modperf.fast.lattice` and :mod:`modperf.fast.answer` (writing imports
more, on use).
"""

from __future__ import annotations

import marshal
import os
import sys
from operator import itemgetter

from ..base.meta import __version__
from . import persist
from .answer import Answer, Plan, fast_answer, quality_notes
from .cache_keys import (
    DATA_ROOT_ENV,
    EMBEDDED_CONFIGS,
    EMBEDDED_DATA,
    PLAN_DEPENDS_SUFFIX,
    PLAN_SUFFIX,
    PLANS_FOLDER,
    blake2b,
    config_folders,
    content_digest,
    distribution_base,
    is_digits,
    package_sources,
    scan_unchanged,
    source_digest,
    source_identity,
    usable_folder,
)
from .cache_trust import read_owned
from .lattice import Lattice

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

FORMAT = 1
MAGIC = b"MODPERF-PLAN\x00\x00\x00\x01"
FOLDER = PLANS_FOLDER
SUFFIX = PLAN_SUFFIX
SCAN_PREFIX = "scan-"
CONTEXT_PREFIX = "context-"
DEPENDS_SUFFIX = PLAN_DEPENDS_SUFFIX
#: Field values a persisted plan is keyed by (their repr is exact and stable).
_KEY_TYPES = (str, int, float, bool, type(None))
#: Package folders whose modules do not decide an answer (the command line parses and prints).
_NOT_ANSWERING = ("cli", "__pycache__")
_SCALARS = frozenset(_KEY_TYPES)
_NUMBERS = (int, float)


# --- reading and writing one file ------------------------------------------------------------


def _frame(value: Any) -> bytes:
    """A file of this format holding ``value`` (:func:`modperf.fast.persist.frame`)."""
    return b"".join(persist.frame(MAGIC, [marshal.dumps(value)]))


def _unframe(data: bytes | bytearray) -> Any:
    """The value of a whole, unaltered file of this format; None otherwise."""
    body = persist.unframe(data, MAGIC)
    if body is None:
        return None
    try:
        return marshal.loads(body[len(MAGIC):])
    except (ValueError, EOFError, TypeError):
        return None


def plain(value: Any) -> bool:
    """Whether ``value`` is plain data throughout: None, bools, ints, floats and strings in
    tuples, lists and dicts (marshal can also build code objects, bytes, sets and complex
    numbers: none is in a plan). A sequence of numbers is judged by adding it up (in C, a few
    nanoseconds an item: one that is not an int or a float fails the sum or makes it
    complex): a plan's lattice holds tens of thousands."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is list or kind is tuple:
        try:
            if type(sum(value)) in _NUMBERS:
                return True
        except (TypeError, OverflowError):  # (an int too large for a float beside a float: judged item by item)
            pass
        return all(type(v) in _SCALARS or plain(v) for v in value)
    if kind is dict:
        return all((type(k) in _SCALARS or plain(k)) and (type(v) in _SCALARS or plain(v)) for k, v in value.items())
    return False


def _read(path: str) -> Any:
    data = read_owned(path)
    return None if data is None else _unframe(data)


def _digest_text(*parts: Any) -> str:
    return blake2b(repr(parts).encode(), digest_size=16).hexdigest()


# --- what a plan depends on -------------------------------------------------------------------


def code_fingerprint() -> str:
    """A digest of modperf's version, this Python's ``marshal`` and every module of the package
    but the command line: any change to the code that resolves, keys, fills or answers makes
    every plan a miss."""
    return source_digest(f"{__version__}\0{FORMAT}\0{sys.version}\0{marshal.version}\0",
                         package_sources("", skip=_NOT_ANSWERING))


def numpy_fingerprint() -> str | None:
    """The digest of the version file of the numpy this interpreter would import (found the
    way the import finds it, without importing it); None when there is none."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            with open(os.path.join(folder, "version.py"), "rb") as f:
                return f"{folder}\0" + blake2b(f.read(), digest_size=16).hexdigest()
        except OSError:
            continue
    return None


def default_config_folders(model_configs: Sequence[str | os.PathLike[str]] | None) -> list[str] | None:
    """The model-config folders a default registry reads (:meth:`ModelRegistry.default`), in
    order, or None where the corpus package is not found without the catalog (then no plan is
    used)."""
    base = distribution_base()
    return None if base is None else config_folders(os.path.join(base, EMBEDDED_CONFIGS), model_configs)


def configs_fingerprint(folders: list[str]) -> str | None:
    """A digest of every file's name, size and mtime in the config folders; None when one
    cannot be listed (the registry then reports it)."""
    h = blake2b(digest_size=16)
    for folder in folders:
        h.update(f"{os.path.abspath(folder)}\0".encode())
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return None
        for name in names:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                return None
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def scan_current(depends: Any, root: str) -> bool:
    """Whether a remembered scan's folders and ``reuse.yaml`` files are as they were
    (:func:`modperf.fast.cache_keys.scan_unchanged`)."""
    try:
        scan_root, folders, sidecars, tables = depends
    except (TypeError, ValueError):
        return False
    return scan_root == root and scan_unchanged(root, folders, sidecars, tables)


def file_digest(path: str | None) -> str | None:
    """The digest of a file's bytes; None for no file or one that cannot be read."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return content_digest(f.read())
    except OSError:
        return None


# --- the plans ----------------------------------------------------------------------------------


class StoredPlan(Plan):
    """A plan read from disk: what :func:`modperf.fast.answer.fast_answer` reads, and the group's
    quality notes (``quality``: ``"none"``, ``"notes"`` with them in ``quality_found``, or
    ``"unknown"`` where the writer did not look)."""

    __slots__ = ("axis_checks", "echoed", "extrapolation_model", "grid", "local", "quality", "quality_found",
                 "template")
    #: (a persisted plan has no lane rule: a table with one is left to the engine)
    lanes = None

    def __init__(self, template: Answer, axis_checks: Any, echoed: Any, grid: Lattice, extrapolation_model: str,
                 local: int | None, quality: str, quality_found: Any) -> None:
        self.template = template
        self.axis_checks = axis_checks
        self.echoed = echoed
        self.grid = grid
        self.extrapolation_model = extrapolation_model
        self.local = local  # the heads coordinate where the grid has a heads axis
        self.quality = quality
        #: with quality "notes": the group's findings by (heads, axis values), with the axes
        self.quality_found = quality_found


class PlanStore:
    """The persisted plans of one database (data root, model-config folders) in one cache
    folder: :meth:`answer` reads them, :meth:`persist` writes them."""

    #: Plans read in one process at most (then the memo starts over; the files stay).
    MEMO = 4096

    def __init__(self, root: str, given: str | None, folders: list[str], cache: str) -> None:
        self.root = root
        #: The data root as given (None: the embedded corpus): an answer names its files by the
        #: paths a scan of the root as given builds, so a plan is kept per root as given too.
        self.given = given
        self._where = (root, given)
        self.config_folders = folders
        self.folder = os.path.join(cache, FOLDER)
        self._code: str | None = None
        self._context: Any = None  # (axis names,) of this code, read once
        self._checked: dict[Any, bool] = {}  # what the checks found, once per process
        #: per tuple of field names: (how to read the non-axis values, the plans by key)
        self._by_names: dict[tuple[Any, ...], tuple[Any, dict[Any, StoredPlan | None]]] = {}

    @classmethod
    def open(cls, data_root: str | os.PathLike[str] | None,
             model_configs: Sequence[str | os.PathLike[str]] | None) -> PlanStore | None:
        """The store of a database, or None where its data root or config folders are not
        plain folders named without the catalog (the database then opens as without plans,
        and reports what is wrong as it always did)."""
        chosen = data_root if data_root is not None else os.environ.get(DATA_ROOT_ENV) or None
        given = None if chosen is None else os.fspath(chosen)
        if chosen is None:
            base = distribution_base()
            if base is None:
                return None
            root = os.path.join(base, EMBEDDED_DATA)
        else:
            root = os.path.expanduser(os.fspath(chosen))
        folders = default_config_folders(model_configs)
        if folders is None or not os.path.isdir(root) or not all(os.path.isdir(f) for f in folders):
            return None
        cache = usable_folder()  # (a folder others can write: said once, not used)
        return None if cache is None else cls(os.path.abspath(root), given, folders, cache)

    # -- reading -------------------------------------------------------------------------------

    def code(self) -> str:
        if self._code is None:
            self._code = code_fingerprint()
        return self._code

    def _context_names(self) -> frozenset[str] | None:
        if self._context is None:
            found = _read(os.path.join(self.folder, CONTEXT_PREFIX + self.code() + DEPENDS_SUFFIX))
            self._context = (frozenset(found[1]),) if type(found) is tuple and found[0] == self.code() else ()
        return self._context[0] if self._context else None

    def axis_names(self) -> frozenset[str] | None:
        """The query fields that are interpolation axes (the point, not the plan), as the
        plans of this code were written with; None where none was written."""
        return self._context_names()

    def _names(self, names: tuple[Any, ...]) -> tuple[Callable[[Mapping[str, Any]], tuple[Any, ...]],
                                                       dict[Any, StoredPlan | None]] | None:
        """For one tuple of field names: how to read the values of the fields that are not
        axes (in order), and the plans read so far by those values and their types."""
        by_names = self._by_names.get(names)
        if by_names is None:
            axes = self._context_names()
            if axes is None:
                return None
            if len(self._by_names) >= self.MEMO:
                self._by_names.clear()
            keep = [n for n in names if n not in axes]
            getter = itemgetter(*keep) if len(keep) >= 2 else lambda fields: tuple([fields[n] for n in keep])
            by_names = self._by_names[names] = (getter, {})
        return by_names

    @staticmethod
    def _file_key(values: tuple[Any, ...]) -> tuple[tuple[Any, str], ...] | None:
        """The values with their types' names (what a plan's file is named by), or None where a
        value is of a type whose text is not exact and stable."""
        for value in values:
            if type(value) not in _KEY_TYPES:
                return None
        return tuple((value, type(value).__name__) for value in values)

    def answer(self, fields: Mapping[str, Any], quality: bool) -> Answer | None:
        """The answer from a persisted plan, or None where there is none that holds for these
        fields (the engine answers then)."""
        plan = self.plan_for(fields)
        if plan is None:
            return None
        notes = quality and plan.quality != "none"
        if notes and plan.quality != "notes":
            return None
        found = fast_answer(plan, fields)
        if found is None:  # axis values given as text (the command line's): read as the query reads them
            as_ints = _digit_axes(plan.axis_checks, fields)
            found = None if as_ints is None else fast_answer(plan, as_ints)
            if found is None:
                return None
        answer, _, point = found
        if notes:
            answer.quality = quality_notes(plan, plan.quality_found, point, answer.kind == "exact")
        return answer

    def plan_for(self, fields: Mapping[str, Any]) -> StoredPlan | None:
        """The persisted plan that holds for these fields (their names in order, and the values
        and types of those that are not axes), or None; read once per process and key."""
        names = tuple(fields)
        by_names = self._by_names.get(names) or self._names(names)
        if by_names is None:
            return None
        getter, plans = by_names
        values = getter(fields)
        key = (values, tuple(map(type, values)))
        try:
            return plans[key]
        except KeyError:
            return self._read(names, values, key, plans)
        except TypeError:  # an unhashable value
            return None

    def _read(self, names: tuple[Any, ...], values: tuple[Any, ...], key: Any,
              plans: dict[Any, StoredPlan | None]) -> StoredPlan | None:
        """The plan of these field names and non-axis values read from disk into the memo
        ``plans`` under ``key`` (None where none holds: remembered too)."""
        if len(plans) >= self.MEMO:
            plans.clear()
        file_key = self._file_key(values)
        plan = plans[key] = None if file_key is None else self._load(names, file_key)
        return plan

    def _path(self, names: tuple[Any, ...], key: Any) -> str:
        name = _digest_text(self.code(), self._where, self.config_folders, names, key)
        return os.path.join(self.folder, name + SUFFIX)

    def _load(self, names: tuple[Any, ...], key: Any) -> StoredPlan | None:
        path = self._path(names, key)
        doc = _read(path)
        if type(doc) is not dict:
            return None
        try:
            if doc["identity"] != (FORMAT, self.code(), self._where, self.config_folders, names, key) \
                    or not plain(doc) or not self._holds(doc):
                return None
            template = object.__new__(Answer)
            template.__dict__.update(doc["template"])
            plan = StoredPlan(template, doc["axis_checks"], doc["echoed"], Lattice.from_plain(doc["lattice"]),
                              doc["extrapolation_model"], doc["local"], doc["quality"], doc["quality_found"])
        except (KeyError, TypeError, ValueError, IndexError, RecursionError):  # (plain: nested past any plan)
            return None
        try:  # noqa: SIM105  (contextlib: a module more for a cold process)
            os.utime(path)  # used now: the cache's size bound removes the files used longest ago
        except OSError:
            pass
        return plan

    def _once(self, what: Any, check: Callable[[], bool]) -> bool:
        found = self._checked.get(what)
        if found is None:
            found = self._checked[what] = bool(check())
        return found

    def _holds(self, doc: dict[str, Any]) -> bool:
        """Whether everything the plan depends on is as it was written (module doc)."""
        if not self._once(("numpy", doc["numpy"]), lambda: numpy_fingerprint() == doc["numpy"]) \
                or not self._once(("configs", doc["configs"]),
                                  lambda: configs_fingerprint(self.config_folders) == doc["configs"]):
            return False
        scan = doc["scan"]

        def scan_holds() -> bool:
            depends = _read(os.path.join(self.folder, SCAN_PREFIX + scan + DEPENDS_SUFFIX))
            return depends is not None and _digest_text(depends) == scan and scan_current(depends, self.root)

        if not self._once(("scan", scan), scan_holds):
            return False
        for source in doc["sources"]:
            if not self._once(("source", source), lambda s=source: _current_source(s)):  # type: ignore[misc]
                return False
        spec_path, spec_digest = doc["spec"]
        return self._once(("spec", spec_path, spec_digest), lambda: file_digest(spec_path) == spec_digest)

    # -- writing -------------------------------------------------------------------------------

    def persist(self, fields: Mapping[str, Any], plan: Any, tables: Sequence[Any], quality: str,
                watched: Any, axis_names: frozenset[str], spec_path: str | None) -> bool:
        """Write ``plan`` (the engine's, after its first answer) for the next process; False
        where it cannot hold (module doc: what it needs) or cannot be written. ``tables``: the
        keyed tables its resolution (and quality notes) loaded, None for one that failed;
        ``watched``: (folders, sidecars, tables read) of the catalog scan's record."""
        try:
            return self._persist(fields, plan, tables, quality, watched, axis_names, spec_path)
        except Exception as exc:  # a plan that cannot be written is no plan, never an error
            persist.note(f"query plan not written ({self.folder}): {getattr(exc, 'detail', None) or exc}")
            return False

    def _persist(self, fields: Mapping[str, Any], plan: Any, tables: Sequence[Any], quality: str, watched: Any,
                 axis_names: frozenset[str], spec_path: str | None) -> bool:
        if watched is None or plan.lanes is not None or not tables:
            return False
        sources: set[tuple[Any, ...]] = set()
        for keyed in tables:
            if keyed is None or keyed.cache_source is None:  # failed, or not what the cache holds
                return False
            sources.add(_identity_tuple(keyed.cache_source))
        context = (self.code(), tuple(sorted(axis_names)))
        if self._context_names() != frozenset(axis_names):
            if not _write(os.path.join(self.folder, CONTEXT_PREFIX + self.code() + DEPENDS_SUFFIX), _frame(context)):
                return False
            self._context = (frozenset(axis_names),)
        names = tuple(fields)
        by_names = self._names(names)
        key = None if by_names is None else self._file_key(by_names[0](fields))
        if key is None:
            return False
        found = self._load(names, key)  # a plan that holds is this one: not written again
        if found is not None and (quality == "unknown" or found.quality == quality):
            return True
        depends = (self.root, [(rel, list(st)) for rel, st in watched[0]], [(rel, d) for rel, d in watched[1]],
                   [(rel, list(key)) for rel, key in watched[2]])
        scan = _digest_text(depends)
        scan_file = os.path.join(self.folder, SCAN_PREFIX + scan + DEPENDS_SUFFIX)
        if not _same(_read(scan_file), depends):
            if not _write(scan_file, _frame(depends)):
                return False
            persist.evict(self.folder, DEPENDS_SUFFIX, keep=scan_file)
        numpy_fp = numpy_fingerprint()
        configs = configs_fingerprint(self.config_folders)
        if numpy_fp is None or configs is None:
            return False
        doc = {
            "identity": (FORMAT, self.code(), self._where, self.config_folders, names, key),
            "numpy": numpy_fp, "configs": configs, "scan": scan, "sources": sorted(sources),
            "spec": (spec_path, file_digest(spec_path)),
            "template": dict(plan.template.__dict__), "axis_checks": plan.axis_checks, "echoed": plan.echoed,
            "lattice": plan.grid.plain_parts(), "extrapolation_model": plan.extrapolation_model, "local": plan.local,
            "quality": quality, "quality_found": plan.quality_found if quality == "notes" else None,
        }
        data = _frame(doc)  # (raises ValueError on a value marshal cannot hold: no plan then)
        if not _same(_unframe(data), doc):  # every value comes back as it was, types included
            return False
        path = self._path(names, key)
        if read_owned(path) == bytearray(data):
            return True
        if not _write(path, data):
            return False
        persist.evict(self.folder, SUFFIX, keep=path)
        return True


def _digit_axes(axis_checks: Any, fields: Mapping[str, Any]) -> dict[str, Any] | None:
    """``fields`` with each axis value that is a string of ASCII digits as the int it spells
    (the query parses such text to that int: modperf.base.limits.parse_int); None where none is."""
    out = None
    for check in axis_checks:
        name = check[0]
        value = fields.get(name) if name is not None else None
        if type(value) is str and is_digits(value):
            if out is None:
                out = dict(fields)
            out[name] = int(value)
    return out


def _same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same value of the same types throughout (NaN is NaN):
    what marshal must give back for a plan to be written (it writes a numpy scalar as bytes)."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is float:
        return a == b or (a != a and b != b)
    if kind is tuple or kind is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if kind is dict:
        return len(a) == len(b) and all(_same(k, j) and _same(v, w) for (k, v), (j, w) in zip(a.items(), b.items()))
    return bool(a == b)


def _current_source(kept: tuple[Any, ...]) -> bool:
    """Whether a table file's identity now is the kept one."""
    now = source_identity(kept[0])
    return now is not None and _identity_tuple(now) == kept


def _identity_tuple(identity: dict[str, Any]) -> tuple[Any, ...]:
    return (identity["path"], identity["size"], identity["mtime_ns"], identity["content"])


def _write(path: str, data: bytes) -> bool:
    """One file of the plans folder (not fsynced: a torn file fails its digest and is a miss);
    False, with a note, where it cannot be written."""
    return persist.write(path, [data], durable=False, failed="query plan not written")

__all__ = ["FOLDER", "MAGIC", "SUFFIX", "PlanStore", "StoredPlan", "code_fingerprint"]
