"""Names users type (modperf.specs.model_names): every model of silicon_sample.csv resolves, each entry
names a bundled config of the same geometry, and an answer says which config it came from."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from modperf import errors as E
from modperf.fast.cache_keys import embedded_systems_dir
from modperf.specs.model_names import KNOWN_NAMES
from modperf.specs.models import ModelRegistry

#: config.json fields that are not geometry: what a fine-tune or a re-quantized checkpoint changes.
NOT_GEOMETRY = {"_name_or_path", "eos_token_id", "bos_token_id", "transformers_version", "quantization_config",
                "torch_dtype", "architectures_note"}


def _geometry(raw: dict) -> dict:
    return {k: v for k, v in raw.items() if k not in NOT_GEOMETRY}


def test_every_model_of_the_silicon_sample_resolves(models: ModelRegistry) -> None:
    with open(embedded_systems_dir() / "silicon_sample.csv", newline="") as f:
        names = sorted({row["model_path"] for row in csv.DictReader(f)})
    assert len(names) == 15
    resolved = {}
    for name in names:
        try:
            config = models.get(name)
        except E.ModperfError as exc:  # a name that does not resolve must say why
            pytest.fail(f"{name} refused: {exc}")
        resolved[name] = config.model_id
        assert (config.resolution is None) == (name in models), name
    assert {n: resolved[n] for n in names if n not in models} == {
        "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
        "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
        "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1@nvfp4",
        "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B@fp8",
        "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B@nvfp4",
        "zhipuai/GLM-5": "zai-org/GLM-5",
    }
    r1 = models.get("nvidia/DeepSeek-R1-NVFP4")
    assert (r1.quantization.gemm, r1.quantization.moe, r1.native_heads) == ("nvfp4", "nvfp4", 128)
    llama = models.get("nvidia/Llama-3.1-8B-Instruct-FP8")
    assert (llama.quantization.gemm, llama.native_heads, llama.kv_heads) == ("fp8", 32, 8)


def test_every_entry_names_a_bundled_config_and_says_why(models: ModelRegistry) -> None:
    for name, (target, why) in KNOWN_NAMES.items():
        assert name not in models, f"{name} is bundled under its own name: the entry would never be read"
        assert target.partition("@")[0] in models, f"{name} -> {target}: no such bundled config"
        assert len(why) > 20
        config = models.get(name)
        assert config.resolution == f"{name} answered from the bundled config {target} ({why})"


@pytest.mark.parametrize(("variant", "base"), [
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "meta-llama/Meta-Llama-3.1-70B"),  # -Instruct and ModelOpt FP8
    ("nvidia/Qwen3-235B-A22B-NVFP4", "Qwen/Qwen3-235B-A22B"),  # ModelOpt NVFP4
    ("Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-32B"),  # a block-fp8 checkpoint
    ("zai-org/GLM-5-FP8", "zai-org/GLM-5"),
])
def test_the_bundled_pairs_show_each_rule(models: ModelRegistry, variant: str, base: str) -> None:
    """The corpus bundles variants beside their bases: they differ in no geometry field (only in
    eos ids, paths and the quantization), the evidence the table's rules stand on."""
    assert _geometry(models.get(variant).raw) == _geometry(models.get(base).raw)
    assert models.get(variant).native_heads == models.get(base).native_heads


def test_a_config_under_the_typed_name_wins(tmp_path: Path) -> None:
    own = json.loads((Path(ModelRegistry.default().get("meta-llama/Meta-Llama-3.1-8B").path)).read_text())
    own["num_attention_heads"] = 64  # the user's own model of that name, whatever it is
    (tmp_path / "meta-llama--Llama-3.1-70B_config.json").write_text(json.dumps(own))
    config = ModelRegistry.default([tmp_path]).get("meta-llama/Llama-3.1-70B")
    assert (config.model_id, config.native_heads, config.resolution) == ("meta-llama/Llama-3.1-70B", 64, None)


def test_a_served_suffix_on_a_known_name_keeps_its_resolution(models: ModelRegistry) -> None:
    config = models.get("meta-llama/Llama-3.1-70B@fp8")
    assert config.quantization.gemm == "fp8" and config.native_heads == 64
    assert config.resolution is not None and "meta-llama/Meta-Llama-3.1-70B" in config.resolution


def test_a_query_and_an_estimate_say_which_config_answered(db) -> None:
    from modperf.model.estimate import estimate

    asked = dict(table="context_attention", system="h200_sxm", backend="trtllm", version="1.3.0rc20", tp_size=8,
                 batch_size=1, isl=1024)
    renamed = db.query(**asked, model="meta-llama/Llama-3.1-70B")
    bundled = db.query(**asked, model="meta-llama/Meta-Llama-3.1-70B")
    assert renamed.latency_ms == bundled.latency_ms
    assert renamed.notes[0].startswith("meta-llama/Llama-3.1-70B answered from the bundled config "
                                       "meta-llama/Meta-Llama-3.1-70B")
    est = estimate(db, model="meta-llama/Llama-3.1-8B-Instruct", system="h200_sxm", backend="trtllm", tps=[2],
                   isl=1024, osl=128, batch=4)
    base = estimate(db, model="meta-llama/Meta-Llama-3.1-8B", system="h200_sxm", backend="trtllm", tps=[2],
                    isl=1024, osl=128, batch=4)
    assert est.tps[0].prefill_ms == base.tps[0].prefill_ms is not None
    assert est.notes[0].startswith("meta-llama/Llama-3.1-8B-Instruct answered from the bundled config "
                                   "meta-llama/Meta-Llama-3.1-8B (Hugging Face renamed")
