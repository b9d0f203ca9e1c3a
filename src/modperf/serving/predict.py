"""Predict serving latency (TTFT, TPOT) of one deployment: parse it (from flags or a row of the
corpus's ``silicon_sample.csv``), price its engine steps from the op tables
(:func:`modperf.model.step.step_cost`), size its KV cache from the system file, and solve the
serving model (:mod:`modperf.serving`). docs/serving.md has the model and every constant.

The deployment's fields are the columns of ``silicon_sample.csv``, so a line of that file is a
question as it stands: ``model_path, system, backend, backend_version, mode, isl, osl,
gemm_quant_mode, moe_quant_mode, batch_size, tp_size, pp_size, attention_dp_size, moe_tp_size,
moe_ep_size`` and, for disaggregated deployments, ``prefill_`` / ``decode_`` + ``batch_size,
num_workers, tp_size, pp_size, attention_dp_size, moe_tp_size, moe_ep_size``; ``concurrency``
(the closed loop's users, all ranks and workers; read from the provenance column's
``silicon_concurrency=N`` where the field is absent) is checked against the pools where they fix
it, and sets the decode batch of a disaggregated deployment that gives neither
``decode_batch_size`` nor worker counts (an assumption every such answer names).
"""

from __future__ import annotations

import math
import re
import weakref
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..base import limits
from ..model.step import COMPOSED_FALLBACK, DecodePart, Parallel, SeqChunk, StepCost, step_cost
from ..query.resolve import served_note
from ..specs.layers import ffn_groups
from ..specs.roofline import bytes_of, gpu_spec
from . import (
    KV_BYTES,
    AggInputs,
    Backend,
    Constants,
    DisaggInputs,
    PoolMemory,
    aggregated,
    backend_of,
    chunks,
    disaggregated,
    kv_bytes_per_token,
    kv_transfer_ms,
    mean_kv,
    packed_requests,
    pool_memory,
    system_memory,
    weight_bytes_per_gpu,
)

if TYPE_CHECKING:
    from ..query.db import Database
    from ..specs.models import ModelConfig

#: Fields of a deployment (the columns of silicon_sample.csv that describe one).
TOP_FIELDS = ("id", "model_path", "system", "backend", "backend_version", "mode", "isl", "osl", "precision",
              "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
              "moe_tp_size", "moe_ep_size", "concurrency")
POOL_FIELDS = ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
#: Choices a deployment may name that silicon_sample.csv has no column for.
CHOICE_FIELDS = ("kv_cache_dtype", "token_budget")
FIELDS = frozenset(TOP_FIELDS) | frozenset(CHOICE_FIELDS) | {f"{side}_{f}" for side in ("prefill", "decode")
                                                            for f in POOL_FIELDS}
#: Columns of the CSV a prediction ignores (measurements and provenance), accepted so that a
#: row of the file can be passed as it is.
IGNORED = frozenset({"silicon_data_source", "silicon_ttft_ms", "silicon_tpot_ms", "model"})

#: A deployment as one JSON line (``predict --batch``), the example every fix about one shows.
DEPLOYMENT_EXAMPLE = ('{"model_path": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "mode": "agg", '
                      '"isl": 2048, "osl": 512, "batch_size": 8, "tp_size": 2}')

_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Pool:
    """One pool of identical workers (the whole deployment, when aggregated)."""

    tp: int
    attention_dp: int = 1
    moe_tp: int | None = None
    moe_ep: int = 1
    pp: int = 1
    batch: int | None = None  # per attention-DP rank
    #: Workers of this pool; None where a disaggregated deployment does not say (TPOT only).
    workers: int | None = 1

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
    #: The KV cache's dtype where the deployment names one (the attention tables are asked for
    #: it and the cache sized by it); None: the backend's rule (Backend.kv_element_bytes).
    kv_cache_dtype: str | None = None
    #: Tokens one engine step takes at most (vLLM max_num_batched_tokens, SGLang
    #: chunked_prefill_size, TRT-LLM max_num_tokens); None: the backend's default
    #: (Backend.step_budget).
    token_budget: int | None = None
    #: The closed loop's users (all ranks and workers), where given.
    concurrency: int | None = None
    #: What the deployment's fields did not say and the answer assumes (each one a note).
    assumptions: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "system": self.system, "backend": self.backend,
                "version": self.version, "mode": self.mode, "isl": self.isl, "osl": self.osl,
                "gemm_quant": self.gemm_quant, "moe_quant": self.moe_quant, "kv_cache_dtype": self.kv_cache_dtype,
                "token_budget": self.token_budget, "concurrency": self.concurrency,
                "assumptions": list(self.assumptions),
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


