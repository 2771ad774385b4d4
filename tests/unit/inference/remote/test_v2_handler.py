"""The V2 handler's requests and answers (httpx.MockTransport as the server; the real KServe
server is in tests/integration/remote): metadata → fields, batches → tensors of at most
rows_per_request rows, a failed request fails its rows alone, in order."""

import json

import httpx
import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError, ModelError, RemoteError
from pyflink_aisp.inference import BatchingConfig, ModelRuntime
from pyflink_aisp.inference.handlers.remote import RemoteEndpoint, RemoteSession, V2Model, V2PredictorHandler
from pyflink_aisp.inference.handlers.remote._v2 import _plan
from pyflink_aisp.inference.tasks import SqlType

META = {"name": "risk", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "Label", "datatype": "INT64", "shape": [-1]},
                    {"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]},
                    {"name": "variable", "datatype": "FP32", "shape": [-1, 1]}]}


def _server(requests, fail_when=lambda rows: False):
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        [tensor] = body["inputs"]
        x = np.array(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        if fail_when(x):
            return httpx.Response(400, text="bad tensor")
        k = x.shape[0]
        probs = np.stack([1 - x[:, 0] / 10, x[:, 0] / 10], axis=1)
        return httpx.Response(200, json={"model_name": "risk", "outputs": [
            {"name": "Label", "datatype": "INT64", "shape": [k], "data": (x[:, 0] > 5).astype(int).tolist()},
            {"name": "probabilities", "datatype": "FP32", "shape": [k, 2], "data": probs.ravel().tolist()},
            {"name": "variable", "datatype": "FP32", "shape": [k, 1], "data": x.sum(axis=1).tolist()}]})
    return answer


def _model(handler, transport) -> V2Model:
    session = RemoteSession(handler.endpoint, transport=httpx.MockTransport(transport))
    return V2Model(session, _plan("risk", META))


def test_metadata_outputs_become_typed_fields() -> None:
    plan = _plan("risk", META)
    assert [(f.name, f.sql_type) for _, f in plan.outputs] == [
        ("label", SqlType.BIGINT), ("probabilities", SqlType.ARRAY_FLOAT), ("variable", SqlType.DOUBLE)]
    assert (plan.input_name, plan.datatype, plan.n_features) == ("x", "FP32", 3)


@pytest.mark.parametrize(("metadata", "message"), [
    ({"error": "Model not found"}, "Open Inference Protocol v2 server"),
    ({**META, "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]}, "one float tensor"),
    ({**META, "outputs": [{"name": "mask", "datatype": "BOOL", "shape": [-1, 4]}]}, "no SQL field takes it"),
    ({**META, "outputs": []}, "need one or more"),
])
def test_metadata_that_is_not_a_numeric_v2_model_is_refused(metadata, message) -> None:
    with pytest.raises(ModelError, match=message):
        _plan("risk", metadata)


def test_a_batch_goes_as_tensors_of_rows_per_request_in_order() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk", rows_per_request=4)
    requests: list = []
    model = _model(handler, _server(requests))
    try:
        x = np.arange(30, dtype=np.float32).reshape(10, 3) / 3
        out = handler.run_inference(list(x), model)
    finally:
        handler.release_model(model)
    assert [r["inputs"][0]["shape"] for r in requests] == [[4, 3], [4, 3], [2, 3]]
    wanted = [{"name": "Label"}, {"name": "probabilities"}, {"name": "variable"}]
    assert [r["outputs"] for r in requests] == [wanted] * 3
    assert [int(p["label"]) for p in out] == [int(v > 5) for v in x[:, 0]]
    np.testing.assert_allclose([p["variable"] for p in out], x.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(np.stack([p["probabilities"] for p in out])[:, 1], x[:, 0] / 10, rtol=1e-6)


def test_the_binary_extension_sends_a_json_header_then_the_tensors_little_endian_bytes() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk", rows_per_request=4, binary=True)
    seen: list = []
    json_server = _server([])

    def answer(request: httpx.Request) -> httpx.Response:
        length = int(request.headers["inference-header-content-length"])
        header, raw = json.loads(request.content[:length]), request.content[length:]
        seen.append((request.headers["content-type"], header, raw))
        [tensor] = header["inputs"]
        data = np.frombuffer(raw, dtype="<f4").reshape(tensor["shape"])
        as_json = {"inputs": [{**tensor, "data": data.ravel().tolist()}]}  # as the JSON server answers it
        answer = json_server(httpx.Request("POST", request.url, json=as_json)).json()
        raws = []  # ... then in the extension: each output's data as raw bytes after the header
        for out in answer["outputs"]:
            dtype = {"INT64": "<i8", "FP32": "<f4"}[out["datatype"]]
            raw = np.asarray(out.pop("data"), dtype=dtype).tobytes()
            out["parameters"] = {"binary_data_size": len(raw)}
            raws.append(raw)
        head = json.dumps(answer).encode()
        return httpx.Response(200, content=head + b"".join(raws),
                              headers={"inference-header-content-length": str(len(head))})

    model = _model(handler, answer)
    try:
        x = np.arange(30, dtype=np.float32).reshape(10, 3) / 3
        out = handler.run_inference(list(x), model)
    finally:
        handler.release_model(model)
    assert [h["inputs"][0]["shape"] for _, h, _ in seen] == [[4, 3], [4, 3], [2, 3]]
    sizes = [{"binary_data_size": n * 3 * 4} for n in (4, 4, 2)]
    assert [h["inputs"][0]["parameters"] for _, h, _ in seen] == sizes
    assert all(ctype == "application/octet-stream" and "data" not in h["inputs"][0] for ctype, h, _ in seen)
    assert all(o["parameters"] == {"binary_data": True} for _, h, _ in seen for o in h["outputs"])
    assert b"".join(raw for _, _, raw in seen) == x.astype("<f4").tobytes()
    np.testing.assert_allclose([p["variable"] for p in out], x.sum(axis=1), rtol=1e-6)
    assert [int(p["label"]) for p in out] == [int(v > 5) for v in x[:, 0]]
    np.testing.assert_allclose(np.stack([p["probabilities"] for p in out])[:, 1], x[:, 0] / 10, rtol=1e-6)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"texts": True}, "a text model"), ({"url": "grpc://s:8001"}, "gRPC sends raw tensor contents")])
