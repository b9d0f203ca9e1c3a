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


def dumps(obj: Any, **kwargs: Any) -> str:
    return json.dumps(plain(obj), allow_nan=False, **kwargs)


__all__ = ["dumps", "plain"]
