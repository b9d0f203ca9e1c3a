"""Queries against the real embedded corpus: values are checked against the parquet files read
directly with pyarrow, errors by type and message."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import modperf
from modperf import errors as E
from modperf.query.engine import QueryEngine
from modperf.query.interp import CURVATURES, Grid, curve

# gemm_type is left to the model's checkpoint (modperf.query.resolve): Kimi-K3's dense layers are
# bfloat16, DeepSeek-V3's fp8_block
GB300 = dict(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0",
             kernel_source="FLASH_ATTN", mla_dtype="bfloat16", kv_cache_dtype="bfloat16")
K3_ROWS = dict(GB300, gemm_type="bfloat16")
DSV3_TP4_FP8_BLOCK = 0.6848  # the stored row (the test also reads it from the file)
V3_ROWS = dict(GB300, gemm_type="fp8_block")
GQA_GEN = dict(table="generation_attention", system="h200_sxm", backend="vllm", version="0.24.0",
               kernel_source="vllm_flash_attn_fa3", attn_dtype="bfloat16", kv_cache_dtype="bfloat16",
               num_key_value_heads=8, head_dim=128, window_size=0, beam_width=1)


def stored(db: modperf.Database, slot: dict, **where) -> list[float]:
    """Latencies of the rows matching ``where``, read straight from the table's file."""
    path = db.ref(slot["system"], slot["backend"], slot["version"], slot["table"]).path
    table = pq.read_table(path)
    mask = None
    for col, value in {**{k: v for k, v in slot.items() if k in table.column_names}, **where}.items():
        m = pc.equal(table.column(col), value)
        mask = m if mask is None else pc.and_(mask, m)
    return table.filter(mask).column("latency").to_pylist()


def test_gb300_answers_kimi_k3_and_deepseek_v3_from_their_own_buckets(db: modperf.Database) -> None:
    # local 32 is Kimi-K3 (96) at tp 3 and DeepSeek-V3 (128) at tp 4: two different modules
    kimi = db.query(**GB300, model="moonshotai/Kimi-K3", tp_size=3, batch_size=4, isl=2048)
    dsv3 = db.query(**GB300, model="deepseek-ai/DeepSeek-V3", tp_size=4, batch_size=4, isl=2048)
    assert (kimi.native, kimi.local, kimi.kind, kimi.models) == (96, 32, "exact", ("moonshotai/Kimi-K3",))
    assert (dsv3.native, dsv3.local, dsv3.kind, dsv3.models) == (128, 32, "exact", ("deepseek-ai/DeepSeek-V3",))
    assert [kimi.latency_ms] == stored(db, K3_ROWS, model="moonshotai/Kimi-K3", num_heads=32, batch_size=4,
                                       isl=2048)
    assert [dsv3.latency_ms] == stored(db, V3_ROWS, model="deepseek-ai/DeepSeek-V3", num_heads=32, batch_size=4,
                                       isl=2048)
    assert kimi.latency_ms == 0.7945 and dsv3.latency_ms == DSV3_TP4_FP8_BLOCK
    assert (kimi.fields["gemm_type"], dsv3.fields["gemm_type"]) == ("bfloat16", "fp8_block")
    assert "fp8_block" in dsv3.derived["gemm_type"] and "weight_block_size [128, 128]" in dsv3.derived["gemm_type"]


@settings(max_examples=40, deadline=None)
@given(row=st.integers(0, 21859))
def test_exact_hits_are_the_stored_values(db: modperf.Database, row: int) -> None:
    path = db.ref("gb300", "vllm", "0.27.0", "mla_context_module").path
    r = {k: v[0] for k, v in pq.read_table(path).slice(row, 1).to_pydict().items()}
    key = {k: r[k] for k in ("op_name", "kernel_source", "mla_dtype", "kv_cache_dtype", "gemm_type", "batch_size",
                             "isl", "step")}
    # every GEMM dtype the table measured: asked by native head count (a model id would fix the
    # dtype its checkpoint stores)
    native = db.models.get(r["model"]).native_heads
    answer = db.query(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0",
                      native_heads=native, num_heads=r["num_heads"], **key)
    assert answer.kind == "exact"
    assert answer.latency_ms == r["latency"]


