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

from . import limits
from .errors import ModelConfigError, ModelConfigsFolderError, UnknownModelError, quote

MODEL_CONFIGS_ENV = "MODPERF_MODEL_CONFIGS"
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
    model_id: str
    path: Path
    raw: dict[str, Any]

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

    def geometry(self, fields: Sequence[ConfigField]) -> tuple[tuple[str, Any], ...]:
        """(field, value) pairs for the fields a module reads, plus the native count."""
        values: list[tuple[str, Any]] = [("num_attention_heads", self.native_heads)]
        for f in fields:
            value = self.get(f.name, f.default)
            values.append((f.name, _hashable(value)))
        return tuple(values)


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _read_config(model_id: str, path: Path) -> dict[str, Any]:
    """A config file as a dict whose numbers modperf computes with are inside their ranges
    (modperf.limits): checked here, once, so the layer schedule and the geometry can rely on them."""
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
        from .catalog import embedded_model_configs

        folders: list[Path] = [embedded_model_configs()]
        env = os.environ.get(MODEL_CONFIGS_ENV)
        if env:
            folders += [Path(p).expanduser() for p in env.split(os.pathsep) if p]
        folders += [Path(p).expanduser() for p in (extra or [])]
        return cls(folders)

    def ids(self) -> list[str]:
        return sorted(self._paths)

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._paths

    def get(self, model_id: str) -> ModelConfig:
        cached = self._cache.get(model_id)
        if cached is not None:
            return cached
        path = self._paths.get(model_id)
        if path is None:
            raise UnknownModelError(
                f"no HF config for model {quote(model_id)}",
                values={"model": model_id},
                fix=(
                    f"save the model's config.json as {quote(config_filename(model_id))} in a folder and "
                    f"pass it with --model-configs DIR (or set {MODEL_CONFIGS_ENV})"
                ),
            )
        raw = _read_config(model_id, path)
        config = ModelConfig(model_id, path, raw)
        self._cache[model_id] = config
        return config
