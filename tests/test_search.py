"""modperf.search: the space, the counts, the fronts against hand-priced deployments, the
limits and loads, the dtype refusals, the launch commands and the files (docs/search.md)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import pytest

import modperf
from modperf import errors as E
from modperf.search import REASONS, front, search
from modperf.search.files import write_outputs
from modperf.search.space import (
    BATCHES,
    DECODE_BATCHES,
    Layout,
    budgets,
    layouts,
    prefill_batches,
    prefill_pools,
    worker_gpus,
)
from modperf.serving.predict import Deployment, Pool, constants_for, pool_memory_of, predict, price, serving_of, solve

QWEN = dict(model="Qwen/Qwen3-32B", system="h200_sxm", gpus=8, isl=4000, osl=500)
LIMITS = dict(ttft_ms=1000.0, tpot_ms=30.0)


@pytest.fixture(scope="module")
def qwen(db: modperf.Database):
    """The issue's example on vLLM: both modes, every kept deployment returned."""
    return search(db, **QWEN, backend="vllm", **LIMITS, keep_points=True, launch=True, top=3)


def _figures(p):
    return (p.ttft_ms, p.tpot_ms, p.tokens_per_s_per_gpu, p.tokens_per_s_per_user)


def _dominates(a, b) -> bool:
    return (a.tokens_per_s_per_gpu >= b.tokens_per_s_per_gpu and a.tokens_per_s_per_user >= b.tokens_per_s_per_user
            and (a.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu or a.tokens_per_s_per_user > b.tokens_per_s_per_user))


def test_front_points_are_predicts_answers_bit_for_bit(db: modperf.Database, qwen) -> None:
    for mode in ("agg", "disagg"):
        assert qwen.fronts[mode], mode
        for p in qwen.fronts[mode]:
            got = predict(db, p.deployment)
            assert _figures(p) == (got.ttft_ms, got.tpot_ms, got.tokens_per_s_per_gpu, got.tokens_per_s_per_user)
            assert p.prediction is not None and _figures(p) == _figures(p.prediction)
            if mode == "agg":  # R replicas of one replica: the whole deployment's users and GPUs
                assert p.gpus == p.replicas * got.gpus and p.concurrency == p.replicas * got.serving["concurrency"]
            else:
                assert (p.gpus, p.concurrency) == (got.gpus, got.serving["concurrency"])


def test_no_deployment_kept_dominates_a_front_point(qwen) -> None:
    assert qwen.kept is not None
    for mode in ("agg", "disagg"):
        kept = qwen.kept[mode]
        assert len(kept) == qwen.total(mode).kept
        for p in qwen.fronts[mode]:
            assert not any(_dominates(q, p) for q in kept)
        # every kept deployment is on the front or dominated by (or level with) a front point
        for q in kept:
            assert any(_dominates(p, q) or _figures(p)[2:] == _figures(q)[2:] for p in qwen.fronts[mode])
        assert qwen.fronts[mode] == front(qwen.fronts[mode])
        assert all(qwen.limits.meets(p.ttft_ms, p.tpot_ms) for p in kept)


