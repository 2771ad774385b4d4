"""The Device value (pyflink_aisp.device, ground floor): parsing, its name, order, and the
combinations it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from pyflink_aisp.device import Device, DeviceKind
from pyflink_aisp.errors import ConfigError


@pytest.mark.parametrize(("text", "device"), [
    ("cpu", Device(DeviceKind.CPU)), (" CPU ", Device(DeviceKind.CPU)), ("cuda", Device(DeviceKind.CUDA, 0)),
    (" cuda ", Device(DeviceKind.CUDA, 0)), ("CUDA:01", Device(DeviceKind.CUDA, 1)),
    ("cuda:12", Device(DeviceKind.CUDA, 12)),
])
def test_parse_takes_any_case_and_space_and_names_the_device_canonically(text: str, device: Device) -> None:
    assert Device.parse(text) == device
    assert Device.parse(str(device)) == device


@pytest.mark.parametrize("text", ["cuda:-0", "cuda:-1", "gpu", "mps", "cuda:", "cpu:0", "cuda:1.0",
                                  "cuda:\u0663", ""])
def test_parse_refuses_other_names(text: str) -> None:
    with pytest.raises(ConfigError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
        Device.parse(text)


def test_devices_order_cpu_first_then_by_index() -> None:
    devices = [Device(DeviceKind.CUDA, 10), Device(DeviceKind.CPU), Device(DeviceKind.CUDA, 2)]
    assert [str(d) for d in sorted(devices)] == ["cpu", "cuda:2", "cuda:10"]


@pytest.mark.parametrize(("kind", "index"), [
    (DeviceKind.CPU, 0), (DeviceKind.CUDA, None), (DeviceKind.CUDA, -1), (DeviceKind.CUDA, True),
    (DeviceKind.CUDA, 1.5), (DeviceKind.CUDA, "1"), ("gpu", 0), ("cpu", 0),
])
def test_a_device_is_a_kind_and_an_int_index_or_a_config_error(kind: Any, index: Any) -> None:
    with pytest.raises(ConfigError):
        Device(kind, index)


def test_a_kind_given_as_a_string_becomes_the_kind() -> None:
    """Kept as a str, "cuda" made a device whose is_gpu was False while its name said cuda:0, and
    "cpu" one equal to Device(DeviceKind.CPU) with another hash."""
    assert Device("cuda", 0).is_gpu and Device("cuda", 0).kind is DeviceKind.CUDA  # type: ignore[arg-type]
    assert hash(Device("cpu")) == hash(Device(DeviceKind.CPU))  # type: ignore[arg-type]
