"""What Flink's own ``triton`` model provider (flink-model-triton 2.3.0) needs to run at all against
the bench's V2 server, kept apart from the bench so that each step is named:

* :func:`provider_jar`: compiles ``bench/java`` (``SchemaCheckedTritonFactory``, provider
  ``triton-schema-checked``) against the pinned Flink and provider jars. 2.3.0 refuses every model
  at planning (its single-column check passes only when the types differ) and cannot ship its
  function to a task (a ``ByteArrayOutputStream`` field in a ``Serializable`` class); the subclass
  repairs the two, and the requests, client and parsing stay Flink's.
* :func:`capitalized_model`: a copy of an ONNX graph whose inputs and outputs are named in capitals.
  The provider sends each tensor's name upper-cased (``name.toUpperCase()``), and a V2 server
  matches names exactly, so a model served to it must be named so.
* :func:`without_version`: the provider always calls ``/v2/models/M/versions/V/infer`` (``V``
  defaults to ``latest``); the KServe server serves one version per model and answers 501 to a
  versioned path, so the bench's proxy drops the segment, as a gateway would.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import onnx

from pyflink_aisp.jars import JarKind, ensure_jars

JAVA = Path(__file__).resolve().parent / "java"
IDENTIFIER = "triton-schema-checked"
_VERSIONED = re.compile(r"/versions/[^/]+/infer$")


def provider_jar(out_dir: Path) -> Path:
    """``out_dir/triton-schema-checked.jar``: ``bench/java`` compiled (javac ``--release 11``) with its
    service file, so that Flink's factory discovery finds ``triton-schema-checked``.

    Raises:
        EnvironmentSetupError: No Maven to fetch the provider jar (:func:`ensure_jars`).
        FileNotFoundError: No ``javac`` / ``jar`` on PATH, or no Flink jars in the PyFlink package.
        subprocess.CalledProcessError: The source does not compile against these jars.
    """
    import pyflink

    lib = Path(pyflink.__file__).resolve().parent / "lib"
    flink = [*sorted(lib.glob("flink-dist-*.jar")), *sorted(lib.glob("flink-table-api-java-uber-*.jar"))]
    triton = [p for p in ensure_jars(JarKind.FLINK_MODELS) if p.name.startswith("flink-model-triton")]
    if len(flink) != 2 or not triton:
        raise FileNotFoundError(f"no flink-dist / table API jar in {lib} or no flink-model-triton jar")
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise FileNotFoundError("javac and jar (a JDK) are needed to build the bench's triton provider")
    classes = out_dir / "triton-provider-classes"
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    sources = [str(p) for p in sorted(JAVA.rglob("*.java"))]
    classpath = ":".join(str(p) for p in [*flink, *triton])
    subprocess.run([javac, "--release", "11", "-cp", classpath, "-d", str(classes), *sources],
                   check=True, capture_output=True, text=True)
    shutil.copytree(JAVA / "META-INF", classes / "META-INF")
    target = out_dir / f"{IDENTIFIER}.jar"
    subprocess.run([jar, "cf", str(target), "-C", str(classes), "."], check=True, capture_output=True)
    return target


def capitalized_model(source: Path, target: Path) -> Path:
    """``target``: the ONNX graph at ``source`` with every graph input and output renamed to its
    upper-case name (and each node's references with it); the computation is unchanged.

    Raises:
        ValueError: Two of the names are equal in capitals.
    """
    model = onnx.load(str(source))
    ends = [*model.graph.input, *model.graph.output]
    names = {v.name: v.name.upper() for v in ends}
    if len(set(names.values())) != len(names):
        raise ValueError(f"{source}: graph inputs and outputs collide in capitals: {sorted(names)}")
    for value in ends:
        value.name = names[value.name]
    for node in model.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return target


def without_version(path: str) -> str:
    """``/v2/models/M/versions/V/infer`` → ``/v2/models/M/infer``; any other path as it is."""
    return _VERSIONED.sub("/infer", path)
