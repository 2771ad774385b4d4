"""The V2 raw tensor layout: the binary tensor data extension's answers and raw contents."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from pyflink_aisp.errors import RemoteError
from pyflink_aisp.inference.handlers.remote._v2_raw import binary_answer, raw_values


def _strings(*texts: str) -> bytes:
    return b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)


def _answer(outputs: list[dict], raws: list[bytes], trailing: bytes = b"") -> tuple[bytes, int]:
    header = json.dumps({"model_name": "m", "outputs": outputs}).encode()
    return header + b"".join(raws) + trailing, len(header)


def test_binary_outputs_are_read_in_the_headers_order_beside_json_ones():
    probabilities = np.array([[0.25, 0.75], [1.0, 0.0]], dtype="<f4").tobytes()
    labels = _strings("ok", "fraud é")
    body, length = _answer([
        {"name": "label", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(labels)}},
        {"name": "score", "datatype": "FP64", "shape": [2], "data": [0.5, 1.5]},
        {"name": "probabilities", "datatype": "FP32", "shape": [2, 2],
         "parameters": {"binary_data_size": len(probabilities)}}], [labels, probabilities])
    answer = binary_answer(body, length)
    assert [o["data"] for o in answer["outputs"]] == [["ok", "fraud é"], [0.5, 1.5], [0.25, 0.75, 1.0, 0.0]]


@pytest.mark.parametrize(("size", "trailing", "message"), [
    (9, b"", "binary_data_size 9 runs past the 8 bytes after the header"),
    (4, b"", "a binary V2 answer with 4 bytes after its outputs"),
    (8, b"x", "a binary V2 answer with 1 bytes after its outputs"),
    (-1, b"", "binary_data_size -1 runs past"),
])
def test_sizes_that_do_not_add_up_are_remote_errors(size, trailing, message):
    body, length = _answer([{"name": "p", "datatype": "FP32", "shape": [2],
                             "parameters": {"binary_data_size": size}}], [b"\0" * 8], trailing)
    with pytest.raises(RemoteError, match=message):
        binary_answer(body, length)


def test_a_header_that_is_not_json_is_a_remote_error():
    with pytest.raises(RemoteError, match="12-byte header is not JSON"):
        binary_answer(b"not json at all", 12)


@pytest.mark.parametrize(("datatype", "raw", "message"), [
    ("FP32", b"\0" * 6, "6 raw bytes are not whole FP32 elements"),
    ("COMPLEX", b"\0" * 8, "unknown datatype 'COMPLEX'"),
    ("BYTES", b"\x05\0\0\0ab", "element runs past its end"),
    ("BYTES", b"\x01\0", "ends inside an element's length"),
])
def test_raw_bytes_that_are_not_the_datatypes_are_remote_errors(datatype, raw, message):
    with pytest.raises(RemoteError, match=message):
        raw_values("out", datatype, raw)


def test_every_numeric_datatype_reads_little_endian():
    assert raw_values("b", "BOOL", b"\x01\x00") == [True, False]
    assert raw_values("i", "INT64", struct.pack("<qq", -3, 2**40)) == [-3, 2**40]
    assert raw_values("u", "UINT16", struct.pack("<H", 65535)) == [65535]
    assert raw_values("h", "FP16", np.array([1.5], dtype="<f2").tobytes()) == [1.5]
