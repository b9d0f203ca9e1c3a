"""The one reader of a query's ``--FIELD VALUE`` options: ``modperf query``'s key columns as
the typer command takes them (``cli.query_cmd``) and as the fast path reads a whole command
line before any parser is imported (``cli._single``). A batch line's fields come as a JSON
object instead (:func:`modperf.fast.batch.parse_line`); both hand the query the same
strings-or-numbers, which it coerces to each column's type.
"""

from __future__ import annotations

from ..base import errors as E

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


def option_fields(args: list[str], flags: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """The ``--FIELD VALUE`` and ``--FIELD=VALUE`` pairs of ``args`` in order, dashes in FIELD
    as underscores, values as given; and the ``flags`` (options without a value, e.g.
    ``--json``) met on the way, in order. A field given twice, a stray argument and an option
    without its value are each a QueryFieldError (the first one found)."""
    own_flags = frozenset(flags)
    fields: dict[str, str] = {}
    seen: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token in own_flags:
            seen.append(token)
            i += 1
            continue
        if not token.startswith("--") or token == "--":
            raise E.QueryFieldError(
                f"unexpected argument {token!r}: key columns are given as --FIELD VALUE",
                values={"argument": token}, fix="e.g. --batch-size 8 --isl 4096 (TABLE comes first)")
        name, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise E.QueryFieldError(f"--{name} needs a value", values={"field": name}, fix=f"--{name} VALUE")
            value = args[i + 1]
            i += 1
        key = name.replace("-", "_")
        if key in fields:  # (the last one winning would silently ignore the first)
            raise E.QueryFieldError(f"--{name} is given twice", values={"field": key}, fix="give each field once")
        fields[key] = value
        i += 1
    return fields, seen


__all__ = ["option_fields"]
