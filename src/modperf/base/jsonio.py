"""JSON as modperf writes it: strict RFC 8259 (a NaN or infinite float becomes null, never the
``NaN`` token strict parsers reject), numpy scalars and arrays as plain numbers and lists.

Neither numpy nor pathlib is imported here: a value of theirs exists only once its module is
imported (so it is looked up in ``sys.modules``), and a process answering from a persisted
plan (modperf.cli._single) writes its answer without importing either."""

from __future__ import annotations

import json
import math
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _numpy_types() -> tuple[Any, Any] | None:
    np = sys.modules.get("numpy")
    return None if np is None else (np.ndarray, np.generic)


def _is_path(value: Any) -> bool:
    pathlib = sys.modules.get("pathlib")
    return pathlib is not None and isinstance(value, pathlib.PurePath)


def plain(value: Any) -> Any:
    """``value`` with numpy types, sets, tuples and paths made JSON types, and every
    non-finite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    numpy_types = _numpy_types()
    if numpy_types is not None and isinstance(value, numpy_types[0]):
        return [plain(v) for v in value.tolist()]
    if numpy_types is not None and isinstance(value, numpy_types[1]):
        return plain(value.item())
    if _is_path(value):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _default(value: Any) -> Any:
    """What the encoder cannot write itself (numpy values, sets, paths), as :func:`plain` makes it."""
    numpy_types = _numpy_types()
    if isinstance(value, (set, frozenset)) or (numpy_types is not None and isinstance(value, numpy_types)) \
            or _is_path(value):
        return plain(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(obj: Any, **kwargs: Any) -> str:
    return json.dumps(plain(obj), allow_nan=False, **kwargs)


def dumps_small(obj: Any, **kwargs: Any) -> str:
    """:func:`dumps` for many small objects (a batch's answer lines), the same text faster."""
    # The encoder writes the common case (no NaN or infinity anywhere) directly, as plain()
    # would have made it: tuples as lists, float and int subclasses by their float/int value.
    # A non-finite float makes it refuse (allow_nan=False); then plain() replaces it by null.
    # (Answers and errors key their objects by strings only; plain() would spell a True or None
    # key "True" / "None" where the encoder writes "true" / "null".)
    try:
        return json.dumps(obj, allow_nan=False, default=_default, **kwargs)
    except ValueError:
        return json.dumps(plain(obj), allow_nan=False, **kwargs)


def dumps_as_is(obj: Any) -> str:
    """The text :func:`dumps_small` writes for ``obj`` when nothing in it needs rewriting;
    ValueError where something does (a NaN or infinite float). For text made once and filled
    in many times (the answer lines of a batch, modperf.query.lines)."""
    return json.dumps(obj, allow_nan=False, default=_default)


def tagged(value: Any) -> Any:
    """``value`` made strict JSON losslessly (the persisted caches' headers): tuples, dicts with
    any keys and non-finite floats are tagged so that :func:`untagged` gives them back as they
    were; numpy scalars become Python numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"f": repr(value)}
    if isinstance(value, tuple):
        return {"t": [tagged(v) for v in value]}
    if isinstance(value, list):
        return [tagged(v) for v in value]
    if isinstance(value, dict):
        return {"d": [[tagged(k), tagged(v)] for k, v in value.items()]}
    numpy_types = _numpy_types()
    if numpy_types is not None and isinstance(value, numpy_types[1]):
        np = sys.modules["numpy"]
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
    return value


def untagged(value: Any) -> Any:
    """The value :func:`tagged` made JSON of."""
    # (JSON scalars are taken as they are, without a call each: an entry's header holds
    # thousands of them)
    if isinstance(value, dict):
        if "t" in value:
            return tuple([v if type(v) in _SCALARS else untagged(v) for v in value["t"]])
        if "f" in value:
            return float(value["f"])
        return {untagged(k): untagged(v) for k, v in value["d"]}
    if isinstance(value, list):
        return [v if type(v) in _SCALARS else untagged(v) for v in value]
    return value


_SCALARS = frozenset((str, int, float, bool, type(None)))


__all__ = ["dumps", "dumps_as_is", "dumps_small", "plain", "tagged", "untagged"]
