"""The torch handlers' device path (issue 23), run on the CPU.

- No hidden device-to-host sync in the forward pass: it runs with ``Tensor.__bool__`` and
  ``Tensor.item`` patched to raise, and gives today's ``encoder(**inputs)`` numbers.
- Launch / collect through a ring of slots with the CPU's :class:`HostOps` (depth 2-3) and a
  recording fake of CUDA's streams and events; the same outputs as the synchronous path.
- Few shapes: padded sequence lengths and batch buckets, outputs equal to unpadded ones.
- TF32, the memory limit, ``empty_cache`` and the device UUID with a fake ``torch.cuda``.

Texts are real Rotten Tomatoes snippets, few of them (torch on 2 cores is slow).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.errors import ConfigError, InferenceError, ModelError
from pyflink_aisp.inference.handlers import TorchEncoderHandler, TorchSentimentHandler
from pyflink_aisp.inference.handlers._common import Pooling
from pyflink_aisp.inference.handlers._torch import TorchSentimentModel
from pyflink_aisp.inference.handlers._torch_device import (
    HostOps,
    MaskMode,
    ShapePolicy,
    TorchDeviceOptions,
    default_buckets,
    device_uuid_of,
    empty_cache,
)
from pyflink_aisp.inference.handlers._torch_load import verified_mask_mode
from pyflink_aisp.inference.handlers._torch_runner import DeviceRunner, pad_rows_into
from pyflink_aisp.models import ModelAssets, locate_source_model
from pyflink_aisp.tokenize import ArrowTokenizer

ATOL = 1e-6


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """24 held-out snippets of mixed lengths."""
    return [r.text for r in split_reviews(load_rotten_tomatoes())[1][:24]]


@pytest.fixture(scope="module")
def handler(model_assets: ModelAssets) -> TorchSentimentHandler:
    return TorchSentimentHandler(model_assets, intra_op_num_threads=2)


@pytest.fixture(scope="module")
def model(handler: TorchSentimentHandler) -> TorchSentimentModel:
    return handler.load_model()


@pytest.fixture(scope="module")
def tokenizer(model: TorchSentimentModel) -> ArrowTokenizer:
    return model.tokenizer


def reference_scores(model: TorchSentimentModel, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The forward pass as it was before issue 23: ``encoder(**inputs)`` with the 2-D mask on
    the batch padded to its longest row, then pooling and the head."""
    padded = model.tokenizer.pad(model.encode(texts))
    with padded, torch.inference_mode():
        inputs = {k: torch.from_numpy(v) for k, v in padded.model_inputs().items()}
        hidden = model.encoder(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        embedding = torch.nn.functional.normalize(mean, p=2.0, dim=1, eps=1e-12)
        score = torch.sigmoid(embedding @ model._coef + model._intercept)
        return score.numpy(), embedding.numpy()


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """A tensor read on the host in Python (``bool(t)``, ``t.item()``: a device-to-host sync on
    CUDA) raises inside the block."""
    def refuse(self: Any, *args: Any) -> Any:
        raise AssertionError("a host sync in the forward pass")

    saved = torch.Tensor.__bool__, torch.Tensor.item
    torch.Tensor.__bool__, torch.Tensor.item = refuse, refuse  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.__bool__, torch.Tensor.item = saved  # type: ignore[method-assign]


# -- 1. no hidden sync ---------------------------------------------------------------------------


def test_the_hf_two_d_mask_syncs_so_the_guard_can_fail(model: TorchSentimentModel, texts: list[str]) -> None:
    with no_host_sync(), pytest.raises(AssertionError, match="host sync"):
        reference_scores(model, texts[:3])


def test_forward_has_no_host_sync_and_equals_todays_outputs(
    model: TorchSentimentModel, texts: list[str]
) -> None:
    assert model.mask_mode is MaskMode.BOOL_4D  # sdpa, the default implementation
    tokens = model.encode(texts)
    with no_host_sync():
        scores, embeddings = model.predict_rows(tokens, np.arange(len(texts)))
    ref_scores, ref_embeddings = reference_scores(model, texts)
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=ATOL)
    np.testing.assert_allclose(embeddings, ref_embeddings, rtol=0, atol=ATOL)


