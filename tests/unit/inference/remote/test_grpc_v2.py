"""The V2 handler over gRPC (``grpc://``) against an in-process ``grpc.server`` running a scripted
servicer (the real KServe server is in tests/integration/remote/test_v2_grpc.py): the generated
messages match their .proto; raw and typed answers read alike; statuses map to HTTP ones and
are retried, dead-lettered or waited out as over REST; the key travels as call metadata only."""

from __future__ import annotations

import concurrent.futures
import filecmp
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError, RemoteError, RemoteTimeoutError
from pyflink_aisp.inference.handlers.remote import LimiterConfig, RemoteEndpoint, V2PredictorHandler
from pyflink_aisp.inference.handlers.remote._grpc_v2 import GRPC_HTTP_STATUS, answer_json, infer_request
from pyflink_aisp.inference.handlers.remote.proto import grpc_predict_v2_pb2 as pb
from pyflink_aisp.inference.handlers.remote.proto import grpc_predict_v2_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[4]
PROTO = Path("pyflink_aisp/inference/handlers/remote/proto/grpc_predict_v2.proto")


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """Model ``risk``: input ``x`` FP32 [-1, 3]; outputs ``score`` FP32 [-1, 1] (the row's sum) and
    ``label`` BYTES [-1] (``high`` when x[0] > 5), raw or typed; ``faults`` scripts the first calls."""

    def __init__(self, *, raw: bool = True) -> None:
        self.raw = raw
        self.faults: list[tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]] | float] = []
        self.infers: list[pb.ModelInferRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def ModelMetadata(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        if request.name != "risk":
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.name} not found")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name="risk", platform="test", inputs=[tensor(name="x", datatype="FP32", shape=[-1, 3])],
            outputs=[tensor(name="score", datatype="FP32", shape=[-1, 1]),
                     tensor(name="label", datatype="BYTES", shape=[-1])])

    def ModelInfer(self, request, context):
        with self.lock:
            self.infers.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
            fault = self.faults.pop(0) if self.faults else None
        if isinstance(fault, float):
            time.sleep(fault)
        elif fault is not None:
            code, details, trailing = fault
            context.set_trailing_metadata(trailing)
            context.abort(code, details)
        [tensor] = request.inputs
        x = np.frombuffer(request.raw_input_contents[0], dtype="<f4").reshape(list(tensor.shape))
        k = x.shape[0]
        labels = [b"high" if v > 5 else b"low" for v in x[:, 0]]
        out = pb.ModelInferResponse(model_name="risk")
        score = out.outputs.add(name="score", datatype="FP32", shape=[k, 1])
        label = out.outputs.add(name="label", datatype="BYTES", shape=[k])
        if self.raw:
            out.raw_output_contents.append(x.sum(axis=1).astype("<f4").tobytes())
            out.raw_output_contents.append(b"".join(len(s).to_bytes(4, "little") + s for s in labels))
        else:
            score.contents.fp32_contents.extend(x.sum(axis=1).tolist())
            label.contents.bytes_contents.extend(labels)
        return out


@pytest.fixture
def server():
    """``(servicer, grpc url)`` of a scripted server on a free loopback port."""
    servicer = _Servicer()
    grpc_server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield servicer, f"grpc://127.0.0.1:{port}"
    finally:
        grpc_server.stop(grace=None)


def _x(n: int) -> np.ndarray:
    return np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 4


def _run(handler: V2PredictorHandler, rows: np.ndarray) -> tuple[list, object]:
    model = handler.load_model()
    try:
        return handler.run_inference(list(rows), model), model.session
    finally:
        handler.release_model(model)


def test_the_generated_modules_match_the_proto(tmp_path) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT), f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", str(ROOT / PROTO)], check=True)
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
        name = PROTO.stem + suffix
        assert filecmp.cmp(tmp_path / PROTO.parent / name, ROOT / PROTO.parent / name, shallow=False), \
            f"{name} is stale: run make protos"


