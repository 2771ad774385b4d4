"""Issue 22: the V2 handler over the protocol's gRPC binding (``grpc://``) against the real KServe
ModelServer's gRPC port (the ``v2_server`` fixture): the same outputs as the graph in process and
as the REST binding, several rows per request; the start-up check names an unknown model and a
port that is not the gRPC one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyflink_aisp.errors import RemoteError
from pyflink_aisp.inference.handlers import OnnxPredictorHandler
from pyflink_aisp.inference.handlers.remote import V2PredictorHandler

pytestmark = pytest.mark.integration


def test_the_grpc_binding_answers_as_the_graph_in_process_and_as_rest(
        run_handler, v2_server, embeddings) -> None:
    rest_url, onnx_path, grpc_url = v2_server.url, v2_server.onnx_path, v2_server.grpc_url
    over_grpc = V2PredictorHandler(url=grpc_url, model="intent_head", rows_per_request=16)
    assert [f.name for f in over_grpc.task().fields] == ["label", "probabilities"]
    got, session = run_handler(over_grpc, embeddings[:300], batch=100)
    stats = session.stats
    rest_handler = V2PredictorHandler(url=rest_url, model="intent_head", rows_per_request=16)
    rest, _ = run_handler(rest_handler, embeddings[:300], batch=100)
    local = OnnxPredictorHandler(model_path=onnx_path)
    want = local.run_inference(list(embeddings[:300]), local.load_model())
    assert not [g for g in got if isinstance(g, BaseException)]
    for g, r, w in zip(got, rest, want, strict=True):
        assert g["label"] == r["label"] == w["label"]
        np.testing.assert_allclose(g["probabilities"], w["probabilities"], atol=1e-6)
        np.testing.assert_array_equal(g["probabilities"], r["probabilities"])
    assert stats.requests == 3 * math.ceil(100 / 16) and stats.retries == 0 and not stats.failures
    assert len({g["label"] for g in got}) > 5


def test_the_start_up_check_names_an_unknown_model_and_the_rest_port(v2_server) -> None:
    rest_url, grpc_url = v2_server.url, v2_server.grpc_url
    with pytest.raises(RemoteError, match="serves no model 'fraud' \\(gRPC NOT_FOUND\\)"):
        V2PredictorHandler(url=grpc_url, model="fraud").check()
    rest_as_grpc = "grpc://" + rest_url.removeprefix("http://")
    with pytest.raises(RemoteError, match="answers no V2 gRPC ModelMetadata \\(is it the server's gRPC port"):
        V2PredictorHandler(url=rest_as_grpc, model="intent_head", request_timeout_s=1.0,
                           deadline_s=3.0).check()
