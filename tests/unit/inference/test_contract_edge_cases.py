"""Edge cases found by breaking: check_model_handler false failures (no services)."""

from __future__ import annotations

import numpy as np

from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.testing import check_model_handler


class _Fixed(ModelHandler[str, object, None]):
    """A deterministic handler whose output per example comes from a table."""

    def __init__(self, table: dict) -> None:
        self._table = table

    def load_model(self) -> None:
        return None

    def run_inference(self, batch, model):  # type: ignore[no-untyped-def]
        return [self._table[x] for x in batch]


def test_equal_infinite_outputs_pass() -> None:
    """Log-probabilities with -inf (an impossible class) are identical alone and in
    the batch, yet the contract fails: inf - inf = nan > atol ("max abs difference nan")."""
    table = {"a": np.array([0.0, -np.inf]), "b": np.array([-np.inf, 0.0])}
    check_model_handler(_Fixed(table), ["a", "b"])


def test_equal_boolean_array_outputs_pass() -> None:
    """Multi-label masks as numpy bool arrays: `==` gives an array and the check
    reports 'cannot compare ndarray with ==' although the outputs are equal."""
    table = {"a": np.array([True, False]), "b": np.array([False, True])}
    check_model_handler(_Fixed(table), ["a", "b"])


def test_equal_string_array_outputs_pass() -> None:
    table = {"a": np.array(["x", "y"]), "b": np.array(["y", "x"])}
    check_model_handler(_Fixed(table), ["a", "b"])
