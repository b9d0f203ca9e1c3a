"""modperf.base.limits and the messages of modperf.base.errors: every range is checked at the edge with a
typed error naming field, value and range; parsing is strict; a message never grows with what
a user typed and never carries a control character. Property tests over the field types."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modperf import errors as E
from modperf.base import limits
from modperf.base.jsonio import dumps
from modperf.specs.shard import divisors, local_heads, parse_tps, validate_tps

FIELDS = sorted(limits.FIELDS)
CONTROL = {chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))} | {"\u202e", "\u2066", "\u200f"}


@given(name=st.sampled_from(FIELDS), data=st.data())
def test_parse_int_accepts_exactly_the_range(name: str, data) -> None:
    rng = limits.FIELDS[name]
    inside = data.draw(st.integers(rng.low, rng.high))
    assert limits.parse_int(name, inside) == inside
    assert limits.parse_int(name, str(inside)) == inside  # the command line gives text
    assert limits.parse_int(name, float(inside)) == inside or abs(inside) > 2**53
    outside = data.draw(st.one_of(st.integers(max_value=rng.low - 1), st.integers(min_value=rng.high + 1)))
    with pytest.raises(E.QueryFieldError) as info:
        limits.parse_int(name, outside)
    err = info.value
    assert err.exit_code == 2
    assert err.values["field"] == name and err.values["range"] == [rng.low, rng.high]
    assert err.values["value"] == outside or isinstance(err.values["value"], str)  # huge ints are shown as text
    assert f"{name} must be an integer in {rng.describe()}" in err.detail


@given(text=st.text(min_size=1, max_size=8))
def test_parse_int_takes_ascii_digits_only(text: str) -> None:
    stripped = text.strip()
    ascii_number = stripped.lstrip("+-").isascii() and stripped.lstrip("+-").isdigit() and \
        stripped.count("+") + stripped.count("-") <= 1 and stripped[:1] in "+-0123456789"
    if ascii_number and int(stripped) in limits.KEY:
        assert limits.parse_int("some_key", text) == int(stripped)
    else:
        with pytest.raises(E.QueryFieldError):
            limits.parse_int("some_key", text)


@pytest.mark.parametrize("value", ["\u00b2", "\u0664", "\uff11", "\u2081", "1\u00b2", "\u0e51"])
def test_digits_that_python_calls_digits_are_refused(value: str) -> None:
    """'²'.isdigit() is True and int('²') raises: a typed error, never a crash."""
    assert any(unicodedata.digit(ch, None) is not None for ch in value)
    with pytest.raises(E.QueryFieldError, match="batch_size must be an integer in 1..1,048,576"):
        limits.parse_int("batch_size", value)


@pytest.mark.parametrize("value", [True, False, None, [4], {"n": 4}, 4.5, float("nan"), float("inf"), "4.0", "", " ",
                                   "0x10", "1e3", "9" * 5000, b"4"])
def test_parse_int_refuses_what_is_not_an_integer(value) -> None:
    with pytest.raises(E.QueryFieldError):
        limits.parse_int("isl", value)


@given(value=st.one_of(st.text(max_size=10), st.integers(), st.floats(), st.none(), st.lists(st.booleans(), max_size=2)))
def test_parse_bool_takes_booleans_only(value) -> None:
    """"allow_substitute": "false" is not False, nor True: a usage error."""
    with pytest.raises(E.QueryFieldError, match="must be true or false"):
        limits.parse_bool("allow_substitute", value)


def test_parse_bool_booleans() -> None:
    assert limits.parse_bool("allow_substitute", True) is True
    assert limits.parse_bool("allow_substitute", False) is False


def test_every_product_of_checked_heads_and_tp_fits_int64() -> None:
    """Why the ranges are what they are: heads * tp and batch * tokens stay far below 2**63."""
    assert limits.HEADS.high * limits.TP.high < 2**31
    assert limits.BATCH.high * limits.TOKENS.high < 2**63
    assert limits.FIELDS["m"].high < 2**63


# --- tp sizes and divisors -------------------------------------------------------------------


@given(tps=st.lists(st.integers(limits.TP.low, limits.TP.high), min_size=1, max_size=6))
def test_tp_lists_parse_and_an_empty_part_is_refused(tps: list[int]) -> None:
    text = ",".join(map(str, tps))
    assert parse_tps(text) == sorted(set(tps))
    for bad in (text + ",", "," + text, text.replace(",", ",,", 1) if "," in text else text + ",,1"):
        with pytest.raises(E.OptionValueError, match="--tp takes positive integers separated by commas"):
            parse_tps(bad)


@pytest.mark.parametrize("bad", ["1,,2", "0", "4097", "1000000000000", "\u00b2", "-1", "1;2", "1 2"])
def test_tp_text_out_of_range_or_malformed(bad: str) -> None:
    with pytest.raises(E.OptionValueError) as info:
        parse_tps(bad)
    assert info.value.exit_code == 2


@given(tps=st.lists(st.one_of(st.integers(), st.booleans()), min_size=1, max_size=4))
def test_validate_tps_keeps_the_range(tps) -> None:
    if all(t in limits.TP for t in tps):
        assert validate_tps(tps) == sorted(set(tps))
    else:
        with pytest.raises(E.OptionValueError, match=r"tp sizes must be positive integers in 1\.\.4,096"):
            validate_tps(tps)


@settings(max_examples=60, deadline=1000)
@given(n=st.integers(1, 10**18))
def test_divisors_are_bounded_whatever_n_is(n: int) -> None:
    """--native-heads 1000000000000 --tp 7 used to enumerate a million candidates; 10**18 never
    ended. Now at most limits.TP.high tries: the tp sizes that divide n."""
    found = divisors(n)
    assert found == [d for d in range(1, min(n, limits.TP.high) + 1) if n % d == 0]


def test_a_shard_error_for_a_huge_native_lists_tp_sizes_only() -> None:
    with pytest.raises(E.ShardError) as info:
        local_heads(10**12, 7)
    assert "(1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100, 125, 128, 160" in info.value.fix
    assert len(info.value.fix) < 1000


# --- messages -------------------------------------------------------------------------------


@given(text=st.text(max_size=3000))
def test_messages_never_carry_control_characters_and_stay_bounded(text: str) -> None:
    err = E.UnknownModelError(f"no HF config for model {E.quote(text)}", file=text, values={"model": text, text: 1},
                              fix=f"save it as {text}")
    rendered = str(err)
    assert not CONTROL & set(rendered)
    assert len(err.detail) <= E.MAX_TEXT + 60 and len(err.fix or "") <= E.MAX_TEXT + 60
    assert len(err.values["model"]) <= E.MAX_VALUE_CHARS + 40
    doc = json.loads(dumps({"error": err.to_dict()}))
    assert len(json.dumps(doc)) < 60_000


def test_a_1mb_name_is_quoted_with_its_length() -> None:
    name = "x" * 1_000_000
    err = E.UnknownModelError(f"no HF config for model {E.quote(name)}", values={"model": name})
    assert err.detail.startswith("no HF config for model 'xxxx") and err.detail.endswith("(1,000,000 characters)")
    assert len(dumps(err.to_dict())) < 5_000


def test_escape_sequences_are_shown_escaped() -> None:
    err = E.UnknownModelError(f"no HF config for model {E.quote(chr(27) + '[2Jevil')}")
    assert str(err) == r"no HF config for model '\x1b[2Jevil'"
    assert E.clean("a\u202eb\nc") == r"a\u202eb\nc"


def test_deep_values_are_summarised() -> None:
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    err = E.QueryFieldError("bad", values={"value": deep, "many": list(range(10_000))})
    assert "nested too deep" in json.dumps(err.values)
    assert len(err.values["many"]) == E.MAX_VALUE_ITEMS + 1 and err.values["many"][-1] == "... (10,000 items)"
