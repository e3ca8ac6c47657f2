"""Golden vectors for Idempotency-Key validation and the request fingerprint (SPEC 6).

The hex digests are pinned: changing the canonicalisation changes every stored
fingerprint, so every in-flight retry would get 422. Such a change needs a new
FINGERPRINT_VERSION and a migration plan, not a new vector.
"""

from __future__ import annotations

import hashlib
import json
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency.canonical import (
    canonical_body,
    canonical_json,
    canonical_number,
    fingerprint_compute,
    fingerprint_of_value,
    idempotency_key_is_valid,
)

PAYMENT = b'{"amount":100,"asset":"JPY","customer":"cus_1"}'


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        (PAYMENT, b'json:{"amount":100,"asset":"JPY","customer":"cus_1"}'),
        # key order, whitespace, 100 vs 100.0 vs 1e2 vs 1E+2 vs 100.00
        (b'{ "customer" : "cus_1",\n "asset":"JPY", "amount": 100.0 }', b'json:{"amount":100,"asset":"JPY","customer":"cus_1"}'),
        (b'{"amount":1e2,"asset":"JPY","customer":"cus_1"}', b'json:{"amount":100,"asset":"JPY","customer":"cus_1"}'),
        (b'{"amount":1E+2,"asset":"JPY","customer":"cus_1"}', b'json:{"amount":100,"asset":"JPY","customer":"cus_1"}'),
        (b'{"amount":100.00,"asset":"JPY","customer":"cus_1"}', b'json:{"amount":100,"asset":"JPY","customer":"cus_1"}'),
        (b'{"amount":101,"asset":"JPY","customer":"cus_1"}', b'json:{"amount":101,"asset":"JPY","customer":"cus_1"}'),
        # nested objects sort at every level; arrays keep their order; -0.0 is 0; 0.50 is 0.5
        (b'{"a":{"z":1,"b":[1,2,{"y":0.50,"x":-0.0}]},"e":"caf\\u00e9"}', 'json:{"a":{"b":[1,2,{"x":0,"y":0.5}],"z":1},"e":"café"}'.encode()),
        ('{"e":"café","a":{"b":[1,2.0,{"x":0,"y":0.5}],"z":1.00}}'.encode(), 'json:{"a":{"b":[1,2,{"x":0,"y":0.5}],"z":1},"e":"café"}'.encode()),
        (b'[2,1]', b"json:[2,1]"),
        # unicode: escapes and raw UTF-8 are the same string; no normalisation (NFC != NFD)
        (b'{"s":"\\ud83d\\ude00"}', 'json:{"s":"😀"}'.encode()),
        ('{"s":"😀"}'.encode(), 'json:{"s":"😀"}'.encode()),
        ('{"s":"e\u0301"}'.encode(), 'json:{"s":"e\u0301"}'.encode()),
        (b'{"s":"line\\nbreak \\"q\\" \\/"}', b'json:{"s":"line\\nbreak \\"q\\" /"}'),
        # huge and tiny numbers stay short and exact; big integers are not rounded
        (b'{"n":1e999999999}', b'json:{"n":1e999999999}'),
        (b'{"n":1.5E-70}', b'json:{"n":1.5e-70}'),
        (b'{"n":123456789012345678901234567890.123}', b'json:{"n":123456789012345678901234567890.123}'),
        (b'{"n":12345678901234567890123456789012345}', b'json:{"n":12345678901234567890123456789012345}'),
        # duplicate keys: the last wins (what the view's parser sees)
        (b'{"a":1,"a":2}', b'json:{"a":2}'),
        (b'true', b"json:true"),
        (b"null", b"json:null"),
        # no body, and bodies that are not JSON
        (b"", b""),
        (b" \n", b""),
        (b"not json", b"raw:not json"),
        (b"[NaN]", b"raw:[NaN]"),
        (b'{"a":Infinity}', b'raw:{"a":Infinity}'),
    ],
)
def test_canonical_body_golden_vectors(raw: bytes, canonical: bytes) -> None:
    assert canonical_body(raw) == canonical


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0", "0"), ("-0", "0"), ("0.000", "0"), ("0e10", "0"), ("7", "7"), ("-7", "-7"), ("100", "100"), ("1e2", "100"),
        ("1.50", "1.5"), ("-0.001", "-0.001"), ("12.340", "12.34"), ("1e63", "1" + "0" * 63), ("1e64", "1e64"),
        ("1.5e-64", "1.5e-64"), ("1e-64", "0." + "0" * 63 + "1"), ("25e-1", "2.5"), ("1234.5e2", "123450"),
    ],
)
def test_canonical_number_rule(text: str, canonical: str) -> None:
    assert canonical_number(Decimal(text)) == canonical


