"""JSON as modperf writes it: strict RFC 8259 (a NaN or infinite float becomes null, never the
``NaN`` token strict parsers reject), numpy scalars and arrays as plain numbers and lists."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


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
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _default(value: Any) -> Any:
    """What the encoder cannot write itself (numpy values, sets, paths), as :func:`plain` makes it."""
    if isinstance(value, (np.ndarray, np.generic, Path, set, frozenset)):
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
    in many times (the answer lines of a batch, modperf.query_lines)."""
    return json.dumps(obj, allow_nan=False, default=_default)


__all__ = ["dumps", "dumps_as_is", "dumps_small", "plain"]
