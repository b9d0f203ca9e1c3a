"""Names users type for models whose config is bundled under another name.

A name here is the same model as the config it resolves to: the same ``config.json`` geometry
(heads, kv heads, head_dim, layers, widths, experts), published under a name the corpus's
``model_configs/`` does not use. Three kinds of entry, each with its source:

* a repository Hugging Face renamed (``meta-llama/Meta-Llama-3.1-70B`` is served today as
  ``meta-llama/Llama-3.1-70B``, the name in the corpus's own ``silicon_sample.csv``);
* a fine-tune that keeps its base's ``config.json`` but for generation fields (``-Instruct``);
* a re-quantized checkpoint of the same geometry (NVIDIA's ModelOpt ``-FP8`` / ``-NVFP4``
  releases): the base config served in that dtype, ``ORG/NAME@DTYPE``
  (:meth:`modperf.specs.models.ModelRegistry.get`), so its dtypes are the checkpoint's and a
  deployment's own still win.

The corpus bundles such pairs itself, and they differ only in those fields:
``nvidia/Llama-3.1-70B-Instruct-FP8`` and ``meta-llama/Meta-Llama-3.1-70B`` (eos ids and the
hf_quant_config's FP8), ``nvidia/Qwen3-235B-A22B-NVFP4`` and ``Qwen/Qwen3-235B-A22B``,
``zai-org/GLM-5-FP8`` and ``zai-org/GLM-5`` (tests/test_model_names.py compares them).

Nothing here maps a model to another geometry: a distilled, pruned or resized model (a
``-Distill``, a Nemotron derivative) is another model and needs its own config. A config file
under the typed name (a user's ``--model-configs`` folder) always wins over this table.
"""

from __future__ import annotations

_LLAMA_RENAME = ("Hugging Face renamed the Llama 3.1 repositories meta-llama/Meta-Llama-3.1-* to "
                 "meta-llama/Llama-3.1-*")
_INSTRUCT = "the -Instruct fine-tune keeps its base's config.json (only eos_token_id differs)"
_MODELOPT_FP8 = ("NVIDIA's ModelOpt FP8 checkpoint (hf_quant_config quant_algo FP8, as the bundled "
                 "nvidia/Llama-3.1-70B-Instruct-FP8) of that geometry")
_MODELOPT_NVFP4 = ("NVIDIA's ModelOpt NVFP4 checkpoint (hf_quant_config quant_algo NVFP4, as the bundled "
                   "nvidia/*-NVFP4 configs) of that geometry")

#: Name a user types -> (the bundled config it is, with ``@DTYPE`` where the checkpoint's weights
#: are stored in another dtype than the config's; why they are the same model).
KNOWN_NAMES: dict[str, tuple[str, str]] = {
    # renamed repositories (Hugging Face, July 2024 onwards: the model cards link the old names)
    "meta-llama/Llama-3.1-8B": ("meta-llama/Meta-Llama-3.1-8B", _LLAMA_RENAME),
    "meta-llama/Llama-3.1-70B": ("meta-llama/Meta-Llama-3.1-70B", _LLAMA_RENAME),
    "meta-llama/Llama-3.1-405B": ("meta-llama/Meta-Llama-3.1-405B", _LLAMA_RENAME),
    # instruction-tuned releases of the same weights' shapes, under the old and the new name
    "meta-llama/Llama-3.1-8B-Instruct": ("meta-llama/Meta-Llama-3.1-8B", f"{_LLAMA_RENAME}; {_INSTRUCT}"),
    "meta-llama/Llama-3.1-70B-Instruct": ("meta-llama/Meta-Llama-3.1-70B", f"{_LLAMA_RENAME}; {_INSTRUCT}"),
    "meta-llama/Llama-3.1-405B-Instruct": ("meta-llama/Meta-Llama-3.1-405B", f"{_LLAMA_RENAME}; {_INSTRUCT}"),
    "meta-llama/Meta-Llama-3.1-8B-Instruct": ("meta-llama/Meta-Llama-3.1-8B", _INSTRUCT),
    "meta-llama/Meta-Llama-3.1-70B-Instruct": ("meta-llama/Meta-Llama-3.1-70B", _INSTRUCT),
    "meta-llama/Meta-Llama-3.1-405B-Instruct": ("meta-llama/Meta-Llama-3.1-405B", _INSTRUCT),
    # re-quantized checkpoints (the corpus's silicon_sample.csv names the first three)
    "nvidia/Llama-3.1-8B-Instruct-FP8": ("meta-llama/Meta-Llama-3.1-8B@fp8", f"{_INSTRUCT}; {_MODELOPT_FP8}"),
    "nvidia/DeepSeek-R1-NVFP4": ("deepseek-ai/DeepSeek-R1@nvfp4", _MODELOPT_NVFP4),
    "nvidia/DeepSeek-R1-FP4": ("deepseek-ai/DeepSeek-R1@nvfp4", _MODELOPT_NVFP4 + " (its Hugging Face name)"),
    "nvidia/Qwen3-32B-NVFP4": ("Qwen/Qwen3-32B@nvfp4", _MODELOPT_NVFP4),
    # one publisher, two hubs: Zhipu AI publishes GLM as zai-org on Hugging Face (formerly THUDM)
    # and as ZhipuAI on ModelScope (the corpus's silicon_sample.csv writes zhipuai/GLM-5)
    "zhipuai/GLM-5": ("zai-org/GLM-5", "Zhipu AI's GLM-5: zhipuai (ModelScope) and zai-org (Hugging Face) are one "
                      "publisher"),
    "ZhipuAI/GLM-5": ("zai-org/GLM-5", "Zhipu AI's GLM-5: ZhipuAI (ModelScope) and zai-org (Hugging Face) are one "
                      "publisher"),
}


def known_name(model_id: str) -> tuple[str, str] | None:
    """``(config id, why)`` for a name in :data:`KNOWN_NAMES`, else None."""
    return KNOWN_NAMES.get(model_id)


__all__ = ["KNOWN_NAMES", "known_name"]