def _pool(row: Mapping[str, Any], prefix: str, *, need_batch: bool, workers: int | None = 1) -> Pool:
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
        workers=_int(row, f"{prefix}num_workers", limits.Range(1, 4096, "workers"), workers))


_SOURCE_CONCURRENCY = re.compile(r"(?:^|;)\s*silicon_concurrency=(\d+)\s*(?:;|$)")


def concurrency_of(row: Mapping[str, Any]) -> int | None:
    """A disaggregated deployment's closed-loop concurrency: the ``concurrency`` field, or else the
    ``silicon_concurrency=N`` of the provenance column ``silicon_data_source`` (how the file's
    rows state it); None where neither says."""
    if present(row, "concurrency"):
        return _int(row, "concurrency", limits.BATCH)
    source = row.get("silicon_data_source")
    match = _SOURCE_CONCURRENCY.search(source) if isinstance(source, str) else None
    if match is None:
        return None
    return limits.parse_int("silicon_data_source's silicon_concurrency", match.group(1), rng=limits.BATCH,
                            fix="give concurrency as a whole number")


def _concurrency_mismatch(concurrency: int, implied: int, how: str) -> E.QueryFieldError:
    return E.QueryFieldError(f"concurrency {concurrency} contradicts the pools: {how} = {implied}",
                             values={"concurrency": concurrency, "implied": implied},
                             fix="give the concurrency the pools serve, or leave it out")


#: The rule that sets a disaggregated decode batch from the concurrency alone (docs/serving.md,
#: "Disaggregated serving"): chosen on the calibration rows without worker counts.
DECODE_SPREAD_ASSUMPTION = (
    "assumed: decode batch per rank = ceil(concurrency {c} / {gpus} tp x attention-DP ranks of one decode worker) "
    "= {b}: the deployment gives neither decode_batch_size nor worker counts, so its {c} users are taken as "
    "spread over one decode worker's ranks (as attention-data-parallel ranks would hold them); the real pool may "
    "have more workers, attention DP or speculative decoding, which no field states")


def _dtype(value: str | None) -> str | None:
    if value is None:
        return None
    return _DTYPE_NAMES.get(value, value)


