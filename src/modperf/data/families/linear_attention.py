"""Linear attention kernels of hybrid models: gated DeltaNet (``gdn``: Qwen3.5) and Mamba-2
(``mamba2``: Nemotron-H), each the mixer's convolution and recurrence kernels.

``gdn`` heads are rank-local, like GQA's: ``num_k_heads`` and ``num_v_heads`` are what one rank
runs (the model's linear heads / tp; the collector sweeps tp 1..16 for each model). The local
key completes the computation (the kernels read heads and head dims, not the model hidden), so
the family is local-only; ``model_name`` records whose shapes were swept (some have no shipped
config) and ``d_model`` that model's hidden size: both carried, not keyed. Where the model has a
config, each row's heads must be its linear heads over one integer tp for k and v alike.

``mamba2`` rows are the unsharded mixer (tp 1): ``nheads``, ``n_groups`` and ``d_state`` equal
the model's config on every row. Evidence: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.roofline import GpuSpec, Roof
from .base import (
    NATIVE_VALUE,
    PER_RANK,
    ConfigHeads,
    DuplicateSpread,
    Family,
    NativeSource,
    Quantity,
    RowRule,
    TableSpec,
    Tier,
    register,
)

AXES = ("batch_size", "seq_len")
TOKENS = RowRule("num_tokens == batch_size * seq_len", ("num_tokens", "batch_size", "seq_len"),
                 lambda c, _: c["num_tokens"] == c["batch_size"] * c["seq_len"],
                 "num_tokens is carried as the product of the axes", "store num_tokens = batch_size * seq_len")
SPREAD = DuplicateSpread("one model measures each local shape once; heads stored as the model's (unsharded) count at "
                         "every tp collapse its shards onto one key: store the heads one rank ran (native // tp)",
                         within="model_name")


def _linear_roof(tokens: Any, batch: Any, channels: Any, d_conv: Any, state: Any, rule_flops: Any,
                 gpu: GpuSpec) -> Roof:
    conv_flops = 2.0 * tokens * channels * d_conv
    moved = tokens * channels * 2.0 * 2.0 + batch * state * 4.0 * 2.0  # bf16 in/out, fp32 state read/write
    return Roof(compute=(conv_flops + rule_flops) / gpu.bf16_flops, memory=moved / gpu.mem_bw)


def linear_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """The convolution over the mixer's channels and the recurrence's state: chunked in context
    (compute-bound), one step in decode (bound by reading and writing the fp32 state)."""
    batch, seq = 1.0 * cols["batch_size"], 1.0 * cols["seq_len"]
    tokens = batch * seq
    if table == "mamba2":
        channels = 1.0 * cols["nheads"] * cols["head_dim"] + 2.0 * cols["n_groups"] * cols["d_state"]
        state = 1.0 * cols["nheads"] * cols["head_dim"] * cols["d_state"]
        rule = 2.0 * tokens * state
    else:
        k_width = 1.0 * cols["num_k_heads"] * cols["head_k_dim"]
        channels = 2.0 * k_width + cols["num_v_heads"] * cols["head_v_dim"]
        state = 1.0 * cols["num_v_heads"] * cols["head_k_dim"] * cols["head_v_dim"]
        rule = 4.0 * tokens * state
    return _linear_roof(tokens, batch, channels, cols["d_conv"], state, rule, gpu)


def local_heads_spec(name: str, fields: tuple[tuple[str, str], ...]) -> TableSpec:
    """The gdn / kda layout: local k and v heads keyed, the model's name and hidden carried."""
    return TableSpec(
        name, "kernel", ("op_name", "kernel_source", "phase"),
        ("num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim", "d_conv"), AXES, "seq_len",
        head_axis=False, carried=("num_tokens", "d_model", "model_name"),
        quantities=(Quantity("num_k_heads", PER_RANK, "key heads one rank runs", beside="the model's: times tp"),
                    Quantity("num_v_heads", PER_RANK, "value heads one rank runs", beside="the model's: times tp"),
                    Quantity("batch_size", PER_RANK, "sequences on the rank"),
                    Quantity("seq_len", PER_RANK, "new tokens per sequence (draft tokens in verify rows)")),
        guards=(TOKENS, ConfigHeads("model_name", fields, PER_RANK,
                                    "store the heads one rank runs: the model's linear heads divided by tp, the same "
                                    "tp for key and value heads"), SPREAD))


LINEAR_ATTENTION = register(
    Family(
        name="linear_attention",
        title="linear attention (gated DeltaNet, Mamba-2)",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            local_heads_spec("gdn", (("num_k_heads", "linear_num_key_heads"),
                                     ("num_v_heads", "linear_num_value_heads"))),
            TableSpec(
                "mamba2", "kernel", ("op_name", "kernel_source", "phase"),
                ("d_state", "d_conv", "nheads", "head_dim", "n_groups", "chunk_size"), AXES, "seq_len",
                head_axis=False, carried=("num_tokens", "d_model", "model_name"),
                quantities=(Quantity("nheads", NATIVE_VALUE, "the model's Mamba heads (the unsharded mixer)"),
                            Quantity("n_groups", NATIVE_VALUE, "the model's B/C groups"),
                            Quantity("d_state", NATIVE_VALUE, "the model's state size")),
                guards=(TOKENS, ConfigHeads("model_name", (("nheads", "mamba_num_heads"), ("n_groups", "n_groups"),
                                                           ("d_state", "ssm_state_size")), NATIVE_VALUE,
                                            "mamba2 rows measure the unsharded mixer (tp 1): store the model's "
                                            "mamba_num_heads, n_groups and ssm_state_size"), SPREAD),
            ),
        ),
        rationale="the kernels read heads, head dims, the convolution width and the state size: the local key "
                  "completes the computation",
        model_head_axis=False,
        roof=linear_roof,
    )
)
