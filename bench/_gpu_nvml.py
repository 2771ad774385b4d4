"""NVML for the GPU check: the device's identity and a GPU-busy sampler (NVML is only read).

The NVML handle of the torch device ``cuda:N`` is found by its PCI bus id (from
``torch.cuda.get_device_properties``), not by its uuid, so NVML's uuid is an independent witness for
the lease check. "GPU busy" is NVML's ``utilization.gpu`` (share of the last sample period in which
a kernel ran) polled by a thread; on the CPU it is "not measured".

Thread-safety: a :class:`BusySampler` is started and stopped by one thread; it reads NVML on its own.
"""

from __future__ import annotations

import os
import platform
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

__all__ = ["BusySampler", "cpu_model", "gpu_identity", "nvml", "package_versions"]

_PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "pyarrow",
    "safetensors",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "nvidia-ml-py",
)


def nvml() -> Any:
    """``pynvml`` initialised, or None where there is no NVML (no driver, no package)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, driver not loaded
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle(nv: Any, torch_index: int) -> tuple[Any, str]:
    """NVML handle of torch's ``cuda:<torch_index>`` and how it was found: by PCI bus id, else by
    torch's uuid, else (a host that reports neither) by NVML index."""
    import torch

    props: Any = torch.cuda.get_device_properties(torch_index)
    try:
        bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        return nv.nvmlDeviceGetHandleByPciBusId(bus.encode()), f"PCI bus id {bus}"
    except Exception as exc:  # NVMLError (unknown bus id) or a torch without the PCI fields
        reason = f"{type(exc).__name__}"
    wanted = str(getattr(props, "uuid", "")).removeprefix("GPU-")
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        if wanted and _text(nv.nvmlDeviceGetUUID(handle)).removeprefix("GPU-") == wanted:
            return handle, f"torch's uuid (bus id lookup: {reason})"
    return nv.nvmlDeviceGetHandleByIndex(torch_index), f"NVML index {torch_index} (bus id lookup: {reason})"


def gpu_identity(nv: Any, torch_index: int) -> dict[str, Any]:
    """Name, uuid, memory, driver and MIG mode of torch's ``cuda:<torch_index>`` as NVML reports it."""
    import torch

    handle, matched_by = _handle(nv, torch_index)
    props = torch.cuda.get_device_properties(torch_index)
    info: dict[str, Any] = {
        "nvml_matched_by": matched_by,
        "nvml_name": _text(nv.nvmlDeviceGetName(handle)),
        "nvml_uuid": _text(nv.nvmlDeviceGetUUID(handle)),
        "memory_total_bytes": int(nv.nvmlDeviceGetMemoryInfo(handle).total),
        "driver": _text(nv.nvmlSystemGetDriverVersion()),
        "pci_bus_id": _text(nv.nvmlDeviceGetPciInfo(handle).busId),
        "torch_name": torch.cuda.get_device_name(torch_index),
        "torch_uuid": str(getattr(props, "uuid", "")),
        "capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
    }
    try:
        info["mig_mode"] = int(nv.nvmlDeviceGetMigMode(handle)[0])
    except Exception:  # not supported on this GPU
        info["mig_mode"] = None
    return info


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_versions() -> dict[str, str]:
    """Installed versions of the packages the check touches ("absent" where not installed)."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    versions["python"] = platform.python_version()
    versions["cpus_usable"] = str(len(os.sched_getaffinity(0)))
    return versions


@dataclass
class BusySampler:
    """Polls ``nvmlDeviceGetUtilizationRates(handle).gpu`` every ``period_s`` while running.

    Attributes:
        samples: The readings, percent.
    """

    nv: Any
    handle: Any
    period_s: float = 0.05
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def for_device(cls, nv: Any, torch_index: int) -> BusySampler:
        """A sampler of torch's ``cuda:<torch_index>``."""
        return cls(nv, _handle(nv, torch_index)[0])

    def __enter__(self) -> BusySampler:
        self.samples = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-busy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.samples.append(int(self.nv.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            except Exception:  # a reading failed: leave it out
                continue

    @property
    def mean(self) -> float | None:
        """Mean busy percent over the samples, None without any."""
        return sum(self.samples) / len(self.samples) if self.samples else None
