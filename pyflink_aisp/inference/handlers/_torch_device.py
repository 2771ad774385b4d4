"""Device options of the PyTorch handlers: shapes, streams, TF32, memory limit, device UUID.

:class:`TorchDeviceOptions` holds what :class:`~pyflink_aisp.inference.TorchSentimentHandler`
and :class:`~pyflink_aisp.inference.TorchEncoderHandler` take besides the model: the
padding that keeps the set of ``(batch, seq_len)`` shapes small (:class:`ShapePolicy`),
the pipeline depth, TF32 and the per-process memory limit; ``None`` / ``()`` mean the
device's default (CUDA: sequence lengths padded to a multiple of 16, batch sizes padded
to powers of two from 8 to the handler's batch size, depth 2; CPU: no padding, depth 1).

:class:`DeviceOps` is the small set of operations the launch path
(:mod:`~pyflink_aisp.inference.handlers._torch_runner`) needs of a device: host buffers
(page-locked on CUDA), device buffers, streams and events. :class:`CudaOps` is the CUDA
one; :class:`HostOps` runs the same code on the CPU with plain tensors, no-op streams
and events that are always complete, so that the launch / collect / ring logic runs in
unit tests.

``torch`` is passed in (or imported lazily): importing this module needs no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import re
from collections.abc import Iterator
from typing import Any, Protocol

from pyflink_aisp.errors import ConfigError, ModelError

__all__ = [
    "CUDA_DEFAULT_DEPTH",
    "CUDA_DEFAULT_MULTIPLE",
    "MAX_PIPELINE_DEPTH",
    "CudaOps",
    "DeviceOps",
    "HostOps",
    "MaskMode",
    "ShapePolicy",
    "TorchDeviceOptions",
    "attention_mask",
    "default_buckets",
    "default_ops",
    "device_uuid_of",
    "empty_cache",
    "mask_mode_for",
    "set_tf32",
]

#: ``pad_to_multiple_of`` on CUDA when none is given (tensor-core friendly; a handful of lengths
#: up to a 128-token ``max_length``).
CUDA_DEFAULT_MULTIPLE = 16
#: Model batches in flight on CUDA when ``pipeline_depth`` is not given: one computing while the
#: next one's inputs are copied.
CUDA_DEFAULT_DEPTH = 2
#: Largest ``pipeline_depth`` accepted (each level keeps one set of buffers).
MAX_PIPELINE_DEPTH = 8
#: Smallest default batch bucket on CUDA.
_SMALLEST_BUCKET = 8
_HEX_UUID = re.compile(r"[0-9a-fA-F]{32}")


def default_buckets(batch_size: int) -> tuple[int, ...]:
    """Powers of two from 8 below ``batch_size``, then ``batch_size`` itself.

    >>> default_buckets(64)
    (8, 16, 32, 64)
    >>> default_buckets(100)
    (8, 16, 32, 64, 100)
    """
    buckets, size = [], _SMALLEST_BUCKET
    while size < batch_size:
        buckets.append(size)
        size *= 2
    return (*buckets, batch_size)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapePolicy:
    """How a model batch of ``k`` rows becomes forward passes of few shapes.

    Attributes:
        pad_to_multiple_of: Sequence lengths are rounded up to a multiple of this (None: the
            longest row of the pass).
        batch_size_buckets: Allowed batch dimensions, ascending: a pass of ``n`` rows is padded
            to the smallest bucket ``>= n``; ``k`` rows beyond the largest bucket are cut into
            passes of the largest bucket. ``()``: one pass of exactly ``k`` rows.
        max_seq_len: Rounded lengths never exceed this (the tokenizer's ``max_length``), unless
            a row is longer; None: no cap.

    Raises:
        ConfigError: ``pad_to_multiple_of`` < 1, buckets not positive and strictly ascending, or
            ``max_seq_len`` < 1.
    """

    pad_to_multiple_of: int | None = None
    batch_size_buckets: tuple[int, ...] = ()
    max_seq_len: int | None = None

    def __post_init__(self) -> None:
        _check_multiple(self.pad_to_multiple_of)
        _check_buckets(self.batch_size_buckets)
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ConfigError(f"max_seq_len must be >= 1 or None, got {self.max_seq_len}")

    def seq_len(self, longest: int) -> int:
        """Padded length of a pass whose longest row has ``longest`` tokens (at least 1)."""
        longest = max(1, longest)
        multiple = self.pad_to_multiple_of
        if multiple is None:
            return longest
        rounded = -(-longest // multiple) * multiple
        if self.max_seq_len is not None:
            rounded = min(rounded, max(self.max_seq_len, longest))
        return rounded

    def passes(self, rows: int) -> list[tuple[int, int, int]]:
        """``(start, stop, batch)`` of each forward pass over ``rows`` rows, in order.

        ``batch >= stop - start``; the extra rows are padding whose outputs are dropped.
        """
        buckets = self.batch_size_buckets
        if not buckets:
            return [(0, rows, rows)] if rows else []
        largest, out = buckets[-1], []
        for start in range(0, rows, largest):
            stop = min(rows, start + largest)
            out.append((start, stop, next(b for b in buckets if b >= stop - start)))
        return out


def _check_multiple(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise ConfigError(f"pad_to_multiple_of must be >= 1 or None, got {value!r}")


def _check_buckets(buckets: tuple[int, ...]) -> None:
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets) or any(
        a >= b for a, b in itertools.pairwise(buckets)
    ):
        raise ConfigError(f"batch_size_buckets must be positive ints, strictly ascending, got {buckets!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TorchDeviceOptions:
    """The device options of a torch handler (validated when the handler is built).

    Attributes:
        device: Normalised device name, ``"cpu"`` or ``"cuda:N"``.
        pad_to_multiple_of: See :class:`ShapePolicy`; None: 16 on CUDA, no padding on the CPU.
        batch_size_buckets: See :class:`ShapePolicy`; ``()``: :func:`default_buckets` of the
            handler's batch size on CUDA, none on the CPU.
        tf32: Let float32 matmuls and convolutions use TF32 on CUDA
            (``torch.backends.cuda.matmul.allow_tf32`` / ``torch.backends.cudnn.allow_tf32``,
            set at load and before every forward pass, since they are process-wide). Outputs
            change, so it is part of the model version.
        memory_limit_bytes: Cap of this process's CUDA caching allocator on the device
            (``torch.cuda.set_per_process_memory_fraction(limit / total, index)`` at load); an
            allocation beyond it raises out-of-memory. None: no cap.
        pipeline_depth: Model batches launched and not yet collected (1..8); None: 2 on CUDA,
            1 on the CPU.

    Raises:
        ConfigError: A value out of range; ``tf32`` or ``memory_limit_bytes`` on the CPU.
    """

    device: str = "cpu"
    pad_to_multiple_of: int | None = None
    batch_size_buckets: tuple[int, ...] = ()
    tf32: bool = False
    memory_limit_bytes: int | None = None
    pipeline_depth: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size_buckets", tuple(self.batch_size_buckets or ()))
        _check_multiple(self.pad_to_multiple_of)
        _check_buckets(self.batch_size_buckets)
        depth = self.pipeline_depth
        if depth is not None and (isinstance(depth, bool) or not 1 <= depth <= MAX_PIPELINE_DEPTH):
            raise ConfigError(f"pipeline_depth must be in 1..{MAX_PIPELINE_DEPTH} or None, got {depth!r}")
        limit = self.memory_limit_bytes
        if limit is not None and (isinstance(limit, bool) or limit < 1):
            raise ConfigError(f"memory_limit_bytes must be >= 1 or None, got {limit!r}")
        if not self.is_cuda and self.tf32:
            raise ConfigError(f"tf32=True needs a CUDA device, got device {self.device!r}")
        if not self.is_cuda and limit is not None:
            raise ConfigError(f"memory_limit_bytes applies to CUDA devices only, got device {self.device!r}")

    @property
    def is_cuda(self) -> bool:
        """The device is a CUDA device."""
        return self.device.startswith("cuda")

    @property
    def index(self) -> int:
        """The CUDA device index (0 on the CPU)."""
        return int(self.device.split(":")[1]) if self.is_cuda else 0

    @property
    def depth(self) -> int:
        """The pipeline depth in use."""
        if self.pipeline_depth is not None:
            return self.pipeline_depth
        return CUDA_DEFAULT_DEPTH if self.is_cuda else 1

    def shape_policy(self, batch_size: int, max_seq_len: int | None) -> ShapePolicy:
        """The shapes for a handler of ``batch_size`` rows per pass and a tokenizer truncating at
        ``max_seq_len``."""
        multiple = self.pad_to_multiple_of
        buckets = self.batch_size_buckets
        if self.is_cuda:
            multiple = multiple if multiple is not None else CUDA_DEFAULT_MULTIPLE
            buckets = buckets or default_buckets(batch_size)
        return ShapePolicy(pad_to_multiple_of=multiple, batch_size_buckets=buckets, max_seq_len=max_seq_len)

    def version_options(self) -> dict[str, str]:
        """``{name: value}`` the options add to a model version: only those that change outputs
        (``tf32``), and only when set, so versions without them keep their digest."""
        return {"tf32": "1"} if self.tf32 else {}

    def apply(self, torch: Any) -> None:
        """At load, before the weights go to the device: TF32 flags and the memory limit.

        Args:
            torch: The ``torch`` module (a stand-in in tests).

        Raises:
            ConfigError: ``memory_limit_bytes`` exceeds the device's total memory.
            ModelError: The memory limit cannot be set.
        """
        if not self.is_cuda:
            return
        set_tf32(torch, self.tf32)
        if self.memory_limit_bytes is None:
            return
        total = int(torch.cuda.get_device_properties(self.index).total_memory)
        if self.memory_limit_bytes > total:
            raise ConfigError(f"memory_limit_bytes {self.memory_limit_bytes} exceeds the {total} bytes of "
                              f"{self.device}")
        try:
            torch.cuda.set_per_process_memory_fraction(self.memory_limit_bytes / total, self.index)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ModelError(f"cannot limit {self.device} to {self.memory_limit_bytes} bytes: {exc}") from exc


def set_tf32(torch: Any, enabled: bool) -> None:
    """Set the process-wide TF32 flags of float32 matmuls and cuDNN convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def device_uuid_of(torch: Any, device: str) -> str | None:
    """The UUID of ``device`` as NVML writes it: ``"GPU-<uuid>"``, or ``"MIG-<uuid>"`` for a MIG
    instance (its name holds ``MIG``); None for the CPU.

    Reads ``torch.cuda.get_device_properties(index).uuid`` (the CUDA device this process sees as
    ``index``, after ``CUDA_VISIBLE_DEVICES``); a value that already has a prefix is kept.

    Raises:
        ModelError: torch gives no UUID for the device.
    """
    if not device.startswith("cuda"):
        return None
    index = int(device.split(":")[1])
    props = torch.cuda.get_device_properties(index)
    raw = str(getattr(props, "uuid", "") or "").strip()
    if raw.startswith(("GPU-", "MIG-")):
        return raw
    if _HEX_UUID.fullmatch(raw):
        raw = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
    if not raw:
        raise ModelError(f"torch reports no UUID for {device}")
    prefix = "MIG-" if "MIG" in str(getattr(props, "name", "")).split() else "GPU-"
    return prefix + raw.lower()


def empty_cache(torch: Any, device: str) -> None:
    """Return the caching allocator's free blocks on ``device`` to the driver (nothing on the CPU)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        with torch.cuda.device(torch.device(device)):
            torch.cuda.empty_cache()


class MaskMode(enum.StrEnum):
    """How the attention mask is handed to a HF model.

    A 2-D padding mask makes ``transformers`` (5.x ``masking_utils``) evaluate
    ``padding_mask.all()`` in Python before every forward pass: a device-to-host sync. A 4-D
    mask is taken as it is, so the two 4-D modes skip that helper.
    """

    #: ``(batch, 1, 1, seq_len)`` bool, True where attended (``attn_implementation="sdpa"``).
    BOOL_4D = "bool-4d"
    #: ``(batch, 1, 1, seq_len)`` float32, 0 where attended and the dtype's minimum elsewhere
    #: (``attn_implementation="eager"``, as ``masking_utils.eager_mask``).
    ADDITIVE_4D = "additive-4d"
    #: The ``(batch, seq_len)`` padding mask (other implementations; syncs once per pass).
    PADDING_2D = "padding-2d"


def mask_mode_for(module: Any) -> MaskMode:
    """The 4-D mode matching ``module.config._attn_implementation``, else :attr:`MaskMode.PADDING_2D`."""
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if implementation == "sdpa":
        return MaskMode.BOOL_4D
    if implementation == "eager":
        return MaskMode.ADDITIVE_4D
    return MaskMode.PADDING_2D


def attention_mask(torch: Any, mode: MaskMode, mask: Any) -> Any:
    """The mask to pass as ``attention_mask`` for a ``(batch, seq_len)`` int64 padding ``mask``
    on the device (built there: no host round trip)."""
    if mode is MaskMode.PADDING_2D:
        return mask
    keep = mask.bool()[:, None, None, :]
    if mode is MaskMode.BOOL_4D:
        return keep
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    return torch.where(keep, zero, torch.finfo(torch.float32).min)


class DeviceOps(Protocol):
    """What the launch path needs of a device (see :class:`CudaOps`, :class:`HostOps`)."""

    def host_buffer(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A host tensor the device copies from / to asynchronously (page-locked on CUDA)."""
        ...

    def device_buffer(self, numel: int, dtype: Any) -> Any:
        """A flat tensor of ``numel`` elements on the device."""
        ...

    def new_stream(self) -> Any:
        """A stream of its own (None: the current one)."""
        ...

    def stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``stream`` current inside the block."""
        ...

    def new_event(self) -> Any:
        """An event to record on a stream."""
        ...

    def record(self, event: Any, stream: Any) -> None:
        """Record ``event`` after the work enqueued on ``stream`` so far."""
        ...

    def wait(self, stream: Any, event: Any) -> None:
        """Work enqueued on ``stream`` from now on waits for ``event`` (on the device)."""
        ...

    def synchronize(self, event: Any) -> None:
        """Block the calling thread until ``event`` has completed."""
        ...


class HostOps:
    """:class:`DeviceOps` of the CPU: plain tensors, no streams, events always complete.

    Every operation runs when it is called, so a launch has finished when it returns; the
    launch / collect bookkeeping is the same as on CUDA.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def host_buffer(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        return torch.empty(shape, dtype=dtype)

    def device_buffer(self, numel: int, dtype: Any) -> Any:
        import torch

        return torch.empty((numel,), dtype=dtype, device=torch.device(self.device))

    def new_stream(self) -> Any:
        return None

    def stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def new_event(self) -> Any:
        return None

    def record(self, event: Any, stream: Any) -> None:
        return None

    def wait(self, stream: Any, event: Any) -> None:
        return None

    def synchronize(self, event: Any) -> None:
        return None


class CudaOps:
    """:class:`DeviceOps` of one CUDA device: pinned host memory, ``torch.cuda.Stream`` and
    ``torch.cuda.Event`` (timing off).

    Args:
        device: ``"cuda:N"``.
    """

    def __init__(self, device: str) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)

    def host_buffer(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._torch.empty(shape, dtype=dtype, pin_memory=True)

    def device_buffer(self, numel: int, dtype: Any) -> Any:
        return self._torch.empty((numel,), dtype=dtype, device=self.device)

    def new_stream(self) -> Any:
        return self._torch.cuda.Stream(device=self.device)

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        with self._torch.cuda.stream(stream):
            yield

    def new_event(self) -> Any:
        return self._torch.cuda.Event(enable_timing=False)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def synchronize(self, event: Any) -> None:
        event.synchronize()


def default_ops(device: str) -> DeviceOps:
    """:class:`CudaOps` for ``"cuda:N"``, :class:`HostOps` otherwise."""
    return CudaOps(device) if device.startswith("cuda") else HostOps(device)
