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

#: The command's own options that take a value, as option_fields names them -> the field they set.
_VALUED = {"system": "system", "backend": "backend", "version": "version", "model": "model",
           "native_heads": "native_heads", "tp": "tp_size", "num_heads": "num_heads"}
_INTEGERS = ("native_heads", "tp_size", "num_heads")
#: The command's own flags read here.
_FLAGS = ("--json", "--allow-substitute")
#: Options that leave this way to the typer command (--help takes no value: option_fields
#: refuses it, or reads the next argument as its value; either way it is left to typer).
_NOT_HERE = frozenset({"data_root", "model_configs", "batch", "help", "json", "allow_substitute"})


def parse(args: list[str]) -> dict[str, Any] | None:
    """The fields ``modperf ARGS`` asks (as the typer command builds them), or None where ARGS
    are not a plain ``query TABLE ... --json`` (module doc)."""
    if len(args) < 3 or args[0] != "query" or args[1].startswith("-") or "--json" not in args:
        return None
    from ..base import errors as E
    from ..fast.fields import option_fields

    try:
        given, flags = option_fields(args[2:], _FLAGS)
    except E.QueryFieldError:
        return None  # (the typer command says what is wrong)
    if len(flags) != len(set(flags)) or _NOT_HERE & set(given):
        return None
    if any(value.startswith("-") for value in given.values()):
        return None  # (the typer command reads a value such as -1 its own way)
    fields: dict[str, Any] = {"table": args[1]}
    for option, field in _VALUED.items():
        value = given.pop(option, None)
        if value is None:
            continue
        if field in given:
            return None  # (given twice: the typer command says so)
        if field in _INTEGERS:
            if not is_digits(value):
                return None
            fields[field] = int(value)
        else:
            fields[field] = value
    fields = {name: fields[name] for name in ("table", *_VALUED.values()) if name in fields}
    if "--allow-substitute" in flags:
        fields["allow_substitute"] = True
    fields.update(given)
    return fields


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
