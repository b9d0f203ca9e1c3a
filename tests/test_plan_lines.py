"""modperf.fast.plan_lines: ``query --batch`` lines answered from persisted plans write the bytes a
batch without the cache writes (``--no-cache``), whatever the lines hold; a batch every line of
which a plan answers imports neither numpy nor pyarrow; refused lines (a contradiction, a key
or a point not covered, a bad field) are written with their exact text, each refused plan
resolved once."""

from __future__ import annotations

import collections
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import REPO, point_fields, run_cli
from tests.test_query_lines import AWKWARD, MSA, SLOTS, mixed_batch

import modperf
from modperf.fast import batch as batch_module
from modperf.fast.batch import read_lines, run_chunks
from modperf.fast.plan_lines import PLAN_LINES, batch_answerer
from modperf.query.engine import QueryEngine
from modperf.query.lines import LineAnswerer

#: Tables whose plans a persisted plan holds (no lane rule picks their kernel per point).
PLAN_SLOTS = [s for s in SLOTS if s[3] != "dsa_context_module"]


def plan_batch(db: modperf.Database) -> bytes:
    """Lines a persisted plan answers once an earlier batch asked the same fields: measured
    points of several tables (in their order and reversed, axis values as ints and as digit
    strings) and points between measured values; quality notes on some (the MSA table)."""
    rng = np.random.default_rng(17)
    lines: list[bytes] = []
    for slot in PLAN_SLOTS:
        keyed = db.table(*slot)
        for b in range(min(keyed.n_buckets, 3)):
            lo, hi = int(keyed.offsets[b]), int(keyed.offsets[b + 1])
            for p in rng.choice(np.arange(lo, hi), size=min(12, hi - lo), replace=False):
                fields = point_fields(keyed, b, int(p))
                lines.append(json.dumps(fields).encode())
                lines.append(json.dumps(dict(reversed(list(fields.items())))).encode())
                axis = str(rng.choice(keyed.spec.axes))
                lines.append(json.dumps({**fields, axis: str(fields[axis])}).encode())
                values = np.unique(keyed.axes[axis][lo:hi])
                at = int(np.searchsorted(values, fields[axis]))
                if at + 1 < values.size and values[at + 1] - values[at] > 1:  # between two measured values
                    lines.append(json.dumps({**fields, axis: int(values[at] + values[at + 1]) // 2}).encode())
    lines += [json.dumps({**MSA, "isl": isl}).encode() for isl in (32768, 30000, 16384, 32768)]
    return b"\n".join(lines[i] for i in rng.permutation(len(lines))) + b"\n"


def _cli(argv: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``python -X importtime -m modperf ARGV``: stdout as bytes, stderr the imports."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "modperf", *argv], input=stdin,
                          capture_output=True, env=env, timeout=300)


def _in_process(data: bytes, chunk: int, shapes: bool = True) -> tuple[bytes, collections.Counter]:
    """The batch answered in this process as the command line answers it (a short batch from
    plans first, the engine for the rest; the engine alone for a long batch or where no plan
    was ever written), and how many lines went to the engine (``lines``) and whether it was
    started (``started``)."""
    db = modperf.open()
    count: collections.Counter = collections.Counter()

    def engine_lines(persist: bool) -> LineAnswerer:
        count["started"] += 1
        answerer = LineAnswerer(db.queries, persist=persist)
        answer, answer_shaped = answerer.answer, answerer.answer_shaped

        def counted(items):
            count["lines"] += len(items)
            return answer(items)

        def counted_shaped(fields, holes, columns, n):
            found = answer_shaped(fields, holes, columns, n)
            count["lines"] += 0 if found is None else n  # (None: they come again through answer)
            return found

        answerer.answer, answerer.answer_shaped = counted, counted_shaped  # type: ignore[method-assign]
        return answerer

    answerer, source = batch_answerer(db.plans, engine_lines, read_lines(io.BytesIO(data)))
    options = {}
    if shapes:
        options = {"shapes": batch_module.LineShapes(answerer.free, learn_at=1, learn_per_chunk=1 << 20),
                   "answer_shaped": answerer.answer_shaped}
    chunks = run_chunks(source, answerer.answer, chunk=chunk, **options)
    return b"".join(line.encode() + b"\n" for c in chunks for _, line in c), count


def short_mixed_batch(db: modperf.Database) -> bytes:
    """The plan batch among part of the mixed batch (every kind of line: answered, extrapolated,
    refused, lane tables, errors, malformed) and the awkward lines: shorter than PLAN_LINES,
    so that the plans answer what they hold and the engine the rest."""
    rng = np.random.default_rng(29)
    lines = [*plan_batch(db).splitlines(), *mixed_batch(db).splitlines()[:2500], *AWKWARD]
    assert len(lines) < PLAN_LINES
    return b"\n".join(lines[i] for i in rng.permutation(len(lines))) + b"\n"


@pytest.fixture(scope="module")
def batches(db: modperf.Database, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, bytes]]:
    """The plan batch, a short mixed batch and the mixed batch (longer than PLAN_LINES), each
    with its answers without the cache (``--no-cache``)."""
    folder = tmp_path_factory.mktemp("batches")
    out = {}
    for name, data in (("mixed", mixed_batch(db)), ("short", short_mixed_batch(db)), ("plans", plan_batch(db))):
        path = folder / f"{name}.jsonl"
        path.write_bytes(data)
        reference = run_cli(["--no-cache", "query", "--batch", str(path)], timeout=300)
        assert reference.returncode == (0 if name == "plans" else 1), reference.stderr[-2000:]
        out[name] = (path, reference.stdout.encode())
    return out


def test_the_plan_batch_is_answered_and_noted(batches: dict[str, tuple[Path, bytes]]) -> None:
    out = [json.loads(line) for line in batches["plans"][1].splitlines()]
    kinds = collections.Counter(o["kind"] for o in out)
    # (a cell the grid filled inside the measured range is extrapolated: a plan answers it too)
    assert set(kinds) <= {"exact", "interpolated", "extrapolated"} and kinds["interpolated"] >= 20
    assert kinds["exact"] >= 250
    assert {o["table"] for o in out} == {s[3] for s in PLAN_SLOTS} | {"msa_context_module"}
    assert sum(o["quality"] is not None for o in out) >= 3


def test_a_batch_from_plans_writes_the_no_cache_bytes(batches: dict[str, tuple[Path, bytes]], cache_dir: Path) -> None:
    for name in ("plans", "short", "mixed"):  # (the plans' first: none of their plans written yet)
        path, reference = batches[name]
        for run in range(2):  # the first fills the cache (the engine writes each plan), the second reads it
            from_file = _cli(["query", "--batch", str(path)])
            from_stdin = _cli(["query", "--batch", "-"], stdin=path.read_bytes())
            assert from_file.returncode == from_stdin.returncode == (0 if name == "plans" else 1), run
            assert from_file.stdout == from_stdin.stdout == reference, (name, run)
            imports = from_file.stderr.decode()
            if name == "plans":  # every line from a plan the first run wrote: neither numpy nor pyarrow
                assert ("numpy" in imports and "pyarrow" in imports) == (run == 0)
                assert "numpy" not in from_stdin.stderr.decode() or run == 0
            else:  # (some lines need the engine: the check above can fail)
                assert "numpy" in imports
    # in this process, in chunks of several sizes, lines of known shapes or not
    path, reference = batches["plans"]
    for chunk in (1, 7, 4096):
        for shapes in (True, False):
            out, count = _in_process(path.read_bytes(), chunk, shapes)
            assert out == reference and count["started"] == 0, (chunk, shapes)
    path, reference = batches["short"]
    for chunk in (7, 4096):
        out, count = _in_process(path.read_bytes(), chunk)
        assert out == reference and count["started"] == 1
        # (the plans answered what they hold until the engine was needed, then the engine the rest)
        assert count["lines"] < len(reference.splitlines())
    path, reference = batches["mixed"]
    out, count = _in_process(path.read_bytes(), 4096)  # (a long batch: the engine's alone)
    assert out == reference and count["started"] == 1


def test_a_long_batch_goes_to_the_engine(batches: dict[str, tuple[Path, bytes]], cache_dir: Path) -> None:
    """A batch of PLAN_LINES lines or more is the engine's from its first line (past its start,
    its vectorised lookup is the faster one); one line fewer, the plans'."""
    path, reference = batches["plans"]
    assert _cli(["query", "--batch", str(path)]).stdout == reference  # (writes the plans)
    lines, answers = path.read_bytes().splitlines(), reference.splitlines()
    repeat = -(-PLAN_LINES // len(lines))
    for n, engine in ((PLAN_LINES, True), (PLAN_LINES - 1, False), (len(lines) * repeat + 5, True)):
        data = b"".join(line + b"\n" for line in (lines * (repeat + 1))[:n])
        expected = b"".join(a + b"\n" for a in (answers * (repeat + 1))[:n])
        for chunk in (64, 4096):
            out, count = _in_process(data, chunk)
            assert out == expected and count["started"] == engine and count["lines"] == (n if engine else 0), n


def test_lines_no_plan_answers_start_the_engine_mid_batch(batches: dict[str, tuple[Path, bytes]],
                                                          cache_dir: Path) -> None:
    """A batch of plan-answered lines with lines only the engine answers among them (a point
    beyond the measured range, a refused one, a key no earlier question asked): the engine
    starts at the first such line and answers from there on, in order."""
    path, reference = batches["plans"]
    assert _cli(["query", "--batch", str(path)]).stdout == reference  # (writes the plans)
    lines = path.read_bytes().splitlines()
    fields = json.loads(lines[0])
    others = [json.dumps({**fields, "batch_size": 1 << 19}).encode(),  # past the measured range
              json.dumps({**fields, "version": fields["version"], "allow_substitute": False}).encode(),  # no plan
              b"not json", b""]
    mixed = b"\n".join([*lines[:300], *others, *lines[300:]]) + b"\n"
    expected = run_cli(["--no-cache", "query", "--batch", "-"], stdin=mixed, timeout=300)
    for chunk in (1, 64, 4096):
        out, count = _in_process(mixed, chunk)
        assert out == expected.stdout.encode() and count["started"] == 1, chunk
        # (the 300 lines before the first the engine answers came from plans)
        assert 2 <= count["lines"] <= len(lines) - 300 + 2, chunk


QWEN = {"table": "context_attention", "system": "h200_sxm", "backend": "sglang", "version": "0.5.14",
        "model": "Qwen/Qwen3-32B", "tp_size": 4}
MLA = {"table": "mla_context_module", "system": "h200_sxm", "backend": "trtllm", "version": "1.3.0rc20",
       "native_heads": 128, "num_heads": 16, "kernel_source": "default", "mla_dtype": "bfloat16",
       "kv_cache_dtype": "bfloat16", "gemm_type": "bfloat16"}
_KEYS = ("mla_context_module keys: op_name, kernel_source, mla_dtype, kv_cache_dtype, gemm_type, batch_size, isl, "
         "step; heads: model or native_heads, and tp_size or num_heads")
#: One refused line of each kind, and its answer line exactly.
REFUSED = [
    ({**QWEN, "head_dim": 64},
     '{"error": {"type": "ContradictionError", "kind": "contradiction", "message": "head_dim=64 contradicts '
     "Qwen/Qwen3-32B at tp_size 4: its full layers use head_dim 128 [field='head_dim', given=64, derived=128, "
     "model='Qwen/Qwen3-32B', tp_size=4]. Fix: leave head_dim out (the model fixes it), or ask with native_heads / "
     'num_heads instead of the model to query another shape", "file": null, "rows": [], "row_count": 0, "values": '
     '{"field": "head_dim", "given": 64, "derived": 128, "model": "Qwen/Qwen3-32B", "tp_size": 4}, "fix": "leave '
     'head_dim out (the model fixes it), or ask with native_heads / num_heads instead of the model to query another '
     'shape"}}'),
    ({**MLA, "kv_cache_dtype": "int4"},
     '{"error": {"type": "NotCoveredError", "kind": "not_covered", "message": "mla_context_module (h200_sx'
     "m/mla/trtllm/1.3.0rc20/mla_context_module) holds no bucket with {'kernel_source': 'default', 'mla_dt"
     "ype': 'bfloat16', 'kv_cache_dtype': 'int4', 'gemm_type': 'bfloat16'} [nearest_covered_keys=[{'op_nam"
     "e': 'mla_context_module', 'kernel_source': 'default', 'mla_dtype': 'bfloat16', 'kv_cache_dtype': 'bf"
     "loat16', 'gemm_type': 'bfloat16', 'native': 128}, {'op_name': 'mla_context_module', 'kernel_source':"
     " 'default', 'mla_dtype': 'bfloat16', 'kv_cache_dtype': 'fp8', 'gemm_type': 'bfloat16', 'native': 128"
     "}, {'op_name': 'mla_context_module', 'kernel_source': 'default', 'mla_dtype': 'bfloat16', 'kv_cache_"
     "dtype': 'bfloat16', 'gemm_type': 'fp8_block', 'native': 128}]]. Fix: the table measured this key wit"
     'h kv_cache_dtype=bfloat16 or kv_cache_dtype=fp8 or kv_cache_dtype=bfloat16, gemm_type=fp8_block (a d'
     "type is the deployment's choice): give it (--kv-cache-dtype bfloat16); or use the values of a covere"
     'd key (nearest listed)", "file": null, "rows": [], "row_count": 0, "values": {"nearest_covered_keys"'
     ': [{"op_name": "mla_context_module", "kernel_source": "default", "mla_dtype": "bfloat16", "kv_cache_'
     'dtype": "bfloat16", "gemm_type": "bfloat16", "native": 128}, {"op_name": "mla_context_module", "kern'
     'el_source": "default", "mla_dtype": "bfloat16", "kv_cache_dtype": "fp8", "gemm_type": "bfloat16", "n'
     'ative": 128}, {"op_name": "mla_context_module", "kernel_source": "default", "mla_dtype": "bfloat16",'
     ' "kv_cache_dtype": "bfloat16", "gemm_type": "fp8_block", "native": 128}]}, "fix": "the table measure'
     'd this key with kv_cache_dtype=bfloat16 or kv_cache_dtype=fp8 or kv_cache_dtype=bfloat16, gemm_type='
     "fp8_block (a dtype is the deployment's choice): give it (--kv-cache-dtype bfloat16); or use the valu"
     'es of a covered key (nearest listed)"}}'),
    ({**MLA, "colour": "red"},
     '{"error": {"type": "QueryFieldError", "kind": "query_field", "message": "unknown field(s) \'colour\' for table '
     f"mla_context_module [unknown=['colour']]. Fix: {_KEYS}\", \"file\": null, \"rows\": [], \"row_count\": 0, "
     f'"values": {{"unknown": ["colour"]}}, "fix": "{_KEYS}"}}}}'),
    ({**MLA, "num_heads": "sixteen"},
     '{"error": {"type": "QueryFieldError", "kind": "query_field", "message": "num_heads must be an integer in '
     "1..65,536 (attention heads) [field='num_heads', value='sixteen', range=[1, 65536]]. Fix: "
     f'{_KEYS}", "file": null, "rows": [], "row_count": 0, "values": {{"field": "num_heads", "value": "sixteen", '
     f'"range": [1, 65536]}}, "fix": "{_KEYS}"}}}}'),
]


def test_refused_lines_are_written_exactly_each_refused_plan_resolved_once(cache_dir: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines of refused plans (a contradiction, a key not covered, an unknown field, a value that
    is not a number), 500 points each, in chunks and in shapes: every line its exact text, and
    each plan resolved once for the whole batch (then a refused line costs microseconds)."""
    rng = np.random.default_rng(23)
    lines = [json.dumps({**fields, "batch_size": int(b), "isl": int(s)}).encode()
             for fields, _ in REFUSED for b, s in zip(rng.integers(1, 257, 500), rng.integers(1, 8193, 500))]
    data = b"\n".join(lines[i] for i in rng.permutation(len(lines))) + b"\n"
    engine_plans = QueryEngine.resolve
    resolved: collections.Counter = collections.Counter()

    def counted(self, fields, *args, **kwargs):
        resolved[tuple(sorted((k, str(v)) for k, v in fields.items() if k not in ("batch_size", "isl")))] += 1
        return engine_plans(self, fields, *args, **kwargs)

    monkeypatch.setattr(QueryEngine, "resolve", counted)
    for chunk in (7, 4096):
        resolved.clear()
        out, _ = _in_process(data, chunk)
        answers = out.decode().splitlines()
        assert len(answers) == len(lines)
        for fields, text in REFUSED:
            answered = {a for line, a in zip(data.splitlines(), answers) if json.loads(line).items() >= fields.items()}
            assert answered == {text}
        assert len(resolved) == len(REFUSED) and set(resolved.values()) == {1}, resolved
    expected = "".join(text + "\n" for fields, text in REFUSED)
    one_each = "".join(json.dumps({**fields, "batch_size": 4, "isl": 1024}) + "\n" for fields, _ in REFUSED)
    assert run_cli(["--no-cache", "query", "--batch", "-"], stdin=one_each.encode()).stdout == expected
    assert run_cli(["query", "--batch", "-"], stdin=data).stdout.splitlines() == out.decode().splitlines()


def test_a_point_outside_the_grid_and_a_bad_axis_value_are_refused_exactly(cache_dir: Path) -> None:
    lines = [{**MLA, "batch_size": 100000, "isl": 1000000}, {**MLA, "batch_size": 4, "isl": "many"}]
    texts = [
        '{"error": {"type": "OutOfCoverageError", "kind": "out_of_coverage", "message": "mla_context_module: point '
        "{'num_heads': 16, 'batch_size': 100000, 'isl': 1000000, 'step': 0} lies in a region of the ragged grid no "
        "measurement reaches within the limit (1 octave(s) of value+1 past the measured points) [native=128, "
        "measured_range={'num_heads': [1, 128], 'batch_size': [1, 256], 'isl': [1, 32768], 'step': [0, 0]}, "
        "nearest_measured=[{'num_heads': 16, 'batch_size': 4, 'isl': 32768, 'step': 0}, {'num_heads': 16, "
        "'batch_size': 8, 'isl': 16384, 'step': 0}, {'num_heads': 16, 'batch_size': 16, 'isl': 8192, 'step': 0}]]. "
        'Fix: query inside the measured range (nearest measured points above), or collect the missing shapes", '
        '"file": null, "rows": [], "row_count": 0, "values": {"native": 128, "measured_range": {"num_heads": [1, 128], '
        '"batch_size": [1, 256], "isl": [1, 32768], "step": [0, 0]}, "nearest_measured": [{"num_heads": 16, '
        '"batch_size": 4, "isl": 32768, "step": 0}, {"num_heads": 16, "batch_size": 8, "isl": 16384, "step": 0}, '
        '{"num_heads": 16, "batch_size": 16, "isl": 8192, "step": 0}]}, "fix": "query inside the measured range '
        '(nearest measured points above), or collect the missing shapes"}}',
        '{"error": {"type": "QueryFieldError", "kind": "query_field", "message": "isl must be an integer in '
        "1..4,194,304 (tokens) [field='isl', value='many', range=[1, 4194304]]. Fix: "
        f'{_KEYS}", "file": null, "rows": [], "row_count": 0, "values": {{"field": "isl", "value": "many", '
        f'"range": [1, 4194304]}}, "fix": "{_KEYS}"}}}}']
    data = "".join(json.dumps(f) + "\n" for f in lines).encode()
    for argv in (["--no-cache", "query", "--batch", "-"], ["query", "--batch", "-"], ["query", "--batch", "-"]):
        found = run_cli(argv, stdin=data)
        assert found.returncode == 1 and found.stdout.splitlines() == texts, argv
