"""The serving model's arithmetic (modperf.serving), on step times whose answers are solved by
hand here; the op-table side is tested in test_predict."""

from __future__ import annotations

import math

import pytest

from modperf import errors as E
from modperf.serving import (
    BACKENDS,
    AggInputs,
    Constants,
    DisaggInputs,
    aggregated,
    chunk_tokens,
    chunks,
    disaggregated,
    kv_budget_bytes,
    packed_requests,
    system_memory,
)

PHYSICS = Constants()


def inputs(batch: int, max_running: int = 1000, osl: int = 11) -> AggInputs:
    # one prefill 100 ms (alone or packed: one request per step), a decode step 10 ms, a step
    # carrying the decodes and a prefill 110 ms
    return AggInputs(batch=batch, isl=1000, osl=osl, prefill_one_ms=100.0, packed=1, prefill_packed_ms=100.0,
                     decode_ms=10.0, capped_ms=110.0, max_running=max_running)


def test_one_user_decodes_at_the_decode_step_and_waits_half_a_step() -> None:
    out = aggregated(inputs(1), PHYSICS)
    assert out.tpot_ms == pytest.approx(10.0, rel=1e-9)
    assert out.ttft_ms == pytest.approx(100.0 + 5.0, rel=1e-9)


def test_two_users_by_hand() -> None:
    """B = 2, O = 11: X = 2 / (TTFT + 10 T), U = X * 100 / 2, T = 10 / (1 - U), TTFT = T / 2 + 100.
    Substituting: 10.5 T^2 - 105 T - 1000 = 0."""
    t = (105 + math.sqrt(105**2 + 4 * 10.5 * 1000)) / 21
    out = aggregated(inputs(2), PHYSICS)
    assert out.tpot_ms == pytest.approx(t, rel=1e-9)
    assert out.ttft_ms == pytest.approx(t / 2 + 100, rel=1e-9)
    rate = out.detail["requests_per_s_per_rank"] / 1000
    assert rate * (out.ttft_ms + 10 * out.tpot_ms) == pytest.approx(2, rel=1e-9)  # Little's law
    assert out.detail["capacity_bound"] is False


def test_constants_scale_the_steps_and_add_the_frontend_and_the_wave() -> None:
    c = Constants(s_pre=0.5, s_dec=2.0, tau0_ms=30.0, kappa=1.0)
    out = aggregated(inputs(1), c)
    assert out.tpot_ms == pytest.approx(20.0)
    assert out.ttft_ms == pytest.approx(30.0 + 10.0 + 50.0)
    # kappa = 1: a user queues behind half of the other users' prefills
    three = aggregated(inputs(3), Constants(kappa=1.0))
    no_wave = aggregated(inputs(3), PHYSICS)
    assert three.detail["queue_ms"] == pytest.approx(100.0)
    # the wave lengthens the cycle, so prefills come less often and the decodes run faster
    assert three.ttft_ms > no_wave.ttft_ms + 90 and three.tpot_ms < no_wave.tpot_ms


def test_past_the_prefill_capacity_ttft_grows_linearly() -> None:
    """Far past capacity one request completes per capped step: the cycle TTFT + 10 TPOT is
    B * 110 ms, so X = 1 / 110 per ms and the decodes share the engine with prefills
    U = (100 / 110) (B - 1) / B of the time."""
    for batch in (400, 800):
        out = aggregated(inputs(batch), PHYSICS)
        assert out.detail["capacity_bound"] is True
        assert out.ttft_ms + 10 * out.tpot_ms == pytest.approx(batch * 110.0, rel=1e-6)
        assert out.tpot_ms == pytest.approx(10.0 / (1 - 100 / 110 * (batch - 1) / batch), rel=1e-6)


def test_requests_beyond_the_kv_cache_wait_for_admission() -> None:
    """One request fits: the other two wait one and two cycles of 105 + 10 * 10 ms."""
    out = aggregated(inputs(3, max_running=1), PHYSICS)
    assert out.tpot_ms == pytest.approx(10.0)
    assert out.detail["admission_wait_ms"] == pytest.approx(2 * 205.0)
    assert out.ttft_ms == pytest.approx(105.0 + 410.0)
    with pytest.raises(E.NotCoveredError, match="the KV cache of one rank does not hold one request"):
        aggregated(inputs(3, max_running=0), PHYSICS)