def test_interpolation_equals_a_hand_blend_of_the_real_neighbours(db: modperf.Database) -> None:
    # generation tables blend linearly in u(step), the coordinate fitted to the group (docs/
    # queries.md): step 1500 sits between 1023 and 2047
    q = dict(GQA_GEN, num_heads=32, batch_size=16)
    grid = db.queries.grid(q)
    [v0] = stored(db, GQA_GEN, num_heads=32, batch_size=16, step=1023)
    [v1] = stored(db, GQA_GEN, num_heads=32, batch_size=16, step=2047)
    k = grid.curvature[grid.axes.index("step")]
    t = (curve(1500.0, k) - curve(1023.0, k)) / (curve(2047.0, k) - curve(1023.0, k))
    answer = db.query(**q, step=1500)
    assert answer.kind == "interpolated"
    assert answer.latency_ms == pytest.approx(v0 + t * (v1 - v0), rel=1e-12)
    # and across local heads: 80 between the measured 64 and 96, in u(heads)
    [h64] = stored(db, GQA_GEN, num_heads=64, batch_size=16, step=1023)
    [h96] = stored(db, GQA_GEN, num_heads=96, batch_size=16, step=1023)
    k = grid.curvature[grid.axes.index("num_heads")]
    t = (curve(80.0, k) - curve(64.0, k)) / (curve(96.0, k) - curve(64.0, k))
    between = db.query(**dict(q, num_heads=80), step=1023)
    assert between.locals_used == (64, 96)
    assert between.latency_ms == pytest.approx(h64 + t * (h96 - h64), rel=1e-12)


@pytest.mark.parametrize("axis", ["step", "batch_size"])
def test_fitted_coordinate_is_the_best_leave_one_out_curvature_of_the_real_lines(db: modperf.Database,
                                                                               axis: str) -> None:
    # every line of the group along the axis (the other key columns fixed), read from the file:
    # predict each measured point from its nearest measured neighbours on the line, for every
    # candidate curvature; the grid's coordinate is the one with the least mean error (each
    # point's error capped at 50 %)
    path = db.ref(GQA_GEN["system"], GQA_GEN["backend"], GQA_GEN["version"], GQA_GEN["table"]).path
    rows = pq.read_table(path).to_pydict()
    others = [c for c in ("num_heads", "batch_size", "step") if c != axis]
    lines: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for i in range(len(rows["latency"])):
        if all(rows[c][i] == v for c, v in GQA_GEN.items() if c in rows):
            lines.setdefault(tuple(rows[c][i] for c in others), []).append((rows[axis][i], rows["latency"][i]))

    def score(k: float) -> float:
        errs = []
        for line in lines.values():
            line.sort()
            for (x0, y0), (x, y), (x1, y1) in zip(line, line[1:], line[2:]):
                if y > 0:
                    t = (curve(float(x), k) - curve(float(x0), k)) / (curve(float(x1), k) - curve(float(x0), k))
                    errs.append(min(abs((y0 + t * (y1 - y0)) / y - 1.0), 0.5))
        return sum(errs) / len(errs)

    scores = {k: score(k) for k in CURVATURES}
    grid = db.queries.grid(dict(GQA_GEN, num_heads=32))
    chosen = grid.curvature[grid.axes.index(axis)]
    assert sum(len(v) - 2 for v in lines.values()) > 900  # measured points with a neighbour each side
    assert scores[chosen] == pytest.approx(min(scores.values()), rel=1e-9, abs=1e-15)
    if axis == "batch_size":  # this line family is not affine in batch: the fit leaves linear
        assert chosen != 0.0 and scores[chosen] < scores[0.0]


def test_local_only_table_needs_no_model(db: modperf.Database) -> None:
    answer = db.query(**GQA_GEN, num_heads=32, batch_size=16, step=1023)
    assert answer.native is None and answer.kind == "exact"
    via_model = db.query(**GQA_GEN, native_heads=64, tp_size=2, batch_size=16, step=1023)
    assert via_model.latency_ms == answer.latency_ms and via_model.local == 32


