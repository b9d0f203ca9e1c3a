"""Compact text for the audit commands' tables (dedupe, coverage, check --quality)."""

from __future__ import annotations

from typing import Any

from ..data.catalog import TableRef

#: Short names for key columns in compact key text.
_SHORT = {"kernel_source": "kernel", "mla_dtype": "mla", "kv_cache_dtype": "kv", "gemm_type": "gemm", "native": "N",
          "num_heads": "heads", "batch_size": "batch", "num_key_value_heads": "kv_heads"}


def compact_key(key: dict[str, Any]) -> str:
    """``kernel=default kv=fp8 N=128 heads=16 batch=8 isl=1024`` (op_name left out: one per table)."""
    return " ".join(f"{_SHORT.get(k, k)}={v}" for k, v in key.items() if k != "op_name")


def short_label(ref: TableRef) -> str:
    """``system backend version table`` (the family folder adds nothing), or the path."""
    if ref.system is None:
        return str(ref.path)
    return f"{ref.system} {ref.backend} {ref.version} {ref.table}"


def label_words(label: str) -> str:
    """A catalog label ``system/family/backend/version/table`` as ``system backend version
    table`` (:func:`short_label`'s text: words a narrow column can wrap between)."""
    parts = label.split("/")
    return " ".join((parts[0], *parts[2:])) if len(parts) == 5 else label


def short_file(label: str) -> str:
    """A catalog label ``system/family/backend/version/table`` as ``backend version``."""
    parts = label.split("/")
    return f"{parts[2]} {parts[3]}" if len(parts) == 5 else label


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def short_count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)
