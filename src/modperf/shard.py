"""Tensor-parallel sizes as users give them: one parser and one check for every command."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from . import errors as E

TP_FIX = "pass e.g. --tp 1,2,4,8"


def validate_tps(tps: Iterable[object]) -> list[int]:
    """Distinct positive integers, sorted; anything else is an OptionValueError (exit 2)."""
    values = list(tps)
    ok = values and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t > 0 for t in values)
    if not ok:
        raise E.OptionValueError("tp sizes must be positive integers", values={"tp": values}, fix=TP_FIX)
    return sorted({int(t) for t in values})


def parse_tps(text: str) -> list[int]:
    """``"1,2,4,8"`` -> [1, 2, 4, 8]."""
    try:
        values = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise E.OptionValueError("--tp takes positive integers separated by commas", values={"tp": text},
                                 fix=TP_FIX) from None
    if not values or any(v <= 0 for v in values):
        raise E.OptionValueError("--tp takes positive integers separated by commas", values={"tp": text},
                                 fix=TP_FIX)
    return validate_tps(values)