def test_extrapolation_is_labelled_and_limited(db: modperf.Database) -> None:
    beyond = db.query(**GB300, model="deepseek-ai/DeepSeek-V3", num_heads=256, batch_size=4, isl=1024)
    assert beyond.kind == "extrapolated" and beyond.locals_used == (128,)
    assert beyond.extrapolation["outside_axes"] == ["num_heads"]
    assert beyond.extrapolation["distance_octaves"] == pytest.approx(math.log2(257 / 129), abs=1e-6)
    assert beyond.latency_ms > db.query(**GB300, model="deepseek-ai/DeepSeek-V3", num_heads=128, batch_size=4,
                                        isl=1024).latency_ms
    with pytest.raises(E.OutOfCoverageError, match=r"beyond the extrapolation limit"):
        db.query(**GB300, model="deepseek-ai/DeepSeek-V3", num_heads=512, batch_size=4, isl=1024)


def test_missing_native_is_refused_naming_the_natives_present(db: modperf.Database) -> None:
    with pytest.raises(E.NotCoveredError) as info:
        db.query(**K3_ROWS, native_heads=64, tp_size=8, batch_size=4, isl=1024)
    assert info.value.values["natives_present"] == [96, 128]
    assert "has no native-64 bucket for this key; it holds native head counts 96, 128" in str(info.value)
    assert "allow_substitute=True (--allow-substitute) to answer from the nearest (96)" in str(info.value)


def test_substitution_takes_the_nearest_native_and_says_so(db: modperf.Database) -> None:
    answer = db.query(**K3_ROWS, native_heads=64, tp_size=8, batch_size=4, isl=1024, allow_substitute=True)
    assert (answer.requested_native, answer.native, answer.local) == (64, 96, 8)
    assert answer.substitution == ("native 64 is not measured in this table; answered from the nearest native "
                                   "bucket, 96 (allow_substitute)")
    assert [answer.latency_ms] == stored(db, K3_ROWS, model="moonshotai/Kimi-K3", num_heads=8, batch_size=4,
                                         isl=1024)
    assert answer.substituted_from == 96


def test_tp_that_does_not_divide_native_is_an_error(db: modperf.Database) -> None:
    with pytest.raises(E.ShardError, match=r"tp_size=3 does not divide the native head count 128"):
        db.query(**GB300, model="deepseek-ai/DeepSeek-V3", tp_size=3, batch_size=4, isl=1024)


def test_unknown_and_missing_fields_list_the_key_columns(db: modperf.Database) -> None:
    keys = ("mla_context_module keys: op_name, kernel_source, mla_dtype, kv_cache_dtype, gemm_type, batch_size, "
            "isl, step; heads: model or native_heads, and tp_size or num_heads")
    v3 = dict(GB300, model="deepseek-ai/DeepSeek-V3")
    with pytest.raises(E.QueryFieldError) as info:
        db.query(**v3, tp_size=8, batch_size=4, isl=1024, seq_len=3)
    assert str(info.value).startswith("unknown field(s) 'seq_len' for table mla_context_module")
    assert info.value.fix == keys
    q = {k: v for k, v in v3.items() if k != "kernel_source"}
    with pytest.raises(E.QueryFieldError) as info:
        db.query(**q, tp_size=8, batch_size=4, isl=1024)
    assert str(info.value).startswith(
        "missing field 'kernel_source' (the table holds 2 values for the fields given: FLASHINFER_MLA, FLASH_ATTN)")
    assert info.value.fix == keys
    # a key the other fields pin down may be left out: FLASH_ATTN rows here are bfloat16 only
    q = {k: v for k, v in v3.items() if k != "mla_dtype"}
    answer = db.query(**q, tp_size=8, batch_size=4, isl=1024)
    assert answer.fields["mla_dtype"] == "bfloat16"
    assert answer.latency_ms == db.query(**v3, tp_size=8, batch_size=4, isl=1024).latency_ms
    with pytest.raises(E.QueryFieldError, match=r"missing the shard: give tp_size"):
        db.query(**v3, batch_size=4, isl=1024)
    with pytest.raises(E.QueryFieldError, match=r"keys \[native\]\[local\].*give model or native_heads"):
        db.query(**GB300, num_heads=16, batch_size=4, isl=1024)


