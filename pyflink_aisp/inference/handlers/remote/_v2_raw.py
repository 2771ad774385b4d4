"""V2 tensors as raw bytes: the gRPC binding's ``raw_input_contents`` / ``raw_output_contents`` and the
REST binding's binary tensor data extension
(https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md),
which lay a tensor out alike: its elements row-major and little-endian, a ``BYTES`` element as a
4-byte little-endian length and that many bytes.

A REST answer in the extension is a JSON header of ``Inference-Header-Content-Length`` bytes, then
the raw data of each output whose ``parameters`` name a ``binary_data_size``, in the header's order.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pyflink_aisp.errors import RemoteError

__all__ = ["RAW_DTYPES", "binary_answer", "raw_values"]

#: V2 datatype → the little-endian numpy dtype of its raw bytes.
RAW_DTYPES = {"BOOL": "?", "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "UINT8": "<u1",
              "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "FP16": "<f2", "FP32": "<f4", "FP64": "<f8"}


def _bytes_elements(raw: bytes) -> list[str]:
    out, i = [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise RemoteError("a raw BYTES output ends inside an element's length")
        n = int.from_bytes(raw[i:i + 4], "little")
        if i + 4 + n > len(raw):
            raise RemoteError("a raw BYTES output's element runs past its end")
        out.append(raw[i + 4:i + 4 + n].decode("utf-8", errors="replace"))
        i += 4 + n
    return out


def raw_values(name: str, datatype: str, raw: bytes) -> list[Any]:
    """The elements of one output's raw bytes, flat: strings for ``BYTES``, else numbers.

    Raises:
        RemoteError: An unknown datatype, a length that is not a whole number of elements, or
            ``BYTES`` lengths that run past the end (status None).
    """
    if datatype == "BYTES":
        return _bytes_elements(raw)
    dtype = RAW_DTYPES.get(datatype)
    if dtype is None:
        raise RemoteError(f"output {name!r} has the unknown datatype {datatype!r}")
    if len(raw) % np.dtype(dtype).itemsize:
        raise RemoteError(f"output {name!r}: {len(raw)} raw bytes are not whole {datatype} elements")
    return np.frombuffer(raw, dtype=dtype).tolist()


def binary_answer(body: bytes, json_length: int) -> dict[str, Any]:
    """A REST answer in the binary tensor data extension, in the JSON answer's shape (each binary
    output's ``data`` filled from the bytes after the header).

    Raises:
        RemoteError: The header is not a JSON object, or the outputs' sizes do not add up to the
            bytes after it (status None).
    """
    try:
        answer = json.loads(body[:json_length])
    except ValueError:
        raise RemoteError(f"a binary V2 answer whose {json_length}-byte header is not JSON") from None
    if not isinstance(answer, dict):
        raise RemoteError("a binary V2 answer whose header is not a JSON object")
    start = json_length
    for out in answer.get("outputs") or []:
        size = (out.get("parameters") or {}).get("binary_data_size") if isinstance(out, dict) else None
        if size is None:
            continue
        if not isinstance(size, int) or size < 0 or start + size > len(body):
            raise RemoteError(f"output {out.get('name')!r}: binary_data_size {size!r} runs past the "
                              f"{len(body) - json_length} bytes after the header")
        out["data"] = raw_values(str(out.get("name")), str(out.get("datatype")), body[start:start + size])
        start += size
    if start != len(body):
        raise RemoteError(f"a binary V2 answer with {len(body) - start} bytes after its outputs")
    return answer
