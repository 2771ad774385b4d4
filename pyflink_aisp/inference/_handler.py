"""The ModelHandler plug-in interface (after Apache Beam's RunInference ModelHandler).

A handler knows how to load one model and how to run it on a batch. Operators
call :meth:`ModelHandler.load_model` once per Python worker in ``open()`` and
:meth:`ModelHandler.run_inference` once per batch, from one thread at a time.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Generic, TypeVar

__all__ = ["ModelHandler"]

ExampleT = TypeVar("ExampleT")
PredictionT = TypeVar("PredictionT")
ModelT = TypeVar("ModelT")


class ModelHandler(abc.ABC, Generic[ExampleT, PredictionT, ModelT]):
    """Loads a model and runs it on batches.

    Subclasses implement the two abstract methods; the rest have defaults.
    A handler is pickled into the job graph, so keep its constructor arguments
    small (paths, checksums, options) and load heavy state in ``load_model``.
    """

    @abc.abstractmethod
    def load_model(self) -> ModelT:
        """Load and return the model (called once per worker, in ``open()``).

        Raises:
            ModelError: the model cannot be loaded or its checksum is wrong.
        """

    @abc.abstractmethod
    def run_inference(self, batch: Sequence[ExampleT], model: ModelT) -> Sequence[PredictionT]:
        """Run the model on ``batch``; return one prediction per example, in order."""

    def model_version(self) -> str:
        """An identifier of the loaded model's version (sha256 by convention)."""
        return "unversioned"

    def example_tokens(self, example: ExampleT, model: ModelT) -> int:
        """Size of one example in tokens, for length buckets and the token budget
        (called per record on the operator's event loop; keep it cheap). Default 1."""
        return 1

    def release_model(self, model: ModelT) -> None:
        """Free the model's resources (called in ``close()``); default: nothing."""