def test_the_aggregated_space_is_every_layout_budget_and_batch_priced_by_hand(db: modperf.Database, qwen) -> None:
    """Each (tp, token budget, batch) of vLLM's aggregated space, priced here with predict and
    the memory rule: the kept set and every reason's count are the search's."""
    base = Deployment("Qwen/Qwen3-32B", "h200_sxm", "vllm", "agg", 4000, 500)
    served = serving_of(db, replace(base, pool=Pool(tp=1, batch=1)))
    kept, why = set(), {r: 0 for r in REASONS}
    assert budgets(8192) == [2048, 4096, 8192, 16384]
    for g in worker_gpus(8):
        assert layouts("vllm", g, has_moe=False) == [Layout(g)]
        for budget in budgets(8192):
            at_budget = replace(base, token_budget=budget)
            try:
                running = pool_memory_of(at_budget, Pool(tp=g), replace(served, chunk=budget)).max_running
            except E.DeploymentFitError:
                running = 0
            for batch in BATCHES:
                if batch > running:
                    why["memory"] += 1
                    continue
                try:
                    got = predict(db, replace(base, token_budget=budget, pool=Pool(tp=g, batch=batch)))
                except E.ModperfError:
                    why["no_table"] += 1
                    continue
                if got.ttft_ms <= 1000 and got.tpot_ms <= 30:
                    kept.add((g, budget, batch, 8 // g))
                else:
                    why["over_limit"] += 1
    assert qwen.kept is not None
    assert {(p.deployment.pool.tp, p.deployment.token_budget, p.deployment.pool.batch, p.replicas)
            for p in qwen.kept["agg"]} == kept
    counts = qwen.total("agg")
    assert counts.left_out == {r: n for r, n in why.items() if n}
    assert counts.enumerated == 4 * 4 * len(BATCHES) == counts.kept + sum(counts.left_out.values())
    assert counts.evaluated == counts.kept + counts.left_out["over_limit"]
    # the memory rule prunes tp1 at 60 running requests of 4000 + 250 tokens (vLLM allocates as it goes)
    assert pool_memory_of(base, Pool(tp=1), served).max_running == 60
    assert "tp1 budget 2048 batch 64: 60 request(s) of 4250 tokens fit per GPU" in counts.examples["memory"][0]


def test_a_deployment_predict_refuses_as_not_fitting_is_pruned_for_memory(db: modperf.Database) -> None:
    """Llama-3.1-70B in bf16 on one H200: vLLM's rule leaves no KV room beside the weights, so
    predict refuses every tp1 deployment (DeploymentFitError); the search counts each of them
    (4 token budgets x every batch) as left out for memory, with predict's message."""
    dep = Deployment("meta-llama/Llama-3.1-70B", "h200_sxm", "vllm", "agg", 4000, 500, token_budget=2048,
                     pool=Pool(tp=1, batch=1))
    with pytest.raises(E.DeploymentFitError) as refused:
        predict(db, dep)
    assert refused.value.kind == "does_not_fit"
    got = search(db, model="meta-llama/Llama-3.1-70B", system="h200_sxm", gpus=1, isl=4000, osl=500,
                 backend="vllm", mode="agg")
    counts = got.total("agg")
    assert counts.enumerated == 4 * len(BATCHES) == counts.left_out["memory"]
    assert counts.evaluated == counts.kept == 0 and got.fronts["agg"] == []
    assert counts.examples["memory"][0] == f"tp1 budget 2048: {refused.value.detail[:200]}"
    assert "vllm's default memory rule leaves 0.00 GiB per GPU of one GPU for the KV cache" in \
        counts.examples["memory"][0]


def test_disaggregated_counts_add_up_and_each_split_fits_the_gpus(db: modperf.Database, qwen) -> None:
    c = qwen.total("disagg")
    assert c.enumerated == c.kept + sum(c.left_out.values())
    assert c.evaluated == c.kept + c.left_out["over_limit"]
    # every (prefill layout, prefill batch) x (decode layout, batch) x (P, D) with P gp + D gd <= 8
    sizes = [g for g in worker_gpus(8) if g < 8]
    pairs = sum(1 for gp in sizes for gd in sizes for p in range(1, 8) for d in range(1, 8) if p * gp + d * gd <= 8)
    # budgets of the prefill workers: 2048 chunks the prompt; 4096, 8192 and 16384 pack 1, 2, 4
    assert prefill_pools(4000, 8192) == [(2048, 1), (4096, 1), (8192, 2), (16384, 4)]
    assert c.enumerated == pairs * 4 * len(DECODE_BATCHES)
    assert qwen.kept is not None
    assert all(p.gpus <= 8 for p in qwen.kept["disagg"])
    best = next(p for p in qwen.best if p.mode == "disagg")
    assert best.tokens_per_s_per_gpu == max(p.tokens_per_s_per_gpu for p in qwen.kept["disagg"])


def test_the_top_is_ranked_and_the_best_is_the_first(qwen) -> None:
    for mode in ("agg", "disagg"):
        top = qwen.top[mode]
        assert len(top) == 3
        assert [p.tokens_per_s_per_gpu for p in top] == sorted((p.tokens_per_s_per_gpu for p in top), reverse=True)
        assert next(p for p in qwen.best if p.mode == mode) is top[0]
    doc = json.loads(json.dumps(qwen.to_dict()))
    assert set(doc) >= {"fronts", "best", "top", "counts", "limits", "backends", "modes", "notes"}
    point = doc["best"][0]
    assert set(point) >= {"ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "concurrency",
                          "gpus", "deployment", "priced", "launch"}
    assert set(point["priced"]) == {"kinds", "versions", "substitutions", "notes", "constants"}
    assert doc["counts"]["agg"]["total"]["left_out"]["memory"] == qwen.total("agg").left_out["memory"]


def test_launch_commands_spell_vllm_flags(qwen) -> None:
    agg = next(p for p in qwen.best if p.mode == "agg")
    pool = agg.deployment.pool
    assert agg.launch is not None and len(agg.launch) == agg.replicas
    first = agg.launch[0]["command"]
    assert first.startswith("CUDA_VISIBLE_DEVICES=" + ",".join(map(str, range(pool.tp))) + " vllm serve Qwen/Qwen3-32B")
    budget = agg.deployment.token_budget
    assert f"--tensor-parallel-size {pool.tp} --max-num-seqs {pool.batch} --max-num-batched-tokens {budget}" in first
    dis = next(p for p in qwen.best if p.mode == "disagg")
    roles = [x["role"] for x in dis.launch]
    assert roles[-1] == "router" and len(roles) == dis.deployment.prefill.workers + dis.deployment.decode.workers + 1
    assert '"kv_role":"kv_producer"' in dis.launch[0]["command"] and "--kv-transfer-config" in dis.launch[0]["command"]
    assert dis.launch[-1]["command"].startswith("python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py")


def test_sglang_and_trtllm_launch_commands(db: modperf.Database) -> None:
    r = search(db, **QWEN, backend="sglang", **LIMITS, top=1, launch=True)
    agg = r.top["agg"][0]
    assert agg.launch[0]["command"].split(" ", 1)[1].startswith(
        f"python -m sglang.launch_server --model-path Qwen/Qwen3-32B --port 30000 --tp-size {agg.deployment.pool.tp}")
    assert f"--max-running-requests {agg.deployment.pool.batch} --chunked-prefill-size {agg.deployment.token_budget}" \
        in agg.launch[0]["command"]
    dis = r.top["disagg"][0].launch
    assert "--disaggregation-mode prefill --disaggregation-transfer-backend nixl" in dis[0]["command"]
    assert dis[-1]["command"].startswith("python -m sglang_router.launch_router --pd-disaggregation --prefill "
                                         "http://localhost:30000")
    t = search(db, **QWEN, backend="trtllm", **LIMITS, top=1, launch=True)
    agg = t.top["agg"][0]
    assert f"trtllm-serve Qwen/Qwen3-32B --host localhost --port 8000 --tp_size {agg.deployment.pool.tp} " \
           f"--max_batch_size {agg.deployment.pool.batch} --max_num_tokens {agg.deployment.token_budget}" \
        in agg.launch[0]["command"]
    dis = t.top["disagg"][0].launch
    assert dis[0]["files"]["trtllm_prefill.yaml"] == \
        "cache_transceiver_config:\n  backend: DEFAULT\ndisable_overlap_scheduler: true\n"
    assert "--config trtllm_prefill.yaml" in dis[0]["command"]
    assert dis[-1]["command"] == "trtllm-serve disaggregated -c disagg_config.yaml"
    assert "context_servers:\n  num_instances: " in dis[-1]["files"]["disagg_config.yaml"]


def test_moe_layouts_follow_each_backends_flags(db: modperf.Database) -> None:
    """vLLM's experts are tp x dp wide, tensor- or expert-parallel; SGLang takes any ep; TRT-LLM's
    attention is all tensor- or all data-parallel."""
    assert layouts("vllm", 4, True) == [Layout(4, 1, 4, 1), Layout(4, 1, 1, 4), Layout(2, 2, 4, 1),
                                        Layout(2, 2, 1, 4), Layout(1, 4, 4, 1), Layout(1, 4, 1, 4)]
    assert len(layouts("sglang", 8, True)) == 16 and Layout(4, 2, 4, 2) in layouts("sglang", 8, True)
    assert {(x.tp, x.attention_dp) for x in layouts("trtllm", 8, True)} == {(8, 1), (1, 8)}
    assert worker_gpus(12) == [1, 2, 3, 4, 6, 8, 12]
    assert prefill_batches(4000, 8192) == [1, 2] and prefill_batches(1000, 16384) == [1, 2, 4, 8, 16]


def test_concurrency_and_request_rate_fix_the_load(db: modperf.Database) -> None:
    fixed = search(db, **QWEN, backend="vllm", concurrency=64, keep_points=True)
    assert fixed.kept is not None
    assert {p.concurrency for m in ("agg", "disagg") for p in fixed.kept[m]} == {64}
    c = fixed.total("agg")
    # at each of the 4 token budgets: replicas 1..8 of tp1, 1..4 of tp2, 1..2 of tp4, one tp8; 3, 5,
    # 6 or 7 replicas do not split 64 users (tp1 x 3, 5, 6, 7 and tp2 x 3); one tp1 replica would
    # hold 64 requests, 60 fit
    assert c.enumerated == 4 * (8 + 4 + 2 + 1)
    assert (c.left_out["concurrency"], c.left_out["memory"]) == (4 * 5, 4 * 1)
    assert fixed.total("disagg").left_out.get("concurrency", 0) > 0  # e.g. 3 decode workers
    rate = search(db, **QWEN, backend="vllm", mode="agg", request_rate=2.0, keep_points=True)
    assert rate.kept is not None and rate.kept["agg"]
    for p in rate.kept["agg"]:
        pred = p.prediction
        carried = pred.serving["concurrency"] * 1000.0 / (pred.ttft_ms + 499 * pred.tpot_ms) * p.replicas
        assert carried >= 2.0
        smaller = [b for b in BATCHES if b < p.deployment.pool.batch]
        if smaller:  # the smallest batch that carries the rate
            lower = predict(db, replace(p.deployment, pool=replace(p.deployment.pool, batch=smaller[-1])))
            assert lower.serving["concurrency"] * 1000.0 / (lower.ttft_ms + 499 * lower.tpot_ms) * p.replicas < 2.0
    assert {p.gpus for p in rate.kept["agg"]} > {8}  # fewer GPUs carry the rate too


def test_tokens_per_user_is_the_tpot_limit(db: modperf.Database) -> None:
    a = search(db, **QWEN, backend="vllm", mode="agg", tokens_per_user=40.0)
    b = search(db, **QWEN, backend="vllm", mode="agg", tpot_ms=25.0)
    assert a.limits.tpot_ms == 25.0
    assert [_figures(p) for p in a.fronts["agg"]] == [_figures(p) for p in b.fronts["agg"]]
    assert all(p.tokens_per_s_per_user >= 40.0 for p in a.fronts["agg"])


def test_kv_cache_dtype_changes_the_answer_and_predict_reproduces_it(db: modperf.Database) -> None:
    bf16 = search(db, **QWEN, backend="vllm", mode="agg", top=1)
    fp8 = search(db, **QWEN, backend="vllm", mode="agg", top=1, kv_cache_dtype="fp8", keep_points=True)
    assert fp8.dtypes["kv_cache_dtype"] == "fp8"
    assert fp8.total("agg").left_out["memory"] < bf16.total("agg").left_out["memory"]  # half the bytes per token
    p = fp8.top["agg"][0]
    assert p.deployment.kv_cache_dtype == "fp8"
    got = predict(db, p.deployment)
    assert _figures(p) == (got.ttft_ms, got.tpot_ms, got.tokens_per_s_per_gpu, got.tokens_per_s_per_user)
    assert got.steps != predict(db, replace(p.deployment, kv_cache_dtype=None)).steps


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(kv_cache_dtype="int4"), E.OptionValueError,
     "--kv-cache-dtype int4: no h200_sxm/vllm attention table of Qwen/Qwen3-32B measured it"),
    (dict(gemm_type="nvfp4"), E.OptionValueError,
     "--gemm-type nvfp4: the h200_sxm/vllm gemm table (0.24.0) measured no such dtype"),
    (dict(moe_dtype="fp8"), E.QueryFieldError, "moe_quant_mode fp8: Qwen/Qwen3-32B has no MoE layers"),
    (dict(tpot_ms=30.0, tokens_per_user=20.0), E.UsageError, "--tpot-ms and --tokens-per-user say the same limit"),
    (dict(concurrency=8, request_rate=1.0), E.UsageError, "--concurrency and --request-rate each fix the load"),
    (dict(ttft_ms=0.0), E.OptionValueError, "--ttft-ms must be a positive number"),
    (dict(version="0.99.0"), E.OptionValueError, "h200_sxm/vllm holds no tables of version '0.99.0'"),
    (dict(mode="mixed"), E.OptionValueError, "--mode must be agg, disagg or both"),
])
def test_every_bad_choice_is_a_typed_error(db: modperf.Database, kwargs, error, message) -> None:
    with pytest.raises(error) as caught:
        search(db, **{**QWEN, "backend": "vllm", **kwargs})
    assert type(caught.value) is error and caught.value.detail.startswith(message)
    if "gemm_type" in kwargs:
        assert caught.value.values["measured"] == ["bfloat16", "fp8", "fp8_block"]