def deployment_from_row(row: Mapping[str, Any]) -> Deployment:
    """A deployment from silicon_sample.csv columns (module doc); empty fields are left out.
    Every malformed field is a QueryFieldError naming it."""
    if not isinstance(row, Mapping):
        raise E.QueryFieldError("a deployment is a JSON object of silicon_sample.csv columns",
                                fix=f"e.g. {DEPLOYMENT_EXAMPLE}")
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
        gemm_quant=_dtype(_str(row, "gemm_quant_mode")), moe_quant=_dtype(_str(row, "moe_quant_mode")),
        kv_cache_dtype=_dtype(_str(row, "kv_cache_dtype")), token_budget=_int(row, "token_budget", limits.TOKENS))
    # The provenance column's concurrency is read for disaggregated rows only: 9 calibration
    # rows of the file write an aggregated batch that is not concurrency / attention DP (their
    # replicas or attention DP unstated), and a row of the file is never refused for that.
    concurrency = concurrency_of(row) if mode == "disagg" else _int(row, "concurrency", limits.BATCH)
    common["concurrency"] = concurrency
    if mode == "agg":
        pool = _pool(row, "", need_batch=True)
        assert pool.batch is not None
        if concurrency is not None and concurrency != pool.batch * pool.attention_dp:
            raise _concurrency_mismatch(concurrency, pool.batch * pool.attention_dp, "batch_size x attention_dp_size")
        return Deployment(**common, pool=pool)
    prefill = _pool(row, "prefill_", need_batch=False, workers=None)
    if prefill.batch is None:
        prefill = Pool(prefill.tp, prefill.attention_dp, prefill.moe_tp, prefill.moe_ep, prefill.pp, 1,
                       prefill.workers)
    if not present(row, "decode_batch_size"):
        if concurrency is None or present(row, "decode_num_workers"):
            raise E.QueryFieldError(
                "a disaggregated deployment needs decode_batch_size: the decode step (and so TPOT) is priced at the "
                "decode pool's batch", values={"missing": ["decode_batch_size"]},
                fix="give decode_batch_size (and prefill_num_workers, decode_num_workers for TTFT); or, without "
                    "worker counts, the concurrency (an assumed decode batch, said in the answer)")
        spread = _pool(row, "decode_", need_batch=False, workers=None)
        ranks = spread.tp * spread.attention_dp
        batch = max(1, math.ceil(concurrency / ranks))
        decode = Pool(spread.tp, spread.attention_dp, spread.moe_tp, spread.moe_ep, spread.pp, batch, None)
        assumption = DECODE_SPREAD_ASSUMPTION.format(c=concurrency, gpus=ranks, b=batch)
        return Deployment(**common, prefill=prefill, decode=decode, assumptions=(assumption,))
    decode = _pool(row, "decode_", need_batch=True, workers=None)
    assert decode.batch is not None
    if concurrency is not None and decode.workers is not None \
            and concurrency != decode.batch * decode.workers * decode.attention_dp:
        raise _concurrency_mismatch(concurrency, decode.batch * decode.workers * decode.attention_dp,
                                    "decode_batch_size x decode_num_workers x decode_attention_dp_size")
    return Deployment(**common, prefill=prefill, decode=decode)


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
    """The model config with the deployment's dtypes (:func:`served_dtypes`), served as every
    command serves a dtype choice (:meth:`modperf.specs.models.ModelRegistry.served`): its own id where
    they are the checkpoint's, else the served variant ``ID@gemm=..,moe=..``. A model without
    MoE layers has no experts to serve: its MoE dtype is left out or repeats the GEMM dtype (as
    silicon_sample.csv writes dense deployments); any other is refused (it would change nothing)."""
    config = db.models.get(dep.model)
    if config.resolution and notes is not None:  # a name the config is not filed under: which answered
        notes.append(config.resolution)
    own = config.quantization
    moe_named = dep.moe_quant
    if moe_named is not None and not ffn_has_moe(config):
        if moe_named != dep.gemm_quant:
            raise E.QueryFieldError(
                f"moe_quant_mode {moe_named}: {config.model_id} has no MoE layers, so it would change nothing",
                values={"field": "moe_quant_mode", "value": moe_named, "model": config.model_id},
                fix="leave moe_quant_mode (--moe-quant) out for a dense model, and name its dtype as gemm_quant_mode "
                    "(--gemm-quant)")
        moe_named = None  # the file's convention for a dense deployment: the GEMM dtype, repeated
    gemm, moe, said = served_dtypes(own.gemm, own.moe, dep.gemm_quant, moe_named)
    if notes is not None:
        notes.extend(said)
    served = db.models.served(config, gemm=gemm, moe=moe)
    if notes is not None:
        chosen = served_note(served)
        if chosen is not None and served is not config:
            notes.append(chosen)
    return served


def ffn_has_moe(config: ModelConfig) -> bool:
    return any(layer.kind == "moe" for layer, _ in ffn_groups(config))


# --- memory: modperf.serving.memory (weight_bytes_per_gpu, kv_bytes_per_token re-exported here) --


# --- the prediction -----------------------------------------------------------------------------


@dataclass
class Prediction:
    """TTFT and TPOT of one deployment. ``ttft_ms`` (and the per-GPU rate and GPU count) are
    None where the deployment does not fix them; ``serving["ttft_reason"]`` says why."""

    deployment: Deployment
    ttft_ms: float | None
    tpot_ms: float
    tokens_per_s_per_user: float
    tokens_per_s_per_gpu: float | None
    gpus: int | None
    steps: dict[str, dict[str, Any]]
    serving: dict[str, Any]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    #: The dtypes the weights are served in beside the checkpoint's (ModelConfig.dtypes_served).
    served: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.deployment.id, "ttft_ms": self.ttft_ms, "ttft_reason": self.serving.get("ttft_reason"),
                "tpot_ms": self.tpot_ms,
                "tokens_per_s_per_user": self.tokens_per_s_per_user,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "gpus": self.gpus,
                "deployment": self.deployment.to_dict(), "served": self.served, "steps": self.steps,
                "serving": self.serving, "provenance": self.provenance, "notes": self.notes}


#: The pricing fallbacks a step may stand on, found by reading why rows were not answered
#: (evaluation rows among them; docs/serving.md reports their ablation): an answer names
#: each one it used (``provenance.fallbacks``).
FALLBACKS = {
    "split": "an op past its grid priced as equal parts inside it",
    "nccl_alltoall": "an all-to-all the all-to-all table holds no bucket for, from the NCCL table",
    "widened": "a collective over more GPUs than the table measured, widened by the roofline",
    "composed_mla": "an MLA layer composed from its parts where the module tables cannot answer",
}


def fallbacks_of(op: Any) -> list[str]:
    """The fallbacks one priced op stands on (:data:`FALLBACKS`)."""
    out = []
    if "split" in op.fields:
        out.append(FALLBACKS["split"])
    if "(nccl alltoall" in op.name:
        out.append(FALLBACKS["nccl_alltoall"])
    if " widened to " in op.name:
        out.append(FALLBACKS["widened"])
    return out


