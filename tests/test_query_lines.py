"""modperf.query.lines: a batch answered plan by plan writes the same bytes as the reference
path (run_lines below, one query at a time), whatever the lines hold, in chunks of any
size, through the CLI from a file and from stdin."""

from __future__ import annotations

import collections
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import point_fields, run_cli, run_lines

import modperf
from modperf.fast import batch as batch_module
from modperf.fast.batch import read_lines, run_chunks
from modperf.query.lines import LineAnswerer

SLOTS = [("h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module"),
         ("h200_sxm", "trtllm", "1.3.0rc20", "mla_generation_module"),
         ("h200_sxm", "sglang", "0.5.14", "context_attention"),
         ("h200_sxm", "sglang", "0.5.14", "generation_attention"),
         ("h200_sxm", "sglang", "0.5.14", "dsa_context_module"),
         ("h200_sxm", "trtllm", "1.3.0rc20", "gemm")]
MSA = dict(table="msa_context_module", system="h200_sxm", backend="trtllm", version="1.3.0rc23",
           model="nvidia/MiniMax-M3-NVFP4", tp_size=1, batch_size=2, step=128, gemm_type="fp8_block")
KIMI = dict(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0", model="moonshotai/Kimi-K3",
            tp_size=8, batch_size=4, isl=2048, kernel_source="FLASH_ATTN")
#: A dtype is the deployment's choice (issue 21): DeepSeek-V3 asked with bf16 GEMMs (its checkpoint
#: stores fp8_block), as a field and as the served variant.
V3_BF16 = dict(table="mla_context_module", system="h200_sxm", backend="trtllm", version="1.3.0rc20",
               model="deepseek-ai/DeepSeek-V3", tp_size=8, batch_size=4, isl=2048, gemm_type="bfloat16")


def mixed_batch(db: modperf.Database) -> bytes:
    """Lines from measured points of several tables and models, moved on and off the grid
    (exact, interpolated, extrapolated, refused), with values of every type, shuffled among
    malformed lines."""
    rng = np.random.default_rng(7)
    lines: list[bytes] = []
    for slot in SLOTS:
        keyed = db.table(*slot)
        for b in range(min(keyed.n_buckets, 4)):
            lo, hi = int(keyed.offsets[b]), int(keyed.offsets[b + 1])
            for p in rng.choice(np.arange(lo, hi), size=min(25, hi - lo), replace=False):
                fields = point_fields(keyed, b, int(p))
                if slot[3] == "dsa_context_module":
                    fields.pop("kernel_source")  # the lane rule picks it per point
                axis = str(rng.choice(keyed.spec.axes))
                for scale in (1, 1, 2, 3, 64):
                    lines.append(json.dumps({**fields, axis: int(fields[axis] * scale + (scale == 3))}).encode())
                lines.append(json.dumps({**fields, axis: str(fields[axis])}).encode())  # a string the query parses
                lines.append(json.dumps({**fields, axis: float(fields[axis])}).encode())
                lines.append(json.dumps({**fields, axis: None}).encode())
                lines.append(json.dumps({k: v for k, v in fields.items() if k != axis}).encode())
                lines.append(json.dumps(dict(reversed(list(fields.items())))).encode())  # another field order
    for isl in (32768, 30000, 16384, 1_000_000, 32768):  # quality findings on the points answered
        lines.append(json.dumps({**MSA, "isl": isl}).encode())
    for isl in (2048, 3000, 1024, 2048, 100_000):  # exact, blended, exact, again, refused
        lines.append(json.dumps({**V3_BF16, "isl": isl}).encode())
        lines.append(json.dumps({**V3_BF16, "isl": isl, "kv_cache_dtype": "fp8"}).encode())
        lines.append(json.dumps({**{k: v for k, v in V3_BF16.items() if k != "gemm_type"}, "isl": isl,
                                 "model": "deepseek-ai/DeepSeek-V3@gemm=bfloat16"}).encode())
    lines.append(json.dumps({**V3_BF16, "gemm_type": "nvfp4"}).encode())  # never measured: refused
    lines += [json.dumps(KIMI).encode(), json.dumps({**KIMI, "isl": 3000}).encode(),
              json.dumps({**KIMI, "num_tokens": 8}).encode(),  # an axis of another table
              json.dumps({**KIMI, "allow_substitute": True}).encode(), json.dumps({**KIMI, "tp_size": 7}).encode(),
              json.dumps({**KIMI, "batch_size": True}).encode(), json.dumps({**KIMI, "batch_size": 0}).encode(),
              json.dumps({**KIMI, "isl": [1, 2]}).encode(), json.dumps({**KIMI, "isl": {"a": 1}}).encode(),
              json.dumps({**KIMI, "self": 1}).encode(), json.dumps({**KIMI, "model": "no/such-model"}).encode(),
              b'{"table": "\xff\xfe"}', b"\xef\xbb\xbf" + json.dumps(KIMI).encode(), b"[" * 100_000 + b"]" * 100_000,
              b'{"batch_size": NaN}', b'{"isl": 1, "isl": 2}', b'{"n": 1' + b"0" * 5000 + b"}", b"\x00\x01", b"",
              b"   ", b"\t" + json.dumps(KIMI).encode() + b" \r", b"[1, 2]", b"{}", b'{"table": 1}', b"{"]
    order = rng.permutation(len(lines))
    return b"\n".join(lines[i] for i in order) + b"\n"


