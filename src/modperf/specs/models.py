"""Model geometry from Hugging Face ``config.json`` files.

A model's *native* head count is its config's ``num_attention_heads``; nothing in modperf
derives it from a literal. Config files are found in the embedded corpus's ``model_configs/``
(a file ``org--Name_config.json`` is model id ``org/Name``) and in user folders given with
``--model-configs DIR`` or ``MODPERF_MODEL_CONFIGS`` (``os.pathsep``-separated); a user folder
wins over the embedded one for the same id.

Some configs (multimodal wrappers such as Kimi-K3, Qwen3-VL, MiniMax-M3-NVFP4) nest the
language model under ``text_config``; the language model is what attention tables measure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base import limits
from ..base.errors import ModelConfigError, ModelConfigsFolderError, UnknownModelError, quote
from ..fast.cache_keys import MODEL_CONFIGS_ENV, config_folders
from .model_names import KNOWN_NAMES, known_name

CONFIG_SUFFIX = "_config.json"
#: Companion files that sit beside configs but are not model configs.
NOT_CONFIGS = ("_hf_quant_config.json",)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class ConfigField:
    """A config field a module's computation reads. ``name`` may be dotted
    (``sparse_attention_config.sparse_topk_blocks``). ``default`` is the value the model code
    assumes when the field is absent (a feature flag that is off); REQUIRED means absence is
    an error, since guessing would merge different modules."""

    name: str
    default: Any = REQUIRED


def model_id_from_filename(name: str) -> str | None:
    if not name.endswith(CONFIG_SUFFIX) or any(name.endswith(s) for s in NOT_CONFIGS):
        return None
    return name[: -len(CONFIG_SUFFIX)].replace("--", "/")


def config_filename(model_id: str) -> str:
    return model_id.replace("/", "--") + CONFIG_SUFFIX


@dataclass
class ModelConfig:
    """One model's HF config (``raw``) and what modperf reads from it."""

    model_id: str
    path: Path
    raw: dict[str, Any]
    #: The companion ``org--Name_hf_quant_config.json`` (ModelOpt checkpoints), when present.
    hf_quant: dict[str, Any] | None = None
    #: Weights served in other dtypes than the checkpoint's (:meth:`ModelRegistry.served`, spelled
    #: ``ORG/NAME@...``): replaces :attr:`quantization`.
    served: Quantization | None = None
    #: Where the name asked is not this config's (a renamed repository, a served variant:
    #: modperf.specs.model_names): which config answered it and why, for the answer's notes.
    resolution: str | None = None

    @property
    def text(self) -> dict[str, Any]:
        """The language-model section: ``text_config`` when the top level is a wrapper."""
        nested = self.raw.get("text_config")
        if "num_attention_heads" not in self.raw and isinstance(nested, dict):
            return nested
        return self.raw

    def get(self, name: str, default: Any = REQUIRED) -> Any:
        node: Any = self.text
        for part in name.split("."):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                if default is REQUIRED:
                    raise ModelConfigError(
                        f"config of {self.model_id} has no field {name!r}",
                        file=self.path,
                        fix=f"add {name!r} to the config, or use the config the model was published with",
                    )
                return default
        return node

    @property
    def native_heads(self) -> int:
        value = self.get("num_attention_heads")
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelConfigError(
                f"num_attention_heads of {self.model_id} is not a positive integer",
                file=self.path,
                values={"num_attention_heads": value},
                fix="correct num_attention_heads in the config",
            )
        return value

    @property
    def kv_heads(self) -> int | None:
        value = self.get("num_key_value_heads", None)
        return value if isinstance(value, int) else None

    @property
    def architectures(self) -> tuple[str, ...]:
        """Both the wrapper's and the language model's architectures (tables record either)."""
        names: list[str] = []
        for section in (self.raw, self.text):
            for name in section.get("architectures") or ():
                if name not in names:
                    names.append(str(name))
        return tuple(names)

    @property
    def quantization(self) -> Quantization:
        """What the weights are served as: the checkpoint's dtypes (:attr:`checkpoint`), or the
        ones a deployment chose (:meth:`ModelRegistry.served`)."""
        return self.served if self.served is not None else Quantization.of(self)

    @property
    def checkpoint(self) -> Quantization:
        """What the checkpoint's weights are stored as (:class:`Quantization`), whatever they are
        served as."""
        return Quantization.of(self)

    @property
    def base_id(self) -> str:
        """The checkpoint's model id (a served variant's id without its ``@`` suffix)."""
        return self.model_id.partition("@")[0]

    def dtypes_served(self) -> dict[str, Any]:
        """The dtypes the weights are served as beside the checkpoint's, as plain data (what
        estimate and predict report as ``served``)."""
        served, own = self.quantization, self.checkpoint
        return {"model": self.model_id, "gemm": served.gemm, "moe": served.moe,
                "checkpoint": {"gemm": own.gemm, "moe": own.moe, "source": own.source}}

    def geometry(self, fields: Sequence[ConfigField]) -> tuple[tuple[str, Any], ...]:
        """(field, value) pairs for the fields a module reads, plus the native count."""
        values: list[tuple[str, Any]] = [("num_attention_heads", self.native_heads)]
        for f in fields:
            value = self.get(f.name, f.default)
            values.append((f.name, _hashable(value)))
        return tuple(values)


