"""modperf.serving.percentiles on real tables: the simulation's grid is the closed form's pricer
(step_cost) at its points, one user's answer is computed here by hand from step_cost, each
backend's scheduler, and the refusals."""

from __future__ import annotations

import pytest

import modperf
from modperf import errors as E
from modperf.model.step import DecodePart, Parallel, SeqChunk, step_cost
from modperf.serving import backend_of
from modperf.serving.percentiles import SimConstants, percentiles, prepare, run, scheduler_for
from modperf.serving.predict import deployment_from_row, price

QWEN = dict(model_path="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", mode="agg", isl=1024, osl=128, tp_size=2)
COMMON = dict(model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", parallel=Parallel(tp=2))


def test_the_grid_is_step_cost_at_its_points(db: modperf.Database) -> None:
    """Decode steps at grid points are step_cost's; a step of prefill beside decodes is the
    decode step plus what the prefill tokens add plus their attention; eight prompts packed in
    one step match step_cost's packed step but for the logits of seven more sequences."""
    grid = prepare(price(db, deployment_from_row({**QWEN, "batch_size": 16}))).steps
    assert grid.decode_batch == (1, 2, 3, 4, 6, 8, 11, 16) and grid.decode_kv == (1025, 1088, 1152)
    for d, kv in ((1, 1025), (16, 1088), (16, 1152)):
        assert grid.decode(d, kv) == pytest.approx(step_cost(db, **COMMON, decode=DecodePart(d, kv)).total_ms,
                                                   rel=1e-12)
    mixed = step_cost(db, **COMMON, prefill=SeqChunk(1, 1024), decode=DecodePart(16, 1088)).total_ms
    assert grid.decode(16, 1088) + grid.extra(1024, 16) + grid.attention(1, 1024) == pytest.approx(mixed, rel=1e-12)
    one = step_cost(db, **COMMON, prefill=SeqChunk(1, 1024)).total_ms
    assert grid.extra(1024, 0) + grid.attention(1, 1024) == pytest.approx(one, rel=1e-12)
    packed = step_cost(db, **COMMON, prefill=SeqChunk(8, 1024)).total_ms
    assert grid.extra(8192, 0) + 8 * grid.attention(8, 1024) == pytest.approx(packed, rel=1e-4)


def test_one_user_from_step_cost(db: modperf.Database) -> None:
    """Physics only, one user: every request prefills alone (TTFT = the prefill step) and
    decodes alone at kv isl + 1 ... isl + osl - 1, so its TPOT is the decode step on the line
    through kv isl + 1 and isl + osl, at the mean kv isl + osl / 2."""
    dep = deployment_from_row({**QWEN, "batch_size": 1})
    out = percentiles(db, dep, fitted=False)
    p1 = step_cost(db, **COMMON, prefill=SeqChunk(1, 1024)).total_ms
    y1 = step_cost(db, **COMMON, decode=DecodePart(1, 1025)).total_ms
    y2 = step_cost(db, **COMMON, decode=DecodePart(1, 1024 + 128)).total_ms
    tpot = y1 + (y2 - y1) * (128 / 2 - 1) / (128 - 1)
    for name, value in (("ttft_ms", p1), ("tpot_ms", tpot), ("e2e_ms", p1 + 127 * tpot)):
        assert out[name] == pytest.approx({"p50": value, "p90": value, "p99": value, "mean": value}, rel=1e-9)
    assert out["loop"] == "closed" and out["concurrency"] == 1 and out["requests"] == 1000
    assert out["tokens_per_s_per_user"] == pytest.approx(1000 / tpot)
    assert out["tokens_per_s_per_gpu"] == pytest.approx(128 / (p1 + 127 * tpot) * 1000 / 2)
    assert out["constants"] == {"source": "physics only: no fitted constants", "s_pre": 1.0, "s_dec": 1.0,
                                "tau0_ms": 0.0, "osl_spread": 0.0}
    assert out["stats"]["preemptions"] == 0 and out["stats"]["max_running"] == 1


def test_backends_schedulers(db: modperf.Database) -> None:
    """Each backend's scheduler: its step budget and running limit are the serving model's
    (SGLang's chunk doubles on GPUs of 160 GB and more), its KV cache in tokens the serving
    model's memory rule divided by the bytes a token takes."""
    seen = {}
    for backend in ("vllm", "trtllm", "sglang"):
        priced = price(db, deployment_from_row({**QWEN, "backend": backend, "batch_size": 16}))
        s = scheduler_for(priced)
        assert s.kv_tokens == int(priced.memory["kv_budget_gib_per_gpu"] * 2**30 // priced.memory["kv_bytes_per_token"])
        seen[backend] = (s.step_tokens, s.max_running, s.mixed, s.chunked, s.admission)
    assert seen == {"vllm": (8192, 1024, True, True, "as_needed"), "trtllm": (8192, 2048, True, True, "whole_sequence"),
                    "sglang": (8192, 1 << 20, False, True, "new_token_ratio")}


def test_open_loop_and_its_seed(db: modperf.Database) -> None:
    """An open loop over two attention-DP ranks gives each rank half the rate; a seed
    reproduces the run."""
    dep = deployment_from_row({**QWEN, "batch_size": 64, "attention_dp_size": 2})
    prepared = prepare(price(db, dep), request_rate=3.0)
    assert prepared.scheduler.max_running == 64  # the batch caps the running requests of a rank
    a = run(prepared, SimConstants(), request_rate=3.0, requests=3000, seed=5)
    b = run(prepared, SimConstants(), request_rate=3.0, requests=3000, seed=5)
    c = run(prepared, SimConstants(), request_rate=3.0, requests=3000, seed=6)
    assert a.workload.request_rate == 1.5 and a.ttft_ms.tolist() == b.ttft_ms.tolist() != c.ttft_ms.tolist()
    assert a.stats["requests_per_s"] == pytest.approx(1.5, rel=0.05)


def test_refusals(db: modperf.Database) -> None:
    disagg = deployment_from_row({"model_path": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm",
                                  "mode": "disagg", "isl": 1024, "osl": 128, "prefill_tp_size": 2,
                                  "prefill_num_workers": 1, "decode_tp_size": 2, "decode_num_workers": 1,
                                  "decode_batch_size": 8})
    with pytest.raises(E.OptionValueError, match="aggregated deployments only"):
        percentiles(db, disagg)
    with pytest.raises(E.OptionValueError, match="one pipeline stage"):
        percentiles(db, deployment_from_row({**QWEN, "batch_size": 8, "pp_size": 2}))


def test_output_spread_breaks_the_wave(db: modperf.Database) -> None:
    """Qwen3-32B in fp8 on h100 TRT-LLM at tp 1, 64 users of isl 2048 / osl 128 (a
    calibration row: TTFT 818 ms, TPOT 98.5 ms measured). With every output 128 tokens the closed loop locks
    into a wave: the prompts prefilled in back-to-back full steps (four a step) finish in
    back-to-back decode steps and come back as one burst, which queues for the next full
    steps; a 10 % spread in output lengths breaks the wave. The step scales and the frontend
    time are the closed form's fitted ones for TRT-LLM on Hopper (docs/serving.md, "What it
    simulates", gives the figures)."""
    dep = deployment_from_row({"model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "backend": "trtllm",
                               "mode": "agg", "isl": 2048, "osl": 128, "batch_size": 64, "tp_size": 1,
                               "gemm_quant_mode": "fp8"})
    prepared = prepare(price(db, dep))
    closed_form = backend_of("trtllm").constants("agg", "h100_sxm")[0]
    c = SimConstants(s_pre=closed_form.s_pre, s_dec=closed_form.s_dec, tau0_ms=closed_form.tau0_ms)
    exact = run(prepared, c)
    spread = run(prepared, SimConstants(c.s_pre, c.s_dec, c.tau0_ms, osl_spread=0.1))
    assert exact.summary()["ttft_ms"]["p50"] > 3000 and spread.summary()["ttft_ms"]["p50"] < 1000
    assert spread.summary()["tpot_ms"]["mean"] > 1.1 * exact.summary()["tpot_ms"]["mean"]
