"""Every range a number from outside modperf must lie in, in one place (docs/limits.md).

A number enters modperf at a few edges: a query field, a command-line option, a value in an
HF config, a key column of a table, a value given to the writer's ``add()``. Each edge checks
it once, against the range named here, and refuses anything outside with a typed error that
names the field, the value and the range. Past the edge, code may rely on the ranges: no
product of two checked numbers overflows int64 (heads * tp < 2**29), and no loop or array
whose length a number sets is longer than the range allows.

The ranges are far wider than anything measured (the corpus's largest native head count is
128, its largest tp 64, its longest sequence about 2**21 tokens) and far narrower than the
numbers that break arithmetic (int64 wraps at 2**63; a divisor search over 10**18 never ends).

Strict parsing lives here too: a query line's integers are JSON integers (or ASCII digit
strings from the command line), never ``True``, never ``"²"``; a flag is a JSON boolean, never
the string ``"false"``.
"""

from __future__ import annotations

import math
import re

from . import errors as E

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from typing import Any


class Range:
    """Inclusive integer range of one kind of number; immutable, compared by value. (A plain
    class rather than a frozen dataclass: a batch answered from persisted plans reads its line
    limit here without importing ``dataclasses``.)"""

    __slots__ = ("high", "low", "what")
    low: int
    high: int
    what: str

    def __init__(self, low: int, high: int, what: str) -> None:
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "what", what)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def _values(self) -> tuple[int, int, str]:
        return self.low, self.high, self.what

    def __eq__(self, other: object) -> bool:
        if type(other) is not Range:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __reduce__(self) -> tuple[type[Range], tuple[int, int, str]]:
        return Range, self._values()  # (copied and pickled through the constructor)

    def __repr__(self) -> str:
        return f"Range(low={self.low!r}, high={self.high!r}, what={self.what!r})"

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high

    def describe(self) -> str:
        return f"{self.low:,}..{self.high:,}"


#: The signed 64-bit range parquet integer columns store.
INT64 = Range(-(2**63), 2**63 - 1, "a 64-bit signed integer")

HEADS = Range(1, 2**16, "attention heads")  # native, rank-local, kv heads
TP = Range(1, 2**12, "tensor-parallel ranks")
BATCH = Range(1, 2**20, "sequences in a batch")
TOKENS = Range(1, 2**22, "tokens")  # isl, osl, num_tokens, GEMM dims
CACHED_TOKENS = Range(0, 2**22, "cached tokens")  # step (kv length before the new tokens), prefix
WIDTH = Range(1, 2**20, "elements per head or token")  # head_dim, hidden_size, GEMM n/k
WINDOW = Range(0, 2**22, "tokens of attention window (0 = full attention)")
RATIO = Range(1, 2**16, "compression ratio")
BEAM = Range(1, 2**10, "beams")
LAYERS = Range(1, 2**12, "layers")
#: How many examples a report lists (0: all of them).
EXAMPLES = Range(0, 2**31 - 1, "examples listed (0 = all)")
#: Any other integer key column of a table or query (its own meaning, not arithmetic).
KEY = Range(0, 2**31 - 1, "a non-negative key value")

#: Query fields, table key columns and writer columns that have their own range.
FIELDS: dict[str, Range] = {
    "num_heads": HEADS,
    "native_heads": HEADS,
    "local_num_heads": HEADS,
    "num_key_value_heads": HEADS,
    "num_attention_heads": HEADS,
    "tp_size": TP,
    "batch_size": BATCH,
    "isl": TOKENS,
    "osl": TOKENS,
    "num_tokens": TOKENS,
    "seq_len": TOKENS,
    "m": Range(1, 2**42, "tokens in a batch"),  # a GEMM over batch * isl tokens
    "n": WIDTH,
    "k": WIDTH,
    "step": CACHED_TOKENS,
    "prefix": CACHED_TOKENS,
    "head_dim": WIDTH,
    "message_size": Range(1, 2**40, "elements in a message"),  # collectives sweep past 2**31 (oneccl on b60)
    "window_size": WINDOW,
    "compress_ratio": RATIO,
    "beam_width": BEAM,
    # estimate's options
    "batch": BATCH,
    "tp": TP,
    "decode_kv": TOKENS,
}

