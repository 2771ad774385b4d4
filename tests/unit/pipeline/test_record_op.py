"""RecordInferenceFunction (``--operator record``) driven row by row with the Arrow operator's fake
handler, beside the Arrow operator on the same records; and the thread-mode settings."""

from __future__ import annotations

import json
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from pyflink.common import Row

from pyflink_aisp.errors import ConfigError, OperatorNotOpenError
from pyflink_aisp.kafka import FieldMapping
from pyflink_aisp.pipeline._arrow_op import ArrowInferenceFunction
from pyflink_aisp.pipeline._record_op import RecordInferenceFunction
from pyflink_aisp.pipeline._settings import thread_mode_settings

from .test_arrow_op import BATCHING, MIN_RECORD_BYTES, SHA, Context, EchoHandler, LeaseOpener, _frame, _record


def _open(kind: type[ArrowInferenceFunction], **kwargs) -> tuple[ArrowInferenceFunction, Context]:
    function = kind(EchoHandler(), batching=BATCHING, open_lease=LeaseOpener(), **kwargs)
    context = Context()
    function.open(context)
    return function, context


def test_each_row_is_scored_as_the_arrow_operator_scores_it_in_a_batch() -> None:
    values = [_record("a", "hello"), b"{not json", _record("n", "a nan"), None,
              _record("big", "x" * MIN_RECORD_BYTES), _record("b", "")]
    arrow, _ = _open(ArrowInferenceFunction, max_record_bytes=MIN_RECORD_BYTES)
    try:
        batch = arrow.eval(_frame(values))
    finally:
        arrow.close()
    record, context = _open(RecordInferenceFunction, max_record_bytes=MIN_RECORD_BYTES)
    try:
        rows = [record.eval(Row(v, "reviews", 0, 100 + i)) for i, v in enumerate(values)]
        gauges = {name: read() for name, read in context.group.gauges.items()}
    finally:
        record.close()
    assert [tuple(r) for r in rows] == list(batch.itertuples(index=False, name=None))
    assert [r[2] for r in rows] == [False, True, True, True, True, False]
    assert json.loads(rows[0][1]) == {"id": "a", "chars": 5, "ratio": 0.05, "echo": "hello",
                                      "model_sha256": SHA}
    assert [json.loads(r[1])["reason"] for r in rows[1:5]] == [
        "invalid_json", "inference_error", "null_value", "oversized_output"]
    # one call per record: six calls of one
    assert (gauges["recordsIn"], gauges["recordsOut"], gauges["arrowBatches"],
            gauges["arrowBatchSizeMax"]) == (6, 2, 6, 1)


def test_the_id_can_be_the_kafka_key_and_a_null_partition_is_unknown() -> None:
    record, _ = _open(RecordInferenceFunction, mapping=FieldMapping(id="key"))
    try:
        row = record.eval(Row(json.dumps({"text": "hi"}).encode(), "t", None, 7, b"k-1"))
    finally:
        record.close()
    assert row[0] == "k-1" and row[2] is False and row[3] == "t/-1/7"
    assert json.loads(row[1])["id"] == "k-1"


def test_a_row_before_open_names_the_operator() -> None:
    record = RecordInferenceFunction(EchoHandler(), batching=BATCHING, open_lease=LeaseOpener())
    with pytest.raises(OperatorNotOpenError, match=r"RecordInferenceFunction\.eval"):
        record.eval(Row(_record("a", "x"), "t", 0, 1))


def test_thread_mode_puts_the_workers_site_packages_on_the_python_path() -> None:
    settings = thread_mode_settings(sys.executable, {})
    assert settings["python.execution-mode"] == "thread"
    paths = settings["python.pythonpath"].split(":")
    pemja = find_spec("pemja")
    assert pemja is not None and pemja.origin is not None
    assert any(Path(pemja.origin).is_relative_to(p) for p in paths), (pemja.origin, paths)


def test_a_given_python_path_or_a_shipped_python_is_left_to_the_user() -> None:
    assert thread_mode_settings(sys.executable, {"python.pythonpath": "/opt/site"}) == {
        "python.execution-mode": "thread"}
    assert thread_mode_settings("venv.zip/venv/bin/python", {}) == {"python.execution-mode": "thread"}


def test_a_python_that_cannot_answer_is_a_config_error(tmp_path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(ConfigError, match=r"python\.pythonpath"):
        thread_mode_settings(str(broken), {})


def test_opening_an_operator_freezes_what_lives_then_out_of_later_full_collections() -> None:
    import gc

    gc.unfreeze()
    before = [object()]  # a tracked container that lives across the open
    try:
        function, _ = _open(RecordInferenceFunction)
        try:
            frozen = gc.get_freeze_count()
            after = [object()]
            scanned = gc.get_objects()
            assert frozen > 0
            assert not any(o is before for o in scanned)  # in the permanent generation
            assert any(o is after for o in scanned)  # what records allocate is still collected
        finally:
            function.close()
    finally:
        gc.unfreeze()
