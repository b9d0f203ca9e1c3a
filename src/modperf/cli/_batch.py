"""``modperf query --batch``: the batch loop, and the command line that asks for nothing else,
run without the command-line parser.

``modperf query --batch FILE`` (``--batch=FILE``, optionally after ``--no-cache``, with no
other argument and no ``MODPERF_DATA_ROOT``) starts the batch before typer, rich and pydantic
are imported: about a tenth of a second of a batch's start, a fifth of a 50,000-line batch.
Anything else, and a batch whose input or database cannot be opened (nothing written yet), goes
through the typer command as before, which says what is wrong the usual way; an error once
answers are being written is reported as the command reports it.
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # (a batch answered from persisted plans imports neither: on use)
    from collections.abc import Iterator
    from typing import IO, Any

#: Answer lines written at once (about 70 KB: below the size the C library maps afresh).
WRITE_LINES = 64


def open_batch(path: str) -> IO[bytes]:
    """The batch input as bytes: each line is decoded on its own, so one line that is not
    UTF-8 gets its own error line instead of ending the batch."""
    from ..base import errors as E

    if path == "-":
        return sys.stdin.buffer
    try:
        stream = open(path, "rb")  # noqa: SIM115  (returned open; the caller closes it)
    except OSError as exc:
        raise E.QueryFieldError(f"cannot read batch file: {exc.strerror}", file=path,
                                fix="pass a file of JSON lines, or - for stdin") from exc
    mode = os.fstat(stream.fileno()).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # a device such as /dev/zero has no lines
        stream.close()
        raise E.QueryFieldError("the batch input is not a file or a pipe", file=path,
                                fix="pass a file of JSON lines, or - for stdin")
    return stream


def answer_batch(db: Any, batch: str, stream: IO[bytes], fields: dict[str, Any]) -> int:
    """Answers every line of ``stream`` (the input ``batch`` names) to stdout, ``fields`` the
    fields every line starts from; the number of lines that failed. Closes the stream (but
    stdin). An input failing mid-way is a QueryFieldError, raised after every answer before it."""
    from ..fast.batch import LineShapes, read_lines, run_chunks
    from ..fast.plan_lines import batch_answerer

    def engine_lines(persist: bool) -> Any:
        from ..query.lines import LineAnswerer

        return LineAnswerer(db.queries, persist=persist)

    def chunks() -> Iterator[list[tuple[bool, str]]]:
        # a chunk of lines at a time, answered plan by plan: a short batch from the persisted
        # plans where they hold (modperf.fast.plan_lines: no numpy), else by the engine
        # (modperf.query.lines)
        answerer, source = batch_answerer(db.plans, engine_lines, read_lines(stream))
        # lines of a shape seen before (the same bytes but for their axis integers) are read
        # by one pattern match each instead of the JSON reader (batch.LineShapes)
        shapes = LineShapes(answerer.free, fields)
        yield from run_chunks(source, answerer.answer, fields, shapes=shapes, answer_shaped=answerer.answer_shaped)

    return write_answers(batch, stream, chunks())


def write_answers(batch: str, stream: IO[bytes], chunks: Iterator[list[tuple[bool, str]]]) -> int:
    """Writes the answer lines of ``chunks`` (``fast.batch.run_chunks`` over ``stream``, the
    input ``batch`` names) to stdout as they come; the number that failed. Closes the stream
    (but stdin); an input failing mid-way is a QueryFieldError, raised after every answer
    before it; an input without a line says so on stderr (:func:`nothing_read`)."""
    failed = answered = 0
    try:
        for chunk in chunks:
            if not chunk:
                continue
            oks, lines = zip(*chunk)
            failed += len(oks) - sum(oks)
            answered += len(oks)
            write = sys.stdout.write
            # written WRITE_LINES lines at a time: a chunk's text joined whole (4 MB and
            # more) is a fresh allocation the C library maps and hands back per chunk,
            # every page of it faulted in again (about half the system time of a batch)
            for at in range(0, len(lines), WRITE_LINES):
                write("\n".join((*lines[at:at + WRITE_LINES], "")))
            sys.stdout.flush()
    except OSError as exc:  # the input failed mid-way (a folder, an I/O error): typed, after every answer
        from ..base import errors as E

        raise E.QueryFieldError(f"cannot read the batch input: {exc.strerror or exc}", file=batch,
                                fix="pass a readable file of JSON lines, or - for stdin") from exc
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    if not answered:
        nothing_read(batch)
    return failed


def nothing_read(batch: str) -> None:
    """An input without a line to answer (an empty file, blank lines only): said on stderr,
    where a script's stdout stays the (empty) answers; the exit code stays 0."""
    from ..base import errors as E

    where = "stdin" if batch == "-" else batch
    sys.stderr.write(f"0 lines read from {E.clean(where)}: nothing to answer\n")


def batch_path(args: list[str]) -> tuple[str, bool] | None:
    """``(FILE, --no-cache given)`` where ``args`` are ``[--no-cache] query --batch FILE`` (or
    ``--batch=FILE``) and nothing else; None otherwise."""
    no_cache = bool(args) and args[0] == "--no-cache"
    rest = args[1:] if no_cache else args
    if len(rest) == 3 and rest[:2] == ["query", "--batch"]:
        path = rest[2]
    elif len(rest) == 2 and rest[0] == "query" and rest[1].startswith("--batch="):
        path = rest[1][len("--batch="):]
    else:
        return None
    if not path or (path.startswith("-") and path != "-"):  # (what the parser reads its own way)
        return None
    return path, no_cache


def run_alone(args: list[str]) -> int | None:
    """Runs ``modperf ARGS`` where they are a batch and nothing else (:func:`batch_path`),
    without the command-line parser: its exit code; None where the typer command is to run
    them (other arguments, ``MODPERF_DATA_ROOT`` set, an input or a database that cannot be
    opened: nothing has been written then)."""
    found = batch_path(args)
    if found is None or "MODPERF_DATA_ROOT" in os.environ:
        return None
    path, no_cache = found
    if no_cache:  # (what the application's --no-cache does)
        from ..fast.cache_keys import NO_CACHE_ENV

        os.environ[NO_CACHE_ENV] = "1"
    from ..query.db import Database

    try:
        db = Database(None, [])
        stream = open_batch(path)
    except Exception:
        return None  # the typer command opens them again and says what is wrong
    try:
        failed = answer_batch(db, path, stream, {})
    except KeyboardInterrupt:  # as typer reports it: exit 130, nothing printed
        return 130
    except Exception as exc:
        from ..base import errors as E
        from ._common import fit_width, report_error

        fit_width()
        if not isinstance(exc, E.ModperfError) and os.environ.get("MODPERF_DEBUG"):
            raise
        return report_error(exc, json_out=False)
    return 1 if failed else 0