#: HF config fields modperf computes with, and their ranges (checked when a config is read).
CONFIG_FIELDS: dict[str, Range] = {
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "num_global_key_value_heads": HEADS,
    "swa_num_attention_heads": HEADS,
    "swa_num_key_value_heads": HEADS,
    "head_dim": WIDTH,
    "global_head_dim": WIDTH,
    "swa_head_dim": WIDTH,
    "hidden_size": WIDTH,
    "num_hidden_layers": LAYERS,
    "max_window_layers": Range(0, LAYERS.high, "layers"),
    "sliding_window": WINDOW,
    "sliding_window_size": WINDOW,
    "attention_chunk_size": WINDOW,
    "kv_lora_rank": WIDTH,
    "q_lora_rank": WIDTH,
    "qk_rope_head_dim": WIDTH,
    "qk_nope_head_dim": WIDTH,
    "v_head_dim": WIDTH,
}
#: Config fields that may be null (HF configs write ``"sliding_window": null`` for "none");
#: any other field above is an integer in its range when present.
CONFIG_NULLABLE = frozenset({"sliding_window", "sliding_window_size", "attention_chunk_size", "num_key_value_heads",
                             "head_dim", "max_window_layers", "q_lora_rank"})
#: Per-layer lists in a config: at most this many entries (a layer schedule walks them).
CONFIG_LAYER_LISTS = ("compress_ratios", "layers_block_type", "layer_types", "hybrid_override_pattern",
                      "hybrid_layer_pattern", "no_rope_layers", "indexer_types", "sparse_attention_freq")
MAX_LAYER_LIST = 2 * LAYERS.high
#: A config file larger than this is not an HF config (the corpus's largest is ~40 KB).
MAX_CONFIG_BYTES = 16 * 2**20
#: Nesting of a config's objects and lists (the corpus's deepest is 6).
MAX_CONFIG_DEPTH = 32

#: One batch line (a query is a few hundred bytes; a longer line is answered with an error).
MAX_LINE_BYTES = 16 * 2**20
#: Characters of a user-given string quoted in a message (the rest is elided, with its length).
QUOTE_CHARS = 120
#: Digits of a number written as text (int64 has 19).
MAX_DIGITS = 20

_DIGITS = re.compile(rf"[+-]?[0-9]{{1,{MAX_DIGITS}}}")


def range_of(name: str) -> Range:
    """The range of a query field or key column (:data:`KEY` for one without its own)."""
    return FIELDS.get(name, KEY)


def _out_of_range(error: type[E.ModperfError], name: str, value: Any, rng: Range, fix: str | None,
                  **kwargs: Any) -> E.ModperfError:
    return error(f"{name} must be an integer in {rng.describe()} ({rng.what})",
                 values={"field": name, "value": value, "range": [rng.low, rng.high]},
                 fix=fix or f"pass {name} as a whole number in {rng.describe()}", **kwargs)


def parse_int(name: str, value: Any, *, rng: Range | None = None, error: type[E.ModperfError] = E.QueryFieldError,
              fix: str | None = None, **kwargs: Any) -> int:
    """``value`` as an int in ``rng`` (default: the field's own range), strictly.

    Accepted: an int (not a bool), a float with an integral value, a string of ASCII digits
    (what the command line gives). Anything else, or a number outside the range, raises
    ``error`` naming the field, the value and the range."""
    rng = rng or range_of(name)
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind in "iu":
        number = int(value)  # a numpy integer scalar
    elif isinstance(value, float) or (hasattr(value, "dtype") and getattr(value, "shape", None) == ()
                                      and value.dtype.kind == "f"):
        f = float(value)
        if math.isfinite(f) and f.is_integer():
            number = int(f)
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
    if number is None or not rng.low <= number <= rng.high:
        raise _out_of_range(error, name, value, rng, fix, **kwargs)
    return number


def check_int(name: str, value: int, *, rng: Range | None = None, error: type[E.ModperfError] = E.QueryFieldError,
              fix: str | None = None, **kwargs: Any) -> int:
    """An already-typed integer inside its range, or ``error``."""
    rng = rng or range_of(name)
    if not rng.low <= value <= rng.high:
        raise _out_of_range(error, name, value, rng, fix, **kwargs)
    return value


def parse_bool(name: str, value: Any, *, error: type[E.ModperfError] = E.QueryFieldError) -> bool:
    """A JSON boolean, strictly: the string ``"false"`` is not False (nor True)."""
    if isinstance(value, bool):
        return value
    if hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind == "b":
        return bool(value)
    raise error(f"{name} must be true or false (a JSON boolean, not a string or number)",
                values={"field": name, "value": value}, fix=f'e.g. "{name}": true')


__all__ = ["BATCH", "BEAM", "CACHED_TOKENS", "CONFIG_FIELDS", "CONFIG_LAYER_LISTS", "CONFIG_NULLABLE", "EXAMPLES",
           "FIELDS", "HEADS", "INT64", "KEY", "LAYERS", "MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH", "MAX_DIGITS",
           "MAX_LAYER_LIST", "MAX_LINE_BYTES", "QUOTE_CHARS", "RATIO", "TOKENS", "TP", "WIDTH", "WINDOW", "Range",
           "check_int", "parse_bool", "parse_int", "range_of"]
