"""Predict serving latency (TTFT, TPOT) of one deployment: parse it (from flags or a row of the
corpus's ``silicon_sample.csv``), price its engine steps from the op tables
(:func:`modperf.model_step.step_cost`), size its KV cache from the system file, and solve the
serving model (:mod:`modperf.serving`). docs/serving.md has the model and every constant.

The deployment's fields are the columns of ``silicon_sample.csv``, so a line of that file is a
question as it stands: ``model_path, system, backend, backend_version, mode, isl, osl,
gemm_quant_mode, moe_quant_mode, batch_size, tp_size, pp_size, attention_dp_size, moe_tp_size,
moe_ep_size`` and, for disaggregated deployments, ``prefill_`` / ``decode_`` + ``batch_size,
num_workers, tp_size, pp_size, attention_dp_size, moe_tp_size, moe_ep_size``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import errors as E
from . import limits
from .layers import ffn_groups, layer_schedule
from .model_step import DecodePart, Parallel, SeqChunk, StepCost, step_cost
from .roofline import bytes_of, gpu_spec
from .serving import (
    AggInputs,
    Constants,
    DisaggInputs,
    aggregated,
    backend_of,
    chunk_tokens,
    chunks,
    disaggregated,
    kv_budget_bytes,
    mean_kv,
    packed_requests,
    system_memory,
)
from .serving_constants import AGG, DISAGG, PROVENANCE

if TYPE_CHECKING:
    from .db import Database
    from .models import ModelConfig

#: Fields of a deployment (the columns of silicon_sample.csv that describe one).
TOP_FIELDS = ("id", "model_path", "system", "backend", "backend_version", "mode", "isl", "osl", "precision",
              "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
              "moe_tp_size", "moe_ep_size")
POOL_FIELDS = ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
FIELDS = frozenset(TOP_FIELDS) | {f"{side}_{f}" for side in ("prefill", "decode") for f in POOL_FIELDS}
#: Columns of the CSV a prediction ignores (measurements and provenance), accepted so that a
#: row of the file can be passed as it is.
IGNORED = frozenset({"silicon_data_source", "silicon_ttft_ms", "silicon_tpot_ms", "model"})

_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}
#: Bytes a KV-cache element takes: bfloat16, or fp8 where the deployment runs fp8 KV
#: (docs/serving.md, "Memory").
KV_BYTES = 2.0


def kv_element_bytes(backend: str, gemm_dtype: str | None) -> float:
    """TRT-LLM serves quantized (8- or 4-bit) checkpoints with the fp8 KV cache their
    quantization config names; vLLM and SGLang keep the model dtype unless told otherwise."""
    return 1.0 if backend == "trtllm" and bits(gemm_dtype) <= 8 else KV_BYTES


@dataclass(frozen=True)
class Pool:
    """One pool of identical workers (the whole deployment, when aggregated)."""

    tp: int
    attention_dp: int = 1
    moe_tp: int | None = None
    moe_ep: int = 1
    pp: int = 1
    batch: int | None = None  # per attention-DP rank
    workers: int = 1

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.attention_dp * self.pp

    def parallel(self, has_moe: bool = True) -> Parallel:
        """The step's parallelism; a model without MoE layers has no MoE axes (the file writes
        moe_tp 1 / moe_ep 1 for dense models at any tp)."""
        if not has_moe:
            return Parallel(tp=self.tp, attention_dp=self.attention_dp)
        return Parallel(tp=self.tp, moe_tp=self.moe_tp, moe_ep=self.moe_ep, attention_dp=self.attention_dp)

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "attention_dp": self.attention_dp, "moe_tp": self.moe_tp, "moe_ep": self.moe_ep,
                "pp": self.pp, "batch": self.batch, "workers": self.workers}


@dataclass(frozen=True)
class Deployment:
    model: str
    system: str
    backend: str
    mode: str  # agg | disagg
    isl: int
    osl: int
    pool: Pool | None = None  # agg
    prefill: Pool | None = None  # disagg
    decode: Pool | None = None
    version: str | None = None
    gemm_quant: str | None = None
    moe_quant: str | None = None
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "system": self.system, "backend": self.backend,
                "version": self.version, "mode": self.mode, "isl": self.isl, "osl": self.osl,
                "gemm_quant": self.gemm_quant, "moe_quant": self.moe_quant,
                "pool": self.pool.to_dict() if self.pool else None,
                "prefill": self.prefill.to_dict() if self.prefill else None,
                "decode": self.decode.to_dict() if self.decode else None}


# --- parsing ------------------------------------------------------------------------------------


def present(row: Mapping[str, Any], name: str) -> bool:
    """Whether a deployment field is given: an empty string, None or NaN (the CSV's empty cells) is not."""
    value = row.get(name)
    return not (value is None or value == "" or (isinstance(value, float) and math.isnan(value)))


def _int(row: Mapping[str, Any], name: str, rng: limits.Range, default: int | None = None,
         zero_is_missing: bool = False) -> int | None:
    if not present(row, name):
        return default
    value = row[name]
    if zero_is_missing and value in (0, 0.0, "0"):
        return default
    return limits.parse_int(name, value, rng=rng, fix=f"give {name} as a whole number in {rng.describe()}")


def _str(row: Mapping[str, Any], name: str) -> str | None:
    if not present(row, name):
        return None
    value = row[name]
    if not isinstance(value, str):
        raise E.QueryFieldError(f"{name} must be a string", values={"field": name, "value": value},
                                fix=f'e.g. "{name}": "..."')
    return value.strip()


def _pool(row: Mapping[str, Any], prefix: str, *, need_batch: bool) -> Pool:
    tp = _int(row, f"{prefix}tp_size", limits.TP)
    if tp is None:
        raise E.QueryFieldError(f"{prefix}tp_size is required", values={"field": f"{prefix}tp_size"},
                                fix=f"give {prefix}tp_size (tensor-parallel ranks of one worker)")
    batch = _int(row, f"{prefix}batch_size", limits.BATCH)
    if need_batch and batch is None:
        raise E.QueryFieldError(f"{prefix}batch_size is required", values={"field": f"{prefix}batch_size"},
                                fix="give the concurrent requests per attention-DP rank")
    return Pool(
        tp=tp, batch=batch,
        attention_dp=_int(row, f"{prefix}attention_dp_size", limits.TP, 1, zero_is_missing=True) or 1,
        moe_tp=_int(row, f"{prefix}moe_tp_size", limits.TP, None, zero_is_missing=True),
        moe_ep=_int(row, f"{prefix}moe_ep_size", limits.TP, 1, zero_is_missing=True) or 1,
        pp=_int(row, f"{prefix}pp_size", limits.Range(1, 256, "pipeline stages"), 1, zero_is_missing=True) or 1,
        workers=_int(row, f"{prefix}num_workers", limits.Range(1, 4096, "workers"), 1) or 1)


def _dtype(value: str | None) -> str | None:
    if value is None:
        return None
    return _DTYPE_NAMES.get(value, value)


def deployment_from_row(row: Mapping[str, Any]) -> Deployment:
    """A deployment from silicon_sample.csv columns (module doc); empty fields are left out.
    Every malformed field is a QueryFieldError naming it."""
    if not isinstance(row, Mapping):
        raise E.QueryFieldError("a deployment is a JSON object of silicon_sample.csv columns", fix="e.g. "
                                '{"model_path": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", ...}')
    unknown = sorted(k for k in row if k not in FIELDS and k not in IGNORED)
    if unknown:
        raise E.QueryFieldError(f"unknown field(s) {', '.join(map(E.quote, unknown[:8]))}",
                                values={"unknown": unknown[:8]},
                                fix="fields are the columns of silicon_sample.csv (docs/serving.md)")
    missing = [f for f in ("model_path", "system", "backend", "mode", "isl", "osl") if not present(row, f)]
    if missing:
        raise E.QueryFieldError(f"missing field(s) {', '.join(missing)}", values={"missing": missing},
                                fix="a deployment names model_path, system, backend, mode, isl and osl")
    mode = _str(row, "mode")
    if mode not in ("agg", "disagg"):
        raise E.QueryFieldError(f"mode must be agg or disagg, not {E.quote(mode)}", values={"mode": mode},
                                fix='"mode": "agg" or "disagg"')
    isl = _int(row, "isl", limits.TOKENS)
    osl = _int(row, "osl", limits.Range(2, limits.TOKENS.high, "output tokens (a TPOT needs two)"))
    assert isl is not None and osl is not None
    common: dict[str, Any] = dict(
        model=str(_str(row, "model_path")), system=str(_str(row, "system")), backend=str(_str(row, "backend")),
        mode=mode, isl=isl, osl=osl, version=_str(row, "backend_version"), id=_str(row, "id"),
        gemm_quant=_dtype(_str(row, "gemm_quant_mode")), moe_quant=_dtype(_str(row, "moe_quant_mode")))
    if mode == "agg":
        return Deployment(**common, pool=_pool(row, "", need_batch=True))
    absent = [f for f in ("prefill_num_workers", "decode_num_workers", "decode_batch_size") if not present(row, f)]
    if absent:
        raise E.QueryFieldError(
            f"a disaggregated deployment needs {', '.join(absent)}: without worker counts and the decode batch "
            "the topology is unknown (two such exports of one configuration differ 10x in TTFT)",
            values={"missing": absent}, fix="give prefill_num_workers, decode_num_workers and decode_batch_size")
    prefill = _pool(row, "prefill_", need_batch=False)
    if prefill.batch is None:
        prefill = Pool(prefill.tp, prefill.attention_dp, prefill.moe_tp, prefill.moe_ep, prefill.pp, 1,
                       prefill.workers)
    return Deployment(**common, prefill=prefill, decode=_pool(row, "decode_", need_batch=True))


# --- the model as served ------------------------------------------------------------------------


def bits(dtype: str | None) -> int:
    """Weight width of a dtype name (4, 8 or 16 bits): the roofline's bytes per element."""
    return int(8 * bytes_of(dtype))


def served_dtypes(own_gemm: str | None, own_moe: str | None, gemm: str | None, moe: str | None
                  ) -> tuple[str | None, str | None, list[str]]:
    """The dtypes a deployment runs, from the checkpoint's and the ones it names (docs/serving.md,
    "Served dtypes"). The names a deployment gives say a weight width; the checkpoint says which
    layers are quantized and in which layout:

    * a name of the checkpoint's own width is the checkpoint's layout (``fp8`` on a block-scaled
      fp8 checkpoint is ``fp8_block``; ``nvfp4`` on an mxfp4 checkpoint is its mxfp4);
    * a checkpoint that quantizes only its experts keeps its dense layers as they are when the
      deployment names the experts' width for them (gpt-oss, Kimi-K2.5);
    * any other width is a re-quantized checkpoint (DeepSeek-R1 served as NVFP4), taken as named.
    """
    notes: list[str] = []
    experts_only = bits(own_gemm) == 16 and bits(own_moe) < 16
    out_gemm, out_moe = gemm or own_gemm, moe or own_moe
    if gemm is not None and own_gemm is not None and (
            bits(gemm) == bits(own_gemm) or (experts_only and bits(gemm) == bits(own_moe))):
        out_gemm = own_gemm
    if moe is not None and own_moe is not None and bits(moe) == bits(own_moe):
        out_moe = own_moe
    for what, named, used in (("gemm", gemm, out_gemm), ("moe", moe, out_moe)):
        if named is not None and used != named:
            notes.append(f"{what} dtype {named} named; the checkpoint stores these weights as {used} (served as such)")
    return out_gemm, out_moe, notes


def served_model(db: Database, dep: Deployment, notes: list[str] | None = None) -> ModelConfig:
    """The model config with the deployment's dtypes (:func:`served_dtypes`): its own id where
    they are the checkpoint's, else the served variant ``ID@gemm=..,moe=..``."""
    config = db.models.get(dep.model)
    own = config.quantization
    gemm, moe, said = served_dtypes(own.gemm, own.moe, dep.gemm_quant, dep.moe_quant)
    if not ffn_has_moe(config):
        moe = own.moe
        said = [n for n in said if not n.startswith("moe")]
    if notes is not None:
        notes.extend(said)
    if (gemm, moe) == (own.gemm, own.moe) or gemm is None or moe is None:
        return config
    return db.models.get(f"{dep.model}@gemm={gemm},moe={moe}")


def ffn_has_moe(config: ModelConfig) -> bool:
    return any(layer.kind == "moe" for layer, _ in ffn_groups(config))


# --- memory ---------------------------------------------------------------------------------------


def weight_bytes_per_gpu(config: ModelConfig, pool: Pool) -> float:
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


# --- the prediction -----------------------------------------------------------------------------


@dataclass
class Prediction:
    deployment: Deployment
    ttft_ms: float
    tpot_ms: float
    tokens_per_s_per_user: float
    tokens_per_s_per_gpu: float
    gpus: int
    steps: dict[str, dict[str, Any]]
    serving: dict[str, Any]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.deployment.id, "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
                "tokens_per_s_per_user": self.tokens_per_s_per_user,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "gpus": self.gpus,
                "deployment": self.deployment.to_dict(), "steps": self.steps, "serving": self.serving,
                "provenance": self.provenance, "notes": self.notes}


