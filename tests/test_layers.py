import pytest

from modperf import errors as E
from modperf.specs.layers import layer_schedule
from modperf.specs.models import ModelRegistry


def groups(models: ModelRegistry, model_id: str) -> list[tuple[str, int]]:
    return [(layer.label, n) for layer, n in layer_schedule(models.get(model_id)).groups()]


@pytest.mark.parametrize(("model", "expected"), [
    ("deepseek-ai/DeepSeek-V3", [("MLA", 61)]),
    ("moonshotai/Kimi-K3", [("KDA linear attention", 69), ("MLA", 24)]),
    ("deepseek-ai/DeepSeek-V3.2", [("DSA indexer", 61)]),
    ("zai-org/GLM-5", [("DSA indexer", 78)]),
    ("zai-org/GLM-5.2", [("DSA indexer", 21), ("DSA shared indexer", 57)]),
    ("deepseek-ai/DeepSeek-V4-Flash", [("DSV4 ratio 0 (sliding window only)", 2), ("DSV4 CSA (ratio 4)", 21),
                                       ("DSV4 HCA (ratio 128)", 20)]),
    ("deepseek-ai/DeepSeek-V4-Pro", [("DSV4 HCA (ratio 128)", 31), ("DSV4 CSA (ratio 4)", 30)]),
    ("MiniMaxAI/MiniMax-M3", [("GQA dense (MSA model)", 3), ("MSA sparse", 57)]),
    ("meta-llama/Meta-Llama-3.1-70B", [("GQA full", 80)]),
    ("openai/gpt-oss-20b", [("GQA sliding(128)", 12), ("GQA full", 12)]),
    ("google/gemma-4-26B-A4B", [("GQA sliding(1024)", 25), ("GQA full", 5)]),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", [("GQA chunked(8192)", 36), ("GQA full", 12)]),
    ("Qwen/Qwen3.5-27B", [("linear attention", 48), ("GQA full", 16)]),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", [("Mamba", 23), ("GQA full", 6)]),
    ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", [("Mamba", 48), ("GQA full", 12)]),
    ("Qwen/Qwen3-32B", [("GQA full", 64)]),
])
def test_layer_schedules_from_real_configs(models, model, expected):
    assert groups(models, model) == expected


def test_fields_each_layer_fixes(models):
    glm52 = layer_schedule(models.get("zai-org/GLM-5.2"))
    shared = next(layer for layer, _ in glm52.groups() if layer.label == "DSA shared indexer")
    assert shared.fields_for("context") == {"op_name": "dsa_context_module_skip_indexer"}
    assert shared.fields_for("generation") == {"op_name": "dsa_generation_module_skip_indexer"}
    gemma = dict((layer.label, layer) for layer, _ in layer_schedule(models.get("google/gemma-4-26B-A4B")).groups())
    # gemma's global layers use their own kv heads and head_dim
    assert gemma["GQA full"].fields_for("context") == {"num_key_value_heads": 2, "head_dim": 512, "window_size": 0}
    assert gemma["GQA sliding(1024)"].fields_for("context") == {"num_key_value_heads": 8, "head_dim": 256,
                                                                "window_size": 1024}
    flash = layer_schedule(models.get("deepseek-ai/DeepSeek-V4-Flash"))
    assert [layer.fields_for("context") for layer, _ in flash.groups()] == [{}, {"compress_ratio": 4},
                                                                            {"compress_ratio": 128}]
    assert not flash.layers[0].covered and flash.layers[2].context_table == "dsv4_csa_context_module"


def test_config_without_layer_count(tmp_path):
    (tmp_path / "acme--Tiny_config.json").write_text('{"num_attention_heads": 8}')
    with pytest.raises(E.ModelConfigError, match="has no positive num_hidden_layers"):
        layer_schedule(ModelRegistry([tmp_path]).get("acme/Tiny"))


def test_ffn_schedules_from_configs(models) -> None:
    from modperf.specs.layers import ffn_groups

    def groups(model: str) -> list[tuple[str, int]]:
        return [(f.label, n) for f, n in ffn_groups(models.get(model))]

    # DeepSeek: first_k_dense_replace 3 dense layers, then routed experts + one shared expert
    assert groups("deepseek-ai/DeepSeek-V3") == [("dense MLP (18432)", 3), ("MoE 256x2048 top-8 + shared 2048", 58)]
    assert groups("Qwen/Qwen3-235B-A22B-FP8") == [("MoE 128x1536 top-8", 94)]
    assert groups("Qwen/Qwen3-32B") == [("dense MLP (25600)", 64)]
    assert groups("Qwen/Qwen3.5-397B-A17B") == [("MoE 512x1024 top-10 + shared 1024", 60)]
    assert groups("openai/gpt-oss-120b") == [("MoE 128x2880 top-4", 36)]
    # a per-layer moe_layer_freq list (MiniMax-M3), Llama-4's interleave step
    assert groups("MiniMaxAI/MiniMax-M3") == [("dense MLP (3072)", 3), ("MoE 128x3072 top-4 + shared 3072", 57)]
    assert groups("meta-llama/Llama-4-Maverick-17B-128E-Instruct") == [("dense MLP (16384)", 24),
                                                                         ("MoE 128x8192 top-1", 24)]
    # latent MoE: the experts read the latent width, not the model's hidden size
    (nemotron, _), = ffn_groups(models.get("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"))
    assert (nemotron.hidden, nemotron.experts, nemotron.topk) == (1024, 512, 22)
