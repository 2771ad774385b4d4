"""The launch path of the PyTorch handlers: pad into reused host buffers, copy, compute, copy back.

A :class:`DeviceRunner` turns rows of a :class:`~pyflink_aisp.tokenize.TokenizedBatch` into the
outputs of a forward function, in two steps that can be apart in time:

- :meth:`DeviceRunner.launch` takes a free *slot* (host buffers, device buffers, two events),
  pads the rows into the slot's host buffers (page-locked on CUDA) in the shapes of the
  :class:`~pyflink_aisp.inference.handlers._torch_device.ShapePolicy`, copies them to the slot's
  device buffers on a copy stream (``non_blocking``) and records the *copied* event; on a
  compute stream that waits for that event it runs the forward pass(es), copies the outputs into
  the slot's host output buffers (``non_blocking``) and records the *done* event. Nothing waits
  for the device.
- :meth:`DeviceRunner.collect` waits for the *done* event, copies the outputs out of the slot and
  gives the slot back.

A slot is never reused while its batch is in flight: slots are taken from a free list and
returned by :meth:`~DeviceRunner.collect` only. Launches through :meth:`DeviceRunner.launch`
are limited to ``depth + 1`` in flight (a ring of ``depth + 1`` slots); a handle dropped without
being collected gives its slot back at the next launch, after its *done* event.

Padding: right padding; sequence ``i`` of a pass has its tokens, ``attention_mask`` 1 on them,
``pad_id`` / ``pad_type_id`` elsewhere; the rows that only pad the batch dimension hold one
attended pad token (a valid mask, so no row's softmax runs over nothing) and their outputs are
dropped.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import InferenceError
from pyflink_aisp.inference.handlers._torch_device import (
    DeviceOps,
    ShapePolicy,
    TorchDeviceOptions,
    default_ops,
)
from pyflink_aisp.tokenize import ArrowTokenizer, TokenizedBatch

__all__ = ["DeviceRunner", "ForwardFn", "LaunchHandle", "TorchDeviceHooks", "make_runner", "pad_rows_into"]

#: ``(input_ids, attention_mask, token_type_ids)``, each ``(batch, seq_len)`` int64 on the device,
#: to the outputs, each ``(batch, ...)`` on the device (row ``i`` belongs to input row ``i``).
ForwardFn = Callable[[Any, Any, Any], Sequence[Any]]
_INPUTS = 3  # input_ids, attention_mask, token_type_ids


def pad_rows_into(
    tokens: TokenizedBatch,
    rows: npt.NDArray[np.int64],
    out: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]],
    *,
    pad_id: int,
    pad_type_id: int,
) -> None:
    """Right-pad ``rows`` of ``tokens`` into ``(batch, seq_len)`` arrays (``batch >= len(rows)``).

    Args:
        tokens: Tokenizer output.
        rows: ``(k,)`` rows of ``tokens``, in the order of the output rows.
        out: ``input_ids``, ``attention_mask``, ``token_type_ids``: ``(batch, seq_len)`` int64,
            written in full; rows ``k..batch`` get one attended pad token.
        pad_id: Id at pad positions.
        pad_type_id: Type id at pad positions.

    Raises:
        InferenceError: A row is longer than ``seq_len``, or ``batch < k``.
    """
    ids, mask, types = out
    batch, seq_len = ids.shape
    offsets = tokens.offsets.astype(np.int64)
    lengths = offsets[rows + 1] - offsets[rows]
    k = len(rows)
    if k > batch or (k and int(lengths.max()) > seq_len):
        raise InferenceError(f"{k} rows of up to {int(lengths.max()) if k else 0} tokens do not fit "
                             f"({batch}, {seq_len})")
    ids.fill(pad_id)
    mask.fill(0)
    types.fill(pad_type_id)
    keep = np.arange(seq_len, dtype=np.int64)[None, :] < lengths[:, None]
    row_first = np.cumsum(lengths) - lengths
    index = np.repeat(offsets[rows] - offsets[0] - row_first, lengths) + np.arange(int(lengths.sum()))
    ids[:k][keep] = tokens.flat_ids[index]
    mask[:k][keep] = 1
    mask[k:, 0] = 1
    constant = tokens.type_id_constant
    if constant is None:
        types[:k][keep] = tokens.flat_type_ids[index]
    elif constant != pad_type_id:
        types[:k][keep] = constant


@dataclasses.dataclass(frozen=True)
class _Pass:
    """One forward pass: rows ``start:stop`` of the launch, padded to ``(batch, seq_len)`` at
    element ``offset`` of the flat buffers."""

    start: int
    stop: int
    batch: int
    seq_len: int
    offset: int

    @property
    def numel(self) -> int:
        return self.batch * self.seq_len


class _Slot:
    """Buffers and events of one batch in flight (grown, never shrunk)."""

    def __init__(self, ops: DeviceOps) -> None:
        self.ops = ops
        self.capacity = 0
        self.host: list[Any] = []
        self.views: list[npt.NDArray[np.int64]] = []
        self.device: list[Any] = []
        self.outputs: list[Any] = []
        self.copied = ops.new_event()
        self.done = ops.new_event()
        self.owner: weakref.ref[LaunchHandle] | None = None
        self.counted = False

    def ensure_inputs(self, torch: Any, numel: int) -> None:
        if numel <= self.capacity:
            return
        self.host = [self.ops.host_buffer((numel,), torch.int64) for _ in range(_INPUTS)]
        self.views = [buffer.numpy() for buffer in self.host]
        self.device = [self.ops.device_buffer(numel, torch.int64) for _ in range(_INPUTS)]
        self.capacity = numel

    def output(self, index: int, like: Any, rows: int) -> Any:
        """The host buffer of output ``index``: at least ``rows`` rows shaped as ``like``'s rows."""
        trailing = tuple(like.shape[1:])
        if index < len(self.outputs):
            buffer = self.outputs[index]
            if tuple(buffer.shape[1:]) == trailing and buffer.dtype == like.dtype and buffer.shape[0] >= rows:
                return buffer
        buffer = self.ops.host_buffer((rows, *trailing), like.dtype)
        if index < len(self.outputs):
            self.outputs[index] = buffer
        else:
            self.outputs.append(buffer)
        return buffer


