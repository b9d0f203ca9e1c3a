import numpy as np
import pytest

from modperf import errors as E
from modperf.deployment import parse_tps, validate_tps


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
