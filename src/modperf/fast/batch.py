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
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from ..base.jsonio import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing, errors and limits cost a batch answered from persisted plans ~10 ms: on use)
    from typing import IO, Any, cast
else:
    def cast(_: object, value: object) -> object:
        return value

_ASCII_BLANK = " \t\n\r\x0b\x0c"  # what bytes.strip() removes: a line of only these is blank
_LINE_FIX = 'one JSON object per line, e.g. {"table": "...", "system": "...", ...}'


class LineTooLong:
    """Stands for an input line longer than the limit (its bytes were skipped, not kept)."""

    def __init__(self, size: int) -> None:
        self.size = size


def read_lines(stream: IO[bytes], limit: int | None = None) -> Iterator[bytes | LineTooLong]:
    """The lines of a byte stream; a line longer than ``limit`` bytes (default: the query
    line's limit, modperf.base.limits) comes out as a :class:`LineTooLong` (read through in chunks,
    never held whole)."""
    if limit is None:
        from ..base.limits import MAX_LINE_BYTES

        limit = MAX_LINE_BYTES
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
    from ..base import errors as E

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
            from ..base import errors as E

            raise ValueError(f"field {E.quote(key)} appears twice")
        seen.add(key)
    raise AssertionError("a shorter dict has a repeated key")


#: json.loads(text, parse_constant=..., object_pairs_hook=...) builds a decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)


def parse_line(number: int, line: bytes | str | LineTooLong, fix: str = _LINE_FIX) -> dict[str, Any] | None:
    """One batch line as a query's fields (None for a blank line); every way a line can be
    malformed is a QueryFieldError naming the line, whose ``fix`` shows a line of the batch's
    kind (a query's by default, a deployment's for ``predict --batch``)."""
    from ..base import errors as E
    from ..base.limits import MAX_LINE_BYTES

    if isinstance(line, LineTooLong):
        raise E.QueryFieldError(f"line {number} is {line.size:,} bytes, longer than a query line may be",
                                values={"line": number, "limit_bytes": MAX_LINE_BYTES}, fix=fix)
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
                                values={"line": number}, fix=fix) from None
    except RecursionError:
        raise E.QueryFieldError(f"line {number} nests arrays or objects too deep to be a query",
                                values={"line": number}, fix=fix) from None
    except ValueError as exc:  # NaN/Infinity, a duplicate key, an integer of thousands of digits
        raise E.QueryFieldError(f"line {number} is not strict JSON: {E.clean(str(exc), 200)}",
                                values={"line": number}, fix=fix) from None
    if not isinstance(obj, dict):
        raise E.QueryFieldError(f"line {number}: a query is a JSON object, got {type(obj).__name__}",
                                values={"line": number}, fix=fix)
    return obj


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

#: Answers a shape's lines: ``(fields, holes, columns, n)`` -- the fields of the shape's first
#: line (defaults merged in), the fields its lines give as their own integers, each such
#: field's digits per line, the number of lines -- gives one ``(ok, line)`` per line, or None
#: where the lines are to be read and answered one by one.
if TYPE_CHECKING:  # (annotations only)
    ShapedAnswer = Callable[[dict[str, Any], tuple[str, ...], list[tuple[bytes, ...]], int],
                            "list[tuple[bool, str]] | None"]


def run_chunks(lines: Iterable[bytes | str | LineTooLong],
               answer_many: Callable[[list[dict[str, Any]]], list[tuple[bool, str]]],
               defaults: Mapping[str, Any] | None = None, chunk: int = CHUNK_LINES,
               shapes: LineShapes | None = None, answer_shaped: ShapedAnswer | None = None,
               fix: str = _LINE_FIX, error_fields: Mapping[str, Any] | None = None
               ) -> Iterator[list[tuple[bool, str]]]:
    """:func:`parse_line` and answer a chunk of lines at a time: per chunk, the ``(ok, line)`` of its
    non-blank lines in order, malformed lines as their error lines and the rest answered by
    ``answer_many`` (the queries' fields, defaults merged in; one ``(ok, line)`` each, as
    ``dumps_small`` of its ``to_dict()``, or an error line). The end of the input ends the last chunk.

    With ``shapes`` (made with the same defaults) and ``answer_shaped``, the lines of a known
    shape (:class:`LineShapes`) are not read as JSON: each shape's lines go to
    ``answer_shaped`` as columns of their integers, and only the others (and a shape's lines
    that it gives back) to ``answer_many``.

    A malformed line's error line starts with ``error_fields`` (e.g. ``{"id": None}``), and
    its ``fix`` shows ``fix`` (a line of the batch's kind: :func:`parse_line`). This is the one
    JSON-lines loop: ``query --batch`` runs it a chunk at a time, ``predict --batch`` a line at
    a time (``chunk=1``: each answer is written as soon as it is priced)."""
    base = dict(defaults or {})
    malformed = _Malformed(fix, dict(error_fields or {}))
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
                if shapes is not None and answer_shaped is not None:
                    answered = _run_chunk_shaped(got, first, answer_many, base, shapes, answer_shaped, malformed)
                else:
                    answered = _run_chunk(got, range(first, first + len(got)), answer_many, base, malformed)
            finally:
                if paused:
                    gc.enable()
            yield answered
            first += len(got)
        if failed is not None:
            raise failed
        if not got:
            return


