"""The ModelHandler plug-in interface (after Apache Beam's RunInference ModelHandler).

A handler knows how to load one model and how to run it on a batch. Operators
call :meth:`ModelHandler.load_model` once per Python worker (in ``open()`` of
the first operator that needs it; operators of one worker share the model) and
:meth:`ModelHandler.run_inference` once per batch, from one thread at a time
(the worker's batching thread).

The two abstract methods are Beam's shape (``apache_beam.ml.inference.base.
ModelHandler``); the hooks below have defaults, so a minimal handler is two
methods. :func:`pyflink_aisp.inference.testing.check_model_handler` is a
contract test any handler can run.

The batch path (:meth:`pyflink_aisp.inference.ModelRuntime.infer_batch`, used by
the Arrow operators) calls two more hooks: :meth:`ModelHandler.prepare_batch`
once per submitted batch (e.g. tokenize a whole Arrow column, on the caller's
thread) and :meth:`ModelHandler.run_prepared` once per model batch (rows of that
prepared batch chosen by the batcher). Their defaults fall back to
``example_tokens`` and ``run_inference``, so a two-method handler works on both
paths; a handler that tokenizes overrides them to tokenize once per batch.

A device that computes asynchronously (CUDA) overrides three more:
:meth:`ModelHandler.pipeline_depth` (how many model batches of the batch path may
be in flight), :meth:`ModelHandler.launch_prepared` (start one batch, do not wait)
and :meth:`ModelHandler.collect_prepared` (wait for it). The batching thread then
launches batch n+1 before it collects batch n, so the host prepares and enqueues
the next batch while the device computes. Their defaults run the batch at launch
(:meth:`ModelHandler.run_prepared`), so nothing changes for a handler that leaves
them. :meth:`ModelHandler.on_out_of_memory` frees cached device memory before a
batch that ran out of memory is split and retried, :meth:`ModelHandler.device_uuid`
names the device the model really runs on.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference.tasks import Task

__all__ = ["ModelHandler", "Prepared", "as_list", "pipeline_depth_of", "rows_of"]


def as_list(batch: Sequence[Any]) -> list[Any]:
    """A batch as a list of Python values: Arrow arrays through ``to_pylist()``
    (``list()`` would give Arrow scalars; nulls become None), anything else ``list()``."""
    to_pylist = getattr(batch, "to_pylist", None)
    return list(to_pylist()) if callable(to_pylist) else list(batch)


_log = logging.getLogger(__name__)

ExampleT = TypeVar("ExampleT")
PredictionT = TypeVar("PredictionT")
ModelT = TypeVar("ModelT")


@dataclass(frozen=True, eq=False)
class Prepared:
    """A submitted batch made ready for the model once (e.g. tokenized).

    Attributes:
        payload: The handler's own form of the batch (a ``TokenizedBatch``, the
            list of examples, ...); only the handler reads it.
        lengths: ``(n,)`` int64 size of each example in tokens (after any
            truncation): the batcher sorts and cuts model batches by it.

    Raises:
        ConfigError: ``lengths`` is not one-dimensional or has negative entries.
    """

    payload: Any
    lengths: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        if self.lengths.ndim != 1 or (self.lengths.size and int(self.lengths.min()) < 0):
            raise ConfigError(f"lengths must be a (n,) array of token counts >= 0, got {self.lengths!r}")

    def __len__(self) -> int:
        return int(self.lengths.shape[0])


class ModelHandler(abc.ABC, Generic[ExampleT, PredictionT, ModelT]):
    """Loads a model and runs it on batches.

    Subclasses implement the two abstract methods; the rest have defaults.
    A handler is pickled into the job graph, so keep its constructor arguments
    small (paths, checksums, options) and load heavy state in ``load_model``.

    Attributes:
        accepts_text_pairs: Examples may be ``(text, text_pair)`` tuples of two ``str`` (a
            record mapped with a second text field, for cross-encoders and NLI models); a
            job that maps one refuses, at start-up, a handler that leaves this False.
        prompt_fields: Placeholder names of record fields beside the text that the handler's
            examples carry: each example is then a ``dict`` of name → ``str`` holding ``text``
            (and ``text_pair``) and these; a job whose mapping has prompt fields refuses, at
            start-up, a handler whose names differ (empty here: the handler takes none).
    """

    accepts_text_pairs: ClassVar[bool] = False
    prompt_fields: tuple[str, ...] = ()

    @abc.abstractmethod
    def load_model(self) -> ModelT:
        """Load and return the model (called once per worker, in ``open()``).

        Raises:
            ModelError: the model cannot be loaded or its checksum is wrong.
        """

    @abc.abstractmethod
    def run_inference(self, batch: Sequence[ExampleT], model: ModelT) -> Sequence[PredictionT]:
        """Run the model on ``batch``; return one prediction per example, in order.

        An exception fails the batch; the batcher then bisects it so that only the
        examples that fail alone are dead-lettered. An out-of-memory error (see
        :func:`pyflink_aisp.inference.is_out_of_memory`) also lowers the batch size.
        An exception *returned* in an example's place fails that example alone, without
        bisecting (a remote handler does this for the rows of a request that failed, so
        that no request is made again); its reason is :func:`pyflink_aisp.outcome.reason_of`'s.
        """

    def task(self, *, with_embedding: bool = False) -> Task:
        """What this handler's predictions mean: their output fields and how one renders.

        The Kafka operators (``build_pipeline``) render every prediction with it, SQL
        functions take their row type from its fields. Called where the job is built
        (the client), so keep it cheap and the task small.

        Args:
            with_embedding: The job asked for each record's embedding too
                (``--with-embedding``); a task without an embedding ignores it.

        Default: none declared, which raises: override it to return a
        :class:`~pyflink_aisp.inference.Task` (e.g. the project's
        :class:`~pyflink_aisp.inference.SentimentTask` or
        :class:`~pyflink_aisp.inference.EmbeddingTask`, or your own).

        Raises:
            ConfigError: The handler declares no task (this default).
        """
        raise ConfigError(f"{type(self).__name__} declares no output fields: override "
                          "ModelHandler.task() to return a Task (pyflink_aisp.inference.Task)")

    def model_version(self) -> str:
        """An identifier of the version :meth:`load_model` loads (sha256 by convention)."""
        return "unversioned"

    def load_version(self, path: Path, sha256: str) -> ModelT:
        """Load another version of the model for a hot swap, from ``path``.

        Implementations verify the file against ``sha256`` and check that the
        new model runs (e.g. on one example) before returning it; the operator
        swaps it in between batches and tags later outputs with ``sha256``.

        Raises:
            ChecksumError: the file's sha256 differs from ``sha256``.
            ModelError: the model cannot be loaded or fails its check, or the
                handler does not support hot swap (this default).
        """
        raise ModelError(f"{type(self).__name__} does not support model hot swap (asked for {path})")

    def example_tokens(self, example: ExampleT, model: ModelT) -> int:
        """Size of one example in tokens, for length buckets and the token budget
        (called per record on the operator's thread; keep it cheap). Default 1."""
        return 1

    def prepare_batch(self, batch: Sequence[ExampleT], model: ModelT) -> Prepared:
        """Make a submitted batch ready for the model, once (batch path only).

        Called on the submitting thread, so it overlaps the model running
        earlier batches. Default: the examples as a list, lengths from
        :meth:`example_tokens`. Override to tokenize the whole batch in one call.

        Args:
            batch: ``n`` examples (a list, an Arrow array or a pandas Series).

        Returns:
            A :class:`Prepared` of ``n`` rows.

        Raises:
            Exception: for a bad example; the runtime then prepares smaller
                parts so that only the bad examples fail.
        """
        examples = as_list(batch)
        lengths = np.fromiter((self.example_tokens(x, model) for x in examples), dtype=np.int64,
                              count=len(examples))
        return Prepared(examples, lengths)

    def run_prepared(
        self, prepared: Prepared, rows: npt.NDArray[np.intp], model: ModelT
    ) -> Sequence[PredictionT]:
        """Run the model on ``rows`` of a prepared batch: one model batch, exactly
        as the batcher formed it (no further splitting).

        Args:
            prepared: From :meth:`prepare_batch`.
            rows: ``(k,)`` row indices into ``prepared``, in the order results are wanted.

        Returns:
            ``k`` predictions, in the order of ``rows``.

        Default: :meth:`run_inference` on those examples of the payload list.
        """
        examples = prepared.payload
        return self.run_inference([examples[i] for i in rows.tolist()], model)

    def pipeline_depth(self, model: ModelT) -> int:
        """How many model batches of the batch path the batching thread may have launched
        (:meth:`launch_prepared`) and not yet collected (:meth:`collect_prepared`).

        Read when the model loads and after each hot swap. 1 (this default): each batch
        is launched and collected at once, :meth:`run_prepared` called and waited for.
        A CUDA handler returns 2 or 3: batch n+1 is padded, copied and enqueued while
        batch n computes. The per-record path (:meth:`run_inference`) is always synchronous.

        Returns:
            An ``int >= 1``.
        """
        return 1

    def launch_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: ModelT) -> Any:
        """Start one model batch of the batch path without waiting for its results.

        Called on the batching thread, at most :meth:`pipeline_depth` batches ahead of
        :meth:`collect_prepared`; each handle is collected exactly once, in launch order.
        A CUDA handler pads into pinned host buffers, copies them on a copy stream,
        enqueues the forward and the device-to-host copy of its outputs and records an
        event; the buffers of a batch in flight must not be reused by the next launch.

        Args:
            prepared: From :meth:`prepare_batch`.
            rows: ``(k,)`` row indices into ``prepared``, in the order results are wanted.

        Returns:
            A handle for :meth:`collect_prepared` (the handler's own object).
            Default: the ``k`` predictions of :meth:`run_prepared` (computed now).

        Raises:
            Exception: the batch cannot be launched; the batcher then runs its rows
                synchronously (launch and collect), bisecting failures as for
                :meth:`run_inference`.
        """
        return self.run_prepared(prepared, rows, model)

    def collect_prepared(self, handle: Any, model: ModelT) -> Sequence[PredictionT]:
        """Wait for a batch started by :meth:`launch_prepared` and return its results.

        Args:
            handle: What :meth:`launch_prepared` returned.
            model: The model the batch was launched on.

        Returns:
            The batch's ``k`` predictions, in the order of its ``rows``.
            Default: ``handle`` itself (the default launch computed it).

        Raises:
            Exception: the batch failed (e.g. CUDA out of memory); handled as a launch that raised.
        """
        return handle  # type: ignore[no-any-return]

    def on_out_of_memory(self, model: ModelT) -> None:
        """Called on the batching thread after a model call ran out of memory
        (:func:`~pyflink_aisp.inference.is_out_of_memory`), once the failed batch's
        references (the frames of its traceback) are dropped and before it is split
        and retried. A torch handler calls ``torch.cuda.empty_cache()``. Default: nothing.
        An exception raised here is logged and ignored."""

    def device_uuid(self, model: ModelT) -> str | None:
        """The UUID of the device the loaded model actually runs on, as NVML writes it
        (``"GPU-xxxxxxxx-..."``, or ``"MIG-..."`` for a MIG instance); None on the CPU
        (this default). The operator compares it with its GPU affinity lease's UUID."""
        return None

    def batch_byte_size(self, batch: Sequence[ExampleT]) -> int:
        """Approximate bytes of ``batch`` as the model receives it (for metrics);
        default: the UTF-8 length of ``str`` examples, else 0."""
        return sum(len(x.encode("utf-8", "replace")) for x in batch if isinstance(x, str))

    def device(self) -> str:
        """Where the model runs, e.g. ``"cpu"`` or ``"cuda:0"`` (reported in metrics;
        never changed behind the user's back). Default ``"cpu"``."""
        return "cpu"

    def metrics(self, model: ModelT) -> dict[str, Callable[[], int]]:
        """The handler's own gauges over ``model``, ``{name: read}`` (read returns an int), added
        to the runtime's in the operator's metric group when it opens; default none."""
        return {}

    def release_model(self, model: ModelT) -> None:
        """Free the model's resources (called when the last operator using it closes,
        or for the old model after a hot swap); default: nothing."""


