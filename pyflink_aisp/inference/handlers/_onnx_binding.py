"""ONNX Runtime IO binding with device-resident inputs and outputs.

:class:`DeviceIO` runs one session through ``InferenceSession.io_binding()``
(ONNX Runtime, "I/O Binding",
https://onnxruntime.ai/docs/performance/tune-performance/iobinding.html, and
"Python API: IOBinding", https://onnxruntime.ai/docs/api/python/api_summary.html):

- each input is copied ONCE into an ``OrtValue`` on the session's device and
  bound with ``bind_ortvalue_input``; the device values are kept per input name,
  shape and dtype (a bucketed batch shape comes back often) and refilled with
  ``OrtValue.update_inplace`` (a host-to-device copy into the same device
  memory, no allocation); a new shape gets ``OrtValue.ortvalue_from_numpy(array,
  device_type, device_id)``;
- outputs are bound to the device (``bind_output(name, device_type, device_id)``:
  ORT allocates them there, so their shape need not be known) and copied to the
  host once after the run (``copy_outputs_to_cpu``).

The device is a switch, ``"cuda:N"`` or ``"cpu"`` (the session's first
provider, :func:`~pyflink_aisp.inference.handlers._onnx.provider_device`): the
same code runs on the CPU provider, where it gives the numbers of a plain
``session.run``. On the CPU ``ortvalue_from_numpy`` would wrap the caller's
array instead of copying it; the array is copied first, so a kept value never
aliases a (pooled) caller buffer that ``update_inplace`` would then overwrite.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from pyflink_aisp.errors import ConfigError

__all__ = ["DEFAULT_CACHED_VALUES", "DeviceIO", "parse_ort_device"]

#: Device input values kept per thread (name x shape x dtype), least recently used dropped first.
DEFAULT_CACHED_VALUES = 24

_Key = tuple[str, tuple[int, ...], str]


def parse_ort_device(device: str) -> tuple[str, int]:
    """``("cuda", N)`` for ``"cuda:N"`` (``"cuda"``: N = 0), ``("cpu", 0)`` for ``"cpu"``.

    Raises:
        ConfigError: Another device string, or a negative / non-integer index.
    """
    kind, _, index = device.partition(":")
    if kind not in ("cuda", "cpu") or (kind == "cpu" and index):
        raise ConfigError(f"ONNX Runtime IO binding device must be 'cpu' or 'cuda[:N]', got {device!r}")
    try:
        device_id = int(index or 0)
    except ValueError:
        raise ConfigError(f"device index of {device!r} must be an integer") from None
    if device_id < 0:
        raise ConfigError(f"device index of {device!r} must be >= 0")
    return kind, device_id


class _ThreadValues(threading.local):
    """One thread's device input values (a thread-local, so no value is refilled by two threads)."""

    def __init__(self) -> None:
        self.values: OrderedDict[_Key, ort.OrtValue] = OrderedDict()


class DeviceIO:
    """Runs a session with its inputs and outputs bound on the session's device.

    Thread-safety: :meth:`run` may be called from several threads at once; each
    thread keeps its own device input values and builds its own binding per run.

    Args:
        session: The ONNX Runtime session.
        outputs: Graph output names, in the order :meth:`run` returns them.
        device: ``"cuda:N"`` (CUDA/TensorRT session on device N) or ``"cpu"``.
        max_cached_values: Device input values kept per thread (>= 0; 0 keeps none).

    Raises:
        ConfigError: A bad ``device``, no ``outputs``, or ``max_cached_values`` < 0.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        outputs: Sequence[str],
        device: str,
        *,
        max_cached_values: int = DEFAULT_CACHED_VALUES,
    ) -> None:
        if isinstance(outputs, str) or not outputs:
            raise ConfigError(f"outputs must be a non-empty sequence of names, got {outputs!r}")
        if max_cached_values < 0:
            raise ConfigError(f"max_cached_values must be >= 0, got {max_cached_values}")
        self._session = session
        self._outputs = tuple(outputs)
        self.device_type, self.device_id = parse_ort_device(device)
        self._max_cached = max_cached_values
        self._local = _ThreadValues()

    def run(self, inputs: Mapping[str, npt.NDArray[np.generic]]) -> list[npt.NDArray[np.generic]]:
        """One ``run_with_iobinding``: inputs copied to the device, outputs copied back.

        The host arrays are copied before this returns; the caller may reuse them
        (e.g. give pooled buffers back) as soon as it does.

        Args:
            inputs: ``{graph input name: host array}`` (e.g. ``(batch, seq_len)`` int64).

        Returns:
            Host arrays of the outputs, in ``outputs`` order.

        Raises:
            Whatever ONNX Runtime raises for a bad feed or a failed run (its own types).
        """
        binding = self._session.io_binding()
        for name, array in inputs.items():
            binding.bind_ortvalue_input(name, self._device_value(name, array))
        binding.synchronize_inputs()  # the copies are complete before the EP's stream reads them
        for name in self._outputs:
            binding.bind_output(name, self.device_type, self.device_id)
        self._session.run_with_iobinding(binding)
        return list(binding.copy_outputs_to_cpu())

    def cached_keys(self) -> list[_Key]:
        """``(input name, shape, dtype)`` of this thread's kept device values, oldest first."""
        return list(self._local.values)

    def _device_value(self, name: str, array: npt.NDArray[np.generic]) -> ort.OrtValue:
        """``array`` on the device: a kept value of that shape refilled, else a new one."""
        array = np.ascontiguousarray(array)
        key = (name, tuple(int(d) for d in array.shape), array.dtype.str)
        values = self._local.values
        value = values.get(key)
        if value is not None:
            value.update_inplace(array)
            values.move_to_end(key)
            return value
        source = array.copy() if self.device_type == "cpu" else array  # cpu: own memory, never an alias
        value = ort.OrtValue.ortvalue_from_numpy(source, self.device_type, self.device_id)
        if self._max_cached:
            values[key] = value
            while len(values) > self._max_cached:
                values.popitem(last=False)
        return value
