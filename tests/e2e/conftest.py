"""The local standalone cluster and broker, started once for all e2e tests (free ports, temp state)."""

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pyflink_aisp.local import LocalStack, LocalStackConfig


@contextmanager
def _running(config: LocalStackConfig) -> Iterator[LocalStack]:
    """A stack up for the ``with`` block, down after it; when ``up`` fails, what it started is
    stopped before the error propagates (it must not run on beside the other tests)."""
    stack = LocalStack(config)
    try:
        stack.up()
    except Exception:
        stack.down()
        raise
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="session")
def running_stack():
    """``with running_stack(config) as stack:`` (:func:`_running`) for fixtures of their own stacks."""
    return _running


@pytest.fixture(scope="session")
def stack(tmp_path_factory, stack_config):
    with _running(stack_config(tmp_path_factory.mktemp("e2e"))) as stack:
        yield stack
