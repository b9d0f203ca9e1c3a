"""modperf.audit.migrate on real tables: the DeepSeek-V4 stale tables must come out equal to the
upstream migration, the legacy MLA-kernel CSVs must load and keep every latency, and every
refusal is typed, names the offending groups and leaves the files as they were."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.helpers import CSA_CTX, STALE_DIR, TWIN_DIR, snapshot, writable_copy

from modperf import errors as E
from modperf.audit.migrate import (
    LEGACY,
    NATIVE_KEYED,
    NO_TP_AXIS,
    NOTHING,
    RANK_LOCAL,
    REFUSED,
    REWRITE,
    STALE,
    UNREADABLE,
    WRITE,
    migrate,
)
from modperf.base.atomic import temp_files
from modperf.data.catalog import TableRef
from modperf.data.loader import load_table
from modperf.data.reader import read_table
from modperf.data.schema import corpus_schema
from modperf.fast.cache_keys import embedded_data_root
from modperf.specs.models import ModelRegistry

NATIVE_KEYED_DIR = "01_dsv4_stale_vs_migrated/native_keyed_kernel_93dfd1fd2"
V3 = "deepseek-ai/DeepSeek-V3"
CONTEXT_MLA_COLUMNS = ["framework", "version", "device", "op_name", "kernel_source", "mla_dtype", "kv_cache_dtype",
                       "num_heads", "batch_size", "isl", "tp_size", "step", "latency"]




def only(report, path_part: str = ""):
    plans = [p for p in report.files if path_part in str(p.source)]
    assert len(plans) == 1, [str(p.source) for p in report.files]
    return plans[0]




# --- stale native -> rank-local: the proof against the upstream migration ----------------------


def test_stale_dry_run_plans_every_group_and_writes_nothing(stale: Path) -> None:
    before = snapshot(stale)
    report = migrate([stale])
    assert report.ok and not report.executed and report.exit_code == 0
    assert [p.pattern for p in report.files] == [STALE] * 5
    assert [p.action for p in report.files] == [REWRITE] * 5
    plan = only(report, "b200_sxm/sparse_attention/sglang/0.5.10/dsv4_csa_context")
    assert plan.rows == 765 and plan.rows_changed == 574  # every tp>1 row: 564 + 4 + 6
    groups = {(g.model, g.version): g for g in plan.groups}
    assert set(groups) == {("sgl-project/DeepSeek-V4-Flash-FP8", "0.5.10rc0"), ("deepseek-ai/DeepSeek-V4-Flash", "0.5.10rc0"),
                           ("deepseek-ai/DeepSeek-V4-Pro", "0.5.10rc0")}
    pro = groups[("deepseek-ai/DeepSeek-V4-Pro", "0.5.10rc0")]
    assert (pro.rows, pro.native, pro.tp_sizes, pro.num_heads_before) == (8, 128, [1, 2, 4, 8], [128])
    assert pro.num_heads_after == {1: 128, 2: 64, 4: 32, 8: 16} and pro.status == "stale"
    flash = groups[("sgl-project/DeepSeek-V4-Flash-FP8", "0.5.10rc0")]
    assert (flash.rows, flash.native, flash.rows_changed) == (752, 64, 564)
    assert flash.num_heads_after == {1: 64, 2: 32, 4: 16, 8: 8}
    assert plan.target == plan.source
    assert snapshot(stale) == before
    assert sum(p.rows_changed for p in report.files) == 4135


def test_stale_migration_equals_the_upstream_migrated_twins(stale: Path, fixtures: Path) -> None:
    report = migrate([stale], execute=True)
    assert report.ok and report.executed
    assert all(p.written for p in report.files)
    assert all(p.verification == {"row_count": True, "schema": True, "other_columns_equal": True, "rank_local": True,
                                  "equals_plan": True, "strict_load": True, "modperf_check": True}
               for p in report.files)
    twins = sorted((fixtures / TWIN_DIR).rglob("*_perf.parquet"))
    assert len(twins) == 5
    for twin in twins:
        ours_path = stale / twin.relative_to(fixtures / TWIN_DIR)
        ours, theirs = pq.read_table(ours_path), pq.read_table(twin)
        # schema (names, types, nullability, field and schema metadata), row order, every column
        assert ours.schema.equals(theirs.schema, check_metadata=True)
        assert ours.schema.metadata == theirs.schema.metadata
        assert ours.equals(theirs, check_metadata=True)
        for name in theirs.column_names:
            assert ours.column(name).to_pylist() == theirs.column(name).to_pylist(), name
        # the file itself: same codec and row groups, and byte for byte the same apart from the
        # writer's version string in the footer (pyarrow 26.0.1 here, 24.0.0 upstream)
        ours_meta, theirs_meta = pq.read_metadata(ours_path), pq.read_metadata(twin)
        assert ours_meta.num_row_groups == theirs_meta.num_row_groups == 1
        assert ours_meta.row_group(0).column(0).compression == theirs_meta.row_group(0).column(0).compression == "ZSTD"
        ours_bytes = ours_path.read_bytes().replace(ours_meta.created_by.encode(), b"<created_by>")
        theirs_bytes = twin.read_bytes().replace(theirs_meta.created_by.encode(), b"<created_by>")
        assert ours_bytes == theirs_bytes
        assert oct(ours_path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())
    assert all(temp_files(p.parent) == [] for p in stale.rglob("*_perf.parquet"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_migrating_twice_is_a_no_op(stale: Path, fixtures: Path) -> None:
    migrate([stale], execute=True)
    again = migrate([stale])
    assert again.ok and [p.pattern for p in again.files] == [RANK_LOCAL] * 5
    assert [p.action for p in again.files] == [NOTHING] * 5
    twins = migrate([fixtures / TWIN_DIR])
    assert twins.ok and {p.action for p in twins.files} == {NOTHING}


def test_out_writes_in_the_data_root_layout_and_keeps_the_original(stale: Path, tmp_path: Path, fixtures: Path) -> None:
    before = snapshot(stale)
    out = tmp_path / "out"
    report = migrate([stale / CSA_CTX], execute=True, out=out)
    assert report.ok
    written = out / CSA_CTX
    assert only(report).target == written and written.is_file()
    assert pq.read_table(written).equals(pq.read_table(fixtures / TWIN_DIR / CSA_CTX), check_metadata=True)
    assert snapshot(stale) == before


def test_sparse_kernel_tables_are_never_touched(fixtures: Path, tmp_path: Path) -> None:
    folder = writable_copy(fixtures / NATIVE_KEYED_DIR, tmp_path / "native")
    before = snapshot(folder)
    report = migrate([folder], execute=True, model=V3)
    plan = only(report)
    assert report.ok and (plan.pattern, plan.action, plan.rows) == (NATIVE_KEYED, NOTHING, 1688)
    assert not plan.written and snapshot(folder) == before


def test_tables_without_tp_size_have_nothing_to_migrate(fixtures: Path) -> None:
    report = migrate([fixtures / "04_gqa_attention"])
    assert report.ok and {(p.pattern, p.action) for p in report.files} == {(NO_TP_AXIS, NOTHING)}


@pytest.mark.slow
def test_the_shipped_corpus_needs_no_migration() -> None:
    """No false positives: 363 head-bearing tables (tp=1 sweeps above native, two-native kernel
    chains, native-keyed kernels) are all current."""
    report = migrate([embedded_data_root()])
    assert report.ok, [str(f) for f in report.failures[:3]]
    assert len(report.files) == 363
    assert {p.action for p in report.files} == {NOTHING}
    assert {p.pattern for p in report.files} == {RANK_LOCAL, NO_TP_AXIS, NATIVE_KEYED}


# --- stale refusals ----------------------------------------------------------------------------


def _edit(path: Path, change) -> None:
    table = pq.read_table(path)
    pq.write_table(change(table), path, compression="zstd")


def _set_where(table: pa.Table, column: str, mask: pa.ChunkedArray, value) -> pa.Table:
    index = table.schema.get_field_index(column)
    field = table.schema.field(index)
    new = pc.if_else(mask, pa.scalar(value, field.type), table.column(column))
    return table.set_column(index, field, new)


def _model_is(table: pa.Table, model: str) -> pa.ChunkedArray:
    return pc.equal(table.column("model"), model)


def test_partly_stale_group_is_refused_with_the_group_and_nothing_is_written(stale: Path) -> None:
    path = stale / CSA_CTX
    # Flash-FP8's tp=8 rows already rank-local (8), its tp=2/4 rows still native (64)
    _edit(path, lambda t: _set_where(t, "num_heads",
                                     pc.and_(_model_is(t, "sgl-project/DeepSeek-V4-Flash-FP8"),
                                             pc.equal(t.column("tp_size"), 8)), 8))
    before = path.read_bytes()
    report = migrate([path], execute=True)
    plan = only(report)
    assert not report.ok and not report.executed and report.exit_code == 1
    assert (plan.pattern, plan.action, plan.written) == (STALE, REFUSED, False)
    (error,) = plan.refusals
    assert type(error) is E.PartlyStaleError and error.kind == "partly_stale"
    assert error.file == str(path) and error.row_count == 752
    assert [(g["model"], g["version"], g["tp_sizes"], g["num_heads"]) for g in error.values["groups"]] == [
        ("sgl-project/DeepSeek-V4-Flash-FP8", "0.5.10rc0", [1, 2, 4, 8], [8, 64])]
    assert "partly stale group(s)" in str(error) and "nothing is guessed" in str(error)
    assert path.read_bytes() == before


def test_heads_that_do_not_divide_are_refused(stale: Path) -> None:
    path = stale / CSA_CTX
    _edit(path, lambda t: _set_where(t, "tp_size", pc.and_(_model_is(t, "deepseek-ai/DeepSeek-V4-Pro"),
                                                           pc.equal(t.column("tp_size"), 8)), 3))
    plan = only(migrate([path]))
    (error,) = plan.refusals
    assert type(error) is E.HeadsNotDivisibleError
    (group,) = error.values["groups"]
    assert (group["model"], group["native"], group["tp_sizes"]) == ("deepseek-ai/DeepSeek-V4-Pro", 128, [1, 2, 3, 4])
    assert group["reason"] == "native 128 does not divide by tp_size [3]"


def test_constant_heads_that_are_not_the_native_are_refused(stale: Path) -> None:
    path = stale / CSA_CTX
    _edit(path, lambda t: _set_where(t, "num_heads", _model_is(t, "deepseek-ai/DeepSeek-V4-Flash"), 32))
    plan = only(migrate([path]))
    (error,) = plan.refusals
    assert type(error) is E.MigrationRefusedError
    (group,) = error.values["groups"]
    assert group["model"] == "deepseek-ai/DeepSeek-V4-Flash"
    assert "constant (32)" in group["reason"] and "native 64" in group["reason"]


def test_unknown_model_in_a_stale_table_is_refused(stale: Path) -> None:
    path = stale / CSA_CTX
    _edit(path, lambda t: _set_where(t, "model", _model_is(t, "deepseek-ai/DeepSeek-V4-Flash"), "acme/NoSuchModel"))
    plan = only(migrate([path]))
    assert [type(e) for e in plan.refusals] == [E.UnknownModelError]
    assert plan.refusals[0].row_count == 5 and "acme--NoSuchModel_config.json" in plan.refusals[0].fix


def test_null_head_axis_values_point_to_check(stale: Path) -> None:
    path = stale / CSA_CTX
    _edit(path, lambda t: t.set_column(t.schema.get_field_index("tp_size"), "tp_size",
                                       pc.if_else(_model_is(t, "deepseek-ai/DeepSeek-V4-Pro"),
                                                  pa.scalar(None, pa.int64()), t.column("tp_size"))))
    (error,) = only(migrate([path])).refusals
    assert type(error) is E.NullValueError and error.values == {"column": "tp_size"}
    assert "null 'tp_size' on 8 row(s)" in str(error) and f"modperf check {path}" in error.fix


# --- legacy tables without num_heads ------------------------------------------------------------


def test_legacy_without_model_is_refused_with_the_command_to_run(legacy: Path) -> None:
    report = migrate([legacy])
    assert report.exit_code == 2  # a missing flag is a usage error
    for plan in report.files:
        assert (plan.pattern, plan.action) == (LEGACY, REFUSED)
        (error,) = plan.refusals
        assert type(error) is E.ModelRequiredError
        assert "no default" in str(error) and f"modperf migrate {plan.source} --model MODEL_ID" in error.fix


def test_legacy_plan_says_what_fills_the_missing_columns(legacy: Path) -> None:
    report = migrate([legacy], model=V3)
    plan = only(report, "context_mla")
    assert (plan.pattern, plan.action, plan.rows, plan.format) == (LEGACY, WRITE, 1218, "csv")
    assert plan.target == legacy / "context_mla_perf.parquet"
    assert plan.filled["kernel_source"]["value"] == "default"
    assert "every TRTLLM context_mla table in the corpus (9 files)" in plan.filled["kernel_source"]["source"]
    assert plan.filled["num_heads"]["source"] == f"native 128 from {V3}'s config"
    (group,) = plan.groups
    assert group.num_heads_after == {1: 128, 2: 64, 4: 32, 8: 16, 16: 8, 32: 4, 64: 2}
    assert not (legacy / "context_mla_perf.parquet").exists()


def test_legacy_csv_migrates_to_the_corpus_schema_and_keeps_every_latency(legacy: Path) -> None:
    originals = snapshot(legacy)
    report = migrate([legacy], execute=True, model=V3)
    assert report.ok and all(p.written for p in report.files)
    assert {k: v for k, v in snapshot(legacy).items() if k in originals} == originals  # originals kept
    registry = ModelRegistry.default()
    for table, rows in (("context_mla", 1218), ("generation_mla", 2534)):
        out = legacy / f"{table}_perf.parquet"
        written = pq.read_table(out)
        assert written.schema.names == CONTEXT_MLA_COLUMNS
        assert written.schema.equals(corpus_schema(table).schema)
        assert [str(f.type) for f in written.schema] == ["string"] * 7 + ["int64"] * 5 + ["double"]
        keyed = load_table(TableRef(table, out), registry)
        assert keyed.rows_read == rows and keyed.n_points == rows and keyed.duplicates_merged == 0
        assert keyed.natives == [128]
        with open(legacy / f"{table}_perf.txt", newline="") as handle:
            source = list(csv.DictReader(handle))
        assert len(source) == rows
        for row in source:
            tp = int(row["tp_size"])
            key = (row["op_name"], "default", row["mla_dtype"], row["kv_cache_dtype"], 128 // tp)
            b = keyed.bucket_id(key)
            assert b is not None, key
            bucket = keyed.bucket(b)
            axes = bucket["axes"]
            hit = ((axes["batch_size"] == int(row["batch_size"])) & (axes["isl"] == int(row["isl"]))
                   & (axes["step"] == int(row["step"])))
            assert hit.sum() == 1
            assert bucket["latency"][hit][0] == float(row["latency"])  # exact, bit for bit
    # the first CSV line, as stored: TRTLLM,0.20.0,NVIDIA H200,mla_context,float16,fp8,1,16,1,0,0.014538666854302088
    ctx = pq.read_table(legacy / "context_mla_perf.parquet")
    assert ctx.slice(0, 1).to_pylist()[0] == {
        "framework": "TRTLLM", "version": "0.20.0", "device": "NVIDIA H200", "op_name": "mla_context",
        "kernel_source": "default", "mla_dtype": "float16", "kv_cache_dtype": "fp8", "num_heads": 128,
        "batch_size": 1, "isl": 16, "tp_size": 1, "step": 0, "latency": 0.014538666854302088,
    }


def test_legacy_target_that_exists_is_refused_unless_it_is_this_migration(legacy: Path) -> None:
    migrate([legacy], execute=True, model=V3)
    again = migrate([legacy], model=V3)  # the .txt files and their migrated parquet twins
    assert again.ok and {p.action for p in again.files} == {NOTHING}
    assert any("already migrated" in n for p in again.files for n in p.notes)
    target = legacy / "context_mla_perf.parquet"
    table = pq.read_table(target)
    pq.write_table(table.slice(1), target)  # someone else's file under that name
    (error,) = only(migrate([legacy / "context_mla_perf.txt"], model=V3)).refusals
    assert type(error) is E.TargetExistsError and error.file == str(target)
    assert "--out DIR" in error.fix


def test_legacy_parquet_needs_out_and_matches_the_csv_migration(legacy: Path, tmp_path: Path) -> None:
    source = read_table(legacy / "context_mla_perf.txt", as_stored=True, csv_types={"version": pa.string()})
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(source, folder / "context_mla_perf.parquet")
    (error,) = only(migrate([folder], model=V3)).refusals
    assert type(error) is E.TargetExistsError and "which migration keeps" in str(error)
    migrate([legacy / "context_mla_perf.txt"], execute=True, model=V3)
    report = migrate([folder], execute=True, model=V3, out=tmp_path / "out")
    assert report.ok
    assert pq.read_table(tmp_path / "out" / "context_mla_perf.parquet").equals(
        pq.read_table(legacy / "context_mla_perf.parquet"))


def test_legacy_column_the_corpus_does_not_decide_needs_fill(legacy: Path, tmp_path: Path) -> None:
    path = tmp_path / "context_mla_perf.txt"
    path.write_text((legacy / "context_mla_perf.txt").read_text().replace("TRTLLM,", "SGLang,"))
    (error,) = only(migrate([path], model=V3)).refusals
    assert type(error) is E.FillUndecidedError
    assert error.values == {"column": "kernel_source",
                            "corpus_values": {"trtllm_mla": 4, "flash_attention": 2, "triton": 2}}
    assert error.fix == "pass --fill kernel_source=VALUE with the value this collection used"
    plan = only(migrate([path], model=V3, fills={"kernel_source": "flash_attention"}))
    assert plan.ok and plan.filled["kernel_source"] == {"value": "flash_attention", "source": "--fill"}


def test_legacy_with_a_model_of_other_dims_is_refused(legacy: Path) -> None:
    plan = only(migrate([legacy / "context_mla_perf.txt"], model="meta-llama/Meta-Llama-3.1-8B"))
    kinds = [e.kind for e in plan.refusals]
    assert kinds[0] == "migration_refused" and "does not have the dims" in str(plan.refusals[0])
    assert "heads_not_divisible" in kinds  # native 32 does not divide by tp 64 either


def test_stale_kernel_table_without_model_column_needs_model(legacy: Path, tmp_path: Path) -> None:
    """A kernel table written with the native convention (num_heads = 128 on every tp)."""
    migrate([legacy / "context_mla_perf.txt"], execute=True, model=V3)
    rank_local = pq.read_table(legacy / "context_mla_perf.parquet")
    folder = tmp_path / "kernel"
    folder.mkdir()
    index = rank_local.schema.get_field_index("num_heads")
    stale_table = rank_local.set_column(index, rank_local.schema.field(index), pa.array([128] * rank_local.num_rows))
    pq.write_table(stale_table, folder / "context_mla_perf.parquet", compression="zstd")
    (error,) = only(migrate([folder])).refusals
    assert type(error) is E.ModelRequiredError and error.values["groups"][0]["tp_sizes"] == [1, 2, 4, 8, 16, 32, 64]
    report = migrate([folder], execute=True, model=V3)
    assert report.ok
    assert pq.read_table(folder / "context_mla_perf.parquet").equals(rank_local)


# --- bad input ------------------------------------------------------------------------------------


def test_truncated_parquet_and_csv_are_unreadable(stale: Path, legacy: Path) -> None:
    path = stale / CSA_CTX
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    plan = only(migrate([path], execute=True))
    assert (plan.pattern, plan.action) == (UNREADABLE, REFUSED)
    assert type(plan.refusals[0]) is E.UnreadableTableError and "truncated" in plan.refusals[0].fix
    csv_path = legacy / "context_mla_perf.txt"
    text = csv_path.read_text()
    csv_path.write_text(text[: len(text) // 2 - 7])  # cut inside a line
    plan = only(migrate([csv_path], model=V3))
    assert type(plan.refusals[0]) is E.UnreadableTableError


def test_unknown_model_flag_and_missing_path_are_usage_errors(stale: Path) -> None:
    with pytest.raises(E.UnknownModelError, match="no HF config for model 'acme/Nope'"):
        migrate([stale], model="acme/Nope")
    with pytest.raises(E.UnknownTableError, match="no such file or folder"):
        migrate([stale / "nope"])


def test_path_outside_the_output_folder_is_refused(stale: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "b200_sxm").symlink_to(elsewhere, target_is_directory=True)
    (error,) = only(migrate([stale / CSA_CTX], execute=True, out=out)).refusals
    assert type(error) is E.PathOutsideOutputError and error.values["resolved"].startswith(str(elsewhere))
    assert list(elsewhere.iterdir()) == []


def test_two_inputs_for_one_target_are_refused(fixtures: Path, tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copyfile(fixtures / STALE_DIR / CSA_CTX, tmp_path / name / "dsv4_csa_context_module_perf.parquet")
    report = migrate([tmp_path / "a", tmp_path / "b"], execute=True, out=tmp_path / "out")
    assert [type(p.refusals[0]) for p in report.files] == [E.TargetConflictError] * 2
    assert not (tmp_path / "out").exists()


def test_a_write_failing_midway_leaves_the_original_and_no_temp_file(stale: Path, monkeypatch) -> None:
    before = snapshot(stale)

    def disk_full(table, where, **kwargs):
        where.write(b"PAR1" + b"\0" * 4096)  # part of a file, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    report = migrate([stale], execute=True)
    assert report.executed and not report.ok and report.exit_code == 1
    failed = [p for p in report.files if p.refusals]
    assert len(failed) == 1 and not failed[0].written
    error = failed[0].refusals[0]
    assert type(error) is E.WriteFailedError and "No space left on device" in str(error)
    assert "the target was not changed and the temporary file was removed" in error.fix
    assert not any(p.written for p in report.files)
    assert snapshot(stale) == before
    assert all(temp_files(p.parent) == [] for p in stale.rglob("*_perf.parquet"))


def test_verification_failure_replaces_nothing(stale: Path, monkeypatch) -> None:
    import modperf.audit.migrate.execute as migrate_module
    from modperf.data.parquet_files import parquet_writer

    def tampered(table: pa.Table, **kwargs):
        latency = table.column("latency")
        return parquet_writer(table.set_column(table.num_columns - 1, "latency", pc.multiply(latency, 2.0)), **kwargs)

    monkeypatch.setattr(migrate_module, "parquet_writer", tampered)
    before = snapshot(stale)
    report = migrate([stale / CSA_CTX], execute=True)
    (error,) = only(report).refusals
    assert type(error) is E.MigrationVerificationError
    assert "column 'latency' changed" in str(error) and error.values["checks"]["other_columns_equal"] is False
    assert snapshot(stale) == before and temp_files((stale / CSA_CTX).parent) == []


# --- symbolic links, output folders, --fill values --------------------------------------------


def test_a_symlinked_table_has_its_target_rewritten(fixtures: Path, tmp_path: Path) -> None:
    """The link stays a link; the file it points to (inside the folder migrated) is migrated."""
    data = writable_copy(fixtures / STALE_DIR, tmp_path / "data")
    folder = (data / CSA_CTX).parent
    (folder / "store").mkdir()
    target = folder / "store" / "csa_context_v1.parquet"  # not a table name: found only through the link
    (data / CSA_CTX).rename(target)
    (data / CSA_CTX).symlink_to(Path("store") / target.name)
    report = migrate([data], execute=True, model_configs=[str(fixtures / "09_hf_configs")])
    assert report.ok and only(report, "b200_sxm/sparse_attention/sglang/0.5.10/dsv4_csa_context").written
    assert (data / CSA_CTX).is_symlink() and (data / CSA_CTX).resolve() == target
    assert pq.read_table(target).equals(pq.read_table(fixtures / TWIN_DIR / CSA_CTX), check_metadata=True)
    # a link and its target both found: one file (its resolved path), planned and written once
    twin = writable_copy(fixtures / STALE_DIR, tmp_path / "twin")
    (twin / "view").mkdir()
    (twin / "view" / "dsv4_csa_context_module_perf.parquet").symlink_to(twin / CSA_CTX)
    report = migrate([twin], execute=True, model_configs=[str(fixtures / "09_hf_configs")])
    assert report.ok and len(report.files) == 5
    assert [(p.source, p.written) for p in report.files if p.source.resolve() == (twin / CSA_CTX).resolve()] == [
        (twin / CSA_CTX, True)]
    assert pq.read_table(twin / CSA_CTX).equals(pq.read_table(fixtures / TWIN_DIR / CSA_CTX), check_metadata=True)


def test_a_link_out_of_its_folder_is_not_rewritten(fixtures: Path, tmp_path: Path) -> None:
    stale = writable_copy(fixtures / STALE_DIR, tmp_path / "stale")
    before = snapshot(stale)
    named = tmp_path / "elsewhere" / "dsv4_csa_context_module_perf.parquet"
    named.parent.mkdir()
    named.symlink_to(stale / CSA_CTX)
    folder = tmp_path / "linked" / "b200_sxm/sparse_attention/sglang/0.5.10"
    folder.mkdir(parents=True)
    (folder / "dsv4_csa_context_module_perf.parquet").symlink_to(stale / CSA_CTX)
    # named on its own: refused in place (it points out of its folder)
    plan = only(migrate([named], execute=True, model_configs=[str(fixtures / "09_hf_configs")]))
    assert [r.kind for r in plan.refusals] == ["link_outside_root"] and not plan.written
    # found in a folder search: the link is not followed at all
    with pytest.raises(E.LinkOutsideRootError):
        migrate([tmp_path / "linked"], execute=True)
    assert snapshot(stale) == before


def test_out_under_a_file_is_a_usage_error(fixtures: Path, legacy: Path, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    for out, message in ((tmp_path / "f", "--out is not a folder"), (tmp_path / "f" / "sub", "--out lies under a file")):
        with pytest.raises(E.UsageError, match=message) as info:
            migrate([legacy], model=V3, out=out)
        assert info.value.exit_code == 2


@pytest.mark.parametrize("value, message", [
    ("99999999999999999999999", r"step must be an integer in 0\.\.4,194,304"),
    ("-1", r"step must be an integer in 0\.\.4,194,304"),
    ("abc", r"step must be an integer in 0\.\.4,194,304"),
    ("\u00b2", r"step must be an integer in 0\.\.4,194,304"),
])
def test_fill_values_are_typed_and_ranged(legacy: Path, tmp_path: Path, value: str, message: str) -> None:
    """An overflowing --fill used to fail inside pyarrow (an internal error)."""
    lines = (legacy / "context_mla_perf.txt").read_text().splitlines()
    col = lines[0].split(",").index("step")
    nostep = tmp_path / "nostep"
    nostep.mkdir()
    (nostep / "context_mla_perf.txt").write_text(
        "\n".join(",".join(v for i, v in enumerate(line.split(",")) if i != col) for line in lines) + "\n")
    with pytest.raises(E.OptionValueError, match=message):
        migrate([nostep], model=V3, out=tmp_path / "out", fills={"step": value})
    plan = only(migrate([nostep], model=V3, out=tmp_path / "out", fills={"step": "0"}))
    assert plan.ok and plan.filled["step"] == {"value": 0, "source": "--fill"}
    with pytest.raises(E.OptionValueError, match="--fill 'stepp' fills nothing"):
        migrate([nostep], model=V3, out=tmp_path / "out", fills={"step": "0", "stepp": "0"})