def test_unknown_model_says_how_to_add_it(db: modperf.Database) -> None:
    with pytest.raises(E.UnknownModelError, match=r"no HF config for model 'acme/Nope'"):
        db.query(**GB300, model="acme/Nope", tp_size=8, batch_size=4, isl=1024)


def test_reused_slot_answers_from_its_donor(db: modperf.Database) -> None:
    q = dict(GQA_GEN, system="b200_sxm", version="0.22.0", kernel_source="vllm_flashinfer_trtllmdecode")
    answer = db.query(**q, num_heads=32, batch_size=16, step=1023)
    assert answer.reused_from == "0.24.0" and answer.version == "0.22.0"
    assert answer.files[0].endswith("b200_sxm/attention/vllm/0.24.0/generation_attention_perf.parquet")
    assert [answer.latency_ms] == stored(db, dict(q, version="0.24.0"), num_heads=32, batch_size=16, step=1023)


def test_vectorised_matches_single_queries(db: modperf.Database) -> None:
    rng = np.random.default_rng(7)
    batch = rng.integers(1, 128, 300)
    isl = rng.integers(16, 8192, 300)
    lat, kinds = db.query_many(**GB300, model="deepseek-ai/DeepSeek-V3", tp_size=8, batch_size=batch, isl=isl)
    for b, s, got, kind in zip(batch, isl, lat, kinds):
        try:
            one = db.query(**GB300, model="deepseek-ai/DeepSeek-V3", tp_size=8, batch_size=int(b), isl=int(s))
        except E.OutOfCoverageError:
            assert kind == -1 and math.isnan(got)
            continue
        assert kind == {"exact": 0, "interpolated": 1, "extrapolated": 2}[one.kind]
        assert got == pytest.approx(one.latency_ms, rel=1e-9)
    assert set(kinds.tolist()) == {-1, 1, 2} and (kinds == 1).sum() > 50


def test_monotone_where_the_data_is_monotone(db: modperf.Database) -> None:
    # past 1k cached tokens decode latency of this bucket grows with the cached length at every
    # batch (below, launch noise makes it wobble): there the answers must grow too
    for batch in (1, 16, 128):
        path = db.ref("h200_sxm", "vllm", "0.24.0", "generation_attention").path
        rows = pq.read_table(path).to_pydict()
        line = sorted((s, lat) for i, (s, lat) in enumerate(zip(rows["step"], rows["latency"]))
                      if all(rows[k][i] == v for k, v in GQA_GEN.items() if k in rows)
                      and rows["num_heads"][i] == 32 and rows["batch_size"][i] == batch and s >= 1023)
        measured = [lat for _, lat in line]
        assert measured == sorted(measured), f"batch {batch}: the data itself is not monotone here"
        steps = np.arange(1023, line[-1][0] + 1, 37)
        lat, kinds = db.query_many(**GQA_GEN, num_heads=32, batch_size=batch, step=steps)
        assert (kinds >= 0).all() and (np.diff(lat) >= 0).all()


def test_gemm_tables_answer_without_a_head_axis(db: modperf.Database) -> None:
    import pyarrow.parquet as pq

    slot = dict(table="gemm", system="h200_sxm", backend="vllm", version="0.24.0")
    raw = pq.read_table(db.ref("h200_sxm", "vllm", "0.24.0", "gemm").path).to_pydict()
    row = next(i for i in range(len(raw["m"])) if (raw["m"][i], raw["n"][i], raw["k"][i], raw["gemm_dtype"][i])
               == (1024, 4096, 7168, "bfloat16"))
    exact = db.query(**slot, gemm_dtype="bfloat16", m=1024, n=4096, k=7168)
    assert exact.kind == "exact" and exact.latency_ms == raw["latency"][row]
    assert exact.fields["kernel_source"] == "torch.nn.functional.linear" and "num_heads" not in exact.fields
    between = db.query(**slot, gemm_dtype="bfloat16", m=1000, n=4096, k=7168)
    below = db.query(**slot, gemm_dtype="bfloat16", m=768, n=4096, k=7168)
    assert between.kind == "interpolated" and below.latency_ms < between.latency_ms < exact.latency_ms


