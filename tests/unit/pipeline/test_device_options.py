"""Device and runtime selection of the jobs and SQL functions (issue 10.1), tested on the host
it runs on: a requested GPU that is not usable is one clear error, never a silent CPU run."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference.handlers import ExecutionProvider, SentimentHandler, TorchSentimentHandler
from pyflink_aisp.pipeline import InferenceOptions, PipelineOptions
from pyflink_aisp.pipeline._handlers import handler_for, onnx_providers
from pyflink_aisp.pipeline._options import GpuProvider, InferenceRuntime, Precision
from pyflink_aisp.pipeline._preflight import check_device, nvidia_gpu_count

BASE = ["--input-topic", "i", "--output-topic", "o"]


@pytest.mark.parametrize("device", ["gpu", "cuda:-1", "mps", "cuda:x", ""])
def test_a_bad_device_exits_2_naming_the_flag(device: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        PipelineOptions.from_args([*BASE, "--device", device])
    assert exc.value.code == 2
    assert f"--device must be cpu, cuda or cuda:N, got {device!r}" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--runtime", "torch", "--encoder-onnx", "e.onnx", "--encoder-tokenizer", "t.json"],
     "--encoder-onnx runs on ONNX Runtime"),
    (["--classifier", "d", "--runtime", "torch"], "--classifier runs on ONNX Runtime"),
    (["--classifier", "d", "--encoder-onnx", "e.onnx", "--encoder-tokenizer", "t.json"],
     "--encoder-onnx and --runtime torch do not go with it"),
    (["--top-k", "3"], "--top-k applies to --classifier only"),
    (["--classifier", "d", "--with-embedding"], "--with-embedding is the sentiment model's"),
    (["--classifier", "d", "--top-k", "-1"], "--top-k"),
    (["--runtime", "torch", "--model-pointer", "p.json"], "--model-pointer (hot swap) needs --runtime onnx"),
    (["--runtime", "tf"], "--runtime must be one of onnx, torch"),
    (["--onnx-provider", "rocm"], "--onnx-provider must be one of cuda, tensorrt"),
    (["--precision", "bf16"], "--precision bf16 needs --runtime torch"),
    (["--runtime", "torch", "--precision", "fp8"], "--precision must be one of fp32, fp16, bf16"),
])
def test_runtime_combinations_that_cannot_work_exit_2(flags: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        PipelineOptions.from_args([*BASE, *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_onnx_providers_follow_the_device_without_a_cpu_fallback() -> None:
    assert onnx_providers(InferenceOptions()) == ((ExecutionProvider.CPU,), None)
    assert onnx_providers(InferenceOptions(device="cuda")) == ((ExecutionProvider.CUDA,), 0)
    assert onnx_providers(InferenceOptions(device="CUDA:3")) == ((ExecutionProvider.CUDA,), 3)
    trt = InferenceOptions(device="cuda:1", onnx_provider=GpuProvider.TENSORRT)
    assert onnx_providers(trt) == ((ExecutionProvider.TENSORRT, ExecutionProvider.CUDA), 1)


def test_handler_for_builds_the_runtime_on_the_device(model_assets, monkeypatch) -> None:
    monkeypatch.setenv("AISP_MODEL_DIR", str(model_assets.directory))
    onnx = handler_for(InferenceOptions(device="cuda:1"))
    assert isinstance(onnx, SentimentHandler)
    assert (onnx.providers, onnx.device()) == (["CUDAExecutionProvider"], "cuda:1")
    torch_cpu = handler_for(InferenceOptions(runtime=InferenceRuntime.TORCH))
    assert isinstance(torch_cpu, TorchSentimentHandler) and torch_cpu.device() == "cpu"
    torch_gpu = handler_for(InferenceOptions(runtime=InferenceRuntime.TORCH, device="cuda"))
    assert torch_gpu.device() == "cuda:0"
    assert torch_gpu.model_version() == torch_cpu.model_version() != onnx.model_version()
    bf16 = handler_for(InferenceOptions(runtime=InferenceRuntime.TORCH, precision=Precision.BF16))
    assert bf16.precision == "bf16" and bf16.model_version() != torch_cpu.model_version()


def test_a_gpu_request_is_checked_against_this_host() -> None:
    """On a CPU-only host (CI) every GPU request fails with the fix; on a GPU host the
    devices that are there pass and one past the last fails."""
    import torch

    check_device(InferenceOptions())
    check_device(InferenceOptions(runtime=InferenceRuntime.TORCH))
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        check_device(InferenceOptions(runtime=InferenceRuntime.TORCH, device=f"cuda:{count - 1}"))
        with pytest.raises(ConfigError, match=rf"this host has {count} CUDA device\(s\)"):
            check_device(InferenceOptions(runtime=InferenceRuntime.TORCH, device=f"cuda:{count}"))
    else:
        with pytest.raises(ConfigError) as exc:
            check_device(InferenceOptions(runtime=InferenceRuntime.TORCH, device="cuda:0"))
        assert str(exc.value) == ("--device cuda:0: no CUDA device is usable here "
                                  "(torch.cuda.is_available() is False); use --device cpu")
    gpus, why = nvidia_gpu_count()
    for provider, name in ((GpuProvider.CUDA, "CUDAExecutionProvider"),
                           (GpuProvider.TENSORRT, "TensorrtExecutionProvider")):
        options = InferenceOptions(device="cuda", onnx_provider=provider)
        if name not in ort.get_available_providers():
            with pytest.raises(ConfigError) as exc:
                check_device(options)
            message = str(exc.value)
            assert message.startswith(f"--device cuda:0: this onnxruntime ({ort.__version__}) has no {name} ")
            assert "install onnxruntime-gpu, use --runtime torch, or --device cpu" in message
        elif gpus == 0:  # onnxruntime-gpu on a host without a GPU: its provider is listed all the same
            with pytest.raises(ConfigError) as exc:
                check_device(options)
            assert str(exc.value) == (f"--device cuda:0: {why} (onnxruntime-gpu lists its CUDA provider even "
                                      "without a GPU); use --device cpu")
        else:
            check_device(options)
            with pytest.raises(ConfigError, match=rf"this host has {gpus} NVIDIA GPU\(s\)"):
                check_device(InferenceOptions(device=f"cuda:{gpus}", onnx_provider=provider))


def test_the_job_refuses_an_unusable_gpu_in_one_line_before_anything_starts(review_job, capsys) -> None:
    """On a host without an NVIDIA GPU; on a GPU host, a device index past the last one."""
    gpus, _ = nvidia_gpu_count()
    device = f"cuda:{gpus}"
    for runtime in ("onnx", "torch"):
        assert review_job.main([*BASE, "--device", device, "--runtime", runtime]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"review_sentiment: error: --device {device}: "), err
