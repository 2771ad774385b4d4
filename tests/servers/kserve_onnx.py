"""A KServe model server (the ``kserve`` package's own ``ModelServer``) serving ONNX graphs
over the Open Inference Protocol v2, REST and gRPC: what a user deploys as a KServe custom
Python predictor. Runs in its own virtual environment (``tests/servers/install.sh``), not
the job's: KServe pins other grpcio / protobuf versions than PyFlink.

    python kserve_onnx.py --http_port 8080 --grpc_port 8081 --onnx NAME=PATH [--onnx NAME=PATH ...] \
        [--any-version]

Each model takes its graph's inputs and returns every graph output, with the metadata
(``GET /v2/models/NAME``) read from the graph. KServe serves one version of a model and answers
``501`` to a versioned path; ``--any-version`` answers ``POST /v2/models/NAME/versions/V/infer`` as
``/v2/models/NAME/infer`` (a client that always names a version, as Flink's ``triton`` provider does).
"""

from __future__ import annotations

import argparse
import re

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

_V2_TYPES = {"tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(int64)": "INT64",
             "tensor(int32)": "INT32", "tensor(bool)": "BOOL", "tensor(string)": "BYTES"}


def _shape(arg):
    return [d if isinstance(d, int) else -1 for d in (arg.shape if isinstance(arg.shape, list) else [])]


class OnnxModel(Model):
    def __init__(self, name: str, path: str):
        super().__init__(name)
        self.path = path
        self.session = None

    def load(self) -> bool:
        self.session = ort.InferenceSession(self.path, providers=["CPUExecutionProvider"])
        self.ready = True
        return self.ready

    def get_input_types(self):
        return [{"name": a.name, "datatype": _V2_TYPES[a.type], "shape": _shape(a)}
                for a in self.session.get_inputs()]

    def get_output_types(self):
        return [{"name": a.name, "datatype": _V2_TYPES[a.type], "shape": _shape(a)}
                for a in self.session.get_outputs()]

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        feeds = {}
        for arg in self.session.get_inputs():
            tensor = next(i for i in payload.inputs if i.name == arg.name)
            value = tensor.as_numpy()
            if arg.type == "tensor(string)":  # BYTES elements arrive as bytes (gRPC) or str (REST)
                texts = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.ravel()]
                value = np.array(texts, dtype=object).reshape(value.shape)
            feeds[arg.name] = value
        names = [a.name for a in self.session.get_outputs()]
        values = self.session.run(names, feeds)
        outputs = []
        for arg, value in zip(self.session.get_outputs(), values, strict=True):
            value = np.asarray(value)
            out = InferOutput(name=arg.name, shape=list(value.shape), datatype=_V2_TYPES[arg.type])
            # binary where the request asks for it (gRPC with raw inputs, REST with binary_data_output),
            # as KServe's own servers set it (kserve.utils.get_predict_response): no Python list between
            out.set_data_from_numpy(value.astype(object) if arg.type == "tensor(string)" else value,
                                    binary_data=payload.use_binary_outputs)
            outputs.append(out)
        # the outputs asked for, binary where asked (the binary tensor data extension), as KServe's own do
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs,
                             requested_outputs=payload.request_outputs or None,
                             use_binary_outputs=payload.use_binary_outputs)


class AnyVersion:
    """ASGI middleware: ``/v2/models/M/versions/V/infer`` → ``/v2/models/M/infer``."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and "/versions/" in scope["path"]:
            path = re.sub(r"^(/v2/models/[^/]+)/versions/[^/]+/infer$", r"\1/infer", scope["path"])
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--any-version", action="store_true", help="answer a versioned infer path too")
    args, _ = parser.parse_known_args()  # the rest are KServe's own (--http_port, --grpc_port, ...)
    models = []
    for spec in args.onnx:
        name, _, path = spec.partition("=")
        model = OnnxModel(name, path)
        model.load()
        models.append(model)
    if args.any_version:
        from kserve import model_server

        model_server.app.add_middleware(AnyVersion)
    ModelServer().start(models)


if __name__ == "__main__":
    main()
