"""A model's attention layers, from its HF config: which table family answers each layer, and
with which fixed key fields.

This is the model's *layer schedule*, kept apart from module geometry on purpose: a row of a
perf table records one variant of a module (indexer or shared-indexer DSA, compress ratio 4 or
128, sliding window or full attention); the schedule says how many layers of each variant a
model has. Layers no attention-module table measures (linear attention, Mamba, DeepSeek-V4's
uncompressed sliding-window layers) are listed as uncovered, so a model-level estimate can say
what it leaves out instead of silently dropping it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..base import errors as E
from .models import ModelConfig
from .shard import head_dim


@dataclass(frozen=True)
class AttentionLayer:
    """One kind of attention layer. ``fields`` are key columns the layer fixes in its tables
    (op_name, compress_ratio, window_size, head_dim, kv heads...)."""

    kind: str  # gqa | mla | dsa | dsv4_csa | dsv4_hca | msa | uncovered
    label: str
    family: str | None
    context_table: str | None
    generation_table: str | None
    native_heads: int
    fields: tuple[tuple[str, Any], ...] = ()
    note: str | None = None
    #: Fields that differ between the context and the generation table (DSA op names).
    context_fields: tuple[tuple[str, Any], ...] = ()
    generation_fields: tuple[tuple[str, Any], ...] = ()

    @property
    def covered(self) -> bool:
        return self.family is not None

    @property
    def name(self) -> str:
        """The short name a query's ``layer`` field picks this kind by (full, sliding, chunked,
        dense, indexer, shared_indexer, sparse, csa, hca, mla)."""
        label = self.label.lower()
        for word in ("shared indexer", "indexer", "sliding", "chunked", "dense", "full", "sparse"):
            if word in label:
                return word.replace(" ", "_")
        return self.kind.removeprefix("dsv4_")

    def table(self, phase: str) -> str | None:
        return self.context_table if phase == "context" else self.generation_table

    def fields_for(self, phase: str) -> dict[str, Any]:
        extra = self.context_fields if phase == "context" else self.generation_fields
        return {**dict(self.fields), **dict(extra)}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "label": self.label, "family": self.family,
                "context_table": self.context_table,
                "generation_table": self.generation_table, "native_heads": self.native_heads,
                "context_fields": self.fields_for("context"), "generation_fields": self.fields_for("generation"),
                "note": self.note}


@dataclass
class LayerSchedule:
    """A model's attention layers in order, with its native head count."""

    model_id: str
    architecture: str | None
    native_heads: int
    layers: list[AttentionLayer] = field(default_factory=list)

    def groups(self) -> list[tuple[AttentionLayer, int]]:
        """Distinct layer kinds with their counts, in order of first appearance."""
        counts = Counter(self.layers)
        seen: list[AttentionLayer] = []
        for layer in self.layers:
            if layer not in seen:
                seen.append(layer)
        return [(layer, counts[layer]) for layer in seen]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model_id, "architecture": self.architecture, "native_heads": self.native_heads,
                "num_layers": len(self.layers),
                "groups": [{**layer.to_dict(), "count": n} for layer, n in self.groups()]}


def _uncovered(label: str, native: int, note: str) -> AttentionLayer:
    return AttentionLayer("uncovered", label, None, None, None, native, (), note)


def _gqa(native: int, kv: int, head_dim: int, window: int, label: str, note: str | None = None) -> AttentionLayer:
    return AttentionLayer(
        "gqa", label, "gqa", "context_attention", "generation_attention", native,
        (("num_key_value_heads", kv), ("head_dim", head_dim), ("window_size", window)), note,
    )


def _num_layers(cfg: ModelConfig) -> int:
    n = cfg.get("num_hidden_layers", None)
    if not isinstance(n, int) or n <= 0:
        raise E.ModelConfigError(f"config of {cfg.model_id} has no positive num_hidden_layers", file=cfg.path,
                                 fix="add num_hidden_layers to the config")
    return n


def _per_layer(cfg: ModelConfig, name: str, n: int, value: Any) -> list[Any]:
    """A config list with one scalar entry per layer (or more: some also cover MTP layers)."""
    if not isinstance(value, list) or len(value) < n or not all(
            isinstance(v, (int, float, str)) or v is None for v in value):
        raise E.ModelConfigError(
            f"{name} of {cfg.model_id} must list one value per layer ({n} layers)", file=cfg.path,
            values={"field": name, "entries": len(value) if isinstance(value, (list, str)) else None},
            fix=f"correct {name} in the config")
    return value


