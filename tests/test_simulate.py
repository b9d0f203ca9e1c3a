"""modperf.serving.simulate: the request-level scheduler simulation on fixed step costs, where every
answer is derived by hand (each test's docstring), and its typed refusals."""

from __future__ import annotations

import numpy as np
import pytest

from modperf import errors as E
from modperf.serving.simulate import Scheduler, StepTimes, Workload, simulate

P, D = 100.0, 10.0  # a step carrying prefill work costs P more; a decode step costs D
FIXED = StepTimes.constant(prefill_ms=P, decode_ms=D)


def vllm_like(**kw) -> Scheduler:
    return Scheduler(**{"step_tokens": 8192, "max_running": 1024, "kv_tokens": None, "admission": "as_needed", **kw})


def same(values, expected: float) -> None:
    assert np.asarray(values) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("scheduler", [
    vllm_like(),
    Scheduler(step_tokens=8192, max_running=2048, kv_tokens=10**6, admission="whole_sequence"),
    Scheduler(step_tokens=8192, max_running=10**6, kv_tokens=10**6, mixed=False, admission="new_token_ratio"),
], ids=["mixed-as-needed", "mixed-whole-sequence", "prefill-first-ratio"])
def test_one_user_is_known_exactly(scheduler: Scheduler) -> None:
    """Concurrency 1, fixed step costs: every request runs alone, so TTFT is the frontend
    delay plus one prefill step, TPOT one decode step, end-to-end TTFT + (osl - 1) TPOT, and
    every percentile equals the mean."""
    sim = simulate(FIXED, scheduler, Workload(isl=1000, osl=11, concurrency=1, requests=300, delay_ms=7.0))
    same(sim.ttft_ms, 7.0 + P)
    same(sim.tpot_ms, D)
    same(sim.e2e_ms, 7.0 + P + 10 * D)
    summary = sim.summary()
    for metric, value in (("ttft_ms", 7.0 + P), ("tpot_ms", D), ("e2e_ms", 7.0 + P + 10 * D)):
        assert summary[metric] == pytest.approx({"p50": value, "p90": value, "p99": value, "mean": value})
    assert sim.stats["preemptions"] == 0 and sim.stats["max_running"] == 1
    assert sim.stats["engine_steps"] == 300 * 11  # one prefill step and ten decode steps each


def test_two_users_one_prefill_per_step() -> None:
    """Two users, a step budget of isl + 1 tokens and no chunking: one prompt fits a step
    beside one decode, two prompts do not. After the first wave the users alternate, one
    step apart: user X's prefill rides in the step carrying Y's last decode (cost D + P),
    Y's prefill in X's first decode step (D + P), then osl - 2 decode steps (D). So TTFT =
    D + P, TPOT = ((osl - 1) D + P) / (osl - 1), end-to-end = osl D + 2P, for every request
    after the first two (users keep sending: no drain)."""
    osl = 11
    scheduler = Scheduler(step_tokens=1001, max_running=8, kv_tokens=None, chunked=False, admission="whole_sequence")
    sim = simulate(FIXED, scheduler, Workload(isl=1000, osl=osl, concurrency=2, requests=200, warmup=2, drain=False))
    same(sim.ttft_ms, D + P)
    same(sim.tpot_ms, D + P / (osl - 1))
    same(sim.e2e_ms, osl * D + 2 * P)
    # the first wave: the first request prefills alone (P), the second beside its decode (D + P)
    first = simulate(FIXED, scheduler, Workload(isl=1000, osl=osl, concurrency=2, requests=2))
    assert first.ttft_ms.tolist() == [P, 2 * P + D]


def test_prefill_first_stalls_the_decodes() -> None:
    """SGLang's order, two users, one prompt per prefill step: A prefills (P), then B (P)
    while A waits, then both decode together and finish together, so the waves repeat:
    TTFT is P for A and 2P for B; A's TPOT carries B's prefill, P / (osl - 1) on top of D."""
    osl = 11
    scheduler = Scheduler(step_tokens=1000, max_running=8, kv_tokens=None, mixed=False, chunked=False,
                          admission="new_token_ratio")
    sim = simulate(FIXED, scheduler, Workload(isl=1000, osl=osl, concurrency=2, requests=100))
    assert sorted(set(sim.ttft_ms.tolist())) == [P, 2 * P]
    assert sim.summary()["ttft_ms"]["mean"] == pytest.approx(1.5 * P)
    assert sim.summary()["tpot_ms"]["mean"] == pytest.approx(D + P / (2 * (osl - 1)))


def test_whole_sequence_admission_queues_the_third_user() -> None:
    """TRT-LLM's GUARANTEED_NO_EVICT with room for two whole sequences and three users: two
    run, one waits a whole cycle (P + (osl - 1) D) before its prefill. At each cycle boundary
    two complete and two are admitted (the one waiting and one newcomer), so half the
    requests see TTFT = P and half P + cycle; TPOT stays D."""
    isl, osl = 1000, 11
    cycle = P + (osl - 1) * D
    scheduler = Scheduler(step_tokens=8192, max_running=64, kv_tokens=2 * (isl + osl), admission="whole_sequence")
    sim = simulate(FIXED, scheduler, Workload(isl=isl, osl=osl, concurrency=3, requests=301, warmup=1, drain=False))
    assert sorted(set(np.round(sim.ttft_ms, 9).tolist())) == [P, P + cycle]
    assert np.count_nonzero(np.isclose(sim.ttft_ms, P)) == 150
    same(sim.tpot_ms, D)
    assert sim.stats["max_running"] == 2 and sim.stats["preemptions"] == 0


