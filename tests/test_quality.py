"""Quality checks: the real trtllm 1.3.0rc23 MSA outliers, and synthetic series for each kind."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modperf import errors as E
from modperf.data.catalog import TableRef
from modperf.data.loader import load_one
from modperf.data.quality import Thresholds, assess, assess_buckets, assess_tables, median
from modperf.query.engine import TableIndex
from modperf.specs.models import ModelRegistry


@pytest.fixture(scope="module")
def msa_context():
    return assess(table="msa_context_module", examples=0)


@pytest.fixture(scope="module")
def msa_generation():
    return assess(table="msa_generation_module", examples=0)


def _file(report, system: str, backend: str):
    (match,) = [f for f in report.files if f.ref.system == system and f.ref.backend == backend]
    return match


def test_trtllm_msa_context_outlier_38810_ms(msa_context) -> None:
    trt = _file(msa_context, "h200_sxm", "trtllm")
    assert trt.ref.version == "1.3.0rc23"
    worst = max((x for x in trt.findings if x.kind == "cross_file"), key=lambda x: x.latency)
    assert worst.latency == 38810.9193
    assert worst.point == {"batch_size": 2, "isl": 32768, "step": 128}
    assert worst.bucket["gemm_type"] == "fp8_block" and worst.bucket["native"] == 64
    assert worst.detail["others"] == [{"file": "h200_sxm/msa/vllm/0.24.0/msa_context_module", "latency": 50.0566}]
    assert worst.ratio == pytest.approx(775.34, rel=1e-4)
    # a backend that is slower across the board shows in the per-file comparison
    medians = {c["with"]: round(c["median_ratio"], 2) for c in trt.comparisons}
    assert medians == {"h200_sxm/msa/sglang/0.5.16/msa_context_module": 3.7,
                       "h200_sxm/msa/vllm/0.24.0/msa_context_module": 13.29}
    assert trt.counts["cross_file"] == 1814 and trt.corroborated == 232


def test_trtllm_msa_generation_outlier_3468_ms(msa_generation) -> None:
    trt = _file(msa_generation, "h200_sxm", "trtllm")
    hits = [x for x in trt.findings if x.kind == "cross_file" and x.latency == 3468.2734]
    (hit,) = hits
    assert hit.point == {"batch_size": 128, "isl": 1, "step": 131071} and hit.bucket["num_heads"] == 32
    assert hit.reference == 1.0999 and hit.ratio == pytest.approx(3153.26, rel=1e-4)
    assert trt.counts["cross_file"] == 1095


def test_msa_totals(msa_context, msa_generation) -> None:
    t = msa_context.totals()
    assert (t["files"], t["non_monotone"], t["spike"], t["cross_file"], t["cross_file_corroborated"]) == (
        21, 5944, 752, 42030, 1938)
    t = msa_generation.totals()
    assert (t["files"], t["non_monotone"], t["spike"], t["cross_file"]) == (21, 144, 0, 7446)
    # the largest isolated spike of the MSA context tables sits in trtllm 1.3.0rc23
    spikes = [(x, f) for f in msa_context.files for x in f.findings if x.kind == "spike"]
    x, f = max(spikes, key=lambda xf: xf[0].ratio)
    assert (f.ref.system, f.ref.backend, f.ref.version) == ("b300_sxm", "trtllm", "1.3.0rc23")
    assert x.point == {"batch_size": 4, "isl": 10240, "step": 128} and x.latency == pytest.approx(391.0, abs=0.1)


def _table(path: Path, rows: list[tuple[int, int, float]], system: str = "h200_sxm", backend: str = "sglang",
           version: str = "0.0.1") -> TableRef:
    """A context_mla table (local-only MLA kernel, no model column): (batch, isl, latency) rows at
    num_heads 16 x tp 8 (native 128)."""
    n = len(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "op_name": ["mla_context"] * n, "kernel_source": [backend] * n, "mla_dtype": ["bfloat16"] * n,
        "kv_cache_dtype": ["bfloat16"] * n, "num_heads": [16] * n, "batch_size": [r[0] for r in rows],
        "isl": [r[1] for r in rows], "tp_size": [8] * n, "step": [0] * n, "latency": [r[2] for r in rows],
    }), path)
    return TableRef("context_mla", path, system, "mla", backend, version)


def _keyed(ref: TableRef):
    loaded = load_one(ref, ModelRegistry.default())
    assert loaded.failures == []
    return loaded.keyed


def test_spike_and_non_monotone(tmp_path: Path) -> None:
    rows = [(1, 1024, 1.0), (2, 1024, 2.0), (4, 1024, 10.0), (8, 1024, 2.5), (16, 1024, 3.0),  # spike at batch 4
            (32, 128, 1.0), (32, 256, 0.5), (32, 512, 1.2),  # falls by half from isl 128 to 256
            (64, 2048, 0.002), (64, 4096, 0.001)]  # falls by half, but by 1 us: below min_delta_ms
    (result,) = assess_tables([_keyed(_table(tmp_path / "context_mla_perf.parquet", rows))])
    assert result.counts == {"non_monotone": 1, "spike": 1, "cross_file": 0}
    spike, fall = sorted(result.findings, key=lambda f: f.kind, reverse=True)
    assert spike.kind == "spike" and spike.axis == "batch_size"
    assert spike.point == {"batch_size": 4, "isl": 1024, "step": 0}
    assert spike.latency == 10.0 and spike.reference == 2.5 and spike.ratio == 4.0
    assert fall.kind == "non_monotone" and fall.axis == "isl"
    assert fall.point == {"batch_size": 32, "isl": 256, "step": 0} and fall.reference == 1.0 and fall.ratio == 2.0
    # thresholds are options
    (loose,) = assess_tables([_keyed(_table(tmp_path / "context_mla_perf.parquet", rows))],
                             Thresholds(monotone_tolerance=3.5, spike_factor=5.0))
    assert loose.counts == {"non_monotone": 0, "spike": 0, "cross_file": 0}


def test_cross_file_corroboration(tmp_path: Path) -> None:
    # three backends on one system measure two keys; trtllm is 100x off at batch 8 (all others
    # agree: corroborated). At batch 16 only two files measured it and they disagree: both flagged,
    # neither corroborated.
    keyed = [
        _keyed(_table(tmp_path / "a" / "context_mla_perf.parquet", [(8, 1024, 1.0), (16, 1024, 2.0)], backend="sglang")),
        _keyed(_table(tmp_path / "b" / "context_mla_perf.parquet", [(8, 1024, 1.1)], backend="vllm")),
        _keyed(_table(tmp_path / "c" / "context_mla_perf.parquet", [(8, 1024, 100.0), (16, 1024, 200.0)],
                      backend="trtllm")),
    ]
    sglang, vllm, trtllm = assess_tables(keyed)
    assert trtllm.counts["cross_file"] == 2 and trtllm.corroborated == 1
    assert sglang.counts["cross_file"] == 1 and sglang.corroborated == 0
    assert vllm.counts["cross_file"] == 0
    top = trtllm.findings[0]
    assert top.point["batch_size"] == 8 and top.detail["corroborated"] is True
    assert sorted(o["latency"] for o in top.detail["others"]) == [1.0, 1.1]
    assert top.reference == pytest.approx(1.05) and top.ratio == pytest.approx(100 / 1.05)


def test_neighbouring_versions_only(tmp_path: Path) -> None:
    # same backend: 0.1 -> 0.2 -> 0.3; version 0.1 is compared with 0.2 only, not with 0.3
    keyed = [_keyed(_table(tmp_path / v / "context_mla_perf.parquet", [(8, 1024, lat)], version=v))
             for v, lat in (("0.1", 1.0), ("0.2", 1.2), ("0.3", 50.0))]
    first, middle, last = assess_tables(keyed)
    assert [c["with"].split("/")[3] for c in first.comparisons] == ["0.2"]
    assert [c["with"].split("/")[3] for c in middle.comparisons] == ["0.1", "0.3"]
    assert first.counts["cross_file"] == 0 and middle.counts["cross_file"] == 0
    assert last.counts["cross_file"] == 1 and last.corroborated == 0


def test_thresholds_are_validated() -> None:
    for bad in (Thresholds(monotone_tolerance=-0.1), Thresholds(spike_factor=1.0), Thresholds(cross_factor=0.5),
                Thresholds(min_delta_ms=float("nan"))):
        with pytest.raises(E.OptionValueError):
            bad.validate()
    assert Thresholds().to_dict() == {"monotone_tolerance": 0.25, "spike_factor": 3.0, "cross_factor": 10.0,
                                      "min_delta_ms": 0.01}


def test_provenance_notes_undeclared_copies_and_version_columns() -> None:
    """Framework all-reduce tables copied verbatim into other folders load clean (their rows are
    real measurements) and --quality says where they came from."""
    report = assess(table="custom_allreduce", examples=0)
    copies = {f.ref.label: n["identical_to"] for f in report.files for n in f.provenance if n["kind"] == "copy_of"}
    assert copies["h200_sxm/comm/sglang/0.5.6.post2/custom_allreduce"] == [
        "h200_sxm/comm/trtllm/1.2.0rc5/custom_allreduce"]
    assert copies["l40s/comm/vllm/0.22.0/custom_allreduce"] == ["l40s/comm/vllm/0.14.0/custom_allreduce"]
    assert sorted(copies) == sorted(f"{s}/comm/{v}/custom_allreduce" for s, v in [
        ("h100_sxm", "sglang/0.5.6.post2"), ("h100_sxm", "trtllm/1.2.0rc5"), ("h200_sxm", "sglang/0.5.6.post2"),
        ("h200_sxm", "trtllm/1.2.0rc5"), ("l40s", "sglang/0.5.9"), ("l40s", "trtllm/1.0.0"),
        ("l40s", "trtllm/1.3.0rc15"), ("l40s", "trtllm/1.3.0rc20"), ("l40s", "vllm/0.14.0"), ("l40s", "vllm/0.22.0")])
    recorded = {f.ref.label: n["recorded"] for f in report.files for n in f.provenance if n["kind"] == "version_column"}
    assert recorded["l40s/comm/trtllm/1.3.0rc20/custom_allreduce"] == ["1.0.0"]
    assert report.totals()["provenance"] == {"copy_of": 10, "version_column": 10}


def test_nccl_folders_are_releases_and_the_column_is_provenance() -> None:
    report = assess(table="nccl", examples=0)
    notes = {f.ref.label: n for f in report.files for n in f.provenance}
    assert sorted(notes) == [f"{s}/comm/nccl/{v}/nccl" for s, v in [
        ("b200_sxm", "2.27.3"), ("b300_sxm", "2.27"), ("gb200", "2.23"), ("gb300", "2.27"), ("h100_sxm", "2.27.3"),
        ("h200_sxm", "2.26.2")]]
    assert all(n == {"kind": "version_column", "folder": n["folder"], "recorded": ["2.29.2"]} for n in notes.values())
    # the NCCL table filed in a framework folder loads (its rows record one release, 2.29.2) and is compared with
    # the system's releases: a re-measurement (check warns where it lies; no version_column note beside that)
    assert not [f for f in report.files if f.failures]
    (misplaced,) = [f for f in report.files if f.ref.misplaced is not None]
    assert misplaced.ref.label == "b300_sxm/comm/trtllm/1.3.0rc10/nccl" and misplaced.provenance == []
    assert {c["with"]: (c["shared_keys"], round(c["median_ratio"], 4)) for c in misplaced.comparisons} == {
        "b300_sxm/comm/nccl/2.27/nccl": (504, 0.9987), "b300_sxm/comm/nccl/2.29.2/nccl": (504, 0.998)}
    assert misplaced.total == 0


@pytest.mark.parametrize("asked", [("h200_sxm", "trtllm", "1.3.0rc20", "generation_attention"),
                                   ("l40s", "trtllm", "1.0.0", "moe"), ("h200_sxm", "vllm", "0.24.0", "gemm")])
def test_one_group_assessed_alone_finds_what_the_whole_table_finds_there(db, asked: tuple[str, ...]) -> None:
    """A query's notes assess only its group (assess_buckets): for every group of a real file,
    every finding, in order, is the whole-table assessment's on that group, the other files
    (versions, backends) being compared as a query compares them."""
    store = db.queries.store
    system, backend, version, table = asked
    mine = store.table(*asked)
    others = [store.load(ref) for ref in store.catalog.select(system=system, table=table, physical=True)
              if ref.path != mine.ref.path]
    assert others
    order = [mine, *others]
    (whole, *_) = assess_tables(order, examples=0)
    bucket_of = [tuple(f.bucket[n] for n in mine.key_names) for f in whole.findings]
    kept = [mine.key_names.index(n) for n in mine.key_names if n != "kernel_source"]
    kinds: dict[str, int] = {}
    merged_kernels = 0  # groups whose keys, without kernel_source, are another group's too
    for buckets in TableIndex.build(mine).groups.values():
        keys = {mine.bucket_keys[b] for b in buckets}
        want = [f.to_dict() for f, key in zip(whole.findings, bucket_of) if key in keys]
        got = [f.to_dict() for f in assess_buckets(order, buckets)]
        assert got == want
        for f in got:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
        reduced = {tuple(key[k] for k in kept) for key in keys}
        merged_kernels += any(key not in keys and tuple(key[k] for k in kept) in reduced for key in mine.bucket_keys)
    assert kinds == {k: v for k, v in whole.counts.items() if v}
    if table == "generation_attention":
        assert kinds["spike"] > 0 and kinds["cross_file"] > 0
    else:  # kernels of one key in several groups: the fastest of them is compared across files
        assert merged_kernels > 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.just(-0.0)),
                min_size=1, max_size=12))
def test_median_is_numpys_bit_for_bit(values: list[float]) -> None:
    """quality.median stands in for np.median (whose first call imports numpy.ma)."""
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(all="ignore"):
        want = float(np.median(x))
    got = median(x)
    assert (math.isnan(got) and math.isnan(want)) or got.hex() == want.hex()
