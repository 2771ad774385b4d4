"""The client's fail-fast on --max-dead-letter-rate: the watch's line found in Flink's exception
history in both shapes, the job cancelled once, REST hiccups survived."""

from __future__ import annotations

import traceback

import pytest

from pyflink_aisp.errors import DeadLetterRateError, EnvironmentSetupError
from pyflink_aisp.pipeline import _failfast
from pyflink_aisp.pipeline._failfast import check_dead_letter_rate, dead_letter_line, wait_failing_fast

LINE = ("100 % of the last 640 records were dead-lettered, 640 as missing_text (no 'text' field; the "
        "object's fields: 'body', 'review_id'): the job reads ... (above --max-dead-letter-rate 0.5 of 1000 "
        "records)")


def _java_trace(python_error: BaseException) -> str:
    """A Python traceback inside a Java stack trace, as the REST API's exception history has it."""
    text = "".join(traceback.format_exception(python_error))
    return ("org.apache.flink.runtime.JobException: Recovery is suppressed ...\nCaused by: "
            "java.lang.RuntimeException: Error received from SDK harness for instruction 4: " + text +
            "\n\tat org.apache.beam.runners.fnexecution.control.FnApiControlClient...")


def test_the_arrow_operators_plain_error_and_the_async_operators_wrapped_one_are_both_read():
    plain = _java_trace(DeadLetterRateError(LINE))
    # PyFlink's async runner: Exception("Error happens inside the class ...", error), no chain
    wrapped = _java_trace(Exception("Error happens inside the class BatchedInferenceFunction during handling "
                                    "input Row(...)", DeadLetterRateError(LINE)))
    assert "DeadLetterRateError: " not in wrapped.split("Exception: (")[-1]
    assert dead_letter_line(plain) == LINE
    assert dead_letter_line(wrapped) == LINE
    assert dead_letter_line(_java_trace(RuntimeError("CUDA error"))) is None


class FakeRest:
    def __init__(self, states: list[str], traces: list[list[str]], cancel_fails: bool = False) -> None:
        self.states, self.traces, self.cancel_fails = states, traces, cancel_fails
        self.cancelled: list[str] = []

    def state(self, rest: str, job_id: str) -> str:
        value = self.states.pop(0)
        if value == "silent":
            raise EnvironmentSetupError("the Flink REST API did not answer")
        return value

    def exceptions(self, rest: str, job_id: str) -> list[str]:
        return self.traces.pop(0) if self.traces else []

    def cancel(self, rest: str, job_id: str) -> None:
        if self.cancel_fails:
            raise EnvironmentSetupError("409: job is not running")
        self.cancelled.append(job_id)


@pytest.fixture
def rest(monkeypatch):
    def install(fake: FakeRest) -> FakeRest:
        monkeypatch.setattr(_failfast, "job_state", fake.state)
        monkeypatch.setattr(_failfast, "job_exceptions", fake.exceptions)
        monkeypatch.setattr(_failfast, "cancel_job", fake.cancel)
        return fake
    return install


def test_the_first_dead_letter_rate_failure_cancels_the_job_and_raises_its_line(rest):
    traces = [[], [_java_trace(RuntimeError("other"))], [_java_trace(DeadLetterRateError(LINE))]]
    fake = rest(FakeRest(["RUNNING", "silent", "RESTARTING", "RESTARTING"], traces))
    with pytest.raises(DeadLetterRateError) as info:
        wait_failing_fast("http://jm", "j1", sleep=lambda s: None)
    assert str(info.value) == f"job j1 cancelled: {LINE}" and fake.cancelled == ["j1"]


def test_a_job_that_failed_for_good_between_polls_still_gives_the_line(rest):
    fake = rest(FakeRest(["FAILED"], [[_java_trace(DeadLetterRateError(LINE))]], cancel_fails=True))
    with pytest.raises(DeadLetterRateError, match=f"^job j2 failed: {LINE[:20]}"):
        wait_failing_fast("http://jm", "j2", sleep=lambda s: None)
    assert fake.cancelled == []


def test_a_job_that_ends_otherwise_returns_and_a_silent_rest_api_is_given_up_on(rest):
    rest(FakeRest(["RUNNING", "FINISHED"], [[], []]))
    wait_failing_fast("http://jm", "j3", sleep=lambda s: None)  # no error: the caller's wait() decides
    rest(FakeRest(["silent"] * 5, []))
    wait_failing_fast("http://jm", "j4", poll_s=1.0, give_up_s=3.0, sleep=lambda s: None)


def test_check_ignores_other_failures(rest):
    rest(FakeRest([], [[_java_trace(RuntimeError("CircuitOpenError: ..."))]]))
    check_dead_letter_rate("http://jm", "j5")