def test_disaggregated_by_hand() -> None:
    x = DisaggInputs(concurrency=4, isl=1000, osl=11, prefill_ranks=2, prefill_one_ms=100.0,
                     prefill_packed_ms=100.0, packed=1, decode_ms=12.0, kv_transfer_ms=3.0)
    out = disaggregated(x, Constants(s_pre=1.0, s_dec=1.0, tau0_ms=50.0, kappa=0.5))
    assert out.tpot_ms == 12.0
    # 4 users over 2 prefill ranks: 2 each, a wave of (2 - 1) / 2 prefills at kappa 0.5
    assert out.ttft_ms == pytest.approx(50.0 + 100.0 + 3.0 + 0.5 * 0.5 * 100.0)
    assert out.detail["capacity_bound"] is False
    # the prefill pool's capacity: 800 users need 400 prefills of 100 ms per rank per cycle
    busy = disaggregated(DisaggInputs(800, 1000, 11, 2, 100.0, 100.0, 1, 12.0, 3.0), Constants())
    assert busy.detail["capacity_bound"] is True
    assert busy.ttft_ms == pytest.approx(800 * 100.0 / 2 - 10 * 12.0)


def test_backend_defaults_from_the_system_files() -> None:
    h200, b200 = system_memory("h200_sxm"), system_memory("b200_sxm")
    assert h200.capacity == 151397597184 and h200.other == 3758096384  # h200_sxm.yaml
    assert chunk_tokens(BACKENDS["sglang"], h200.capacity) == 8192
    assert chunk_tokens(BACKENDS["sglang"], b200.capacity) == 16384
    assert chunk_tokens(BACKENDS["vllm"], b200.capacity) == 8192
    budget = kv_budget_bytes(BACKENDS["vllm"], mem_capacity=h200.capacity, weights=64e9, other=h200.other,
                             chunk=8192, gpus=1)
    assert budget == pytest.approx(0.9 * 151397597184 - 64e9 - 3758096384)
    assert packed_requests(64, 1000, 8192) == 8 and packed_requests(64, 9000, 8192) == 1
    assert chunks(15000, 8192) == [(8192, 0), (6808, 8192)]
    with pytest.raises(E.SystemSpecError, match="no memory size for system 'nope'"):
        system_memory("nope")


def test_an_eager_step_is_at_least_its_ops_times_the_host_time_per_op() -> None:
    """900 ops at 0.2 ms each: every step carrying prefill takes at least 180 ms (the 100 ms
    prefill is host-bound); the graphed decode step does not."""
    x = AggInputs(batch=1, isl=1000, osl=11, prefill_one_ms=100.0, packed=1, prefill_packed_ms=100.0, decode_ms=10.0,
                  capped_ms=110.0, max_running=10, prefill_ops=900, prefill_chunks=1)
    out = aggregated(x, Constants(host_op_ms=0.2))
    assert out.tpot_ms == pytest.approx(10.0) and out.ttft_ms == pytest.approx(180.0 + 5.0)
    assert aggregated(x, Constants(host_op_ms=0.05)).ttft_ms == pytest.approx(100.0 + 5.0)


def test_a_prefill_first_scheduler_caps_tpot_with_a_decode_step_plus_a_prefill_step() -> None:
    """Far past capacity a decoding user waits through a decode step and a whole prefill step
    (prefill first) instead of one step carrying both (mixed): 10 + 100 ms against 110 ms here,
    the same by construction; with a mixed step of 40 ms the two differ."""
    mixed = AggInputs(batch=800, isl=1000, osl=11, prefill_one_ms=100.0, packed=1, prefill_packed_ms=100.0,
                      decode_ms=10.0, capped_ms=40.0, max_running=1000)
    alone = AggInputs(**{**mixed.__dict__, "scheduler": "prefill_first"})
    assert aggregated(mixed, PHYSICS).detail["capped_step_ms"] == pytest.approx(40.0)
    assert aggregated(alone, PHYSICS).detail["capped_step_ms"] == pytest.approx(110.0)
    assert aggregated(alone, PHYSICS).ttft_ms > aggregated(mixed, PHYSICS).ttft_ms
