"""Fail fast on ``--max-dead-letter-rate``: the submitting client cancels a job whose
dead-letter watch failed it, instead of letting the restart strategy replay the same
records into the same failure until its attempts are spent.

The job's :class:`~pyflink_aisp.errors.DeadLetterRateError` reaches the client only as
text, in the Flink REST API's exception history (``/jobs/:jobid/exceptions``): a
Python traceback in a Java stack trace. The Arrow operator's error ends that traceback
as ``...DeadLetterRateError: <line>``; PyFlink's async operator wraps it first, so its
traceback ends ``Exception: ('Error happens inside ...', DeadLetterRateError('<line>'))``.
:func:`dead_letter_line` reads both.
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Callable

from pyflink_aisp.alignment import cancel_job, job_exceptions, job_state
from pyflink_aisp.errors import DeadLetterRateError, EnvironmentSetupError

__all__ = ["check_dead_letter_rate", "dead_letter_line", "wait_failing_fast"]

#: Flink job states after which a job does not run again (``JobStatus.isGloballyTerminalState``).
TERMINAL = frozenset({"FINISHED", "CANCELED", "FAILED"})
_PLAIN = re.compile(r"DeadLetterRateError: (.+)")
_WRAPPED = re.compile(r"DeadLetterRateError\((?P<literal>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\)")


def dead_letter_line(trace: str) -> str | None:
    """The watch's line in a failure's stack trace, or None when it is another failure."""
    wrapped = _WRAPPED.search(trace)
    if wrapped is not None:
        try:
            return str(ast.literal_eval(wrapped.group("literal")))
        except (ValueError, SyntaxError):
            return wrapped.group("literal")[1:-1]
    plain = _PLAIN.search(trace)
    return None if plain is None else plain.group(1).strip()


def check_dead_letter_rate(rest: str, job_id: str) -> None:
    """Cancel the job and raise if one of its failures so far is a dead-letter-rate failure.

    Raises:
        DeadLetterRateError: It is (the job is cancelled, or the cancel was refused because
            the job had ended by itself).
        EnvironmentSetupError: The REST API did not answer.
    """
    for trace in job_exceptions(rest, job_id):
        line = dead_letter_line(trace)
        if line is None:
            continue
        try:
            cancel_job(rest, job_id)
        except EnvironmentSetupError:  # already FAILED (its restarts spent) or CANCELED
            raise DeadLetterRateError(f"job {job_id} failed: {line}") from None
        raise DeadLetterRateError(f"job {job_id} cancelled: {line}")


def wait_failing_fast(rest: str, job_id: str, *, poll_s: float = 1.0, give_up_s: float = 60.0,
                      sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait for the job to end, checking its failures each ``poll_s``. A REST API that does not
    answer is asked again at the next poll; after ``give_up_s`` of silence this returns (the
    caller then waits for the job without the check).

    Raises:
        DeadLetterRateError: The job failed on ``--max-dead-letter-rate`` (see
            :func:`check_dead_letter_rate`).
    """
    silent = 0.0
    while silent < give_up_s:
        try:
            ended = job_state(rest, job_id) in TERMINAL
            check_dead_letter_rate(rest, job_id)  # after the state: a job that just FAILED is read too
            silent = 0.0
        except EnvironmentSetupError:
            ended, silent = False, silent + poll_s  # a JobManager failover or a slow answer
        if ended:
            return
        sleep(poll_s)
