"""The orjson path of the JSON decoder (plain documents) gives what Python's ``json`` path gives."""

import json
import random
import struct

import numpy as np
import pytest

from pyflink_aisp.kafka import DecodedRecord, FieldMapping, KafkaCoordinates, _decode, decode_review
from pyflink_aisp.outcome import DeadLettered

SRC = KafkaCoordinates(topic="features", partition=0, offset=9)
FEATURES = FieldMapping(features=("/embedding",), id="/tx")


def _both(value: bytes, mapping: FieldMapping, monkeypatch: pytest.MonkeyPatch):
    fast = decode_review(value, SRC, mapping)
    with monkeypatch.context() as m:
        m.setattr(_decode, "_plain_object", lambda raw, as_doubles=frozenset(): None)
        slow = decode_review(value, SRC, mapping)
    return fast, slow


def _floats(rng: np.random.Generator, n: int) -> list[float]:
    """Doubles of every kind: random bit patterns (subnormals included), embedding-like values,
    halfway-looking decimals."""
    bits = [struct.unpack("<d", struct.pack("<Q", int(b)))[0]
            for b in rng.integers(0, 2**63 - 1, size=n, dtype=np.uint64)]
    finite = [x for x in bits if abs(x) < 2.0**63]  # wider ones take json's path (tested below)
    return finite + (rng.standard_normal(n) * 0.05).astype(np.float32).astype(float).tolist() + [
        0.1, 0.30000000000000004, 5e-324, 2.2250738585072014e-308, 9.2e18, -0.0, 1e-5, 1e16]


@pytest.mark.parametrize("fmt", ["repr", "%.17g", "%.20e", "%.3f"])
def test_feature_vectors_decode_bit_for_bit_as_the_standard_library_reads_them(fmt, monkeypatch):
    rng = np.random.default_rng(7)
    values = _floats(rng, 400)
    text = ", ".join(repr(v) if fmt == "repr" else fmt % v for v in values)
    raw = b'{"tx": "r1", "embedding": [' + text.encode() + b"]}"
    assert _decode._plain_object(raw) is not None  # the orjson path is the one under test
    fast, slow = _both(raw, FEATURES, monkeypatch)
    assert isinstance(fast, DecodedRecord)
    assert fast == slow
    assert struct.pack(f"<{len(values)}d", *fast.features) == struct.pack(f"<{len(values)}d", *slow.features)


@pytest.mark.parametrize("value", [
    b'{"id": "a", "text": "plain"}',
    b'{"id": 18446744073709551615, "text": "x"}',       # u64's largest: an int either way
    b'{"id": -9223372036854775808, "text": "x"}',
    b'{"id": 123456789012345678901234567890, "text": "x"}',  # wider: Python's json keeps it exact
    b'{"id": 1.5, "text": "x"}',                         # bad_id
    b'{"id": true, "text": "x"}',
    b'{"text": 5}',                                      # text_not_string
    b'{"id": "a"}',                                      # missing_text
    b'{"text": "caf\xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x8e\xac", "label": null}',  # raw UTF-8, U+2028, astral
    b'{"text": "x", "label": [1, [2, [3.5, "s", null, false]]]}',
    b'{"text": "x", "big": [1, 9223372036854775808]}',
    b'{"text": "x", "label": 1e999}',                    # overflow: orjson refuses, json decides
    b'{"text": "x", "text": "y"}',                       # duplicate_key
    b'{"text": "x", "m": {"k": 1, "k": 2}}',
    b'{"text": "\\u00e9", "id": "\\u0061"}',             # escapes: json's path
    b'{"te\\u0078t": "a", "text": "b"}',                 # a repeated name spelled two ways
    b'{"text": "x",}', b'{"text": "x"} {}', b'[1, 2]', b'"x"', b'', b'{"text": NaN}',
    b'{"text": "\xff"}',                                 # invalid UTF-8
    b'\xef\xbb\xbf{"text": "bom"}',
    b'{"text": "tab\there"}',                            # a raw control character
    b' \n {"text": "x"} \n',
])
def test_every_document_gets_the_same_outcome_on_both_paths(value, monkeypatch):
    fast, slow = _both(value, FieldMapping(), monkeypatch)
    if isinstance(slow, DeadLettered):
        assert isinstance(fast, DeadLettered)
        assert (fast.reason, fast.detail, fast.value) == (slow.reason, slow.detail, slow.value)
    else:
        assert fast == slow