def test_the_binary_extension_is_for_numeric_models_over_rest(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        V2PredictorHandler(**{"url": "http://s", "model": "risk", "binary": True, **kwargs})


def test_a_refused_request_fails_its_rows_alone_and_is_not_sent_again() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk", rows_per_request=2)
    requests: list = []
    model = _model(handler, _server(requests, fail_when=lambda x: bool((x[:, 0] == 99).any())))
    try:
        x = np.ones((6, 3), dtype=np.float32)
        x[3, 0] = 99  # in the second request (rows 2, 3)
        out = handler.run_inference(list(x), model)
    finally:
        handler.release_model(model)
    assert len(requests) == 3  # one per request: the batcher does not bisect a returned error
    assert [isinstance(p, RemoteError) for p in out] == [False, False, True, True, False, False]
    assert out[2].status == 400 and "bad tensor" in str(out[2])


def test_the_runtime_dead_letters_returned_errors_without_bisecting() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk", rows_per_request=2)
    requests: list = []
    transport = _server(requests, fail_when=lambda x: bool((x[:, 0] == 99).any()))
    handler._plan = _plan("risk", META)  # the metadata the job's client read
    handler.load_model = lambda: _model(handler, transport)  # type: ignore[method-assign]
    runtime = ModelRuntime(handler, BatchingConfig(max_batch_size=64, max_wait_ms=1), None)
    try:
        x = np.ones((8, 3), dtype=np.float32)
        x[5, 0] = 99
        outcomes = runtime.infer_batch(list(x))
    finally:
        runtime.release()
    assert [type(o).__name__ for o in outcomes] == ["Inferred"] * 4 + ["RemoteError"] * 2 + ["Inferred"] * 2
    assert all(o.model_version == "v2:risk" for o in outcomes if not isinstance(o, RemoteError))
    assert len(requests) == 4


def test_an_answer_of_the_wrong_shape_is_a_remote_error_of_its_rows() -> None:
    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"outputs": [{"name": "Label", "shape": [1], "data": [1]}]})

    handler = V2PredictorHandler(url="http://s", model="risk")
    model = _model(handler, short)
    try:
        out = handler.run_inference([[1, 2, 3], [4, 5, 6]], model)
    finally:
        handler.release_model(model)
    assert all(isinstance(p, RemoteError) for p in out)
    assert "output 'Label' has shape [1] with 1 values for 2 rows" in str(out[0])


def test_a_vector_of_another_width_fails_before_any_request() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk")
    requests: list = []
    model = _model(handler, _server(requests))
    try:
        with pytest.raises(ValueError, match=r"expected a \(3,\) feature vector"):
            handler.prepare_batch([[1.0, 2.0]], model)
    finally:
        handler.release_model(model)
    assert requests == []


def test_the_health_check_names_an_unreachable_server_and_an_unknown_model() -> None:
    with pytest.raises(RemoteError, match=r"127\.0\.0\.1:9 is unreachable"):
        V2PredictorHandler(url="http://127.0.0.1:9", model="risk", request_timeout_s=2.0).task()
    with pytest.raises(ConfigError, match="without '/'"):
        V2PredictorHandler(url="http://s", model="a/b")
    assert RemoteEndpoint(url="http://s/").url == "http://s"


