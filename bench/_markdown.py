"""Shared by the benchmarks: write one ``## <name>`` section of ``bench/REPORT.md``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["replace_section"]


def replace_section(path: Path, heading: str, section: str) -> None:
    """Replace the section that starts with the line ``heading`` (e.g. ``## Inference``)
    with ``section``, or append it; the other sections stay as they are."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    start = text.find(heading + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(heading))
        rest = text[end + 1 :] if end >= 0 else ""
        text = text[:start] + (section.rstrip("\n") + "\n\n" if rest else section) + rest
    path.write_text(text)
