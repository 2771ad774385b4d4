"""BatchedInferenceFunction outside Flink: a fake runtime context, a fake model file."""

import asyncio
import time
from pathlib import Path

import pytest

from pyflink_aisp.errors import DeadLetterRateError, InferenceError, InferenceTimeoutError
from pyflink_aisp.inference import BatchingConfig, ModelHandler
from pyflink_aisp.outcome import Reason, reason_of
from pyflink_aisp.pipeline._watch import DeadLetterWatchConfig
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
        if "slow" in batch:
            time.sleep(0.3)  # still running when the test's timeout() fires
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


def test_the_dead_letter_watch_counts_every_outcome_and_fails_past_its_limit():
    fn = BatchedInferenceFunction(
        LengthHandler(str(Path.cwd())), batching=BatchingConfig(max_batch_size=4, max_wait_ms=1),
        extract=lambda rec: rec["text"], emit=lambda rec, pred, ver: (rec["id"], pred),
        dead_letter=lambda rec, err: ("DLQ", rec["id"]),
        dead_letters=DeadLetterWatchConfig(warn_share=0.25, max_share=0.25, window=20, min_records=10))
    ctx = Context()
    fn.open(ctx)

    async def go(records):
        return await asyncio.gather(*(fn.async_invoke(r) for r in records), return_exceptions=True)

    try:
        out = asyncio.run(go([{"id": i, "text": "ok"} for i in range(5)] + [{"id": 9}] * 4))
        assert out[5:] == [[("DLQ", 9)]] * 4 and ctx.group.gauges["deadLetterAlarm"]() == 0
        out = asyncio.run(go([{"id": 9}] * 3))  # 6, then 7 dead: more than 0.25 x 20 whatever follows
        assert any(isinstance(o, DeadLetterRateError) for o in out)
        assert ctx.group.gauges["deadLetterAlarm"]() == 1
        assert sum(isinstance(o, DeadLetterRateError) for o in out) == 2
        assert fn._shell.watch.message.startswith("58 % of the last 12 records were dead-lettered, 7 as "
                                                  "inference_error (KeyError: 'text')")
    finally:
        fn.close()


def test_a_record_that_timed_out_counts_once_when_its_inference_ends_later():
    """PyFlink does not cancel a timed-out coroutine: its late result must not count as a second,
    good outcome (an all-timeouts stream would read as 50 % dead letters)."""
    import cloudpickle

    fn = make()
    fn = cloudpickle.loads(cloudpickle.dumps(fn))  # the job graph's copy: the timeout bookkeeping is rebuilt
    ctx = Context()
    fn.open(ctx)
    record = {"id": 1, "text": "slow"}

    async def go():
        task = asyncio.ensure_future(fn.async_invoke(record))
        await asyncio.sleep(0)  # parked in the batcher
        (letter,) = fn.timeout(record)  # what PyFlink's timer does
        return letter, await task

    try:
        letter, late = asyncio.run(go())
    finally:
        fn.close()
    assert letter[:3] == ("DLQ", 1, Reason.INFERENCE_TIMEOUT) and late == []
    assert fn._counts["recordsIn"] == 1 and fn._counts["recordsOut"] == 0 and fn._counts["deadLetters"] == 1
    assert fn._shell.watch._records == 1 and fn._shell.watch._reasons[Reason.INFERENCE_TIMEOUT] == 1
