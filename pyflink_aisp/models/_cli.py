"""``build_main``: build (or verify) the model assets from the command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pyflink_aisp.errors import AispError
from pyflink_aisp.models._assets import ensure_model_assets

__all__ = ["build_main"]


def build_main(argv: Sequence[str] | None = None) -> int:
    """Build the sentiment model assets once and print what was built.

    Prints held-out accuracy, sha256 (the model version), path and build time.
    Usable as a console-script target or from ``aisp models build``.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``):
            ``[--cache-dir DIR]``.

    Returns:
        Exit status: 0 on success, 1 on a pyflink-aisp error (printed to stderr).
    """
    parser = argparse.ArgumentParser(prog="aisp-build-model", description=build_main.__doc__)
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="parent dir (default: $AISP_HOME/models)"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        assets = ensure_model_assets(args.cache_dir)
    except AispError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - started
    sizes = f"{assets.heldout_size} held out, {assets.train_size} train"
    print(f"heldout_accuracy: {assets.heldout_accuracy:.4f} ({sizes})")
    print(f"sha256:           {assets.sha256}")
    print(f"path:             {assets.onnx_path}")
    print(f"build_seconds:    {assets.build_seconds:.1f} (this call: {elapsed:.1f} s)")
    return 0
