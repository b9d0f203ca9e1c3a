"""``query --batch`` lines answered from persisted plans (:mod:`modperf.fast.plans`), without numpy.

A batch's lines that a persisted plan holds for -- their field names, and the values of the
fields that are not axes, those of a question an earlier process resolved; their point one
the plan answers (:meth:`modperf.fast.plans.PlanStore.answer`: inside the measured range, not
refused, no lane rule) -- are answered here, each line the plan's answer text with the
point's parts filled in (:mod:`modperf.fast.answer_text`, the text the engine's batch path writes;
checked on each plan's first answer of each kind against the JSON writer's). Every other line
goes to the engine's batch path (:class:`modperf.query.lines.LineAnswerer`), started on the
first line that needs it, and once started it answers every later chunk (it is then as fast
per line, and a process keeps one path). A batch of :data:`PLAN_LINES` lines or more goes to
the engine from its first line (:func:`batch_answerer` reads that far ahead). The output is
the engine's, byte for byte, in input order
(``tests/test_plan_lines.py``): a batch every line of which a plan answers imports neither
numpy nor pyarrow, and starts as fast as a single query answered from a plan.
"""

from __future__ import annotations

from ..base.jsonio import dumps_small
from .answer import HEADS
from .answer_text import make_template, reach_parts

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
    from typing import Any

    from .plans import PlanStore, StoredPlan

#: Plans whose answer text is kept at most (then the texts are made again as lines come).
_KEEP_PLANS = 4096
#: A batch of this many lines or more is answered by the engine from its first line: past its
#: start, the engine's vectorised lookup answers distinct points faster than the scalar lookup
#: a plan answers with (about 5.6 against 11.6 us a line in process), and its start (about
#: 0.25 s) is what a short batch saves. (The engine's batch path reads 4,096 lines at a time:
#: reading that far ahead delays no answer.)
PLAN_LINES = 4096


