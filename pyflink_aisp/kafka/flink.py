"""PyFlink functions of the Kafka area (importing this module imports PyFlink)."""

from __future__ import annotations

from pyflink_aisp.kafka._decode_fn import (
    DECODED_TYPE,
    DLQ_TAG,
    KEY_VALUE_TYPE,
    DecodeFunction,
    UndecodableRecord,
    decode_row,
)

__all__ = ["DECODED_TYPE", "DLQ_TAG", "KEY_VALUE_TYPE", "DecodeFunction", "UndecodableRecord", "decode_row"]
