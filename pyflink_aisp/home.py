"""Where pyflink-aisp keeps its state: jar cache, model assets, local services.

``$AISP_HOME`` when set; else ``.aisp/`` in the source checkout (editable
install, the usual case: state stays with the project); else
``~/.cache/pyflink-aisp``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["aisp_home", "project_root"]


def project_root() -> Path | None:
    """The source checkout this package runs from, or None for a regular install."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def aisp_home() -> Path:
    """The state directory (created on first use).

    Returns:
        An absolute directory path.
    """
    env = os.environ.get("AISP_HOME")
    if env:
        home = Path(env).expanduser().resolve()
    else:
        root = project_root()
        home = root / ".aisp" if root else Path.home() / ".cache" / "pyflink-aisp"
    home.mkdir(parents=True, exist_ok=True)
    return home
