"""Runs ``modperf ARGS`` in this process with a profiler on, and prints as JSON every call
from a function of one modperf stage into a function of a later stage (an upward call), each as
``[caller stage, callee stage, callee module, callee function]`` (tests/test_architecture.py:
the way a question travels never calls back up but through functions handed down)."""

from __future__ import annotations

import json
import re
import sys

STAGES = {"base": 0, "fast": 1, "specs": 2, "data": 3, "query": 4, "audit": 5, "model": 5, "serving": 6, "cli": 7}
_PACKAGE = re.compile(r"[/\\]modperf[/\\]([a-z_]+)[/\\](.*)\.py$")


def _where(filename: str) -> tuple[str, str] | None:
    found = _PACKAGE.search(filename)
    if found is None or found.group(1) not in STAGES:
        return None
    return found.group(1), f"{found.group(1)}.{found.group(2).replace('/', '.')}"


def main(args: list[str]) -> None:
    upward: set[tuple[str, str, str, str]] = set()

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        if event != "call":
            return
        callee = _where(frame.f_code.co_filename)
        if callee is None:
            return
        back = frame.f_back
        while back is not None and _where(back.f_code.co_filename) is None:
            back = back.f_back  # (through the standard library, e.g. a sort's key function)
        caller = None if back is None else _where(back.f_code.co_filename)
        if caller is not None and STAGES[callee[0]] > STAGES[caller[0]]:
            upward.add((caller[0], callee[0], callee[1], frame.f_code.co_name))

    sys.argv = ["modperf", *args]
    from modperf.cli import main as cli_main

    sys.setprofile(profile)
    try:
        cli_main()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    sys.stderr.write(json.dumps(sorted(upward)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
