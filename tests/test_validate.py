"""One test per guard: each builds a bad variant of a real corpus table and asserts the exact
error type and the key parts of its message (file, rows, values, fix)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers import patched, set_col, variant

from modperf import errors as E
from modperf.data.catalog import TableRef, refs_for_paths
from modperf.data.loader import load_one
from modperf.specs.models import ModelRegistry

MLA_MODULE = ("h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module")  # DeepSeek-V3, tp=1 sweep
DSV4_GEN = ("h200_sxm", "sglang", "0.5.14", "dsv4_csa_generation_module")  # Flash-FP8 + Pro-FP8 tp chains
GLM5_TOPK = ("h200_sxm", "sglang", "0.5.14", "glm5_topk_module")  # native-keyed, zero latencies by contract


def failures(ref: TableRef, models: ModelRegistry) -> list[E.ModperfError]:
    result = load_one(ref, models)
    assert result.keyed is None, "the variant should have been rejected"
    return result.failures


def only(fs: list[E.ModperfError], cls: type[E.ModperfError]) -> E.ModperfError:
    assert [type(f) for f in fs] == [cls], [str(f) for f in fs]
    return fs[0]


def test_the_base_tables_load(db, models):
    for slot in (MLA_MODULE, DSV4_GEN, GLM5_TOPK):
        assert load_one(db.ref(*slot), models).ok


def test_unreadable_truncated_parquet(db, models, tmp_path):
    src = db.ref(*MLA_MODULE).path
    out = tmp_path / "h200_sxm" / "mla" / "trtllm" / "1.3.0rc20" / src.name
    out.parent.mkdir(parents=True)
    out.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    f = only(failures(refs_for_paths([out])[0], models), E.UnreadableTableError)
    assert f.file == str(out)
    assert str(f).startswith(f"{out}: cannot read table:")
    assert "the file is truncated or not a parquet/CSV table" in f.fix


def test_missing_num_heads_points_to_migrate(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: t.drop_columns(["num_heads"]))
    f = only(failures(ref, models), E.MissingColumnError)
    assert f.values == {"table": "mla_context_module", "column": "num_heads"}
    assert "no num_heads column: legacy layout whose head axis is unknown (nothing is backfilled)" in str(f)
    # the table names each row's model: migrate takes the native from it; a parquet original is never replaced
    assert f.fix == (f"run `modperf migrate {ref.path} --out {ref.path.parent / 'migrated'}` (a dry run: it prints "
                     "the plan; add --execute to write)")


def test_missing_tp_size_and_model_are_both_reported(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: t.drop_columns(["tp_size", "model"]))
    fs = failures(ref, models)
    assert [type(f) for f in fs] == [E.MissingColumnError, E.MissingColumnError]
    assert [f.values["column"] for f in fs] == ["tp_size", "model"]
    assert "tp_size is mandatory in module tables" in fs[0].fix
    assert "no model column: the native head count cannot be derived" in str(fs[1])


def test_non_integer_heads(db, models, tmp_path):
    def mutate(t):
        heads = t.column("num_heads").to_numpy().astype(float)
        heads[[10, 11]] = [21.5, 42.25]
        return set_col(t, "num_heads", heads)

    f = only(failures(variant(db, tmp_path, MLA_MODULE, mutate), models), E.NonIntegerHeadsError)
    assert f.rows == [10, 11] and f.row_count == 2
    assert f.values == {"column": "num_heads", "examples": [21.5, 42.25]}
    assert "rows 10, 11: 'num_heads' holds non-integer values" in str(f)


def test_wrong_dtypes(db, models, tmp_path):
    def mutate(t):
        t = set_col(t, "num_heads", t.column("num_heads").to_numpy().astype(float))  # whole numbers, wrong type
        return set_col(t, "latency", pc.cast(t.column("latency"), pa.string()))

    fs = failures(variant(db, tmp_path, MLA_MODULE, mutate), models)
    assert [type(f) for f in fs] == [E.ColumnTypeError, E.ColumnTypeError]
    assert "column 'num_heads' is double, expected an integer type" in str(fs[0])
    assert fs[0].fix == "store 'num_heads' as int64 (its values are whole numbers)"
    assert "column 'latency' is string, expected float (ms)" in str(fs[1])


def test_null_values(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: patched(t, "kernel_source", {3: None, 9: None}))
    f = only(failures(ref, models), E.NullValueError)
    assert f.rows == [3, 9] and "null 'kernel_source'" in str(f)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -0.5])
def test_invalid_latency(db, models, tmp_path, bad):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: patched(t, "latency", {7: bad}))
    f = only(failures(ref, models), E.InvalidLatencyError)
    assert f.rows == [7]
    assert "row 7: latency must be finite and > 0 ms" in str(f)
    assert f.fix.startswith("re-measure these rows")


def test_invalid_heads(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: patched(t, "num_heads", {0: 0, 1: -8}))
    f = only(failures(ref, models), E.InvalidHeadsError)
    assert f.rows == [0, 1] and f.values == {"column": "num_heads", "examples": [0, -8]}


def test_unknown_model(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: patched(t, "model", {5: "acme/Nope-1T"}))
    f = only(failures(ref, models), E.UnknownModelError)
    assert f.rows == [5] and f.values["model"] == "acme/Nope-1T"
    assert "acme--Nope-1T_config.json" in f.fix


def test_architecture_mismatch(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: patched(t, "architecture", {2: "LlamaForCausalLM"}))
    f = only(failures(ref, models), E.ArchitectureMismatchError)
    assert f.rows == [2]
    assert f.values == {"model": "deepseek-ai/DeepSeek-V3", "architecture": "LlamaForCausalLM",
                        "config_architectures": ["DeepseekV3ForCausalLM"]}


def test_unexpected_column_fails_closed(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: t.append_column("page_size", pa.array([64] * t.num_rows)))
    f = only(failures(ref, models), E.UnexpectedColumnError)
    assert "column 'page_size' is not declared for table mla_context_module (family mla_module)" in str(f)


@pytest.mark.parametrize("chunk", [None, 100])
def test_rank_local_guard(db, models, tmp_path, monkeypatch, chunk):
    """The guard runs a chunk of rows at a time: the same row whichever chunk it falls in."""
    if chunk is not None:
        import modperf.data.validate as validate

        monkeypatch.setattr(validate, "_CHUNK", chunk)
    raw = pq.read_table(db.ref(*DSV4_GEN).path)
    tp = raw.column("tp_size").to_numpy()
    model = np.array(raw.column("model").to_pylist())
    row = int(np.flatnonzero((tp == 2) & (model == "sgl-project/DeepSeek-V4-Flash-FP8"))[0])
    ref = variant(db, tmp_path, DSV4_GEN, lambda t: patched(t, "num_heads", {row: 64}))
    f = only(failures(ref, models), E.RankLocalError)
    assert f.rows == [row]
    assert f.values == {"model": "sgl-project/DeepSeek-V4-Flash-FP8", "num_heads": 64, "tp_size": 2, "native": 64,
                        "expected_num_heads": 32}
    assert "tp_size > 1 row is not rank-local: num_heads * tp_size != native" in str(f)


def test_stale_fingerprint(db, models, tmp_path):
    # every Pro-FP8 row back to the retired native convention: 128 at every tp
    def mutate(t):
        model = np.array(t.column("model").to_pylist())
        heads = t.column("num_heads").to_numpy().copy()
        heads[model == "sgl-project/DeepSeek-V4-Pro-FP8"] = 128
        return set_col(t, "num_heads", heads)

    ref = variant(db, tmp_path, DSV4_GEN, mutate)
    f = only(failures(ref, models), E.StaleConventionError)
    assert f.row_count == 1600
    assert f.values == {"model": "sgl-project/DeepSeek-V4-Pro-FP8", "num_heads": 128, "tp_sizes": [1, 2, 4, 8]}
    assert f.fix == (f"run `modperf migrate {ref.path}` (a dry run: it prints the plan; add --execute to rewrite the "
                     "file): num_heads becomes native // tp_size")


def test_native_contract_of_sparse_kernels(db, models, tmp_path):
    ref = variant(db, tmp_path, GLM5_TOPK, lambda t: patched(t, "num_heads", {4: 32}))
    f = only(failures(ref, models), E.NativeContractError)
    assert f.rows == [4] and f.values["native"] == 64 and f.values["num_heads"] == 32
    assert "do not migrate it" in f.fix


def test_zero_latency_only_where_topk_is_a_noop(db, models, tmp_path):
    raw = pq.read_table(db.ref(*GLM5_TOPK).path)
    lat = raw.column("latency").to_numpy()
    kv = raw.column("isl").to_numpy() + raw.column("step").to_numpy()
    assert (lat == 0).sum() == 2444 and kv[lat == 0].max() == 2048  # GLM-5 index_topk
    row = int(np.flatnonzero(kv > 2048)[0])
    ref = variant(db, tmp_path, GLM5_TOPK, lambda t: patched(t, "latency", {row: 0.0}))
    f = only(failures(ref, models), E.InvalidLatencyError)
    assert f.rows == [row]
    assert "this table allows 0 only where 0 ms where (isl + step) // compress_ratio <= index_topk" in str(f)


def test_geometry_collision(db, tmp_path):
    base = json.loads(ModelRegistry.default().get("deepseek-ai/DeepSeek-V3").path.read_text())
    base["q_lora_rank"] = 3072
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "acme--Wide-V3_config.json").write_text(json.dumps(base))
    registry = ModelRegistry.default([configs])

    def mutate(t):
        return patched(t, "model", {r: "acme/Wide-V3" for r in range(100)})

    ref = variant(db, tmp_path, MLA_MODULE, mutate)
    f = only(failures(ref, registry), E.GeometryCollisionError)
    assert "models with different MLA attention module geometry share native bucket 128" in str(f)
    assert f.values["models"] == [["acme/Wide-V3"], ["deepseek-ai/DeepSeek-V3"]]
    assert f.values["differing_fields"] == {"q_lora_rank": [3072, 1536]}


def test_model_without_the_fields_the_module_reads(db, models, tmp_path):
    # Kimi-K2 shares GLM-5's native (64) but is not a DSA model: no indexer fields
    ref = variant(db, tmp_path, ("h200_sxm", "vllm", "0.24.0", "dsa_generation_module"),
                  lambda t: patched(t, "model", {0: "moonshotai/Kimi-K2-Instruct"}))
    fs = failures(ref, models)
    assert {type(f) for f in fs} == {E.ModelConfigError, E.ArchitectureMismatchError}
    cfg_err = next(f for f in fs if isinstance(f, E.ModelConfigError))
    assert "config of moonshotai/Kimi-K2-Instruct has no field 'index_n_heads' (the DSA attention module reads it)" in str(cfg_err)


def test_every_failure_is_collected(db, models, tmp_path):
    def mutate(t):
        t = patched(t, "latency", {1: float("nan")})
        t = patched(t, "model", {2: "acme/Nope"})
        return t.append_column("extra", pa.array([1] * t.num_rows))

    kinds = sorted(f.kind for f in failures(variant(db, tmp_path, MLA_MODULE, mutate), models))
    assert kinds == ["invalid_latency", "unexpected_column", "unknown_model"]

    def mutate_types(t):
        t = set_col(t, "step", t.column("step").to_numpy().astype(float))
        return patched(t, "op_name", {4: None})

    # unreadable columns stop the row checks, but every column problem is listed
    kinds = sorted(f.kind for f in failures(variant(db, tmp_path, MLA_MODULE, mutate_types), models))
    assert kinds == ["column_type", "null_value"]


# --- value ranges (modperf.base.limits, docs/limits.md) ----------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(heads=st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, 2**16, 2**16 + 1, 2**62, 2**63 - 1])))
def test_num_heads_is_checked_against_its_range(db, models, tmp_path_factory, heads: int) -> None:
    """A head count outside 1..65,536 is refused by the loader (it used to pass: 2**62 at tp 1)."""
    ref = variant(db, tmp_path_factory.mktemp("heads"), MLA_MODULE, lambda t: patched(t, "num_heads", {0: heads}))
    result = load_one(ref, models)
    invalid = [f for f in result.failures if isinstance(f, E.InvalidHeadsError)]
    if 1 <= heads <= 2**16:
        assert not invalid
    else:
        assert len(invalid) == 1 and invalid[0].rows == [0]
        assert invalid[0].values == {"column": "num_heads", "examples": [heads]}
        assert "'num_heads' must be an integer in 1..65,536 (attention heads)" in invalid[0].detail


def test_heads_that_wrap_int64_at_tp_4_are_refused(db, models, tmp_path):
    """num_heads = 2**62 + 32 at tp 4: num_heads * tp_size is 128 modulo 2**64, which matched
    DeepSeek-V4-Pro's native and passed; a query then interpolated between 128 and 4.6e18."""
    table = pq.read_table(db.ref(*DSV4_GEN).path)
    models_col, tps = table.column("model").to_pylist(), table.column("tp_size").to_pylist()
    row = next(i for i, (m, t) in enumerate(zip(models_col, tps)) if t == 4)
    assert (np.array([2**62 + 32], dtype=np.int64) * 4)[0] == 128  # the wraparound itself
    ref = variant(db, tmp_path, DSV4_GEN, lambda t: patched(t, "num_heads", {row: 2**62 + 32}))
    f = only(failures(ref, models), E.InvalidHeadsError)
    assert f.rows == [row] and f.values["examples"] == [2**62 + 32]


