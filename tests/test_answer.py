"""Answer (modperf.fast.answer): a plain class that behaves as the dataclass it replaced (equality by
value over every attribute, defaults, repr, to_dict, copy); importing the module imports
neither numpy nor dataclasses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from modperf.fast.answer import Answer


def sample(**optional: object) -> Answer:
    return Answer(0.25, "exact", "mla_context_module", "h200_sxm", "trtllm", "1.3.0rc20", 128, 16, (16,),
                  ("/x.parquet",), ("deepseek-ai/DeepSeek-V3",), {"batch_size": 4}, **optional)


def test_defaults_and_equality_over_every_attribute() -> None:
    a = sample()
    assert a.notes == [] and a.derived == {} and a.quality is None and a.version_chosen is False
    assert a.notes is not sample().notes  # a new list per answer
    assert a == sample() and a != sample(notes=["x"]) and a != sample(version_chosen=True)
    assert a.copy(lane={"kernel_source": "k", "rule": "r"}).lane == {"kernel_source": "k", "rule": "r"}
    assert a.copy() == a and a.copy() is not a


def test_to_dict_and_repr() -> None:
    d = sample(substitution="s").to_dict()
    assert d["latency_ms"] == 0.25 and d["locals_used"] == [16] and d["files"] == ["/x.parquet"]
    assert d["substitution"] == "s" and list(d)[:3] == ["latency_ms", "kind", "table"]
    assert repr(sample()).startswith("Answer(latency_ms=0.25, kind='exact', table='mla_context_module'")


def test_unknown_attributes_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) colour"):
        sample(colour="red")
    with pytest.raises(TypeError, match="Answer has no attribute 'colour'"):
        sample().copy(colour="red")


def test_importing_the_fast_path_imports_no_numpy() -> None:
    heavy = "('numpy', 'dataclasses', 'pyarrow', 'json', 'pathlib', 'typing', 'typer', 'rich')"
    for modules, want in (("modperf.fast.answer, modperf.fast.lattice, modperf.fast.plans", "[]"),
                          # (the command line's writer of the answer needs the JSON encoder)
                          ("modperf.base.jsonio, modperf.cli._single", "['json']")):
        run = subprocess.run([sys.executable, "-c", f"import sys, {modules}; "
                              f"print(sorted(m for m in {heavy} if m in sys.modules))"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == want, modules