class _Steps:
    """Prices the engine steps of one pool and keeps their provenance."""

    def __init__(self, db: Database, dep: Deployment, model: str, pool: Pool, version: str | None,
                 has_moe: bool) -> None:
        self.db, self.dep, self.model, self.pool, self.version = db, dep, model, pool, version
        self.parallel = pool.parallel(has_moe)
        self.kinds: Counter[str] = Counter()
        self.versions: dict[str, str] = {}
        self.notes: list[str] = []
        gpu = gpu_spec(dep.system)
        self.hop_ms = (pool.pp - 1) * gpu.p2p_latency * 1000.0  # pipeline stages hand over once per step

    def cost(self, prefill: SeqChunk | None = None, decode: DecodePart | None = None) -> StepCost:
        step = step_cost(self.db, model=self.model, system=self.dep.system, backend=self.dep.backend,
                         parallel=self.parallel, version=self.version, prefill=prefill, decode=decode)
        if not step.complete or step.total_ms is None:
            reasons = "; ".join(f"{r['name']}: {r['reason']}" for r in step.not_covered[:3])
            raise E.NotCoveredError(f"the step of {self.model} on {self.dep.system} {self.dep.backend} is partial: "
                                    f"{reasons}", values={"model": self.model, "system": self.dep.system,
                                                          "backend": self.dep.backend},
                                    fix="see `modperf estimate --scope model` for the ops no table covers")
        for op in step.ops:
            self.kinds[op.kind] += op.count
        self.versions.update(step.versions)
        return step

    def ms(self, prefill: SeqChunk | None = None, decode: DecodePart | None = None) -> float:
        step = self.cost(prefill, decode)
        assert step.total_ms is not None
        return float(step.total_ms) + self.hop_ms

    def prefill_one(self, isl: int, chunk: int) -> float:
        return sum(self.ms(prefill=SeqChunk(1, tokens, prefix)) for tokens, prefix in chunks(isl, chunk))