def test_every_grpc_status_has_an_http_status() -> None:
    assert set(GRPC_HTTP_STATUS) == set(grpc.StatusCode)
    code = grpc.StatusCode
    codes = (code.RESOURCE_EXHAUSTED, code.UNAVAILABLE, code.INVALID_ARGUMENT)
    assert [GRPC_HTTP_STATUS[c] for c in codes] == [429, 503, 400]


def test_a_request_carries_the_tensor_as_little_endian_raw_bytes() -> None:
    x = _x(2).astype(np.float64)
    request = infer_request("risk", "3", "x", "FP64", x, ["score"])
    assert (request.model_name, request.model_version, list(request.inputs[0].shape)) == ("risk", "3", [2, 3])
    np.testing.assert_array_equal(np.frombuffer(request.raw_input_contents[0], "<f8").reshape(2, 3), x)
    assert [o.name for o in request.outputs] == ["score"]


def test_raw_and_typed_answers_read_alike() -> None:
    raw, typed = pb.ModelInferResponse(), pb.ModelInferResponse()
    for answer in (raw, typed):
        answer.outputs.add(name="p", datatype="FP32", shape=[2, 2])
        answer.outputs.add(name="l", datatype="BYTES", shape=[2])
        answer.outputs.add(name="n", datatype="INT64", shape=[2])
    raw.raw_output_contents.extend([np.array([.1, .9, .7, .3], "<f4").tobytes(),
                                    b"\x03\x00\x00\x00yes\x02\x00\x00\x00no",
                                    np.array([7, -1], "<i8").tobytes()])
    typed.outputs[0].contents.fp32_contents.extend([.1, .9, .7, .3])
    typed.outputs[1].contents.bytes_contents.extend([b"yes", b"no"])
    typed.outputs[2].contents.int64_contents.extend([7, -1])
    got = answer_json(raw)
    assert got == answer_json(typed)
    assert [o["data"] for o in got["outputs"][1:]] == [["yes", "no"], [7, -1]]
    np.testing.assert_allclose(got["outputs"][0]["data"], [.1, .9, .7, .3], rtol=1e-6)


def test_raw_bytes_elements_past_the_end_are_an_error() -> None:
    answer = pb.ModelInferResponse()
    answer.outputs.add(name="l", datatype="BYTES", shape=[1])
    answer.raw_output_contents.append(b"\x09\x00\x00\x00short")
    with pytest.raises(RemoteError, match="runs past its end"):
        answer_json(answer)


@pytest.mark.parametrize("raw", [True, False])
def test_rows_go_several_per_request_and_come_back_in_order(server, raw) -> None:
    servicer, url = server
    servicer.raw = raw
    handler = V2PredictorHandler(url=url, model="risk", rows_per_request=4)
    assert [f.name for f in handler.task().fields] == ["score", "label"]
    x = _x(10)
    out, session = _run(handler, x)
    assert [o["label"] for o in out] == ["high" if v > 5 else "low" for v in x[:, 0]]
    np.testing.assert_allclose([o["score"] for o in out], x.sum(axis=1), rtol=1e-6)
    assert sorted(list(r.inputs[0].shape) for r in servicer.infers) == [[2, 3], [4, 3], [4, 3]]
    assert session.stats.requests == 3 and session.stats.retries == 0


def test_the_key_travels_as_call_metadata_and_nowhere_else(server, monkeypatch) -> None:
    servicer, url = server
    monkeypatch.setenv("V2_KEY", "sk-grpc-secret")
    servicer.faults = [(grpc.StatusCode.INVALID_ARGUMENT, "bad input", ())]
    handler = V2PredictorHandler(url=url, model="risk", api_key_env="V2_KEY")
    out, _ = _run(handler, _x(2))
    assert all(m.get("authorization") == "Bearer sk-grpc-secret" for m in servicer.metadata)
    assert all(isinstance(o, RemoteError) and "sk-grpc-secret" not in str(o) for o in out)