def rows_of(examples: Sequence[Any], start: int, stop: int) -> Sequence[Any]:
    """Rows ``start:stop`` of a list, an Arrow array or a pandas Series (by position)."""
    iloc = getattr(examples, "iloc", None)
    return iloc[start:stop] if iloc is not None else examples[start:stop]  # type: ignore[no-any-return]


def pipeline_depth_of(handler: ModelHandler[Any, Any, Any], model: Any, fallback: int | None = None) -> int:
    """``handler.pipeline_depth(model)``, checked to be an int >= 1.

    Raises:
        ConfigError: It is not, or the hook raised (unless ``fallback`` is given: then
            that is returned, and the problem logged).
    """
    name = type(handler).__name__
    cause: Exception | None = None
    try:
        depth = handler.pipeline_depth(model)
    except Exception as exc:  # a handler's own hook: report it as a configuration problem
        message, cause = f"{name}.pipeline_depth raised {type(exc).__name__}: {exc}", exc
    else:
        if not isinstance(depth, bool) and isinstance(depth, int) and depth >= 1:
            return depth
        message, cause = f"{name}.pipeline_depth must return an int >= 1, got {depth!r}", None
    if fallback is None:
        raise ConfigError(message) from cause
    _log.error("%s; using %d", message, fallback)
    return fallback
