"""BatchedInferenceFunction outside Flink: a fake runtime context, a fake model file."""

import asyncio
from pathlib import Path

import pytest

from pyflink_aisp.errors import InferenceError, InferenceTimeoutError
from pyflink_aisp.inference import BatchingConfig, ModelHandler
from pyflink_aisp.outcome import Reason, reason_of
from pyflink_aisp.pipeline.flink import BatchedInferenceFunction


class Group:
    def __init__(self):
        self.gauges = {}

    def add_group(self, name):
        assert name == "aisp"
        return self

    def gauge(self, name, read):
        assert name not in self.gauges, f"gauge {name} registered twice"
        self.gauges[name] = read


class Context:
    def __init__(self):
        self.group = Group()

    def get_metrics_group(self):
        return self.group


class LengthHandler(ModelHandler[str, int, str]):
    def __init__(self, tag: str):
        self.tag = tag

    def load_model(self):
        return self.tag

    def model_version(self):
        return "ab" * 32

    def run_inference(self, batch, model):
        if "poison" in batch:
            raise RuntimeError("poisoned")
        return [len(x) for x in batch]


def make(dead_letter=True):
    return BatchedInferenceFunction(
        LengthHandler(str(Path.cwd())), batching=BatchingConfig(max_batch_size=4, max_wait_ms=1),
        extract=lambda rec: rec["text"], emit=lambda rec, pred, ver: (rec["id"], pred, ver[:4]),
        dead_letter=(lambda rec, err: ("DLQ", rec["id"], reason_of(err), err)) if dead_letter else None,
    )


def test_records_are_scored_in_batches_and_bad_ones_dead_lettered():
    fn, ctx = make(), Context()
    fn.open(ctx)

    async def go():
        records = [{"id": i, "text": "x" * i} for i in range(1, 6)]
        records += [{"id": 9, "text": "poison"}, {"id": 10}]
        return await asyncio.gather(*(fn.async_invoke(r) for r in records))

    out = asyncio.run(go())
    gauges = {name: read() for name, read in ctx.group.gauges.items()}
    fn.close()
    assert out[:5] == [[(i, i, "abab")] for i in range(1, 6)]
    ((tag, rid, reason, error),) = out[5]
    assert (tag, rid, reason, str(error)) == ("DLQ", 9, Reason.INFERENCE_ERROR, "poisoned")
    assert type(error) is RuntimeError
    ((tag, rid, reason, error),) = out[6]  # extract raised KeyError: dead-lettered, not a job failure
    assert (tag, rid, reason, type(error)) == ("DLQ", 10, Reason.INFERENCE_ERROR, KeyError)
    assert gauges["recordsIn"] == 7 and gauges["recordsOut"] == 5 and gauges["deadLetters"] == 2
    assert gauges["endToEndUsMax"] >= gauges["endToEndUsP50"] > 0 and gauges["serializationUsP99"] >= 0
    assert gauges["inferenceFailures"] == 1 and gauges["bisections"] >= 1


def test_a_timed_out_record_is_dead_lettered_or_fails_without_a_dlq():
    fn = make()
    (letter,) = fn.timeout({"id": 3, "text": "t"})
    assert letter[:3] == ("DLQ", 3, Reason.INFERENCE_TIMEOUT) and isinstance(letter[3], InferenceTimeoutError)
    assert fn._counts["deadLetters"] == 1
    with pytest.raises(TimeoutError):
        make(dead_letter=False).timeout({"id": 3, "text": "t"})


def test_invoke_before_open_is_an_error():
    with pytest.raises(InferenceError):
        asyncio.run(make().async_invoke({"id": 1, "text": "a"}))