def test_the_runtime_registers_the_handlers_remote_gauges() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk")
    requests: list = []
    transport = _server(requests)
    handler._plan = _plan("risk", META)
    handler.load_model = lambda: _model(handler, transport)  # type: ignore[method-assign]
    runtime = ModelRuntime(handler, BatchingConfig(max_batch_size=64, max_wait_ms=1), None)

    class Group:
        def __init__(self) -> None:
            self.gauges: dict = {}

        def gauge(self, name, read) -> None:
            self.gauges[name] = read

    group = Group()
    try:
        runtime.bind_metrics(group)
        runtime.infer_batch(list(np.ones((5, 3), dtype=np.float32)))
        assert group.gauges["remoteRequests"]() == 1 and group.gauges["recordsInferred"]() == 5
        assert {"remoteRetries", "remoteConcurrencyLimit", "remoteThrottledMs"} <= set(group.gauges)
    finally:
        runtime.release()


def test_a_non_finite_vector_fails_alone_before_any_request() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk")
    requests: list = []
    model = _model(handler, _server(requests))
    try:
        for bad in ([float("nan"), 1.0, 1.0], [1e300, 1.0, 1.0]):  # 1e300 is inf as FP32
            with pytest.raises(ValueError, match="NaN or infinity"):
                handler.prepare_batch([bad], model)
        assert model.session.limiter.inflight == 0
        assert len(handler.run_inference([[1.0, 2.0, 3.0]], model)) == 1  # still serving
    finally:
        handler.release_model(model)


TEXT_META = {"name": "tfidf", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}],
             "outputs": [{"name": "label", "datatype": "BYTES", "shape": [-1]}]}


def test_a_text_model_takes_one_bytes_input_and_the_texts_go_as_strings() -> None:
    plan = _plan("tfidf", TEXT_META, texts=True)
    assert plan.texts and plan.rank == 2 and plan.n_features == 1
    requests = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        [tensor] = body["inputs"]
        return httpx.Response(200, json={"outputs": [{"name": "label", "datatype": "BYTES",
                                                      "shape": [tensor["shape"][0]],
                                                      "data": [t.upper() for t in tensor["data"]]}]})

    handler = V2PredictorHandler(url="http://s", model="tfidf", texts=True, rows_per_request=2)
    model = V2Model(RemoteSession(handler.endpoint, transport=httpx.MockTransport(answer)), plan)
    try:
        out = handler.run_inference(["é bien", "dull", "ok"], model)
        assert [o["label"] for o in out] == ["É BIEN", "DULL", "OK"]
        assert requests[0]["inputs"] == [{"name": "text", "shape": [2, 1], "datatype": "BYTES",
                                          "data": ["é bien", "dull"]}]
        assert handler.batch_byte_size(["é bien", "dull"]) == 7 + 4  # UTF-8 bytes
        with pytest.raises(ValueError, match="a text model takes strings, got int"):
            model.stack(["a", 3])
    finally:
        model.session.close()


@pytest.mark.parametrize(("inputs", "texts", "message"), [
    (TEXT_META["inputs"], False, "numeric model takes one float tensor .*a text model: leave out --feature"),
    (META["inputs"], True, "a text model takes one BYTES tensor \\[-1\\] or \\[-1, 1\\]"),
    ([{"name": "t", "datatype": "BYTES", "shape": [-1, 2]}], True, "a text model takes one BYTES tensor"),
])
def test_an_input_of_the_other_kind_is_refused_with_a_hint(inputs, texts, message) -> None:
    with pytest.raises(ModelError, match=message):
        _plan("m", {**TEXT_META, "inputs": inputs}, texts=texts)


def test_a_batch_with_a_nan_or_a_ragged_row_names_the_fault_before_any_request() -> None:
    handler = V2PredictorHandler(url="http://s", model="risk")
    requests: list = []
    model = _model(handler, _server(requests))
    try:
        assert model.stack([[1.0, 2.0, 3.0], (4, 5, 6)]).tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
        with pytest.raises(ValueError, match="holds NaN or infinity"):
            model.stack([[1.0, 2.0, 3.0], [float("nan"), 0.0, 1.0]])
        with pytest.raises(ValueError, match="holds NaN or infinity"):
            model.stack([[1.0, 2.0, 1e39]])  # past float32's range after the cast
        with pytest.raises(ValueError, match=r"expected a \(3,\) feature vector, got shape \(2,\)"):
            model.stack([[1.0, 2.0, 3.0], [1.0, 2.0]])
    finally:
        handler.release_model(model)
    assert requests == []
