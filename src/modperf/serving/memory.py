"""Memory: what one GPU holds (weights, KV cache), how many requests run at once under a
backend's memory rule, whether a deployment fits at all, and the KV transfer between the pools
of a disaggregated deployment (docs/serving.md, "Memory").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..base import errors as E
from ..specs.layers import ffn_groups, layer_schedule
from ..specs.roofline import bytes_of, gpu_spec
from .backend import KV_BYTES, Backend, GiB

if TYPE_CHECKING:
    from ..specs.models import ModelConfig


@dataclass(frozen=True)
class SystemMemory:
    """One GPU's memory (``gpu.mem_capacity``) and the reserve the system file keeps for
    activations, CUDA graphs and NCCL (``misc.other_mem``), in bytes."""

    capacity: float
    other: float


def system_memory(system: str) -> SystemMemory:
    """The memory of ``system`` from its yaml, as :func:`modperf.specs.roofline.gpu_spec` reads it; a
    SystemSpecError where the file is missing or gives no capacity."""
    gpu = gpu_spec(system)
    if not gpu.from_file or gpu.mem_capacity <= 0:
        from ..fast.cache_keys import embedded_systems_dir

        path = embedded_systems_dir() / f"{system}.yaml"
        reason = "no positive gpu.mem_capacity" if gpu.from_file else "no system file"
        raise E.SystemSpecError(f"no memory size for system {E.quote(system)}: {reason}", file=path,
                                fix=f"add {path.name} with gpu.mem_capacity (bytes) and misc.other_mem beside "
                                    "the data")
    return SystemMemory(gpu.mem_capacity, gpu.other_mem)


class PoolShape(Protocol):
    """The parallelism of one pool of workers (``modperf.predict.Pool``)."""

    @property
    def tp(self) -> int: ...
    @property
    def attention_dp(self) -> int: ...
    @property
    def moe_tp(self) -> int | None: ...
    @property
    def moe_ep(self) -> int: ...
    @property
    def pp(self) -> int: ...


def weight_bytes_per_gpu(config: ModelConfig, pool: PoolShape) -> float:
    """Weights one GPU of ``pool`` holds: attention, dense MLPs, shared experts and embeddings
    split over tp (replicated over attention-DP ranks), routed experts over moe_tp x moe_ep,
    layers over pp stages. Parameter counts from the HF config (docs/serving.md, "Memory")."""
    q = config.quantization
    gemm_b, moe_b = bytes_of(q.gemm or "bfloat16"), bytes_of(q.moe or "bfloat16")
    hidden = int(config.get("hidden_size"))
    heads = config.native_heads
    kv = config.kv_heads or heads
    head_dim = int(config.get("head_dim", None) or hidden // heads)
    kv_lora = config.get("kv_lora_rank", None)
    if isinstance(kv_lora, int) and kv_lora > 0:
        q_lora = config.get("q_lora_rank", None) or 0
        nope = int(config.get("qk_nope_head_dim", 128))
        rope = int(config.get("qk_rope_head_dim", 64))
        v = int(config.get("v_head_dim", 128))
        q_in = q_lora or hidden
        attn = (hidden * q_lora if q_lora else 0) + q_in * heads * (nope + rope) + hidden * (kv_lora + rope) \
            + kv_lora * heads * (nope + v) + heads * v * hidden
    else:
        attn = hidden * (heads + 2 * kv) * head_dim + heads * head_dim * hidden
    layers = len(layer_schedule(config).layers)
    dense = experts = shared = 0
    for ffn, n in ffn_groups(config):
        if ffn.kind == "dense":
            dense += 3 * ffn.hidden * ffn.inter * n
        else:
            experts += ffn.experts * 3 * ffn.hidden * ffn.inter * n
            shared += (3 * ffn.hidden * ffn.shared_inter + hidden * ffn.experts) * n
    vocab = int(config.get("vocab_size", 0) or 0)
    embed = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    moe_gpus = (pool.moe_tp or pool.tp * pool.attention_dp // max(pool.moe_ep, 1)) * pool.moe_ep
    per_gpu = (attn * layers + dense + shared) * gemm_b / pool.tp + experts * moe_b / max(moe_gpus, 1) \
        + embed * 2.0 / pool.tp
    return per_gpu / pool.pp


def kv_bytes_per_token(config: ModelConfig, tp: int, context: int, element: float = KV_BYTES) -> float:
    """KV-cache bytes one token takes on one attention rank at tp (all its layers): MLA's
    latent (kv_lora_rank + rope dims, the same on every rank); GQA's K and V of the rank's kv
    heads (one replicated head where tp exceeds kv). Sliding-window layers hold at most their
    window (averaged over ``context``); linear-attention layers hold a constant state, not a
    per-token cache."""
    total = 0.0
    for layer, n in layer_schedule(config).groups():
        fields = dict(layer.fields)
        if layer.kind in ("mla", "dsa"):
            lora = int(config.get("kv_lora_rank", 512))
            rope = int(config.get("qk_rope_head_dim", 64))
            index = int(config.get("index_head_dim", 0) or 0) if layer.kind == "dsa" else 0
            total += (lora + rope + index) * element * n
        elif layer.kind in ("gqa", "msa"):
            kv = int(fields.get("num_key_value_heads", config.kv_heads or config.native_heads))
            head_dim = int(fields.get("head_dim", config.get("head_dim", None)
                                      or int(config.get("hidden_size")) // config.native_heads))
            local_kv = max(1, kv // tp)
            window = int(fields.get("window_size", 0) or 0)
            share = min(1.0, window / context) if window else 1.0
            total += 2 * local_kv * head_dim * element * share * n
        elif layer.kind.startswith("dsv4"):
            head_dim = int(config.get("head_dim", 512))
            ratio = int(fields.get("compress_ratio", 1) or 1)
            total += head_dim * element / ratio * n
    return total


@dataclass
class PoolMemory:
    """One GPU of a pool: its weights, the KV budget the backend's rule leaves, KV bytes per
    token, the tokens one request holds, and how many requests run at once."""

    weights: float
    budget: float
    per_token: float
    reserved_tokens: int
    max_running: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"weights_gib_per_gpu": self.weights / GiB, "kv_budget_gib_per_gpu": self.budget / GiB,
                "kv_bytes_per_token": self.per_token, "max_running": self.max_running}


def pool_memory(backend: Backend, config: ModelConfig, pool: PoolShape, *, system: str, memory: SystemMemory,
                chunk: int, tokens: int, reserved: int, element: float, what: str = "") -> PoolMemory:
    """The memory of one GPU of ``pool`` under ``backend``'s rule, for requests that hold
    ``reserved`` KV tokens on average and at most ``tokens`` each (the KV length sliding windows
    average over). A deployment that cannot run is a DeploymentFitError with the figures: the
    weights alone over the GPU's memory, or one request's KV over what they leave."""
    weights = weight_bytes_per_gpu(config, pool)
    per_token = kv_bytes_per_token(config, pool.tp, tokens, element)
    physical = memory.capacity - weights - memory.other
    pool_name = f"the {what} pool" if what else "one GPU"
    figures = {"weights_gib": round(weights / GiB, 2), "gpu_gib": round(memory.capacity / GiB, 2),
               "reserve_gib": round(memory.other / GiB, 2), "kv_gib_per_request": round(per_token * tokens / GiB, 3)}
    if physical <= 0:
        raise E.DeploymentFitError(
            f"{config.model_id} does not fit {pool_name} on {system}: its weights take {weights / GiB:.1f} GiB per "
            f"GPU at tp {pool.tp}, moe_ep {pool.moe_ep}, pp {pool.pp}; the GPU has {memory.capacity / GiB:.1f} GiB and "
            f"the system file keeps {memory.other / GiB:.1f} GiB for activations", values=figures,
            fix="use more GPUs per worker (tp, moe_ep, pp) or a smaller dtype")
    if per_token * tokens > physical:
        raise E.DeploymentFitError(
            f"one request of {tokens} tokens does not fit {pool_name} of {config.model_id} on {system}: its KV cache "
            f"takes {per_token * tokens / GiB:.2f} GiB, the GPU has {physical / GiB:.2f} GiB left beside "
            f"{weights / GiB:.1f} GiB of weights", values={**figures, "left_gib": round(physical / GiB, 2)},
            fix="use more GPUs per worker, a shorter sequence or a smaller KV dtype")
    budget = backend.kv_budget_bytes(mem_capacity=memory.capacity, weights=weights, other=memory.other, chunk=chunk,
                                     gpus=pool.tp)
    notes: list[str] = []
    if budget <= 0:
        fits = 0
    elif per_token <= 0:
        fits = backend.max_running
    else:
        fits = int(budget // (per_token * reserved))
    if fits < 1:
        raise E.DeploymentFitError(
            f"{backend.name}'s default memory rule leaves {max(budget, 0) / GiB:.2f} GiB per GPU of {pool_name} for "
            f"the KV cache, less than one request of {reserved} tokens ({per_token * reserved / GiB:.2f} GiB) of "
            f"{config.model_id} on {system}", values={**figures, "kv_budget_gib": round(budget / GiB, 2)},
            fix="use more GPUs per worker (tp, moe_ep) or a smaller dtype; a deployment that runs so sets its own "
                "memory fraction, which modperf does not model (the backend's default rule is priced)")
    return PoolMemory(weights, budget, per_token, reserved, min(fits, backend.max_running), notes)


def kv_transfer_ms(kv_bytes: float, *, system: str, gpus: int) -> float:
    """Moving one request's KV cache from the prefill pool to the decode pool: its bytes over
    the link between nodes (NVLink inside GB200/GB300 racks, the NIC elsewhere) of every GPU of
    the prefill worker, plus one hop."""
    gpu = gpu_spec(system)
    return kv_bytes / (gpu.inter_node_bw * gpus) * 1000.0 + gpu.p2p_latency * 1000.0


__all__ = ["PoolMemory", "PoolShape", "SystemMemory", "kv_bytes_per_token", "kv_transfer_ms",
           "pool_memory", "system_memory", "weight_bytes_per_gpu"]