class LaunchHandle:
    """A launched batch; pass it to :meth:`DeviceRunner.collect` exactly once.

    Attributes:
        rows: Rows of the batch (``k``).
        shapes: ``(batch, seq_len)`` of each forward pass.
    """

    __slots__ = ("__weakref__", "_outputs", "_slot", "rows", "shapes")

    def __init__(self, slot: _Slot, rows: int, outputs: int, shapes: tuple[tuple[int, int], ...]) -> None:
        self._slot: _Slot | None = slot
        self._outputs = outputs
        self.rows = rows
        self.shapes = shapes


class DeviceRunner:
    """Launch / collect of one forward function on one device (see the module docstring).

    Thread-safety: :meth:`launch` and :meth:`collect` are for one thread (the runtime's batching
    thread); :meth:`run` and :meth:`run_many` may be called from any thread (each call uses slots
    of its own and does not count against ``depth``).

    Args:
        forward: The model; called on the compute stream under ``torch.inference_mode``.
        ops: The device's operations.
        policy: Shapes of the forward passes.
        depth: Batches :meth:`launch` may have in flight is ``depth + 1`` at most.
        pad_id: Id of pad positions.
        pad_type_id: Type id of pad positions.
    """

    def __init__(
        self,
        forward: ForwardFn,
        *,
        ops: DeviceOps,
        policy: ShapePolicy,
        depth: int,
        pad_id: int,
        pad_type_id: int,
    ) -> None:
        self.forward = forward
        self.ops = ops
        self.policy = policy
        self.depth = depth
        self._pad = (pad_id, pad_type_id)
        self._copy_stream = ops.new_stream()
        self._compute_stream = ops.new_stream()
        self._lock = threading.Lock()
        self._free: list[_Slot] = []
        self._busy: list[_Slot] = []
        self._launched = 0
        #: ``(batch, seq_len)`` -> forward passes run in that shape.
        self.shapes: collections.Counter[tuple[int, int]] = collections.Counter()

    @property
    def in_flight(self) -> int:
        """Batches launched by :meth:`launch` and not collected."""
        return self._launched

    @property
    def slots(self) -> int:
        """Slots allocated so far (free and busy)."""
        return len(self._free) + len(self._busy)

    def launch(self, tokens: TokenizedBatch, rows: npt.NDArray[np.integer]) -> LaunchHandle:
        """Start one batch of ``rows`` (``k >= 1``) without waiting for the device.

        Raises:
            InferenceError: ``depth + 1`` batches are already in flight, or no rows.
            Exception: What padding or the forward function raise while enqueuing (e.g. CUDA
                out-of-memory); the slot is given back first.
        """
        return self._launch(tokens, rows, counted=True)

    def collect(self, handle: LaunchHandle) -> tuple[npt.NDArray[Any], ...]:
        """Wait for a launched batch and return its outputs: ``(k, ...)`` host arrays (copies) in
        the order of its rows.

        Raises:
            InferenceError: The handle was collected already.
            Exception: An error the device reports at the wait (the slot is given back).
        """
        slot = handle._slot
        if slot is None:
            raise InferenceError("this launched batch was collected already")
        handle._slot = None
        try:
            self.ops.synchronize(slot.done)
            return tuple(np.array(buffer[: handle.rows].numpy(), copy=True)
                         for buffer in slot.outputs[: handle._outputs])
        finally:
            self._release(slot)

    def run(self, tokens: TokenizedBatch, rows: npt.NDArray[np.integer]) -> tuple[npt.NDArray[Any], ...]:
        """:meth:`launch` then :meth:`collect` (not counted against ``depth``)."""
        return self.collect(self._launch(tokens, rows, counted=False))

    def run_many(
        self, tokens: TokenizedBatch, parts: Sequence[npt.NDArray[np.intp]]
    ) -> Iterator[tuple[npt.NDArray[np.intp], tuple[npt.NDArray[Any], ...]]]:
        """``(rows, outputs)`` of each part in order, with up to ``depth`` parts in flight."""
        pending: collections.deque[tuple[npt.NDArray[np.intp], LaunchHandle]] = collections.deque()
        try:
            for rows in parts:
                pending.append((rows, self._launch(tokens, rows, counted=False)))
                if len(pending) >= self.depth:
                    done, handle = pending.popleft()
                    yield done, self.collect(handle)
            while pending:
                done, handle = pending.popleft()
                yield done, self.collect(handle)
        finally:
            for _, handle in pending:  # an error or an early stop: wait for and free the rest
                with contextlib.suppress(Exception):
                    self.collect(handle)

    def close(self) -> None:
        """Drop the buffers of the free slots (busy ones are dropped when collected)."""
        with self._lock:
            self._free.clear()

    # -- slots -----------------------------------------------------------------------------------

    def _acquire(self, counted: bool) -> _Slot:
        with self._lock:
            for slot in [s for s in self._busy if s.owner is not None and s.owner() is None]:
                self.ops.synchronize(slot.done)  # dropped without collect: reclaim once done
                self._give_back(slot)
            if counted and self._launched >= self.depth + 1:
                raise InferenceError(f"{self._launched} model batches are in flight, the most pipeline depth "
                                     f"{self.depth} allows; collect one before launching another")
            slot = self._free.pop() if self._free else _Slot(self.ops)
            slot.owner, slot.counted = None, counted
            self._busy.append(slot)
            self._launched += counted
            return slot

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            self._give_back(slot)

    def _give_back(self, slot: _Slot) -> None:
        self._busy.remove(slot)
        self._launched -= slot.counted
        slot.owner, slot.counted = None, False
        self._free.append(slot)

    # -- one launch ------------------------------------------------------------------------------

    def _launch(
        self, tokens: TokenizedBatch, rows: npt.NDArray[np.integer], *, counted: bool
    ) -> LaunchHandle:
        import torch

        selected = np.asarray(rows, dtype=np.int64)
        if selected.ndim != 1 or not len(selected):
            raise InferenceError(f"a launch needs a non-empty (k,) row index, got shape {selected.shape}")
        slot = self._acquire(counted)
        try:
            with torch.inference_mode():
                passes = self._plan(tokens, selected)
                self._fill(torch, slot, tokens, selected, passes)
                outputs = self._enqueue(slot, passes, len(selected))
        except BaseException:
            self._release(slot)
            raise
        handle = LaunchHandle(slot, len(selected), outputs, tuple((p.batch, p.seq_len) for p in passes))
        slot.owner = weakref.ref(handle)
        return handle

    def _plan(self, tokens: TokenizedBatch, rows: npt.NDArray[np.int64]) -> list[_Pass]:
        offsets = tokens.offsets
        lengths = offsets[rows + 1].astype(np.int64) - offsets[rows]
        passes, offset = [], 0
        for start, stop, batch in self.policy.passes(len(rows)):
            seq_len = self.policy.seq_len(int(lengths[start:stop].max()))
            passes.append(_Pass(start, stop, batch, seq_len, offset))
            offset += batch * seq_len
        return passes

    def _fill(
        self,
        torch: Any,
        slot: _Slot,
        tokens: TokenizedBatch,
        rows: npt.NDArray[np.int64],
        passes: list[_Pass],
    ) -> None:
        """Pad every pass into the slot's host buffers (host work only)."""
        slot.ensure_inputs(torch, passes[-1].offset + passes[-1].numel)
        pad_id, pad_type_id = self._pad
        for p in passes:
            views = tuple(v[p.offset : p.offset + p.numel].reshape(p.batch, p.seq_len) for v in slot.views)
            pad_rows_into(tokens, rows[p.start : p.stop], views,  # type: ignore[arg-type]
                          pad_id=pad_id, pad_type_id=pad_type_id)

    def _enqueue(self, slot: _Slot, passes: list[_Pass], rows: int) -> int:
        """Copy in, compute, copy out, record *done*; returns the number of outputs."""
        ops, total = self.ops, passes[-1].offset + passes[-1].numel
        with ops.stream(self._copy_stream):
            for host, device in zip(slot.host, slot.device, strict=True):
                device[:total].copy_(host[:total], non_blocking=True)
            ops.record(slot.copied, self._copy_stream)
        count = 0
        with ops.stream(self._compute_stream):
            ops.wait(self._compute_stream, slot.copied)
            for p in passes:
                ids, mask, types = (buffer[p.offset : p.offset + p.numel].view(p.batch, p.seq_len)
                                    for buffer in slot.device)
                outputs = self.forward(ids, mask, types)
                for index, output in enumerate(outputs):
                    target = slot.output(index, output, rows)
                    target[p.start : p.stop].copy_(output[: p.stop - p.start], non_blocking=True)
                count = len(outputs)
                self.shapes[(p.batch, p.seq_len)] += 1
            ops.record(slot.done, self._compute_stream)
        return count