class _Malformed:
    """How a batch says a line is malformed: its fix, and the fields its error line starts with."""

    __slots__ = ("fields", "fix")

    def __init__(self, fix: str, fields: dict[str, Any]) -> None:
        self.fix = fix
        self.fields = fields

    def line(self, exc: BaseException) -> tuple[bool, str]:
        return False, dumps({**self.fields, **error_line(exc)})


def _run_chunk(got: list[bytes | str | LineTooLong], numbers: Sequence[int],
               answer_many: Callable[[list[dict[str, Any]]], list[tuple[bool, str]]],
               base: dict[str, Any], malformed: _Malformed) -> list[tuple[bool, str]]:
    """The ``(ok, line)`` of a chunk's non-blank lines (``numbers``: each line's number)."""
    objs, misses = _flat_objects(got)
    if not misses:  # every line one flat object: answered as they are
        found = cast("list[dict[str, Any]]", objs)
        queries = [{**base, **obj} for obj in found] if base else found
        answered = answer_many(queries)
        if len(answered) != len(queries):
            raise ValueError(f"{len(answered)} answers to {len(queries)} queries")
        return answered
    return [o for o in _run_chunk_by_line(got, objs, misses, numbers, answer_many, base, malformed) if o is not None]


def _run_chunk_shaped(got: list[bytes | str | LineTooLong], first: int,
                      answer_many: Callable[[list[dict[str, Any]]], list[tuple[bool, str]]], base: dict[str, Any],
                      shapes: LineShapes, answer_shaped: ShapedAnswer, malformed: _Malformed
                      ) -> list[tuple[bool, str]]:
    """A chunk whose lines of a known shape go to ``answer_shaped``, the rest as :func:`_run_chunk`."""
    found, rest = shapes.split(got)
    if not found:
        return _run_chunk(got, range(first, first + len(got)), answer_many, base, malformed)
    out: list[tuple[bool, str] | None] = [None] * len(got)
    for shape, at, columns in found:
        answered = answer_shaped(shape.fields, shape.holes, columns, len(at))
        if answered is None:
            rest.extend(at)
            continue
        if len(answered) != len(at):
            raise ValueError(f"{len(answered)} answers to {len(at)} queries")
        for k, one in zip(at, answered):
            out[k] = one
    if rest:
        rest.sort()
        lines = [got[k] for k in rest]
        objs, misses = _flat_objects(lines)
        for k, maybe in zip(rest, _run_chunk_by_line(lines, objs, misses, [first + k for k in rest], answer_many,
                                                      base, malformed)):
            out[k] = maybe
    return [o for o in out if o is not None]  # (a blank line has no answer)


def _run_chunk_by_line(got: list[bytes | str | LineTooLong], objs: list[dict[str, Any] | None], misses: list[int],
                       numbers: Sequence[int], answer_many: Callable[[list[dict[str, Any]]], list[tuple[bool, str]]],
                       base: dict[str, Any], malformed: _Malformed) -> list[tuple[bool, str] | None]:
    """Lines some of which were not read with the rest: each of those on its own. Per line,
    its ``(ok, line)``, None for a blank line."""
    for k in misses:
        objs[k] = _flat_object(got[k])
    out: list[tuple[bool, str] | None] = [None] * len(got)
    todo: list[int] = []
    queries: list[dict[str, Any]] = []
    for k, obj in enumerate(objs):
        if obj is None:
            try:
                obj = parse_line(numbers[k], got[k], malformed.fix)
            except Exception as exc:  # a bad line never stops the batch
                out[k] = malformed.line(exc)
                continue
            if obj is None:
                continue
        todo.append(k)
        queries.append({**base, **obj} if base else obj)
    if queries:
        for at, answered in zip(todo, answer_many(queries), strict=True):
            out[at] = answered
    return out


# -- lines of a known shape -----------------------------------------------------------------

#: An integer as JSON and Python's repr both write it (no leading zero, no "-0"), of at most
#: 18 digits (an int64), standing where a shape's line gives its own value.
_HOLE = rb"(0|-?[1-9][0-9]{0,17})"
_DIGITS = b"0123456789"
_BLANKS = re.compile(r"[ \t\n\r]*")