def _frame(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def test_fingerprint_golden_vectors() -> None:
    fp = fingerprint_compute(method="POST", path="/v1/terminal/payments", principal_id="ter_abc", body=PAYMENT)
    assert fp == "c5197ce583362c0a150aa752342f3bd604191914429fa392acc9365060547e4e"
    # The documented framing, rebuilt independently.
    assert fp == _frame(b"tally-idempotency-v1", b"POST", b"/v1/terminal/payments", b"ter_abc", b"json:" + PAYMENT)
    respelled = b'{"customer":"cus_1","amount":100.0,"asset":"JPY"}'
    assert fingerprint_compute(method="post", path="/v1/terminal/payments", principal_id="ter_abc", body=respelled) == fp
    assert fingerprint_compute(method="POST", path="/v1/terminal/payments", principal_id="ter_abd", body=PAYMENT) == (
        "1240c0533cfa293eae17aecbe0ac6cc6ba5d5e058527727096055f15901667d1"
    )
    assert fingerprint_compute(method="POST", path="/v1/terminal/payments", principal_id="ter_abc", body=b"") == (
        "491a40144b99db65fed4fc91a4dd6fa0a508cedddf635e1947cf9ef1a7eff1d6"
    )
    nested = b'{"a":{"z":1,"b":[1,2,{"y":0.50,"x":-0.0}]},"e":"caf\\u00e9"}'
    assert fingerprint_compute(method="POST", path="/v1/customer/transfers", principal_id="cus_x", body=nested) == (
        "40901bbec10e554e3f52be31a9e98471ec11f31098cc648925bcad3df97a6d0e"
    )


def test_fingerprint_separates_method_path_principal_and_body() -> None:
    base = {"method": "POST", "path": "/v1/terminal/payments", "principal_id": "ter_abc", "body": PAYMENT}
    variants = [
        {**base, "method": "PUT"},
        {**base, "path": "/v1/terminal/payments/"},
        {**base, "principal_id": "ter_abC"},
        {**base, "body": PAYMENT.replace(b"100", b"1000")},
        # framing: moving a character between path and principal is still another request
        {**base, "path": "/v1/terminal/paymentst", "principal_id": "er_abc"},
        {**base, "body": b""},
        {**base, "body": b"raw:" + PAYMENT},
    ]
    fingerprints = {fingerprint_compute(**base)} | {fingerprint_compute(**v) for v in variants}  # type: ignore[arg-type]
    assert len(fingerprints) == len(variants) + 1


def test_task_fingerprints_refuse_floats() -> None:
    assert fingerprint_of_value(scope="s", principal_id="task:x", payload={"n": Decimal("1.0")}) == fingerprint_of_value(
        scope="s", principal_id="task:x", payload={"n": 1}
    )
    with pytest.raises(TypeError):
        canonical_json({"n": 1.0})
    with pytest.raises(TypeError):
        canonical_json(1.0)


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("a", True), ("x" * 255, True), ("x" * 256, False), ("", False), (" ", False), ("   ", False),
        ("order 123", True), ("~!@#$%^&*()_+-=[]{}|;':,./<>?`\"\\", True), ("caf\u00e9", False),
        ("tab\t", False), ("nl\n", False), ("\x7f", False), ("\x00", False), ("550e8400-e29b-41d4-a716-446655440000", True),
    ],
)
def test_key_golden_vectors(key: str, valid: bool) -> None:
    assert idempotency_key_is_valid(key) is valid


# --- properties ------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30), st.text(max_size=8),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**9), max_value=10**9),
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20
)


def _respell(value: object, rng: random.Random) -> str:
    """Another valid JSON text of the same value: shuffled keys, spaces, other number spellings."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return "{ " + " , ".join(f"{json.dumps(k)} :\n{_respell(v, rng)}" for k, v in items) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_respell(v, rng) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | Decimal):
        d = Decimal(value)
        spellings = [str(d), f"{d:.5f}", f"{d:E}" if d == d.to_integral_value() and abs(d) < 10**15 else str(d)]
        return rng.choice(spellings)
    return json.dumps(value, ensure_ascii=rng.random() < 0.5)


@settings(max_examples=200, deadline=None)
@given(value=json_values, seed=st.integers(0, 2**32))
def test_any_respelling_of_a_body_has_the_same_canonical_form(value: object, seed: int) -> None:
    rng = random.Random(seed)
    original = _respell(value, random.Random(0)).encode()
    respelled = _respell(value, rng).encode()
    assert canonical_body(respelled) == canonical_body(original)
    assert canonical_body(original).startswith(b"json:")


@settings(max_examples=200, deadline=None)
@given(a=json_values, b=json_values)
def test_different_values_have_different_canonical_forms(a: object, b: object) -> None:
    ca, cb = canonical_body(_respell(a, random.Random(1)).encode()), canonical_body(_respell(b, random.Random(2)).encode())
    assert (ca == cb) == (_normal(a) == _normal(b))


def _normal(value: object) -> object:
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, bool) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, int | Decimal):
        return ("n", Decimal(value).normalize() if value else Decimal(0))
    return value