def _version_for(db: Database, dep: Deployment, notes: list[str]) -> str | None:
    """The deployment's backend version where the corpus holds that version's GEMM table for the
    system (then the other tables come from the nearest version holding them); otherwise None
    (each table takes the newest version held), said in a note. A version that holds only a
    scattered family (a MoE or communication sweep) does not anchor the step. A system and
    backend the corpus holds nothing of is an UnknownTableError naming the nearest."""
    slots = [r for r in db.store.catalog.slots if r.system == dep.system and r.backend == dep.backend]
    if not slots:
        raise db.store.unknown_slot(dep.system, dep.backend, "(any version)", "gemm")
    if dep.version is None:
        return None
    if dep.version in {r.version for r in slots if r.table == "gemm"}:
        return dep.version
    notes.append(f"backend version {dep.version} has no GEMM table for {dep.system} {dep.backend} in the corpus: "
                 "each table takes the newest version held (provenance.versions)")
    return None


def constants_for(dep: Deployment, fitted: bool = True) -> tuple[Constants, str]:
    """The fitted constants of the deployment's backend and mode (modperf.serving_constants),
    or the physics-only ones where none are fitted or ``fitted`` is False."""
    c = (AGG.get(dep.backend) if dep.mode == "agg" else DISAGG) if fitted else None
    return (c, PROVENANCE[dep.mode]) if c is not None else (Constants(), "physics only: no fitted constants")