def test_a_vector_with_numbers_past_64_bits_decodes_alike_on_both_paths(monkeypatch):
    """A field only the features read is read as doubles on both paths: there orjson's nearest double
    for a wide integer literal is ``float(int)``, ties included (2**64 + 2**11 lies halfway)."""
    wide = ["123456789012345678901234567890", "18446744073709551616", "-9223372036854775809",
            str(2**64 + 2**11), str(2**64 + 3 * 2**11), str(-(2**100 + 2**47)), "9" * 308]
    numbers = ", ".join(["0.5", "1.7976931348623157e308", "-3e200", "7", *wide])
    raw = b'{"tx": "r1", "embedding": [' + numbers.encode() + b"]}"
    assert _decode._plain_object(raw) is None  # where any field may be read as an integer
    assert _decode._plain_object(raw, FEATURES.feature_only_names) is not None
    fast, slow = _both(raw, FEATURES, monkeypatch)
    assert isinstance(fast, DecodedRecord) and fast == slow
    assert fast.features == (0.5, 1.7976931348623157e308, -3e200, 7.0, *(float(int(w)) for w in wide))
    assert struct.pack("<11d", *fast.features) == struct.pack("<11d", *slow.features)


@pytest.mark.parametrize("mapping", [
    FieldMapping(features=("/embedding",), id="/tx", keep=("/embedding",)),  # kept as written
    FieldMapping(features=("/embedding/1",), id="/tx", keep=("*",)),          # kept by '*'
    FieldMapping(features=("/embedding",), id="/embedding"),                  # the id's field too
    FieldMapping(features=("/label",), id="/tx"),                             # the label is read too
])
def test_a_wide_integer_another_reader_sees_takes_the_standard_librarys_path(mapping, monkeypatch):
    name = mapping.features[0].split("/")[1]
    raw = b'{"tx": "r1", "' + name.encode() + b'": [0.5, 123456789012345678901234567890]}'
    assert mapping.feature_only_names == frozenset()
    assert _decode._plain_object(raw, mapping.feature_only_names) is None
    fast, slow = _both(raw, mapping, monkeypatch)
    if isinstance(slow, DeadLettered):
        assert isinstance(fast, DeadLettered) and (fast.reason, fast.detail) == (slow.reason, slow.detail)
    else:
        assert fast == slow
        assert dict(fast.kept).get("embedding", [0, 123456789012345678901234567890])[1] == \
            123456789012345678901234567890  # exact where it is kept


def test_the_fields_only_the_features_read():
    assert FEATURES.feature_only_names == frozenset({"embedding"})
    assert FieldMapping(features=("/embedding",), id="/tx", keep=("*",)).feature_only_names == {"embedding"}
    assert FieldMapping(features=("/a", "/b", "/label"), id="/a").feature_only_names == {"b"}
    assert FieldMapping(features=("/v/0",), keep=("/v",)).feature_only_names == frozenset()
    assert FieldMapping().feature_only_names == frozenset()


def test_wide_integers_stay_exact():
    out = decode_review(b'{"id": 123456789012345678901234567890, "text": "x"}', SRC)
    assert isinstance(out, DecodedRecord) and out.id == "123456789012345678901234567890"