def test_overload_is_waited_out_and_retried_and_the_limit_backs_off(server) -> None:
    servicer, url = server
    servicer.faults = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", (("retry-after", "1"),)),
                       (grpc.StatusCode.UNAVAILABLE, "draining", ())]
    handler = V2PredictorHandler(url=url, model="risk", rows_per_request=8,
                                 concurrency=LimiterConfig(initial=4, maximum=4))
    started = time.monotonic()
    out, session = _run(handler, _x(8))
    assert not [o for o in out if isinstance(o, BaseException)]
    assert session.stats.retries == 2 and session.stats.requests == 3 and len(servicer.infers) == 3
    assert session.limiter.decreases == 2 and session.stats.throttled_s >= 1.0
    assert time.monotonic() - started >= 1.0


def test_a_refusal_fails_its_rows_alone_with_the_http_status_and_is_not_retried(server) -> None:
    servicer, url = server
    servicer.faults = [(grpc.StatusCode.INVALID_ARGUMENT, "shape [2, 3] expected [-1, 4]", ())]
    handler = V2PredictorHandler(url=url, model="risk", rows_per_request=2,
                                 concurrency=LimiterConfig(initial=1, maximum=1))
    out, session = _run(handler, _x(4) * 3)  # rows 2 and 3: x[0] 4.5 and 6.75
    assert isinstance(out[0], RemoteError) and out[0] is out[1] and out[0].status == 400
    assert "gRPC INVALID_ARGUMENT (HTTP 400): shape [2, 3]" in str(out[0])
    assert [o["label"] for o in out[2:]] == ["low", "high"]
    assert session.stats.failures == {400: 1} and len(servicer.infers) == 2


def test_answers_past_the_deadline_are_remote_timeouts(server) -> None:
    servicer, url = server
    servicer.faults = [2.0] * 4
    handler = V2PredictorHandler(url=url, model="risk", request_timeout_s=0.3, deadline_s=0.8)
    out, _ = _run(handler, _x(2))
    assert all(isinstance(o, RemoteTimeoutError) for o in out)
    assert "0.8 s deadline" in str(out[0]) and "DEADLINE_EXCEEDED" in str(out[0])


def test_the_start_up_check_names_an_unknown_model_and_a_port_that_is_not_grpc(server) -> None:
    _, url = server
    with pytest.raises(RemoteError, match="serves no model 'fraud' \\(gRPC NOT_FOUND\\)") as unknown:
        V2PredictorHandler(url=url, model="fraud").check()
    assert unknown.value.status == 404
    with socket_listening() as port, pytest.raises(RemoteError, match="answers no V2 gRPC ModelMetadata"):
        V2PredictorHandler(url=f"grpc://127.0.0.1:{port}", model="risk", request_timeout_s=0.5,
                           deadline_s=1.5).check()


def test_grpc_urls_are_for_the_v2_handler_only() -> None:
    from pyflink_aisp.inference.handlers.remote import OpenAIEmbeddingHandler, RemoteSession

    with pytest.raises(ConfigError, match="grpc://host:port"):
        RemoteEndpoint(url="grpc://server")
    with pytest.raises(ConfigError, match="only the V2 handler speaks gRPC"):
        RemoteSession(RemoteEndpoint(url="grpc://server:8001"))
    with pytest.raises(ConfigError, match="gRPC"):
        OpenAIEmbeddingHandler(url="grpc://server:8001", model="m")


class socket_listening:
    """A loopback port that accepts TCP and answers nothing (not a gRPC server)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        return self.sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_texts_go_as_length_prefixed_utf8_in_the_raw_contents() -> None:
    texts = np.array([["é"], ["ab"]], dtype=object)
    request = infer_request("tfidf", None, "text", "BYTES", texts, ["label"])
    assert list(request.inputs[0].shape) == [2, 1] and request.inputs[0].datatype == "BYTES"
    assert request.raw_input_contents[0] == b"\x02\x00\x00\x00\xc3\xa9\x02\x00\x00\x00ab"
