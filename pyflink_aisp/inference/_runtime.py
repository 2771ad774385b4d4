"""One model and one batcher per Python worker, shared by its operators.

A PyFlink Python worker (one process per TaskManager slot set) may run several
operators that use the same model: a DataStream async operator, a SQL async
scalar function, a pandas UDF. :meth:`ModelRuntime.acquire` returns the
worker's runtime for a ``(handler, batching, swap)`` key, creating it (and
loading the model) on first use; :meth:`ModelRuntime.release` closes it when
its last user closes. All records of all those operators meet in one
:class:`~pyflink_aisp.inference.MicroBatcher`, so batches fill from every
operator, and one copy of the model sits in memory.

Two ways in: per record (:meth:`ModelRuntime.submit` / :meth:`ModelRuntime.infer`,
for async operators: a future per record, batches formed across records) and
per batch (:meth:`ModelRuntime.submit_batch` / :meth:`ModelRuntime.infer_batch`,
for Arrow/pandas operators that already hold many records: the handler
prepares the whole batch once, e.g. one tokenizer call, and the batching thread
cuts it into the model's real batches, sorted by length, within the batch size,
token budget, buckets and OOM cap in force; one future per submitted batch).
Both share the model, the SLO controller, bisection of failing batches and the
metrics.

Pipelined batch path: when ``handler.pipeline_depth(model)`` (read at load and
at each swap) is above 1, the batching thread launches model batches with
``handler.launch_prepared`` and collects them with ``handler.collect_prepared``,
up to that many in flight; :meth:`ModelRuntime.infer_batch` then submits a large
batch as consecutive slices without waiting between them, so preparing (e.g.
tokenizing) slice k+1 on the caller's thread overlaps the device computing slice k.

Hot swap (:class:`~pyflink_aisp.inference.ModelSwapConfig`): a watcher thread
polls the pointer file, loads a new version with ``handler.load_version`` off
the batching thread, and the batching thread swaps it in before its next batch;
each :class:`Inferred` carries the version of the model that produced it. A
batch launched on the old model carries that model and version to its collect
(tagged with the version that launched it); the old model is released once its
last batch in flight is collected.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import AispError, ConfigError, InferenceError, ModelError
from pyflink_aisp.inference._batcher import BatchReport, MicroBatcher
from pyflink_aisp.inference._handler import ModelHandler, Prepared, as_list, pipeline_depth_of, rows_of
from pyflink_aisp.inference._queue import BatchingConfig
from pyflink_aisp.inference._swap import ModelPointer, ModelSwapConfig, read_pointer
from pyflink_aisp.inference.metrics import Window, register_window, version_number

__all__ = ["Inferred", "ModelRuntime", "handler_key"]

#: Rows per slice of :meth:`ModelRuntime.infer_batch` on a pipelined model, in model batches.
SLICE_BATCHES = 2

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inferred:
    """One record's result.

    Attributes:
        prediction: What the handler returned for the record.
        model_version: Version (sha256) of the model that produced it.
    """

    prediction: Any
    model_version: str


@dataclass
class _Swap:
    """Hot-swap state, shared by the watcher and the batching thread."""

    seen: ModelPointer | None = None
    ready: tuple[Any, str] | None = None
    swaps: int = 0
    failures: int = 0
    last_error: str = ""


@dataclass(frozen=True, eq=False)
class _Launched:
    """A model batch launched on ``model`` (of ``version``): collected on the same model."""

    handle: Any
    model: Any
    version: str

    def done(self) -> bool:
        """Whether the handler's handle finished (only called when it has ``done``)."""
        return bool(self.handle.done())

    @property
    def add_done_callback(self) -> Callable[[Callable[[Any], None]], None] | None:
        """The handler's handle's ``add_done_callback`` (a run pool's future), else None: with
        it the batcher launches the next batch beside this one instead of waiting on it."""
        inner = getattr(self.handle, "add_done_callback", None)
        if not callable(inner):
            return None
        return lambda fn: inner(lambda _future: fn(self))

    @property
    def compute_s(self) -> float | None:
        """The handler handle's own ``compute_s`` (a CPU run pool's timed run), else None."""
        own = getattr(self.handle, "compute_s", None)
        return float(own) if isinstance(own, int | float) else None