class PlanLines:
    """Answers lists of query fields (one chunk of a batch) from persisted plans, handing what
    no plan answers to the engine's answerer (made by ``engine_lines`` on first need): the same
    interface as :class:`modperf.query.lines.LineAnswerer` (``free``, ``answer``,
    ``answer_shaped``)."""

    def __init__(self, store: PlanStore, free: frozenset[str], engine_lines: Callable[[], Any], *,
                 quality: bool = True) -> None:
        self.store = store
        #: The fields a line of a shape may give as its own integers: the interpolation axes.
        self.free = free
        self._start = engine_lines
        self.quality = quality  # (whether answers list their quality notes: the engine's default)
        self.engine_lines: Any = None  # the engine's answerer, once started
        # per plan (by identity, the plan held): what _text_of makes
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
            line = None if plan is None else self._line(fields, self._text_of(plan))
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
        """``(ok, line)`` per line of a shape (:class:`modperf.fast.batch.Shape`: ``fields`` with the
        integers ``columns`` in the fields ``holes``, ``n`` lines), in order."""
        if self.engine_lines is not None:
            return self.engine_lines.answer_shaped(fields, holes, columns, n)
        plan = self.store.plan_for(fields)  # (the holes are axes: one plan for every line)
        if plan is None:
            return self._engine().answer_shaped(fields, holes, columns, n)
        # a line of the shape is its integers: its line is made once per distinct point of the chunk
        one = dict(fields)
        text = self._text_of(plan)
        line_of = self._line
        out: list[tuple[bool, str] | None] = [None] * n
        misses: list[int] = []
        made: dict[Any, str | None] = {}
        single = len(holes) == 1
        keys: Any = columns[0] if single else zip(*columns)
        for k, digits in enumerate(keys):
            try:
                line = made[digits]
            except KeyError:
                if single:
                    one[holes[0]] = int(digits)
                else:
                    for name, value in zip(holes, digits):
                        one[name] = int(value)
                line = made[digits] = line_of(one, text)
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

    def _line(self, fields: Mapping[str, Any], text: list[Any]) -> str | None:
        """The answer line of ``fields`` from the persisted plan ``text`` holds
        (:meth:`_text_of` it: the plan :meth:`PlanStore.plan_for` these fields gives); None where
        the engine is to answer."""
        answer = self.store.answer(fields, self.quality)
        if answer is None:
            return None
        template = text[1]
        values = answer.__dict__
        latency = values["latency_ms"]
        kind = values["kind"]
        if template is None or type(latency) is not float or latency - latency != 0.0 \
                or values["locals_used"] != template.locals_used:
            return dumps_small(answer.to_dict())  # (a NaN: the writer)
        extrapolation = values["extrapolation"]
        if extrapolation is None:
            reach = "null"
        else:  # a cell the grid filled inside the measured range: its reach from the plan's text
            outside = tuple(extrapolation["outside_axes"])
            parts = text[3].get(outside)
            if parts is None:
                parts = text[3][outside] = reach_parts(extrapolation)
            distance = extrapolation["distance_octaves"]
            if parts is False or type(distance) is not float or distance - distance != 0.0:
                return dumps_small(answer.to_dict())
            reach = parts[0] + float.__repr__(distance) + parts[1]
        notes = values["quality"]
        resolved = values["fields"]  # (the point's axis values among them: plain ints)
        line: str = template.fmt % (float.__repr__(latency), f'"{kind}"', reach,
                                    *[int.__repr__(resolved[name]) for name in text[4]],
                                    "null" if notes is None else dumps_small(notes))
        checked = text[2]
        if kind not in checked:  # the plan's first answer of a kind: written as the writer writes it
            checked.add(kind)
            written = dumps_small(answer.to_dict())
            if line != written:
                text[1] = None
            return written
        return line

    def _text_of(self, plan: StoredPlan) -> list[Any]:
        """``[plan, its answer text or None, the kinds of answer it was checked on, the parts of
        its extrapolation text by the axes a point lies beyond, the axis fields the text holds
        in its order]``, kept per plan."""
        kept = self._templates.get(id(plan))
        if kept is not None and kept[0] is plan:
            return kept
        axis_fields = tuple(HEADS if check[0] is None else check[0] for check in plan.axis_checks)
        template = make_template(plan.template, axis_fields, plan.grid, plan.local, plan.quality == "notes")
        names = [] if template is None else [axis_fields[j] for j in template.field_order]
        kept = [plan, template, set(), {}, names]
        if len(self._templates) >= _KEEP_PLANS:
            self._templates.clear()
        self._templates[id(plan)] = kept
        return kept


def batch_answerer(store: PlanStore | None, engine_lines: Callable[[bool], Any],
                   lines: Iterable[Any], *, quality: bool = True) -> tuple[Any, Iterator[Any]]:
    """The answerer of a batch whose lines ``lines`` yields, and those lines again: the plans'
    (:class:`PlanLines`) where there are plans and the batch has fewer than :data:`PLAN_LINES`
    lines (read ahead to see), else the engine's (``engine_lines(persist)``, ``persist``: the
    batch is short, so that the plans it resolves are kept for its next run). An input failing
    within the lines read ahead fails where it did, after them."""
    source = iter(lines)
    head: list[Any] = []
    failed: OSError | None = None
    try:
        for line in source:
            head.append(line)
            if len(head) >= PLAN_LINES:
                break
    except OSError as exc:  # (raised again after the lines read before it: they are answered first)
        failed = exc

    def again() -> Iterator[Any]:
        yield from head
        if failed is not None:
            raise failed
        yield from source

    short = len(head) < PLAN_LINES
    found = PlanLines.open(store, lambda: engine_lines(True), quality=quality) if short else None
    return (found if found is not None else engine_lines(short)), again()


__all__ = ["PLAN_LINES", "PlanLines", "batch_answerer"]
