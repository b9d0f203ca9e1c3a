import json
from pathlib import Path

import pytest

from modperf import errors as E
from modperf.data.families import registry
from modperf.specs.models import ModelRegistry, config_filename, model_id_from_filename

DSA = registry()["dsa"]
MLA = registry()["mla_module"]
DSV4 = registry()["dsv4"]


def test_model_ids_from_file_names():
    assert model_id_from_filename("deepseek-ai--DeepSeek-V3_config.json") == "deepseek-ai/DeepSeek-V3"
    assert model_id_from_filename("nvidia--GLM-5-NVFP4_hf_quant_config.json") is None
    assert config_filename("moonshotai/Kimi-K3") == "moonshotai--Kimi-K3_config.json"


def test_embedded_configs(models: ModelRegistry):
    assert len(models.ids()) == 89  # 117 files, 28 of them hf_quant companions
    assert models.get("deepseek-ai/DeepSeek-V3").native_heads == 128
    assert models.get("zai-org/GLM-5").native_heads == 64
    assert models.get("MiniMaxAI/MiniMax-M3").native_heads == 64
    assert models.get("sgl-project/DeepSeek-V4-Flash-FP8").native_heads == 64


def test_text_config_nesting(models: ModelRegistry):
    kimi = models.get("moonshotai/Kimi-K3")
    assert "num_attention_heads" not in kimi.raw  # the wrapper has no heads...
    assert kimi.native_heads == 96  # ...the language model does
    assert kimi.get("kv_lora_rank") == 512
    assert kimi.architectures == ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")
    assert models.get("nvidia/MiniMax-M3-NVFP4").native_heads == 64
    assert models.get("Qwen/Qwen3-VL-8B-Instruct").kv_heads == 8


def test_unknown_model_says_how_to_add_it(models: ModelRegistry):
    with pytest.raises(E.UnknownModelError) as info:
        models.get("acme/Llama-9-1T")
    msg = str(info.value)
    assert "no HF config for model 'acme/Llama-9-1T'" in msg
    assert "acme--Llama-9-1T_config.json" in msg and "--model-configs DIR" in msg
    assert "MODPERF_MODEL_CONFIGS" in msg


