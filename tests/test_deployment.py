import numpy as np
import pytest

from modperf import errors as E
from modperf.query.deployment import heads_answer
from modperf.specs.shard import local_heads, local_kv_heads, parse_tps, validate_tps


def test_parse_and_validate_tps():
    assert parse_tps("8, 1,2,4,2") == [1, 2, 4, 8]
    assert validate_tps([np.int64(4), 1]) == [1, 4]
    for bad in ("", "one", "1,0", "-2"):
        with pytest.raises(E.OptionValueError, match="--tp takes positive integers separated by commas"):
            parse_tps(bad)
    for bad in ([], [1, True], [2.0], [0]):
        with pytest.raises(E.OptionValueError, match="tp sizes must be positive integers") as info:
            validate_tps(bad)
        assert info.value.exit_code == 2


def test_kv_heads_shard_or_replicate() -> None:
    assert [local_kv_heads(8, tp) for tp in (1, 2, 4, 8, 16, 32)] == [8, 4, 2, 1, 1, 1]
    with pytest.raises(E.ShardError, match=r"tp_size=8 cannot shard 12 kv heads \(neither divides the other\)"):
        local_kv_heads(12, 8)
    assert local_heads(96, 3) == 32
    with pytest.raises(E.ShardError, match=r"use a tp_size that divides 96 \(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96\)"):
        local_heads(96, 5)


def test_heads_answer_is_the_grids_rule() -> None:
    measured = [1, 2, 4, 8, 16, 32, 64, 128]
    assert heads_answer(measured, 16) == "exact"
    assert heads_answer(measured, 12) == "interpolated"
    assert heads_answer(measured, 256) == "extrapolated"  # log2(257/129) = 0.99 octave
    assert heads_answer(measured, 512) is None
    assert heads_answer([], 8) is None