@pytest.mark.parametrize("column, value, cls", [("batch_size", 0, E.ValueRangeError), ("batch_size", 2**40, E.ValueRangeError),
                                                ("isl", -1, E.ValueRangeError), ("tp_size", 5000, E.InvalidHeadsError)])
def test_key_columns_are_checked_against_their_range(db, models, tmp_path, column, value, cls):
    ref = variant(db, tmp_path, DSV4_GEN, lambda t: patched(t, column, {3: value}))
    f = only(failures(ref, models), cls)
    assert f.rows == [3] and f.values == {"column": column, "examples": [value]}


def test_an_empty_table_is_a_failure(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: t.slice(0, 0))
    f = only(failures(ref, models), E.EmptyTableError)
    assert str(f) == f"{ref.path}: the table holds no rows: it can answer nothing. Fix: re-collect the table, or " \
                     "remove the file"


def test_duplicate_column_names(db, models, tmp_path):
    ref = variant(db, tmp_path, MLA_MODULE, lambda t: pa.Table.from_arrays([*t.columns, t.column("isl")],
                                                                          names=[*t.column_names, "isl"]))
    f = only(failures(ref, models), E.DuplicateColumnError)
    assert "column name(s) 'isl' appear more than once" in f.detail and f.values == {"columns": ["isl"]}


def test_a_file_that_is_not_a_table_is_not_quoted(models, tmp_path):
    """A CSV-named link to /etc/passwd: the reason says what is wrong, never a line of the file."""
    folder = tmp_path / "h200_sxm/mla/trtllm/0.20.0"
    folder.mkdir(parents=True)
    for name, text in (("context_mla_perf.txt", Path("/etc/passwd").read_text()),
                       ("generation_mla_perf.txt", "root:x:0:0:root:/root:/bin/bash\n1\n")):
        (folder / name).write_text(text)
        f = only(failures(refs_for_paths([folder / name])[0], models), E.UnreadableTableError)
        assert "root:" not in str(f) and "/bin/" not in str(f)
    assert "not a perf table" in str(f) or "CSV" in str(f)