@dataclass(frozen=True)
class Quantization:
    """The dtypes a checkpoint fixes, in the names the perf tables key, read from the config's
    ``quantization_config`` and the companion ``*_hf_quant_config.json``. ``gemm`` is the dense
    linear layers' dtype (``gemm_type`` of module tables, ``gemm_dtype`` of GEMM tables);
    ``moe`` the routed experts' (``moe_dtype``):

    =======================================================  ===========  ================
    checkpoint                                               gemm         moe
    =======================================================  ===========  ================
    no quantization config                                   bfloat16     bfloat16
    ``quant_method: fp8`` with ``weight_block_size``         fp8_block    fp8_block
    ``quant_method: fp8`` without blocks; ``quant_algo FP8``  fp8          fp8
    ``quant_algo: NVFP4``                                    nvfp4        nvfp4
    ``quant_method: mxfp4`` (gpt-oss: experts only)          bfloat16     w4a16_mxfp4
    ``compressed-tensors`` 4-bit, attention ignored          bfloat16     int4_wo / w4a16_mxfp4
    any other mixed precision                                undecided    undecided
    =======================================================  ===========  ================

    An undecided dtype (None) is left to the user's value or the table's default, and the
    answer says so. ``source`` says where the values came from.
    """

    gemm: str | None
    moe: str | None
    source: str

    @classmethod
    def of(cls, cfg: ModelConfig) -> Quantization:
        q = cfg.raw.get("quantization_config") or cfg.text.get("quantization_config")
        q = q if isinstance(q, dict) else None
        hf = cfg.hf_quant
        method = str((q or {}).get("quant_method") or "").lower()
        algo = str((q or {}).get("quant_algo") or "").upper()
        if not algo and isinstance(hf, dict):
            section = hf.get("quantization", hf)
            algo = str(section.get("quant_algo") or "").upper() if isinstance(section, dict) else ""
        where = "quantization_config" if q is not None else (
            "hf_quant_config.json" if hf is not None else "no quantization config")
        if method == "fp8":
            blocked = bool((q or {}).get("weight_block_size"))
            dtype = "fp8_block" if blocked else "fp8"
            return cls(dtype, dtype, f"{where}: quant_method fp8" + (
                f", weight_block_size {list((q or {})['weight_block_size'])}" if blocked else ""))
        if algo == "FP8":
            return cls("fp8", "fp8", f"{where}: quant_algo FP8")
        if algo == "NVFP4":
            return cls("nvfp4", "nvfp4", f"{where}: quant_algo NVFP4")
        if method == "mxfp4":
            return cls("bfloat16", "w4a16_mxfp4", f"{where}: quant_method mxfp4 quantizes the experts only")
        if method == "compressed-tensors" and q is not None and _ignores_attention(q):
            moe = _compressed_experts(q)
            return cls("bfloat16", moe, f"{where}: compressed-tensors leaves attention and dense layers in bfloat16"
                       + (f"; experts {moe}" if moe else ""))
        if method or algo:
            return cls(None, None, f"{where}: {method or algo} does not fix one dtype per kind of layer")
        return cls("bfloat16", "bfloat16", "no quantization config: bfloat16 weights")


def _ignores_attention(q: Mapping[str, Any]) -> bool:
    return any("self_attn" in str(entry) for entry in q.get("ignore") or ())


