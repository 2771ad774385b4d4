"""The GPU check's import guard: only the PyFlink-free parts of the package may load.

The GPU host has no PyFlink, Java or Kafka client (ARCHITECTURE.md), so ``bench/gpu_check.sh run``
must work with the inference core, the handlers, the tokenizer and the pure parts of the affinity
package alone. :func:`install` puts an import hook first on ``sys.meta_path`` that refuses, with an
``ImportError`` naming the importer, and records:

- a project area outside :data:`ALLOWED_AREAS` (``pyflink_aisp.pipeline``, ``.kafka``, ``.jobs`` ...)
  or a private module of an allowed area that needs a server stack (:data:`DENIED_MODULES`);
- a module of :data:`FORBIDDEN` (``pyflink``, ``confluent_kafka``, ``httpx``, ``fastapi``, ``uvicorn``)
  asked for by project or bench code. Third-party code may import them (``huggingface_hub`` may need
  ``httpx``): the rule is about what this project needs there.

Every refusal is recorded even when the importer catches the ``ImportError`` (an optional import is
still a dependency the GPU host may not have); the check reports them and fails its
"PyFlink-free" row, so the CPU dry run in CI catches a forbidden import.

Thread-safety: :meth:`ImportGuard.find_spec` appends to a list (atomic under the GIL).
"""

from __future__ import annotations

import importlib.abc
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

__all__ = ["ALLOWED_AREAS", "DENIED_MODULES", "FORBIDDEN", "ImportGuard", "install"]

#: Top-level modules the project must not import on the GPU host.
FORBIDDEN = ("pyflink", "confluent_kafka", "httpx", "fastapi", "uvicorn")
#: ``pyflink_aisp`` sub-packages / modules the check may load.
ALLOWED_AREAS = (
    "affinity",
    "checksums",
    "datasets",
    "device",
    "errors",
    "home",
    "inference",
    "models",
    "outcome",
    "tokenize",
)
#: Modules of allowed areas that need a server stack (FastAPI app, HTTP client, remote handlers).
DENIED_MODULES = (
    "pyflink_aisp.affinity._app",
    "pyflink_aisp.affinity._client",
    "pyflink_aisp.inference.handlers.remote",
)
_PROJECT = "pyflink_aisp"
_BENCH_PREFIX = "_gpu_"


@dataclass
class ImportGuard(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that refuses (and records) the imports described above.

    Attributes:
        refused: ``"<module> (imported by <importer>)"`` for every refused import, in order.
    """

    refused: list[str] = field(default_factory=list)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        """Refuse ``fullname`` when the rules say so; else defer to the other finders (None).

        Raises:
            ImportError: The import is refused (recorded in :attr:`refused` first).
        """
        reason = self._reason(fullname)
        if reason is not None:
            entry = f"{fullname} ({reason})"
            self.refused.append(entry)
            raise ImportError(f"gpu_check import guard: {entry}; the GPU host has no such module")
        return None

    def _reason(self, fullname: str) -> str | None:
        if fullname == _PROJECT or fullname.startswith(_PROJECT + "."):
            parts = fullname.split(".")
            if len(parts) > 1 and parts[1] not in ALLOWED_AREAS:
                return f"area pyflink_aisp.{parts[1]} is not PyFlink-free, imported by {_importer()}"
            if any(fullname == m or fullname.startswith(m + ".") for m in DENIED_MODULES):
                return f"needs a server stack, imported by {_importer()}"
            return None
        if fullname.split(".")[0] in FORBIDDEN:
            importer = _importer()
            if _is_ours(importer):
                return f"imported by {importer}"
        return None


def _importer() -> str:
    """The ``__name__`` of the innermost frame that is not the import machinery."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if not (name.startswith("importlib") or name.startswith("_frozen_importlib") or name == __name__):
            return str(name)
        frame = frame.f_back
    return "?"


def _is_ours(module: str) -> bool:
    return (
        module == _PROJECT
        or module.startswith(_PROJECT + ".")
        or module.startswith(_BENCH_PREFIX)
        or module in ("__main__", "gpu_check")
    )


def install() -> ImportGuard:
    """Put a fresh guard first on ``sys.meta_path`` (modules already imported stay) and return it."""
    guard = ImportGuard()
    sys.meta_path.insert(0, guard)
    return guard
