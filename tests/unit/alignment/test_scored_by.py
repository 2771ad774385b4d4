"""``aisp verify --scored-by MODEL``: one kind of a route's records against its model's run alone."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

import pyflink_aisp.kafka
from pyflink_aisp.alignment import compare_outputs, select_scored_by
from pyflink_aisp.cli import main as aisp
from pyflink_aisp.errors import DataError

ONNX, TORCH = "a" * 64, "b" * 64
#: Six reviews, a route's answer for each (short ones to onnx_sentiment), and the scores a run of
#: each model alone gives every one of them.
SCORES = {"rt-00001": 0.91, "rt-00002": 0.12, "rt-00003": 0.55, "rt-00004": 0.08, "rt-00005": 0.73,
          "rt-00006": 0.31}
SHORT = ("rt-00001", "rt-00002", "rt-00005")


def _scored(rid: str, score: float, version: str, **extra: Any) -> bytes:
    label = "fresh" if score >= 0.5 else "rotten"
    return json.dumps({"id": rid, "label": label, "score": score, "model_sha256": version, **extra}).encode()


def _route_output(rid: str, score: float) -> bytes:
    model, version = ("onnx_sentiment", ONNX) if rid in SHORT else ("torch_sentiment", TORCH)
    return _scored(rid, score, version, scored_by=[{"model": model, "model_sha256": version}])


ROUTE = [_route_output(rid, score) for rid, score in SCORES.items()]
ALONE = {"onnx_sentiment": [_scored(rid, score + 2e-7, ONNX) for rid, score in reversed(SCORES.items())],
         "torch_sentiment": [_scored(rid, score - 3e-7, TORCH) for rid, score in SCORES.items()]}


def test_each_kind_is_kept_with_the_same_ids_of_its_model_alone() -> None:
    onnx = select_scored_by(ROUTE, ALONE["onnx_sentiment"], "onnx_sentiment")
    assert [json.loads(v)["id"] for v in onnx.a] == list(SHORT)
    assert sorted(json.loads(v)["id"] for v in onnx.b) == list(SHORT)
    assert (onnx.count_a, onnx.count_b, onnx.left_aside_b) == (6, 6, 3)
    assert onnx.line() == ("kept 3 of 6 in A (scored by onnx_sentiment); 3 of B's 6 records left aside "
                           "(ids not in A's kept set)")
    assert compare_outputs(onnx.a, onnx.b).ok
    torch = select_scored_by(ROUTE, ALONE["torch_sentiment"], "torch_sentiment")
    assert [json.loads(v)["id"] for v in torch.a] == ["rt-00003", "rt-00004", "rt-00006"]
    assert compare_outputs(torch.a, torch.b).ok
    # the other model's run alone: same ids, another version: every record differs
    crossed = select_scored_by(ROUTE, ALONE["torch_sentiment"], "onnx_sentiment")
    assert [d.id for d in compare_outputs(crossed.a, crossed.b).differing] == list(SHORT)


def test_the_answering_model_is_the_last_of_a_cascade() -> None:
    trail = [{"model": "onnx_sentiment", "model_sha256": ONNX, "confidence": 0.18},
             {"model": "torch_sentiment", "model_sha256": TORCH}]
    escalated = _scored("rt-00003", 0.55, TORCH, scored_by=trail)
    sure = _scored("rt-00001", 0.91, ONNX, scored_by=trail[:1])
    sql = _scored("rt-00002", 0.12, ONNX, scored_by=json.dumps(trail[:1]))  # a SQL route's JSON string
    selection = select_scored_by([escalated, sure, sql], ALONE["onnx_sentiment"], "onnx_sentiment")
    assert selection.a == [sure, sql]
    assert select_scored_by([escalated, sure], [], "torch_sentiment").a == [escalated]


def test_a_missing_kind_a_record_without_scored_by_or_a_bad_record_is_an_error() -> None:
    with pytest.raises(DataError, match=r"no record is scored by 'onnx'.*onnx_sentiment, torch_sentiment"):
        select_scored_by(ROUTE, ALONE["onnx_sentiment"], "onnx")
    with pytest.raises(DataError, match="no record is scored by 'onnx_sentiment' \\(it is empty\\)"):
        select_scored_by([], ALONE["onnx_sentiment"], "onnx_sentiment")
    with pytest.raises(DataError, match=r"run a: 2 of 8 records have no scored_by list .*rt-00009, rt-00010"):
        select_scored_by([*ROUTE, *(_scored(r, 0.5, ONNX) for r in ("rt-00009", "rt-00010"))],
                         [], "onnx_sentiment")
    with pytest.raises(DataError, match="run b: an output record is not"):
        select_scored_by(ROUTE, [b"not json"], "onnx_sentiment")


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[bytes]]:
    """``read_topic`` over in-memory topics, for the command line."""
    held: dict[str, list[bytes]] = {}

    def read_topic(_servers: str, topic: str, **_kwargs: Any) -> list[SimpleNamespace]:
        return [SimpleNamespace(value=lambda v=v: v) for v in held[topic]]

    monkeypatch.setattr(pyflink_aisp.kafka, "read_topic", read_topic)
    return held


def test_aisp_verify_scored_by(topics: dict[str, list[bytes]], capsys: pytest.CaptureFixture[str]) -> None:
    topics.update(route=ROUTE, onnx=ALONE["onnx_sentiment"], torch=ALONE["torch_sentiment"])
    verify = ["verify", "--bootstrap-servers", "127.0.0.1:1"]
    assert aisp([*verify, "route", "onnx", "--scored-by", "onnx_sentiment"]) == 0
    out = capsys.readouterr().out
    assert "kept 3 of 6 in A (scored by onnx_sentiment); 3 of B's 6 records left aside" in out
    assert out.rstrip().endswith("SAME")
    assert aisp([*verify, "route", "torch", "--scored-by", "onnx_sentiment"]) == 3
    assert aisp([*verify, "route", "torch"]) == 3  # without it, the other kind differs
    capsys.readouterr()
    assert aisp([*verify, "route", "onnx", "--scored-by", "onnx"]) == 1
    assert "no record is scored by 'onnx'" in capsys.readouterr().err
    manifests = ["--manifest", "a.json", "--manifest", "b.json"]
    assert aisp([*verify, *manifests, "--scored-by", "onnx_sentiment"]) == 1
    assert "--scored-by compares output topics" in capsys.readouterr().err
