"""Batches of queries answered plan by plan: the same answer lines as one query at a time,
written faster.

``modperf query --batch`` answers a chunk of lines at once. Lines whose non-axis fields are
equal share one resolved plan (the key :meth:`QueryEngine.query` caches plans by); each group's
points go through the plan's grid in one vectorised lookup (:meth:`Grid.lookup_many`, the same
latencies bit for bit as the scalar lookup), and each answer line is the plan's JSON text with
the point's parts filled in. A group's refused points get their nearest measured cells from
one vectorised search and their error line from the plan's refusal text; an extrapolated
point its scalar lookup written into the plan's text. A lane table's lines go lane by lane
(each line's lane from its point). A value where an integer goes that is not one (text, a
float, null) is read once per value as the query reads it (:meth:`QueryEngine.axis_value`:
its coordinate, or its error line); a plan whose resolution is refused gives its error line
to every line of the group, once for the batch. What is left -- a value that is not a scalar,
a non-finite latency, an axis the table does not have -- is answered by the reference path,
``engine.query`` then the JSON writer, line by line (a refused line's text kept); the text of
a refused or extrapolated point is kept per (plan, point) for the batch, since it depends on
nothing else (a line's answer depends on its fields alone, never on the lines before it). The
lines of one shape (:class:`modperf.fast.batch.Shape`: their bytes equal but for their axis
integers) come as columns of those integers (:meth:`LineAnswerer.answer_shaped`): one plan, no
dict per line.
``tests/test_query_lines.py`` checks the output against the reference byte for byte. A short
batch answers from persisted plans first (:mod:`modperf.fast.plan_lines`) and hands this path the
lines no plan answers.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..base import errors as E
from ..base import limits
from ..base.jsonio import dumps, dumps_as_is, dumps_small
from ..data.families.base import HEADS
from ..fast.answer import extrapolation_of
from ..fast.answer_text import KIND_TEXT, Template, holes, make_template, reach_parts
from ..fast.batch import error_line
from .engine import AXIS_NAMES, NOT_LOOKED_UP, QueryEngine, QueryPlan, refusal_error, refusal_where
from .interp import EXACT, EXTRAPOLATED, INTERPOLATED, REFUSED, Lookup

#: Markers for the parts of a refusal (the error's text escapes control characters).
_REFUSAL_MARK = "@modperf-refusal-part-{}@"
#: Plans with a template kept, and points whose slow answer text is kept, at most.
_KEEP_PLANS = 4096
_KEEP_POINTS = 1 << 16


#: The types of a JSON scalar (what the query's field check accepts from a batch line).
_SCALARS = frozenset((str, int, float, bool, type(None)))
#: Longest text (characters) of the values a line's kept error is keyed by: a line may hold
#: megabytes, and a key holds them as long as it is kept.
_KEY_CHARS = 1024


def _scalar_axes(fields: Mapping[str, Any], layout: _Layout) -> bool:
    """Whether every axis value of a line is a JSON scalar (resolving its plan reads no axis
    value but to check that)."""
    for name in layout.axis_names:  # noqa: SIM110  (a loop: no generator per line)
        if type(fields[name]) not in _SCALARS:
            return False
    return True


def _kept(store: dict[int, tuple[Any, Any]], plan: QueryPlan, make: Callable[[QueryPlan], Any]) -> Any:
    """What ``make(plan)`` gives, made once per plan (by identity; the plan is held, so its id
    is not reused) and kept for at most ``_KEEP_PLANS`` plans."""
    kept = store.get(id(plan))
    if kept is not None and kept[0] is plan:
        return kept[1]
    made = make(plan)
    if len(store) >= _KEEP_PLANS:
        store.clear()
    store[id(plan)] = (plan, made)
    return made


class _Refusal:
    """One plan's refusal line as a %-format: (each of the point's axis values, where it lies,
    the nearest measured cells as a list's repr, the same as JSON)."""

    __slots__ = ("cell_fmt", "fmt")

    def __init__(self, fmt: str, cell_fmt: str) -> None:
        self.fmt = fmt
        self.cell_fmt = cell_fmt  # one cell's axis values as a dict's repr (the point's, in fmt)