def launches(step: StepCost) -> int:
    """The ops an eager engine launches for ``step``: every op of every layer."""
    return sum(op.count for op in step.ops)


class _Steps:
    """Prices the engine steps of one pool and keeps their provenance."""

    def __init__(self, db: Database, dep: Deployment, model: str, pool: Pool, version: str | None,
                 has_moe: bool, allow_substitute: bool = False) -> None:
        self.db, self.dep, self.model, self.pool, self.version = db, dep, model, pool, version
        self.allow_substitute = allow_substitute
        self.substitutions: set[str] = set()
        self.parallel = pool.parallel(has_moe)
        self.dtypes = {"kv_cache_dtype": dep.kv_cache_dtype} if dep.kv_cache_dtype else None
        self.kinds: Counter[str] = Counter()
        self.versions: dict[str, str] = {}
        self.notes: list[str] = []
        self.fallbacks: set[str] = set()
        self.launches = 0  # ops of the last eager step priced (modperf.serving: the host floor)
        gpu = gpu_spec(dep.system)
        self.hop_ms = (pool.pp - 1) * gpu.p2p_latency * 1000.0  # pipeline stages hand over once per step

    def cost(self, prefill: SeqChunk | None = None, decode: DecodePart | None = None,
             graphed: bool = False) -> StepCost:
        step = step_cost(self.db, model=self.model, system=self.dep.system, backend=self.dep.backend,
                         parallel=self.parallel, version=self.version, prefill=prefill, decode=decode,
                         dtypes=self.dtypes, graphed=graphed, allow_substitute=self.allow_substitute)
        if not step.complete or step.total_ms is None:
            reasons = "; ".join(f"{r['name']}: {r['reason']}" for r in step.not_covered[:3])
            raise E.NotCoveredError(f"the step of {self.model} on {self.dep.system} {self.dep.backend} is partial: "
                                    f"{reasons}", values={"model": self.model, "system": self.dep.system,
                                                          "backend": self.dep.backend},
                                    fix="see `modperf estimate --scope model` for the ops no table covers")
        for op in step.ops:
            self.kinds[op.kind] += op.count
            self.fallbacks.update(fallbacks_of(op))
            if op.substitution:
                self.substitutions.add(f"{op.name}: {op.substitution}")
        if any(note.startswith(COMPOSED_FALLBACK) for note in step.notes):
            self.fallbacks.add(FALLBACKS["composed_mla"])
        self.versions.update(step.versions)
        self.notes.extend(n for n in step.served_from if n not in self.notes)  # where a misplaced table lies
        return step

    def ms(self, prefill: SeqChunk | None = None, decode: DecodePart | None = None) -> float:
        step = self.cost(prefill, decode)
        assert step.total_ms is not None
        self.launches = launches(step)
        return float(step.total_ms) + self.hop_ms

    def prefill_one(self, isl: int, chunk: int) -> float:
        return sum(self.ms(prefill=SeqChunk(1, tokens, prefix)) for tokens, prefix in chunks(isl, chunk))


#: Per database: (system, backend) -> the versions holding its GEMM table, for every pair its
#: catalog holds any table of (every deployment priced asks; the catalog has hundreds of slots).
_HELD: weakref.WeakKeyDictionary[Database, dict[tuple[str, str], frozenset[str]]] = weakref.WeakKeyDictionary()


def _held(db: Database) -> dict[tuple[str, str], frozenset[str]]:
    held = _HELD.get(db)
    if held is None:
        pairs: dict[tuple[str, str], set[str]] = {}
        for r in db.store.catalog.slots:
            versions = pairs.setdefault((str(r.system), str(r.backend)), set())
            if r.table == "gemm":
                versions.add(str(r.version))
        held = _HELD[db] = {k: frozenset(v) for k, v in pairs.items()}
    return held


def _version_for(db: Database, dep: Deployment, notes: list[str]) -> str | None:
    """The deployment's backend version where the corpus holds that version's GEMM table for the
    system (then the other tables come from the nearest version holding them); otherwise None
    (each table takes the newest version held), said in a note. A version that holds only a
    scattered family (a MoE or communication sweep) does not anchor the step. A system and
    backend the corpus holds nothing of is an UnknownTableError naming the nearest."""
    gemm_versions = _held(db).get((dep.system, dep.backend))
    if gemm_versions is None:
        raise db.store.unknown_slot(dep.system, dep.backend, "(any version)", "gemm")
    if dep.version is None:
        return None
    if dep.version in gemm_versions:
        return dep.version
    notes.append(f"backend version {dep.version} has no GEMM table for {dep.system} {dep.backend} in the corpus: "
                 "each table takes the newest version held (provenance.versions)")
    return None


