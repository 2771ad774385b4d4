"""Tasks: declared output fields, their checks, and rendering one prediction into the job's JSON."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError, InferenceError
from pyflink_aisp.inference.tasks import (
    EmbeddingTask,
    OutputField,
    SentimentTask,
    SqlType,
    Task,
    check_task,
    render_fields,
    render_prediction,
)

SHA = "d" * 64


class Fixed(Task):
    def __init__(self, fields: tuple[OutputField, ...], rendered: dict[str, Any]) -> None:
        self._fields, self._rendered = fields, rendered

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return self._fields

    def render(self, prediction: Any) -> dict[str, Any]:
        return self._rendered


SCORE = OutputField(name="score", sql_type=SqlType.DOUBLE)


@pytest.mark.parametrize("name", ["id", "model_sha256", "reason", "detail", "Score", "2x", "a-b", ""])
def test_an_output_field_needs_a_lower_case_name_the_operators_do_not_write(name: str) -> None:
    with pytest.raises(ConfigError, match="output field name"):
        OutputField(name=name, sql_type=SqlType.DOUBLE)


def test_an_output_field_needs_a_sql_type() -> None:
    with pytest.raises(ConfigError, match="must be a SqlType"):
        OutputField(name="score", sql_type="DOUBLE")  # type: ignore[arg-type]


def test_check_task_refuses_no_fields_repeated_names_and_non_tasks() -> None:
    assert check_task(SentimentTask()) == SentimentTask()
    with pytest.raises(ConfigError, match="at least one output field"):
        check_task(Fixed((), {}))
    with pytest.raises(ConfigError, match=r"\['score', 'score'\]"):
        check_task(Fixed((SCORE, SCORE), {}))
    with pytest.raises(ConfigError, match="must return a Task, got float"):
        check_task(0.5)  # type: ignore[arg-type]


def test_the_projects_tasks_declare_their_fields_and_sql_types() -> None:
    assert [(f.name, f.sql_type, f.extra) for f in SentimentTask(with_embedding=True).fields] == [
        ("score", SqlType.DOUBLE, False), ("label", SqlType.STRING, False),
        ("embedding", SqlType.ARRAY_DOUBLE, True)]
    assert [f.name for f in SentimentTask().fields] == ["score", "label"]
    assert [(f.name, f.sql_type) for f in EmbeddingTask().fields] == [("embedding", SqlType.ARRAY_FLOAT)]


def test_a_render_with_other_names_or_a_wrong_shape_is_an_inference_error() -> None:
    with pytest.raises(InferenceError, match=r"gave the fields \['scor'\], not its declared \['score'\]"):
        render_fields(Fixed((SCORE,), {"scor": 1.0}), None)
    with pytest.raises(InferenceError, match="SentimentTask cannot render the prediction: TypeError"):
        render_prediction(SentimentTask(), "r", 0.5, SHA, max_record_bytes=1 << 20)


def test_extra_fields_follow_model_sha256() -> None:
    task = SentimentTask(with_embedding=True)
    value = render_prediction(task, "r", (np.float32(0.25), np.array([1.0, 0.5], np.float32)), SHA,
                              max_record_bytes=1 << 20)
    assert value == json.dumps({"id": "r", "label": "rotten", "score": 0.25, "model_sha256": SHA,
                                "embedding": [1.0, 0.5]}, separators=(",", ":"))  # compact, as Flink's json


@pytest.mark.parametrize("rendered", [None, ["score"], 0.5])
def test_a_render_that_is_not_a_mapping_is_an_inference_error(rendered: Any) -> None:
    with pytest.raises(InferenceError, match=r"Fixed\.render must return a mapping"):
        render_fields(Fixed((SCORE,), rendered), None)


@pytest.mark.parametrize("value", [np.float32(0.5), np.int64(1), np.array([1.0]), object()])
def test_a_rendered_value_json_cannot_carry_is_an_inference_error(value: Any) -> None:
    """A task that hands back numpy scalars breaks its contract on every record: the operator
    dead-letters them (and the breaker judges) instead of failing the job on a TypeError."""
    with pytest.raises(InferenceError, match="not JSON-able"):
        render_prediction(Fixed((SCORE,), {"score": value}), "r", None, SHA, max_record_bytes=1 << 20)
