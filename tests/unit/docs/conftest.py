"""docs/gen_pages.py (docs/ is not a package) loaded once as the module ``aisp_docs_gen_pages``,
so the docs tests ``import aisp_docs_gen_pages as gen``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "docs" / "gen_pages.py"
_NAME = "aisp_docs_gen_pages"

if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _module
    _spec.loader.exec_module(_module)