def make_runner(
    forward: ForwardFn,
    *,
    options: TorchDeviceOptions,
    ops: DeviceOps | None,
    tokenizer: ArrowTokenizer,
    batch_size: int,
) -> DeviceRunner:
    """The runner of a model: ``options``' shapes (the tokenizer's ``max_length`` caps padded
    lengths) and depth, ``ops`` or the device's own (:func:`default_ops`)."""
    return DeviceRunner(
        forward,
        ops=ops if ops is not None else default_ops(options.device),
        policy=options.shape_policy(batch_size, tokenizer.config.max_length),
        depth=options.depth,
        pad_id=tokenizer.pad_id,
        pad_type_id=tokenizer.pad_type_id,
    )


class TorchDeviceHooks:
    """The device hooks both torch handlers share (before ``ModelHandler`` in the bases).

    The model offers ``runner`` (:class:`DeviceRunner`), ``device_uuid`` and ``empty_cache()``.
    """

    def launch_prepared(self, prepared: Any, rows: npt.NDArray[np.intp], model: Any) -> LaunchHandle:
        """Pad, copy and enqueue ``rows`` of the tokenized batch (``prepared.payload``); returns
        before the device is done.

        Thread-safety: the batching thread only (as ``collect_prepared``).

        Raises:
            ModelError: The model was released.
            InferenceError: More than ``pipeline_depth + 1`` batches in flight.
        """
        handle: LaunchHandle = model.launch(prepared.payload, rows)
        return handle

    def pipeline_depth(self, model: Any) -> int:
        """The constructor's ``pipeline_depth``, else 2 on CUDA and 1 on the CPU."""
        return int(model.runner.depth)

    def on_out_of_memory(self, model: Any) -> None:
        """``torch.cuda.empty_cache()`` on the model's CUDA device (nothing on the CPU)."""
        model.empty_cache()

    def device_uuid(self, model: Any) -> str | None:
        """``"GPU-<uuid>"`` / ``"MIG-<uuid>"`` of the CUDA device the model runs on, read at load;
        None on the CPU."""
        uuid: str | None = model.device_uuid
        return uuid
