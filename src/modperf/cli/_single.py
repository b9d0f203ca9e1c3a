"""``modperf query TABLE ... --json``, answered from a persisted plan before the command-line
parser starts (modperf.fast.plans): a process asking one thing prints its answer without importing
typer, rich, pydantic, numpy or pyarrow.

Only a plain command line takes this way: ``query``, the table first, then options given as
``--NAME VALUE`` or ``--NAME=VALUE`` (each once), ``--json``, and no ``--data-root``,
``--model-configs``, ``--batch``, ``--no-cache`` or ``MODPERF_DATA_ROOT``. The fields are
built as the typer command builds them (``--tp``, ``--native-heads`` and ``--num-heads`` as
integers; any other ``--FIELD VALUE`` a string, which a plan reads as the query does).
Anything else, and a question no plan holds, returns None: the typer command then runs it as
always (and writes the plan for next time). The output is the typer command's, byte for byte
(tests/cli/test_single.py).
"""

from __future__ import annotations

import os
import sys

from ..fast.cache_keys import DATA_ROOT_ENV, is_digits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The command's own options that take a value: option -> field (None: not a field here).
_VALUED = {"--system": "system", "--backend": "backend", "--version": "version", "--model": "model",
           "--native-heads": "native_heads", "--tp": "tp_size", "--num-heads": "num_heads"}
_INTEGERS = ("native_heads", "tp_size", "num_heads")
#: Options and flags that leave this way to the typer command.
_NOT_HERE = ("--data-root", "--model-configs", "--batch", "--help")


def parse(args: list[str]) -> dict[str, Any] | None:
    """The fields ``modperf ARGS`` asks (as the typer command builds them), or None where ARGS
    are not a plain ``query TABLE ... --json`` (module doc)."""
    if len(args) < 3 or args[0] != "query" or args[1].startswith("-") or "--json" not in args:
        return None
    own: dict[str, Any] = {}
    extra: dict[str, str] = {}
    allow_substitute = json_seen = False
    i = 2
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--":
            return None
        name, eq, value = token.partition("=")
        if name in _NOT_HERE:
            return None
        if name in ("--json", "--allow-substitute"):
            if eq or (json_seen if name == "--json" else allow_substitute):
                return None
            if name == "--json":
                json_seen = True
            else:
                allow_substitute = True
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        field = _VALUED.get(name)
        if field is not None:
            if field in own:
                return None
            if field in _INTEGERS:
                if not is_digits(value):
                    return None
                own[field] = int(value)
            else:
                own[field] = value
            continue
        key = name[2:].replace("-", "_")
        if not key or key in extra:
            return None
        extra[key] = value
    fields: dict[str, Any] = {"table": args[1]}
    for name in ("system", "backend", "version", "model", "native_heads", "tp_size", "num_heads"):
        fields[name] = own.get(name)
    if allow_substitute:
        fields["allow_substitute"] = True
    if set(extra) & {k for k, v in fields.items() if v is not None}:
        return None  # (given twice: the typer command says so)
    fields.update(extra)
    return {k: v for k, v in fields.items() if v is not None}


def run_alone(args: list[str]) -> int | None:
    """Answers ``modperf ARGS`` from a persisted plan where ARGS are a plain JSON query and a
    plan holds (its exit code, 0); None where the typer command is to run them."""
    if DATA_ROOT_ENV in os.environ:
        return None
    fields = parse(args)
    if fields is None:
        return None
    from ..fast.cache_keys import enabled

    if not enabled(None):
        return None
    from ..fast.plans import PlanStore

    store = PlanStore.open(None, [])
    answer = None if store is None else store.answer(fields, True)
    if answer is None:
        return None
    from ..base.jsonio import dumps

    sys.stdout.write(dumps(answer.to_dict(), indent=2) + "\n")  # (the typer command's emit_json)
    return 0


__all__ = ["parse", "run_alone"]