def constants_for(dep: Deployment, fitted: bool = True) -> tuple[Constants, str]:
    """The fitted constants of the deployment's backend, mode and GPU generation (carried by
    the backend's module, :mod:`modperf.serving`), or the physics-only ones where none are
    fitted or ``fitted`` is False; and where they come from."""
    return backend_of(dep.backend).constants(dep.mode, dep.system, fitted)


@dataclass
class Priced:
    """A deployment's engine steps, priced from the op tables: everything the serving model
    needs that does not depend on its fitted constants. ``ttft_reason`` says why TTFT cannot
    be answered (a disaggregated deployment without worker counts: TPOT only)."""

    deployment: Deployment
    inputs: AggInputs | DisaggInputs
    steps: dict[str, Any]
    memory: dict[str, Any]
    concurrency: int | None
    gpus: int | None
    kinds: Counter[str]
    versions: dict[str, str]
    notes: list[str]
    #: The dtypes the weights are served in beside the checkpoint's (ModelConfig.dtypes_served).
    served: dict[str, Any] = field(default_factory=dict)
    ttft_reason: str | None = None
    #: The pricing fallbacks the steps stand on (:data:`FALLBACKS`).
    fallbacks: list[str] = field(default_factory=list)
    #: Ops answered from another native head count (``allow_substitute``): empty for a strict
    #: answer.
    substitutions: list[str] = field(default_factory=list)
    #: Prices more steps of the same (aggregated) pool: the simulation's grid (modperf.percentiles).
    pricer: _Steps | None = None
    #: What the deployment did not say and the answer assumes (``Deployment.assumptions``).
    assumptions: list[str] = field(default_factory=list)


def _substituted(substitutions: set[str]) -> list[str]:
    if not substitutions:
        return []
    return [f"substituted (allow_substitute): {len(substitutions)} op(s) answered from another native head count, "
            "per head at the rank's local heads: " + "; ".join(sorted(substitutions))]


def _decode_step(steps: _Steps, backend: Backend, memory_capacity: float, batch: int, kv: int,
                 notes: list[str]) -> tuple[StepCost, bool]:
    """A decode-only step as the engine runs it: replayed as a CUDA graph up to the backend's
    largest captured batch, eagerly beyond it (docs/serving.md, "What a served step pays")."""
    graphed = batch <= backend.graph_max_batch(memory_capacity, steps.pool.tp)
    if not graphed:
        notes.append(f"decode batch {batch} is above {backend.name}'s largest CUDA graph "
                     f"({backend.graph_max_batch(memory_capacity, steps.pool.tp)}): priced as an eager step")
    return steps.cost(decode=DecodePart(batch, kv), graphed=graphed), graphed


@dataclass(frozen=True)
class Served:
    """What every pool of a deployment shares: the version its tables are anchored at, the model
    as served (dtypes), whether it has MoE layers, the per-step token budget (the deployment's,
    else the backend's default), and the notes saying what was chosen."""

    version: str | None
    config: ModelConfig
    has_moe: bool
    chunk: int
    notes: tuple[str, ...]


def serving_of(db: Database, dep: Deployment) -> Served:
    """:class:`Served` of ``dep`` (a deployment search asks it once per backend, not per point)."""
    backend = backend_of(dep.backend)  # a backend without serving rules is refused by name first
    notes: list[str] = []
    version = _version_for(db, dep, notes)
    config = served_model(db, dep, notes)
    chunk = dep.token_budget or backend.step_budget(system_memory(dep.system).capacity)
    return Served(version, config, ffn_has_moe(config), chunk, tuple(notes))


def kv_element_bytes(backend: Backend, config: ModelConfig, kv_cache_dtype: str | None = None) -> float:
    """Bytes one KV-cache element takes: the dtype the deployment names, as named; otherwise
    the backend's rule (:meth:`Backend.kv_element_bytes`)."""
    if kv_cache_dtype is not None:
        return bytes_of(kv_cache_dtype)
    return backend.kv_element_bytes(config.quantization.gemm)