def test_user_folder_adds_and_overrides(tmp_path: Path, monkeypatch):
    cfg = json.loads((ModelRegistry.default().get("deepseek-ai/DeepSeek-V3").path).read_text())
    cfg["num_attention_heads"] = 64
    (tmp_path / "acme--Half-V3_config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("MODPERF_MODEL_CONFIGS", str(tmp_path))
    reg = ModelRegistry.default()
    assert reg.get("acme/Half-V3").native_heads == 64


def test_bad_configs_are_typed(tmp_path: Path):
    (tmp_path / "acme--Broken_config.json").write_text("{not json")
    (tmp_path / "acme--NoHeads_config.json").write_text('{"hidden_size": 1}')
    reg = ModelRegistry([tmp_path])
    with pytest.raises(E.ModelConfigError, match="cannot read config of acme/Broken"):
        reg.get("acme/Broken")
    with pytest.raises(E.ModelConfigError, match="config of acme/NoHeads has no field 'num_attention_heads'"):
        reg.get("acme/NoHeads").native_heads
    # a folder the user names that is not there is a usage error (exit 2), not bad data
    with pytest.raises(E.ModelConfigsFolderError, match="model-config folder does not exist") as info:
        ModelRegistry([tmp_path / "missing"])
    assert info.value.exit_code == 2


def test_glm5_and_glm52_are_aliases_for_the_dsa_module(models: ModelRegistry):
    """The hard case: GLM-5 and GLM-5.2 differ in head_dim (64 vs 192), indexer schedule and
    rope theta, but not in anything the DSA module computes with. head_dim is a label MLA-style
    modules never read (q/k widths are qk_nope + qk_rope = 256, v is v_head_dim = 256); which
    layers skip the indexer is recorded per row as op_name."""
    glm5, glm52 = models.get("zai-org/GLM-5"), models.get("zai-org/GLM-5.2")
    assert (glm5.get("head_dim"), glm52.get("head_dim")) == (64, 192)
    assert glm5.get("rope_parameters") != glm52.get("rope_parameters")
    assert glm52.get("index_topk_freq") == 4 and glm5.get("index_topk_freq", None) is None
    assert glm5.geometry(DSA.geometry) == glm52.geometry(DSA.geometry)
    assert glm5.geometry(MLA.geometry) == glm52.geometry(MLA.geometry)
    assert "head_dim" not in dict(glm5.geometry(DSA.geometry))


def test_geometry_splits_what_the_module_reads(models: ModelRegistry):
    flash, pro = models.get("deepseek-ai/DeepSeek-V4-Flash"), models.get("deepseek-ai/DeepSeek-V4-Pro")
    differ = {k for (k, v), (_, w) in zip(flash.geometry(DSV4.geometry), pro.geometry(DSV4.geometry)) if v != w}
    assert differ == {"num_attention_heads", "hidden_size", "q_lora_rank", "o_groups", "index_topk"}
    # sgl-project's FP8 checkpoint is the same module as deepseek-ai's Flash
    assert models.get("sgl-project/DeepSeek-V4-Flash-FP8").geometry(DSV4.geometry) == flash.geometry(DSV4.geometry)
    # Kimi-K3 gates its attention output: a field the MLA module reads
    kimi, v3 = dict(models.get("moonshotai/Kimi-K3").geometry(MLA.geometry)), dict(
        models.get("deepseek-ai/DeepSeek-V3").geometry(MLA.geometry))
    assert (kimi["mla_use_output_gate"], v3["mla_use_output_gate"]) == (True, False)
    # DeepSeek-V3 and R1 and the NVFP4 V3.1 checkpoint: one MLA geometry
    assert models.get("deepseek-ai/DeepSeek-R1").geometry(MLA.geometry) == tuple(v3.items())
    assert models.get("nvidia/DeepSeek-V3.1-NVFP4").geometry(MLA.geometry) == tuple(v3.items())


def test_missing_geometry_field_is_an_error(models: ModelRegistry):
    with pytest.raises(E.ModelConfigError, match="config of moonshotai/Kimi-K2-Instruct has no field 'index_n_heads'"):
        models.get("moonshotai/Kimi-K2-Instruct").geometry(DSA.geometry)


# --- every config value modperf computes with is checked when the config is read ---------------


def _variant(fixture_dir: Path, tmp_path: Path, model: str, **changes) -> ModelRegistry:
    raw = json.loads((fixture_dir / "deepseek-ai--DeepSeek-V3_config.json").read_text())
    (tmp_path / config_filename(model)).write_text(json.dumps({**raw, **changes}))
    return ModelRegistry([tmp_path])


@pytest.mark.parametrize("field, value, message", [
    ("num_attention_heads", 10**9, "num_attention_heads of acme/X must be an integer in 1..65,536 (attention heads)"),
    ("num_attention_heads", True, "num_attention_heads of acme/X must be an integer in 1..65,536"),
    ("num_attention_heads", "128", "num_attention_heads of acme/X must be an integer in 1..65,536"),
    ("num_hidden_layers", 10**7, "num_hidden_layers of acme/X must be an integer in 1..4,096 (layers)"),
    ("num_key_value_heads", 0, "num_key_value_heads of acme/X must be an integer in 1..65,536"),
    ("hidden_size", 2**70, "config of acme/X holds an integer outside 64 bits"),
    ("hidden_size", None, "hidden_size of acme/X must be an integer in 1..1,048,576"),
    ("num_hidden_layers", 12.0, "num_hidden_layers of acme/X must be an integer in 1..4,096"),
    ("sliding_window", -1, "sliding_window of acme/X must be an integer in 0..4,194,304"),
    ("compress_ratios", [4] * 9000, "compress_ratios of acme/X lists 9,000 layers (at most 8,192)"),
])
def test_config_values_out_of_range(fixtures: Path, tmp_path: Path, field, value, message):
    reg = _variant(fixtures / "09_hf_configs", tmp_path, "acme/X", **{field: value})
    with pytest.raises(E.ModelConfigError) as info:
        reg.get("acme/X")
    assert message in str(info.value) and info.value.exit_code == 1
    if "must be an integer in" in message:
        assert info.value.values["field"] == field


def test_configs_that_are_not_configs(tmp_path: Path):
    (tmp_path / "acme--Deep_config.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "acme--Nested_config.json").write_text('{"a": ' + "[" * 40 + "]" * 40 + "}")
    (tmp_path / "acme--Binary_config.json").write_bytes(b"\xff\xfe\x00")
    with open(tmp_path / "acme--Huge_config.json", "wb") as f:
        f.truncate(17 * 2**20)
    reg = ModelRegistry([tmp_path])
    for model, message in (("acme/Deep", "config of acme/Deep nests deeper than JSON configs do"),
                           ("acme/Nested", "config of acme/Nested nests deeper than 32 levels"),
                           ("acme/Binary", "cannot read config of acme/Binary: UnicodeDecodeError"),
                           ("acme/Huge", "config of acme/Huge is 17,825,792 bytes: too large to be an HF config")):
        with pytest.raises(E.ModelConfigError, match=message):
            reg.get(model)


def test_a_model_configs_path_that_is_a_file_is_a_usage_error(tmp_path: Path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(E.ModelConfigsFolderError) as info:
        ModelRegistry([tmp_path / "a.txt"])
    assert info.value.exit_code == 2


def test_every_config_in_the_corpus_and_fixtures_is_inside_the_ranges(fixtures: Path):
    reg = ModelRegistry.default([fixtures / "09_hf_configs"])
    assert len(reg.ids()) == 89
    for model in reg.ids():
        reg.get(model)  # raises for a value out of range


def test_per_layer_lists_shorter_than_the_layers(fixtures: Path, tmp_path: Path):
    from modperf.specs.layers import layer_schedule

    raw = json.loads((fixtures / "09_hf_configs" / "MiniMaxAI--MiniMax-M3_config.json").read_text())
    text = raw.get("text_config", raw)
    text["sparse_attention_config"]["sparse_attention_freq"] = [1, 0]
    (tmp_path / "acme--Short_config.json").write_text(json.dumps(raw))
    with pytest.raises(E.ModelConfigError, match=r"sparse_attention_freq of acme/Short must list one value per layer"):
        layer_schedule(ModelRegistry([tmp_path]).get("acme/Short"))
