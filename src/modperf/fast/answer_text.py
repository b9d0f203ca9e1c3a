"""A plan's answer line as a %-format: the JSON text of its answers made once, filled per point.

A batch writes thousands of answers of one plan; their JSON differs only in the point's parts
(the latency, the kind, the extrapolation, the axis values among the fields, the quality
notes). :func:`make_template` writes the plan's template answer once through the JSON writer
with markers where those parts go and turns the text into a %-format, so that an answer line
is one ``%`` operation. Both batch paths use it: the engine's
(:mod:`modperf.query.lines`) and the persisted plans' (:mod:`modperf.fast.plan_lines`). It imports
only the standard library and layer-0 modules: a process answering a batch from persisted
plans imports no numpy.
"""

from __future__ import annotations

from ..base.jsonio import dumps_as_is
from .answer import HEADS, Answer
from .lattice import EXACT, EXTRAPOLATED, INTERPOLATED, REFUSED

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from collections.abc import Mapping, Sequence
    from typing import Any

    from .lattice import Lattice

#: Markers standing for the per-point parts while a plan's answer text is made.
MARK = "\x01modperf-point-part-{}\x01"
#: A kind code's text in an answer line (an extrapolated or refused point is written otherwise).
KIND_TEXT = {EXACT: '"exact"', INTERPOLATED: '"interpolated"', EXTRAPOLATED: "", REFUSED: ""}


class Template:
    """One plan's answer text as a %-format: (latency, kind, extrapolation, the axis values
    in the order the answer's fields list them, quality)."""

    __slots__ = ("field_order", "fmt", "locals_used", "quality")

    def __init__(self, fmt: str, field_order: list[int], quality: bool, locals_used: tuple[int, ...]) -> None:
        self.fmt = fmt
        self.field_order = field_order  # positions in the point of the axis values, in text order
        self.quality = quality  # whether the plan's group has quality findings to look up
        self.locals_used = locals_used  # the answers' locals_used, which the text holds


def make_template(template: Answer, axis_fields: Sequence[str], grid: Lattice, local: int | None,
                  quality: bool) -> Template | None:
    """The answer ``template`` (a plan's: ``axis_fields`` per axis of its lattice ``grid``,
    ``local`` its heads coordinate) as ``to_dict`` gives it and the JSON writer writes it, with
    markers where the point's parts go; None where that text cannot be trusted (a marker that
    the fields themselves hold, a value the writer would rewrite). ``quality``: whether the
    plan's group has quality findings (kept on the template for its writer)."""
    # the heads the answer says it used depend on the heads coordinate only, one per plan
    heads_used: tuple[int, ...] = ()
    if HEADS in axis_fields:
        assert local is not None
        lows = [low for low, _ in grid.ranges().values()]
        probe = [local if n == HEADS else lows[j] for j, n in enumerate(axis_fields)]
        heads_used = grid.lookup(probe).heads_used
    answer = object.__new__(Answer)
    answer.__dict__.update(template.__dict__)
    marks = iter(range(1 << 30))
    answer.latency_ms = MARK.format(next(marks))  # type: ignore[assignment]
    answer.kind = MARK.format(next(marks))
    if heads_used:
        answer.locals_used = heads_used
    answer.extrapolation = MARK.format(next(marks))  # type: ignore[assignment]
    resolved = dict(template.fields)
    axis_mark: dict[str, int] = {}
    for name in axis_fields:
        if name != HEADS:
            axis_mark[name] = next(marks)
            resolved[name] = MARK.format(axis_mark[name])
    answer.fields = resolved
    answer.quality = MARK.format(next(marks))  # type: ignore[assignment]
    try:
        text = dumps_as_is(answer.to_dict())
    except (ValueError, TypeError):
        return None
    tokens = [dumps_as_is(MARK.format(k)) for k in range(next(marks))]
    if any(text.count(tok) != 1 for tok in tokens) or "\x01" in text.replace("\\u0001", ""):
        return None
    positions = [text.index(tok) for tok in tokens]
    # the text's order of the parts: latency, kind, extrapolation, fields (in their dict
    # order), quality -- as to_dict lists them
    in_text = sorted(range(len(tokens)), key=positions.__getitem__)
    field_marks = [k for k in in_text if k not in (0, 1, 2, len(tokens) - 1)]
    if in_text[:3] != [0, 1, 2] or in_text[-1] != len(tokens) - 1:
        return None
    by_mark = {axis_mark[n]: j for j, n in enumerate(axis_fields) if n != HEADS}
    return Template(holes(text, tokens, positions, in_text), [by_mark[k] for k in field_marks], quality,
                    answer.locals_used)


def reach_parts(extrapolation: Mapping[str, Any]) -> tuple[str, str] | bool:
    """An answer's extrapolation part (:func:`modperf.fast.answer.extrapolation_of`) as JSON, split
    around its distance: the text before and after it (the rest depends on the plan and the
    axes a point lies beyond); False where a marker distance does not show once."""
    marker = 987654.321  # (round(marker, 6) is marker)
    try:
        text = dumps_as_is({**extrapolation, "distance_octaves": marker})
    except (ValueError, TypeError):
        return False
    mark = float.__repr__(marker)
    if text.count(mark) != 1:
        return False
    before, after = text.split(mark)
    return before, after


def holes(text: str, tokens: list[str], positions: list[int], order: list[int],
          fills: Mapping[int, str] | None = None) -> str:
    """``text`` as a %-format: each marker token (at its position, in text order ``order``) a
    ``%s`` hole (or the format ``fills`` gives for it), every literal ``%`` doubled."""
    pieces = []
    last = 0
    fills = fills or {}
    for k in order:
        pieces.append(text[last:positions[k]].replace("%", "%%"))
        pieces.append(fills.get(k, "%s"))
        last = positions[k] + len(tokens[k])
    pieces.append(text[last:].replace("%", "%%"))
    return "".join(pieces)


__all__ = ["KIND_TEXT", "MARK", "Template", "holes", "make_template", "reach_parts"]