# --- bounds and strict fields (modperf.base.limits) -------------------------------------------------

KIMI = dict(GB300, model="moonshotai/Kimi-K3", tp_size=3)


@settings(max_examples=40, deadline=None)
@given(field=st.sampled_from(["batch_size", "isl", "tp_size", "native_heads", "num_heads"]),
       value=st.one_of(st.integers(max_value=0), st.integers(min_value=2**22 + 1), st.just(2**62), st.just(2**70)))
def test_numbers_outside_their_range_are_usage_errors(db, field, value):
    """batch_size 0 and isl 0 used to be answered ('extrapolated'); 2**62 heads wrapped."""
    fields = {**KIMI, "batch_size": 4, "isl": 2048}
    if field == "native_heads":
        fields.pop("model")
    if field == "num_heads":
        fields.pop("tp_size")
    fields[field] = value
    with pytest.raises(E.QueryFieldError) as info:
        db.query(**fields)
    assert info.value.values["field"] == field and info.value.exit_code == 2
    assert f"{field} must be an integer in" in info.value.detail


@pytest.mark.parametrize("fields, message", [
    (dict(allow_substitute="false"), "allow_substitute must be true or false"),
    (dict(allow_substitute=0), "allow_substitute must be true or false"),
    (dict(self=1), "unknown field(s) 'self' for table mla_context_module"),
    (dict(batch_size="\u00b2"), "batch_size must be an integer in 1..1,048,576"),
    (dict(batch_size=True), "batch_size must be an integer in 1..1,048,576"),
    (dict(isl=[2048]), "field 'isl' must be a string, a number or a boolean, not a list"),
    (dict(mla_dtype=["bfloat16"]), "field 'mla_dtype' must be a string, a number or a boolean, not a list"),
])
def test_fields_are_parsed_strictly(db, fields, message):
    with pytest.raises(E.QueryFieldError, match=message.replace("(", r"\(").replace(")", r"\)")):
        db.query(**{**KIMI, "batch_size": 4, "isl": 2048, **fields})
    assert db.query(**KIMI, batch_size=4, isl=2048, allow_substitute=False).latency_ms == 0.7945


def test_a_value_that_is_not_a_scalar_is_refused_alike_with_or_without_its_plan_cached():
    """A batch line's error must not depend on whether an earlier line resolved its plan."""
    fresh = modperf.open(cache=False)
    cases = [({**KIMI, "batch_size": [4], "isl": 2048}, "batch_size"),
             ({**KIMI, "batch_size": None, "isl": [2048]}, "isl")]  # (an axis left null before it)
    for fields, name in cases:
        with pytest.raises(E.QueryFieldError, match=f"field '{name}' must be a string, a number or a boolean, "
                                                    "not a list"):
            fresh.query(**fields)
    assert fresh.query(**KIMI, batch_size=4, isl=2048).latency_ms == 0.7945  # the plan is cached now
    for fields, name in cases:
        with pytest.raises(E.QueryFieldError, match=f"field '{name}' must be a string, a number or a boolean, "
                                                    "not a list"):
            fresh.query(**fields)


def test_query_many_checks_its_arrays(db):
    base = {k: v for k, v in KIMI.items()}
    lat, _ = db.query_many(**base, batch_size=np.array([4, 8]), isl=2048)
    assert lat.tolist()[0] == 0.7945
    for bad in (np.array([4, 0]), np.array([4.0, np.nan]), np.array([np.nan, 4.0]), np.array([4, 2**40]),
                np.array([True, False])):
        with pytest.raises(E.QueryFieldError, match=r"field 'batch_size' must hold numbers in 1\.\.1,048,576"):
            db.query_many(**base, batch_size=bad, isl=2048)


