"""``aisp package``: everything ``flink run`` needs on a cluster without the project venv.

Layout of a package folder (default ``<aisp_home>/packages/review-sentiment``)::

    aisp-env.tar.gz        the job's Python (``-pyarch ...#aisp-env``, see ``_env``)
    jars/*.jar             the Flink Kafka connector (the job's ``--jars``: ``pipeline.jars``)
    model/                 the sentiment model assets (model.onnx, tokenizer.json, manifest.json)
    package.json           sha256 of every file, the model version, the ``flink run`` argv

The job's entry point ships in the environment's copy of the package: ``flink run
-pym pyflink_aisp.jobs.review_sentiment``.

The model is read from the package folder, which every TaskManager must see at
the same path (one host, or a shared volume); each Python worker checks the
files against ``manifest.json`` (sha256) when it loads the model in ``open()``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.deploy._env import ENV_ARCHIVE_TARGET, EnvArchive, ensure_env_archive
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.home import aisp_home
from pyflink_aisp.jobs.review_sentiment import MODULE as JOB_MODULE
from pyflink_aisp.models import ModelAssets, ensure_model_assets, load_model_assets

__all__ = ["JobPackage", "build_package", "default_package_dir"]

_ENV_FILE = "aisp-env.tar.gz"
_MANIFEST = "package.json"


def default_package_dir() -> Path:
    """``<aisp_home>/packages/review-sentiment``."""
    return aisp_home() / "packages" / "review-sentiment"


@dataclass(frozen=True, kw_only=True)
class JobPackage:
    """A built package folder.

    Attributes:
        directory: The package folder (absolute).
        env: The environment archive it links.
        model: The model assets copied into ``model/``.
        jars: The connector jars in ``jars/``.
        module: The job's entry module in the environment (``flink run -pym``).
        flink: The ``flink`` executable the printed command uses.
        jobmanager: ``host:port`` of the cluster's REST endpoint (``flink run -m``).
    """

    directory: Path
    env: EnvArchive
    model: ModelAssets
    jars: tuple[Path, ...]
    module: str
    flink: str
    jobmanager: str

    def __post_init__(self) -> None:
        if not self.directory.is_absolute():
            raise ConfigError(f"package directory must be absolute, got {self.directory}")

    def run_command(self, *job_args: str, detached: bool = False) -> list[str]:
        """argv of ``flink run`` for this package, with ``job_args`` appended.

        The same argv works for any cluster whose TaskManagers see ``directory``
        (the model) and have the base CPython of the archive (see ``_env``).
        """
        archive = (self.directory / _ENV_FILE).as_uri()
        jars = ";".join(jar.as_uri() for jar in self.jars)
        return [
            self.flink, "run", *(["-d"] if detached else []), "-m", self.jobmanager,
            "-pyarch", f"{archive}#{ENV_ARCHIVE_TARGET}",
            "-pyexec", self.env.python, "-pyclientexec", self.env.python,
            "-pym", self.module, "--jars", jars, "--model-dir", str(self.model.directory), *job_args,
        ]  # fmt: skip

    def command_line(self, *job_args: str) -> str:
        """:meth:`run_command` as one shell-quoted line."""
        return shlex.join(self.run_command(*job_args))


def build_package(
    directory: Path | None = None,
    *,
    jars: Sequence[Path] | None = None,
    model: ModelAssets | None = None,
    flink: str = "flink",
    jobmanager: str = "localhost:8081",
) -> JobPackage:
    """Assemble a package folder (the environment archive is built or taken from its cache).

    Args:
        directory: The package folder; default :func:`default_package_dir`.
        jars: Connector jars; default the jar cache (:func:`~pyflink_aisp.local.flink_connector_jars`).
        model: Model assets; default the cached build (:func:`~pyflink_aisp.models.ensure_model_assets`).
        flink: ``flink`` executable named in the printed command.
        jobmanager: ``flink run -m`` value.

    Raises:
        EnvironmentSetupError: As :func:`ensure_env_archive`.
        ModelError: The model assets are missing or fail their checksums.
    """
    from pyflink_aisp.jars import flink_connector_jars

    target = Path(directory or default_package_dir()).expanduser().absolute()
    env = ensure_env_archive()
    assets = model or ensure_model_assets()
    chosen = list(jars) if jars is not None else flink_connector_jars()
    target.mkdir(parents=True, exist_ok=True)
    _place(env.path, target / _ENV_FILE)
    (target / "jars").mkdir(exist_ok=True)
    for old in (target / "jars").glob("*.jar"):
        old.unlink()
    placed_jars = [_place(Path(jar), target / "jars" / Path(jar).name) for jar in chosen]
    model_dir = target / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.copytree(assets.directory, model_dir, ignore=shutil.ignore_patterns("*.lock", ".*"))
    (target / "review_sentiment.py").unlink(missing_ok=True)  # a job file of packages built before -pym
    package = JobPackage(
        directory=target, env=env, model=load_model_assets(model_dir), jars=tuple(placed_jars),
        module=JOB_MODULE, flink=flink, jobmanager=jobmanager,
    )  # fmt: skip
    _write_manifest(package)
    return package


def _place(source: Path, dest: Path) -> Path:
    """Hard-link ``source`` to ``dest`` (same file system), else copy it."""
    dest.unlink(missing_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)
    return dest


def _write_manifest(package: JobPackage) -> None:
    root = package.directory
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != _MANIFEST)
    manifest = {
        "env_key": package.env.key,
        "model_sha256": package.model.sha256,
        "files": {str(p.relative_to(root)): sha256_file(p) for p in files},
        "flink_run": package.run_command("--input-topic", "IN", "--output-topic", "OUT"),
    }
    (root / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