class Shape:
    """The lines that are one line's bytes but for the integer values of some fields (its
    holes): each such line is the JSON object ``fields`` with those values replaced."""

    __slots__ = ("fields", "holes", "pattern")

    def __init__(self, fields: dict[str, Any], holes: tuple[str, ...], pattern: re.Pattern[bytes]) -> None:
        self.fields = fields
        self.holes = holes
        self.pattern = pattern


def shape_of(line: bytes, free: frozenset[str], base: Mapping[str, Any]) -> Shape | None:
    """The shape of ``line`` whose holes are the fields among ``free`` given as integers; None
    for a line that is not one flat JSON object of unique keys in UTF-8.

    Why a line that the pattern matches is that object with the holes' values replaced: the
    pattern is the line's bytes, each hole's integer token replaced by a group matching an
    integer token. A value's token ends where the JSON scanner ended it (a blank, a comma or
    the closing brace follows: no digit, point or exponent) and follows a colon or a blank,
    so a matched line holds the same tokens in the same places but for the holes' integers,
    and reads as the same keys in the same order with the same values but those."""
    obj = _flat_object(line)
    if obj is None:
        return None
    text = line.decode("utf-8")
    spans = _value_spans(text)
    if spans is None or [(k, v) for k, v, _, _ in spans] != list(obj.items()):
        return None
    pieces: list[bytes] = []
    holes: list[str] = []
    last = 0
    hole = re.compile(_HOLE)
    for key, value, start, end in spans:
        token = text[start:end]
        if key in free and type(value) is int and hole.fullmatch(token.encode()) and repr(value) == token:
            at = len(text[:start].encode("utf-8"))
            pieces.append(re.escape(line[last:at]))
            pieces.append(_HOLE)
            last = at + len(token)
            holes.append(key)
    pieces.append(re.escape(line[last:]))
    return Shape({**base, **obj}, tuple(holes), re.compile(b"".join(pieces)))


def _value_spans(text: str) -> list[tuple[str, Any, int, int]] | None:
    """``(key, value, start, end)`` per pair of a flat JSON object's text (blanks around it),
    in order; None where the text is not read that way."""
    try:
        at = _BLANKS.match(text).end()  # type: ignore[union-attr]
        if not text.startswith("{", at):
            return None
        at = _BLANKS.match(text, at + 1).end()  # type: ignore[union-attr]
        spans = []
        if text.startswith("}", at):
            at += 1
        else:
            while True:
                key, at = _SCAN_PAIRS(text, at)
                at = _BLANKS.match(text, at).end()  # type: ignore[union-attr]
                if type(key) is not str or not text.startswith(":", at):
                    return None
                start = _BLANKS.match(text, at + 1).end()  # type: ignore[union-attr]
                value, at = _SCAN_PAIRS(text, start)
                spans.append((key, value, start, at))
                at = _BLANKS.match(text, at).end()  # type: ignore[union-attr]
                if text.startswith(",", at):
                    at = _BLANKS.match(text, at + 1).end()  # type: ignore[union-attr]
                elif text.startswith("}", at):
                    at += 1
                    break
                else:
                    return None
    except Exception:  # StopIteration (no value there), a bad number
        return None
    return spans if not text[at:].strip(_JSON_BLANK) else None


