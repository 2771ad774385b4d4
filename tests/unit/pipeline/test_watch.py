"""The dead-letter watch: one line when most records are dead letters, a gauge, and the optional failure."""

from __future__ import annotations

import logging

import pytest

from pyflink_aisp.errors import ConfigError, DeadLetterRateError
from pyflink_aisp.kafka import KafkaCoordinates, decode_review
from pyflink_aisp.outcome import DeadLettered, Reason
from pyflink_aisp.pipeline._watch import DeadLetterWatch, DeadLetterWatchConfig, likely_fix

SRC = KafkaCoordinates(topic="reviews", partition=0, offset=7)


def _foreign(n: int) -> list[DeadLettered]:
    """Dead letters of records of another shape, {"review_id", "body", "lang"}."""
    letters = [decode_review(b'{"review_id": "r1", "body": "fine", "lang": "en"}', SRC) for _ in range(n)]
    assert all(isinstance(d, DeadLettered) for d in letters)
    return letters  # type: ignore[return-value]


def test_a_topic_of_another_shape_gives_one_line_naming_the_reason_the_fields_and_the_fix(caplog):
    watch = DeadLetterWatch()
    with caplog.at_level(logging.WARNING, logger="pyflink_aisp.dead_letters"):
        for _ in range(10):  # 10 Arrow batches of 64: judged from the 100th record on
            watch.record(64, _foreign(64))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1  # one line when the alarm starts, not one per batch
    assert lines[0].startswith("100 % of the last 128 records were dead-lettered, 128 as missing_text "
                               "(no 'text' field; the object's fields: 'body', 'lang', 'review_id'): ")
    assert lines[0].endswith(likely_fix(Reason.MISSING_TEXT))
    assert watch.alarm and watch.last_share == 1.0 and watch.message.startswith("100 % of the last 640")


def test_below_the_share_or_before_min_records_it_stays_quiet(caplog):
    watch = DeadLetterWatch(DeadLetterWatchConfig(window=1000, min_records=100))
    with caplog.at_level(logging.WARNING, logger="pyflink_aisp.dead_letters"):
        watch.record(99, _foreign(99))  # all dead, but not yet 100 records in the window
        assert not watch.alarm and watch.last_share == 0.0
        watch.record(101, [])  # 99 of 200: 49.5 % is not above 50 %
    assert not watch.alarm and watch.last_share == pytest.approx(0.495) and caplog.records == []


def test_the_alarm_clears_when_a_window_ends_at_or_below_the_share(caplog):
    watch = DeadLetterWatch(DeadLetterWatchConfig(window=200, min_records=100))
    with caplog.at_level(logging.WARNING, logger="pyflink_aisp.dead_letters"):
        watch.record(200, _foreign(200))  # window 1: all dead → alarm, then the window rolls
        assert watch.alarm
        watch.record(200, _foreign(20))  # window 2: 10 % → cleared
    assert not watch.alarm and watch.last_share == pytest.approx(0.1)
    assert [r.getMessage() for r in caplog.records][1] == "dead letters back to 10 % of the last 200 records"


def test_above_max_share_of_a_window_it_fails_the_job_with_the_line_and_names_the_others():
    watch = DeadLetterWatch(DeadLetterWatchConfig(warn_share=0.5, max_share=0.5, window=100, min_records=10))
    tombstone = decode_review(None, SRC)
    assert isinstance(tombstone, DeadLettered)
    with pytest.raises(DeadLetterRateError) as info:
        watch.record(100, [*_foreign(60), tombstone])
    text = str(info.value)
    assert text.startswith("61 % of the last 100 records were dead-lettered, 60 as missing_text (")
    assert "; also null_value 1: " in text
    assert text.endswith("(above --max-dead-letter-rate 0.5 of 100 records)")


def test_a_burst_early_in_a_window_does_not_fail_the_job_until_the_window_cannot_end_below_the_limit():
    config = DeadLetterWatchConfig(warn_share=0.5, max_share=0.5, window=1000, min_records=100)
    watch = DeadLetterWatch(config)
    watch.record(100, _foreign(100))  # 100 of 100: warned, but 900 good records could still follow
    assert watch.alarm
    watch.record(400, _foreign(400))  # 500 of 1000 at most: not above half
    with pytest.raises(DeadLetterRateError, match="501 as missing_text"):
        watch.record(1, _foreign(1))  # 501: above half of the window whatever comes next


def test_a_multi_line_error_detail_stays_one_line():
    letter = DeadLettered(reason=Reason.INFERENCE_ERROR, detail="RuntimeError: ONNX failed\n  at node 3\n")
    watch = DeadLetterWatch()
    watch.record(100, [letter] * 100)
    assert "\n" not in watch.message and "(RuntimeError: ONNX failed at node 3)" in watch.message


def test_threads_that_record_at_once_lose_no_count():
    import threading

    watch = DeadLetterWatch(DeadLetterWatchConfig(window=2, min_records=1))
    errors: list[BaseException] = []

    def hammer() -> None:
        try:
            for _ in range(2000):
                watch.record(1, _foreign(1))
        except BaseException as exc:  # any error is the failure this test looks for
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and watch.alarm and watch.last_share == 1.0


def test_every_reason_has_a_fix():
    assert len({likely_fix(r) for r in Reason}) >= 10
    assert all(likely_fix(r) != "see the dead letters' detail" for r in Reason)


@pytest.mark.parametrize("fields", [{"warn_share": 1.0}, {"max_share": -0.1}, {"min_records": 0},
                                    {"min_records": 11, "window": 10}])
def test_a_config_that_cannot_work_is_refused(fields):
    with pytest.raises(ConfigError):
        DeadLetterWatchConfig(**fields)