def test_query_many_refuses_bad_values_with_typed_errors(db):
    """Values that once escaped as raw TypeError/ValueError/AttributeError: a list holding None,
    a scalar axis given as None or a word, arrays whose shapes do not broadcast."""
    base = {k: v for k, v in KIMI.items()}
    for arrays in ({"batch_size": [4, None]}, {"batch_size": [None, 4]}, {"batch_size": np.array(["4", "8"])}):
        with pytest.raises(E.QueryFieldError, match=r"field 'batch_size' must hold numbers in 1\.\.1,048,576"):
            db.query_many(**base, **arrays, isl=2048)
    with pytest.raises(E.QueryFieldError, match=r"^missing field 'isl'"):
        db.query_many(**base, batch_size=np.array([4, 8]), isl=None)
    with pytest.raises(E.QueryFieldError, match=r"^isl must be an integer in 1\.\.4,194,304 \(tokens\)"):
        db.query_many(**base, batch_size=np.array([4, 8]), isl="many")
    with pytest.raises(E.QueryFieldError, match=r"^the arrays' shapes \{'batch_size': \[2\], 'isl': \[3\]\} do not"):
        db.query_many(**base, batch_size=np.array([4, 8]), isl=np.array([2048, 4096, 8192]))
    lat, _ = db.query_many(**base, batch_size=np.array([4, 8]), isl="2048")  # a digit string, as a query reads it
    assert lat.tolist()[0] == 0.7945


def test_query_many_reuses_its_plan_only_for_the_same_fields(db):
    """The vectorised plan is cached by the scalar fields and which fields are arrays: a second
    call with another shard or another array answers like single queries, never from the
    first call's plan."""
    base = {k: v for k, v in KIMI.items() if k not in ("tp_size", "num_heads")}
    batch = np.array([4, 8, 16])
    for tp in (8, 4, 8):
        lat, _ = db.query_many(**base, tp_size=tp, batch_size=batch, isl=2048)
        singles = [db.answer({**base, "tp_size": tp, "batch_size": int(b), "isl": 2048}, quality=False)
                   for b in batch]
        assert [x.hex() for x in lat.tolist()] == [s.latency_ms.hex() for s in singles]
    lat, _ = db.query_many(**base, tp_size=8, batch_size=4, isl=np.array([2048, 4096]))
    assert lat.tolist() == [db.answer({**base, "tp_size": 8, "batch_size": 4, "isl": i}, quality=False).latency_ms
                            for i in (2048, 4096)]


# --- the single query's fast path against the reference path ---------------------------------

MLA_TRTLLM = dict(table="mla_context_module", system="h200_sxm", backend="trtllm", version="1.3.0rc20",
                  model="deepseek-ai/DeepSeek-V3", tp_size=8)
#: A group with quality findings (modperf.data.quality), heads 8 and 16 measured: answers list notes.
DSV4_GEN = dict(table="dsv4_csa_generation_module", system="h200_sxm", backend="sglang", version="0.5.14",
                native_heads=64, kernel_source="compressed_flashmla", mla_dtype="bfloat16",
                kv_cache_dtype="fp8_e4m3", gemm_type="bfloat16", compress_ratio=4)

#: A table whose backend picks the kernel by shape (a lane rule): isl + step past 2048 runs the
#: indexer lane, a grid of its own.
DSA_LANES = dict(table="dsa_context_module", system="h200_sxm", backend="sglang", version="0.5.14",
                 model="deepseek-ai/DeepSeek-V3.2", tp_size=8, isl=1024, step=0)


def _outcome(call, *args, **kwargs) -> tuple:
    """An answer as its kind, its dict's text (latency as hex: every bit) and the types of its
    fields, or the error's type, message and values."""
    try:
        a = call(*args, **kwargs)
    except E.ModperfError as e:
        return (type(e).__name__, str(e), repr(e.values))
    d = a.to_dict()
    return (a.kind, d["latency_ms"].hex(), repr(d), [type(v) for v in a.fields.values()])


