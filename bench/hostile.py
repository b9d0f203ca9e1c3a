"""Hostile-input campaign: every command fed what a careless or hostile user would give it.

Each case runs the real CLI in its own process (with a timeout) and is judged on what a user
sees: the exit code is a documented one (0 ok, 1 data, 2 usage; 3 is an internal error, a bug),
the command finishes, ``--json`` output is strict JSON (no NaN), no traceback and no raw control
character reaches the terminal, the output stays small when the input is huge, and no file of
the input is quoted into a message. The table lists every case that broke a rule; the summary
counts cases, exit codes and failures.

    python bench/hostile.py                 # the whole campaign (about 2 minutes on 2 cores)
    python bench/hostile.py --only query    # cases whose name contains "query"
    python bench/hostile.py --json          # one JSON object per case

Cases that need a file to be unreadable run without CAP_DAC_OVERRIDE (``setpriv``) when run
as root, so the permission bits apply.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"
MLA = "07_latent_collision/wheel/gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet"
CSA = "01_dsv4_stale_vs_migrated/migrated_93dfd1fd2/b200_sxm/sparse_attention/sglang/0.5.10/" \
      "dsv4_csa_context_module_perf.parquet"
STALE = "01_dsv4_stale_vs_migrated/stale_parent_eed87c1c9"
LEGACY = "03_legacy_no_num_heads/aiconfigurator-0.1.0_h200_sxm_trtllm_0.20.0"
SLOT = ["mla_context_module", "--system", "gb300", "--backend", "vllm", "--version", "0.27.0"]
KEY = ["--kernel-source", "FLASH_ATTN", "--mla-dtype", "bfloat16", "--kv-cache-dtype", "bfloat16",
       "--gemm-type", "bfloat16"]
LINE = {"table": "mla_context_module", "system": "gb300", "backend": "vllm", "version": "0.27.0",
        "kernel_source": "FLASH_ATTN", "mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16",
        "gemm_type": "bfloat16", "batch_size": 4, "isl": 2048, "model": "moonshotai/Kimi-K3", "tp_size": 3}
KIMI = ["estimate", "--model", "moonshotai/Kimi-K3", "--system", "gb300", "--backend", "vllm", "--isl", "1024",
        "--osl", "64", "--batch", "2"]
PASSWD_MARK = "root:x:0:0"
ESC = "\x1b"
MAX_OUTPUT = 200_000


@dataclass
class Case:
    name: str
    argv: list[str]
    expect: tuple[int, ...]  # exit codes that are right for this case
    json: bool = False
    unprivileged: bool = False
    stdin: bytes | None = None
    timeout: float = 30.0
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    case: Case
    code: int | None
    seconds: float
    problems: list[str] = field(default_factory=list)


def _strict_json(text: str) -> None:
    def bad(name: str) -> None:
        raise ValueError(f"{name} in JSON output")
    for line in text.splitlines() if text.lstrip().startswith("{\"") and "\n{" in text else [text]:
        if line.strip():
            json.loads(line, parse_constant=bad)


def _table(path: Path) -> pa.Table:
    return pq.read_table(path)


def _with(table: pa.Table, name: str, values: list) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, type=table.schema.field(name).type))


def _layout(root: Path, table: pa.Table, name: str = "mla_context_module",
            where: str = "gb300/mla/vllm/0.27.0") -> Path:
    folder = root / where
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / f"{name}_perf.parquet")
    return root


def _config(folder: Path, model: str, **changes) -> None:
    base = json.loads((FIXTURES / "09_hf_configs" / "deepseek-ai--DeepSeek-V3_config.json").read_text())
    base.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / (model.replace("/", "--") + "_config.json")).write_text(json.dumps(base))


def build(tmp: Path) -> dict[str, Path]:
    """Every hostile input, under ``tmp``. Returns named paths."""
    p: dict[str, Path] = {}
    mla = _table(FIXTURES / MLA)
    heads = mla.column("num_heads").to_pylist()
    p["good"] = _layout(tmp / "good", mla)
    p["empty"] = _layout(tmp / "empty", mla.slice(0, 0))
    dup = pa.Table.from_arrays([*mla.columns, mla.column("batch_size")], names=[*mla.column_names, "batch_size"])
    p["dup"] = _layout(tmp / "dup", dup)
    p["heads62"] = _layout(tmp / "heads62", _with(mla, "num_heads", [2**62] + heads[1:]))
    csa = _table(FIXTURES / CSA)
    tps, hs = csa.column("tp_size").to_pylist(), csa.column("num_heads").to_pylist()
    row = next(i for i, t in enumerate(tps) if t == 4)
    hs[row] = 2**62 + 32  # times 4 wraps to 128 in int64
    p["wrap"] = _layout(tmp / "wrap", _with(csa, "num_heads", hs), "dsv4_csa_context_module",
                        "b200_sxm/sparse_attention/sglang/0.5.10")
    p["negative"] = _layout(tmp / "negative", _with(mla, "batch_size", [-1] + mla.column("batch_size").to_pylist()[1:]))
    nan_heads = pa.array([float("nan")] + [float(h) for h in heads[1:]])
    p["nan_heads"] = _layout(tmp / "nan_heads", mla.set_column(mla.column_names.index("num_heads"), "num_heads",
                                                               nan_heads))
    models = mla.column("model").to_pylist()
    p["esc_model"] = _layout(tmp / "esc_model", _with(mla, "model", [f"{ESC}[2Jevil"] + models[1:]))
    p["huge_model"] = _layout(tmp / "huge_model", _with(mla, "model", ["m" * 1_000_000] + models[1:]))
    big = pa.array([2**64 - 1] + [int(h) for h in heads[1:]], type=pa.uint64())
    p["uint64_heads"] = _layout(tmp / "uint64_heads", mla.set_column(mla.column_names.index("num_heads"), "num_heads",
                                                                     big))
    listy = pa.array([[h] for h in heads], type=pa.list_(pa.int64()))
    p["list_heads"] = _layout(tmp / "list_heads", mla.set_column(mla.column_names.index("num_heads"), "num_heads",
                                                                 listy))
    text_latency = pa.array([str(x) for x in mla.column("latency").to_pylist()])
    p["text_latency"] = _layout(tmp / "text_latency", mla.set_column(mla.column_names.index("latency"), "latency",
                                                                     text_latency))
    p["no_columns"] = _layout(tmp / "no_columns", pa.table({}))
    p["truncated"] = tmp / "truncated"
    _layout(p["truncated"], mla)
    f = p["truncated"] / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet"
    f.write_bytes(f.read_bytes()[:500])
    p["zero_bytes"] = tmp / "zero_bytes/gb300/mla/vllm/0.27.0"
    p["zero_bytes"].mkdir(parents=True)
    (p["zero_bytes"] / "mla_context_module_perf.parquet").write_bytes(b"")
    p["zero_bytes"] = tmp / "zero_bytes"
    passwd = tmp / "passwd"
    (passwd / "h200_sxm/mla/trtllm/0.20.0").mkdir(parents=True)
    (passwd / "h200_sxm/mla/trtllm/0.20.0/context_mla_perf.txt").symlink_to("/etc/passwd")
    p["passwd"] = passwd
    p["passwd_file"] = passwd / "h200_sxm/mla/trtllm/0.20.0/context_mla_perf.txt"
    outside = tmp / "outside_link"
    (outside / "gb300/mla/vllm/0.27.0").mkdir(parents=True)
    (outside / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet").symlink_to(FIXTURES / MLA)
    p["outside_link"] = outside
    dangling = tmp / "dangling"
    (dangling / "gb300/mla/vllm/0.27.0").mkdir(parents=True)
    (dangling / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet").symlink_to(tmp / "nowhere")
    p["dangling"] = dangling
    p["unreadable_sub"] = _layout(tmp / "unreadable_sub", mla)
    _layout(p["unreadable_sub"], mla, where="h200_sxm/mla/vllm/0.27.0")
    (p["unreadable_sub"] / "h200_sxm").chmod(0)
    p["unreadable_root"] = _layout(tmp / "unreadable_root", mla)
    p["unreadable_root"].chmod(0)
    p["unreadable_file"] = _layout(tmp / "unreadable_file", mla)
    (p["unreadable_file"] / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet").chmod(0)
    for name, text in (("scalar_reuse", "5\n"), ("list_reuse", "reuse: 7\n"), ("bad_reuse", "reuse: [1, {a: b}]\n"),
                       ("yaml_reuse", "reuse: [\n"), ("binary_reuse", "\x00\xff\xfe")):
        p[name] = _layout(tmp / name, mla)
        (p[name] / "gb300/mla/vllm/0.27.0/reuse.yaml").write_bytes(text.encode("latin-1"))
    for name, text in (("bad_meta", "tables: [\n"), ("deep_meta", "[" * 5000 + "]" * 5000),
                       ("scalar_meta", "just text\n")):
        p[name] = _layout(tmp / name, mla)
        (p[name] / "gb300/mla/vllm/0.27.0/collection_meta.yaml").write_text(text)
    p["debris"] = _layout(tmp / "debris", mla)
    (p["debris"] / "gb300/mla/vllm/0.27.0/.mla_context_module_perf.parquet.abc123.modperf-tmp").write_bytes(b"x")
    p["dir_table"] = tmp / "dir_table"
    (p["dir_table"] / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet").mkdir(parents=True)
    # model configs
    cfg = tmp / "configs"
    _config(cfg, "acme/Heads1e9", num_attention_heads=10**9)
    _config(cfg, "acme/Layers1e7", num_hidden_layers=10**7)
    _config(cfg, "acme/Int70", num_attention_heads=2**70)
    _config(cfg, "acme/StrHeads", num_attention_heads="128")
    _config(cfg, "acme/BoolHeads", num_attention_heads=True)
    _config(cfg, "acme/NoHidden", hidden_size=None)
    (cfg / "acme--Deep_config.json").write_text("[" * 100_000 + "]" * 100_000)
    (cfg / "acme--Nested_config.json").write_text('{"a": ' + "[" * 200 + "]" * 200 + "}")
    (cfg / "acme--NotJson_config.json").write_text("{")
    (cfg / "acme--Binary_config.json").write_bytes(b"\xff\xfe\x00")
    (cfg / "acme--Scalar_config.json").write_text("7")
    _config(cfg, "acme/ShortFreq", sparse_attention_config={"use_sparse_attention": True,
                                                             "sparse_attention_freq": [1, 0]},
            kv_lora_rank=None)
    p["configs"] = cfg
    p["unreadable_configs"] = tmp / "unreadable_configs"
    p["unreadable_configs"].mkdir()
    p["unreadable_configs"].chmod(0)
    p["a_file"] = tmp / "a_file.txt"
    p["a_file"].write_text("not a folder\n")
    # batches
    lines = [json.dumps(LINE).encode(), b'{"table": "\xff\xfe"}', json.dumps({**LINE, "self": 1}).encode(),
             b"[" * 100_000 + b"]" * 100_000, json.dumps({**LINE, "allow_substitute": "false"}).encode(),
             json.dumps({**LINE, "batch_size": "\u00b2"}).encode(), json.dumps({**LINE, "batch_size": 0}).encode(),
             json.dumps({**LINE, "isl": 0}).encode(), b'{"batch_size": NaN}', b'{"a": 1, "a": 2}',
             json.dumps({**LINE, "native_heads": 10**12, "tp_size": 7, "model": None}).encode(),
             json.dumps({**LINE, "model": "x" * 1_000_000}).encode(), json.dumps({**LINE, "isl": [1, [2]]}).encode(),
             b'{"n": 1' + b"0" * 5000 + b"}", json.dumps({**LINE, "isl": 2**70}).encode(),
             json.dumps({**LINE, "batch_size": True}).encode(), json.dumps({**LINE, "model": f"{ESC}[2J"}).encode(),
             b"\x00\x01\x02", b"   ", json.dumps(LINE).encode()]
    p["batch"] = tmp / "batch.jsonl"
    p["batch"].write_bytes(b"\n".join(lines) + b"\n")
    p["batch_long"] = tmp / "long.jsonl"
    p["batch_long"].write_bytes(b'{"x": "' + b"y" * (17 * 2**20) + b'"}\n' + json.dumps(LINE).encode() + b"\n")
    # migration inputs
    p["stale"] = tmp / "stale"
    shutil.copytree(FIXTURES / STALE, p["stale"], copy_function=shutil.copyfile)
    p["legacy"] = tmp / "legacy"
    shutil.copytree(FIXTURES / LEGACY, p["legacy"], copy_function=shutil.copyfile)
    p["readonly"] = tmp / "readonly"
    shutil.copytree(FIXTURES / STALE, p["readonly"], copy_function=shutil.copyfile)
    for q in sorted(p["readonly"].rglob("*"), reverse=True):
        q.chmod(0o555 if q.is_dir() else 0o444)
    p["linked"] = tmp / "linked"
    shutil.copytree(FIXTURES / STALE, p["linked"] / "real", copy_function=shutil.copyfile)
    link_dir = p["linked"] / "view" / "b200_sxm/sparse_attention/sglang/0.5.10"
    link_dir.mkdir(parents=True)
    (link_dir / "dsv4_csa_context_module_perf.parquet").symlink_to(
        p["linked"] / "real/b200_sxm/sparse_attention/sglang/0.5.10/dsv4_csa_context_module_perf.parquet")
    p["link_out"] = tmp / "link_out" / "b200_sxm/sparse_attention/sglang/0.5.10"
    p["link_out"].mkdir(parents=True)
    (p["link_out"] / "dsv4_csa_context_module_perf.parquet").symlink_to(
        p["stale"] / "b200_sxm/sparse_attention/sglang/0.5.10/dsv4_csa_context_module_perf.parquet")
    p["link_out"] = tmp / "link_out"
    # dedupe output folders
    p["foreign_out"] = tmp / "foreign_out"
    foreign = p["foreign_out"] / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("my notes, not a table\n")
    p["readonly_out"] = tmp / "readonly_out"
    p["readonly_out"].mkdir()
    p["readonly_out"].chmod(0o555)
    return p


def cases(p: dict[str, Path]) -> list[Case]:
    out: list[Case] = []

    def both(name: str, argv: list[str], expect: tuple[int, ...], **kw) -> None:
        out.append(Case(name, argv, expect, **kw))
        out.append(Case(name + " --json", [*argv, "--json"], expect, json=True, **kw))

    # check over hostile tables and data roots
    for name, code in (("good", 0), ("empty", 1), ("dup", 1), ("heads62", 1), ("wrap", 1), ("negative", 1),
                       ("nan_heads", 1), ("esc_model", 1), ("huge_model", 1), ("truncated", 1), ("zero_bytes", 1),
                       ("passwd", 1), ("outside_link", 1), ("dangling", 1), ("scalar_reuse", 1), ("list_reuse", 1),
                       ("bad_reuse", 1), ("yaml_reuse", 1), ("binary_reuse", 1), ("bad_meta", 1), ("deep_meta", 1),
                       ("scalar_meta", 1), ("debris", 1), ("dir_table", 1), ("uint64_heads", 1), ("list_heads", 1),
                       ("text_latency", 1), ("no_columns", 1)):
        both(f"check path {name}", ["check", str(p[name])], (code,))
        both(f"check root {name}", ["check", "--data-root", str(p[name])], (code,))
    for name in ("unreadable_sub", "unreadable_root", "unreadable_file"):
        both(f"check path {name}", ["check", str(p[name])], (1,), unprivileged=True)
        both(f"check root {name}", ["check", "--data-root", str(p[name])], (1,), unprivileged=True)
    both("check passwd file named", ["check", str(p["passwd_file"])], (1,))
    both("check a non-table file", ["check", str(p["a_file"])], (2,))
    both("check missing path", ["check", str(p["a_file"]) + ".nope"], (2,))
    both("check data root is a file", ["check", "--data-root", str(p["a_file"])], (2,))
    both("check quality on empty", ["check", str(p["empty"]), "--quality"], (1,))
    both("check bad threshold", ["check", "--quality", "--spike-factor", "nan"], (2,))
    both("check model-configs missing", ["check", str(p["good"]), "--model-configs", str(p["a_file"]) + ".no"], (2,))
    both("check model-configs a file", ["check", str(p["good"]), "--model-configs", str(p["a_file"])], (2,))
    both("check model-configs unreadable", ["check", str(p["good"]), "--model-configs",
                                            str(p["unreadable_configs"])], (2,), unprivileged=True)
    both("check env data root is a file", ["check"], (2,), env={"MODPERF_DATA_ROOT": str(p["a_file"])})
    both("check env model configs missing", ["check", str(p["good"])], (2,),
         env={"MODPERF_MODEL_CONFIGS": str(p["a_file"]) + ".no"})
    both("check unknown table", ["check", "--table", "nope"], (2,))
    out.append(Case("coverage --json --csv", ["coverage", "--csv", "--json"], (2,), json=True))
    both("coverage diff unknown versions", ["coverage", "--diff", "9.9", "9.8"], (2,))
    both("query unknown slot", ["query", "nope_table", "--system", "x", "--backend", "y", "--version", "z"], (2,))
    # ls and coverage over hostile roots
    for name in ("empty", "dup", "truncated", "passwd", "scalar_reuse", "bad_meta", "esc_model", "huge_model",
                 "dangling"):
        both(f"ls {name}", ["ls", "--data-root", str(p[name])], (0, 1))
        both(f"coverage {name}", ["coverage", "--data-root", str(p[name])], (0, 1))
    both("ls unreadable root", ["ls", "--data-root", str(p["unreadable_root"])], (0, 1), unprivileged=True)
    both("coverage tp 1,,2", ["coverage", "--data-root", str(p["good"]), "--tp", "1,,2"], (2,))
    both("coverage tp huge", ["coverage", "--model", "moonshotai/Kimi-K3", "--tp", "1000000000000"], (2,))
    both("coverage plot to a folder", ["coverage", "--data-root", str(p["good"]), "--plot", str(p["good"])], (2,))
    both("coverage plot under a file", ["coverage", "--data-root", str(p["good"]), "--plot",
                                        str(p["a_file"] / "x.png")], (1, 2))
    # query: one query
    q = ["query", *SLOT, *KEY]
    both("query ok", [*q, "--model", "moonshotai/Kimi-K3", "--tp", "3", "--batch-size", "4", "--isl", "2048"], (0,))
    for name, extra in (("native 1e12 tp 7", ["--native-heads", "1000000000000", "--tp", "7"]),
                        ("native 1e18 tp 7", ["--native-heads", "1000000000000000000", "--tp", "7"]),
                        ("native 0", ["--native-heads", "0", "--tp", "1"]),
                        ("tp 0", ["--model", "moonshotai/Kimi-K3", "--tp", "0"]),
                        ("num-heads 2^62", ["--model", "moonshotai/Kimi-K3", "--num-heads", str(2**62)]),
                        ("tp -3", ["--model", "moonshotai/Kimi-K3", "--tp", "-3"])):
        both(f"query {name}", [*q, *extra, "--batch-size", "4", "--isl", "2048"], (2,))
    base = [*q, "--model", "moonshotai/Kimi-K3", "--tp", "3"]
    for name, extra, code in (("batch 0", ["--batch-size", "0", "--isl", "2048"], 2),
                              ("isl 0", ["--batch-size", "4", "--isl", "0"], 2),
                              ("superscript", ["--batch-size", "\u00b2", "--isl", "2048"], 2),
                              ("arabic digits", ["--batch-size", "\u0664", "--isl", "2048"], 2),
                              ("isl 2^70", ["--batch-size", "4", "--isl", str(2**70)], 2),
                              ("isl 5000 digits", ["--batch-size", "4", "--isl", "9" * 5000], 2),
                              ("isl float", ["--batch-size", "4", "--isl", "2048.5"], 2),
                              ("isl nan", ["--batch-size", "4", "--isl", "nan"], 2),
                              ("allow-substitute string", ["--batch-size", "4", "--isl", "2048",
                                                           "--allow_substitute=false"], 2),
                              ("self field", ["--batch-size", "4", "--isl", "2048", "--self", "1"], 2),
                              ("dangling field", ["--batch-size", "4", "--isl"], 2),
                              ("esc field name", ["--batch-size", "4", "--isl", "2048", f"--{ESC}[2J", "1"], 2),
                              ("huge field name", ["--batch-size", "4", "--isl", "2048", "--" + "f" * 100_000, "1"], 2),
                              ("beyond limit", ["--batch-size", "4", "--isl", "4000000"], 1)):
        both(f"query {name}", [*base, *extra], (code,))
    both("query esc model", [*q, "--model", f"{ESC}[2Jevil", "--tp", "3", "--batch-size", "4", "--isl", "2048"], (2,))
    both("query long model", [*q, "--model", "m" * 100_000, "--tp", "3", "--batch-size", "4", "--isl", "2048"], (2,))
    both("query rejected table", ["query", *SLOT, "--data-root", str(p["dup"]), *KEY, "--native-heads", "96", "--tp",
                                  "3", "--batch-size", "4", "--isl", "2048"], (1,))
    both("query empty table", ["query", *SLOT, "--data-root", str(p["empty"]), *KEY, "--native-heads", "96", "--tp",
                               "3", "--batch-size", "4", "--isl", "2048"], (1,))
    both("query unreadable root", ["query", *SLOT, "--data-root", str(p["unreadable_root"]), *KEY, "--native-heads",
                                   "96", "--tp", "3", "--batch-size", "4", "--isl", "2048"], (1,), unprivileged=True)
    both("query scalar reuse root", ["query", *SLOT, "--data-root", str(p["scalar_reuse"]), *KEY, "--native-heads",
                                     "96", "--tp", "3", "--batch-size", "4", "--isl", "2048"], (0,))
    both("query 1M-line-name batch", ["query", "--batch", str(p["batch"])], (1,))
    both("query long-line batch", ["query", "--batch", str(p["batch_long"])], (1,))
    both("query batch folder", ["query", "--batch", str(p["good"])], (2,))
    both("query batch missing", ["query", "--batch", str(p["good"] / "nope.jsonl")], (2,))
    both("query batch /dev/zero", ["query", "--batch", "/dev/zero"], (2,))
    both("query batch stdin", ["query", "--batch", "-"], (1,), stdin=p["batch"].read_bytes())
    both("query batch stdin hang line", ["query", "--batch", "-"], (1,),
         stdin=json.dumps({**LINE, "model": None, "native_heads": 10**12, "tp_size": 7}).encode() + b"\n"
         + json.dumps(LINE).encode() + b"\n")
    # predict
    pred = ["predict", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm", "--isl", "1024",
            "--osl", "128"]
    row = {"id": "r", "model_path": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "mode": "agg",
           "isl": 1024, "osl": 128, "batch_size": 8, "tp_size": 2}
    both("predict ok", [*pred, "--batch", "8", "--tp", "2"], (0,))
    both("predict tp huge", [*pred, "--batch", "8", "--tp", "1000000000000"], (2,))
    both("predict batch 0", [*pred, "--batch", "0", "--tp", "2"], (2,))
    both("predict unknown system", [*pred[:4], "h200", *pred[5:], "--batch", "8", "--tp", "2"], (2,))
    both("predict batch folder", ["predict", "--batch", str(p["good"])], (2,))
    both("predict batch stdin hostile lines", ["predict", "--batch", "-"], (1,),
         stdin=b"\n".join([json.dumps(row).encode(), b"\xff\xfe", b"[" * 100000, json.dumps({**row, "tp_size": 10**30}).encode(),
                           json.dumps({**row, "isl": 2**40}).encode(), json.dumps({**row, "mode": "disagg"}).encode(),
                           json.dumps({**row, "self": 1}).encode(), json.dumps(row).encode()]) + b"\n")
    # estimate
    both("estimate ok", [*KIMI, "--scope", "attention", "--tp", "1,2"], (0,))
    both("estimate model ok", ["estimate", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend",
                               "vllm", "--isl", "1024", "--osl", "128", "--batch", "4", "--tp", "8"], (0,))
    for name, extra in (("tp 1,,2", ["--tp", "1,,2"]), ("tp 0", ["--tp", "0"]), ("tp empty", ["--tp", ""]),
                        ("tp trailing comma", ["--tp", "1,2,"]), ("tp huge", ["--tp", "1000000000000"]),
                        ("tp superscript", ["--tp", "\u00b2"]), ("isl huge", ["--isl", str(2**40)]),
                        ("batch 0", ["--batch", "0"]), ("prefix -1", ["--prefix", "-1"]),
                        ("kernel-source unknown table", ["--kernel-source", "nope_table=K"]),
                        ("kernel-source no =", ["--kernel-source", "K"])):
        both(f"estimate {name}", [*KIMI, *extra], (2,))
    both("estimate kernel unknown kernel", [*KIMI, "--tp", "1", "--kernel-source", "mla_context_module=NOPE"], (1, 2))
    cfg = ["--model-configs", str(p["configs"])]
    est = ["estimate", "--system", "gb300", "--backend", "vllm", "--isl", "1024", "--osl", "64", "--batch", "2",
           "--tp", "3", *cfg]
    for model in ("acme/Heads1e9", "acme/Layers1e7", "acme/Int70", "acme/StrHeads", "acme/BoolHeads",
                  "acme/NoHidden", "acme/Deep", "acme/Nested", "acme/NotJson", "acme/Binary", "acme/Scalar",
                  "acme/ShortFreq"):
        both(f"estimate config {model}", [*est, "--model", model], (1, 2))
    both("estimate model-configs missing", [*KIMI, "--model-configs", str(p["a_file"]) + ".no"], (2,))
    # migrate
    both("migrate dry run", ["migrate", str(p["stale"])], (0,))
    both("migrate --out is a file", ["migrate", str(p["stale"]), "--out", str(p["a_file"])], (2,))
    both("migrate --out under a file", ["migrate", str(p["stale"]), "--out", str(p["a_file"] / "x")], (2,))
    both("migrate fill overflow", ["migrate", str(p["legacy"]), "--model", "deepseek-ai/DeepSeek-V3", "--fill",
                                   "num_heads=99999999999999999999999", "--out", str(p["stale"].parent / "o1")], (0, 1, 2))
    both("migrate fill overflow int column", ["migrate", str(p["legacy"]), "--model", "deepseek-ai/DeepSeek-V3",
                                              "--fill", "beam_width=99999999999999999999999", "--out",
                                              str(p["stale"].parent / "o2")], (0, 1, 2))
    both("migrate fill not a number", ["migrate", str(p["legacy"]), "--model", "deepseek-ai/DeepSeek-V3", "--fill",
                                       "beam_width=abc", "--out", str(p["stale"].parent / "o3")], (0, 1, 2))
    both("migrate fill no =", ["migrate", str(p["legacy"]), "--fill", "oops"], (2,))
    both("migrate passwd", ["migrate", str(p["passwd"])], (1,))
    both("migrate passwd file", ["migrate", str(p["passwd_file"])], (1,))
    both("migrate unknown model", ["migrate", str(p["legacy"]), "--model", f"{ESC}[2J"], (2,))
    both("migrate read-only execute", ["migrate", str(p["readonly"]), "--execute"], (1,), unprivileged=True)
    both("migrate link out of folder", ["migrate", str(p["link_out"] / "b200_sxm/sparse_attention/sglang/0.5.10/"
                                                       "dsv4_csa_context_module_perf.parquet")], (1,))
    both("migrate link folder search", ["migrate", str(p["link_out"])], (1,))
    both("migrate unreadable sub", ["migrate", str(p["unreadable_sub"])], (1,), unprivileged=True)
    # dedupe
    both("dedupe write foreign file", ["dedupe", str(p["good"]), "--write", str(p["foreign_out"])], (2,))
    both("dedupe write out is a file", ["dedupe", str(p["good"]), "--write", str(p["a_file"])], (2,))
    both("dedupe write read-only out", ["dedupe", str(p["good"]), "--write", str(p["readonly_out"])], (1,),
         unprivileged=True)
    both("dedupe tolerance nan", ["dedupe", str(p["good"]), "--tolerance", "nan"], (2,))
    both("dedupe examples negative", ["dedupe", str(p["good"]), "--examples", "-5"], (0, 2))
    both("dedupe unreadable sub", ["dedupe", str(p["unreadable_sub"])], (1,), unprivileged=True)
    return out


def _command(case: Case) -> list[str]:
    cmd = [sys.executable, "-m", "modperf", *case.argv]
    if case.unprivileged and os.geteuid() == 0 and shutil.which("setpriv"):
        drop = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", "--", *cmd]
    return cmd


def run(case: Case, env: dict[str, str]) -> Result:
    start = time.perf_counter()
    try:
        proc = subprocess.run(_command(case), input=case.stdin, capture_output=True, timeout=case.timeout,
                              env={**env, **case.env})
    except subprocess.TimeoutExpired:
        return Result(case, None, time.perf_counter() - start, [f"no exit within {case.timeout:g} s (a hang)"])
    seconds = time.perf_counter() - start
    res = Result(case, proc.returncode, seconds)
    stdout, stderr = proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    if proc.returncode == 3:
        res.problems.append("internal error (exit 3): " + stderr.strip()[:300])
    elif proc.returncode not in case.expect:
        res.problems.append(f"exit {proc.returncode}, expected {'/'.join(map(str, case.expect))}: "
                            + (stderr.strip() or stdout.strip())[:300])
    if "Traceback" in stdout + stderr:
        res.problems.append("a traceback reached the user")
    if ESC in stderr or (ESC in stdout and not case.json):
        res.problems.append("a raw control character reached the terminal")
    if PASSWD_MARK in stdout + stderr:
        res.problems.append("a line of /etc/passwd reached a message")
    if len(proc.stdout) + len(proc.stderr) > MAX_OUTPUT:
        res.problems.append(f"{len(proc.stdout) + len(proc.stderr):,} bytes of output")
    if case.json and proc.returncode != 3:
        try:
            _strict_json(stdout)
        except ValueError as exc:
            res.problems.append(f"--json output is not strict JSON: {str(exc)[:120]}")
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run only cases whose name contains this")
    parser.add_argument("--workers", type=int, default=max(2, (os.cpu_count() or 2)))
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args()
    if not (FIXTURES / "README.md").is_file():
        sys.exit(f"needs the shared fixtures at {FIXTURES}")
    tmp = Path(tempfile.mkdtemp(prefix="modperf-hostile-"))
    tmp.chmod(0o755)
    try:
        paths = build(tmp)
        chosen = [c for c in cases(paths) if not args.only or args.only in c.name]
        env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "COLUMNS": "120"}
        env.pop("MODPERF_DEBUG", None)
        start = time.perf_counter()
        with ThreadPoolExecutor(args.workers) as pool:
            results = list(pool.map(lambda c: run(c, env), chosen))
        wall = time.perf_counter() - start
    finally:
        for q in [tmp, *tmp.rglob("*")]:
            if not q.is_symlink():
                q.chmod(q.stat().st_mode | stat.S_IRWXU)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        for r in results:
            print(json.dumps({"case": r.case.name, "exit": r.code, "seconds": round(r.seconds, 2),
                              "problems": r.problems}))
        return
    failed = [r for r in results if r.problems]
    if failed:
        print(f"{'case':60} {'exit':>4} {'s':>6}  problem")
        for r in failed:
            for problem in r.problems:
                print(f"{r.case.name[:60]:60} {r.code!s:>4} {r.seconds:6.1f}  {problem}")
    codes: dict[str, int] = {}
    for r in results:
        codes[str(r.code)] = codes.get(str(r.code), 0) + 1
    slowest = max(results, key=lambda r: r.seconds)
    print(f"\n{len(results)} cases in {wall:.0f} s: exit codes {dict(sorted(codes.items()))}; "
          f"{len(failed)} broke a rule; slowest {slowest.seconds:.1f} s ({slowest.case.name})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