def _head_dim(cfg: ModelConfig) -> int:
    hd = head_dim(cfg)
    if hd is None:
        raise E.ModelConfigError(f"config of {cfg.model_id} gives no head_dim and hidden_size does not divide by "
                                 "num_attention_heads", file=cfg.path, fix="add head_dim to the config")
    return hd


def layer_schedule(cfg: ModelConfig) -> LayerSchedule:
    """The attention layers of a model, read from its config; kept on the config object (read
    for every deployment priced: its weights, its KV bytes; callers only read it)."""
    kept = cfg.__dict__.get("_layer_schedule")
    if kept is None:
        kept = cfg.__dict__["_layer_schedule"] = _layer_schedule(cfg)
    return kept


def _layer_schedule(cfg: ModelConfig) -> LayerSchedule:
    text = cfg.text
    arch = (cfg.architectures or (None,))[0]
    native = cfg.native_heads
    sched = LayerSchedule(cfg.model_id, arch, native)
    model_type = str(text.get("model_type") or cfg.raw.get("model_type") or "")

    blocks = text.get("layers_block_type")
    n = len(blocks) if isinstance(blocks, list) and "num_hidden_layers" not in text else _num_layers(cfg)
    if "compress_ratios" in text:  # DeepSeek-V4: per-layer compression (the list also covers MTP)
        ratios = _per_layer(cfg, "compress_ratios", n, text["compress_ratios"])[:n]
        for r in ratios:
            if r == 4:
                sched.layers.append(AttentionLayer("dsv4_csa", "DSV4 CSA (ratio 4)", "dsv4", "dsv4_csa_context_module",
                                                   "dsv4_csa_generation_module", native, (("compress_ratio", 4),)))
            elif r == 128:
                sched.layers.append(AttentionLayer("dsv4_hca", "DSV4 HCA (ratio 128)", "dsv4",
                                                   "dsv4_hca_context_module", "dsv4_hca_generation_module", native,
                                                   (("compress_ratio", 128),)))
            else:
                sched.layers.append(_uncovered(f"DSV4 ratio {r} (sliding window only)", native,
                                               "no module table measures uncompressed sliding-window DSV4 layers"))
        return sched

    if "index_topk" in text and "kv_lora_rank" in text:  # DSA: DeepSeek-V3.2, GLM-5.x
        types = text.get("indexer_types")
        for i in range(n):
            shared = isinstance(types, list) and i < len(types) and types[i] == "shared"
            suffix = "_skip_indexer" if shared else ""
            label = "DSA shared indexer" if shared else "DSA indexer"
            sched.layers.append(AttentionLayer(
                "dsa", label, "dsa", "dsa_context_module", "dsa_generation_module", native, (),
                "layer reuses the previous indexer's top-k (op_name *_skip_indexer)" if shared else None,
                (("op_name", f"dsa_context_module{suffix}"),), (("op_name", f"dsa_generation_module{suffix}"),),
            ))
        return sched

    if "kv_lora_rank" in text:  # MLA: DeepSeek-V3/R1, Kimi K2/K3
        linear = text.get("linear_attn_config")
        full = set(_per_layer(cfg, "full_attn_layers", 0, linear.get("full_attn_layers") or [])) \
            if isinstance(linear, dict) else None
        for i in range(n):
            if full is not None and (i + 1) not in full:  # Kimi-K3 lists layers 1-based
                sched.layers.append(_uncovered("KDA linear attention", native,
                                               "Kimi delta attention layers are not attention-module tables"))
            else:
                sched.layers.append(AttentionLayer("mla", "MLA", "mla_module", "mla_context_module",
                                                   "mla_generation_module", native))
        return sched

    sparse = text.get("sparse_attention_config")
    kv = cfg.kv_heads or native
    hd = _head_dim(cfg)
    if isinstance(sparse, dict) and sparse.get("use_sparse_attention"):  # MiniMax-M3
        freq = _per_layer(cfg, "sparse_attention_freq", n, sparse.get("sparse_attention_freq") or [1] * n)
        for i in range(n):
            if freq[i]:
                sched.layers.append(AttentionLayer("msa", "MSA sparse", "msa", "msa_context_module",
                                                   "msa_generation_module", native))
            else:
                sched.layers.append(_gqa(native, kv, hd, 0, "GQA dense (MSA model)",
                                         "dense layers of a sparse-attention model: GQA kernel"))
        return sched

    # GQA family: full attention with optional sliding-window / chunked / linear / mamba layers
    sliding = text.get("sliding_window")
    window = sliding if isinstance(sliding, int) else 0
    types = text.get("layer_types")
    hybrid = text.get("hybrid_override_pattern")
    mimo = text.get("hybrid_layer_pattern")
    if isinstance(hybrid, str) or isinstance(blocks, list):
        # Nemotron-H spells its blocks as a pattern ('*' attention, 'M' mamba, '-' mlp, 'E' moe),
        # Nemotron-3 Ultra/Lightning as a list of names; MLP and MoE blocks hold no attention.
        names = {"*": "attention", "M": "mamba"}
        block_kinds: Iterable[Any]
        if isinstance(hybrid, str):
            block_kinds = (names.get(ch) for ch in hybrid)
        else:
            assert isinstance(blocks, list)  # the other half of the condition above
            block_kinds = blocks
        for block in block_kinds:
            if block == "attention":
                sched.layers.append(_gqa(native, kv, hd, 0, "GQA full"))
            elif block == "mamba":
                sched.layers.append(_uncovered("Mamba", native, "state-space layers are not attention tables"))
        return sched
    if isinstance(mimo, list):  # MiMo-V2: 1 = sliding-window layer with its own head layout
        for p in _per_layer(cfg, "hybrid_layer_pattern", 0, mimo)[:n]:
            if p:
                sched.layers.append(_gqa(text.get("swa_num_attention_heads", native),
                                         text.get("swa_num_key_value_heads", kv), text.get("swa_head_dim", hd),
                                         int(text.get("sliding_window_size") or window), f"GQA sliding({window})",
                                         "v head dim differs from qk head dim; keyed by qk head_dim"))
            else:
                sched.layers.append(_gqa(native, kv, hd, 0, "GQA full",
                                         "v head dim differs from qk head dim; keyed by qk head_dim"))
        return sched
    if isinstance(types, list):
        for t in _per_layer(cfg, "layer_types", 0, types)[:n]:
            if t == "sliding_attention":
                sched.layers.append(_gqa(native, kv, hd, window, f"GQA sliding({window})"))
            elif t == "full_attention":
                g_kv = text.get("num_global_key_value_heads") or kv
                g_hd = text.get("global_head_dim") or hd
                sched.layers.append(_gqa(native, g_kv, g_hd, 0, "GQA full"))
            else:
                sched.layers.append(_uncovered(str(t).replace("_", " "), native,
                                               "linear-attention layers are not attention-module tables"))
        return sched
    chunk = text.get("attention_chunk_size")
    if isinstance(chunk, int) and model_type.startswith("llama4"):
        # Llama 4: every 4th layer is global NoPE attention, the others chunked local attention
        nope = _per_layer(cfg, "no_rope_layers", n,
                          text.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)])
        for i in range(n):
            if nope[i]:
                sched.layers.append(_gqa(native, kv, hd, chunk, f"GQA chunked({chunk})",
                                         "chunked local attention measured as a window of the chunk size"))
            else:
                sched.layers.append(_gqa(native, kv, hd, 0, "GQA full"))
        return sched
    uses_window = text.get("use_sliding_window", bool(window))
    max_window = text.get("max_window_layers")
    for i in range(n):
        # Qwen-style configs: when use_sliding_window is on, layers from max_window_layers up use
        # the window and the layers below it attend fully; Mistral-style configs (no switch)
        # window every layer.
        in_window = bool(uses_window and window and (max_window is None or i >= max_window))
        sched.layers.append(_gqa(native, kv, hd, window if in_window else 0,
                                 f"GQA sliding({window})" if in_window else "GQA full"))
    return sched