class LineShapes:
    """The shapes of a batch's lines (:class:`Shape`: one line's bytes but for the integers of
    the fields ``free``), learnt as lines come: a line matching a known shape is read by one
    match of its pattern instead of the JSON reader. A program's batch is mostly lines of a
    few shapes (its fields fixed, its points varying).

    A chunk's lines are grouped by their bytes without digits (one C call per line); a group
    is matched against the shapes known for its text, and a shape is learnt from the first
    line that none of them matches where at least ``learn_at`` lines share that text (making
    the pattern costs about what reading a few hundred lines costs), at most
    ``learn_per_chunk`` shapes a chunk and ``per_text`` per text, ``keep`` in all (then every
    shape is dropped and learnt again as lines come: a pattern holds some kilobytes).
    The ``recent`` shapes that most of a chunk's lines had are tried first on the next chunk's
    every line, before any grouping."""

    def __init__(self, free: frozenset[str], defaults: Mapping[str, Any] | None = None, learn_at: int = 64,
                 learn_per_chunk: int = 4, per_text: int = 8, keep: int = 256, recent: int = 4) -> None:
        self.free = free
        self.base = dict(defaults or {})
        self.learn_at = learn_at
        self.learn_per_chunk = learn_per_chunk
        self.per_text = per_text
        self.keep = keep
        self._by_text: dict[bytes, list[Shape]] = {}
        self._n_shapes = 0  # shapes kept in all
        self._tried: dict[bytes, int] = {}  # lines of a text no shape could be learnt from
        self.recent = recent
        self._recent: list[Shape] = []  # the shapes tried first on a chunk's every line

    def split(self, lines: list[bytes | str | LineTooLong]
              ) -> tuple[list[tuple[Shape, list[int], list[tuple[bytes, ...]]]], list[int]]:
        """Per shape found among ``lines``: the shape, the positions of its lines and, per
        hole, the digits of each; then the positions of the other lines."""
        found: list[tuple[Shape, list[int], list[tuple[bytes, ...]]]] = []
        at = list(range(len(lines)))
        if self._recent:
            # the shapes most of the last chunk's lines had, tried on every line first (a line
            # of another shape fails its match within its first differing bytes)
            try:
                for shape in self._recent:
                    at = self._match(shape, lines, at, found)
                    if not at:
                        break
            except TypeError:  # a line that is not bytes: the lines grouped by their text below
                found, at = [], list(range(len(lines)))
        if at:
            found, rest = self._split_by_text(lines, at, found)
        else:
            rest = []
        # the next chunk tries first the shapes of at least a sixteenth of this one's lines
        common = sorted(((len(rows), id(shape), shape) for shape, rows, _ in found if 16 * len(rows) >= len(lines)),
                        key=lambda c: c[:2], reverse=True)
        self._recent = [shape for _, _, shape in common[:self.recent]]
        return found, rest

    def _split_by_text(self, lines: list[bytes | str | LineTooLong], todo: list[int],
                       found: list[tuple[Shape, list[int], list[tuple[bytes, ...]]]]
                       ) -> tuple[list[tuple[Shape, list[int], list[tuple[bytes, ...]]]], list[int]]:
        """:meth:`split` of the lines ``todo``, grouped by their bytes without digits (added
        to ``found``)."""
        picked = cast("list[bytes]", lines if len(todo) == len(lines) else [lines[k] for k in todo])
        try:
            texts = list(map(bytes.translate, picked, itertools.repeat(None), itertools.repeat(_DIGITS)))
        except TypeError:  # a line that is not bytes (too long, or given as str): none of a shape
            texts = [line.translate(None, _DIGITS) if type(line) is bytes else None  # type: ignore[misc]
                     for line in picked]
        index: dict[bytes | None, int] = {}
        ids = [index.setdefault(t, len(index)) for t in texts]
        rows: list[list[int]] = [[] for _ in index]
        for k, g in zip(todo, ids):
            rows[g].append(k)
        rest: list[int] = []
        budget = self.learn_per_chunk
        for text, at in zip(index, rows):
            shapes = self._by_text.get(text) if text is not None else None
            if shapes is None:
                if text is None or len(at) < self.learn_at or self._tried.get(text, 0) >= 2:
                    rest.extend(at)
                    continue
                shapes = []
            for shape in shapes:
                at = self._match(shape, lines, at, found)
                if not at:
                    break
            while at and budget > 0 and len(at) >= self.learn_at and len(shapes) < self.per_text:
                budget -= 1
                learnt = shape_of(cast(bytes, lines[at[0]]), self.free, self.base)
                if learnt is None or learnt.pattern.fullmatch(cast(bytes, lines[at[0]])) is None:
                    if len(self._tried) >= self.keep:
                        self._tried.clear()
                    self._tried[cast(bytes, text)] = self._tried.get(cast(bytes, text), 0) + 1
                    break
                if self._n_shapes >= self.keep:
                    self._by_text.clear()
                    self._n_shapes = 0
                    shapes = []
                if not shapes:
                    self._by_text[cast(bytes, text)] = shapes
                shapes.append(learnt)
                self._n_shapes += 1
                at = self._match(learnt, lines, at, found)
            rest.extend(at)
        return found, rest

    @staticmethod
    def _match(shape: Shape, lines: list[bytes | str | LineTooLong], at: list[int],
               found: list[tuple[Shape, list[int], list[tuple[bytes, ...]]]]) -> list[int]:
        """The lines ``at`` that ``shape`` matches added to ``found``; the others returned."""
        matches = list(map(shape.pattern.fullmatch, map(cast("list[bytes]", lines).__getitem__, at)))
        if None in matches:
            miss = [k for k, m in zip(at, matches) if m is None]
            at = [k for k, m in zip(at, matches) if m is not None]
            matches = [m for m in matches if m is not None]
        else:
            miss = []
        if at:
            groups = cast("Callable[[re.Match[bytes] | None], tuple[bytes, ...]]", re.Match.groups)
            columns = list(zip(*map(groups, matches))) if shape.holes else []
            found.append((shape, at, columns))
        return miss


__all__ = ["CHUNK_LINES", "LineShapes", "LineTooLong", "Shape", "error_line", "parse_line", "read_lines", "run_chunks",
           "shape_of"]
