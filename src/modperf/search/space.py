"""The deployments a search considers: the parallel layouts each backend's launch flags can
express, the batch sizes it sweeps, and the GPUs a worker may take (docs/search.md, "The space").

Each backend spells a worker's parallelism differently, and the space holds only what its own
flags can start (so every deployment the search returns has a launch command):

* **vLLM** (``--tensor-parallel-size``, ``--data-parallel-size``, ``--enable-expert-parallel``):
  attention runs tp x dp; the MoE layers form one group of tp x dp GPUs, tensor-parallel by
  default or expert-parallel with ``--enable-expert-parallel`` (vLLM's data-parallel deployment
  guide: "By default, expert layers form a tensor parallel group of size DP x TP").
* **SGLang** (``--tp-size``, ``--dp-size`` with ``--enable-dp-attention``, ``--ep-size``): the
  worker's GPUs are ``--tp-size``; attention runs tp-size / dp-size per rank; experts over
  ``--ep-size`` with tp-size / ep-size tensor-parallel inside each (server_args).
* **TRT-LLM** (``trtllm-serve --tp_size --ep_size`` and ``enable_attention_dp`` in its
  ``--config`` file): the worker's GPUs are ``--tp_size``; attention is tensor-parallel over
  all of them or, with attention DP, one rank each; experts over ``--ep_size``.

Attention data parallelism is offered for MoE models only: for a dense model it is replicas
inside one server, which the replica axis already covers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs.shard import divisors

#: Requests per attention-DP rank the search sweeps where no concurrency is given: every one up
#: to 8 (where TPOT moves most), then 12-25 % apart up to the largest running set any backend
#: keeps by default (vLLM's max_num_seqs is 1024).
BATCHES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 144, 160,
           192, 224, 256, 288, 320, 384, 448, 512, 576, 640, 768, 896, 1024)
#: Requests per rank of a decode worker (disaggregated): a decode step is cheap to price and the
#: decode batch alone sets TPOT, so the sweep is finer: every one up to 16, then steps of 2, 4
#: and 8 up to 512, then as BATCHES.
DECODE_BATCHES = (*range(1, 16), *range(16, 32, 2), *range(32, 128, 4), *range(128, 512, 8),
                  *(b for b in BATCHES if b >= 512))
#: Per-step token budgets swept besides the backend's default (vLLM --max-num-batched-tokens,
#: SGLang --chunked-prefill-size, TRT-LLM --max_num_tokens): smaller ones chunk long prompts and
#: shorten the steps decodes wait through; larger ones pack more prompts per step.
TOKEN_BUDGETS = (2048, 4096, 8192, 16384)
BACKENDS = ("vllm", "sglang", "trtllm")
MODES = ("agg", "disagg")


@dataclass(frozen=True, order=True)
class Layout:
    """One worker's parallelism: attention ``tp`` x ``attention_dp`` GPUs, the MoE layers over
    ``moe_tp`` x ``moe_ep`` of the same GPUs (None for a dense model)."""

    tp: int
    attention_dp: int = 1
    moe_tp: int | None = None
    moe_ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.attention_dp

    def label(self) -> str:
        text = f"tp{self.tp}"
        if self.attention_dp > 1:
            text += f" dp{self.attention_dp}"
        if self.moe_tp is not None and self.moe_ep > 1:
            text += f" ep{self.moe_ep}" + (f" etp{self.moe_tp}" if self.moe_tp > 1 else "")
        return text


def worker_gpus(total: int) -> list[int]:
    """GPUs one worker may take out of ``total``: the powers of two up to it and its divisors."""
    sizes = {d for d in divisors(total)}
    size = 1
    while size <= total:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def layouts(backend: str, gpus: int, has_moe: bool) -> list[Layout]:
    """The layouts of a ``gpus``-GPU worker ``backend`` can start (module doc)."""
    if not has_moe:
        return [Layout(gpus)]
    out: list[Layout] = []
    if backend == "vllm":
        for dp in divisors(gpus):
            out += [Layout(gpus // dp, dp, gpus, 1)]
            if gpus > 1:
                out += [Layout(gpus // dp, dp, 1, gpus)]
    elif backend == "sglang":
        for dp in divisors(gpus):
            out += [Layout(gpus // dp, dp, gpus // ep, ep) for ep in divisors(gpus)]
    else:  # trtllm: attention over all ranks, or one rank each (enable_attention_dp)
        for dp in sorted({1, gpus}):
            out += [Layout(gpus // dp, dp, gpus // ep, ep) for ep in divisors(gpus)]
    return out


def budgets(default: int) -> list[int]:
    """The token budgets of the space: :data:`TOKEN_BUDGETS` and the backend's default."""
    return sorted({*TOKEN_BUDGETS, default})


def prefill_pools(isl: int, default: int) -> list[tuple[int, int]]:
    """The distinct (token budget, requests packed per step) of a prefill worker: below the
    input length a budget chunks the prompt (one request per step); from there on only the
    packing differs (1, 2, 4, ... up to what the budget holds), so of the budgets that pack the
    same number of requests the smallest is kept (the others price the same)."""
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for budget in budgets(default):
        if budget < isl:
            out.append((budget, 1))
            continue
        for pb in prefill_batches(isl, budget):
            if pb not in seen:
                seen.add(pb)
                out.append((budget, pb))
    return out


def prefill_batches(isl: int, chunk: int) -> list[int]:
    """Requests a prefill step may pack: 1, and every power of two up to what the per-step
    token budget holds (one when a request alone fills it)."""
    most = max(1, chunk // isl)
    out, batch = [1], 2
    while batch <= most:
        out.append(batch)
        batch *= 2
    if most not in out:
        out.append(most)
    return out


__all__ = ["BACKENDS", "BATCHES", "DECODE_BATCHES", "MODES", "TOKEN_BUDGETS", "Layout", "budgets", "layouts",
           "prefill_batches", "prefill_pools", "worker_gpus"]