class _Layout:
    """The field names of a line, in order: which are the plan's and which are axes."""

    __slots__ = ("axis_names", "plan_names", "plan_values")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.plan_names = tuple(n for n in names if n not in AXIS_NAMES)
        self.axis_names = frozenset(n for n in names if n in AXIS_NAMES)
        getter = operator.itemgetter(*self.plan_names) if self.plan_names else (lambda _: ())
        if len(self.plan_names) == 1:
            self.plan_values: Callable[[Mapping[str, Any]], tuple[Any, ...]] = lambda f: (getter(f),)
        else:
            self.plan_values = getter


class _ShapedItems(Sequence[dict[str, Any]]):
    """The fields of a shape's lines (:class:`modperf.fast.batch.Shape`), made when asked for: the
    shape's fields with the line's own integers in its holes."""

    __slots__ = ("columns", "fields", "holes", "n")

    def __init__(self, fields: dict[str, Any], holes: tuple[str, ...], columns: list[tuple[bytes, ...]],
                 n: int) -> None:
        self.fields = fields
        self.holes = holes
        self.columns = dict(zip(holes, columns))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        fields = dict(self.fields)
        for name, col in self.columns.items():
            fields[name] = int(col[i])
        return fields

    def column(self, name: str, rows: list[int]) -> list[int]:
        col = self.columns[name]
        return list(map(int, col if len(rows) == self.n else map(col.__getitem__, rows)))