@pytest.mark.parametrize(("value", "plain"), [
    (b'{"tx": "a", "embedding": [0.5, -1, 2]}', True),
    (b'{"tx": "a\\"b", "embedding": [0.5]}', False),            # a backslash
    (b'{"tx": "a", "m": {"k": 1}}', False),                     # an object inside
    (b'{"tx": "a", "tx": "b"}', False),                         # a name twice
    (b'{"tx": "tx", "v": 1}', False),                           # a name's spelling also a value: json decides
    (b'{"tx": "a", "v": 12345678901234567890123}', False),      # wider than 64 bits
    (b'{"tx": "a", "v": [1, -1e19]}', False),
    (b'\xef\xbb\xbf{"tx": "a"}', False),
    (b'[{"tx": "a"}]', False),
])
def test_which_documents_take_the_orjson_path(value, plain):
    got = _decode._plain_object(value)
    assert (got is not None) == plain
    if plain:
        assert got == json.loads(value)


_ATOMS = ["0", "-0", "1.5", "1E+5", "1e-400", "1e400", "9223372036854775808", "-9223372036854775809",
          "123456789012345678901234567890", "5e-324", "true", "null", '"x"', '""', '"text"', '"caf\u00e9"',
          '"a\\nb"', '"\\ud800"', "NaN", "01", "1.", '"{"', "[]", "{}"]
_NAMES = ['"text"', '"id"', '"tx"', '"embedding"', '"a"', '"te\\u0078t"', '""']


def _document(rng: random.Random, depth: int = 0) -> str:
    def value(d: int) -> str:
        r = rng.random()
        if d > 3 or r < 0.5:
            return rng.choice(_ATOMS)
        if r < 0.75:
            return "[" + ",".join(value(d + 1) for _ in range(rng.randint(0, 5))) + "]"
        return _document(rng, d + 1)
    return "{" + ",".join(f"{rng.choice(_NAMES)}:{value(depth)}" for _ in range(rng.randint(0, 4))) + "}"


def test_both_paths_agree_on_random_and_mangled_documents(monkeypatch):
    """Random objects of the atoms above (every edge of both parsers), a third of them with bytes
    deleted, inserted or replaced; each decoded with every kind of mapping."""
    rng = random.Random(20261207)
    mappings = [FieldMapping(), FEATURES, FieldMapping(text="/a", keep=("*",)),
                FieldMapping(features=("/a",), id="/tx"), FieldMapping(features=("/embedding",), keep=("*",)),
                FieldMapping(features=("/embedding",), id="/tx", keep=("/embedding",))]
    plain = 0
    for _ in range(3000):
        doc = _document(rng)
        if rng.random() < 0.5:
            doc = doc[:-1] + ("," if len(doc) > 2 else "") + '"text":"x","tx":"t","embedding":[1,2.5,-3e2]}'
        raw = bytearray(doc.encode("utf-8"))
        for _ in range(rng.randint(0, 2) if rng.random() < 0.3 and raw else 0):
            i = rng.randrange(len(raw))
            op = rng.random()
            if op < 0.3:
                del raw[i]
            elif op < 0.6:
                raw.insert(i, rng.choice(b'{}[],:"\\ 0e-.\xff'))
            else:
                raw[i] = rng.randrange(256)
            if not raw:
                break
        value = bytes(raw)
        plain += _decode._plain_object(value) is not None
        fast, slow = _both(value, rng.choice(mappings), monkeypatch)
        if isinstance(slow, DeadLettered):
            assert isinstance(fast, DeadLettered), value
            assert (fast.reason, fast.detail, fast.value) == (slow.reason, slow.detail, slow.value), value
        else:
            assert fast == slow, value
    assert plain > 300  # the orjson path was exercised


@pytest.mark.parametrize("depth", [400, 700, 1000])
def test_arrays_nested_past_pythons_stack_decode_as_on_the_json_path(depth, monkeypatch):
    """orjson reads 1,023 levels; the wide-number walk recursed on them and raised RecursionError
    out of the decoder (found by a helper trying to break the fast path)."""
    raw = b'{"text":"x","a":' + b"[" * depth + b"1" + b"]" * depth + b"}"
    fast, slow = _both(raw, FieldMapping(), monkeypatch)
    if isinstance(slow, DeadLettered):
        assert isinstance(fast, DeadLettered) and (fast.reason, fast.detail) == (slow.reason, slow.detail)
    else:
        assert fast == slow == DecodedRecord(id="features/0/9", text="x")
