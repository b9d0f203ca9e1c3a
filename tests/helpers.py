"""Helpers the tests share (import them from here, never from conftest).

Real-data tests read the embedded corpus (the installed aiconfigurator-core wheel) and the
historical fixtures in ``../shared/fixtures`` beside the checkout. A fresh clone has no
``../shared``: those tests skip with the reason, unless MODPERF_REQUIRE_SHARED=1 (set by
``.ci/run``) turns the absence into a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from modperf.base.jsonio import dumps, dumps_small
from modperf.fast.batch import LineTooLong, error_line, parse_line

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
REQUIRE_SHARED = os.environ.get("MODPERF_REQUIRE_SHARED") == "1"

# migration fixtures (test_migrate, cli/test_migrate_cmd)
STALE_DIR = "01_dsv4_stale_vs_migrated/stale_parent_eed87c1c9"
TWIN_DIR = "01_dsv4_stale_vs_migrated/migrated_93dfd1fd2"
LEGACY_DIR = "03_legacy_no_num_heads/aiconfigurator-0.1.0_h200_sxm_trtllm_0.20.0"
CSA_CTX = "b200_sxm/sparse_attention/sglang/0.5.10/dsv4_csa_context_module_perf.parquet"


def shared_fixtures() -> Path:
    """The fixtures folder, or skip (fail under MODPERF_REQUIRE_SHARED=1) when it is absent."""
    if not (FIXTURES / "README.md").is_file():
        message = f"../shared/fixtures not found at {FIXTURES} (only CI and dev machines have it beside the checkout)"
        if REQUIRE_SHARED:
            pytest.fail(message + "; MODPERF_REQUIRE_SHARED=1 makes this a failure")
        pytest.skip(message)
    return FIXTURES


def writable_copy(src: Path, dst: Path) -> Path:
    """The fixtures are read-only; copies must be writable for migrate to replace files."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the collector-side writer, replayed (test_writer, test_crash) ---------------------------


def split_columns(table, leave_out: tuple[str, ...]) -> tuple[dict, list[str]]:
    """Columns with one value are fixed at open; the rest are given per measurement."""
    import pyarrow.compute as pc

    fixed, per_row = {}, []
    for name in table.column_names:
        if name in leave_out:
            continue
        values = pc.unique(table.column(name)).to_pylist()
        if len(values) == 1:
            fixed[name] = values[0]
        else:
            per_row.append(name)
    return fixed, per_row


def replay(rows, root: Path, table: str, *, leave_out: tuple[str, ...], system: str, backend: str, **kwargs):
    """Write ``rows`` through a writer the way a collector would, one add() per row."""
    from modperf.audit.writer import open_writer

    fixed, per_row = split_columns(rows, ("latency", *leave_out))
    version = fixed.pop("version")
    fixed.pop("model", None)
    with open_writer(table, root=root, system=system, backend=backend, version=version, **kwargs, **fixed) as writer:
        columns = {n: rows.column(n).to_pylist() for n in (*per_row, "latency")}
        for i in range(rows.num_rows):
            writer.add(columns["latency"][i], **{n: columns[n][i] for n in per_row})
    return writer