class LineAnswerer:
    """Answers lists of query fields (one chunk of a batch); keeps templates and slow answers
    between chunks."""

    #: The fields a line of a shape may give as its own integers (:class:`modperf.fast.batch.Shape`):
    #: the interpolation axes, which are the point, not the plan.
    free = AXIS_NAMES

    def __init__(self, engine: QueryEngine, *, persist: bool = False) -> None:
        self.engine = engine
        #: Whether the plans this batch resolves are persisted after their first answers
        #: (modperf.fast.plans: for a short batch, whose next run answers from them; checking a
        #: plan already on disk costs a process about 15 ms, a long batch's path does not).
        self.persist = persist
        self._templates: dict[int, tuple[QueryPlan, Template | None]] = {}
        self._refusals: dict[int, tuple[QueryPlan, _Refusal | None]] = {}
        self._nearest_texts: dict[int, tuple[QueryPlan, dict[tuple[int, ...], tuple[str, str]]]] = {}
        self._extrapolations: dict[int, tuple[QueryPlan, dict[tuple[str, ...], tuple[str, str] | bool]]] = {}
        # per plan: the answer line of each extrapolated or refused point (by its axis values' text)
        self._slow: dict[int, tuple[QueryPlan, dict[tuple[str, ...], tuple[bool, str]]]] = {}
        self._n_slow = 0  # lines kept in all
        self._layouts: dict[tuple[str, ...], _Layout] = {}
        # per plan: each axis value read as the query reads it (its coordinate, or its error line)
        self._axis_values: dict[int, tuple[QueryPlan, dict[tuple[str, type, str], int | tuple[bool, str]]]] = {}
        # per (field names, values and types of the non-axis fields): the error line of a plan
        # whose resolution is refused
        self._failed: dict[tuple[Any, ...], tuple[bool, str]] = {}
        # per line (field names, values and their types): its error line from the reference path
        self._line_errors: dict[tuple[Any, ...], tuple[bool, str]] = {}

    def reference(self, fields: Mapping[str, Any]) -> tuple[bool, str]:
        """One line the way :func:`modperf.fast.batch.run_lines` answers it. A line refused once is
        refused again with the same text (kept, for lines of scalar values)."""
        types = tuple(map(type, fields.values()))
        key = None
        if _SCALARS.issuperset(types):
            # (by each value's text: -0.0 equals 0.0, but an error quotes it as given)
            texts = tuple(map(repr, fields.values()))
            if sum(map(len, texts)) + sum(map(len, fields)) <= _KEY_CHARS:
                key = (tuple(fields), texts, types)
        found = self._line_errors.get(key) if key is not None else None
        if found is not None:
            return found
        try:
            return True, dumps_small(self.engine.query(fields).to_dict())
        except Exception as exc:  # a bad line never stops the batch
            found = (False, dumps(error_line(exc)))
            typed = isinstance(exc, E.ModperfError)
        if key is not None and typed:
            if len(self._line_errors) >= _KEEP_POINTS:
                self._line_errors.clear()
            self._line_errors[key] = found
        return found

    def answer(self, items: Sequence[Mapping[str, Any]]) -> list[tuple[bool, str]]:
        """``(ok, line)`` per item, in order: what :meth:`reference` gives for it."""
        out: list[tuple[bool, str] | None] = [None] * len(items)
        # lines are grouped by their field names (in order) and the values and types of the
        # non-axis ones: a group is finer than the plan cache's key, so one plan answers it
        for (layout, _, _), rows in self._groups(items, out).items():
            self._group(layout, rows, items, out)
        return [o if o is not None else self.reference(items[i]) for i, o in enumerate(out)]

    def answer_shaped(self, fields: dict[str, Any], holes: tuple[str, ...], columns: list[tuple[bytes, ...]],
                      n: int) -> list[tuple[bool, str]] | None:
        """``(ok, line)`` per line of a shape (:class:`modperf.fast.batch.Shape`: ``fields`` with the
        integers ``columns`` in the fields ``holes``, ``n`` lines): what :meth:`answer` gives
        for their fields; None where the shape's lines are to be answered by :meth:`answer`
        (an axis given as anything but an integer)."""
        names = tuple(fields)
        layout = self._layouts.get(names) or self._layout(names)
        if not layout.axis_names <= set(holes):
            return None
        items = _ShapedItems(fields, holes, columns, n)
        out: list[tuple[bool, str] | None] = [None] * n
        self._group(layout, list(range(n)), items, out)
        return [o if o is not None else self.reference(items[i]) for i, o in enumerate(out)]

    def _groups(self, items: Sequence[Mapping[str, Any]], out: list[tuple[bool, str] | None]
                ) -> dict[tuple[Any, ...], list[int]]:
        """The lines of each group (key: layout, non-axis values, their types); a line whose
        value cannot be a key is answered (by the reference path) into ``out``."""
        names = list(map(tuple, items))
        layouts = self._layouts
        if names.count(names[0]) == len(names) if names else False:
            # one layout (the common chunk): the keys made a chunk at a time
            layout = layouts.get(names[0]) or self._layout(names[0])
            values = list(map(layout.plan_values, items))
            keys = list(zip(itertools.repeat(layout), values, map(tuple, map(map, itertools.repeat(type), values))))
            index: dict[tuple[Any, ...], int] = {}
            try:
                ids = [index.setdefault(k, len(index)) for k in keys]
            except TypeError:  # an unhashable value: line by line below
                pass
            else:
                if len(index) == 1:
                    return {keys[0]: list(range(len(items)))}
                found: dict[tuple[Any, ...], list[int]] = {k: [] for k in index}
                rows = list(found.values())
                for i, g in enumerate(ids):
                    rows[g].append(i)
                return found
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, (fields, line_names) in enumerate(zip(items, names)):
            layout = layouts.get(line_names) or self._layout(line_names)
            plan_values = layout.plan_values(fields)
            try:
                groups.setdefault((layout, plan_values, tuple(map(type, plan_values))), []).append(i)
            except TypeError:  # an unhashable value: the reference path says what is wrong
                out[i] = self.reference(fields)
        return groups

    def _columns(self, plan: QueryPlan, layout: _Layout, rows: list[int], items: Sequence[Mapping[str, Any]]
                 ) -> tuple[list[Any], dict[int, list[str]]] | dict[int, tuple[bool, str] | None] | None:
        """Per axis of the plan, the values of the lines ``rows`` and their JSON text: an
        in-range plain integer as it is, any other value read as the query reads it
        (:meth:`QueryEngine.axis_value`: text parsed, null or left out the plan's fixed value;
        kept per value); or, where some line's value is refused, per such line its error line
        (None: the reference path answers it, for a value that is not a scalar); None where an
        axis has no value."""
        columns: list[tuple[int, Any]] = []
        n = len(rows)
        failed: dict[int, tuple[bool, str] | None] = {}
        shaped = items if isinstance(items, _ShapedItems) else None
        if shaped is None:
            lines = items if n == len(items) else list(map(items.__getitem__, rows))  # (rows: every line, or some)
        for j, name in enumerate(plan.axis_fields):
            if name == HEADS:
                columns.append((j, plan.local))
                continue
            fixed = plan.fixed.get(name)
            if shaped is not None and name in layout.axis_names:  # (a shape's axes: its lines' own integers)
                col = shaped.column(name, rows)
            elif name in layout.axis_names:
                col = list(map(operator.itemgetter(name), lines))
            elif fixed is not None:
                col = [fixed] * n
            else:
                return None
            rng = limits.range_of(name)
            if set(map(type, col)) != {int} or min(col) < rng.low or max(col) > rng.high:
                read = _kept(self._axis_values, plan, lambda _: {})
                for k, (i, v) in enumerate(zip(rows, col)):
                    if type(v) is int and rng.low <= v <= rng.high:
                        continue
                    if type(v) not in _SCALARS:
                        failed[i] = None  # (the query's field check refuses the line: by reference)
                        continue
                    key = (name, type(v), repr(v))  # (by its text: -0.0 equals 0.0, but an error quotes it)
                    found = read.get(key)
                    if found is None:
                        try:
                            found = self.engine.axis_value(plan, name, v)
                        except E.ModperfError as exc:
                            found = (False, dumps(error_line(exc)))
                        if len(key[2]) <= _KEY_CHARS:  # (long text is not kept: a key holds it)
                            if len(read) >= _KEEP_POINTS:
                                read.clear()
                            read[key] = found
                    if type(found) is int:
                        col[k] = found
                    else:
                        failed.setdefault(i, found)  # (the first axis refused is the line's error)
            columns.append((j, col))
        if failed:
            return failed
        cols = [c if isinstance(c, int) else np.array(c, dtype=np.int64) for _, c in columns]
        return cols, {j: list(map(int.__repr__, c)) for j, c in columns if not isinstance(c, int)}

    def _layout(self, names: tuple[str, ...]) -> _Layout:
        if len(self._layouts) >= _KEEP_PLANS:
            self._layouts.clear()
        layout = self._layouts[names] = _Layout(names)
        return layout

    # -- one group of lines sharing a plan ----------------------------------------------------

    def _group(self, layout: _Layout, rows: list[int],
               items: Sequence[Mapping[str, Any]], out: list[tuple[bool, str] | None]) -> None:
        engine = self.engine
        first = items[rows[0]]
        values = layout.plan_values(first)
        types = tuple(map(type, values))
        names = tuple(first)
        # (a group keeps -0.0 and 0.0 together, which an error quotes apart: no float; long
        # text is not kept for the batch, which a key would hold)
        failed_key = (names, values, types) if float not in types else None
        refusal = self._failed.get(failed_key) if failed_key is not None else None
        if refusal is None:
            try:
                plan = engine.plan(first)
            except E.ModperfError as exc:
                # the plan's fields are refused (a contradiction, a key the table does not
                # cover, an unknown field): that error is every line's whose axis values are
                # scalars, whatever its point (resolution reads no axis value but to check
                # that it is a scalar)
                if failed_key is None or not _scalar_axes(first, layout):
                    return  # (refused for its own value, maybe: every line by reference)
                refusal = (False, dumps(error_line(exc)))
                if sum(len(v) for v in (*names, *values) if type(v) is str) <= _KEY_CHARS:
                    if len(self._failed) >= _KEEP_PLANS:
                        self._failed.clear()
                    self._failed[failed_key] = refusal
            except Exception:
                return  # every line of the group through the reference path (it raises there too)
        if refusal is not None:
            if isinstance(items, _ShapedItems):  # (a shape's axis values are its integers)
                for i in rows:
                    out[i] = refusal
            else:
                for i in rows:
                    if _scalar_axes(items[i], layout):
                        out[i] = refusal
            return
        axis_fields = plan.axis_fields
        if any(k not in axis_fields for k in layout.axis_names):
            return  # an axis the table does not have: the reference path names the table's keys
        columns = self._columns(plan, layout, rows, items)
        if isinstance(columns, dict):  # some lines' values are refused: their error lines (or by reference)
            for i, line in columns.items():
                if line is not None:
                    out[i] = line
            rows = [i for i in rows if i not in columns]
            columns = self._columns(plan, layout, rows, items) if rows else None
        if not isinstance(columns, tuple):
            return
        cols, text_cols = columns
        if plan.lanes is None:
            self._answer_points(plan, rows, cols, text_cols, items, out)
            if plan.pending is not None and self.persist:  # its first answers: kept for the next process
                if engine.annotate_quality and plan.quality_found is NOT_LOOKED_UP:
                    plan.quality_found = engine.quality_found(plan)
                engine.persist(plan, first)
            return
        # the kernel is picked per point (a lane rule): each lane's points through its plan
        for lane, at in self._lanes(plan, cols, len(rows)):
            self._answer_points(lane, [rows[r] for r in at], [c if isinstance(c, int) else c[at] for c in cols],
                                {j: [t[r] for r in at] for j, t in text_cols.items()}, items, out)

    @staticmethod
    def _lanes(plan: QueryPlan, cols: list[Any], n: int) -> list[tuple[QueryPlan, list[int]]]:
        """Per lane that runs some of the points ``cols`` (``n`` of them): the lane's plan
        (:meth:`modperf.query.engine.QueryPlan.lane_for`) and the positions of its points."""
        columns = [itertools.repeat(c, n) if isinstance(c, int) else c.tolist() for c in cols]
        by_lane: dict[int, tuple[QueryPlan, list[int]]] = {}
        for r, point in enumerate(zip(*columns)):
            lane = plan.lane_for(dict(zip(plan.axis_fields, point)))
            by_lane.setdefault(id(lane), (lane, []))[1].append(r)
        return list(by_lane.values())

    def _answer_points(self, plan: QueryPlan, rows: list[int], cols: list[Any], text_cols: dict[int, list[str]],
                       items: Sequence[Mapping[str, Any]], out: list[tuple[bool, str] | None]) -> None:
        """The lines ``rows`` of one plan (no lane rule), their axis values ``cols`` (an int
        where one value stands for every line) and their text ``text_cols``: answered into
        ``out``, left None where the reference path is to answer."""
        engine = self.engine
        template = self._template(plan)
        if template is None:
            return
        lat, kinds, spent = plan.grid.lookup_many_spent(cols)
        texts = [text_cols[j] for j in template.field_order]
        fmt = template.fmt
        latencies = list(map(float.__repr__, lat.tolist()))
        # exact and interpolated points of finite latency: the template filled in (a NaN or an
        # infinity: the reference path writes what it becomes)
        plain = ((kinds == EXACT) | (kinds == INTERPOLATED)) & np.isfinite(lat)
        if plain.all():
            at: list[int] | range = range(len(rows))
            sel_rows, sel_lat, sel_kind, sel_texts = rows, latencies, kinds.tolist(), texts
        else:
            at = np.flatnonzero(plain).tolist()
            sel_rows, sel_lat, sel_kind = list(map(rows.__getitem__, at)), list(map(latencies.__getitem__, at)), \
                kinds[plain].tolist()
            sel_texts = [list(map(t.__getitem__, at)) for t in texts]
        lines = [fmt % parts for parts in zip(sel_lat, map(KIND_TEXT.__getitem__, sel_kind),
                                              itertools.repeat("null"), *sel_texts, itertools.repeat("null"))]
        if template.quality:
            for n, (r, kind) in enumerate(zip(at, sel_kind)):
                notes = engine.quality_of(plan, [c if isinstance(c, int) else int(c[r]) for c in cols])
                if notes is not None:
                    lines[n] = fmt % (latencies[r], KIND_TEXT[kind], "null", *[t[r] for t in texts],
                                      dumps_small(notes))
        for i, line in zip(sel_rows, lines):
            out[i] = (True, line)
        if plain.all():
            return
        # extrapolated or refused: depends on nothing but the plan and the point (the text
        # kept for the batch per plan -- the plan is the field names in order, and the values
        # of the others: two lines of one group key may differ in which axes they give -- by
        # the point's axis values' text; the heads are the plan's)
        slow = self._slow_of(plan)
        refused: list[tuple[int, int, tuple[str, ...]]] = []  # (position, line, memo key)
        extrapolated: list[tuple[int, int]] = []  # (position, line)
        memos: list[tuple[str, ...]] = []
        other = np.flatnonzero(~plain).tolist()
        points = zip(*[list(map(t.__getitem__, other)) for t in text_cols.values()]) if text_cols \
            else itertools.repeat(())
        for r, kind, memo in zip(other, kinds[~plain].tolist(), points):
            found = slow.get(memo)
            if found is not None:
                out[rows[r]] = found
            elif kind == REFUSED:
                refused.append((r, rows[r], memo))
            elif kind == EXTRAPOLATED:
                extrapolated.append((r, rows[r]))
                memos.append(memo)
        if extrapolated:
            self._extrapolate(plan, template, cols, texts, latencies, spent, extrapolated, items, out)
            slow = self._memo_room(plan, len(memos))
            for (_, i), memo in zip(extrapolated, memos):
                found = out[i]
                if found is not None:
                    slow[memo] = found
        if refused:
            self._refuse(plan, cols, text_cols, spent, refused, items, out)

    def _slow_of(self, plan: QueryPlan) -> dict[tuple[str, ...], tuple[bool, str]]:
        return _kept(self._slow, plan, lambda _: {})

    def _memo_room(self, plan: QueryPlan, adding: int) -> dict[tuple[str, ...], tuple[bool, str]]:
        """The plan's kept lines, with room for ``adding`` more: every plan's are dropped when
        all of them would hold ``_KEEP_POINTS``."""
        if self._n_slow + adding >= _KEEP_POINTS:
            self._slow.clear()
            self._n_slow = 0
        self._n_slow += adding
        return self._slow_of(plan)

    def _extrapolate(self, plan: QueryPlan, template: Template, cols: list[Any], texts: list[list[str]],
                     latencies: list[str], spent: np.ndarray, extrapolated: list[tuple[int, int]],
                     items: Sequence[Mapping[str, Any]], out: list[tuple[bool, str] | None]) -> None:
        """The answer lines of a group's extrapolated points (positions in the group, lines):
        the latency and the distance spent from the group's lookup (the scalar lookup's bit
        for bit), the axes beyond the range from the point, the extrapolation part from the
        plan's text for those axes (:func:`modperf.fast.answer.extrapolation_of` with a marker for
        the distance)."""
        grid = plan.grid
        at = np.array([r for r, _ in extrapolated], dtype=np.intp)
        beyond: list[Any] = []  # per axis: whether each point lies beyond its range (or one bool)
        for a, c in enumerate(cols):
            lo, hi = int(grid.values[a][0]), int(grid.values[a][-1])
            if isinstance(c, np.ndarray):
                beyond.append(((c[at] < lo) | (c[at] > hi)).tolist())
            else:
                beyond.append(itertools.repeat(not lo <= c <= hi))
        distances = spent[at].tolist()
        parts = _kept(self._extrapolations, plan, lambda _: {})
        fmt = template.fmt
        for (r, i), distance, *outside in zip(extrapolated, distances, *beyond):
            axes = tuple([grid.axes[a] for a, o in enumerate(outside) if o])
            text = parts.get(axes)
            if text is None:
                text = parts[axes] = self._extrapolation_text(plan, axes)
            latency = latencies[r]
            if text is False or latency[-1] in "nf" or not distance > 0.0:  # (the last: not extrapolated)
                found = self._extrapolated(plan, template, [c if isinstance(c, int) else int(c[r]) for c in cols],
                                           [t[r] for t in texts])
                out[i] = found if found is not None else self.reference(items[i])
                continue
            notes = None
            if template.quality:
                notes = self.engine.quality_of(plan, [c if isinstance(c, int) else int(c[r]) for c in cols])
            extrapolation = text[0] + float.__repr__(round(distance, 6)) + text[1]
            out[i] = (True, fmt % (latency, '"extrapolated"', extrapolation, *[t[r] for t in texts],
                                   "null" if notes is None else dumps_small(notes)))

    @staticmethod
    def _extrapolation_text(plan: QueryPlan, axes: tuple[str, ...]) -> tuple[str, str] | bool:
        """The plan's extrapolation part for points beyond the range of ``axes``, as the text
        before and after the distance; False where a marker distance does not show once."""
        found = Lookup(0.0, EXTRAPOLATED, 0.0, (), axes)  # (the distance: reach_parts' marker)
        return reach_parts(extrapolation_of(plan.grid, plan.extrapolation_model, found))

    def _extrapolated(self, plan: QueryPlan, template: Template, point: list[int], texts: list[str]
                      ) -> tuple[bool, str] | None:
        """An extrapolated point's answer line: its scalar lookup written into the plan's
        template; None where the reference path must write it (a non-finite number)."""
        found = plan.grid.lookup(point)
        latency = float.__repr__(found.latency_ms)
        if found.kind != EXTRAPOLATED or latency[-1] in "nf":
            return None
        try:
            extrapolation = dumps_as_is(extrapolation_of(plan.grid, plan.extrapolation_model, found))
        except ValueError:
            return None
        notes = self.engine.quality_of(plan, point) if template.quality else None
        return True, template.fmt % (latency, '"extrapolated"', extrapolation, *texts,
                                     "null" if notes is None else dumps_small(notes))

    def _refuse(self, plan: QueryPlan, cols: list[Any], text_cols: dict[int, list[str]], spent: np.ndarray,
                refused: list[tuple[int, int, tuple[Any, ...]]], items: Sequence[Mapping[str, Any]],
                out: list[tuple[bool, str] | None]) -> None:
        """The refusal lines of a group's refused points (positions in the group, lines, memo
        keys): the nearest measured cells of all of them in one search, each line the plan's
        refusal text with the point's parts filled in."""
        refusal = self._refusal(plan)
        if refusal is None:
            found_lines = [self.reference(items[i]) for _, i, _ in refused]
        else:
            at = np.array([r for r, _, _ in refused], dtype=np.intp)
            grid = plan.grid
            nearest = grid.nearest_covered_at([c if isinstance(c, int) else c[at] for c in cols]).tolist()
            local = repr(plan.local)
            axis_texts = [[local] * len(refused) if j not in text_cols else [text_cols[j][r] for r, _, _ in refused]
                          for j in range(len(cols))]
            cell_fmt, fmt = refusal.cell_fmt, refusal.fmt
            wheres = (refusal_where(math.inf), refusal_where(0.0))
            where_texts = list(map(wheres.__getitem__, np.isfinite(spent[at]).tolist()))
            # the nearest cells' text (as a list's repr, and as JSON), per set of cells
            texts = _kept(self._nearest_texts, plan, lambda _: {})
            if len(texts) >= _KEEP_POINTS:
                texts.clear()
            keys = list(map(tuple, nearest))
            nears = list(map(texts.get, keys))
            if None in nears:
                for n, key in enumerate(keys):
                    if nears[n] is None:
                        near = texts.get(key)
                        if near is None:
                            listed = "[" + ", ".join([cell_fmt % grid.measured_cell(c) for c in key]) + "]"
                            near = texts[key] = (listed, listed.replace("'", '"'))
                        nears[n] = near
            found_lines = [(False, fmt % (*parts, where, *near))
                           for *parts, where, near in zip(*axis_texts, where_texts, nears)]
        slow = self._memo_room(plan, len(refused))
        for (_, i, memo), found in zip(refused, found_lines):
            slow[memo] = found
            out[i] = found

    def _refusal(self, plan: QueryPlan) -> _Refusal | None:
        return _kept(self._refusals, plan, self._make_refusal)

    @staticmethod
    def _make_refusal(plan: QueryPlan) -> _Refusal | None:
        """The plan's refusal line as :func:`modperf.query.engine.refusal_error` and the error line's
        writer make it, with markers where the point's parts go; None where that text cannot be
        trusted: an axis name that is not a plain identifier (its repr and JSON would differ
        by more than the quotes), a message long enough to be cut, a marker the plan's own
        text holds."""
        axes = plan.grid.axes
        if not all(a.isidentifier() and a.isascii() for a in axes):
            return None
        marks = [_REFUSAL_MARK.format(k) for k in range(3)]

        class _Text:  # a part written as is by str() and, through E._plain, by the values
            def __init__(self, text: str) -> None:
                self.text = text

            def __str__(self) -> str:
                return self.text

        exc = refusal_error(plan, _Text(marks[0]), marks[1], _Text(marks[2]))
        # the longest point and nearest text stays far from the cut (E.MAX_TEXT)
        if len(exc.detail) + 100 * len(axes) + 200 > E.MAX_TEXT:
            return None
        text = dumps(error_line(exc))
        tokens = [marks[0], marks[1], f"'{marks[2]}'", f'"{marks[2]}"']
        if any(text.count(m) != c for m, c in zip(marks, (1, 1, 2))) or any(text.count(t) != 1 for t in tokens):
            return None
        positions = [text.index(t) for t in tokens]
        order = sorted(range(len(tokens)), key=positions.__getitem__)
        if order != [0, 1, 2, 3]:
            return None
        cell_fmt = "{" + ", ".join(f"'{a}': %s" for a in axes) + "}"
        # (the point's hole written as its axis values' holes: identifiers hold no %)
        return _Refusal(holes(text, tokens, positions, order, {0: cell_fmt}), cell_fmt)

    def _template(self, plan: QueryPlan) -> Template | None:
        return _kept(self._templates, plan, self._make_template)

    def _make_template(self, plan: QueryPlan) -> Template | None:
        """The plan's answer line as a %-format (modperf.fast.answer_text.make_template); None where
        that text cannot be trusted."""
        engine = self.engine
        has_quality = engine.annotate_quality and engine.quality_found(plan) is not None
        return make_template(plan.template, plan.axis_fields, plan.grid, plan.local, has_quality)


__all__ = ["LineAnswerer"]
