"""The local standalone cluster and broker, started once for all e2e tests (free ports, temp state)."""

import pytest

from pyflink_aisp.local import LocalStack


@pytest.fixture(scope="session")
def stack(tmp_path_factory, stack_config):
    stack = LocalStack(stack_config(tmp_path_factory.mktemp("e2e")))
    try:
        stack.up()
    except Exception:
        stack.down()  # what started must not run on beside the other tests
        raise
    yield stack
    stack.down()
