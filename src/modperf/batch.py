"""JSON-lines batches: one query per input line, one answer (or error) per output line, in
order; a bad line never stops the batch."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from . import errors as E
from .jsonio import dumps


def error_line(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, E.ModperfError):
        return {"error": exc.to_dict()}
    return {"error": {"type": type(exc).__name__, "kind": "internal", "message": str(exc)}}


def run_lines(lines: Iterable[str], answer: Callable[[dict[str, Any]], Any],
              defaults: Mapping[str, Any] | None = None) -> Iterator[tuple[bool, str]]:
    """For each non-blank line: ``(True, json of answer(fields).to_dict())`` or ``(False, json
    of {"error": ...})``. ``defaults`` are fields every line starts from (a line's own fields
    win)."""
    base = dict(defaults or {})
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise E.QueryFieldError(f"line {number}: a query is a JSON object, got {type(obj).__name__}",
                                        values={"line": number}, fix='e.g. {"table": "...", "system": "...", ...}')
            result = answer({**base, **obj})
            yield True, dumps(result.to_dict())
        except json.JSONDecodeError as exc:
            err = E.QueryFieldError(f"line {number} is not JSON: {exc.msg}", values={"line": number},
                                    fix="one JSON object per line")
            yield False, dumps(error_line(err))
        except Exception as exc:  # a bad line never stops the batch
            yield False, dumps(error_line(exc))


__all__ = ["error_line", "run_lines"]
