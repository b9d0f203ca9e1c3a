"""Coverage accounting against facts of the real corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from modperf import errors as E
from modperf.audit.coverage import (
    coverage,
    coverage_diff,
    model_coverage,
    parse_tps,
    to_csv,
)

MLA_MODULE = ("mla_context_module", "mla_generation_module")
MLA_KERNEL = ("context_mla", "generation_mla")


@pytest.fixture(scope="module")
def mla_module_coverage():
    return {t: coverage(table=t) for t in MLA_MODULE}


@pytest.fixture(scope="module")
def mla_kernel_coverage():
    return {t: coverage(table=t) for t in MLA_KERNEL}


def test_kimi_k3_96_native_rows_exist_only_in_gb300_vllm_0_27_0(mla_module_coverage) -> None:
    for table, report in mla_module_coverage.items():
        assert report.ok
        with_96 = [(s.ref.system, s.ref.backend, s.ref.version) for s in report.slots if s.native(96)]
        assert with_96 == [("gb300", "vllm", "0.27.0")], table
        k3 = report.find("gb300", "vllm", "0.27.0", table).native(96)
        assert k3.models == ["moonshotai/Kimi-K3"]
        # tp=1 sweep rows at locals 1..96 stand for every tp whose local was swept
        assert [c.tp for c in k3.cells if c.measured] == [1, 2, 3, 4, 6, 8, 12, 24, 48, 96]
        assert [c.tp for c in k3.cells if not c.measured] == [16, 32]  # locals 6 and 3 were not swept
        assert k3.cell(8).local == 12 and k3.cell(8).via == "sweep" and k3.cell(8).collected_tp == [1]
        assert k3.cell(1).via == "tp1"
        assert k3.undeployable_locals == [64, 128]  # swept, but no tp of a 96-head model runs them


def test_every_mla_module_slot_holds_deepseek_v3(mla_module_coverage) -> None:
    report = mla_module_coverage["mla_context_module"]
    assert len(report.slots) == 17
    for s in report.slots:
        nc = s.native(128)
        assert nc is not None and nc.models == ["deepseek-ai/DeepSeek-V3"]
        assert all(c.measured for c in nc.cells if c.tp <= 64)
    # reuse is visible: rtx_pro_6000_server trtllm 1.3.0rc23 answers from 1.3.0rc20
    rc23 = report.find("rtx_pro_6000_server", "trtllm", "1.3.0rc23", "mla_context_module")
    assert rc23.ref.reuse is not None and rc23.ref.reuse.from_version == "1.3.0rc20"


def test_mla_kernel_128_native_tp_chain_survives_only_in_trtllm_1_0_0(mla_kernel_coverage) -> None:
    for table, report in mla_kernel_coverage.items():
        assert len(report.slots) == 18
        chains = sorted((s.ref.system, s.ref.backend, s.ref.version) for s in report.slots
                        if any(c.measured and c.tp > 1 for c in s.native(128).cells))
        assert chains == [("a100_sxm", "trtllm", "1.0.0"), ("l40s", "trtllm", "1.0.0")], table
        for s in report.slots:
            assert [n.native for n in s.natives] == [64, 128]
            nc = s.native(128)
            assert nc.cell(1).measured  # 128 x tp1 everywhere
            # local-only: the 64-native chain's rows answer DeepSeek-V3 at tp8 (local 16) everywhere
            assert nc.cell(8).answerable
            if (s.ref.system, s.ref.version) not in (("a100_sxm", "1.0.0"), ("l40s", "1.0.0")):
                assert not nc.cell(8).measured and nc.cell(8).via == "local"


def test_model_question_named_alias_and_local_only() -> None:
    v3 = model_coverage("deepseek-ai/DeepSeek-V3", [1, 2, 4, 8], table="mla_context_module")
    assert v3.native == 128 and len(v3.answers) == 17
    assert all(a.match == "named" and a.answerable_tps == [1, 2, 4, 8] for a in v3.answers)

    k3 = model_coverage("moonshotai/Kimi-K3", [1, 2, 4, 8, 16], table="mla_context_module")
    answering = [(a.ref.system, a.ref.backend, a.ref.version, a.answerable_tps) for a in k3.answers if a.answerable_tps]
    # tp16 (local 6) was not swept, but it lies between the measured locals 4 and 8: a query
    # answers it interpolated, and coverage says so (one heads-axis rule, modperf.query.deployment)
    assert answering == [("gb300", "vllm", "0.27.0", [1, 2, 4, 8, 16])]
    (gb300,) = [a for a in k3.answers if a.answerable_tps]
    assert gb300.cells[16].measured is False and gb300.cells[16].answer == "interpolated"
    assert gb300.cells[16].via == "interpolated" and gb300.cells[8].answer == "exact"
    assert {a.match for a in k3.answers} == {"named", "native-missing"}

    # GLM-5 is named in most DSA tables; in the sglang 0.5.14 Blackwell tables only its aliases
    # (GLM-5-FP8, GLM-5.2 NVFP4: same native, same DSA module geometry) measured it
    glm = model_coverage("zai-org/GLM-5", [1, 2, 4, 8], table="dsa_context_module", backend="sglang")
    matches = {(a.ref.system, a.match) for a in glm.answers}
    assert matches == {("b200_sxm", "alias"), ("b300_sxm", "alias"), ("gb200", "alias"), ("gb300", "alias"),
                       ("h100_sxm", "named"), ("h200_sxm", "named")}
    assert all(a.answerable_tps == [1, 2, 4, 8] for a in glm.answers)

    # MLA kernels are local-only: Kimi-K3's locals 96/48/24/12 exist only in the vllm mla_bmm sweeps
    # (elsewhere they lie between the measured powers of two: answered, interpolated)
    kernel = model_coverage("moonshotai/Kimi-K3", [1, 2, 4, 8], table="mla_bmm")
    assert all(a.answerable_tps == [1, 2, 4, 8] for a in kernel.answers)
    assert {c.answer for a in kernel.answers for c in a.cells.values()} == {"exact", "interpolated"}
    assert sorted((a.ref.system, a.ref.backend, a.ref.version) for a in kernel.answers
                  if all(c.answer == "exact" for c in a.cells.values())) == [
        ("b200_sxm", "sglang", "0.5.14"), ("b200_sxm", "vllm", "0.24.0"), ("b300_sxm", "vllm", "0.24.0"),
        ("gb200", "vllm", "0.24.0"), ("gb300", "vllm", "0.24.0"), ("gb300", "vllm", "0.27.0"),
        ("h100_sxm", "vllm", "0.24.0"), ("h200_sxm", "vllm", "0.24.0")]
    assert {a.match for a in kernel.answers} == {"local-only"}


def test_gqa_model_question() -> None:
    llama = model_coverage("meta-llama/Meta-Llama-3.1-8B", [1, 2, 4, 8], table="context_attention",
                           system="h200_sxm")
    assert llama.answers and {a.family for a in llama.answers} == {"gqa"}
    # 32 q heads, 8 kv heads, head_dim 128: tp8 -> 4 q heads and 1 kv head per rank
    for a in llama.answers:
        assert a.cells[8] is not None and a.cells[8].local == 4
    assert any(a.answerable_tps == [1, 2, 4, 8] for a in llama.answers)
    # a latent-attention model is never asked about GQA kernels
    v3 = model_coverage("deepseek-ai/DeepSeek-V3", [8], table="context_attention", system="h200_sxm")
    assert v3.answers == []


def test_native_keyed_sparse_kernel_cells() -> None:
    report = coverage(table="dsv4_csa_topk_calib")
    assert len(report.slots) == 6
    for s in report.slots:
        assert [(n.native, [c.tp for c in n.cells if c.measured]) for n in s.natives] == [(64, [1]), (128, [1])]


def test_coverage_and_query_agree_on_kimi_k3(db) -> None:
    """What coverage calls answerable, a query answers, with the same kind; what it does not, a
    query refuses (the disagreement the consolidation issue found: tp16 on gb300)."""
    k3 = model_coverage("moonshotai/Kimi-K3", [1, 2, 4, 8, 16, 32], table="mla_context_module")
    point = {"batch_size": 1, "isl": 1024, "step": 0, "kernel_source": "FLASH_ATTN", "kv_cache_dtype": "bfloat16",
             "gemm_type": "bfloat16"}
    for a in k3.answers:
        for tp, cell in a.cells.items():
            fields = {"table": a.ref.table, "system": a.ref.system, "backend": a.ref.backend,
                      "version": a.ref.version, "model": "moonshotai/Kimi-K3", "tp_size": tp, **point}
            if cell is not None and cell.answerable:
                assert db.query(**fields).kind == cell.answer, (a.ref.label, tp)
            else:
                with pytest.raises((E.NotCoveredError, E.QueryFieldError)):
                    db.query(**fields)


def test_diff_gb300_vllm_0_24_to_0_27() -> None:
    d = coverage_diff("0.24.0", "0.27.0", system="gb300", backend="vllm", table="mla_context_module")
    (s,) = d.slots
    assert s.status == "both" and s.changed
    assert s.natives[96]["gained"] == [1, 2, 3, 4, 6, 8, 12, 24, 48, 96] and s.natives[96]["lost"] == []
    assert s.natives[128]["gained"] == [] and s.natives[128]["lost"] == []
    # same cells for DeepSeek-V3, a few grid points fewer in 0.27.0
    assert s.natives[128]["points_before"][8] == 1098 and s.natives[128]["points_after"][8] == 1084
    assert s.locals_gained == [12, 24, 48, 96]
    with pytest.raises(E.OptionValueError, match="no table with the model's head axis of version"):
        coverage_diff("0.24.0", "9.9.9", system="gb300")


def test_fixture_paths_two_natives_never_mix(fixtures: Path) -> None:
    report = coverage([str(fixtures / "07_latent_collision" / "wheel" / "gb300")])
    (s,) = report.slots
    assert [(n.native, n.models) for n in s.natives] == [(96, ["moonshotai/Kimi-K3"]),
                                                         (128, ["deepseek-ai/DeepSeek-V3"])]


def test_csv_and_json_layouts(mla_module_coverage) -> None:
    report = mla_module_coverage["mla_generation_module"]
    rows = report.rows()
    text = to_csv(rows)
    header = text.splitlines()[0].split(",")
    assert header == ["system", "backend", "version", "table", "family", "tier", "reused_from", "native", "models",
                      "tp", "local", "measured", "answerable", "points", "variants", "collected_tp", "via",
                      "answer"]
    k3_tp8 = [r for r in rows if r["native"] == 96 and r["tp"] == 8]
    assert len(k3_tp8) == 1 and k3_tp8[0]["local"] == 12 and k3_tp8[0]["measured"] is True
    d = report.to_dict()
    assert d["ok"] is True and len(d["slots"]) == 17


def test_option_errors() -> None:
    assert parse_tps("8,1, 2,4") == [1, 2, 4, 8]
    for bad in ("", "0", "1,x", "-2"):
        with pytest.raises(E.OptionValueError):
            parse_tps(bad)
    with pytest.raises(E.UnknownModelError):
        model_coverage("nobody/NoSuchModel", [1], table="mla_bmm")
    with pytest.raises(E.UnknownTableError):
        coverage(table="gemm")


def test_plot_files(mla_module_coverage, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")
    from modperf.audit.plot import plot_coverage, plot_model

    out = plot_coverage(mla_module_coverage["mla_context_module"], tmp_path / "mla.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model = model_coverage("moonshotai/Kimi-K3", [1, 2, 4, 8], table="mla_context_module")
    assert plot_model(model, tmp_path / "k3.png").stat().st_size > 10_000
    with pytest.raises(E.OptionValueError):
        plot_coverage(mla_module_coverage["mla_context_module"], tmp_path / "mla.txt")