# --- the CLI as a user runs it --------------------------------------------------------------


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """``modperf ARGV`` in this process through the real entry point (parser errors included):
    (exit code, stdout, stderr)."""
    from modperf.cli import main

    capsys.readouterr()
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def unprivileged(cmd: list[str]) -> list[str]:
    """``cmd`` so that file permission bits apply to it: as root, without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH (setpriv); otherwise as it is. Skips when root cannot drop them."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to apply")
    drop = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", "--", *cmd]


def run_cli(argv: list[str], *, drop_privileges: bool = False, stdin: bytes | None = None,
            timeout: float = 60, preexec_fn=None, columns: int | None = None) -> subprocess.CompletedProcess:
    """``python -m modperf ARGV`` in a child process (text output), its output a pipe (not a
    terminal); ``columns`` sets COLUMNS, the width a user's terminal would give (None: unset,
    the width of output that reaches no terminal)."""
    cmd = [sys.executable, "-m", "modperf", *argv]
    if drop_privileges:
        cmd = unprivileged(cmd)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=env, preexec_fn=preexec_fn)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                                       proc.stderr.decode("utf-8", "replace"))


def strict_json(text: str):
    """``json.loads`` that refuses NaN and Infinity (RFC 8259, JavaScript's JSON.parse)."""
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def world_readable_tmp(tmp_path: Path) -> Path:
    """A folder under tmp_path that a process without CAP_DAC_* can enter (pytest's base is 0700)."""
    for p in (tmp_path, *tmp_path.parents):
        if p == Path(tempfile.gettempdir()):
            break
        p.chmod(p.stat().st_mode | 0o755)
    return tmp_path


# --- kill -9 (test_crash, bench/crash.py) -------------------------------------------------------


def crash_server() -> None:
    """A fork server: reads one JSON request per line, forks a child that runs it, answers
    ``{"pid": ...}`` at once and ``{"pid", "code", "killed", "seconds"}`` when the child ends.
    modperf is imported once, before any fork, by a process that has read no table (so no
    worker thread holds a lock a child would inherit); each child starts its work at once."""
    import signal
    import time

    import modperf.cli  # noqa: F401  (imported before forking)

    for line in sys.stdin:
        request = json.loads(line)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: run, never return into the loop
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            code = 1
            try:
                code = _crash_op(request)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                code = 70
            os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        print(json.dumps({"pid": pid, "code": code, "killed": killed, "seconds": time.perf_counter() - start}),
              flush=True)


def _crash_op(request: dict) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from modperf.cli import main

    op, args = request["op"], request["args"]
    if op == "cli":
        main(args["argv"])
        return 0
    if op == "writer":
        rows = pq.read_table(args["rows"])
        scaled = pa.array(rows.column("latency").to_numpy() * args["scale"])
        rows = rows.set_column(rows.column_names.index("latency"), "latency", scaled)
        replay(rows, Path(args["root"]), args["table"], leave_out=("num_heads",), system=args["system"],
               backend=args["backend"], model=args["model"], overwrite=True)
        return 0
    raise ValueError(op)


class CrashServer:
    """The test side of :func:`crash_server`: run a request, optionally SIGKILL the child after
    ``kill_after`` seconds; returns the child's end record."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src"),
                                                            os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.helpers import crash_server; crash_server()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)

    def run(self, op: str, args: dict, kill_after: float | None = None) -> dict:
        import signal
        import time

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        if kill_after is not None:
            time.sleep(kill_after)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` except modperf's temporary files, by relative path."""
    from modperf.base.atomic import TMP_SUFFIX

    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(TMP_SUFFIX)}


def temps_under(folder: Path) -> list[Path]:
    from modperf.base.atomic import TMP_SUFFIX

    return sorted(p for p in folder.rglob(f"*{TMP_SUFFIX}"))


def restore(folder: Path, content: dict[str, bytes]) -> None:
    """Put ``folder`` back to ``content`` (files only; temporary files of earlier trials stay,
    as a crash would leave them)."""
    for rel, data in content.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_bytes() != data:
            path.unlink(missing_ok=True)
            path.write_bytes(data)


def kill_campaign(server: CrashServer, op: str, args: dict, folder: Path, old: dict[str, bytes],
                  new: dict[str, bytes], trials: int, seed: int,
                  same: Callable[[str, bytes, bytes], bool] | None = None) -> dict[str, int]:
    """``trials`` runs of one write, each SIGKILLed at a point of the run (stratified: half over
    0..1.2x its duration, half over its last half, where it writes; one after it ends), from the
    ``old`` content of ``folder`` (the run's duration is measured first, from the same state).
    After each kill every file must hold its old or its new bytes (``same`` may relax that for
    a file, e.g. a sidecar that records the date); then the write runs again, unkilled, and
    ``folder`` must hold exactly the new content and no temporary file. Returns counts."""
    import random

    rng = random.Random(seed)
    durations = []
    for _ in range(2):  # the run's duration from old to new, warm (the faster of two)
        restore(folder, old)
        end = server.run(op, args)
        assert end["code"] == 0, end
        durations.append(end["seconds"])
    duration = min(durations)
    spread = trials // 2  # over the whole run
    late = trials - spread - 1  # over its end, where the writes, verifications and renames are
    points = [(i + rng.random()) / spread * 1.2 * duration for i in range(spread)]
    points += [(0.55 + 0.5 * (i + rng.random()) / late) * duration for i in range(late)] + [3 * duration]
    stats = {"trials": 0, "killed": 0, "files_old": 0, "files_new": 0, "debris_before_next_run": 0,
             "debris_after_next_run": 0}
    equal = same or (lambda rel, a, b: a == b)
    for at in points:
        restore(folder, old)
        end = server.run(op, args, kill_after=at)
        stats["trials"] += 1
        stats["killed"] += bool(end["killed"])
        now = files_of(folder)
        assert set(now) == set(new), f"files after a kill at {at:.3f}s: {sorted(set(now) ^ set(new))}"
        for rel, data in now.items():
            if equal(rel, data, new[rel]):
                stats["files_new"] += 1
            else:
                assert equal(rel, data, old[rel]), f"{rel} is neither the old nor the new file (kill at {at:.3f}s)"
                stats["files_old"] += 1
        stats["debris_before_next_run"] += len(temps_under(folder))
        again = server.run(op, args)
        assert again["code"] == 0, again
        assert all(equal(rel, data, new[rel]) for rel, data in files_of(folder).items()), "the re-run did not finish"
        left = temps_under(folder)
        stats["debris_after_next_run"] += len(left)
        assert not left, f"debris after the next run: {left}"
    return stats