def test_backend_and_version_choices(db: modperf.Database) -> None:
    with pytest.raises(E.UsageError, match="--version names one backend's release"):
        search(db, **QWEN, version="0.24.0")
    with pytest.raises(E.OptionValueError, match="--backend must be one of vllm, sglang, trtllm or all"):
        search(db, **QWEN, backend="tgi")
    with pytest.raises(E.UnknownModelError):
        search(db, **{**QWEN, "model": "nobody/none"})
    pinned = search(db, **QWEN, backend="vllm", version="0.24.0", mode="agg", top=1)
    assert pinned.top["agg"][0].deployment.version == "0.24.0"


def test_out_writes_fronts_top_and_json(db: modperf.Database, qwen, tmp_path) -> None:
    written = write_outputs(qwen, tmp_path / "out")
    assert [p.name for p in written] == ["front_agg.csv", "front_disagg.csv", "top.csv", "search.json"]
    rows = list(csv.DictReader((tmp_path / "out" / "front_disagg.csv").open()))
    assert len(rows) == len(qwen.fronts["disagg"])
    first = qwen.fronts["disagg"][0]
    assert float(rows[0]["tokens_per_s_per_gpu"]) == first.tokens_per_s_per_gpu
    assert int(rows[0]["decode_batch"]) == first.deployment.decode.batch
    top = list(csv.DictReader((tmp_path / "out" / "top.csv").open()))
    assert [r["mode"] for r in top] == ["agg"] * 3 + ["disagg"] * 3
    doc = json.loads((tmp_path / "out" / "search.json").read_text())
    assert doc["counts"]["disagg"]["total"]["kept"] == qwen.total("disagg").kept
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_a_deployment_is_priced_as_predict_solves_it(db: modperf.Database) -> None:
    """The search's disaggregated figures come from the pools priced apart: the same numbers
    as price() of the whole deployment (a worker count changes only the split)."""
    dep = Deployment("Qwen/Qwen3-32B", "h200_sxm", "vllm", "disagg", 4000, 500, token_budget=4096,
                     prefill=Pool(tp=2, batch=1, workers=3), decode=Pool(tp=2, batch=48, workers=1))
    whole = solve(price(db, dep), *constants_for(dep))
    r = search(db, **QWEN, backend="vllm", mode="disagg", keep_points=True)
    assert r.kept is not None
    match = [p for p in r.kept["disagg"] if p.deployment == dep]
    assert len(match) == 1 and _figures(match[0]) == _figures(whole)
    assert not math.isnan(whole.tokens_per_s_per_gpu)