class ModelRuntime:
    """The worker's model, batcher and hot-swap watcher for one handler.

    Use :meth:`acquire`/:meth:`release`, not the constructor.

    Thread-safety: all public methods may be called from any thread.
    """

    _registry: ClassVar[dict[tuple[str, BatchingConfig, ModelSwapConfig | None], ModelRuntime]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self, handler: ModelHandler[Any, Any, Any], batching: BatchingConfig, swap: ModelSwapConfig | None
    ) -> None:
        self.handler = handler
        self.batching = batching
        self._swap_config = swap
        self._refs = 0
        start = time.perf_counter()
        self._model = handler.load_model()
        self.model_load_ms = (time.perf_counter() - start) * 1000.0
        self.model_version = handler.model_version()
        try:
            self._depth = pipeline_depth_of(handler, self._model)
        except ConfigError:
            handler.release_model(self._model)
            raise
        self._in_flight: dict[int, int] = {}  # id(model) -> its launched batches not yet collected
        self._retired: dict[int, Any] = {}  # swapped-out models released at their last collect
        self._swap = _Swap()
        self._swap_lock = threading.Lock()
        self._stop = threading.Event()
        self.batch_sizes, self.batch_tokens = Window(), Window()
        self.queue_wait_us, self.compute_us = Window(), Window()
        self.batcher: MicroBatcher[Any, Inferred] = MicroBatcher(
            self._run_batch, batching, on_batch=self._on_batch, name="aisp-batcher", run_rows=self._run_rows,
            launch_rows=self._launch_rows, collect=self._collect_rows, pipeline_depth=lambda: self._depth,
            on_oom=lambda: self.handler.on_out_of_memory(self._model))
        self._watcher: threading.Thread | None = None
        if swap is not None:
            self._poll_pointer()  # a pointer published before (re)start wins over the default
            self._watcher = threading.Thread(target=self._watch, name="aisp-model-watch", daemon=True)
            self._watcher.start()

    @classmethod
    def acquire(
        cls,
        handler: ModelHandler[Any, Any, Any],
        batching: BatchingConfig,
        *,
        swap: ModelSwapConfig | None = None,
        key: str | None = None,
    ) -> ModelRuntime:
        """The worker's runtime for this handler and configuration (created and the
        model loaded on first use); pair every call with :meth:`release`.

        Args:
            handler: The model's handler.
            batching: The batcher's config.
            swap: Hot-swap config; None: never swap.
            key: The handler's :func:`handler_key`, computed where the handler was
                built (None: computed here; enough for handlers the standard
                pickle takes).

        Raises:
            ModelError: the model cannot be loaded.
        """
        entry = (key or handler_key(handler), batching, swap)
        with cls._registry_lock:
            runtime = cls._registry.get(entry)
            if runtime is None:
                runtime = cls(handler, batching, swap)
                cls._registry[entry] = runtime
            runtime._refs += 1
            return runtime

    def release(self) -> None:
        """Drop one reference; the last one stops the threads and frees the model."""
        with self._registry_lock:
            self._refs -= 1
            if self._refs > 0:
                return
            for key, runtime in list(self._registry.items()):
                if runtime is self:
                    del self._registry[key]
        self._stop.set()
        self.batcher.close()
        if self._watcher is not None:
            self._watcher.join()
        self._offer(None)  # a version loaded but never swapped in
        self.handler.release_model(self._model)

    def submit(self, example: Any, tokens: int | None = None) -> Future[Inferred]:
        """Queue one example (``tokens`` from ``handler.example_tokens`` when None).

        Raises:
            Exception: whatever ``handler.example_tokens`` raised for a bad example.
            InferenceError: the runtime is released.
        """
        if tokens is None:
            tokens = self.handler.example_tokens(example, self._model)
        return self.batcher.submit(example, tokens)

    async def infer(self, example: Any) -> Inferred:
        """:meth:`submit`, awaited on the running event loop."""
        return await asyncio.wrap_future(self.submit(example))

    def submit_batch(self, examples: Sequence[Any]) -> Future[list[Inferred | BaseException]]:
        """Queue a whole batch (the batch path): ``handler.prepare_batch`` runs once on
        this thread, the batching thread cuts the model batches.

        Args:
            examples: ``n`` examples: a list, an Arrow array or a pandas Series.

        Returns:
            A future of ``n`` outcomes in input order: an :class:`Inferred`, or
            the exception for that example alone (its preparation or its model
            call failed; other examples are unaffected).

        Raises:
            InferenceError: The runtime is released.
        """
        parts = self._prepare_isolating(examples, 0)
        if len(parts) == 1 and isinstance(parts[0][1], Prepared):
            return self.batcher.submit_chunk(parts[0][1], parts[0][1].lengths)
        n = sum(size for _, _, size in parts)
        pending = [(start, size, self.batcher.submit_chunk(prep, prep.lengths))
                   if isinstance(prep, Prepared) else (start, size, prep) for start, prep, size in parts]
        merged: Future[list[Inferred | BaseException]] = Future()
        merged.set_running_or_notify_cancel()

        def stitch() -> list[Inferred | BaseException]:
            out: list[Inferred | BaseException] = [InferenceError("no outcome")] * n
            for start, size, part in pending:
                out[start:start + size] = part.result() if isinstance(part, Future) else [part] * size
            return out

        threading.Thread(target=lambda: merged.set_result(stitch()), name="aisp-stitch", daemon=True).start()
        return merged

    @property
    def pipeline_depth(self) -> int:
        """The serving model's ``handler.pipeline_depth`` (read at load and at each swap)."""
        return self._depth

    def device_uuid(self) -> str | None:
        """``handler.device_uuid`` of the serving model: the device it really runs on
        (``"GPU-..."``/``"MIG-..."``), None on the CPU."""
        return self.handler.device_uuid(self._model)

    def infer_batch(self, examples: Sequence[Any]) -> list[Inferred | BaseException]:
        """:meth:`submit_batch` and wait (blocking; for pandas/Arrow UDFs).

        With a pipelined model (:attr:`pipeline_depth` > 1) a batch of more than
        ``SLICE_BATCHES x max_batch_size`` rows goes through :meth:`infer_batch_pipelined`
        in slices of that size; otherwise in one :meth:`submit_batch` call.
        """
        slice_rows = SLICE_BATCHES * self.batching.max_batch_size
        if self._depth > 1 and len(examples) > slice_rows:
            return self.infer_batch_pipelined(examples, slice_rows)
        return self.submit_batch(examples).result()

    def infer_batch_pipelined(
        self, examples: Sequence[Any], slice_rows: int
    ) -> list[Inferred | BaseException]:
        """Submit ``examples`` as consecutive slices of ``slice_rows`` rows without waiting
        between them, then wait for each in order: preparing slice k+1 on this thread
        overlaps the model running slice k.

        Args:
            examples: ``n`` examples: a list, an Arrow array or a pandas Series.
            slice_rows: Rows per slice (the last may be shorter).

        Returns:
            ``n`` outcomes in input order, as :meth:`submit_batch`'s; a slice that could
            not be submitted (e.g. the runtime was released) fails its own rows only.

        Raises:
            ConfigError: ``slice_rows`` < 1.
        """
        if slice_rows < 1:
            raise ConfigError(f"slice_rows must be >= 1, got {slice_rows}")
        n = len(examples)
        parts: list[tuple[int, Future[list[Inferred | BaseException]] | BaseException]] = []
        for start in range(0, n, slice_rows):
            size = min(slice_rows, n - start)
            try:
                parts.append((size, self.submit_batch(rows_of(examples, start, start + size))))
            except Exception as exc:
                parts.append((size, exc))
        out: list[Inferred | BaseException] = []
        for size, part in parts:
            if isinstance(part, BaseException):
                out.extend([part] * size)
                continue
            try:
                out.extend(part.result())
            except Exception as exc:
                out.extend([exc] * size)
        return out

    def _prepare_isolating(
        self, examples: Sequence[Any], start: int
    ) -> list[tuple[int, Prepared | BaseException, int]]:
        """``(start, prepared or error, size)`` parts covering ``examples``: when
        ``prepare_batch`` raises, halves are prepared again until each bad example
        is alone (the same isolation as failing model batches)."""
        n = len(examples)
        if n == 0:
            return [(start, Prepared([], np.zeros(0, dtype=np.int64)), 0)]
        try:
            prepared = self.handler.prepare_batch(examples, self._model)
            if len(prepared) != n:
                raise InferenceError(f"prepare_batch returned {len(prepared)} rows for {n} examples")
            return [(start, prepared, n)]
        except Exception as exc:
            if n == 1:
                return [(start, exc, 1)]
            items = examples if isinstance(examples, list) else as_list(examples)
            mid = n // 2
            head = self._prepare_isolating(items[:mid], start)
            return head + self._prepare_isolating(items[mid:], start + mid)

    @property
    def swap_state(self) -> _Swap:
        """Hot-swap counters and the last error (read-only use)."""
        return self._swap

    def bind_metrics(self, group: Any) -> None:
        """Register this runtime's gauges (see :mod:`pyflink_aisp.inference.metrics`)
        on a PyFlink metric group."""
        stats, swap = self.batcher.stats, self._swap
        gauges = {
            "batches": lambda: stats.batches, "recordsInferred": lambda: stats.records,
            "inferenceFailures": lambda: stats.failed, "bisections": lambda: stats.bisections,
            "oomSplits": lambda: stats.oom_splits, "modelSwaps": lambda: swap.swaps,
            "modelSwapFailures": lambda: swap.failures,
            "maxBatchSizeKnob": lambda: self.batcher.knobs.max_batch_size,
            "maxWaitUsKnob": lambda: round(self.batcher.knobs.max_wait_ms * 1000),
            "sloP99Us": lambda: round((self.batcher.controller.last_p99_ms or 0.0) * 1000)
            if self.batcher.controller else 0,
            "modelLoadTimeMs": lambda: round(self.model_load_ms),
            "modelVersion": lambda: version_number(self.model_version),
        }
        gauges.update(self.handler.metrics(self._model))  # e.g. a remote handler's requests and retries
        for name, read in gauges.items():
            group.gauge(name, read)
        for name, window in (("batchSize", self.batch_sizes), ("batchTokens", self.batch_tokens),
                             ("queueWaitUs", self.queue_wait_us), ("computeUs", self.compute_us)):
            register_window(group, name, window)

    def _take_ready(self) -> tuple[Any, str] | None:
        with self._swap_lock:
            ready, self._swap.ready = self._swap.ready, None
        return ready

    def _offer(self, ready: tuple[Any, str] | None) -> None:
        """Watcher thread: make ``ready`` the next version (None: none); a version
        loaded earlier but not yet swapped in is released."""
        with self._swap_lock:
            stale, self._swap.ready = self._swap.ready, ready
        if stale is not None:
            self._release_retired(stale[0])

    def _swap_in(self) -> tuple[Any, str]:
        """Batching thread: swap in a ready model version; the model and version to run.
        An old model with batches in flight is released at their last collect."""
        ready = self._take_ready()
        if ready is not None:
            old, self._model = self._model, ready[0]
            previous, self.model_version = self.model_version, ready[1]
            self._depth = pipeline_depth_of(self.handler, self._model, fallback=1)
            self._swap.swaps += 1
            _log.info("model swapped %s -> %s", previous[:12], self.model_version[:12])
            if self._in_flight.get(id(old)):
                self._retired[id(old)] = old
            else:
                self._release_retired(old)
        return self._model, self.model_version

    def _run_batch(self, examples: list[Any]) -> list[Inferred]:
        """Batching thread: one model batch of the per-record path."""
        model, version = self._swap_in()
        return _tag(self.handler.run_inference(examples, model), version)

    def _run_rows(self, prepared: Prepared, rows: npt.NDArray[np.intp]) -> list[Inferred]:
        """Batching thread: one model batch of the batch path (``rows`` of ``prepared``)."""
        model, version = self._swap_in()
        return _tag(self.handler.run_prepared(prepared, rows, model), version)

    def _launch_rows(self, prepared: Prepared, rows: npt.NDArray[np.intp]) -> _Launched:
        """Batching thread: launch one model batch of the batch path on the serving model."""
        model, version = self._swap_in()
        handle = self.handler.launch_prepared(prepared, rows, model)
        self._in_flight[id(model)] = self._in_flight.get(id(model), 0) + 1
        return _Launched(handle, model, version)

    def _collect_rows(self, launched: _Launched) -> list[Inferred]:
        """Batching thread: collect a launched batch on the model that launched it, tagged
        with its version; a retired model is released with its last batch."""
        try:
            return _tag(self.handler.collect_prepared(launched.handle, launched.model), launched.version)
        finally:
            key = id(launched.model)
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]
                retired = self._retired.pop(key, None)
                if retired is not None:
                    self._release_retired(retired)

    def _release_retired(self, model: Any) -> None:
        """Release a model that no longer serves (swapped out, after its last batch; or loaded and
        replaced before it was swapped in); an error is logged, not raised: the batch it computed
        is done (raising here would discard its results and run it again), and the watcher thread
        must keep polling."""
        try:
            self.handler.release_model(model)
        except Exception:
            _log.exception("releasing the swapped-out model failed")

    def _on_batch(self, report: BatchReport) -> None:
        self.batch_sizes.add(report.size)
        self.batch_tokens.add(report.padded_tokens)
        self.queue_wait_us.extend(w * 1e6 for w in report.queue_wait_s)
        self.compute_us.add(report.compute_s * 1e6)

    def _watch(self) -> None:
        assert self._swap_config is not None
        while not self._stop.wait(self._swap_config.poll_interval_s):
            self._poll_pointer()

    def _poll_pointer(self) -> None:
        """Load the pointer's version if it changed; on failure keep the old model."""
        assert self._swap_config is not None
        try:
            pointer = read_pointer(self._swap_config.pointer_path)
        except ModelError as exc:
            self._fail(str(exc))
            return
        if pointer is None or pointer == self._swap.seen:
            return
        self._swap.seen = pointer
        if pointer.sha256 == self.model_version:
            self._offer(None)  # rolled back to the serving version before a swap happened
            return
        try:
            model = self.handler.load_version(pointer.path, pointer.sha256)
        except AispError as exc:
            self._fail(f"refused model {pointer.path} ({pointer.sha256[:12]}): {exc}")
            return
        except Exception as exc:  # a handler's own load error: refuse the version, keep serving
            self._fail(f"refused model {pointer.path} ({pointer.sha256[:12]}): {type(exc).__name__}: {exc}")
            return
        try:
            pipeline_depth_of(self.handler, model)
        except ConfigError as exc:  # refused before it could be swapped in
            self.handler.release_model(model)
            self._fail(f"refused model {pointer.path} ({pointer.sha256[:12]}): {exc}")
            return
        self._offer((model, pointer.sha256))

    def _fail(self, message: str) -> None:
        if message != self._swap.last_error:
            _log.error("model hot swap: %s; still serving %s", message, self.model_version[:12])
            self._swap.failures += 1
        self._swap.last_error = message