def test_eager_attention_gets_an_additive_mask_and_the_same_outputs(
    model_assets: ModelAssets, texts: list[str]
) -> None:
    eager = TorchSentimentHandler(model_assets, intra_op_num_threads=2).load_model()
    eager.encoder.set_attn_implementation("eager")
    rebuilt = TorchSentimentModel(eager.encoder, eager._coef.numpy(), float(eager._intercept[0]),
                                  eager.tokenizer, device="cpu", batch_size=8)
    assert rebuilt.mask_mode is MaskMode.ADDITIVE_4D
    with no_host_sync():
        scores, embeddings = rebuilt.predict_rows(rebuilt.encode(texts[:6]), np.arange(6))
    ref_scores, ref_embeddings = reference_scores(rebuilt, texts[:6])  # eager with the 2-D mask
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=ATOL)
    np.testing.assert_allclose(embeddings, ref_embeddings, rtol=0, atol=ATOL)


def test_a_model_that_misreads_the_four_d_mask_keeps_the_two_d_one(
    model: TorchSentimentModel,
) -> None:
    module = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))

    def refuses_four_d(ids: Any, mask: Any, types: Any) -> Any:
        if mask.dim() != 2:
            raise ValueError("expected a 2-D mask")
        return ids.float()

    def misreads_four_d(ids: Any, mask: Any, types: Any) -> Any:
        return ids.float() + (mask.dim() != 2)

    for call in (refuses_four_d, misreads_four_d):
        mode = verified_mask_mode(torch, module, model.tokenizer, torch.device("cpu"), call)
        assert mode is MaskMode.PADDING_2D
    agreeing = verified_mask_mode(torch, module, model.tokenizer, torch.device("cpu"),
                                  lambda ids, mask, types: ids.float())
    assert agreeing is MaskMode.BOOL_4D
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert verified_mask_mode(torch, flash, model.tokenizer, torch.device("cpu"),
                              lambda ids, mask, types: ids.float()) is MaskMode.PADDING_2D


def test_encoder_handler_forward_has_no_host_sync(texts: list[str]) -> None:
    handler = TorchEncoderHandler(model_dir=locate_source_model().directory, pooling=Pooling.MEAN,
                                  normalize=True, intra_op_num_threads=2)
    encoder = handler.load_model()
    assert encoder.mask_mode is MaskMode.BOOL_4D
    padded = encoder.tokenizer.pad(encoder.tokenizer.encode(texts[:8]))
    with padded, torch.inference_mode():
        inputs = {k: torch.from_numpy(v) for k, v in padded.model_inputs().items()}
        hidden = encoder.module(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=1)
    prepared = handler.prepare_batch(texts[:8], encoder)
    with no_host_sync():
        got = np.stack(handler.run_prepared(prepared, np.arange(8), encoder))
    np.testing.assert_allclose(got, ref.numpy(), rtol=0, atol=ATOL)


# -- 2. launch / collect through a ring of slots --------------------------------------------------


def test_launch_collect_at_depth_three_equals_the_synchronous_path(
    model_assets: ModelAssets, handler: TorchSentimentHandler, model: TorchSentimentModel, texts: list[str]
) -> None:
    deep = TorchSentimentHandler(model_assets, intra_op_num_threads=2, pipeline_depth=3)
    deep_model = deep.load_model()
    assert deep.pipeline_depth(deep_model) == 3 and handler.pipeline_depth(model) == 1
    prepared = deep.prepare_batch(texts, deep_model)
    parts = [np.arange(0, 5), np.arange(5, 12)[::-1].copy(), np.arange(12, 24)]
    handles = [deep.launch_prepared(prepared, rows, deep_model) for rows in parts]
    assert deep_model.runner.in_flight == 3
    first = handles[0]._slot  # type: ignore[union-attr]
    assert len({id(h._slot) for h in handles}) == 3  # type: ignore[union-attr]  # no slot shared
    snapshot = first.views[0].copy()  # type: ignore[union-attr]  # the first batch's padded ids
    fourth = deep.launch_prepared(prepared, np.arange(3), deep_model)  # depth + 1 in flight: allowed
    with pytest.raises(InferenceError, match="in flight"):
        deep.launch_prepared(prepared, np.arange(3), deep_model)
    assert np.array_equal(first.views[0], snapshot)  # type: ignore[union-attr]  # not reused in flight
    got = [deep.collect_prepared(h, deep_model) for h in handles]
    deep.collect_prepared(fourth, deep_model)
    assert deep_model.runner.in_flight == 0 and deep_model.runner.slots == 4
    sync = handler.run_prepared(handler.prepare_batch(texts, model), np.arange(24), model)
    for rows, predictions in zip(parts, got, strict=True):
        assert len(predictions) == len(rows)
        for row, (score, embedding) in zip(rows.tolist(), predictions, strict=True):
            assert abs(score - sync[row][0]) <= ATOL
            np.testing.assert_allclose(embedding, sync[row][1], rtol=0, atol=ATOL)
    with pytest.raises(InferenceError, match="collected already"):
        deep.collect_prepared(handles[0], deep_model)


