"""Pre-flight of a job's environment: one line naming the problem and its fix, before Flink starts.

Without it a missing connector jar surfaces as a 100-line Py4J trace ending
in ``ValidationException: Unable to create a source ... 'connector'='kafka'``,
a missing model directory or Python executable only when a TaskManager opens
the operator. :func:`~pyflink_aisp.pipeline._build.make_environment` checks, on the client:

* every ``pipeline.jars`` entry of the job is a readable jar file (``file://``
  URLs; other schemes are the cluster's to fetch), and together they provide
  the Flink Kafka table factory (``KafkaDynamicTableFactory``, listed in
  ``META-INF/services/org.apache.flink.table.factories.Factory``, the Java
  ``ServiceLoader`` file Flink's ``FactoryUtil`` reads, and its class present)
  and the Kafka client classes it loads;
* the model files the options name are readable files / directories;
* the model's device is usable here (``--device cuda:N``: a CUDA device N for
  PyTorch, the CUDA/TensorRT execution provider for ONNX Runtime);
* the workers' Python executable exists and is executable. A bare name is
  looked up on this host's ``PATH``; on a remote cluster the TaskManagers must
  have the same path (this host is all the client can check). A relative path
  inside a Python archive of the job (``flink run -pyarch env.tar.gz#env -pyexec
  env/venv/bin/python``, ``aisp package``) is extracted on the workers only: then
  the archive must be a readable file here.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.pipeline._config import InferenceOptions
from pyflink_aisp.pipeline._options import InferenceRuntime

__all__ = ["KAFKA_FACTORY", "archive_targets", "check_connector_jars", "check_device", "check_model_paths",
           "check_python", "nvidia_gpu_count"]

#: The table factory of ``'connector' = 'kafka'`` in flink-sql-connector-kafka (4.x, 5.x).
KAFKA_FACTORY = "org.apache.flink.streaming.connectors.kafka.table.KafkaDynamicTableFactory"
_SERVICES = "META-INF/services/org.apache.flink.table.factories.Factory"
_FACTORY_CLASS = KAFKA_FACTORY.replace(".", "/") + ".class"
#: The Kafka consumer class, shaded (flink-sql-connector-kafka) or plain (kafka-clients).
_CLIENT_CLASSES = frozenset({
    "org/apache/flink/kafka/shaded/org/apache/kafka/clients/consumer/KafkaConsumer.class",
    "org/apache/kafka/clients/consumer/KafkaConsumer.class",
})
_FIX_JARS = ("pass --jars file:///path/flink-sql-connector-kafka-5.0.0-2.2.jar (Maven Central: "
             "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2) or fill the dev cache with "
             "`aisp local jars`")


def _local_path(url: str) -> Path | None:
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    return None  # http(s)://, s3://...: fetched by the cluster


def _jar_entries(path: Path) -> tuple[set[str], str]:
    """The entry names of a local jar and its table-factory services file.

    Raises:
        ConfigError: Missing, a directory, unreadable or not a zip.
    """
    if path.is_dir():
        raise ConfigError(f"connector jar {path} is a directory, not a jar: {_FIX_JARS}")
    if not path.is_file():
        raise ConfigError(f"connector jar {path} does not exist: {_FIX_JARS}")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"connector jar {path} is not readable by user {os.getuid()}: "
                          "fix its permissions")
    try:
        with zipfile.ZipFile(path) as jar:
            names = set(jar.namelist())
            services = jar.read(_SERVICES).decode("utf-8", "replace") if _SERVICES in names else ""
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError(f"connector jar {path} is not a jar ({exc}): {_FIX_JARS}") from exc
    return names, services


def check_connector_jars(urls: list[str]) -> None:
    """Every local jar exists and is a jar; together they provide :data:`KAFKA_FACTORY`
    (listed as a service and its class present) and the Kafka client it runs on
    (shaded in flink-sql-connector-kafka, or a kafka-clients jar beside the thin
    flink-connector-kafka).

    Raises:
        ConfigError: One line: which jar, what is wrong, how to fix it.
    """
    remote = False
    listed = has_factory = has_client = False
    for url in urls:
        path = _local_path(url)
        if path is None:
            remote = True
            continue
        names, services = _jar_entries(path)
        listed = listed or KAFKA_FACTORY in services.split()
        has_factory = has_factory or _FACTORY_CLASS in names
        has_client = has_client or bool(_CLIENT_CLASSES & names)
    if remote:
        return  # the cluster fetches the others: it may hold what is missing here
    names_given = ", ".join(urls) or "none"
    if not (listed and has_factory):
        raise ConfigError(f"no jar of --jars ({names_given}) provides the Flink Kafka connector "
                          f"({KAFKA_FACTORY}): {_FIX_JARS}")
    if not has_client:
        raise ConfigError(f"the jars of --jars ({names_given}) hold the Flink Kafka connector but not the "
                          "Kafka client it needs: use flink-sql-connector-kafka (the client shaded in), or "
                          "add kafka-clients to --jars")


#: The files of a HF sequence-classification model directory (``--classifier``).
_CLASSIFIER_FILES = ("config.json", "tokenizer.json", "model.onnx")


def check_model_paths(options: InferenceOptions) -> None:
    """The model directory, encoder files and hot-swap pointer directory the options name
    are there and readable (the model build itself is checked when it loads).

    Raises:
        ConfigError: One line naming the path and the option.
    """
    directory = options.resolved_model_dir
    if directory is not None:
        if not directory.is_dir():
            raise ConfigError(f"--model-dir {directory} is not a directory: build one with "
                              "`aisp model build --out DIR` or leave it unset for the cached build")
        if not os.access(directory, os.R_OK | os.X_OK):
            raise ConfigError(f"--model-dir {directory} is not readable by user {os.getuid()}")
    encoder = (("--encoder-onnx", options.encoder_onnx), ("--encoder-tokenizer", options.encoder_tokenizer),
               ("--predictor", options.predictor))
    for flag, path in encoder:
        if path is not None and not (path.is_file() and os.access(path, os.R_OK)):
            raise ConfigError(f"{flag} {path} is not a readable file")
    if options.classifier is not None:
        missing = [n for n in _CLASSIFIER_FILES if not os.access(options.classifier / n, os.R_OK)]
        if missing:
            raise ConfigError(f"--classifier {options.classifier} is not a sequence-classification model "
                              f"directory: {missing} missing or unreadable (it needs "
                              f"{list(_CLASSIFIER_FILES)})")
    pointer = options.model_pointer
    if pointer is not None and not pointer.resolve().parent.is_dir():
        raise ConfigError(f"--model-pointer {pointer}: its directory does not exist (publish with "
                          "`aisp model publish POINTER MODEL`)")


def check_device(options: InferenceOptions) -> None:
    """The model's device is usable on this host (the workers of the local cluster
    share it; a remote cluster's TaskManagers are checked again when the model
    loads, which also refuses an unusable GPU): never a silent CPU run.

    Raises:
        ConfigError: ``--runtime torch`` without PyTorch; ``--device cuda:N`` with
            no CUDA device N (torch), or an onnxruntime without the CUDA/TensorRT
            execution provider (the CPU-only build), in one line with the fix.
    """
    device = options.resolved_device
    if options.runtime is InferenceRuntime.TORCH:
        try:
            import torch
        except ImportError as exc:
            raise ConfigError("--runtime torch needs PyTorch: pip install -e '.[torch]'") from exc
        if device == "cpu":
            return
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {options.device}: no CUDA device is usable here "
                              "(torch.cuda.is_available() is False); use --device cpu")
        index, count = int(device.split(":")[1]), torch.cuda.device_count()
        if index >= count:
            raise ConfigError(f"--device {options.device}: this host has {count} CUDA device(s) "
                              f"(0..{count - 1})")
        return
    if device == "cpu":
        return
    import onnxruntime as ort

    tensorrt = options.onnx_provider.value == "tensorrt"
    wanted = "TensorrtExecutionProvider" if tensorrt else "CUDAExecutionProvider"
    available = ort.get_available_providers()
    if wanted not in available:
        raise ConfigError(f"--device {options.device}: this onnxruntime ({ort.__version__}) has no {wanted} "
                          f"(available: {', '.join(available)}): install onnxruntime-gpu, use --runtime "
                          "torch, or --device cpu")
    count, why = nvidia_gpu_count()
    index = int(device.split(":")[1])
    if index >= count:
        raise ConfigError(f"--device {options.device}: {why or f'this host has {count} NVIDIA GPU(s)'} "
                          "(onnxruntime-gpu lists its CUDA provider even without a GPU); use --device cpu")


def nvidia_gpu_count() -> tuple[int, str]:
    """NVIDIA GPUs the driver shows (NVML, nvidia-ml-py), and why none when NVML fails.

    Returns:
        ``(count, "")``, or ``(0, "no NVIDIA driver here (NVML: <error>)")``.
    """
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return 0, f"no NVIDIA driver here (NVML: {exc})"
    try:
        return int(pynvml.nvmlDeviceGetCount()), ""
    finally:
        pynvml.nvmlShutdown()


def archive_targets(archives: str | None) -> dict[str, str]:
    """``python.archives`` (``-pyarch``) as {target folder: archive path}.

    Flink's format: comma-separated ``path[#target]``; without ``#`` the target is
    the archive's file name.
    """
    targets: dict[str, str] = {}
    for item in (archives or "").split(","):
        item = item.strip()
        if item:
            path, _, target = item.partition("#")
            targets[target or Path(urlparse(path).path or path).name] = path
    return targets


def check_python(executable: str, archives: str | None = None) -> str:
    """The workers' Python executable as an absolute path, or as given when it lies
    in one of the job's Python archives (then the archive is checked instead).

    Args:
        executable: ``python.executable`` (``-pyexec``).
        archives: ``python.archives`` (``-pyarch``), if any.

    Raises:
        ConfigError: Not found on ``PATH`` or not executable; or its archive is
            not a readable file here.
    """
    first = Path(executable).parts[0] if executable and not os.path.isabs(executable) else ""
    shipped = archive_targets(archives).get(first) if os.sep in executable else None
    if shipped is not None:
        local = unquote(urlparse(shipped).path) if "://" in shipped else shipped
        if not os.path.isfile(local) or not os.access(local, os.R_OK):
            raise ConfigError(f"the Python archive {shipped} of the workers' Python {executable} is not a "
                              "readable file: rebuild it with `aisp package`")
        return executable
    found = shutil.which(executable)
    if found is None:
        where = "does not exist" if os.sep in executable else "is not on PATH"
        raise ConfigError(f"the workers' Python executable {executable} {where}: run the job with the "
                          "project's Python (e.g. .venv/bin/python, or `flink run -pyexec /abs/python`)")
    return found