def pool_memory_of(dep: Deployment, pool: Pool, served: Served, what: str = "") -> PoolMemory:
    """The memory of one GPU of ``pool`` serving ``dep`` (:func:`modperf.serving.pool_memory`):
    ``what`` is ``""`` for an aggregated deployment's pool, ``"prefill"`` (requests hold their
    prompt) or ``"decode"`` for a disaggregated one's. A DeploymentFitError where it cannot run."""
    backend = backend_of(dep.backend)
    if what == "prefill":
        tokens = reserved = dep.isl
    else:
        tokens, reserved = dep.isl + dep.osl, backend.reserved_tokens(dep.isl, dep.osl)
    return pool_memory(backend, served.config, pool, system=dep.system, memory=system_memory(dep.system),
                       chunk=served.chunk, tokens=tokens, reserved=reserved,
                       element=kv_element_bytes(backend, served.config, dep.kv_cache_dtype), what=what)


def price(db: Database, dep: Deployment, served: Served | None = None, *, allow_substitute: bool = False) -> Priced:
    """The engine steps of ``dep`` from the op tables (module doc). Raises a ModperfError when a
    step cannot be priced (an op out of coverage, a shard that does not divide, an unknown model
    or system) or the deployment cannot run (DeploymentFitError, with the figures).
    ``served``: :func:`serving_of` ``dep``, when the caller has it already.
    ``allow_substitute``: an attention module table without the model's native head count
    answers from the nearest native it measured, scaled per head (``Priced.substitutions`` and
    a note say which ops)."""
    served = served or serving_of(db, dep)
    notes = list(served.notes)
    version, config, has_moe, chunk = served.version, served.config, served.has_moe, served.chunk
    backend = backend_of(dep.backend)
    memory = system_memory(dep.system)
    kv_mean = mean_kv(dep.isl, dep.osl)
    inputs: AggInputs | DisaggInputs
    if dep.mode == "agg":
        pool = dep.pool
        assert pool is not None and pool.batch is not None
        mem = pool_memory_of(dep, pool, served)
        notes += mem.notes
        priced = _Steps(db, dep, config.model_id, pool, version, has_moe, allow_substitute)
        running = max(1, min(pool.batch, mem.max_running))
        decode_batch = math.ceil(running / pool.pp)
        packed = packed_requests(running, dep.isl, chunk) if dep.isl <= chunk else 1
        one = priced.prefill_one(dep.isl, chunk)
        packed_ms = priced.ms(prefill=SeqChunk(packed, dep.isl, 0)) if dep.isl <= chunk else one
        prefill_ops = priced.launches
        decode_step, graphed = _decode_step(priced, backend, memory.capacity, decode_batch, kv_mean, notes)
        decode_ms = float(decode_step.total_ms or 0.0) + priced.hop_ms
        capped_ms = priced.ms(prefill=SeqChunk(packed, min(chunk, dep.isl), 0),
                              decode=DecodePart(decode_batch, kv_mean))
        inputs = AggInputs(pool.batch, dep.isl, dep.osl, one, packed, packed_ms, decode_ms, capped_ms,
                           mem.max_running, prefill_ops, len(chunks(dep.isl, chunk)), backend.scheduler)
        agg_steps = {"prefill_one": {"ms": one, "chunk_tokens": chunk},
                     "prefill_packed": {"ms": packed_ms, "requests": packed, "ops": prefill_ops},
                     "decode": {"ms": decode_ms, "batch": decode_batch, "kv": kv_mean, "graphed": graphed,
                                "components": decode_step.components},
                     "mixed": {"ms": capped_ms, "prefill_tokens": packed * min(chunk, dep.isl),
                               "decode_batch": decode_batch}}
        return Priced(dep, inputs, agg_steps, mem.to_dict(), pool.batch * pool.attention_dp, pool.gpus_per_worker,
                      priced.kinds, priced.versions, notes + priced.notes + _substituted(priced.substitutions),
                      config.dtypes_served(), fallbacks=sorted(priced.fallbacks),
                      substitutions=sorted(priced.substitutions), pricer=priced)
    assert dep.prefill is not None and dep.decode is not None and dep.decode.batch is not None
    # Both pools' memory is checked before any step is priced: a deployment that cannot run is
    # refused as such whichever of its steps the tables could price.
    pre_mem = pool_memory_of(dep, dep.prefill, served, "prefill")
    dec_mem = pool_memory_of(dep, dep.decode, served, "decode")
    dec = price_decode_pool(db, dep, served, allow_substitute=allow_substitute, memory=dec_mem)
    notes += pre_mem.notes + dec.notes
    memory_doc: dict[str, Any] = {"prefill": pre_mem.to_dict(), "decode": dec.memory}
    if dep.prefill.workers is None or dep.decode.workers is None:
        reason = ("TTFT needs the topology: without prefill_num_workers and decode_num_workers the prefill pool's "
                  "load is unknown (two such exports of one configuration differ 10x in TTFT); TPOT is the decode "
                  "pool's step")
        inputs = DisaggInputs(None, dep.isl, dep.osl, None, None, None, 1, dec.values["decode_ms"], None)
        return Priced(dep, inputs, dec.steps, memory_doc, dep.concurrency, None, dec.kinds, dec.versions,
                      list(dep.assumptions) + notes + dec.step_notes + _substituted(dec.substitutions),
                      config.dtypes_served(), ttft_reason=reason, fallbacks=sorted(dec.fallbacks),
                      substitutions=sorted(dec.substitutions), assumptions=list(dep.assumptions))
    pre = price_prefill_pool(db, dep, served, allow_substitute=allow_substitute, memory=pre_mem)  # its notes: pre_mem's
    concurrency = dep.decode.batch * dep.decode.workers * dep.decode.attention_dp
    inputs = disagg_inputs(dep.isl, dep.osl, concurrency, dep.prefill.workers * dep.prefill.attention_dp, pre, dec)
    gpus = dep.prefill.workers * dep.prefill.gpus_per_worker + dep.decode.workers * dep.decode.gpus_per_worker
    memory_doc["kv_transfer_bytes"] = pre.kv_transfer_bytes
    return Priced(dep, inputs, {**pre.steps, **dec.steps}, memory_doc, concurrency, gpus, pre.kinds + dec.kinds,
                  {**pre.versions, **dec.versions},
                  notes + pre.step_notes + dec.step_notes + _substituted(pre.substitutions | dec.substitutions),
                  config.dtypes_served(), fallbacks=sorted(pre.fallbacks | dec.fallbacks),
                  substitutions=sorted(pre.substitutions | dec.substitutions))


