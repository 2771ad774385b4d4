"""Where a model runs: a :class:`Device` value (``cpu`` or CUDA device ``N``), parsed once.

A GPU request never silently becomes a CPU run: code that cannot use the
device it was given raises, it does not fall back.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from pyflink_aisp.errors import ConfigError

__all__ = ["Device", "DeviceKind"]

_DEVICE_RE = re.compile(r"cpu|cuda(?::([0-9]+))?")


class DeviceKind(enum.StrEnum):
    """The kinds of device a model can run on."""

    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True, order=True)
class Device:
    """A device: ``Device(DeviceKind.CPU)`` or ``Device(DeviceKind.CUDA, N)``.

    ``str(device)`` is its canonical name, ``"cpu"`` or ``"cuda:N"`` (PyTorch's spelling).

    Raises:
        ConfigError: Not a kind (``"cuda"`` becomes :attr:`DeviceKind.CUDA`), a CPU with an
            index, or a CUDA device without one or with one that is not an int >= 0.
    """

    kind: DeviceKind
    index: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, DeviceKind):
            try:
                object.__setattr__(self, "kind", DeviceKind(self.kind))
            except ValueError:
                raise ConfigError(f"a device kind is 'cpu' or 'cuda', got {self.kind!r}") from None
        cpu = self.kind is DeviceKind.CPU
        bad_index = self.index is not None and (
            not isinstance(self.index, int) or isinstance(self.index, bool) or self.index < 0)
        if cpu != (self.index is None) or bad_index:
            wants = "no index" if cpu else "an int index >= 0"
            raise ConfigError(f"a {self.kind.value} device takes {wants}, got {self.index!r}")

    @classmethod
    def parse(cls, text: str) -> Device:
        """``"cpu"``, ``"cuda"`` (= CUDA device 0 of the process, as ``torch.device("cuda")`` before
        any ``set_device``) or ``"cuda:N"``, in any case.

        Raises:
            ConfigError: Any other name (``"mps"``, ``"cuda:-1"``, ``"gpu"``).
        """
        match = _DEVICE_RE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
        if match is None:
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {text!r}")
        if match.group(0) == "cpu":
            return cls(DeviceKind.CPU)
        return cls(DeviceKind.CUDA, int(match.group(1) or 0))

    @property
    def is_gpu(self) -> bool:
        """Whether this is a CUDA device."""
        return self.kind is DeviceKind.CUDA

    def __str__(self) -> str:
        return "cpu" if self.kind is DeviceKind.CPU else f"cuda:{self.index}"
