"""One answer (:class:`Answer`) and the single query's fast path, without numpy.

A resolved plan (:class:`modperf.query.engine.QueryEngine`'s, or one restored from disk by
:mod:`modperf.fast.plans`) answers a point by :func:`fast_answer`: the fields' axis values, when
every one is a plain int in its range, then the cell, a blend along one axis, or the lattice's
general lookup. Both paths run this code, so an answer from a persisted plan is the in-process
one bit for bit. A plan here is anything with ``grid`` (a :class:`modperf.fast.lattice.Lattice`),
``template`` (an :class:`Answer`), ``axis_checks``, ``echoed``, ``extrapolation_model`` and
``lanes`` (with ``lane_for`` and ``axis_fields`` where it is not None).
"""

from __future__ import annotations

from .lattice import INTERPOLATED, KIND_NAMES, MEASURED_CELL, MISSING_OFFSET, REFUSED

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from collections.abc import Mapping
    from typing import Any, TypeVar

    from .lattice import Lattice, Lookup

    P = TypeVar("P", bound="Plan")

#: The rank-local head count's field (modperf.data.families.base.HEADS is this one).
HEADS = "num_heads"

#: Answer's attributes in its constructor's order, with the default of each optional one (a
#: callable: a new object per answer).
_REQUIRED = ("latency_ms", "kind", "table", "system", "backend", "version", "native", "local", "locals_used",
             "files", "models", "fields")
_OPTIONAL = (("requested_native", lambda: None), ("substitution", lambda: None), ("reused_from", lambda: None),
             ("reuse_reason", lambda: None), ("extrapolation", lambda: None), ("substituted_from", lambda: None),
             ("derived", dict), ("defaults", dict), ("lane", lambda: None), ("quality", lambda: None),
             ("notes", list), ("version_chosen", lambda: False))
_NAMES = _REQUIRED + tuple(n for n, _ in _OPTIONAL)


class Answer:
    """The answer to one query.

    ``latency_ms``; ``kind`` (exact | interpolated | extrapolated); the slot (``table``,
    ``system``, ``backend``, ``version``); ``native``: the native bucket that answered (None:
    local-only table); ``local``: the rank-local heads asked for; ``locals_used``: measured local
    counts that carried weight; ``files``; ``models``: models (aliases included) that measured
    the group; ``fields``: the resolved key, defaults included; ``requested_native``;
    ``substitution``: set when allow_substitute answered from another native, and
    ``substituted_from``, that native; ``reused_from`` / ``reuse_reason``: the donor version when
    reuse.yaml answered; ``extrapolation``; ``derived``: key columns the model fixed, with why
    (modperf.query.resolve); ``defaults``: key columns left out and filled by a documented default,
    with the rule; ``lane``: the kernel a lane rule picked for this shape (``{"kernel_source":
    ..., "rule": ...}``); ``quality``: quality findings on the measured points the answer stands
    on (modperf.data.quality); ``notes``; ``version_chosen``: the version was the default, not given.

    A plain class (compared by value, ``to_dict`` for JSON) rather than a dataclass: a process
    answering from a persisted plan creates it without importing ``dataclasses``."""

    latency_ms: float
    kind: str
    table: str
    system: str
    backend: str
    version: str
    native: int | None
    local: int
    locals_used: tuple[int, ...]
    files: tuple[str, ...]
    models: tuple[str, ...]
    fields: dict[str, Any]
    requested_native: int | None
    substitution: str | None
    reused_from: str | None
    reuse_reason: str | None
    extrapolation: dict[str, Any] | None
    substituted_from: int | None
    derived: dict[str, str]
    defaults: dict[str, str]
    lane: dict[str, str] | None
    quality: list[dict[str, Any]] | None
    notes: list[str]
    version_chosen: bool

    def __init__(self, latency_ms: float, kind: str, table: str, system: str, backend: str, version: str,
                 native: int | None, local: int, locals_used: tuple[int, ...], files: tuple[str, ...],
                 models: tuple[str, ...], fields: dict[str, Any], **optional: Any) -> None:
        values = self.__dict__
        values.update(latency_ms=latency_ms, kind=kind, table=table, system=system, backend=backend,
                      version=version, native=native, local=local, locals_used=locals_used, files=files,
                      models=models, fields=fields)
        for name, default in _OPTIONAL:
            values[name] = optional.pop(name) if name in optional else default()
        if optional:
            raise TypeError(f"Answer() got unexpected keyword argument(s) {', '.join(sorted(optional))}")

    def copy(self, **changes: Any) -> Answer:
        """A shallow copy with ``changes`` set."""
        out = object.__new__(Answer)
        out.__dict__.update(self.__dict__)
        for name, value in changes.items():
            if name not in _NAMES:
                raise TypeError(f"Answer has no attribute {name!r}")
            out.__dict__[name] = value
        return out

    def __eq__(self, other: object) -> bool:
        if type(other) is not Answer:
            return NotImplemented
        return all(self.__dict__[n] == other.__dict__[n] for n in _NAMES)

    # mutable, compared by value
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Answer(" + ", ".join(f"{n}={self.__dict__[n]!r}" for n in _NAMES) + ")"

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms, "kind": self.kind, "table": self.table, "system": self.system,
            "backend": self.backend, "version": self.version, "native": self.native, "local": self.local,
            "locals_used": list(self.locals_used), "requested_native": self.requested_native,
            "substitution": self.substitution, "substituted_from": self.substituted_from,
            "reused_from": self.reused_from, "reuse_reason": self.reuse_reason,
            "extrapolation": self.extrapolation, "files": list(self.files), "models": list(self.models),
            "fields": dict(self.fields), "derived": dict(self.derived), "defaults": dict(self.defaults),
            "lane": self.lane, "quality": self.quality, "notes": list(self.notes),
            "version_chosen": self.version_chosen,
        }