@dataclass
class PoolPriced:
    """One pool of a disaggregated deployment, priced: what the serving model takes from it
    (the prefill pool: one request's prefill, a packed prefill step, its ops, the KV transfer;
    the decode pool: its decode step), its steps, their provenance, and its memory. The other
    pool and the worker counts do not change it. ``notes`` are the pool's own (memory, CUDA
    graphs), ``step_notes`` the steps' (where a table lies)."""

    values: dict[str, Any]
    steps: dict[str, Any]
    kinds: Counter[str]
    versions: dict[str, str]
    notes: list[str]
    step_notes: list[str]
    memory: dict[str, Any]
    fallbacks: set[str] = field(default_factory=set)
    substitutions: set[str] = field(default_factory=set)
    kv_transfer_bytes: float = 0.0


def price_prefill_pool(db: Database, dep: Deployment, served: Served | None = None, *,
                       allow_substitute: bool = False, memory: PoolMemory | None = None) -> PoolPriced:
    """The prefill pool of a disaggregated ``dep`` (its batch: requests packed per step);
    ``memory``: :func:`pool_memory_of` the pool, when the caller has checked it already."""
    assert dep.prefill is not None
    served = served or serving_of(db, dep)
    mem = memory or pool_memory_of(dep, dep.prefill, served, "prefill")
    config, chunk = served.config, served.chunk
    pre = _Steps(db, dep, config.model_id, dep.prefill, served.version, served.has_moe, allow_substitute)
    batch = dep.prefill.batch or 1
    packed = packed_requests(batch, dep.isl, chunk) if dep.isl <= chunk else 1
    one = pre.prefill_one(dep.isl, chunk)
    packed_ms = pre.ms(prefill=SeqChunk(packed, dep.isl, 0)) if dep.isl <= chunk else one
    prefill_ops = pre.launches
    element = kv_element_bytes(backend_of(dep.backend), config, dep.kv_cache_dtype)
    kv_all = kv_bytes_per_token(config, 1, dep.isl + dep.osl, element) * dep.isl  # the whole request's cache
    transfer_ms = kv_transfer_ms(kv_all, system=dep.system, gpus=dep.prefill.gpus_per_worker)
    steps = {"prefill_one": {"ms": one, "chunk_tokens": chunk},
             "prefill_packed": {"ms": packed_ms, "requests": packed, "ops": prefill_ops}}
    values = {"one": one, "packed": packed, "packed_ms": packed_ms, "transfer_ms": transfer_ms,
              "ops": prefill_ops, "chunks": len(chunks(dep.isl, chunk))}
    return PoolPriced(values, steps, pre.kinds, pre.versions, list(mem.notes), pre.notes, mem.to_dict(),
                      pre.fallbacks, pre.substitutions, kv_all)