def _tag(predictions: Sequence[Any], version: str) -> list[Any]:
    """Each prediction as an :class:`Inferred` of ``version``; an exception a handler returned in
    a prediction's place (one example failed, e.g. its remote request) stays that example's outcome."""
    return [p if isinstance(p, BaseException) else Inferred(p, version) for p in predictions]


def handler_key(handler: ModelHandler[Any, Any, Any]) -> str:
    """Identity of a handler's configuration, for sharing one runtime among the
    operators of a worker: the sha256 of its pickle.

    The copies of one handler that several operators unpickle pickle alike with
    the standard pickle. A handler it cannot serialize by reference (its class
    is defined in the job script, ``__main__``, so it travels by value through
    cloudpickle, as under ``flink run``; or it holds a lambda or a closure) is
    keyed by its cloudpickle, which is stable for one object but not across
    unpickled copies: operators therefore compute the key where the handler is
    built (the job's client) and pass it to :meth:`ModelRuntime.acquire`. A
    handler neither pickler takes is keyed by identity.
    """
    name = type(handler).__qualname__
    try:
        blob = pickle.dumps(handler)
    except Exception:  # PicklingError, AttributeError, TypeError: not importable by reference
        try:
            import cloudpickle

            blob = cloudpickle.dumps(handler)
        except Exception:
            return f"{name}:id:{id(handler)}"
    return f"{name}:{hashlib.sha256(blob).hexdigest()}"
