"""Rows handed to a user's own tools: Arrow tables, and pandas or polars frames where installed.

``KeyedTable.to_arrow()`` gives a table's measured points; :func:`answers_to_arrow` gives
query answers (``Answer`` objects, their ``to_dict()``, or the JSON lines ``query --batch``
writes) one row each; :func:`to_frame` turns either into a pandas or polars frame. pandas and
polars are not dependencies of modperf: a frame needs the library installed, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..base import errors as E

if TYPE_CHECKING:  # pyarrow on use (a query answered from a persisted plan imports none)
    import pyarrow as pa

#: The libraries :func:`to_frame` hands a table to, and how each is installed.
FRAME_LIBRARIES = {"pandas": "pip install pandas", "polars": "pip install polars"}

#: An answer's own columns, first in every table of answers (then the fields asked, by name).
ANSWER_COLUMNS = ("latency_ms", "kind", "table", "system", "backend", "version", "native", "local",
                  "requested_native", "substituted_from", "reused_from", "extrapolated_octaves", "models", "files",
                  "notes", "error")


def _answer_row(answer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the answer's own columns, the fields it answered) of an Answer, its dict, or an error
    line of ``query --batch``."""
    d = answer.to_dict() if hasattr(answer, "to_dict") else answer
    if not isinstance(d, Mapping):
        raise E.UsageError(f"an answer is an Answer or its dict, not {type(answer).__name__}",
                           fix="pass db.query(...) results, their .to_dict(), or json.loads of query --batch lines")
    if "error" in d and "latency_ms" not in d:
        err = d["error"] if isinstance(d["error"], Mapping) else {"message": str(d["error"])}
        return {"kind": "error", "error": err.get("message")}, {}
    x = d.get("extrapolation") or {}
    own = {name: d.get(name) for name in ANSWER_COLUMNS if name not in ("extrapolated_octaves", "models", "files",
                                                                         "notes", "error")}
    own["extrapolated_octaves"] = x.get("distance_octaves") if isinstance(x, Mapping) else None
    for name in ("models", "files", "notes"):
        own[name] = ", ".join(map(str, d.get(name) or ())) or None
    return own, dict(d.get("fields") or {})


def _column(values: list[Any]) -> pa.Array:
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types across answers: as text
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def answers_to_arrow(answers: Iterable[Any]) -> pa.Table:
    """One row per answer: its latency, kind (a name, never a code), slot, native and local
    heads, substitution, reuse and extrapolation, models, files and notes (comma-joined), then
    every field it answered (a column per field name, null where an answer has none). An error
    line of ``query --batch`` is a row of kind ``error`` with its message."""
    import pyarrow as pa

    rows = [_answer_row(a) for a in answers]
    names = list(ANSWER_COLUMNS)
    for _, fields in rows:
        names += [k for k in fields if k not in names]
    columns = {name: _column([own[name] if name in own else fields.get(name) for own, fields in rows])
               for name in names}
    return pa.table(columns) if rows else pa.table({name: pa.array([], pa.null()) for name in names})


def to_frame(table: pa.Table, library: str = "pandas") -> Any:
    """``table`` as a pandas DataFrame (``library="pandas"``) or a polars DataFrame
    (``"polars"``); a library that is not installed is a UsageError saying how to install it."""
    if library not in FRAME_LIBRARIES:
        raise E.OptionValueError(f"no frame library {E.quote(library)}", values={"library": library},
                                 fix=f"choose {' or '.join(FRAME_LIBRARIES)}")
    try:
        module = __import__(library)
    except ImportError:
        raise E.UsageError(f"{library} is not installed (modperf does not depend on it)", values={"library": library},
                           fix=f"{FRAME_LIBRARIES[library]}, or use the Arrow table itself") from None
    return table.to_pandas() if library == "pandas" else module.from_arrow(table)


__all__ = ["ANSWER_COLUMNS", "FRAME_LIBRARIES", "answers_to_arrow", "to_frame"]