# --- feed-forward blocks --------------------------------------------------------------------


@dataclass(frozen=True)
class FfnLayer:
    """One kind of feed-forward block. ``dense``: a gated MLP of width ``inter``; ``moe``: a
    router over ``experts`` routed experts of width ``inter`` (the model's per-expert size), each
    token taking ``topk``, plus shared experts of total width ``shared_inter``. ``hidden`` is the
    experts' input width (the model's hidden size, or a latent MoE width)."""

    kind: str  # dense | moe
    inter: int
    hidden: int
    experts: int = 0
    topk: int = 0
    shared_inter: int = 0

    @property
    def label(self) -> str:
        if self.kind == "dense":
            return f"dense MLP ({self.inter})"
        shared = f" + shared {self.shared_inter}" if self.shared_inter else ""
        return f"MoE {self.experts}x{self.inter} top-{self.topk}{shared}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "inter": self.inter, "hidden": self.hidden,
                "experts": self.experts, "topk": self.topk, "shared_inter": self.shared_inter}


def _int(cfg: ModelConfig, *names: str) -> int | None:
    for name in names:
        value = cfg.get(name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def ffn_schedule(cfg: ModelConfig) -> list[FfnLayer]:
    """:func:`_ffn_schedule`, kept on the config object (callers only read it)."""
    kept = cfg.__dict__.get("_ffn_schedule")
    if kept is None:
        kept = cfg.__dict__["_ffn_schedule"] = _ffn_schedule(cfg)
    return kept


def _ffn_schedule(cfg: ModelConfig) -> list[FfnLayer]:
    """The feed-forward block of every decoder layer, read from the config (the layer order of
    the attention schedule). Which layers are MoE: DeepSeek-style ``first_k_dense_replace`` and
    ``moe_layer_freq`` (an int, or a per-layer list), Qwen-style ``decoder_sparse_step`` and
    ``mlp_only_layers``, Llama-4's ``interleave_moe_layer_step``; models with experts and none of
    these (Mixtral, MiniMax-M2, gpt-oss) are MoE on every layer; Nemotron-H patterns list their
    blocks (``E`` MoE, ``-`` MLP)."""
    text = cfg.text
    hidden = _int(cfg, "hidden_size")
    if hidden is None:
        raise E.ModelConfigError(f"config of {cfg.model_id} has no hidden_size", file=cfg.path,
                                 fix="add hidden_size to the config")
    experts = _int(cfg, "n_routed_experts", "num_experts", "num_local_experts") or 0
    dense_inter = _int(cfg, "intermediate_size_mlp", "intermediate_size") or 0
    hybrid = text.get("hybrid_override_pattern")
    blocks = text.get("layers_block_type")
    if experts:
        topk = _int(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk")
        expert_inter = _int(cfg, "moe_intermediate_size", "intermediate_size")
        if topk is None or expert_inter is None:
            raise E.ModelConfigError(
                f"config of {cfg.model_id} has {experts} experts but no top-k or expert width", file=cfg.path,
                fix="add num_experts_per_tok and moe_intermediate_size to the config")
        shared = (_int(cfg, "shared_expert_intermediate_size") or
                  (_int(cfg, "n_shared_experts") or 0) * expert_inter)
        if str(text.get("model_type", "")).startswith("gemma4"):
            shared = _int(cfg, "intermediate_size") or 0  # Gemma 4 runs a dense MLP beside its experts
        moe = FfnLayer("moe", expert_inter, _int(cfg, "routed_expert_hidden_size", "moe_latent_size") or hidden,
                       experts, topk, shared)
    dense = FfnLayer("dense", dense_inter or 0, hidden)
    if isinstance(hybrid, str) or isinstance(blocks, list):
        if isinstance(hybrid, str):
            kinds = [{"E": "moe", "-": "dense"}.get(ch) for ch in hybrid]
        else:
            kinds = [{"moe": "moe", "mlp": "dense"}.get(str(b)) for b in blocks or ()]
        return [moe if k == "moe" and experts else dense for k in kinds if k is not None]
    n = _num_layers(cfg)
    if not experts:
        return [dense] * n
    first = _int(cfg, "first_k_dense_replace")
    freq = text.get("moe_layer_freq")
    step = _int(cfg, "decoder_sparse_step")
    interleave = _int(cfg, "interleave_moe_layer_step")
    only_mlp = set(text.get("mlp_only_layers") or [])
    out = []
    for i in range(n):
        if isinstance(freq, list):
            is_moe = bool(freq[i]) if i < len(freq) else True
        elif first is not None or isinstance(freq, int):
            is_moe = i >= (first or 0) and i % (freq if isinstance(freq, int) and freq > 0 else 1) == 0
        elif step is not None:
            is_moe = i not in only_mlp and (i + 1) % max(step, 1) == 0
        elif interleave is not None:
            is_moe = (i + 1) % max(interleave, 1) == 0
        else:
            is_moe = i not in only_mlp
        out.append(moe if is_moe else dense)
    return out


def ffn_groups(cfg: ModelConfig) -> list[tuple[FfnLayer, int]]:
    """Distinct feed-forward kinds with their counts, in order of first appearance."""
    counts = Counter(ffn_schedule(cfg))
    return list(counts.items())
