"""check_model_handler on the real handlers, the example handler, and deliberately broken ones."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.handlers import SentimentHandler
from pyflink_aisp.inference.handlers._torch import TorchSentimentHandler
from pyflink_aisp.inference.testing import ContractReport, HandlerContractError, check_model_handler
from pyflink_aisp.models import ModelAssets

ROOT = Path(__file__).resolve().parents[3]

#: Real snippets of different lengths and both labels (distinct outputs show order mistakes).
EXAMPLES = [
    "A gorgeous, witty, seductive movie.",
    "Dull.",
    "The plot makes no sense and the jokes fall flat, but the cast tries hard.",
    "An utterly charming, beautifully acted film " * 4,
    "Wonderful!",
    "A long, winding, self-indulgent mess of a movie that never finds its footing.",
]


@pytest.fixture(scope="module")
def lexicon_module() -> ModuleType:
    """``jobs/examples/lexicon_handler.py`` imported as a module."""
    path = ROOT / "jobs" / "examples" / "lexicon_handler.py"
    spec = importlib.util.spec_from_file_location("lexicon_handler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lexicon_handler"] = module
    spec.loader.exec_module(module)
    return module


def _assert_report(report: ContractReport, version: str, device: str) -> None:
    assert report.examples == len(EXAMPLES)
    assert report.model_version == version
    assert report.device == device
    assert len(report.example_tokens) == len(EXAMPLES)
    assert report.example_tokens[3] > report.example_tokens[1] >= 1


def test_sentiment_handler_onnx_cpu_keeps_the_contract(model_assets: ModelAssets) -> None:
    report = check_model_handler(SentimentHandler(model_assets, intra_op_num_threads=2), EXAMPLES)
    _assert_report(report, model_assets.sha256, "cpu")
    assert report.example_tokens[1] == 4  # [CLS] dull . [SEP]
    assert 0.0 < report.max_abs_diff < 1e-5  # padding moves the last bits, within atol


def test_torch_handler_cpu_keeps_the_contract(model_assets: ModelAssets) -> None:
    handler = TorchSentimentHandler(model_assets, intra_op_num_threads=2)
    report = check_model_handler(handler, EXAMPLES)
    _assert_report(report, handler.model_version(), "cpu")
    assert report.max_abs_diff < 1e-5


def test_example_lexicon_handler_keeps_the_contract(lexicon_module: ModuleType, tmp_path: Path) -> None:
    train, heldout = split_reviews(load_rotten_tomatoes())
    lexicon = lexicon_module.train_lexicon(train)
    sha256 = lexicon.save(tmp_path / "lexicon.json")
    handler = lexicon_module.LexiconSentimentHandler(tmp_path / "lexicon.json", sha256)
    report = check_model_handler(handler, [r.text for r in heldout[:40]])
    assert report.model_version == sha256 and report.device == "cpu"
    assert report.max_abs_diff == 0.0  # pure Python: batching changes nothing
    model = handler.load_model()
    scores = np.array([p.score for p in handler.run_inference([r.text for r in heldout], model)])
    labels = np.array([r.label for r in heldout])
    assert float(((scores >= 0.5) == (labels == 1)).mean()) > 0.75  # measured 0.787


# ---- deliberately broken handlers ---------------------------------------------------------


class LengthHandler(ModelHandler[str, float, dict[str, float]]):
    """A correct toy handler: score = number of characters / 100."""

    def load_model(self) -> dict[str, float]:
        return {"scale": 100.0}

    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        return [len(text) / model["scale"] for text in batch]

    def model_version(self) -> str:
        return "length-1"


class DropsLast(LengthHandler):
    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        return list(super().run_inference(batch, model))[:-1] if len(batch) > 1 else [0.0] * len(batch)


class Reversed(LengthHandler):
    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        return list(super().run_inference(batch, model))[::-1]


class SortsWithoutUnsorting(LengthHandler):
    """Scores texts sorted by value and forgets to restore the input order."""

    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        return list(super().run_inference(sorted(batch), model))


class SortsInPlace(LengthHandler):
    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        out = list(super().run_inference(batch, model))
        batch.sort()  # type: ignore[attr-defined]
        return out


class ReturnsGenerator(LengthHandler):
    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Any:
        return (len(text) for text in batch)


class NoisyHandler(LengthHandler):
    """Adds 1e-7 per batch position: fine within atol=1e-5, caught at atol=0."""

    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        return [x + 1e-7 * i for i, x in enumerate(super().run_inference(batch, model))]


class EmptyGivesOne(LengthHandler):
    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        return list(super().run_inference(batch, model)) or [0.0]


class HoldsLock(LengthHandler):
    def __init__(self) -> None:
        self.lock = threading.Lock()


class NoVersion(LengthHandler):
    def model_version(self) -> str:
        return ""


class ZeroTokens(LengthHandler):
    def example_tokens(self, example: str, model: dict[str, float]) -> int:
        return 0


class BoolTokens(LengthHandler):
    def example_tokens(self, example: str, model: dict[str, float]) -> int:
        return True


class LoadFails(LengthHandler):
    def load_model(self) -> dict[str, float]:
        raise FileNotFoundError("/models/missing.onnx")


class ReleaseFails(LengthHandler):
    def release_model(self, model: dict[str, float]) -> None:
        raise RuntimeError("double free")


class DictOutputs(LengthHandler):
    """Structured outputs (an array and a label); the batch path garbles the first label."""

    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        out = [{"vec": np.array([len(t), t.count(" ")], dtype=np.float32), "label": t[:3]} for t in batch]
        if len(batch) > 1:
            out[0]["label"] = "???"
        return out


class SharedBuffer(LengthHandler):
    """Pipelined, but every launch writes its outputs into one buffer: a batch in flight is overwritten."""

    def pipeline_depth(self, model: dict[str, float]) -> int:
        return 2

    def launch_prepared(self, prepared: Any, rows: Any, model: dict[str, float]) -> Any:
        buffer: list[Any] = self.__dict__.setdefault("_buffer", [])
        buffer[:] = self.run_inference([prepared.payload[i] for i in rows.tolist()], model)
        return buffer


class Pipelined(LengthHandler):
    """Pipelined correctly: a launch returns its own outputs, collect hands them back."""

    def pipeline_depth(self, model: dict[str, float]) -> int:
        return 3

    def launch_prepared(self, prepared: Any, rows: Any, model: dict[str, float]) -> Any:
        return ("launched", list(self.run_inference([prepared.payload[i] for i in rows.tolist()], model)))

    def collect_prepared(self, handle: Any, model: dict[str, float]) -> Sequence[Any]:
        tag, outputs = handle
        assert tag == "launched"
        return outputs


class ZeroDepth(LengthHandler):
    def pipeline_depth(self, model: dict[str, float]) -> int:
        return 0


class EmptyUuid(LengthHandler):
    def device_uuid(self, model: dict[str, float]) -> str | None:
        return ""


UNSORTED = ["bb", "a", "dddd", "ccc"]
SORTED = sorted(UNSORTED)


@pytest.mark.parametrize(
    ("handler", "examples", "check", "reason"),
    [
        (DropsLast(), UNSORTED, "output_count", "3 outputs for 4 inputs"),
        (Reversed(), UNSORTED, "order", "output 0 of the batch differs from example 0"),
        (SortsWithoutUnsorting(), UNSORTED, "order", "output 0 of the batch"),
        (SortsWithoutUnsorting(), SORTED, "shuffle", "of a shuffled batch"),
        (SortsInPlace(), UNSORTED, "input_unchanged", "changed its input list"),
        (ReturnsGenerator(), UNSORTED, "output_count", "generator without len()"),
        (EmptyGivesOne(), UNSORTED, "empty_batch", "1 outputs for 0 inputs"),
        (HoldsLock(), UNSORTED, "picklable", "cannot be pickled"),
        (NoVersion(), UNSORTED, "model_version", "non-empty str"),
        (ZeroTokens(), UNSORTED, "example_tokens", "example 0 ('bb'): expected an int >= 1, got 0"),
        (BoolTokens(), UNSORTED, "example_tokens", "got True"),
        (LoadFails(), UNSORTED, "load_model", "FileNotFoundError: /models/missing.onnx"),
        (ReleaseFails(), UNSORTED, "release_model", "RuntimeError: double free"),
        (DictOutputs(), UNSORTED, "order", "['label']: '???' != 'bb'"),
        (SharedBuffer(), UNSORTED, "pipelined", "example 3 through launch_prepared/collect_prepared"),
        (ZeroDepth(), UNSORTED, "pipeline_depth", "an int >= 1, got 0"),
        (EmptyUuid(), UNSORTED, "device_uuid", "None or a non-empty str, got ''"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, ModelHandler) else None,
)
def test_broken_handler_fails_with_the_reason(
    handler: ModelHandler[Any, Any, Any], examples: list[str], check: str, reason: str
) -> None:
    with pytest.raises(HandlerContractError) as info:
        check_model_handler(handler, examples)
    assert info.value.check == check
    assert reason in info.value.reason, info.value.reason
    assert str(info.value).startswith(f"[{check}] ")


def test_a_correctly_pipelined_handler_passes() -> None:
    report = check_model_handler(Pipelined(), UNSORTED)
    assert "pipelined" in report.checks and report.max_abs_diff == 0.0


def test_correct_toy_handler_passes_and_tolerance_applies() -> None:
    report = check_model_handler(LengthHandler(), UNSORTED)
    assert report.max_abs_diff == 0.0 and report.example_tokens == (1, 1, 1, 1)
    assert report.model_version == "length-1" and report.device == "cpu"
    noisy = check_model_handler(NoisyHandler(), UNSORTED, atol=1e-5)
    assert noisy.max_abs_diff == pytest.approx(3e-7, rel=1e-3)
    with pytest.raises(HandlerContractError, match=r"\[order\] .* max abs difference 1e-07 > atol 0"):
        check_model_handler(NoisyHandler(), UNSORTED, atol=0.0)


class Counting(LengthHandler):
    def __init__(self) -> None:
        self.calls = 0

    def run_inference(self, batch: Sequence[str], model: dict[str, float]) -> Sequence[Any]:
        self.calls += 1
        return super().run_inference(batch, model)


def test_checks_run_on_a_pickled_copy() -> None:
    handler = Counting()
    check_model_handler(handler, UNSORTED)
    assert handler.calls == 0  # 1 batch + 4 alone + 1 shuffled + 1 empty ran on the copy


def test_needs_two_examples_and_valid_atol() -> None:
    with pytest.raises(ConfigError):
        check_model_handler(LengthHandler(), ["only one"])
    with pytest.raises(ConfigError):
        check_model_handler(LengthHandler(), UNSORTED, atol=-1.0)


def test_contract_error_is_an_assertion_error() -> None:
    assert issubclass(HandlerContractError, AssertionError)