@dataclass
class Priced:
    """A deployment's engine steps, priced from the op tables: everything the serving model
    needs that does not depend on its fitted constants."""

    deployment: Deployment
    inputs: AggInputs | DisaggInputs
    steps: dict[str, Any]
    memory: dict[str, Any]
    concurrency: int
    gpus: int
    kinds: Counter[str]
    versions: dict[str, str]
    notes: list[str]
    #: Prices more steps of the same (aggregated) pool: the simulation's grid (modperf.percentiles).
    pricer: _Steps | None = None


def price(db: Database, dep: Deployment) -> Priced:
    """The engine steps of ``dep`` from the op tables (module doc). Raises a ModperfError when a
    step cannot be priced (an op out of coverage, a shard that does not divide, an unknown model
    or system)."""
    notes: list[str] = []
    backend = backend_of(dep.backend)
    version = _version_for(db, dep, notes)
    config = served_model(db, dep, notes)
    has_moe = ffn_has_moe(config)
    memory = system_memory(dep.system)
    chunk = chunk_tokens(backend, memory.capacity)
    kv_mean = mean_kv(dep.isl, dep.osl)
    inputs: AggInputs | DisaggInputs
    if dep.mode == "agg":
        pool = dep.pool
        assert pool is not None and pool.batch is not None
        priced = _Steps(db, dep, config.model_id, pool, version, has_moe)
        weights = weight_bytes_per_gpu(config, pool)
        budget = kv_budget_bytes(backend, mem_capacity=memory.capacity, weights=weights, other=memory.other,
                                 chunk=chunk, gpus=pool.tp)
        reserve = dep.isl + (dep.osl if backend.reserves_whole_sequence else dep.osl // 2)
        element = kv_element_bytes(dep.backend, config.quantization.gemm)
        per_token = kv_bytes_per_token(config, pool.tp, dep.isl + dep.osl, element)
        physical = memory.capacity - weights - memory.other
        if budget < per_token * reserve <= physical:
            notes.append(f"the {backend.name} default memory rule leaves {budget / 2**30:.1f} GiB for the KV cache, "
                         "less than one request: the deployment must set its own memory fraction; the physical "
                         f"remainder ({physical / 2**30:.1f} GiB) is used")
            budget = physical
        if budget <= 0:
            fits = 0
        elif per_token <= 0:
            fits = backend.max_running
        else:
            fits = int(budget // (per_token * reserve))
        max_running = min(fits, backend.max_running)
        if max_running < 1:
            raise E.NotCoveredError(
                f"{config.model_id} at tp {pool.tp} does not fit one request of {dep.isl} + {dep.osl} tokens on "
                f"{dep.system}: weights {weights / 2**30:.1f} GiB per GPU, KV budget {budget / 2**30:.1f} GiB",
                values={"weights_gib": round(weights / 2**30, 2), "kv_budget_gib": round(budget / 2**30, 2)},
                fix="use more GPUs per replica (tp, moe_ep) or a smaller dtype")
        running = max(1, min(pool.batch, max_running))
        decode_batch = math.ceil(running / pool.pp)
        packed = packed_requests(running, dep.isl, chunk) if dep.isl <= chunk else 1
        one = priced.prefill_one(dep.isl, chunk)
        packed_ms = priced.ms(prefill=SeqChunk(packed, dep.isl, 0)) if dep.isl <= chunk else one
        decode_step = priced.cost(decode=DecodePart(decode_batch, kv_mean))
        decode_ms = float(decode_step.total_ms or 0.0) + priced.hop_ms
        capped_ms = priced.ms(prefill=SeqChunk(packed, min(chunk, dep.isl), 0),
                              decode=DecodePart(decode_batch, kv_mean))
        inputs = AggInputs(pool.batch, dep.isl, dep.osl, one, packed, packed_ms, decode_ms, capped_ms, max_running)
        steps = {"prefill_one": {"ms": one, "chunk_tokens": chunk},
                 "prefill_packed": {"ms": packed_ms, "requests": packed},
                 "decode": {"ms": decode_ms, "batch": decode_batch, "kv": kv_mean,
                            "components": decode_step.components},
                 "mixed": {"ms": capped_ms, "prefill_tokens": packed * min(chunk, dep.isl),
                           "decode_batch": decode_batch}}
        memory_doc = {"weights_gib_per_gpu": weights / 2**30, "kv_budget_gib_per_gpu": budget / 2**30,
                      "kv_bytes_per_token": per_token, "max_running": max_running}
        return Priced(dep, inputs, steps, memory_doc, pool.batch * pool.attention_dp, pool.gpus_per_worker,
                      priced.kinds, priced.versions, notes + priced.notes, priced)
    assert dep.prefill is not None and dep.decode is not None and dep.decode.batch is not None
    pre = _Steps(db, dep, config.model_id, dep.prefill, version, has_moe)
    dec = _Steps(db, dep, config.model_id, dep.decode, version, has_moe)
    batch = dep.prefill.batch or 1
    packed = packed_requests(batch, dep.isl, chunk) if dep.isl <= chunk else 1
    one = pre.prefill_one(dep.isl, chunk)
    packed_ms = pre.ms(prefill=SeqChunk(packed, dep.isl, 0)) if dep.isl <= chunk else one
    decode_step = dec.cost(decode=DecodePart(dep.decode.batch, kv_mean))
    decode_ms = float(decode_step.total_ms or 0.0) + dec.hop_ms
    concurrency = dep.decode.batch * dep.decode.workers * dep.decode.attention_dp
    gpu = gpu_spec(dep.system)
    link = gpu.inter_node_bw  # the pools sit on different nodes (on GB200/GB300 racks: NVLink)
    element = kv_element_bytes(dep.backend, config.quantization.gemm)
    kv_all = kv_bytes_per_token(config, 1, dep.isl + dep.osl, element) * dep.isl  # the whole request's cache
    transfer_ms = kv_all / (link * dep.prefill.gpus_per_worker) * 1000.0 + gpu.p2p_latency * 1000.0
    inputs = DisaggInputs(concurrency, dep.isl, dep.osl, dep.prefill.workers * dep.prefill.attention_dp, one,
                          packed_ms, packed, decode_ms, transfer_ms)
    steps = {"prefill_one": {"ms": one, "chunk_tokens": chunk},
             "prefill_packed": {"ms": packed_ms, "requests": packed},
             "decode": {"ms": decode_ms, "batch": dep.decode.batch, "kv": kv_mean,
                        "components": decode_step.components}}
    gpus = dep.prefill.workers * dep.prefill.gpus_per_worker + dep.decode.workers * dep.decode.gpus_per_worker
    return Priced(dep, inputs, steps, {"kv_transfer_bytes": kv_all}, concurrency, gpus, pre.kinds + dec.kinds,
                  {**pre.versions, **dec.versions}, notes + pre.notes + dec.notes)


def solve(priced: Priced, constants: Constants, source: str) -> Prediction:
    """The serving model on priced steps (modperf.serving)."""
    dep = priced.deployment
    if isinstance(priced.inputs, AggInputs):
        times = aggregated(priced.inputs, constants)
    else:
        times = disaggregated(priced.inputs, constants)
    cycle_ms = times.ttft_ms + (dep.osl - 1) * times.tpot_ms
    per_gpu = priced.concurrency * dep.osl / cycle_ms * 1000.0 / priced.gpus
    serving = {**times.detail, "constants": {"source": source, **vars(constants)}, "memory": priced.memory,
               "concurrency": priced.concurrency}
    provenance = {"versions": dict(sorted(priced.versions.items())), "kinds": dict(sorted(priced.kinds.items())),
                  "version_asked": dep.version}
    return Prediction(dep, times.ttft_ms, times.tpot_ms, 1000.0 / times.tpot_ms, per_gpu, priced.gpus,
                      priced.steps, serving, provenance, list(priced.notes))


def predict(db: Database, dep: Deployment, *, fitted: bool = True) -> Prediction:
    """TTFT and TPOT of ``dep``: :func:`price`, then the serving model with the backend's fitted
    constants (or physics only)."""
    constants, source = constants_for(dep, fitted)
    return solve(price(db, dep), constants, source)


__all__ = ["FIELDS", "Deployment", "Pool", "Prediction", "Priced", "constants_for", "deployment_from_row",
           "kv_bytes_per_token", "predict", "price", "served_model", "solve", "weight_bytes_per_gpu"]
