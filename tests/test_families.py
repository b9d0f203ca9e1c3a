"""Every family beyond attention, on real tables: the table loads, a query at a stored point
returns the stored latency bit for bit (read from the parquet file here, in the declared unit
converted to ms), a point between two stored neighbours lies between them, extrapolation holds
utilisation against the family's roofline, and a table rewritten in the other convention for
its axis is rejected with the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tests.helpers import column, set_col, stored_latency, stored_rows, variant

import modperf
from modperf import errors as E
from modperf.data.loader import load_one, load_table
from modperf.specs.models import ModelRegistry
from modperf.specs.roofline import gpu_spec


def rejected(ref, models: ModelRegistry) -> list[E.ModperfError]:
    result = load_one(ref, models)
    assert result.keyed is None, "the rewritten table should have been rejected"
    return result.failures


def only(failures: list[E.ModperfError], cls: type[E.ModperfError]) -> E.ModperfError:
    assert [type(f) for f in failures] == [cls], [str(f) for f in failures]
    return failures[0]


def query(db: modperf.Database, slot: tuple[str, str, str, str], **fields):
    system, backend, version, table = slot
    return db.query(table=table, system=system, backend=backend, version=version, **fields)


def between_neighbours(db: modperf.Database, slot: tuple[str, str, str, str], fields: dict, axis: str) -> None:
    """A point halfway between two stored neighbours along ``axis`` (the first pair of the group
    whose values are at least 2 apart and whose latencies differ) is interpolated, strictly
    between their stored latencies (exact answers, which equal the file's values)."""
    keyed = db.table(*slot)
    grid = db.queries.grid({"table": slot[3], "system": slot[0], "backend": slot[1], "version": slot[2], **fields})
    values = [int(v) for v in grid.values[list(grid.axes).index(axis)]]
    for lo, hi in zip(values, values[1:]):
        if hi - lo < 2:
            continue
        a = query(db, slot, **fields, **{axis: lo})
        b = query(db, slot, **fields, **{axis: hi})
        if a.kind != "exact" or b.kind != "exact" or a.latency_ms == b.latency_ms:
            continue
        mid = query(db, slot, **fields, **{axis: (lo + hi) // 2})
        assert mid.kind == "interpolated", (keyed.ref.label, axis, lo, hi)
        assert min(a.latency_ms, b.latency_ms) < mid.latency_ms < max(a.latency_ms, b.latency_ms)
        return
    raise AssertionError(f"no pair of stored neighbours along {axis} in {keyed.ref.label}")


def roofline_ratio(db: modperf.Database, slot: tuple[str, str, str, str], key: dict, axis: str, at: float,
                   edge: float) -> float:
    """R(at) / R(edge) along one axis from the family's own work model, computed here."""
    keyed = db.table(*slot)
    work = keyed.family.work_model(slot[3], keyed.spec.phase, key, {}, gpu_spec(slot[0]))

    def seconds(x: float) -> float:
        values = [float(x) if a == axis else float(key[a]) for a in keyed.spec.axes]
        return float(work.shape_seconds(values))

    return seconds(at) / seconds(edge)


# --- gemm ---------------------------------------------------------------------------------------

GEMM = ("h200_sxm", "vllm", "0.24.0", "gemm")


def test_gemm_extrapolates_along_its_roofline(db: modperf.Database) -> None:
    key = dict(op_name="gemm", kernel_source="torch.nn.functional.linear", gemm_dtype="bfloat16", n=4096, k=7168)
    top = int(column(stored_rows(db.ref(*GEMM).path, key), "m").max())
    edge = query(db, GEMM, **key, m=top)
    beyond = query(db, GEMM, **key, m=int(top * 1.5))
    assert edge.kind == "exact" and beyond.kind == "extrapolated"
    assert beyond.latency_ms == pytest.approx(
        edge.latency_ms * roofline_ratio(db, GEMM, {**key, "m": top}, "m", top * 1.5, top), rel=1e-12)


def test_gemm_with_a_global_n_is_rejected(db, models, tmp_path: Path) -> None:
    """A column-parallel projection stored with the model's n beside one rank's latency (tp 8)."""
    ref = variant(db, tmp_path, GEMM, lambda t: set_col(t, "n", column(t, "n") * 8))
    f = only(rejected(ref, models), E.BeyondRooflineError)
    assert "rows beat their roofline by more than 1.25x (the dtype's tensor-core peak: 2mnk / latency" in str(f)
    assert f.values["max_utilisation"] > 7  # the bf16 rows peak at 0.95 of 989 TFLOPS in the real file
    assert f.fix.startswith("m, n, k must be the shape one rank multiplied: store n (or k) divided by the tensor")


# --- moe --------------------------------------------------------------------------------------

MOE = ("a100_sxm", "trtllm", "1.0.0", "moe")
MOE_KEY = dict(op_name="moe", kernel_source="moe_torch_flow", moe_dtype="bfloat16", distribution="power_law_1.01",
               hidden_size=7168, inter_size=2048, topk=8, num_experts=256, moe_ep_size=2)


def test_moe_queries(db: modperf.Database) -> None:
    path = db.ref(*MOE).path
    rows = stored_rows(path, {**MOE_KEY, "moe_tp_size": 8})
    tokens = sorted(set(column(rows, "num_tokens").tolist()))
    lo, hi = tokens[-2], tokens[-1]
    exact = query(db, MOE, **MOE_KEY, moe_tp_size=8, num_tokens=hi)
    assert exact.kind == "exact"
    assert exact.latency_ms == stored_latency(path, {**MOE_KEY, "moe_tp_size": 8, "num_tokens": hi})
    between = query(db, MOE, **MOE_KEY, moe_tp_size=8, num_tokens=(lo + hi) // 2)
    low = stored_latency(path, {**MOE_KEY, "moe_tp_size": 8, "num_tokens": lo})
    assert between.kind == "interpolated" and low < between.latency_ms < exact.latency_ms
    # at the global shape, a rank of tp 8 runs an eighth of each expert: faster than at tp 2
    assert exact.latency_ms < query(db, MOE, **MOE_KEY, moe_tp_size=2, num_tokens=hi).latency_ms
    beyond = query(db, MOE, **MOE_KEY, moe_tp_size=8, num_tokens=int(hi * 1.5))
    key = {**MOE_KEY, "moe_tp_size": 8, "num_tokens": hi}
    assert beyond.kind == "extrapolated" and beyond.latency_ms == pytest.approx(
        exact.latency_ms * roofline_ratio(db, MOE, key, "num_tokens", hi * 1.5, hi), rel=1e-12)


def _per_rank(table: pa.Table, name: str, by: str) -> pa.Table:
    """``name`` rewritten to one rank's slice (name // by), keeping the rows where that slice is
    still divisible (a per-rank table a collector could have written)."""
    value, size = column(table, name), column(table, by)
    table = table.filter(pa.array((value // size) % size == 0))
    return set_col(table, name, column(table, name) // column(table, by))


def test_moe_with_per_rank_inter_size_is_rejected(db, models, tmp_path: Path) -> None:
    ref = variant(db, tmp_path, MOE, lambda t: _per_rank(t, "inter_size", "moe_tp_size"))
    f = only(rejected(ref, models), E.ConventionError)
    assert "inter_size looks per-rank" in str(f) and "moe_tp_size" in str(f)
    example = f.values["examples"][0]
    chain = example["moe_tp_size -> inter_size"]
    assert all(tp * inter == chain[0][0] * chain[0][1] for tp, inter in chain)  # inter * tp constant: each slice
    assert f.fix.startswith("store the model's per-expert inter_size (the config's moe_intermediate_size)")


def test_moe_with_per_rank_experts_is_rejected(db, models, tmp_path: Path) -> None:
    ref = variant(db, tmp_path, MOE, lambda t: _per_rank(t, "num_experts", "moe_ep_size"))
    f = only(rejected(ref, models), E.ConventionError)
    assert "num_experts looks per-rank" in str(f)
    assert f.fix.startswith("store the model's routed num_experts on every row with the moe_ep_size")


WIDEEP_CTX = ("h200_sxm", "sglang", "0.5.10", "wideep_context_moe")
MEGAMOE = ("gb300", "sglang", "0.5.10", "dsv4_megamoe_module")


def test_wide_ep_moe_tables(db, models, tmp_path: Path) -> None:
    path = db.ref(*WIDEEP_CTX).path
    first = stored_rows(path, {}).slice(0, 1).to_pylist()[0]
    key = {k: first[k] for k in ("op_name", "kernel_source", "moe_dtype", "distribution", "hidden_size",
                                 "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "num_tokens")}
    assert query(db, WIDEEP_CTX, **key).latency_ms == first["latency"]
    # the group's tokens: a table of per-rank tokens breaks num_tokens % ep == 0
    ref = variant(db, tmp_path, WIDEEP_CTX,
                  lambda t: set_col(t, "num_tokens", column(t, "num_tokens") // column(t, "moe_ep_size")))
    f = only(rejected(ref, models), E.InvariantError)
    assert "num_tokens % moe_ep_size == 0 fails" in str(f)
    assert f.fix == "store the group's tokens (per-rank tokens times moe_ep_size) in num_tokens"


def test_megamoe_tokens_are_per_rank(db, models, tmp_path: Path) -> None:
    path = db.ref(*MEGAMOE).path
    rows = stored_rows(path, {"phase": "generation", "distribution": "balanced", "moe_ep_size": 8})
    r = rows.slice(3, 1).to_pylist()[0]
    key = {k: r[k] for k in ("op_name", "kernel_source", "phase", "moe_dtype", "kernel_dtype", "distribution",
                             "source_policy", "pre_dispatch", "buffer_policy", "hidden_size", "inter_size", "topk",
                             "num_experts", "num_fused_shared_experts", "moe_tp_size", "moe_ep_size", "num_tokens")}
    assert query(db, MEGAMOE, **key).latency_ms == r["latency"]
    ref = variant(db, tmp_path, MEGAMOE, lambda t: set_col(t, "num_tokens", column(t, "global_num_tokens")))
    failures = rejected(ref, models)
    assert {type(f) for f in failures} == {E.InvariantError}
    assert any(str(f).split(": ", 2)[-1].startswith("global_num_tokens == num_tokens * moe_ep_size fails")
               for f in failures)


# --- all-to-all -------------------------------------------------------------------------------

MOE_A2A = ("h200_sxm", "vllm", "0.24.0", "moe_a2a")
DEEPEP_GB200 = ("gb200", "sglang", "0.5.12", "wideep_deepep_normal")
TRTLLM_A2A = ("gb200", "trtllm", "1.3.0rc10", "trtllm_alltoall")


def test_moe_a2a_microseconds_become_milliseconds(db: modperf.Database) -> None:
    path = db.ref(*MOE_A2A).path
    r = stored_rows(path, {"comm_backend": "deepep_ll", "phase": "dispatch"}).slice(5, 1).to_pylist()[0]
    key = {k: r[k] for k in ("op_name", "kernel_source", "comm_backend", "phase", "comm_dtype", "ep_size",
                             "node_num", "hidden_size", "topk", "num_experts", "num_tokens", "sms")}
    answer = query(db, MOE_A2A, **key)
    assert answer.kind == "exact" and answer.latency_ms == r["latency"] / 1000.0
    between_neighbours(db, MOE_A2A, {k: v for k, v in key.items() if k != "num_tokens"}, "num_tokens")


def test_moe_a2a_stored_in_milliseconds_is_rejected(db, models, tmp_path: Path) -> None:
    ref = variant(db, tmp_path, MOE_A2A, lambda t: set_col(t, "latency", column(t, "latency") / 1000.0))
    kinds = {f.kind for f in rejected(ref, models)}
    assert kinds == {"invariant", "units"}  # latency != transmit_us + notify_us, and below a microsecond


def test_deepep_rows_unpivot_per_phase_with_the_systems_ep_size(db: modperf.Database) -> None:
    """GB200 nodes hold 4 GPUs: its DeepEP tables are EP 4 (never node_num * 8)."""
    path = db.ref(*DEEPEP_GB200).path
    r = stored_rows(path, {}).slice(7, 1).to_pylist()[0]
    key = dict(op_name=r["op_name"], kernel_source=r["kernel_source"], node_num=1, hidden_size=r["hidden_size"],
               topk=r["num_topk"], num_experts=r["num_experts"], num_tokens=r["num_token"], sms=r["dispatch_sms"])
    dispatch = query(db, DEEPEP_GB200, **key, phase="dispatch", ep_size=4)
    combine = query(db, DEEPEP_GB200, **key, phase="combine", ep_size=4)
    assert dispatch.kind == combine.kind == "exact"
    assert dispatch.latency_ms == (r["dispatch_transmit_us"] + r["dispatch_notify_us"]) / 1000.0
    assert combine.latency_ms == (r["combine_transmit_us"] + r["combine_notify_us"]) / 1000.0
    with pytest.raises(E.NotCoveredError):
        query(db, DEEPEP_GB200, **key, phase="dispatch", ep_size=8)
    assert db.table(*DEEPEP_GB200).rows_read == 2 * db.table(*DEEPEP_GB200).rows_stored


def test_deepep_error_rows_name_the_stored_row(db, models, tmp_path: Path) -> None:
    def mutate(t: pa.Table) -> pa.Table:
        values = column(t, "combine_transmit_us")
        values[[3, 17]] = -1.0
        return set_col(t, "combine_transmit_us", values)

    f = only(rejected(variant(db, tmp_path, DEEPEP_GB200, mutate), models), E.InvalidLatencyError)
    assert f.rows == [3, 17]  # the combine copies of stored rows 3 and 17


def test_deepep_outside_the_layout_cannot_derive_its_ep_size(db, models, tmp_path: Path) -> None:
    out = tmp_path / "loose" / "wideep_deepep_ll_perf.parquet"
    out.parent.mkdir()
    out.write_bytes(db.ref("h200_sxm", "sglang", "0.5.12", "wideep_deepep_ll").path.read_bytes())
    f = only(rejected(modperf.data.catalog.refs_for_paths([out])[0], models), E.SystemSpecError)
    assert "ep_size = node_num * gpus_per_node of the system" in str(f)


def test_trtllm_alltoall_with_group_tokens_is_rejected(db, models, tmp_path: Path) -> None:
    path = db.ref(*TRTLLM_A2A).path
    r = stored_rows(path, {"op_name": "alltoall_dispatch"}).slice(40, 1).to_pylist()[0]
    key = {k: r[k] for k in ("op_name", "kernel_source", "moe_dtype", "distribution", "hidden_size", "topk",
                             "num_experts", "num_tokens")}
    assert query(db, TRTLLM_A2A, **key, ep_size=r["moe_ep_size"]).latency_ms == r["latency"]
    between_neighbours(db, TRTLLM_A2A, {k: v for k, v in key.items() if k != "num_tokens"} | {
        "ep_size": r["moe_ep_size"]}, "num_tokens")
    ref = variant(db, tmp_path, TRTLLM_A2A,
                  lambda t: set_col(t, "num_tokens", column(t, "num_tokens") * column(t, "moe_ep_size")))
    f = only(rejected(ref, models), E.ConventionError)
    assert str(f).split(": ", 1)[1].startswith("num_tokens is per rank: the median latency ratio over")
    assert f.values["median_ratio"] < 0.85 and f.values["expected"] == "[0.85, -]"
    assert f.fix.startswith("store the tokens one rank dispatches in num_tokens")


# --- all-reduce and collectives -----------------------------------------------------------------

ALLREDUCE = ("h200_sxm", "vllm", "0.24.0", "custom_allreduce")
NCCL = ("h200_sxm", "nccl", "2.29.2", "nccl")


def test_custom_allreduce_queries(db: modperf.Database) -> None:
    path = db.ref(*ALLREDUCE).path
    key = dict(op_name="all_reduce", kernel_source="vLLM_custom_graph", allreduce_dtype="bfloat16", num_gpus=8)
    exact = query(db, ALLREDUCE, **key, message_size=1 << 24)
    assert exact.kind == "exact" and exact.latency_ms == stored_latency(path, {**key, "message_size": 1 << 24})
    between = query(db, ALLREDUCE, **key, message_size=3 << 23)
    assert between.kind == "interpolated"
    assert stored_latency(path, {**key, "message_size": 1 << 24}) < between.latency_ms < stored_latency(
        path, {**key, "message_size": 1 << 25})
    beyond = query(db, ALLREDUCE, **key, message_size=3 << 28)
    top = query(db, ALLREDUCE, **key, message_size=1 << 29)
    assert beyond.kind == "extrapolated" and beyond.latency_ms == pytest.approx(
        top.latency_ms * roofline_ratio(db, ALLREDUCE, {**key, "message_size": 1 << 29}, "message_size", 3 << 28,
                                        1 << 29), rel=1e-12)


def test_custom_allreduce_in_bytes_is_rejected(db, models, tmp_path: Path) -> None:
    ref = variant(db, tmp_path, ALLREDUCE, lambda t: set_col(t, "message_size", column(t, "message_size") * 2))
    f = only(rejected(ref, models), E.BeyondRooflineError)
    assert "the system's link: bus bytes 2(n-1)/n * message bytes / latency" in str(f)
    assert f.values["max_utilisation"] > 2  # 1.04 of NVLink's 450 GB/s in the real file, read as half the bytes
    assert f.fix == "store message_size as the number of elements (not bytes) each rank all-reduces"


def test_nccl_queries_by_release(db: modperf.Database) -> None:
    key = dict(op_name="all_gather", kernel_source="NCCL", nccl_dtype="half", num_gpus=8, message_size=1 << 20)
    answer = query(db, NCCL, **key)
    assert answer.kind == "exact" and answer.latency_ms == stored_latency(db.ref(*NCCL).path, key)
    assert (answer.backend, answer.version) == ("nccl", "2.29.2")
    between_neighbours(db, NCCL, {k: v for k, v in key.items() if k != "message_size"}, "message_size")


def test_nccl_with_per_rank_all_gather_is_rejected(db, models, tmp_path: Path) -> None:
    def per_rank(t: pa.Table) -> pa.Table:
        gather = column(t, "op_name") == "all_gather"
        return set_col(t, "message_size", np.where(gather, column(t, "message_size") // column(t, "num_gpus"),
                                                   column(t, "message_size")))

    f = only(rejected(variant(db, tmp_path, NCCL, per_rank), models), E.ConventionError)
    assert "all_gather sizes the whole buffer" in str(f) and f.values["median_ratio"] > 1.6
    assert f.values["step"] == {"op_name": ["reduce_scatter", "all_gather"]}


def test_nccl_in_bytes_is_rejected(db, models, tmp_path: Path) -> None:
    """On a PCIe host no row nears the link rate, so the ceiling is blind there; the elements
    guard (half at m against int8 at 2m) is not."""
    slot = ("rtx_pro_6000_server", "nccl", "2.29.2", "nccl")

    def in_bytes(t: pa.Table) -> pa.Table:
        return set_col(t, "message_size", column(t, "message_size") * np.where(column(t, "nccl_dtype") == "int8", 1, 2))

    f = only(rejected(variant(db, tmp_path, slot, in_bytes), models), E.ConventionError)
    assert "message_size counts elements" in str(f) and f.values["median_ratio"] > 1.8  # twice the bytes


def test_oneccl_all_gather_is_keyed_by_the_whole_buffer(db, models, tmp_path: Path) -> None:
    slot = ("b60", "oneccl", "2021.15.9", "oneccl")
    path = db.ref(*slot).path
    stored = {"op_name": "all_gather", "nccl_dtype": "half", "num_gpus": 4, "message_size": 1 << 20}
    answer = query(db, slot, kernel_source="oneCCL", **{**stored, "message_size": 4 << 20})
    assert answer.kind == "exact" and answer.latency_ms == stored_latency(path, stored)

    def whole(t: pa.Table) -> pa.Table:
        gather = column(t, "op_name") == "all_gather"
        return set_col(t, "message_size", np.where(gather, column(t, "message_size") * column(t, "num_gpus"),
                                                   column(t, "message_size")))

    # counted twice, the all_gather buffers would cross PCIe faster than it carries bytes
    f = only(rejected(variant(db, tmp_path, slot, whole), models), E.BeyondRooflineError)
    assert {w["op_name"] for w in f.values["worst"]} == {"all_gather"}
    assert f.fix.startswith("oneCCL tables store each rank's all_gather send count")


# --- quantize ---------------------------------------------------------------------------------

SCALE = ("h200_sxm", "vllm", "0.24.0", "scale_matrix")
COMPUTESCALE = ("b200_sxm", "sglang", "0.5.14", "computescale")


def test_quantize_queries_and_zero_latencies(db: modperf.Database) -> None:
    path = db.ref(*SCALE).path
    key = dict(op_name="scale_matrix", kernel_source="static_scaled_fp8_quant", quant_dtype="fp8", k=7168)
    exact = query(db, SCALE, **key, m=4096)
    assert exact.kind == "exact" and exact.latency_ms == stored_latency(path, {**key, "m": 4096})
    ms = sorted(set(column(stored_rows(path, key), "m").tolist()))
    lo, hi = [(a, b) for a, b in zip(ms, ms[1:]) if a >= 4096 and b - a > 1][0]
    between = query(db, SCALE, **key, m=(lo + hi) // 2)
    assert between.kind == "interpolated"
    assert stored_latency(path, {**key, "m": lo}) < between.latency_ms < stored_latency(path, {**key, "m": hi})
    # computescale stores max(0, dynamic - static): zeros load and answer as stored
    keyed = load_table(db.ref(*COMPUTESCALE), ModelRegistry.default())
    assert (keyed.latency == 0).sum() > 1600


def test_scale_matrix_wider_than_the_rank_is_rejected(db, models, tmp_path: Path) -> None:
    ref = variant(db, tmp_path, SCALE, lambda t: set_col(t, "k", column(t, "k") * 2))
    f = only(rejected(ref, models), E.BeyondRooflineError)
    assert "rows moving >= 512 MiB, beyond the L2 cache" in str(f)


# --- linear attention, kda, mhc, encoder attention, mlp -----------------------------------------

GDN = ("h200_sxm", "vllm", "0.24.0", "gdn")
KDA = ("h200_sxm", "vllm", "0.1.dev19262", "kda")
MAMBA = ("h200_sxm", "trtllm", "1.3.0rc20", "mamba2")


def _heads_native(models: ModelRegistry, fields: tuple[str, str]):
    def mutate(t: pa.Table) -> pa.Table:
        model = column(t, "model_name")
        k, v = column(t, "num_k_heads").copy(), column(t, "num_v_heads").copy()
        for name in set(model.tolist()):
            if name in models:
                cfg = models.get(name)
                k[model == name], v[model == name] = cfg.get(fields[0]), cfg.get(fields[1])
        return set_col(set_col(t, "num_k_heads", k), "num_v_heads", v)
    return mutate


def test_gdn_local_heads(db, models, tmp_path: Path) -> None:
    path = db.ref(*GDN).path
    key = dict(op_name="gdn", phase="context", num_k_heads=4, head_k_dim=128, num_v_heads=16, head_v_dim=128,
               d_conv=4, batch_size=8)
    kernels = sorted(set(column(stored_rows(path, key), "kernel_source").tolist()))
    key["kernel_source"] = kernels[0]
    exact = query(db, GDN, **key, seq_len=4096)
    assert exact.kind == "exact" and exact.latency_ms == stored_latency(path, {**key, "seq_len": 4096})
    between = query(db, GDN, **key, seq_len=6144)
    assert between.kind == "interpolated"
    assert exact.latency_ms < between.latency_ms < stored_latency(path, {**key, "seq_len": 8192})
    ref = variant(db, tmp_path, GDN, _heads_native(models, ("linear_num_key_heads", "linear_num_value_heads")))
    f = only(rejected(ref, models), E.DuplicateSpreadError)
    assert "rows of one model_name sharing a full key disagree" in str(f)
    assert "store the heads one rank ran (native // tp)" in f.fix


def test_kda_local_heads(db, models, tmp_path: Path) -> None:
    path = db.ref(*KDA).path
    r = stored_rows(path, {"phase": "generation", "num_v_heads": 24}).slice(2, 1).to_pylist()[0]
    key = {k: r[k] for k in ("op_name", "kernel_source", "phase", "num_k_heads", "head_k_dim", "num_v_heads",
                             "head_v_dim", "d_conv", "batch_size", "seq_len")}
    assert query(db, KDA, **key).latency_ms == stored_latency(path, key)
    between_neighbours(db, KDA, {k: v for k, v in key.items() if k != "batch_size"}, "batch_size")
    ref = variant(db, tmp_path, KDA, _heads_native(models, ("linear_attn_config.num_heads",) * 2))
    only(rejected(ref, models), E.DuplicateSpreadError)


def test_mamba2_heads_are_the_unsharded_mixer(db, models, tmp_path: Path) -> None:
    ref = variant(db, tmp_path, MAMBA, lambda t: set_col(t, "nheads", column(t, "nheads") // 2))
    failures = rejected(ref, models)
    assert {type(f) for f in failures} == {E.NativeContractError}
    assert {f.values["model"] for f in failures} == {m for m in set(column(stored_rows(db.ref(*MAMBA).path, {}),
                                                                            "model_name").tolist()) if m in models}


MHC = ("b200_sxm", "sglang", "0.5.14", "mhc_module")
ENCODER = ("h200_sxm", "vllm", "0.24.0", "encoder_attention")
MLP = ("h200_sxm", "sglang", "0.5.6.post2", "wideep_context_mlp")


def test_mhc_hidden_is_the_full_residual(db, models, tmp_path: Path) -> None:
    path = db.ref(*MHC).path
    r = stored_rows(path, {"hidden_size": 7168}).slice(4, 1).to_pylist()[0]
    key = {k: r[k] for k in ("op_name", "kernel_source", "hidden_size", "hc_mult", "num_sites", "sinkhorn_iters",
                             "num_tokens")}
    assert query(db, MHC, **key).latency_ms == r["latency"]
    between_neighbours(db, MHC, {k: v for k, v in key.items() if k != "num_tokens"}, "num_tokens")
    ref = variant(db, tmp_path, MHC, lambda t: set_col(t, "hidden_size", column(t, "hidden_size") // 2))
    f = only(rejected(ref, models), E.InvariantError)
    assert "hidden_size, hc_mult, sinkhorn_iters match no model config of the row's architecture" in str(f)


def test_encoder_attention_local_heads(db, models, tmp_path: Path) -> None:
    path = db.ref(*ENCODER).path
    key = dict(op_name="encoder_attention", kernel_source="vllm_vit_flash_attn_fa3", attn_dtype="bfloat16",
               head_dim=80, batch_size=4)
    exact = query(db, ENCODER, **key, num_heads=16, isl=4096)
    assert exact.kind == "exact" and exact.latency_ms == stored_latency(path, {**key, "num_heads": 16, "isl": 4096})
    assert exact.fields["num_heads"] == 16
    between_neighbours(db, ENCODER, {**key, "num_heads": 16}, "isl")
    ref = variant(db, tmp_path, ENCODER, lambda t: set_col(t, "num_heads", np.full(t.num_rows, 16)))
    f = only(rejected(ref, models), E.DuplicateSpreadError)
    assert f.values["median_spread"] > 1


def test_mlp_latency_column_is_avg_ms(db, models, tmp_path: Path) -> None:
    path = db.ref(*MLP).path
    r = stored_rows(path, {}).slice(9, 1).to_pylist()[0]
    answer = query(db, MLP, op_name=r["op_name"], kernel_source=r["kernel_source"], quant_type=r["quant_type"],
                   hidden_size=r["hidden_size"], intermediate_size=r["intermediate_size"], num_tokens=r["num_token"])
    assert answer.kind == "exact" and answer.latency_ms == r["avg_ms"]
    between_neighbours(db, MLP, dict(op_name=r["op_name"], kernel_source=r["kernel_source"], quant_type=r["quant_type"],
                                     hidden_size=r["hidden_size"], intermediate_size=r["intermediate_size"]),
                       "num_tokens")
    ref = variant(db, tmp_path, MLP, lambda t: set_col(t, "intermediate_size", column(t, "intermediate_size") * 8))
    f = only(rejected(ref, models), E.BeyondRooflineError)
    assert f.fix == "store the intermediate size one rank multiplied"
