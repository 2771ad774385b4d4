"""``aisp``, the command line (top floor: it wires every area's commands together)."""

from __future__ import annotations

from pyflink_aisp.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
