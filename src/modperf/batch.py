"""JSON-lines batches: one query per input line, one answer (or error) per output line, in
order; a bad line never stops the batch.

Input is read as bytes, one line at a time, so that nothing about one line (invalid UTF-8, a
line of 100 MB, 100,000 nested arrays, a NaN, a duplicate key) can keep another line from
being answered: each such line gets its own error line.
"""

from __future__ import annotations

import gc
import itertools
import json
import json.scanner
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any, cast

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
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:  # the first key seen twice, as a scan in order finds it
        if key in seen:
            raise ValueError(f"field {E.quote(key)} appears twice")
        seen.add(key)
    raise AssertionError("a shorter dict has a repeated key")


#: json.loads(text, parse_constant=..., object_pairs_hook=...) builds a decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)


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
        if text.startswith("\ufeff"):  # json.loads refuses a BOM before decoding; say it the same way
            obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
        else:
            obj = _DECODER.decode(text)
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


#: A scanner of one JSON value whose objects come out as lists of pairs (a C callable: no
#: Python call per object, and repeated keys stay visible).
_SCAN_PAIRS = json.scanner.make_scanner(
    json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=list))  # type: ignore[arg-type]
_JSON_BLANK = " \t\n\r"  # what the JSON decoder skips around a value


def _flat_object(line: bytes | str | LineTooLong) -> dict[str, Any] | None:
    """The common line -- one flat JSON object of unique keys, UTF-8 -- read the quick way;
    None for anything else, which :func:`parse_line` then reads (and names what is wrong)."""
    if type(line) is not bytes:
        return None
    try:
        text = line.decode("utf-8").strip(_JSON_BLANK)
        if not text.startswith("{"):
            return None
        pairs, end = _SCAN_PAIRS(text, 0)
    except Exception:  # StopIteration, a bad byte, NaN, a huge integer, nesting too deep
        return None
    if end != len(text):
        return None
    obj = dict(pairs)
    if len(obj) != len(pairs):
        return None
    for value in obj.values():
        if type(value) is list:  # an array, or a nested object (a list of pairs here)
            return None
    return obj


#: A decoder of a whole chunk at once (a JSON array of the chunk's lines): objects as dicts,
#: which the C scanner builds without a Python call; what a dict hides (a repeated key) is
#: found by counting quotes (:func:`_flat_objects`).
class _Constant:
    """Stands for a NaN or Infinity read in a chunk (its line is then read on its own, which
    refuses it): a failure would not say where it is."""


_DECODE_DICTS = json.JSONDecoder(parse_constant=lambda _: _Constant())


def _flat_objects(lines: list[bytes | str | LineTooLong]) -> tuple[list[dict[str, Any] | None], list[int]]:
    """Per line, :func:`_flat_object` of it or None, and the positions of the Nones: the lines
    that are one flat object are read in one JSON call per chunk where that can be trusted
    (every other line, and every line of a part that fails, gets None, and is then read on its
    own)."""
    n = len(lines)
    out: list[dict[str, Any] | None] = [None] * n
    raw = cast("list[bytes]", lines)  # (until a line that is not bytes makes the join fail)
    try:
        joined: bytes | None = b"\n,".join(raw)
    except TypeError:
        joined = None
    if joined is not None and joined.count(b"{") == n and [line[:1] for line in raw].count(b"{") == n \
            and b"[" not in joined and b"\\" not in joined:
        picked = list(range(n))  # (the common chunk: the checks below, made once for all its lines)
    else:
        picked = [i for i, line in enumerate(raw) if type(line) is bytes and line[:1] == b"{"
                  and line.count(b"{") == 1 and b"[" not in line and b"\\" not in line]
        joined = None
    if picked:
        _decode_flat([raw[i] for i in picked], picked, out, joined, [_FAILED_READS])
    return out, [i for i, obj in enumerate(out) if obj is None] if None in out else []


#: Failed array reads a chunk may make before its remaining lines are read one at a time (each
#: failure reads again the part after the failing line: a chunk of many bad lines would cost
#: the square of its length).
_FAILED_READS = 64