# --- the fast path ----------------------------------------------------------------------------


#: A plan's ``quality_found`` before anyone looked its group's quality findings up (None is an
#: answer: the group has none).
NOT_LOOKED_UP: Any = type("NotLookedUp", (), {"__repr__": lambda self: "NOT_LOOKED_UP"})()


class Plan:
    """Everything a single question resolves to but its point: what :func:`fast_answer` reads.

    The query engine resolves plans (:class:`modperf.query.engine.QueryPlan`) and persisted
    plans are read back as them (:class:`modperf.fast.plans.StoredPlan`); both answer through
    :func:`fast_answer`, so an answer is the same bit for bit whichever answered. A plan has:

    * ``template``: the :class:`Answer` every point shares (slot, native, group, provenance);
    * ``grid``: the lattice of the plan's group (:class:`modperf.fast.lattice.Lattice`);
    * ``axis_checks``: per axis, in the grid's order, (field name, low, high, the value when the
      field is left out or None, the lattice offsets of the axis's values); the heads axis reads
      no field (its name is None) and its value is ``local``;
    * ``echoed``: (field name, point position) of the axes an answer's fields echo;
    * ``local``: the rank-local heads where the grid has a heads axis;
    * ``lanes``: None, or where a backend picks its kernel per shape, (lane, test, reason)
      triples, with :meth:`lane_for` giving the plan of the lane a point runs;
    * ``extrapolation_model``: what an extrapolated answer holds utilisation against;
    * ``quality_found``: the group's quality findings (:data:`NOT_LOOKED_UP` until looked up).
    """

    __slots__ = ()
    template: Answer
    grid: Lattice
    axis_fields: Any
    axis_checks: Any
    echoed: Any
    local: int | None
    quality_found: Any
    extrapolation_model: str
    lanes: Any = None

    def lane_for(self: P, point: Mapping[str, Any]) -> P:
        raise NotImplementedError("a plan without lanes has one grid")


