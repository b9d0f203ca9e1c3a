"""modperf.fast.batch: input read as bytes, one answer or one error line per input line, whatever a
line holds (invalid UTF-8, 100,000 nested arrays, NaN, a key named ``self``, 17 MB), and a
table the loader rejects is read once per database, not once per line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers import run_lines, run_main, strict_json

import modperf
from modperf import errors as E
from modperf.data import loader
from modperf.fast.batch import LineTooLong, parse_line, read_lines

MLA = "07_latent_collision/wheel/gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet"
LINE = {"table": "mla_context_module", "system": "gb300", "backend": "vllm", "version": "0.27.0",
        "kernel_source": "FLASH_ATTN", "mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "gemm_type": "bfloat16",
        "batch_size": 4, "isl": 2048, "model": "moonshotai/Kimi-K3", "tp_size": 3}


def answers(db: modperf.Database, data: bytes) -> list[dict]:
    return [strict_json(out) for _, out in run_lines(read_lines(io.BytesIO(data)), db.queries.query)]


def test_every_line_is_answered_in_order(db: modperf.Database) -> None:
    good = json.dumps(LINE).encode()
    lines = [good, b'{"table": "\xff\xfe"}', json.dumps({**LINE, "self": 1}).encode(), b"[" * 100_000 + b"]" * 100_000,
             json.dumps({**LINE, "allow_substitute": "false"}).encode(), json.dumps({**LINE, "batch_size": "\u00b2"}).encode(),
             json.dumps({**LINE, "batch_size": 0}).encode(), json.dumps({**LINE, "isl": 0}).encode(),
             b'{"batch_size": NaN}', b'{"isl": 1, "isl": 2}', b'{"n": 1' + b"0" * 5000 + b"}",
             json.dumps({**LINE, "isl": [1, [2]]}).encode(), b"\x00\x01", b"", b"   ", good]
    out = answers(db, b"\n".join(lines) + b"\n")
    assert len(out) == 14  # 16 lines, two blank
    assert out[0]["latency_ms"] == out[-1]["latency_ms"] == 0.7945  # the exact measured value, before and after
    kinds = [o["error"]["kind"] for o in out[1:-1]]
    assert kinds == ["query_field"] * 12
    messages = [o["error"]["message"] for o in out[1:-1]]
    assert messages[0].startswith("line 2 is not UTF-8 (byte 0xff at offset 11)")
    assert messages[1].startswith("unknown field(s) 'self' for table mla_context_module")
    assert messages[2].startswith("line 4 nests arrays or objects too deep to be a query")
    assert messages[3].startswith("allow_substitute must be true or false (a JSON boolean, not a string or number)")
    assert messages[4].startswith("batch_size must be an integer in 1..1,048,576 (sequences in a batch)")
    assert messages[5].startswith("batch_size must be an integer in 1..1,048,576")
    assert messages[6].startswith("isl must be an integer in 1..4,194,304 (tokens)")
    assert messages[7].startswith("line 9 is not strict JSON: NaN is not a JSON number")
    assert messages[8].startswith("line 10 is not strict JSON: field 'isl' appears twice")
    assert messages[9].startswith("line 11 is not strict JSON: Exceeds the limit (4300 digits)")
    # (the error a fresh resolution gives, though the first line's plan is cached: modperf.query.engine)
    assert messages[10].startswith("field 'isl' must be a string, a number or a boolean, not a list")
    assert messages[11].startswith("line 13 is not JSON")


def test_a_huge_native_at_tp_7_answers_at_once_and_the_next_line_too(db: modperf.Database) -> None:
    hang = json.dumps({**LINE, "model": None, "native_heads": 10**12, "tp_size": 7}).encode()
    out = answers(db, hang + b"\n" + json.dumps(LINE).encode() + b"\n")
    assert out[0]["error"]["message"].startswith("native_heads must be an integer in 1..65,536 (attention heads)")
    assert out[1]["latency_ms"] == 0.7945


def test_a_1mb_model_name_gives_a_small_error_line(db: modperf.Database) -> None:
    out = list(run_lines([json.dumps({**LINE, "model": "x" * 1_000_000}).encode()], db.queries.query))
    assert len(out[0][1]) < 6_000
    assert "(1,000,000 characters)" in strict_json(out[0][1])["error"]["message"]


def test_long_lines_are_skipped_in_chunks() -> None:
    data = b'{"x": "' + b"y" * 5000 + b'"}\n{"a": 1}\n' + b"z" * 3000
    lines = list(read_lines(io.BytesIO(data), limit=1000))
    assert isinstance(lines[0], LineTooLong) and lines[0].size == 5000 + 10
    assert lines[1] == b'{"a": 1}\n'
    assert isinstance(lines[2], LineTooLong) and lines[2].size == 3000
    with pytest.raises(E.QueryFieldError, match="line 1 is 5,010 bytes, longer than a query line may be"):
        parse_line(1, lines[0])


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(lines=st.lists(st.one_of(st.binary(max_size=60), st.just(json.dumps(LINE).encode()),
                                st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=4),
                                                                             st.booleans(), st.none(), st.floats()),
                                                max_size=4).map(lambda d: json.dumps({**LINE, **d}).encode())),
                      max_size=6))
def test_any_bytes_give_one_strict_json_line_per_line(db: modperf.Database, lines: list[bytes]) -> None:
    """Whatever the bytes, each non-blank line gets exactly one line of strict JSON, an answer or
    a typed error (never ``internal``)."""
    data = b"\n".join(line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines)
    expected = sum(1 for line in data.split(b"\n") if line.strip())
    out = answers(db, data)
    assert len(out) == expected
    for o in out:
        assert "latency_ms" in o or (o["error"]["kind"] != "internal" and o["error"]["type"].endswith("Error"))


def test_a_rejected_table_is_read_once_per_database(fixtures: Path, tmp_path: Path, monkeypatch) -> None:
    table = pq.read_table(fixtures / MLA)
    dup = pa.Table.from_arrays([*table.columns, table.column("isl")], names=[*table.column_names, "isl"])
    folder = tmp_path / "gb300/mla/vllm/0.27.0"
    folder.mkdir(parents=True)
    pq.write_table(dup, folder / "mla_context_module_perf.parquet")
    db = modperf.open(tmp_path)
    loads = []
    real = loader.load_one
    monkeypatch.setattr(loader, "load_one", lambda *a, **k: loads.append(1) or real(*a, **k))
    out = answers(db, b"\n".join([json.dumps(LINE).encode()] * 50))
    assert len(out) == 50 and len(loads) == 1
    assert {o["error"]["kind"] for o in out} == {"table_rejected"}
    assert [f["kind"] for f in out[-1]["error"]["failures"]] == ["duplicate_column"]
    assert out[0]["error"]["message"] == out[-1]["error"]["message"]
    assert "column name(s) 'isl' appear more than once" in out[-1]["error"]["message"]


def test_cli_batch_file_with_invalid_utf8_answers_every_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "q.jsonl"
    path.write_bytes(json.dumps(LINE).encode() + b"\n\xff\xfe\n" + json.dumps(LINE).encode() + b"\n")
    code, out, err = run_main(["query", "--batch", str(path)], capsys)
    lines = [strict_json(line) for line in out.splitlines()]
    assert code == 1 and len(lines) == 3 and err == ""
    assert lines[0]["latency_ms"] == lines[2]["latency_ms"] == 0.7945
    assert lines[1]["error"]["message"].startswith("line 2 is not UTF-8")


@pytest.mark.parametrize("target", ["folder", "/dev/zero", "missing"])
def test_cli_batch_input_that_is_not_a_file(tmp_path: Path, capsys, target: str) -> None:
    path = {"folder": str(tmp_path), "missing": str(tmp_path / "none.jsonl")}.get(target, target)
    for extra in ([], ["--json"]):
        code, out, err = run_main(["query", "--batch", path, *extra], capsys)
        assert code == 2
        if extra:
            assert strict_json(out)["error"]["kind"] == "query_field"
        else:
            assert err.startswith("error (query_field): ")


def test_small_dumps_writes_what_dumps_writes(db) -> None:
    """Batch answer lines go through jsonio.dumps_small: the same strict text as jsonio.dumps,
    for real answers and for every kind of value dumps makes plain."""
    from pathlib import Path

    import numpy as np

    from modperf.base.jsonio import dumps, dumps_small

    answer = db.answer({**LINE}, quality=True).to_dict()
    odd = {"nan": float("nan"), "inf": [float("-inf")], "np": np.float64(0.1), "npnan": np.float32("nan"),
           "int": np.int64(7), "arr": np.array([1.5, np.nan]), "tuple": (1, (2, 3)), "path": Path("/x"),
           "set": {3}, "bool": np.bool_(True), "nested": {"a": [{"b": 1e-300}]}}
    for obj in (answer, odd, {"x": np.float64("nan")}, [np.float64(2.0)]):
        assert dumps_small(obj) == dumps(obj)
