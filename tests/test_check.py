"""The guardrail over the whole embedded corpus, and the historical fixtures."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from modperf import errors as E
from modperf.audit.check import check
from modperf.data.catalog import Catalog
from modperf.data.families import family_of, model_head_axis_tables
from modperf.data.families.base import Tier

EXPECTED_NATIVES = {
    "deepseek-ai/DeepSeek-V3": 128, "deepseek-ai/DeepSeek-V3.2": 128, "deepseek-ai/DeepSeek-V4-Pro": 128,
    "sgl-project/DeepSeek-V4-Pro-FP8": 128, "sgl-project/DeepSeek-V4-Flash-FP8": 64, "moonshotai/Kimi-K3": 96,
    "MiniMaxAI/MiniMax-M3": 64, "zai-org/GLM-5": 64, "zai-org/GLM-5-FP8": 64, "zai-org/GLM-5.2": 64,
    "zai-org/GLM-5.2-FP8": 64, "nvidia/GLM-5.2-NVFP4": 64,
}


@pytest.fixture(scope="module")
def corpus_report():
    return check()


MISPLACED_NCCL = "b300_sxm/comm/trtllm/1.3.0rc10/nccl"


def test_every_declared_table_loads(corpus_report):
    """All 736 files are read and none is skipped; every file passes every guard and the corpus
    checks clean. One file is out of place and says so, as a warning: an NCCL table filed in a
    trtllm framework folder, whose rows record release 2.29.2, whose own folder holds a table
    measuring the same 504 keys (docs/families.md)."""
    assert len(corpus_report.files) == 736 and corpus_report.skipped == 0
    assert corpus_report.ok and corpus_report.failures == []
    (warning,) = corpus_report.warnings
    assert isinstance(warning, E.MisplacedTableError) and warning.kind == "misplaced_table"
    assert warning.severity == "warning"
    assert warning.file.endswith(MISPLACED_NCCL + "_perf.parquet")
    held_by = str(Catalog.scan().slot("b300_sxm", "nccl", "2.29.2", "nccl").path)
    assert held_by.endswith("b300_sxm/comm/nccl/2.29.2/nccl_perf.parquet")
    assert warning.values == {"folder": "trtllm/1.3.0rc10", "recorded_versions": ["2.29.2"],
                              "belongs_in": "b300_sxm/comm/nccl/2.29.2", "held_by": held_by, "shared_keys": 504,
                              "keys_only_here": 0, "median_ratio": 0.998}
    assert "this file is not served (it re-measures 504 of that file's keys and holds none that file lacks" \
        in warning.detail
    assert warning.fix == (f"keep one of the two: delete this one (rm {warning.file}), or put it in place of the "
                           f"other (mv {warning.file} {held_by})")
    assert [fr.ref.label for fr in corpus_report.files if fr.warnings] == [MISPLACED_NCCL]
    # rows as the files store them (the misplaced file's 1,512 included: it loads)
    assert corpus_report.rows == 12_586_413
    per_family = {k: (v.files, v.files_failed, v.rows) for k, v in corpus_report.families.items()}
    assert per_family == {
        "gqa": (60, 0, 2_745_399), "mla_kernel": (80, 0, 141_026), "mla_module": (32, 0, 238_084),
        "dsa": (40, 0, 906_997), "msa": (42, 0, 360_007), "dsv4": (67, 0, 892_973), "sparse_kernel": (42, 0, 180_223),
        "gemm": (30, 0, 2_999_083), "moe": (69, 0, 3_626_136), "alltoall": (29, 0, 25_608),
        "custom_allreduce": (75, 0, 7_981), "collective": (22, 0, 14_958), "quantize": (48, 0, 78_144),
        "linear_attention": (33, 0, 163_450), "kda": (17, 0, 18_941), "mhc": (22, 0, 3_035),
        "encoder_attention": (24, 0, 184_296), "mlp": (4, 0, 72),
    }
    assert corpus_report.families["collective"].warnings == 1
    assert sum(v.warnings for v in corpus_report.families.values()) == 1
    per_table: dict[str, int] = defaultdict(int)
    for fr in corpus_report.files:
        per_table[fr.ref.table] += 1
    assert len(per_table) == 45 and sum(per_table.values()) == 736


def test_natives_per_family(corpus_report):
    natives = {k: sorted(v.natives) for k, v in corpus_report.families.items() if v.natives}
    assert natives == {"mla_kernel": [64, 128], "mla_module": [96, 128], "dsa": [64, 128],
                       "msa": [64], "dsv4": [64, 128], "sparse_kernel": [64, 128]}
    # the corpus holds no alias duplicates today; every merged row is a same-model re-measurement
    assert sum(v.alias_duplicate_points for v in corpus_report.families.values()) == 0
    assert corpus_report.families["dsv4"].duplicates_merged == 158_332


def test_mla_kernel_agreement_is_the_local_only_evidence(corpus_report):
    """Files holding both a 64- and a 128-native tp chain measure the same local key twice;
    the chains agree to well under 1% in the median."""
    agreement = {a["table"]: a for a in corpus_report.families["mla_kernel"].agreement}
    assert sorted(agreement) == [
        "a100_sxm/mla/trtllm/1.0.0/context_mla", "a100_sxm/mla/trtllm/1.0.0/generation_mla",
        "l40s/mla/trtllm/1.0.0/context_mla", "l40s/mla/trtllm/1.0.0/generation_mla"]
    a100 = agreement["a100_sxm/mla/trtllm/1.0.0/context_mla"]
    assert a100["natives"] == [64, 128] and a100["shared_keys"] == 1044
    assert a100["median_rel_diff"] == pytest.approx(0.005898, abs=1e-6)
    assert all(a["median_rel_diff"] < 0.01 for a in agreement.values())


def test_rank_local_and_configs_independently(models):
    """Recomputed from the raw files, without the loader: every model has a config, its native
    is the expected one, and every tp>1 row of a non-sparse table is rank-local."""
    seen: dict[str, set[int]] = defaultdict(set)
    tp_gt1_rows = 0
    for ref in Catalog.scan().select(tables=model_head_axis_tables()):
        names = pq.read_schema(ref.path).names
        if "model" not in names:
            continue
        t = pq.read_table(ref.path, columns=["model", "num_heads", "tp_size"])
        model = np.array(t.column("model").to_pylist())
        heads, tp = t.column("num_heads").to_numpy(), t.column("tp_size").to_numpy()
        for name in np.unique(model):
            native = models.get(str(name)).native_heads
            seen[str(name)].add(native)
            rows = model == name
            if family_of(ref.table).tier is Tier.NATIVE:
                assert (heads[rows] == native).all(), ref.label
            else:
                chain = rows & (tp > 1)
                tp_gt1_rows += int(chain.sum())
                assert (heads[chain] * tp[chain] == native).all(), ref.label
    assert {m: sorted(v) for m, v in seen.items()} == {m: [n] for m, n in EXPECTED_NATIVES.items()}
    assert tp_gt1_rows == 1_247_853


# --- ../shared fixtures ---------------------------------------------------------------------

def test_stale_dsv4_tables_are_rejected(fixtures: Path):
    report = check([str(fixtures / "01_dsv4_stale_vs_migrated" / "stale_parent_eed87c1c9")])
    assert not report.ok and len(report.files) == 5
    assert {type(f) for f in report.failures} == {E.StaleConventionError}
    assert all("modperf migrate" in f.fix for f in report.failures)
    csa = next(fr for fr in report.files if fr.ref.table == "dsv4_csa_context_module" and fr.ref.system == "b200_sxm")
    assert sorted((f.values["model"], f.values["num_heads"], f.row_count) for f in csa.failures) == [
        ("deepseek-ai/DeepSeek-V4-Flash", 64, 5), ("deepseek-ai/DeepSeek-V4-Pro", 128, 8),
        ("sgl-project/DeepSeek-V4-Flash-FP8", 64, 752)]
    assert all(f.values["tp_sizes"] == [1, 2, 4, 8] for f in csa.failures)


def test_migrated_twins_and_the_native_keyed_control_load(fixtures: Path):
    base = fixtures / "01_dsv4_stale_vs_migrated"
    report = check([str(base / "migrated_93dfd1fd2"), str(base / "native_keyed_kernel_93dfd1fd2")])
    assert report.ok and len(report.files) == 6
    control = next(fr for fr in report.files if fr.ref.table == "dsv4_hca_attn_module")
    # num_heads constant (64 / 128) across tp 1..8 by contract: not stale
    assert control.family == "sparse_kernel" and control.rows == 1688 and control.natives == [64, 128]


def test_legacy_tables_without_num_heads_point_to_migration(fixtures: Path):
    report = check([str(fixtures / "03_legacy_no_num_heads")])
    assert len(report.files) == 2 and not report.ok
    for fr in report.files:
        heads = [f for f in fr.failures if f.values.get("column") == "num_heads"]
        assert len(heads) == 1 and isinstance(heads[0], E.MissingColumnError)
        assert heads[0].fix.startswith(f"run `modperf migrate {fr.ref.path} --model MODEL_ID`")


def test_every_fixture_table_outside_the_stale_and_legacy_sets_loads(fixtures: Path):
    report = check([str(fixtures)])
    bad = {fr.ref.path.relative_to(fixtures).parts[0] for fr in report.files if not fr.ok}
    assert bad == {"01_dsv4_stale_vs_migrated", "03_legacy_no_num_heads"}
    assert sum(not fr.ok for fr in report.files) == 7  # 5 stale parents + 2 legacy CSVs
    alias = [fr for fr in report.files if fr.ref.path.parts[-6] == "githead_095f58a51"]
    assert sorted((fr.ref.table, fr.alias_duplicate_points) for fr in alias) == [
        ("dsa_generation_module", 5888), ("mla_context_module", 3886), ("mla_generation_module", 5886)]


def test_unknown_table_filter_is_a_usage_error():
    with pytest.raises(E.UnknownTableError) as info:
        check(table="gemmm")
    assert info.value.exit_code == 2 and "'gemmm' is not a declared table" in str(info.value)
    assert "choose one of: " in info.value.fix and "moe_a2a" in info.value.fix


def test_describe_family_lists_the_declarations() -> None:
    from modperf.audit.check import describe_family

    a2a = describe_family("alltoall")
    normal = next(t for t in a2a["tables"] if t["table"] == "wideep_deepep_normal")
    assert normal["latency"] == {"column": "latency", "unit": "us"}
    assert normal["renames"] == {"num_token": "num_tokens", "num_topk": "topk"}
    assert normal["unpivot"]["phases"]["combine"] == {"latency": ["combine_transmit_us", "combine_notify_us"],
                                                      "sms": ["combine_sms"]}
    assert normal["derived"] == [{"column": "ep_size", "formula": "node_num * gpus_per_node of the system (the "
                                  "collector ran every GPU of each node)", "keyed": True, "needs_system": True}]
    moe = next(t for t in describe_family("moe")["tables"] if t["table"] == "moe")
    assert {q["column"]: q["scope"] for q in moe["quantities"]} == {
        "inter_size": "global", "num_experts": "global", "hidden_size": "global", "num_tokens": "global"}
    assert [g["guard"] for g in moe["guards"]] == ["ShardedKey", "Scaling", "ShardedKey", "Scaling", "DuplicateSpread"]
    assert moe["guards"][1]["step"] == {"moe_tp_size": 2} and moe["guards"][1]["high"] == 0.9
    nccl = describe_family("collective")["tables"][0]
    assert nccl["library"] == "nccl" and describe_family("collective")["work_model"] == "row roofline"


def test_forked_workers_report_what_one_process_reports(fixtures: Path, monkeypatch):
    """29 fixture files (7 rejected, 17 failures): loaded in forked workers, every file's result
    and every failure (type, message, file, rows, values, fix) equals the in-process load."""
    import importlib

    check_module = importlib.import_module("modperf.audit.check")  # (modperf.audit.check is also the function)

    alone = check([str(fixtures)], workers=1)
    assert len(alone.files) == 29 >= check_module.PROCESS_MIN_FILES and len(alone.failures) == 17

    def no_threads(*args, **kwargs):
        raise AssertionError("a check of 29 files with 2 workers loads in forked processes")

    monkeypatch.setattr(check_module, "load_many", no_threads)
    seen = []
    forked = check([str(fixtures)], workers=2, on_progress=lambda i, n, r: seen.append((i, n)))
    assert seen == [(i, 29) for i in range(1, 30)]
    assert forked.to_dict() | {"seconds": 0} == alone.to_dict() | {"seconds": 0}
    for mine, theirs in zip(forked.files, alone.files):
        assert mine.ref == theirs.ref and mine.rows == theirs.rows and mine.points == theirs.points
        assert [(type(f), str(f), f.file, f.rows, f.row_count, f.values, f.fix) for f in mine.failures] == \
            [(type(f), str(f), f.file, f.rows, f.row_count, f.values, f.fix) for f in theirs.failures]


def test_a_worker_that_dies_loses_no_file(fixtures: Path, monkeypatch):
    """A forked worker killed while loading (here: it exits at its first task) breaks the pool;
    check loads what it did not get back in this process and reports every file, as without
    workers, instead of waiting on the lost task."""
    import importlib
    import os

    check_module = importlib.import_module("modperf.audit.check")
    alone = check([str(fixtures)], workers=1)
    parent = os.getpid()
    real = check_module.load_one

    def dies_in_a_worker(*args, **kwargs):
        if os.getpid() != parent:
            os._exit(9)
        return real(*args, **kwargs)

    monkeypatch.setattr(check_module, "load_one", dies_in_a_worker)
    seen = []
    broken = check([str(fixtures)], workers=2, on_progress=lambda i, n, r: seen.append((i, n)))
    assert seen == [(i, 29) for i in range(1, 30)]
    assert broken.to_dict() | {"seconds": 0} == alone.to_dict() | {"seconds": 0}


def test_checking_tables_that_unpivot_and_convert_units_never_imports_pandas():
    """pyarrow's ``pa.array`` and ``pa.scalar`` import pandas to probe for it (0.2 s of CPU per
    process, each worker of a forked check); validation builds its phase column and its unit
    divisor from buffers instead. The DeepEP tables store dispatch and combine side by side, in
    microseconds; their phases and latencies are the ones pyarrow's own conversions give."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, pyarrow as pa\n"
        "from modperf.audit.check import check\n"
        "r = check(table='wideep_deepep_normal', workers=1)\n"
        "r2 = check(table='wideep_deepep_ll', workers=1)\n"
        "assert r.files and r2.files and all(f.ok for f in [*r.files, *r2.files]), r.failures + r2.failures\n"
        "assert 'pandas' not in sys.modules\n"
        "from modperf.data.conventions import _repeated\n"
        "for text, n in (('dispatch', 5), ('', 3), ('combine', 0), ('é', 4)):\n"
        "    assert _repeated(text, n).equals(pa.array([text] * n, pa.string()))\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