def _variants(db: modperf.Database, base: dict, heads: list[int]) -> list[dict]:
    """Queries of ``base``'s grid: each axis a measured value, a value between two, past either
    end or far past; and the same points with an axis as a bool, a digit string, a float, a
    numpy integer, out of its range, None or left out."""
    grid = db.queries.grid(base)
    rng = np.random.default_rng(3)
    axes = [(a, v) for a, v in zip(grid.axes, grid._values_py) if a != "num_heads"]
    out = []
    for h in heads or [None]:
        for _ in range(60):
            q = dict(base) if h is None else dict(base, num_heads=h)
            for a, vals in axes:
                i = int(rng.integers(len(vals)))
                q[a] = [vals[i], (vals[i] + vals[min(i + 1, len(vals) - 1)]) // 2, vals[-1] + 1,
                        max(vals[0] - 1, 0), 4 * vals[-1] + 7][int(rng.integers(5)) if rng.integers(3) else 0]
            out.append(q)
    if heads:  # the points with quality findings, and points between them and their neighbours
        engine = db.queries
        first = {**base, "num_heads": heads[0], **{a: v[0] for a, v in axes}}
        found = engine.quality_found(engine.plan(first))
        for (h, coords) in sorted(found[0]) if found else ():
            at = dict(zip((a for a, _ in axes), coords))
            out.append({**base, "num_heads": h, **at})
            for a, vals in axes:
                i = vals.index(at[a])
                if i > 0:
                    out.append({**base, "num_heads": h, **at, a: (vals[i - 1] + vals[i]) // 2})
                    out.append({**base, "num_heads": 12, **at, a: (vals[i - 1] + vals[i]) // 2})
            out.append({**base, "num_heads": 12, **at})
    odd = [True, False, "8", " 16", "x", 8.0, 8.5, float("nan"), np.int64(8), np.uint8(2), -1, 0, 2**40, None]
    for q in list(out[:40]):
        for a, _ in axes:
            for v in odd:
                out.append({**q, a: v})
            out.append({k: v for k, v in q.items() if k != a})
    return out


@pytest.mark.parametrize("base,heads", [(MLA_TRTLLM, []), (DSV4_GEN, [8, 12, 16]), (DSA_LANES, []),
                                        (dict(DSA_LANES, isl=4096), [])])
def test_single_queries_answer_as_the_reference_path(db: modperf.Database, base: dict, heads: list[int],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``query`` (the fast path where every axis value is a plain int in its range, through the
    cached plan, the exact-hit index and Grid.between for one axis between lattice values)
    against the reference path (a freshly resolved plan, every field parsed by modperf.base.limits,
    the grid's general lookup): the same answers bit for bit, quality notes included, and the
    same errors; for every kind of point and value."""
    engine = db.queries
    between = Grid.between
    took: dict[bool, int] = {True: 0, False: 0}  # Grid.between answered / declined

    def counted(grid: Grid, point: list[int], a: int, cell: int) -> tuple | None:
        got = between(grid, point, a, cell)
        took[got is not None] += 1
        return got

    monkeypatch.setattr(Grid, "between", counted)
    kinds: dict[str, int] = {}
    notes = 0
    queries = _variants(db, base, heads)
    if base["table"] == DSA_LANES["table"]:  # every cell of the first lane's lattice near the lanes' boundary
        grid = engine.grid(base)
        axes = dict(zip(grid.axes, grid._values_py))
        queries += [dict(base, batch_size=b, isl=i, step=p) for b in axes["batch_size"][:3]
                    for i in axes["isl"][-4:] for p in axes["step"]]
    for q in queries:
        for quality in (True, False):
            for diagnose in (True, False):
                fast = _outcome(engine.query, q, quality=quality, diagnose=diagnose)
                try:
                    plan = engine.resolve(q)
                except E.ModperfError:
                    plan = None
                ref = _outcome(engine.resolve, q) if plan is None else \
                    _outcome(engine.answer_of, plan, q, quality=quality, diagnose=diagnose)
                assert fast == ref, q
        got = _outcome(engine.query, q)
        kinds[got[0]] = kinds.get(got[0], 0) + 1
        notes += len(got) == 4 and "'quality': [" in got[2]
    assert {"exact", "interpolated", "extrapolated", "OutOfCoverageError", "QueryFieldError"} <= set(kinds)
    assert took[True] > 0 and took[False] > 0, took  # both of Grid.between's outcomes compared
    if base is DSV4_GEN:
        assert notes > 0  # exact and blended answers with quality notes
    if base["table"] == DSA_LANES["table"]:  # both lanes answered (points of either lane's lattice)
        lanes = {engine.query(q).lane["kernel_source"] for q in _variants(db, base, heads)[:60]
                 if _outcome(engine.query, q)[0] in ("exact", "interpolated", "extrapolated")}
        assert lanes == {"sglang_dsa_dense_mha_fa3", "sglang_dsa_indexer_flashmla_sparse"}


def test_query_many_of_one_point_answers_as_the_vectorised_path(db: modperf.Database) -> None:
    """A one-point call (answered by the scalar lookup where it is exact or between measured
    points) against the same point in a two-point call (the vectorised path): the same latency
    bits, kind, dtypes; the shape of the arrays given; everything else through the vectorised
    path (extrapolated, refused, floats, lists, out of range)."""
    grid = db.queries.grid(MLA_TRTLLM)
    vals = dict(zip(grid.axes, grid._values_py))
    rng = np.random.default_rng(9)
    kinds = set()
    for _ in range(300):
        point = {}
        for a in ("batch_size", "isl"):
            v = vals[a]
            i = int(rng.integers(len(v)))
            point[a] = [v[i], (v[i] + v[min(i + 1, len(v) - 1)]) // 2, v[-1] + 1, 3 * v[-1]][int(rng.integers(4))]
        for shape, dtype in (((1,), np.int64), ((), np.int32), ((1, 1), np.uint32)):
            one = db.query_many(**MLA_TRTLLM, **{a: np.full(shape, x, dtype=dtype) for a, x in point.items()})
            two = db.query_many(**MLA_TRTLLM, **{a: np.array([x, x]) for a, x in point.items()})
            assert one.latency_ms.shape == one.kind.shape == shape
            assert (one.latency_ms.dtype, one.kind.dtype) == (two.latency_ms.dtype, two.kind.dtype)
            assert one.latency_ms.ravel()[0].tobytes() == two.latency_ms[0].tobytes()
            assert one.kind.ravel()[0] == two.kind[0]
            kinds.add(int(two.kind[0]))
            # a scalar axis beside an array one; the step the plan fixes left out or given
            mixed = db.query_many(**MLA_TRTLLM, batch_size=np.full(shape, point["batch_size"]), isl=point["isl"],
                                  **({} if shape == () else {"step": 0}))
            assert mixed.latency_ms.ravel()[0].tobytes() == two.latency_ms[0].tobytes()
    assert kinds == {0, 1, 2, -1}
    for odd in ([4], np.array([4.0]), np.array([True]), np.array([2**30])):
        try:
            one = db.query_many(**MLA_TRTLLM, batch_size=odd, isl=np.array([2048]))
        except E.QueryFieldError as e:
            assert "batch_size" in str(e)
        else:
            two = db.query_many(**MLA_TRTLLM, batch_size=np.array([4, 4]), isl=np.array([2048, 2048]))
            assert one.latency_ms.tobytes() == two.latency_ms[:1].tobytes()


@pytest.mark.parametrize("slot", [("h200_sxm", "trtllm", "1.3.0rc20", "generation_attention"),
                                  ("h200_sxm", "sglang", "0.5.14", "dsv4_csa_generation_module")])
def test_quality_notes_group_by_group_are_the_whole_tables(db: modperf.Database, slot: tuple[str, ...]) -> None:
    """A table past QUALITY_WHOLE_POINTS has its notes assessed group by group: every group's
    notes (points, values, references, order) are those of the whole-table assessment."""
    engine = db.queries
    keyed = engine.store.table(*slot)
    by_group = QueryEngine(engine.store, engine.models)
    by_group.QUALITY_WHOLE_POINTS = 0
    noted = 0
    for group in engine.index(keyed).groups:
        whole = engine._findings(keyed, group)
        assert by_group._findings(keyed, group) == whole
        noted += bool(whole)
    assert noted > 0
    assert by_group._quality_index == {}  # never assessed whole