def price_decode_pool(db: Database, dep: Deployment, served: Served | None = None, *,
                      allow_substitute: bool = False, memory: PoolMemory | None = None) -> PoolPriced:
    """The decode pool of a disaggregated ``dep`` (its batch: requests per attention-DP rank),
    its step replayed as a CUDA graph up to the backend's largest captured batch; ``memory``:
    :func:`pool_memory_of` the pool, when the caller has checked it already."""
    assert dep.decode is not None and dep.decode.batch is not None
    served = served or serving_of(db, dep)
    mem = memory or pool_memory_of(dep, dep.decode, served, "decode")
    notes = list(mem.notes)
    dec = _Steps(db, dep, served.config.model_id, dep.decode, served.version, served.has_moe, allow_substitute)
    kv_mean = mean_kv(dep.isl, dep.osl)
    decode_step, graphed = _decode_step(dec, backend_of(dep.backend), system_memory(dep.system).capacity,
                                        dep.decode.batch, kv_mean, notes)
    decode_ms = float(decode_step.total_ms or 0.0) + dec.hop_ms
    steps = {"decode": {"ms": decode_ms, "batch": dep.decode.batch, "kv": kv_mean, "graphed": graphed,
                        "components": decode_step.components}}
    return PoolPriced({"decode_ms": decode_ms}, steps, dec.kinds, dec.versions, notes, dec.notes, mem.to_dict(),
                      dec.fallbacks, dec.substitutions)


def disagg_inputs(isl: int, osl: int, concurrency: int, prefill_ranks: int, pre: PoolPriced,
                  dec: PoolPriced) -> DisaggInputs:
    """The serving model's inputs of a disaggregated deployment from its two pools: closed-loop
    users over the whole deployment (decode batch x decode workers x their DP ranks) and prefill
    ranks (prefill workers x their DP ranks)."""
    p = pre.values
    return DisaggInputs(concurrency, isl, osl, prefill_ranks, p["one"], p["packed_ms"], p["packed"],
                        dec.values["decode_ms"], p["transfer_ms"], p["ops"], p["chunks"])


def tokens_per_s_per_gpu(concurrency: int, osl: int, ttft_ms: float, tpot_ms: float, gpus: int) -> float:
    """Output tokens per second per GPU of a closed loop (docs/search.md, the scoreboard's
    definition): ``concurrency x osl / (TTFT + (osl - 1) x TPOT) / GPUs``."""
    cycle_ms = ttft_ms + (osl - 1) * tpot_ms
    return concurrency * osl / cycle_ms * 1000.0 / gpus


def solve(priced: Priced, constants: Constants, source: str) -> Prediction:
    """The serving model on priced steps (modperf.serving)."""
    dep = priced.deployment
    if isinstance(priced.inputs, AggInputs):
        times = aggregated(priced.inputs, constants)
    else:
        times = disaggregated(priced.inputs, constants)
    per_gpu: float | None = None
    if times.ttft_ms is not None and priced.concurrency is not None and priced.gpus:
        per_gpu = tokens_per_s_per_gpu(priced.concurrency, dep.osl, times.ttft_ms, times.tpot_ms, priced.gpus)
    serving = {**times.detail, "constants": {"source": source, **vars(constants)}, "memory": priced.memory,
               "concurrency": priced.concurrency}
    if priced.ttft_reason is not None:
        serving["ttft_reason"] = priced.ttft_reason
    provenance = {"versions": dict(sorted(priced.versions.items())), "kinds": dict(sorted(priced.kinds.items())),
                  "version_asked": dep.version, "fallbacks": list(priced.fallbacks),
                  "substitutions": list(priced.substitutions), "assumptions": list(priced.assumptions)}
    return Prediction(dep, times.ttft_ms, times.tpot_ms, 1000.0 / times.tpot_ms, per_gpu, priced.gpus,
                      priced.steps, serving, provenance, list(priced.notes), dict(priced.served))


def predict(db: Database, dep: Deployment, *, fitted: bool = True, allow_substitute: bool = False) -> Prediction:
    """TTFT and TPOT of ``dep``: :func:`price`, then the serving model with the constants its
    backend carries for its mode and GPU generation (or physics only)."""
    constants, source = constants_for(dep, fitted)
    return solve(price(db, dep, allow_substitute=allow_substitute), constants, source)


__all__ = ["FIELDS", "KV_BYTES", "Deployment", "Pool", "PoolPriced", "Prediction", "Priced", "Served", "concurrency_of",
           "constants_for", "deployment_from_row", "disagg_inputs", "kv_bytes_per_token", "kv_element_bytes",
           "pool_memory_of", "predict", "price", "price_decode_pool", "price_prefill_pool", "served_model",
           "serving_of", "solve", "tokens_per_s_per_gpu", "weight_bytes_per_gpu"]
