"""The shard rules: what one rank runs when a model is deployed at a tensor-parallel size.

Every command that turns a model and a deployment into table keys goes through here (query,
estimate, coverage, the step pricer), so that they cannot disagree:

* tp sizes as users give them (:func:`parse_tps`, :func:`validate_tps`);
* local heads: ``native / tp``, only where tp divides the native (:func:`local_heads`);
* GQA kv heads under the backends' sharding rule (:func:`local_kv_heads`): each rank holds
  ``kv / tp`` kv heads where tp divides kv; where tp exceeds kv (and kv divides tp) every rank
  holds one kv head, replicated ``tp / kv`` times (vLLM, SGLang and TRT-LLM all replicate this
  way); any other combination cannot be sharded;
* ``head_dim`` of a config (its own field, else ``hidden_size / num_attention_heads``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..base import errors as E
from ..base import limits

if TYPE_CHECKING:
    from .models import ModelConfig

TP_FIX = "pass e.g. --tp 1,2,4,8"



# --- tp sizes ---------------------------------------------------------------------------------


def validate_tps(tps: Iterable[object]) -> list[int]:
    """Distinct integers in the tp range (modperf.base.limits), sorted; anything else is an
    OptionValueError (exit 2)."""
    values = list(tps)
    ok = values and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                        and limits.TP.low <= t <= limits.TP.high for t in values)
    if not ok:
        raise E.OptionValueError(f"tp sizes must be positive integers in {limits.TP.describe()}", values={"tp": values},
                                 fix=TP_FIX)
    return sorted({int(t) for t in values if isinstance(t, (int, np.integer))})  # every t is (ok); narrows t


def parse_tps(text: str) -> list[int]:
    """``"1,2,4,8"`` -> [1, 2, 4, 8]. Every comma separates a number: ``1,,2`` is refused."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and len(p) <= limits.MAX_DIGITS and int(p) in limits.TP for p in parts):
        raise E.OptionValueError(f"--tp takes positive integers separated by commas (each in {limits.TP.describe()})",
                                 values={"tp": text}, fix=TP_FIX)
    return validate_tps([int(p) for p in parts])


def divisors(n: int) -> list[int]:
    """The tp sizes (inside the tp range) that divide ``n``: at most ``limits.TP.high`` tries,
    whatever ``n`` is."""
    return [d for d in range(1, min(n, limits.TP.high) + 1) if n % d == 0]


# --- heads ------------------------------------------------------------------------------------


def local_heads(native: int, tp: int) -> int:
    """Heads one rank runs: ``native / tp``; ShardError where tp does not divide the native."""
    if native % tp:
        raise E.ShardError(
            f"tp_size={tp} does not divide the native head count {native}",
            values={"native_heads": native, "tp_size": tp},
            fix=f"use a tp_size that divides {native} ({', '.join(map(str, divisors(native)))}), "
                "or give num_heads (the rank-local count) directly")
    return native // tp


def kv_shardable(kv: int, tp: int) -> bool:
    return kv % tp == 0 or tp % kv == 0


def local_kv_heads(kv: int, tp: int) -> int:
    """kv heads one rank holds: ``kv / tp``, or one (replicated) where tp exceeds kv."""
    if kv % tp == 0:
        return kv // tp
    if tp % kv == 0:
        return 1
    raise E.ShardError(
        f"tp_size={tp} cannot shard {kv} kv heads (neither divides the other)",
        values={"num_key_value_heads": kv, "tp_size": tp},
        fix=f"use a tp_size that divides {kv} or that {kv} divides")


def head_dim(cfg: ModelConfig) -> int | None:
    """The attention head width: the config's ``head_dim``, else hidden_size / heads."""
    hd = cfg.get("head_dim", None)
    if isinstance(hd, int) and not isinstance(hd, bool):
        return hd
    hidden = cfg.get("hidden_size", None)
    if isinstance(hidden, int) and hidden % cfg.native_heads == 0:
        return hidden // cfg.native_heads
    return None


def gqa_dims(cfg: ModelConfig) -> tuple[int, int] | None:
    """(kv heads, head_dim) of a GQA model, or None where the config does not say."""
    kv = cfg.kv_heads
    hd = head_dim(cfg)
    if kv is None or hd is None:
        return None
    return kv, hd


__all__ = ["TP_FIX", "divisors", "gqa_dims", "head_dim", "kv_shardable", "local_heads", "local_kv_heads", "parse_tps",
           "validate_tps"]