def refused_batch(db: modperf.Database) -> bytes:
    """Lines of several tables (and heads) with every axis drawn from its measured range or up
    to three times past it: most points refused, in the ragged grid's empty corners (no
    measurement within the limit) and beyond the limit, the rest on, between or just beyond
    measured points; a few refused points repeated."""
    rng = np.random.default_rng(5)
    lines: list[bytes] = []
    for slot in SLOTS[:4]:
        keyed = db.table(*slot)
        for b in range(min(keyed.n_buckets, 3)):
            lo, hi = int(keyed.offsets[b]), int(keyed.offsets[b + 1])
            fields = point_fields(keyed, b, lo)
            values = {a: keyed.axes[a][lo:hi] for a in keyed.spec.axes}
            for k in range(120):
                point = {a: int(rng.integers(int(v.min()), int(v.max()) * (3 if k % 3 == 0 else 1) + 1))
                         for a, v in values.items()}
                lines.append(json.dumps({**fields, **point}).encode())
    lines += lines[::50]
    order = rng.permutation(len(lines))
    return b"\n".join(lines[i] for i in order) + b"\n"


@pytest.fixture(scope="module", params=["mixed", "refused"])
def batch(db: modperf.Database, request: pytest.FixtureRequest) -> bytes:
    return mixed_batch(db) if request.param == "mixed" else refused_batch(db)


@pytest.fixture(scope="module")
def reference(db: modperf.Database, batch: bytes) -> bytes:
    return b"".join(line.encode() + b"\n" for _, line in run_lines(read_lines(io.BytesIO(batch)), db.queries.query))