def _compressed_experts(q: Mapping[str, Any]) -> str | None:
    """The experts' dtype of a compressed-tensors checkpoint that quantizes only them."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        return None
    (group,) = groups.values()
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict) or weights.get("num_bits") != 4 or group.get("input_activations"):
        return None
    if "mxfp4" in str(group.get("format") or q.get("format") or ""):
        return "w4a16_mxfp4"
    return "int4_wo" if weights.get("type") == "int" else None


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _read_config(model_id: str, path: Path) -> dict[str, Any]:
    """A config file as a dict whose numbers modperf computes with are inside their ranges
    (modperf.base.limits): checked here, once, so the layer schedule and the geometry can rely on them."""
    fix = "repair the config, or replace it with the config.json the model was published with"
    try:
        size = path.stat().st_size
        if size > limits.MAX_CONFIG_BYTES:
            raise ModelConfigError(f"config of {model_id} is {size:,} bytes: too large to be an HF config",
                                   file=path, values={"limit_bytes": limits.MAX_CONFIG_BYTES}, fix=fix)
        raw = json.loads(path.read_bytes())
    except ModelConfigError:
        raise
    except RecursionError:
        raise ModelConfigError(f"config of {model_id} nests deeper than JSON configs do", file=path,
                               values={"limit_depth": limits.MAX_CONFIG_DEPTH}, fix=fix) from None
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        reason = exc.strerror if isinstance(exc, OSError) else type(exc).__name__
        if isinstance(exc, json.JSONDecodeError):
            reason = f"not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
        raise ModelConfigError(f"cannot read config of {model_id}: {reason}", file=path, fix=fix) from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"config of {model_id} is not a JSON object", file=path, fix="replace the file")
    _check_config(model_id, path, raw, fix)
    return raw


def _check_config(model_id: str, path: Path, raw: dict[str, Any], fix: str) -> None:
    stack: list[tuple[Any, int]] = [(raw, 1)]
    while stack:  # no recursion: the depth limit is what is being checked
        node, depth = stack.pop()
        if depth > limits.MAX_CONFIG_DEPTH:
            raise ModelConfigError(f"config of {model_id} nests deeper than {limits.MAX_CONFIG_DEPTH} levels",
                                   file=path, values={"limit_depth": limits.MAX_CONFIG_DEPTH}, fix=fix)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, int) and not isinstance(node, bool) and node not in limits.INT64:
            raise ModelConfigError(f"config of {model_id} holds an integer outside 64 bits", file=path,
                                   values={"value": node}, fix=fix)
    sections = [raw] + ([raw["text_config"]] if isinstance(raw.get("text_config"), dict) else [])
    for section in sections:
        for name, rng in limits.CONFIG_FIELDS.items():
            if name not in section or (section[name] is None and name in limits.CONFIG_NULLABLE):
                continue
            value = section[name]
            if value not in rng:
                raise ModelConfigError(
                    f"{name} of {model_id} must be an integer in {rng.describe()} ({rng.what})", file=path,
                    values={"field": name, "value": value, "range": [rng.low, rng.high]}, fix=fix)
        for name in limits.CONFIG_LAYER_LISTS:
            value = section.get(name)
            if isinstance(value, (list, str)) and len(value) > limits.MAX_LAYER_LIST:
                raise ModelConfigError(
                    f"{name} of {model_id} lists {len(value):,} layers (at most {limits.MAX_LAYER_LIST:,})",
                    file=path, values={"field": name}, fix=fix)


@dataclass
class ModelRegistry:
    """Model id -> config file, over an ordered list of folders (later folders win)."""

    folders: list[Path]
    _paths: dict[str, Path] = field(default_factory=dict)
    _cache: dict[str, ModelConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for folder in self.folders:
            if not folder.is_dir():
                raise ModelConfigsFolderError(
                    "model-config folder does not exist",
                    file=folder,
                    fix="pass a folder holding org--Name_config.json files",
                )
            try:
                entries = sorted(folder.iterdir())
            except OSError as exc:
                raise ModelConfigsFolderError(
                    f"cannot list the model-config folder: {exc.strerror or exc}", file=folder,
                    fix="make the folder readable, or pass another one") from None
            for entry in entries:
                model_id = model_id_from_filename(entry.name)
                if model_id is not None:
                    self._paths[model_id] = entry

    @classmethod
    def default(cls, extra: Iterable[str | os.PathLike[str]] | None = None) -> ModelRegistry:
        from ..fast.cache_keys import embedded_model_configs

        return cls([Path(f) for f in config_folders(str(embedded_model_configs()), list(extra or []))])

    def ids(self) -> list[str]:
        return sorted(self._paths)

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._paths

    def get(self, model_id: str) -> ModelConfig:
        """The config of ``model_id``. ``ORG/NAME@DTYPE`` (or ``@gemm=DTYPE,moe=DTYPE``) is the same
        model served with its weights in other dtypes than its checkpoint's (a quantized variant
        of one geometry, e.g. ``deepseek-ai/DeepSeek-R1@nvfp4``): :meth:`served`, spelled in the id."""
        cached = self._cache.get(model_id)
        if cached is not None:
            return cached
        if "@" in str(model_id):
            return self._served(str(model_id))
        path = self._paths.get(model_id)
        if path is None and known_name(str(model_id)) is not None:
            return self._known(str(model_id))
        if path is None:
            near = self.nearest(model_id)
            raise UnknownModelError(
                f"no HF config for model {quote(model_id)}",
                values={"model": model_id},
                fix=(
                    (f"did you mean {', '.join(near)}? Otherwise " if near else "")
                    + f"save the model's config.json as {quote(config_filename(model_id))} in a folder and "
                    f"pass it with --model-configs DIR (or set {MODEL_CONFIGS_ENV})"
                ),
            )
        raw = _read_config(model_id, path)
        config = ModelConfig(model_id, path, raw, self._hf_quant(model_id, path))
        self._cache[model_id] = config
        return config

    def _known(self, model_id: str) -> ModelConfig:
        """A name :mod:`modperf.specs.model_names` resolves: its config (served in the checkpoint's
        dtype where the entry says so), saying which and why."""
        target, why = KNOWN_NAMES[model_id]
        base = self.get(target)
        config = ModelConfig(base.model_id, base.path, base.raw, base.hf_quant, base.served,
                             f"{model_id} answered from the bundled config {target} ({why})")
        self._cache[model_id] = config
        return config

    def served(self, model: str | ModelConfig, *, gemm: str | None = None, moe: str | None = None) -> ModelConfig:
        """``model`` served with its dense linear layers in ``gemm`` and its routed experts in
        ``moe`` (None: as ``model`` serves them). A dtype is the deployment's choice, not the
        model's: this is the one form every command gives it -- a query's ``gemm_type`` /
        ``gemm_dtype`` / ``moe_dtype`` field (:func:`modperf.query.resolve.serve`), estimate's dtype
        options, predict's quant modes and the ``ORG/NAME@...`` suffix. The geometry stays the
        checkpoint's; the dtypes derived from the config follow what is served. Dtypes that are
        the checkpoint's give its plain config; others the variant ``ORG/NAME@gemm=..,moe=..``."""
        config = model if isinstance(model, ModelConfig) else self.get(model)
        now, own = config.quantization, config.checkpoint
        want = (now.gemm if gemm is None else str(gemm), now.moe if moe is None else str(moe))
        if want == (own.gemm, own.moe):
            return self.get(config.base_id)
        if want == (now.gemm, now.moe):
            return config
        spec = ",".join(f"{part}={value}" for part, value in zip(("gemm", "moe"), want) if value is not None)
        return self.get(f"{config.base_id}@{spec}")

    def _served(self, model_id: str) -> ModelConfig:
        base_id, _, spec = model_id.partition("@")
        base = self.get(base_id)
        dtypes: dict[str, str] = {}
        for part in spec.split(","):
            key, eq, value = part.partition("=")
            if not eq:
                key, value = "both", key
            key, value = key.strip(), value.strip()
            if key not in ("both", "gemm", "moe") or not value:
                raise UnknownModelError(
                    f"cannot read the served-dtype suffix of {model_id!r}", values={"model": model_id},
                    fix="write ORG/NAME@DTYPE (e.g. @nvfp4) or ORG/NAME@gemm=DTYPE,moe=DTYPE")
            if key == "both":
                dtypes["gemm"] = dtypes["moe"] = value
            else:
                dtypes[key] = value
        own = base.quantization
        served = Quantization(dtypes.get("gemm", own.gemm), dtypes.get("moe", own.moe), f"served as {spec}")
        config = ModelConfig(model_id, base.path, base.raw, base.hf_quant, served, base.resolution)
        self._cache[model_id] = config
        return config

    def nearest(self, model_id: str, count: int = 3) -> list[str]:
        """Known ids a mistyped one probably meant: the same name under an org (``Qwen3-32B``
        -> ``Qwen/Qwen3-32B``), then close spellings of the whole id or the name."""
        wanted = str(model_id).lower()
        by_name = [m for m in self.ids() if m.split("/")[-1].lower() == wanted.split("/")[-1]]
        if by_name:
            return by_name[:count]
        import difflib  # on use: only an unknown model needs suggestions

        close = difflib.get_close_matches(str(model_id), self.ids(), n=count, cutoff=0.75)
        names = {m.split("/")[-1]: m for m in self.ids()}
        close += [names[n] for n in difflib.get_close_matches(str(model_id).split("/")[-1], list(names), n=count,
                                                               cutoff=0.8) if names[n] not in close]
        return close[:count]

    @staticmethod
    def _hf_quant(model_id: str, config_path: Path) -> dict[str, Any] | None:
        companion = config_path.with_name(config_path.name.removesuffix(CONFIG_SUFFIX) + NOT_CONFIGS[0])
        if not companion.is_file():
            return None
        try:
            data = json.loads(companion.read_text())
        except (OSError, ValueError) as exc:
            raise ModelConfigError(f"cannot read the quantization config of {model_id}: {exc}", file=companion,
                                   fix="repair or replace the JSON file") from exc
        return data if isinstance(data, dict) else None