def fast_answer(plan: P, fields: Mapping[str, Any]) -> tuple[Answer, P, list[int]] | None:
    """(the answer, the plan that answered, the point) where every axis value of ``fields`` is a
    plain int inside its range (or left out where the plan fixes it) and the lattice answers
    the point: a measured cell's stored latency, a blend along the one axis off the lattice, or
    the lattice's general lookup. None for anything else (a string, a float, a bool, None, out
    of range: the reference path parses or refuses it; a refused point: it says why; a point
    past the measured range of a lattice without a roofline). Where a lane rule picks the
    kernel per shape (``plan.lanes``), the lane's plan answers. The answer is a shallow copy of
    the template (its attribute dict copied whole) with the point's part set."""
    point = []
    cell = 0  # the point's cell in the padded lattice: the sum of its values' offsets (negative
    # when a value is not a lattice value)
    for name, low, high, fixed, offsets in plan.axis_checks:
        value = fields.get(name)  # None: the heads axis (never a field's name)
        if type(value) is int and low <= value <= high:
            pass
        elif value is None and fixed is not None:
            value = fixed
        else:
            return None
        point.append(value)
        cell += offsets.get(value, MISSING_OFFSET)
    if plan.lanes is not None:  # the lane the backend runs here (its grid: the cell again)
        plan = plan.lane_for(dict(zip(plan.axis_fields, point)))
        cell = 0
        for check, value in zip(plan.axis_checks, point):
            cell += check[4].get(value, MISSING_OFFSET)
    grid = plan.grid
    t = plan.template
    answer = object.__new__(Answer)
    values = answer.__dict__ = t.__dict__.copy()
    if cell >= 0 and grid.state_py[cell] == MEASURED_CELL:  # a measured cell: its stored latency
        values["latency_ms"] = grid.lat_py[cell]
        values["kind"] = "exact"
        if grid.heads_pos >= 0:
            values["locals_used"] = (point[grid.heads_pos],)
    elif cell < 0 and (between := _between(plan, point, cell)) is not None:
        # one axis between two lattice values, interpolated from unextrapolated cells
        values["latency_ms"], heads_used = between
        values["kind"] = KIND_NAMES[INTERPOLATED]
        if heads_used:
            values["locals_used"] = heads_used
    else:
        if grid.roofline is None and not grid.inside(point):
            return None
        found = grid.lookup_general(point)
        if found.kind == REFUSED:
            return None
        values["latency_ms"] = found.latency_ms
        values["kind"] = KIND_NAMES[found.kind]
        if found.heads_used:
            values["locals_used"] = found.heads_used
        if found.distance > 0:
            values["extrapolation"] = extrapolation_of(grid, plan.extrapolation_model, found)
    resolved = t.fields.copy()
    for name, i in plan.echoed:
        resolved[name] = point[i]
    values["fields"] = resolved
    return answer, plan, point


def _between(plan: Any, point: list[int], cell: int) -> tuple[float, tuple[int, ...]] | None:
    """:meth:`Lattice.between` for a fast-path point whose cell sum holds ``MISSING_OFFSET``
    exactly once (one axis off its lattice), else None."""
    base = cell - MISSING_OFFSET  # the other axes' sum: negative when two or more missed
    if base < 0:
        return None
    for a, check in enumerate(plan.axis_checks):
        if point[a] not in check[4]:
            return plan.grid.between(point, a, base)
    return None  # (unreached: some axis missed)


def quality_notes(plan: Any, found: tuple[dict[tuple[Any, ...], list[dict[str, Any]]], tuple[str, ...]],
                  point: list[int], exact: bool) -> list[dict[str, Any]] | None:
    """The quality findings (modperf.data.quality) on the measured points an answer at ``point``
    stands on, from ``found``: the plan's group's findings by (heads, axis values) with the
    table's axes. An exact answer stands on its own cell, any other on the measured corners of
    its interpolation box (:meth:`Lattice.support_values`). ``plan`` gives ``grid``, ``local``
    and ``echoed``."""
    by_point, axes = found
    if exact:
        notes = by_point.get((plan.local, tuple([point[i] for _, i in plan.echoed])))
        return list(notes) if notes else None
    grid = plan.grid
    at = [grid.axes.index(a) for a in axes]
    heads_at = grid.axes.index(HEADS) if HEADS in grid.axes else -1
    hits: list[dict[str, Any]] = []
    for cell in grid.support_values(point):
        heads = cell[heads_at] if heads_at >= 0 else plan.local
        hits.extend(by_point.get((heads, tuple([cell[i] for i in at])), ()))
    return hits or None


def extrapolation_of(grid: Lattice, model: str, found: Lookup) -> dict[str, Any]:
    """How far an extrapolated answer (a lookup that spent some distance) reached, as the
    answer lists it; ``model`` names what the extrapolation holds (the plan's
    ``extrapolation_model``)."""
    return {"distance_octaves": round(found.distance, 6), "limit_octaves": grid.limit,
            "outside_axes": list(found.outside), "measured_range": grid.ranges(), "model": model}


__all__ = ["HEADS", "NOT_LOOKED_UP", "Answer", "Plan", "extrapolation_of", "fast_answer", "quality_notes"]