# --- real tables, read or rewritten ----------------------------------------------------------


def variant(db: Any, tmp_path: Path, slot: tuple[str, str, str, str], mutate: Callable[[pa.Table], pa.Table]) -> Any:
    """A mutated copy of a real table, written in the standard layout under tmp_path."""
    from modperf.data.catalog import refs_for_paths

    ref = db.ref(*slot)
    table = mutate(pq.read_table(ref.path))
    out = tmp_path / ref.system / ref.family_dir / ref.backend / ref.version / ref.path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return refs_for_paths([out])[0]


def set_col(table: pa.Table, name: str, values: Any) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(values) if not isinstance(values, pa.Array) else values)


def patched(table: pa.Table, name: str, rows: dict[int, object]) -> pa.Table:
    values = table.column(name).to_pylist()
    for r, v in rows.items():
        values[r] = v
    return set_col(table, name, pa.array(values, type=table.schema.field(name).type))


def stored_rows(path: Path, where: Mapping[str, Any]) -> pa.Table:
    """The rows of a table file whose columns equal ``where``, read with pyarrow alone."""
    table = pq.read_table(path)
    mask = None
    for col, value in where.items():
        m = pc.equal(table.column(col), value)
        mask = m if mask is None else pc.and_(mask, m)
    return table.filter(mask) if mask is not None else table


def stored_latency(path: Path, where: Mapping[str, Any], column: str = "latency") -> float:
    """The latency the file stores at ``where``: the lower median where rows repeat the key
    (the loader's duplicate rule), the value itself where they do not."""
    values = sorted(stored_rows(path, where).column(column).to_pylist())
    assert values, f"no stored row at {dict(where)}"
    return values[(len(values) - 1) // 2]


def column(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_pylist())


# --- query lines from measured points -----------------------------------------------------------


def point_fields(keyed: Any, bucket: int, point: int) -> dict[str, Any]:
    """The query fields that ask a keyed table for one of its measured points (slot, key
    columns, head identity by the family's tier, the point's axis values)."""
    from modperf.data.buckets import NATIVE
    from modperf.data.families.base import HEADS, TP, Tier

    ref = keyed.ref
    fields: dict[str, Any] = {"table": ref.table, "system": ref.system, "backend": ref.backend,
                              "version": ref.version}
    key = dict(zip(keyed.key_names, keyed.bucket_keys[bucket]))
    fields.update({k: v for k, v in key.items() if k not in (NATIVE, "local_num_heads", HEADS, TP)})
    fields.update({a: int(keyed.axes[a][point]) for a in keyed.spec.axes})
    local = int(keyed.bucket_local[bucket])
    if keyed.family.tier is Tier.NATIVE:
        fields.update(native_heads=int(key[HEADS]), tp_size=int(key[TP]))
    elif keyed.family.tier is Tier.NATIVE_LOCAL:
        fields.update(native_heads=int(key[NATIVE]), num_heads=local)
    elif keyed.spec.head_axis:
        fields["num_heads"] = local
    return fields


def run_lines(lines: Iterable[bytes | str | LineTooLong], answer: Callable[[dict[str, Any]], Any],
              defaults: Mapping[str, Any] | None = None) -> Iterator[tuple[bool, str]]:
    """The reference the chunked batch is held to (one line at a time, read by parse_line):
    for each non-blank line: ``(True, json of answer(fields).to_dict())`` or ``(False, json
    of {"error": ...})``. ``defaults`` are fields every line starts from (a line's own fields
    win). Lines may be bytes (decoded as UTF-8 here) or str."""
    base = dict(defaults or {})
    for number, line in enumerate(lines, 1):
        try:
            obj = parse_line(number, line)
            if obj is None:
                continue
            result = answer({**base, **obj})
            yield True, dumps_small(result.to_dict())
        except Exception as exc:  # a bad line never stops the batch
            yield False, dumps(error_line(exc))
