"""JSON-lines batches: one query per input line, one answer (or error) per output line, in
order; a bad line never stops the batch.

Input is read as bytes, one line at a time, so that nothing about one line (invalid UTF-8, a
line of 100 MB, 100,000 nested arrays, a NaN, a duplicate key) can keep another line from
being answered: each such line gets its own error line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

from . import errors as E
from .jsonio import dumps, dumps_small
from .limits import MAX_LINE_BYTES

_ASCII_BLANK = " \t\n\r\x0b\x0c"  # what bytes.strip() removes: a line of only these is blank
_LINE_FIX = 'one JSON object per line, e.g. {"table": "...", "system": "...", ...}'


class LineTooLong:
    """Stands for an input line longer than the limit (its bytes were skipped, not kept)."""

    def __init__(self, size: int) -> None:
        self.size = size


def read_lines(stream: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes | LineTooLong]:
    """The lines of a byte stream; a line longer than ``limit`` bytes comes out as a
    :class:`LineTooLong` (read through in chunks, never held whole)."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            size = len(line)
            while True:
                more = stream.readline(limit + 1)
                size += len(more)
                if not more or more.endswith(b"\n"):
                    break
            yield LineTooLong(size)
        else:
            yield line


def error_line(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, E.ModperfError):
        return {"error": exc.to_dict()}
    return {"error": {"type": type(exc).__name__, "kind": "internal", "message": E.clean(str(exc))}}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"field {E.quote(key)} appears twice")
        obj[key] = value
    return obj


def parse_line(number: int, line: bytes | str | LineTooLong) -> dict[str, Any] | None:
    """One batch line as a query's fields (None for a blank line); every way a line can be
    malformed is a QueryFieldError naming the line."""
    if isinstance(line, LineTooLong):
        raise E.QueryFieldError(f"line {number} is {line.size:,} bytes, longer than a query line may be",
                                values={"line": number, "limit_bytes": MAX_LINE_BYTES}, fix=_LINE_FIX)
    if isinstance(line, bytes):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise E.QueryFieldError(f"line {number} is not UTF-8 (byte {line[exc.start]:#04x} at offset {exc.start})",
                                    values={"line": number}, fix="write the batch file as UTF-8") from None
    else:
        text = line
    if not text.strip(_ASCII_BLANK):  # str.strip() would also drop \x1c-\x1f and count the line as blank
        return None
    try:
        obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise E.QueryFieldError(f"line {number} is not JSON: {exc.msg} (column {exc.colno})",
                                values={"line": number}, fix=_LINE_FIX) from None
    except RecursionError:
        raise E.QueryFieldError(f"line {number} nests arrays or objects too deep to be a query",
                                values={"line": number}, fix=_LINE_FIX) from None
    except ValueError as exc:  # NaN/Infinity, a duplicate key, an integer of thousands of digits
        raise E.QueryFieldError(f"line {number} is not strict JSON: {E.clean(str(exc), 200)}",
                                values={"line": number}, fix=_LINE_FIX) from None
    if not isinstance(obj, dict):
        raise E.QueryFieldError(f"line {number}: a query is a JSON object, got {type(obj).__name__}",
                                values={"line": number}, fix=_LINE_FIX)
    return obj


def run_lines(lines: Iterable[bytes | str | LineTooLong], answer: Callable[[dict[str, Any]], Any],
              defaults: Mapping[str, Any] | None = None) -> Iterator[tuple[bool, str]]:
    """For each non-blank line: ``(True, json of answer(fields).to_dict())`` or ``(False, json
    of {"error": ...})``. ``defaults`` are fields every line starts from (a line's own fields
    win). Lines may be bytes (decoded as UTF-8 here) or str."""
    base = dict(defaults or {})
    for number, line in enumerate(lines, 1):
        try:
            obj = parse_line(number, line)
            if obj is None:
                continue
            result = answer({**base, **obj})
            yield True, dumps_small(result.to_dict())
        except Exception as exc:  # a bad line never stops the batch
            yield False, dumps(error_line(exc))


__all__ = ["LineTooLong", "error_line", "parse_line", "read_lines", "run_lines"]