def test_a_dropped_handle_gives_its_slot_back_and_a_failed_launch_holds_none(
    model: TorchSentimentModel, tokenizer: ArrowTokenizer, texts: list[str]
) -> None:
    calls = []

    def forward(ids: Any, mask: Any, types: Any) -> tuple[Any, ...]:
        calls.append(ids.shape)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory (fake)")
        return (mask.sum(dim=1),)

    runner = DeviceRunner(forward, ops=HostOps(), policy=ShapePolicy(), depth=1, pad_id=0, pad_type_id=0)
    tokens = tokenizer.encode(texts[:4])
    runner.launch(tokens, np.arange(2))  # dropped without collect
    gc.collect()
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.launch(tokens, np.arange(4))
    assert runner.in_flight == 0  # the dropped handle was reclaimed, the failed launch gave its slot back
    handle = runner.launch(tokens, np.arange(4))
    (lengths,) = runner.collect(handle)
    assert lengths.tolist() == tokens.lengths[:4].tolist()


class RecordingOps(HostOps):
    """CUDA's stream / event calls as a log: which stream is current, what is recorded, waited
    for and synchronised. Work still runs at once (on the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, ...]] = []
        self.current = "default"
        self._streams = iter(["copy", "compute"])
        self._events = 0

    def host_buffer(self, shape: tuple[int, ...], dtype: Any) -> Any:
        self.log.append(("host_buffer", self.current))
        return super().host_buffer(shape, dtype)

    def new_stream(self) -> Any:
        return next(self._streams)

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        saved, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = saved

    def new_event(self) -> Any:
        self._events += 1
        return f"event{self._events}"

    def record(self, event: Any, stream: Any) -> None:
        assert stream == self.current
        self.log.append(("record", event, stream))

    def wait(self, stream: Any, event: Any) -> None:
        assert stream == self.current
        self.log.append(("wait", stream, event))

    def synchronize(self, event: Any) -> None:
        self.log.append(("synchronize", event))


def test_copy_stream_compute_stream_and_events_are_ordered(
    tokenizer: ArrowTokenizer, texts: list[str]
) -> None:
    ops = RecordingOps()

    def forward(ids: Any, mask: Any, types: Any) -> tuple[Any, ...]:
        ops.log.append(("forward", ops.current))
        return (mask.sum(dim=1), ids[:, 0])

    policy = ShapePolicy(pad_to_multiple_of=8, batch_size_buckets=(4, 8))
    runner = DeviceRunner(forward, ops=ops, policy=policy, depth=2, pad_id=0, pad_type_id=0)
    tokens = tokenizer.encode(texts[:12])
    first = runner.launch(tokens, np.arange(6))
    second = runner.launch(tokens, np.arange(6, 12))
    ops.log.append(("collect",))
    lengths, cls = runner.collect(first)
    runner.collect(second)
    steps = [e for e in ops.log if e[0] != "host_buffer"]
    # slot 1 has events 1 (copied) and 2 (done); slot 2 events 3 and 4
    assert steps[:4] == [("record", "event1", "copy"), ("wait", "compute", "event1"),
                         ("forward", "compute"), ("record", "event2", "compute")]
    assert steps[4:8] == [("record", "event3", "copy"), ("wait", "compute", "event3"),
                          ("forward", "compute"), ("record", "event4", "compute")]
    assert steps[8:] == [("collect",), ("synchronize", "event2"), ("synchronize", "event4")]
    assert lengths.tolist() == tokens.lengths[:6].tolist() and cls.tolist() == [101] * 6
    allocated = sum(1 for e in ops.log if e[0] == "host_buffer")
    assert allocated == 2 * (3 + 2)  # two slots: three inputs and two outputs each
    runner.collect(runner.launch(tokens, np.arange(3, 9)))
    assert sum(1 for e in ops.log if e[0] == "host_buffer") == allocated  # a free slot's buffers reused


# -- 3. few shapes --------------------------------------------------------------------------------


def test_padding_rows_equals_the_tokenizers_padding_also_for_pairs(tokenizer: ArrowTokenizer) -> None:
    firsts = ["A gripping film.", "Dull.", "The plot meanders for two hours and never arrives."]
    for tokens in (tokenizer.encode(firsts), tokenizer.encode(firsts, ["Yes.", "No, it is long.", "Ok."])):
        rows = np.array([2, 0, 1], dtype=np.int64)
        expected = tokenizer.pad(tokens, rows)
        out = tuple(np.full((5, 32), -1, dtype=np.int64) for _ in range(3))
        pad_rows_into(tokens, rows, out, pad_id=tokenizer.pad_id, pad_type_id=tokenizer.pad_type_id)  # type: ignore[arg-type]
        width = expected.seq_len
        for got, want in zip(out, (expected.input_ids, expected.attention_mask, expected.token_type_ids),
                             strict=True):
            assert np.array_equal(got[:3, :width], want)
        ids, mask, _ = out
        assert (mask[:3, width:] == 0).all() and (ids[:3, width:] == tokenizer.pad_id).all()
        assert mask[3:].tolist() == [[1] + [0] * 31] * 2  # batch padding: one attended token
        expected.release()


def test_many_varied_batches_run_in_few_shapes_and_drop_the_padding_rows(
    tokenizer: ArrowTokenizer,
) -> None:
    corpus = [r.text for r in split_reviews(load_rotten_tomatoes())[1][:400]]
    tokens = tokenizer.encode(corpus)
    rng = np.random.default_rng(23)
    forward = lambda ids, mask, types: (mask.sum(dim=1), ids[:, 0])  # noqa: E731
    bucketed = DeviceRunner(forward, ops=HostOps(), depth=2, pad_id=0, pad_type_id=0,
                            policy=TorchDeviceOptions(device="cuda:0").shape_policy(64, 128))
    plain = DeviceRunner(forward, ops=HostOps(), policy=ShapePolicy(), depth=1, pad_id=0, pad_type_id=0)
    for _ in range(60):
        rows = rng.choice(len(corpus), size=int(rng.integers(1, 100)), replace=False)
        lengths, first = bucketed.run(tokens, rows)
        assert lengths.tolist() == tokens.lengths[rows].tolist() and (first == 101).all()
        plain.run(tokens, rows)
    shapes = set(bucketed.shapes)
    assert {b for b, _ in shapes} <= {8, 16, 32, 64} and all(s % 16 == 0 and s <= 128 for _, s in shapes)
    assert len(shapes) <= 4 * 8 < len(set(plain.shapes))  # at most 32 against one per batch
    assert len(set(plain.shapes)) >= 50


def test_padded_shapes_give_the_unpadded_outputs(
    model_assets: ModelAssets, model: TorchSentimentModel, texts: list[str]
) -> None:
    padded = TorchSentimentHandler(model_assets, intra_op_num_threads=2, batch_size=16,
                                   pad_to_multiple_of=16, batch_size_buckets=(8, 16)).load_model()
    tokens = padded.encode(texts)
    rows = np.arange(len(texts) - 1, -1, -1)[:21]  # 21 rows: passes of 16 and 5 (padded to 8)
    scores, embeddings = padded.predict_rows(tokens, rows)
    assert {b for b, _ in padded.runner.shapes} == {8, 16}
    assert all(s % 16 == 0 for _, s in padded.runner.shapes)
    ref_scores, ref_embeddings = model.predict_rows(model.encode(texts), rows)
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=ATOL)
    np.testing.assert_allclose(embeddings, ref_embeddings, rtol=0, atol=ATOL)
    predicted, _ = padded.predict(texts)
    np.testing.assert_allclose(predicted, model.predict(texts)[0], rtol=0, atol=ATOL)


def test_shape_policy_and_device_defaults() -> None:
    assert default_buckets(64) == (8, 16, 32, 64) and default_buckets(100) == (8, 16, 32, 64, 100)
    assert default_buckets(4) == (4,)
    policy = ShapePolicy(pad_to_multiple_of=16, batch_size_buckets=(8, 32), max_seq_len=100)
    assert [policy.seq_len(n) for n in (0, 1, 16, 17, 97, 100, 130)] == [16, 16, 16, 32, 100, 100, 130]
    assert policy.passes(5) == [(0, 5, 8)] and policy.passes(70) == [(0, 32, 32), (32, 64, 32), (64, 70, 8)]
    assert ShapePolicy().passes(7) == [(0, 7, 7)] and ShapePolicy().seq_len(9) == 9
    cuda = TorchDeviceOptions(device="cuda:1")
    assert (cuda.depth, cuda.index) == (2, 1)
    assert cuda.shape_policy(64, 128) == ShapePolicy(
        pad_to_multiple_of=16, batch_size_buckets=(8, 16, 32, 64), max_seq_len=128)
    cpu = TorchDeviceOptions()
    assert cpu.depth == 1 and cpu.shape_policy(64, 128) == ShapePolicy(max_seq_len=128)
    for bad in ({"pad_to_multiple_of": 0}, {"batch_size_buckets": (8, 8)}, {"batch_size_buckets": (0,)},
                {"pipeline_depth": 0}, {"pipeline_depth": 9}, {"memory_limit_bytes": 0, "device": "cuda:0"}):
        with pytest.raises(ConfigError):
            TorchDeviceOptions(**bad)  # type: ignore[arg-type]


# -- 4.-6. TF32, memory limit, out-of-memory release, device UUID ----------------------------------


def fake_torch(total_memory: int = 80 << 30, uuid: Any = "4dbe4f36-1a45-4f70-9f2c-0c5a1b2c3d4e",
               name: str = "NVIDIA H200") -> SimpleNamespace:
    """A ``torch`` stand-in with the parts of ``torch.cuda`` / ``torch.backends`` the handlers use."""
    calls: list[tuple[Any, ...]] = []

    @contextlib.contextmanager
    def device(where: Any) -> Iterator[None]:
        calls.append(("device", str(where)))
        yield

    cuda = SimpleNamespace(
        is_available=lambda: True,
        get_device_properties=lambda index: SimpleNamespace(total_memory=total_memory, uuid=uuid, name=name),
        set_per_process_memory_fraction=lambda fraction, index: calls.append(("fraction", fraction, index)),
        empty_cache=lambda: calls.append(("empty_cache",)),
        device=device,
    )
    backends = SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=False)),
                               cudnn=SimpleNamespace(allow_tf32=False))
    return SimpleNamespace(cuda=cuda, backends=backends, device=torch.device, calls=calls)


def test_tf32_is_refused_on_the_cpu_set_on_cuda_and_part_of_the_version(model_assets: ModelAssets) -> None:
    with pytest.raises(ConfigError, match="tf32=True needs a CUDA device"):
        TorchSentimentHandler(model_assets, tf32=True)
    with pytest.raises(ConfigError, match="tf32=True needs a CUDA device"):
        TorchEncoderHandler(model_dir=locate_source_model().directory, tf32=True)
    plain = TorchSentimentHandler(model_assets, device="cuda")
    tf32 = TorchSentimentHandler(model_assets, device="cuda", tf32=True)
    assert tf32.model_version() != plain.model_version()
    assert plain.model_version() == TorchSentimentHandler(model_assets).model_version()
    directory = locate_source_model().directory
    assert (TorchEncoderHandler(model_dir=directory, device="cuda", tf32=True).model_version()
            != TorchEncoderHandler(model_dir=directory, device="cuda").model_version())
    fake = fake_torch()
    TorchDeviceOptions(device="cuda:0", tf32=True).apply(fake)
    assert fake.backends.cuda.matmul.allow_tf32 is True and fake.backends.cudnn.allow_tf32 is True
    TorchDeviceOptions(device="cuda:0").apply(fake)
    assert fake.backends.cuda.matmul.allow_tf32 is False


def test_memory_limit_sets_the_process_fraction_and_refuses_more_than_the_device(
    model_assets: ModelAssets,
) -> None:
    with pytest.raises(ConfigError, match="CUDA devices only"):
        TorchSentimentHandler(model_assets, memory_limit_bytes=1 << 30)
    with pytest.raises(ConfigError, match="CUDA devices only"):
        TorchEncoderHandler(model_dir=locate_source_model().directory, memory_limit_bytes=1 << 30)
    fake = fake_torch(total_memory=8 << 30)
    TorchDeviceOptions(device="cuda:1", memory_limit_bytes=2 << 30).apply(fake)
    assert fake.calls == [("fraction", 0.25, 1)]
    with pytest.raises(ConfigError, match="exceeds the 8589934592 bytes of cuda:1"):
        TorchDeviceOptions(device="cuda:1", memory_limit_bytes=(8 << 30) + 1).apply(fake)
    TorchDeviceOptions(device="cuda:0").apply(fake)  # no limit: nothing set
    assert fake.calls == [("fraction", 0.25, 1)]


def test_out_of_memory_empties_the_cuda_cache_of_the_models_device(
    handler: TorchSentimentHandler, model: TorchSentimentModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_torch()
    empty_cache(fake, "cuda:1")
    assert fake.calls == [("device", "cuda:1"), ("empty_cache",)]
    empty_cache(fake, "cpu")
    assert len(fake.calls) == 2
    monkeypatch.setattr(model, "device", "cuda:0")
    monkeypatch.setattr(model, "_torch", fake)
    handler.on_out_of_memory(model)
    assert fake.calls[2:] == [("device", "cuda:0"), ("empty_cache",)]


def test_device_uuid_as_nvml_writes_it(handler: TorchSentimentHandler, model: TorchSentimentModel) -> None:
    assert handler.device_uuid(model) is None  # the CPU
    plain = "4dbe4f36-1a45-4f70-9f2c-0c5a1b2c3d4e"
    assert device_uuid_of(fake_torch(uuid=plain), "cuda:0") == f"GPU-{plain}"
    assert device_uuid_of(fake_torch(uuid=plain.replace("-", "").upper()), "cuda:0") == f"GPU-{plain}"
    assert device_uuid_of(fake_torch(uuid=plain, name="NVIDIA H200 MIG 1g.18gb"), "cuda:0") == f"MIG-{plain}"
    assert device_uuid_of(fake_torch(uuid=f"MIG-{plain}"), "cuda:0") == f"MIG-{plain}"
    assert device_uuid_of(fake_torch(), "cpu") is None
    with pytest.raises(ModelError, match="no UUID"):
        device_uuid_of(fake_torch(uuid=""), "cuda:0")


def test_encoder_handler_launches_in_flight_in_few_shapes_with_injected_ops(texts: list[str]) -> None:
    directory = locate_source_model().directory
    plain = TorchEncoderHandler(model_dir=directory, normalize=True, intra_op_num_threads=2)
    ops = RecordingOps()
    deep = TorchEncoderHandler(model_dir=directory, normalize=True, intra_op_num_threads=2, batch_size=8,
                               pad_to_multiple_of=16, batch_size_buckets=(4, 8), pipeline_depth=2,
                               device_ops=ops)
    assert deep.model_version() == plain.model_version()  # shapes and depth do not change outputs
    model, reference = deep.load_model(), plain.load_model()
    assert deep.pipeline_depth(model) == 2 and deep.device_uuid(model) is None
    prepared = deep.prepare_batch(texts[:14], model)
    first = deep.launch_prepared(prepared, np.arange(0, 11), model)  # passes of 8 and 3 (padded to 4)
    second = deep.launch_prepared(prepared, np.arange(11, 14), model)
    got = np.stack([*deep.collect_prepared(first, model), *deep.collect_prepared(second, model)])
    expected = np.stack(plain.run_inference(texts[:14], reference))
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    assert {b for b, _ in model.runner.shapes} == {4, 8} and all(s % 16 == 0 for _, s in model.runner.shapes)
    assert ("synchronize", "event2") in ops.log and ("wait", "compute", "event3") in ops.log
    assert deep.collect_prepared(deep.launch_prepared(prepared, np.arange(0), model), model) == []
