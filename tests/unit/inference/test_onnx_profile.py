"""ONNX Runtime's profiler on the sentiment model's session, ended after a bounded number of runs
(issue 24's kernel-level co-location diagnosis; read by bench/_ort_profile.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference.handlers import OnnxSentimentModel, OrtProfiling, ProfiledRuns

TEXTS = ["a fine film", "dull and far too long for what it has to say", "yes", "the cast is wonderful"]


def _runs(path: str) -> list[dict]:
    events = json.loads(Path(path).read_text(encoding="utf-8"))
    return [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]


def test_the_session_profiles_its_first_runs_then_stops_with_the_same_outputs(model_assets, tmp_path) -> None:
    plain = OnnxSentimentModel(model_assets, intra_op_num_threads=2, batch_size=2, verify=False)
    profiled = OnnxSentimentModel(model_assets, intra_op_num_threads=2, batch_size=2, verify=False,
                                  profiling=OrtProfiling(directory=tmp_path / "prof", runs=3))
    assert profiled.profiled is not None and profiled.profiled.path is None
    want, _ = plain.predict(TEXTS)
    got, _ = profiled.predict(TEXTS)  # two runs of 2
    assert profiled.profiled.path is None  # not yet: 2 of 3
    again, _ = profiled.predict(TEXTS)  # runs 3 and 4: the profile ends after the third
    path = profiled.profiled.path
    assert path is not None and Path(path).parent == tmp_path / "prof"
    assert Path(path).name.startswith("aisp-ort-")
    assert len(_runs(path)) == 3
    profiled.predict(TEXTS)
    profiled.close()
    assert profiled.profiled.path == path and len(_runs(path)) == 3  # nothing after the end
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(again, want)
    kernels = [e for e in json.loads(Path(path).read_text()) if e.get("cat") == "Node"]
    assert {"MatMul"} <= {e["args"]["op_name"] for e in kernels}
    assert all("Wait" in e["args"]["thread_scheduling_stats"]["main_thread"] for e in kernels)


def test_closing_before_the_last_run_writes_the_runs_so_far(model_assets, tmp_path) -> None:
    model = OnnxSentimentModel(model_assets, intra_op_num_threads=1, batch_size=4, verify=False,
                               profiling=OrtProfiling(directory=tmp_path, runs=100))
    model.predict(TEXTS)
    model.close()
    assert model.profiled is not None and len(_runs(model.profiled.path)) == 1
    model.close()  # idempotent


class _Session:
    def __init__(self) -> None:
        self.ended = 0

    def end_profiling(self) -> str:
        self.ended += 1
        return f"profile-{self.ended}.json"


def test_the_counter_ends_the_profiling_once() -> None:
    session = _Session()
    runs = ProfiledRuns(session, 2)
    runs.ran()
    assert (session.ended, runs.path) == (0, None)
    runs.ran()
    runs.ran()
    runs.close()
    assert (session.ended, runs.path) == (1, "profile-1.json")


def test_bad_profiling_settings_are_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="profiled runs must be >= 1, got 0"):
        OrtProfiling(directory=tmp_path, runs=0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    from pyflink_aisp.errors import ModelError

    with pytest.raises(ModelError, match="cannot create the ONNX Runtime profile directory"):
        OrtProfiling(directory=blocker / "sub").file_prefix()


def test_the_job_option_profiles_the_sentiment_model_only(tmp_path) -> None:
    from pyflink_aisp.pipeline import PipelineOptions
    from pyflink_aisp.pipeline._handlers import handler_for

    options = PipelineOptions.from_args(["--input-topic", "i", "--output-topic", "o", "--onnx-profile-dir",
                                         str(tmp_path / "p"), "--onnx-profile-runs", "7"])
    handler = handler_for(options)
    assert handler._profiling == OrtProfiling(directory=tmp_path / "p", runs=7)  # type: ignore[attr-defined]
    assert handler_for(PipelineOptions(input_topic="i", output_topic="o"))._profiling is None  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="--onnx-profile-dir profiles the ONNX sentiment model"):
        handler_for(PipelineOptions(input_topic="i", output_topic="o", onnx_profile_dir=tmp_path,
                                    runtime="torch"))