def _decode_flat(lines: list[bytes], at: list[int], out: list[dict[str, Any] | None], joined: bytes | None,
                 budget: list[int]) -> None:
    """``out[at[k]]`` = the object of ``lines[k]``, read as one JSON array, for lines that each
    begin with their only ``{`` and hold no ``[`` and no backslash; where the array fails, the
    part before the failing line and the part after it are read again and the failing line is
    left None (a failure without a position: each half again), as long as ``budget[0]``, the
    failures a chunk may still make, lasts.

    Why one array reads each line as the line alone: each line holds exactly one ``{``, its
    first byte, so the array's k-th object begins at line k's first byte and (a string cannot
    hold the raw newline before each inserted comma, and a key cannot begin with ``{``) ends
    within it: the object is the line's text without its blanks, and it is flat (no other
    ``{``, no ``[``). A repeated key, which a dict hides, shows in the count of quotes: without
    a backslash every ``"`` delimits a string, so a line of p pairs of which s have string
    values holds 2 (p + s) of them, and its dict keeps at most as many pairs and string
    values, strictly fewer pairs where a key repeats."""
    m = len(lines)
    if m == 0 or budget[0] <= 0:
        return
    if joined is None:
        joined = b"\n,".join(lines)
    fail: int | None = None
    try:
        text = "[" + joined.decode("utf-8") + "]"
    except UnicodeDecodeError as exc:
        fail = joined.count(b"\n,", 0, exc.start)
    try:
        if fail is None:
            objs = _DECODE_DICTS.decode(text)
    except json.JSONDecodeError as exc:
        fail = text.count("\n,", 0, exc.pos)
    except (ValueError, RecursionError):  # an integer of thousands of digits: no position
        budget[0] -= 1
        if m == 1:
            return
        half = m // 2
        _decode_flat(lines[:half], at[:half], out, None, budget)
        _decode_flat(lines[half:], at[half:], out, None, budget)
        return
    if fail is not None or len(objs) != m:  # (a count apart: a line holding more than its object)
        budget[0] -= 1
        if m == 1:
            return  # the line is read on its own, which names what is wrong
        # the part before the line where it failed, and the rest (that line first: where a line
        # is cut short, the failure shows at the next one)
        cut = m // 2 if fail is None else min(max(fail, 1), m - 1)
        _decode_flat(lines[:cut], at[:cut], out, None, budget)
        _decode_flat(lines[cut:], at[cut:], out, None, budget)
        return
    types = list(map(type, itertools.chain.from_iterable(map(dict.values, objs))))
    if not types.count(_Constant) and joined.count(b'"') == 2 * (sum(map(len, objs)) + types.count(str)):
        for k, obj in zip(at, objs):
            out[k] = obj
        return
    for k, line, obj in zip(at, lines, objs):  # some line repeats a key or holds a NaN: the others are good
        types = list(map(type, obj.values()))
        if not types.count(_Constant) and line.count(b'"') == 2 * (len(obj) + types.count(str)):
            out[k] = obj


#: Lines a chunked batch answers at once (an answer waits at most until its chunk is read).
CHUNK_LINES = 4096


def run_chunks(lines: Iterable[bytes | str | LineTooLong],
               answer_many: Callable[[list[dict[str, Any]]], list[tuple[bool, str]]],
               defaults: Mapping[str, Any] | None = None, chunk: int = CHUNK_LINES) -> Iterator[list[tuple[bool, str]]]:
    """:func:`run_lines` a chunk of lines at a time: per chunk, the ``(ok, line)`` of its
    non-blank lines in order, malformed lines as their error lines and the rest answered by
    ``answer_many`` (the queries' fields, defaults merged in; one ``(ok, line)`` each, as
    :func:`run_lines` writes it). The end of the input ends the last chunk."""
    base = dict(defaults or {})
    source = iter(lines)
    first = 1  # the number of the chunk's first line
    while True:
        got: list[bytes | str | LineTooLong] = []
        failed: OSError | None = None
        try:
            got.extend(itertools.islice(source, chunk))
        except OSError as exc:  # the input failed mid-way: the lines read before it are answered first
            failed = exc
        if got:
            # the cyclic garbage collector paused while a chunk is read and answered: it makes
            # thousands of objects that live until its answers are written (and no cycles), on
            # which the collector would run again and again, through every object of the process
            paused = gc.isenabled()
            gc.disable()
            try:
                objs, misses = _flat_objects(got)
                if not misses:  # every line one flat object: answered as they are
                    found = cast("list[dict[str, Any]]", objs)
                    queries = [{**base, **obj} for obj in found] if base else found
                    answered = answer_many(queries)
                    if len(answered) != len(queries):
                        raise ValueError(f"{len(answered)} answers to {len(queries)} queries")
                else:
                    answered = _run_chunk_by_line(got, objs, misses, first, answer_many, base)
            finally:
                if paused:
                    gc.enable()
            yield answered
            first += len(got)
        if failed is not None:
            raise failed
        if not got:
            return


def _run_chunk_by_line(got: list[bytes | str | LineTooLong], objs: list[dict[str, Any] | None], misses: list[int],
                       first: int, answer_many: Callable[[list[dict[str, Any]]], list[tuple[bool, str]]],
                       base: dict[str, Any]) -> list[tuple[bool, str]]:
    """One chunk some of whose lines were not read with the rest: each of those on its own."""
    for k in misses:
        objs[k] = _flat_object(got[k])
    out: list[tuple[bool, str] | None] = []
    todo: list[int] = []
    queries: list[dict[str, Any]] = []
    for k, obj in enumerate(objs):
        if obj is None:
            try:
                obj = parse_line(first + k, got[k])
            except Exception as exc:  # a bad line never stops the batch
                out.append((False, dumps(error_line(exc))))
                continue
            if obj is None:
                continue
        todo.append(len(out))
        out.append(None)
        queries.append({**base, **obj} if base else obj)
    if queries:
        for at, answered in zip(todo, answer_many(queries), strict=True):
            out[at] = answered
    return [o for o in out if o is not None]  # (every None was filled)


__all__ = ["CHUNK_LINES", "LineTooLong", "error_line", "parse_line", "read_lines", "run_chunks", "run_lines"]
