"""``query --batch`` lines answered from persisted plans (:mod:`modperf.plans`), without numpy.

A batch's lines that a persisted plan holds for -- their field names, and the values of the
fields that are not axes, those of a question an earlier process resolved; their point one
the plan answers (:meth:`modperf.plans.PlanStore.answer_with`: inside the measured range, not
refused, no lane rule) -- are answered here, each line the plan's answer text with the
point's parts filled in (:mod:`modperf.answer_text`, the text the engine's batch path writes;
checked once per plan against the JSON writer's). Every other line goes to the engine's batch
path (:class:`modperf.query_lines.LineAnswerer`), started on the first line that needs it,
and once started it answers every later chunk (it is then as fast per line, and a process
keeps one path). The output is the engine's, byte for byte, in input order
(``tests/test_plan_lines.py``): a batch every line of which a plan answers imports neither
numpy nor pyarrow, and starts as fast as a single query answered from a plan.
"""

from __future__ import annotations

from .answer import HEADS
from .answer_text import make_template
from .jsonio import dumps_small

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from .plans import PlanStore, StoredPlan

#: Plans whose answer text is kept at most (then the texts are made again as lines come).
_KEEP_PLANS = 4096


class PlanLines:
    """Answers lists of query fields (one chunk of a batch) from persisted plans, handing what
    no plan answers to the engine's answerer (made by ``engine_lines`` on first need): the same
    interface as :class:`modperf.query_lines.LineAnswerer` (``free``, ``answer``,
    ``answer_shaped``)."""

    def __init__(self, store: PlanStore, free: frozenset[str], engine_lines: Callable[[], Any], *,
                 quality: bool = True) -> None:
        self.store = store
        #: The fields a line of a shape may give as its own integers: the interpolation axes.
        self.free = free
        self._start = engine_lines
        self.quality = quality  # (whether answers list their quality notes: the engine's default)
        self.engine_lines: Any = None  # the engine's answerer, once started
        # per plan (by identity, the plan held): [the plan, its answer text (None: the writer
        # writes every answer), whether the text was checked against the writer's]
        self._templates: dict[int, list[Any]] = {}

    @classmethod
    def open(cls, store: PlanStore | None, engine_lines: Callable[[], Any], *,
             quality: bool = True) -> PlanLines | None:
        """The plans' answerer, or None where there are no plans to answer from (no store, or
        none written by this code: the engine answers the batch from its first line)."""
        free = None if store is None else store.axis_names()
        if store is None or free is None:
            return None
        return cls(store, free, engine_lines, quality=quality)

    def _engine(self) -> Any:
        if self.engine_lines is None:
            self.engine_lines = self._start()
        return self.engine_lines

    def answer(self, items: Sequence[Mapping[str, Any]]) -> list[tuple[bool, str]]:
        """``(ok, line)`` per item, in order: the engine's line for it."""
        if self.engine_lines is not None:
            return self.engine_lines.answer(items)
        out: list[tuple[bool, str] | None] = [None] * len(items)
        misses: list[int] = []
        plan_for = self.store.plan_for
        for i, fields in enumerate(items):
            plan = plan_for(fields)
            line = None if plan is None else self._line(plan, fields)
            if line is None:
                misses.append(i)
            else:
                out[i] = (True, line)
        if misses:
            for i, one in zip(misses, self._engine().answer([items[i] for i in misses]), strict=True):
                out[i] = one
        return out  # type: ignore[return-value]

    def answer_shaped(self, fields: dict[str, Any], holes: tuple[str, ...], columns: list[tuple[bytes, ...]],
                      n: int) -> list[tuple[bool, str]] | None:
        """``(ok, line)`` per line of a shape (:class:`modperf.batch.Shape`: ``fields`` with the
        integers ``columns`` in the fields ``holes``, ``n`` lines), in order."""
        if self.engine_lines is not None:
            return self.engine_lines.answer_shaped(fields, holes, columns, n)
        plan = self.store.plan_for(fields)  # (the holes are axes: one plan for every line)
        if plan is None:
            return self._engine().answer_shaped(fields, holes, columns, n)
        # a plan's answer reads the axis values only (PlanStore.answer_with)
        axes = {name: value for name, value in fields.items() if name in self.free}
        out: list[tuple[bool, str] | None] = [None] * n
        misses: list[int] = []
        line_of = self._line
        if len(holes) == 1:
            (name,), (column,) = holes, columns
            for k, digits in enumerate(column):
                axes[name] = int(digits)
                line = line_of(plan, axes)
                if line is None:
                    misses.append(k)
                else:
                    out[k] = (True, line)
        else:
            for k, values in enumerate(zip(*columns)):
                for name, digits in zip(holes, values):
                    axes[name] = int(digits)
                line = line_of(plan, axes)
                if line is None:
                    misses.append(k)
                else:
                    out[k] = (True, line)
        if misses:
            items = []
            for k in misses:
                one = dict(fields)
                for name, column in zip(holes, columns):
                    one[name] = int(column[k])
                items.append(one)
            for k, found in zip(misses, self._engine().answer(items), strict=True):
                out[k] = found
        return out  # type: ignore[return-value]

    def _line(self, plan: StoredPlan, fields: Mapping[str, Any]) -> str | None:
        """The answer line of ``fields`` from ``plan``; None where the engine is to answer."""
        found = self.store.answer_with(plan, fields, self.quality)
        if found is None:
            return None
        answer, point = found
        kept = self._templates.get(id(plan))
        if kept is None or kept[0] is not plan:
            kept = self._template(plan)
        template = kept[1]
        values = answer.__dict__
        latency = values["latency_ms"]
        kind = values["kind"]
        if template is None or (kind != "exact" and kind != "interpolated") or values["extrapolation"] is not None \
                or type(latency) is not float or latency - latency != 0.0 \
                or values["locals_used"] != template.locals_used:
            return dumps_small(answer.to_dict())  # (a filled cell's extrapolation, a NaN: the writer)
        notes = values["quality"]
        text = template.fmt % (float.__repr__(latency), '"exact"' if kind == "exact" else '"interpolated"', "null",
                               *[int.__repr__(point[j]) for j in template.field_order],
                               "null" if notes is None else dumps_small(notes))
        if not kept[2]:  # the plan's first such answer: the template must write it as the writer does
            kept[2] = True
            written = dumps_small(answer.to_dict())
            if text != written:
                kept[1] = None
            return written
        return text

    def _template(self, plan: StoredPlan) -> list[Any]:
        """``[plan, its answer text or None, whether the text was checked]``, kept."""
        axis_fields = tuple(HEADS if check[0] is None else check[0] for check in plan.axis_checks)
        kept = [plan, make_template(plan.template, axis_fields, plan.grid, plan.local, plan.quality == "notes"),
                False]
        if len(self._templates) >= _KEEP_PLANS:
            self._templates.clear()
        self._templates[id(plan)] = kept
        return kept


__all__ = ["PlanLines"]