def test_recompute_preemption_when_the_cache_runs_out() -> None:
    """vLLM's as-needed allocation: two prompts of 100 tokens in a cache of 206. Both
    prefill in one step (P); each decode step takes a token per request, so after 3 steps
    the 6 spare tokens are gone and the newest request (B, 4 tokens generated) is preempted.
    A finishes alone (TTFT P, TPOT D); then B recomputes its 104 tokens (one step, P), which
    yields its 5th token, and decodes the 6 left: end-to-end 2P + 10D + 6D."""
    scheduler = vllm_like(kv_tokens=206)
    sim = simulate(FIXED, scheduler, Workload(isl=100, osl=11, concurrency=2, requests=2))
    assert sim.stats["preemptions"] == 1
    assert sim.ttft_ms.tolist() == [P, P]  # B's first token came before it was preempted
    assert sim.e2e_ms.tolist() == [P + 10 * D, 2 * P + 16 * D]
    assert sim.tpot_ms[1] == pytest.approx((P + 16 * D) / 10)


def test_new_token_ratio_admits_once_the_ratio_has_decayed() -> None:
    """SGLang's admission with a cache of 300 tokens, isl 100, osl 101, the ratio decaying
    from 0.7 by 0.06 a decode step. B is admitted when 200 - k - r (100 - k) >= 100 + 101 r
    with r = 0.7 - 0.06 k, i.e. after k = 4 of A's decode steps (at k = 3: 97 < 103.0; at
    k = 4: 96 >= 90.6): TTFT_B = P + 4D + P."""
    scheduler = Scheduler(step_tokens=8192, max_running=64, kv_tokens=300, mixed=False, admission="new_token_ratio",
                          ratio_init=0.7, ratio_min=0.1, ratio_decay_steps=10)
    sim = simulate(FIXED, scheduler, Workload(isl=100, osl=101, concurrency=2, requests=2))
    assert sim.ttft_ms.tolist() == pytest.approx([P, 2 * P + 4 * D])


def test_open_loop_is_seeded() -> None:
    """Poisson arrivals: the same seed gives the same run, another seed another; far below
    capacity the engine completes what is offered, and every request runs alone or beside
    a few (TTFT at least one prefill step)."""
    load = Workload(isl=1000, osl=11, request_rate=2.0, requests=4000, seed=7)
    a, b = simulate(FIXED, vllm_like(), load), simulate(FIXED, vllm_like(), load)
    assert np.array_equal(a.ttft_ms, b.ttft_ms) and np.array_equal(a.e2e_ms, b.e2e_ms)
    c = simulate(FIXED, vllm_like(), Workload(isl=1000, osl=11, request_rate=2.0, requests=4000, seed=8))
    assert not np.array_equal(a.ttft_ms, c.ttft_ms)
    assert a.stats["requests_per_s"] == pytest.approx(2.0, rel=0.05)
    assert a.ttft_ms.min() >= P and a.summary()["ttft_ms"]["p50"] < a.summary()["ttft_ms"]["p99"]


def test_decode_step_grows_with_kv() -> None:
    """A decode step linear in the kv length (1 ms + 0.01 ms per kv token): one user's TPOT
    is the step at its mean kv over its output, isl + osl / 2."""
    steps = StepTimes(decode_batch=(1,), decode_kv=(1000, 2000), decode_ms=((11.0, 21.0),), extra_tokens=(1,),
                      extra_batch=(0,), extra_ms=((P,),))
    sim = simulate(steps, vllm_like(), Workload(isl=1000, osl=101, concurrency=1, requests=10))
    same(sim.tpot_ms, 1.0 + 0.01 * (1000 + 101 / 2))


def test_refusals_are_typed() -> None:
    with pytest.raises(E.OptionValueError, match="exactly one"):
        Workload(isl=10, osl=10)
    with pytest.raises(E.OptionValueError, match="osl must be an integer >= 2"):
        Workload(isl=10, osl=1, concurrency=1)
    with pytest.raises(E.OptionValueError, match="admission must be one of"):
        Scheduler(step_tokens=1, max_running=1, kv_tokens=None, admission="lifo")
    with pytest.raises(E.NotCoveredError, match="does not fit the rank's KV cache"):
        simulate(FIXED, Scheduler(step_tokens=8192, max_running=4, kv_tokens=100, admission="whole_sequence"),
                 Workload(isl=90, osl=20, concurrency=1))


def test_output_lengths_spread() -> None:
    """One user, output lengths drawn from osl x [0.5, 1.5] = 6..16 tokens (seeded): TTFT and
    TPOT stay one prefill and one decode step; end-to-end is P + (length - 1) D, each length
    of the range seen; the same seed draws the same lengths."""
    load = Workload(isl=1000, osl=11, concurrency=1, requests=500, osl_spread=0.5, seed=3)
    sim = simulate(FIXED, vllm_like(), load)
    same(sim.ttft_ms, P)
    same(sim.tpot_ms, D)
    lengths = np.round((sim.e2e_ms - P) / D + 1).astype(int)
    assert sorted(set(lengths.tolist())) == list(range(6, 17))
    assert np.array_equal(simulate(FIXED, vllm_like(), load).e2e_ms, sim.e2e_ms)