def test_the_mixed_batch_covers_every_kind_of_line(db: modperf.Database) -> None:
    out = [json.loads(line) for _, line in run_lines(read_lines(io.BytesIO(mixed_batch(db))), db.queries.query)]
    kinds = collections.Counter(o["kind"] if "kind" in o else o["error"]["kind"] for o in out)
    assert min(kinds[k] for k in ("exact", "interpolated", "extrapolated", "out_of_coverage", "query_field")) >= 10
    assert kinds["unknown_model"] == kinds["shard"] == 1
    assert {o["table"] for o in out if "kind" in o} == {s[3] for s in SLOTS} | {"msa_context_module"}
    assert sum(o.get("quality") is not None for o in out) >= 3
    assert sum(o.get("lane") is not None for o in out) >= 10
    overridden = [o for o in out if "kind" in o and o["fields"].get("model", "").startswith("deepseek-ai/DeepSeek-V3")
                  and o["fields"].get("gemm_type") == "bfloat16"]
    assert len(overridden) == 12 and {o["kind"] for o in overridden} == {"exact", "interpolated"}
    assert all("its checkpoint stores them as fp8_block" in o["derived"]["gemm_type"] for o in overridden)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_plan_by_plan_writes_the_reference_bytes(batch: bytes, reference: bytes, chunk: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    db = modperf.open()  # its own plans and templates
    answerer = LineAnswerer(db.queries)
    by_reference = 0
    one_at_a_time = answerer.reference

    def counted(fields):
        nonlocal by_reference
        by_reference += 1
        return one_at_a_time(fields)

    monkeypatch.setattr(answerer, "reference", counted)
    chunks = list(run_chunks(read_lines(io.BytesIO(batch)), answerer.answer, chunk=chunk))
    assert b"".join(line.encode() + b"\n" for c in chunks for _, line in c) == reference
    assert all(len(c) <= chunk for c in chunks)  # (a chunk of blank lines has none)
    # most lines answered on or between measured points are written from their plan's template
    # (the test would pass trivially if every line fell back to the reference path); the rest
    # -- lane tables, axis values given as strings or floats, errors, extrapolated and refused
    # points -- go through the reference path
    out = [json.loads(line) for line in reference.splitlines()]
    templated = sum(o.get("kind") in ("exact", "interpolated") and o["lane"] is None for o in out)
    assert len(out) - by_reference >= templated * 0.6


def test_the_cli_writes_the_reference_bytes_from_a_file_and_from_stdin(batch: bytes, reference: bytes,
                                                                        tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(batch)
    from_file = run_cli(["query", "--batch", str(path)], timeout=300)
    from_stdin = run_cli(["query", "--batch", "-"], stdin=batch, timeout=300)
    assert from_file.returncode == from_stdin.returncode == 1  # some lines fail
    assert from_file.stdout.encode() == from_stdin.stdout.encode() == reference


def test_the_refused_batch_is_mostly_refused_both_ways_in_several_tables(db: modperf.Database) -> None:
    lines = [json.loads(line) for _, line in run_lines(read_lines(io.BytesIO(refused_batch(db))), db.queries.query)]
    refused = [o["error"] for o in lines if "error" in o]
    assert all(e["type"] == "OutOfCoverageError" for e in refused)
    assert len(refused) >= 0.5 * len(lines)
    assert {e["message"].split(":")[0] for e in refused} == {s[3] for s in SLOTS[:4]}
    ragged = sum("no measurement reaches" in e["message"] for e in refused)
    assert 0 < ragged < len(refused)  # and the rest beyond the extrapolation limit
    assert all(len(e["values"]["nearest_measured"]) == 3 for e in refused)


def test_refused_and_extrapolated_points_are_written_from_their_plans_texts(db: modperf.Database,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The refused and extrapolated lines of a refused-dominated batch do not go through the
    reference path (the test comparing bytes would pass trivially if they did)."""
    batch = refused_batch(db)
    answerer = LineAnswerer(modperf.open().queries)
    by_reference = collections.Counter()
    one_at_a_time = answerer.reference

    def counted(fields):
        ok, line = one_at_a_time(fields)
        by_reference[ok] += 1
        return ok, line

    monkeypatch.setattr(answerer, "reference", counted)
    one_by_one = answerer._extrapolated  # (an extrapolated point's scalar lookup: the fallback)
    monkeypatch.setattr(answerer, "_extrapolated", lambda *a: (by_reference.update(["scalar"]), one_by_one(*a))[1])
    out = [line for c in run_chunks(read_lines(io.BytesIO(batch)), answerer.answer, chunk=4096) for _, line in c]
    assert sum(line.startswith('{"error"') for line in out) >= 0.5 * len(out)
    assert sum('"kind": "extrapolated"' in line for line in out) >= 20
    assert by_reference[False] == by_reference[True] == by_reference["scalar"] == 0


# -- a chunk's lines read in one JSON call ------------------------------------------------------

#: Lines the chunk reader must leave to the line-by-line reader, or read as the line alone
#: gives: each beside good lines in a chunk.
AWKWARD = [b'{"batch_size": NaN}', b'{"isl": 1, "isl": 2}', b'{"isl": 1, "isl": 1}', b'{"a": "x", "b": 1, "a": "y"}',
           b'{"a": Infinity}', b'{"a": 1, "b": {"c": 2}}', b'{"a": [1, 2]}', b'{"a": {"b": 1, "b": 2}}',
           b'\xef\xbb\xbf{}', b'{"t": "\xff"}', b'{"t": "\xc3"}', b'{"a": 1}, {"b": 2}', b'{"a": 1}, "x"',
           b'{"a": 1', b'"b": 2}', b'{"a": 1}}', b'{', b'}', b'{"a": "{"}', b'{"a": "["}',
           b'{"a": "\\u0022", "a": 1}', b'{"a\\"": 1, "a\\"": 2}', b' {"a": 1}', b'{"a": 1} ', b'\t{}\r', b'',
           b'   ', b'[1]', b'1', b'{}', b'{"n": 1' + b"0" * 5000 + b"}", b'{"a": -0}', b'{"a": 01}',
           b'{"a": 1.5e3, "b": true, "c": null, "d": "\xc3\xa9,:"}', b'{"a": "\x01"}', b'{,}', b'{"a": 1,}',
           b'{"a": "\n"}']


def _typed(obj):
    return None if obj is None else [(k, type(v), v) for k, v in obj.items()]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(AWKWARD),
                          st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=4),
                                                                       st.booleans(), st.none(), st.floats(
                                                                           allow_nan=False, allow_infinity=False)),
                                          max_size=4).map(lambda d: json.dumps(d).encode())),
                min_size=1, max_size=12))
def test_a_chunk_read_at_once_gives_what_each_line_alone_gives(lines: list[bytes]) -> None:
    """Every object the chunk reader gives is the object the one-line reader gives (types and
    key order too); what it leaves (None) the line-by-line path reads."""
    lines = [line + b"\n" for line in lines]
    objs, misses = batch_module._flat_objects(lines)
    assert misses == [k for k, obj in enumerate(objs) if obj is None]
    for line, obj in zip(lines, objs):
        if obj is not None:
            assert _typed(obj) == _typed(batch_module._flat_object(line))


def test_one_bad_line_leaves_the_rest_of_its_chunk_read_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    good = [json.dumps({"table": "t", "isl": k, "name": f"a,b:{k}"}).encode() + b"\n" for k in range(200)]
    for bad in AWKWARD:
        lines = [*good[:77], bad + b"\n", *good[77:]]
        objs, misses = batch_module._flat_objects(lines)
        assert all(_typed(obj) == _typed(batch_module._flat_object(line)) for line, obj in zip(lines, objs) if obj)
        assert set(misses) <= {77}  # (the array's reading of the others survives the bad line)
    calls = []
    decode = batch_module._DECODE_DICTS.decode
    monkeypatch.setattr(batch_module, "_DECODE_DICTS", type("D", (), {"decode": lambda self, text: (
        calls.append(text), decode(text))[1]})())
    batch_module._flat_objects([*good[:77], b'{"isl": 1' + b"0" * 5000 + b'}\n', *good[77:]])
    assert len(calls) <= 2 * 9  # halving down to the line without a position: a few reads, not one per line
    calls.clear()
    objs, misses = batch_module._flat_objects([*good[:77], b'{"isl": NaN}\n', b'{"a": 1, "a": 2}\n', *good[77:]])
    assert len(calls) == 1 and misses == [77, 78]


def test_chunks_with_awkward_lines_write_the_reference_bytes(db: modperf.Database) -> None:
    rng = np.random.default_rng(3)
    good = [json.dumps({**KIMI, "isl": int(isl)}).encode() for isl in rng.integers(1, 9000, size=300)]
    lines = good + AWKWARD * 3
    data = b"\n".join(lines[i] for i in rng.permutation(len(lines))) + b"\n"
    reference = [line for _, line in run_lines(read_lines(io.BytesIO(data)), db.queries.query)]
    for chunk in (1, 7, 64, 4096):
        answerer = LineAnswerer(db.queries)
        out = [line for c in run_chunks(read_lines(io.BytesIO(data)), answerer.answer, chunk=chunk) for _, line in c]
        assert out == reference


# -- lines of a known shape ---------------------------------------------------------------------


def _shaped_run(db: modperf.Database, data: bytes, chunk: int, defaults: dict | None = None, **options
                ) -> tuple[list[list[tuple[bool, str]]], int]:
    """The chunks a batch gives with its shapes learnt from the first line of each (every line
    of a known shape read by its pattern), and the number of lines answered as a shape's."""
    answerer = LineAnswerer(db.queries)
    shaped = 0
    answer_shaped = answerer.answer_shaped

    def counted(fields, holes, columns, n):
        nonlocal shaped
        found = answer_shaped(fields, holes, columns, n)
        shaped += 0 if found is None else n
        return found

    shapes = batch_module.LineShapes(answerer.free, defaults, **{"learn_at": 1, "learn_per_chunk": 1 << 20, **options})
    chunks = list(run_chunks(read_lines(io.BytesIO(data)), answerer.answer, defaults, chunk=chunk, shapes=shapes,
                             answer_shaped=counted))
    return chunks, shaped


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_lines_of_a_known_shape_write_the_reference_bytes(batch: bytes, reference: bytes, chunk: int) -> None:
    chunks, shaped = _shaped_run(modperf.open(), batch, chunk)
    assert b"".join(line.encode() + b"\n" for c in chunks for _, line in c) == reference
    assert all(len(c) <= chunk for c in chunks)
    # (the test would pass trivially if no line were read by its shape)
    assert shaped >= 0.5 * len(reference.splitlines())


def test_the_shapes_kept_are_bounded(batch: bytes, reference: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = []
    match = batch_module.LineShapes._match
    monkeypatch.setattr(batch_module.LineShapes, "_match", staticmethod(lambda *a: (kept.append(a[0]), match(*a))[1]))
    sizes = []
    split = batch_module.LineShapes.split
    monkeypatch.setattr(batch_module.LineShapes, "split",
                        lambda self, lines: (split(self, lines), sizes.append(self._n_shapes))[0])
    chunks, shaped = _shaped_run(modperf.open(), batch, 64, keep=3)
    assert b"".join(line.encode() + b"\n" for c in chunks for _, line in c) == reference
    assert max(sizes) <= 3 and len(set(map(id, kept))) > 3  # (more were learnt than kept)


def test_lines_of_a_known_shape_take_the_defaults_as_the_reference_does(db: modperf.Database) -> None:
    rng = np.random.default_rng(11)
    slot = {k: KIMI[k] for k in ("system", "backend", "version")}
    lines = [json.dumps({k: v for k, v in {**KIMI, "isl": int(isl)}.items() if k not in slot}).encode()
             for isl in rng.integers(1, 9000, size=150)]
    lines += [json.dumps({**KIMI, "isl": int(isl), "backend": "sglang"}).encode() for isl in (100, 2048, 9000)]
    data = b"\n".join(lines[i] for i in rng.permutation(len(lines))) + b"\n"
    defaults = {**slot, "isl": "7", "batch_size": 2}  # (a line's own fields win)
    reference = [line for _, line in run_lines(read_lines(io.BytesIO(data)), db.queries.query, defaults)]
    for chunk in (7, 4096):
        chunks, shaped = _shaped_run(db, data, chunk, defaults)
        assert [line for c in chunks for _, line in c] == reference
        assert shaped >= 140


FREE = LineAnswerer.free
_DIGIT_RUN = st.sampled_from([b"", b"0", b"7", b"-", b"-3", b"12", b"007", b"1e3", b".5", b"123456789012345678",
                              b"1234567890123456789"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["isl", "batch_size", "step", "table", "n", "a: 1,", "b"]),
                       st.one_of(st.integers(-10**20, 10**20), st.integers(0, 99),
                                 st.text(alphabet='0123456789:, {}"ab-é', max_size=6), st.booleans(), st.none(),
                                 st.floats(allow_nan=False, allow_infinity=False)), max_size=5),
       st.sampled_from([(", ", ": "), (",", ":"), (" ,  ", " :\t")]), st.booleans(),
       st.lists(st.tuples(st.integers(0, 1 << 16), st.one_of(_DIGIT_RUN, st.integers(-10**19, 10**19).map(
           lambda v: str(v).encode())), st.integers(0, 2), st.booleans()), min_size=1, max_size=4),
       st.lists(st.integers(-10**18 + 1, 10**18 - 1), min_size=5, max_size=5))
def test_a_line_its_shape_matches_reads_as_the_shape_with_its_integers(proto: dict, separators: tuple[str, str],
                                                                       ascii_only: bool, edits: list,
                                                                       others: list[int]) -> None:
    """A shape's pattern matches its own line and the line with other integers in its holes;
    any line it matches (the line with numbers replaced, digits and signs inserted or removed)
    reads as the shape's fields with the matched integers in its holes: keys, order, types
    and values."""
    def dumped(obj: dict) -> bytes:
        return json.dumps(obj, separators=separators, ensure_ascii=ascii_only).encode() + b"\n"

    line = dumped(proto)
    shape = batch_module.shape_of(line, FREE, {})
    assert shape is not None and shape.pattern.fullmatch(line)
    assert set(shape.holes) == {k for k, v in proto.items() if k in FREE and type(v) is int and abs(v) < 10**18}
    moved = shape.pattern.fullmatch(dumped({**proto, **dict(zip(shape.holes, others))}))
    assert moved is not None and list(map(int, moved.groups())) == others[:len(shape.holes)]
    variant = line
    for at, text, cut, a_run in edits:
        runs = [m.span() for m in re.finditer(rb"-?[0-9]+", variant)]
        if a_run and runs:  # a whole number, sign and digits, replaced
            start, end = runs[at % len(runs)]
            variant = variant[:start] + text + variant[end:]
        else:
            at %= len(variant) + 1
            variant = variant[:at] + text + variant[at + cut:]
    found = shape.pattern.fullmatch(variant)
    if found is not None:
        expected = dict(shape.fields)
        expected.update({h: int(v) for h, v in zip(shape.holes, found.groups())})
        assert _typed(batch_module._flat_object(variant)) == _typed(expected)
        assert _typed(batch_module.parse_line(1, variant)) == _typed(expected)


def test_a_line_that_is_not_one_flat_object_has_no_shape() -> None:
    for line in AWKWARD:
        shape = batch_module.shape_of(line + b"\n", FREE, {})
        if shape is not None:  # (a flat object of unique keys: it reads as the line alone gives)
            assert _typed(shape.fields) == _typed(batch_module._flat_object(line + b"\n"))
    assert batch_module.shape_of(b'{"isl": 1, "isl": 2}\n', FREE, {}) is None
    assert batch_module.shape_of(b'{"isl": [1]}\n', FREE, {}) is None
    assert batch_module.shape_of(b'{"isl": NaN}\n', FREE, {}) is None
    shape = batch_module.shape_of(b'{"isl": 01}\n', FREE, {})
    assert shape is None
    shape = batch_module.shape_of(b'{"isl": -0, "step": 3, "tp_size": 4, "batch_size": true}\n', FREE, {})
    assert shape is not None and shape.holes == ("step",)  # -0 and true stay as written; tp_size is no axis


def test_a_point_given_with_and_without_an_axis_the_plan_fixes_writes_each_its_own_line(db: modperf.Database) -> None:
    """Lines of one table and one point, one giving `step` and one leaving it to the plan (0):
    two plans (the answer lists its fields in the order given), so the text kept for an
    extrapolated or refused point is kept per plan."""
    keyed = db.table(*SLOTS[0])
    fields = point_fields(keyed, 0, int(keyed.offsets[0]))
    assert fields["step"] == 0
    lines = []
    for isl in (fields["isl"], 50_000, 10**6, 50_000):
        given = {**fields, "isl": isl}
        lines += [json.dumps(given).encode(), json.dumps({k: v for k, v in given.items() if k != "step"}).encode()]
    data = b"\n".join(lines) + b"\n"
    reference = [line for _, line in run_lines(read_lines(io.BytesIO(data)), db.queries.query)]
    assert reference[2] != reference[3] and json.loads(reference[2]) == json.loads(reference[3])  # (the order)
    assert '"kind": "extrapolated"' in reference[2] and reference[4].startswith('{"error"')
    for chunk in (1, 4096):
        answerer = LineAnswerer(db.queries)
        assert [line for c in run_chunks(read_lines(io.BytesIO(data)), answerer.answer, chunk=chunk)
                for _, line in c] == reference


def test_lines_of_a_known_shape_beside_lines_too_long_or_given_as_text(db: modperf.Database) -> None:
    """A chunk holding a line too long or a line given as str (no shape is tried on those)
    after chunks that taught the shapes tried first on every line."""
    rng = np.random.default_rng(13)
    good = [json.dumps({**KIMI, "isl": int(isl)}).encode() + b"\n" for isl in rng.integers(1, 9000, size=200)]
    long = json.dumps({**KIMI, "model": "x" * 500}).encode() + b"\n"
    data = b"".join(good[:100] + [long] + good[100:])
    lines = list(read_lines(io.BytesIO(data), limit=400))
    assert isinstance(lines[100], batch_module.LineTooLong)
    lines[150] = lines[150].decode()
    reference = [line for _, line in run_lines(lines, db.queries.query)]
    answerer = LineAnswerer(db.queries)
    shaped = 0

    def counted(fields, holes, columns, n):
        nonlocal shaped
        shaped += n
        return answerer.answer_shaped(fields, holes, columns, n)

    shapes = batch_module.LineShapes(answerer.free, learn_at=1)
    out = [line for c in run_chunks(lines, answerer.answer, chunk=50, shapes=shapes, answer_shaped=counted)
           for _, line in c]
    assert out == reference and shaped >= 190


def test_axis_values_to_parse_or_refuse_are_read_once_per_value(db: modperf.Database,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A value where an integer goes (text, a float, a boolean, null, out of range, a value that
    is not a number) is read as the query reads it once per value and plan, and its lines take
    the vectorised path (answered, or refused with the reference's error line); a value that is
    not a scalar goes through the reference path, which refuses it as a fresh resolution does."""
    rng = np.random.default_rng(31)
    values = ["2048", "3000", 2048.0, 3000.5, True, None, 0, 1 << 40, "many", "-0", -0.0, 0.0, "²", [2048]]
    lines = [json.dumps({**KIMI, "batch_size": int(b), "isl": v}).encode()
             for v in values for b in rng.integers(1, 64, 40)]
    data = b"\n".join(lines[i] for i in rng.permutation(len(lines))) + b"\n"
    reference = [line for _, line in run_lines(read_lines(io.BytesIO(data)), db.queries.query)]
    for chunk in (7, 4096):
        answerer = LineAnswerer(modperf.open().queries)
        read: collections.Counter = collections.Counter()
        axis_value = answerer.engine.axis_value
        monkeypatch.setattr(answerer.engine, "axis_value", lambda plan, name, v, f=axis_value, read=read: (
            read.update([repr(v)]), f(plan, name, v))[1])
        by_reference: list = []
        one_at_a_time = answerer.reference
        monkeypatch.setattr(answerer, "reference", lambda fields, f=one_at_a_time, seen=by_reference: (
            seen.append(fields["isl"]), f(fields))[1])
        out = [line for c in run_chunks(read_lines(io.BytesIO(data)), answerer.answer, chunk=chunk) for _, line in c]
        assert out == reference
        assert by_reference == [[2048]] * 40  # (only the list)
        assert read.pop("[2048]") == 40  # (the reference path, once per line)
        assert set(read.values()) == {1} and len(read) == len(values) - 1, read  # (once per value, across chunks)
    kinds = collections.Counter(json.loads(line).get("kind") or json.loads(line)["error"]["kind"] for line in out)
    # ("2048", "3000" and 2048.0 read as the integers; the rest refused)
    assert kinds["query_field"] == 11 * 40 and kinds["exact"] + kinds["interpolated"] >= 40


def test_refusals_of_long_text_are_not_kept_for_the_batch(db: modperf.Database) -> None:
    """A kept error is keyed by its line's values, which a line may hold by the megabyte: long
    text is refused line by line (within a group, at once), never kept."""
    long_model = {**KIMI, "model": "org/" + "x" * 5000}
    long_value = {**KIMI, "isl": "9" * 5000}
    lines = [json.dumps({**long_model, "batch_size": b}).encode() for b in range(1, 40)]
    lines += [json.dumps({**long_value, "batch_size": b}).encode() for b in range(1, 40)]
    lines += [json.dumps({**KIMI, "model": "no/such-model", "batch_size": b}).encode() for b in range(1, 40)]
    data = b"\n".join(lines) + b"\n"
    reference = [line for _, line in run_lines(read_lines(io.BytesIO(data)), db.queries.query)]
    answerer = LineAnswerer(modperf.open().queries)
    out = [line for c in run_chunks(read_lines(io.BytesIO(data)), answerer.answer, chunk=4096) for _, line in c]
    assert out == reference and len(set(out)) == 3
    kept = list(answerer._failed)  # (keys: field names, non-axis values, their types)
    assert len(kept) == 1 and "no/such-model" in kept[0][1]  # (the short one)
    assert all(len(k[2]) <= 1024 for memo in answerer._axis_values.values() for k in memo[1])
    assert not answerer._line_errors
