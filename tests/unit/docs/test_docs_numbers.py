"""No hand-written number in the docs that its declared sources do not hold.

Every hand-written page (README.md and docs/**/*.md except the generated ones) names its sources in one
HTML comment, which MkDocs and GitHub render as nothing:

    <!-- sources: bench/REPORT.md, pyflink_aisp/pipeline/_config.py, git:4c3d780 -->

A source is a repository path (a glob such as ``pyflink_aisp/**/_cost.py`` survives a module moving to
another folder) or ``git:HASH``, which reads that commit's message from docs/evidence/commits.md (kept
there verbatim because a CI clone may be shallow; test_docs_pages checks it against git).

The check takes every number of the page's prose and tables and asserts that each one is a number of at
least one source, compared by value (``12,808`` = ``12808``, ``1e-5`` = ``0.00001``). Left out: fenced
code, inline code (commands, identifiers and pinned versions such as ``mkdocs==1.6.1``), HTML comments,
link targets, heading and list numbering, and digits glued to letters (``p99``, ``int64``, ``FLINK-39532``,
``MiniLM-L6-v2``), which name things rather than measure them.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

import aisp_docs_gen_pages as gen
import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


#: A number as prose writes it: thousands separators, a decimal part, an exponent.
_END = r"(?=x\b|[^\w]|$)"  # a ratio's "x" (0.96x) is no name
_PROSE_NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)\d{1,3}(?:,\d{3})+(?:\.\d+)?" + _END
                           + r"|(?<![\w.])(?<![A-Za-z]-)\d+(?:\.\d+)?(?:e[-+]?\d+)?" + _END)
#: A number in a source file: anywhere, also inside identifiers (``8 * size``, ``_MS = 2000``).
_SOURCE_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _value(token: str) -> Decimal | None:
    try:
        return Decimal(token.replace(",", "").replace("_", "")).normalize()
    except InvalidOperation:
        return None


def prose(markdown: str) -> str:
    """The page's prose and tables: code, comments, link targets and numbering removed."""
    text = re.sub(r"<!--.*?-->", " ", markdown, flags=re.S)
    text = re.sub(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", " ", text, flags=re.S | re.M)
    text = re.sub(r"``[^`]+``|`[^`\n]+`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"<https?://[^>]*>|https?://\S+", " ", text)
    text = re.sub(r"^(#{1,6}\s+)\d+\.\s", r"\1", text, flags=re.M)  # "# 1. Title"
    text = re.sub(r"^(\s*(?:[-*]\s+)?\[?)\d+\.\s", r"\1", text, flags=re.M)  # "1. item", "- [1. Title]"
    return re.sub(r"(?<=\[)\d+\.\s", "", text)  # "[1. Bundle time](...)"


def numbers_of_page(markdown: str) -> list[str]:
    """Every number token of the page's prose and tables, in order."""
    return _PROSE_NUMBER.findall(prose(markdown))


def source_values(text: str) -> set[Decimal]:
    """Every number of a source's text, by value (``1_000`` and ``1,000`` read as 1000)."""
    text = re.sub(r"(?<=\d)[,_](?=\d{3}(?!\d))", "", text)
    return {v for v in map(_value, _SOURCE_NUMBER.findall(text)) if v is not None}


def declared_sources(markdown: str) -> list[str]:
    """The page's ``<!-- sources: ... -->`` entries."""
    return gen.sources_of(markdown)


def source_text(source: str, root: Path, evidence: dict[str, str]) -> str:
    """The text a source stands for; raises LookupError when it names nothing."""
    commit = gen.GIT_SOURCE.match(source)
    if commit:
        if commit.group(1) not in evidence:
            raise LookupError(f"{source}: not in docs/evidence/commits.md (run `python docs/gen_pages.py`)")
        return evidence[commit.group(1)]
    files = sorted(p for p in root.glob(source) if p.is_file())
    if not files:
        raise LookupError(f"{source}: no such file (moved? point the sources line at its new path)")
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def unsourced_numbers(markdown: str, root: Path, evidence: dict[str, str]) -> list[str]:
    """The page's numbers that none of its declared sources holds (a page without sources: all)."""
    values: set[Decimal] = set()
    for source in declared_sources(markdown):
        values |= source_values(source_text(source, root, evidence))
    return [n for n in numbers_of_page(markdown) if _value(n) not in values]


def _evidence() -> dict[str, str]:
    return gen.evidence_sections((DOCS / "evidence" / "commits.md").read_text(encoding="utf-8"))


PAGES = gen.hand_written_pages()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_number_of_a_page_is_in_its_sources(page: Path):
    markdown = page.read_text(encoding="utf-8")
    if numbers_of_page(markdown):
        assert declared_sources(markdown), f"{page.name} quotes numbers but names no <!-- sources: -->"
    missing = unsourced_numbers(markdown, ROOT, _evidence())
    assert missing == [], f"{page.relative_to(ROOT)}: numbers not in its sources: {sorted(set(missing))}"


def test_the_generated_pages_are_left_to_their_generator():
    names = {p.relative_to(DOCS).as_posix() for p in PAGES if p.is_relative_to(DOCS)}
    assert "performance.md" not in names and "evidence/commits.md" not in names
    assert "decisions/0001-bundle-time-and-size.md" in names


# The check itself, on sample pages.

def _sample(tmp_path: Path, page: str, source: str = "", evidence: dict[str, str] | None = None):
    (tmp_path / "report.md").write_text(source, encoding="utf-8")
    return unsourced_numbers(page, tmp_path, evidence or {})


def test_a_number_the_source_holds_passes(tmp_path: Path):
    page = ("<!-- sources: report.md -->\n"
            "The job ran 12,808 reviews at 566 records/s (p99 1.5e-3 s, 0.7695).\n")
    assert _sample(tmp_path, page, "records 12808, rate 566, p99 0.0015, accuracy 0.7695") == []


def test_an_invented_number_fails(tmp_path: Path):
    page = "<!-- sources: report.md -->\nThe job ran 12,808 reviews at 567 records/s.\n"
    assert _sample(tmp_path, page, "records 12,808 at 566 records/s") == ["567"]


def test_a_changed_decimal_fails(tmp_path: Path):
    page = "<!-- sources: report.md -->\nheld-out accuracy 0.7696\n"
    assert _sample(tmp_path, page, "accuracy 0.7695") == ["0.7696"]


def test_a_page_without_sources_has_every_number_unsourced(tmp_path: Path):
    assert _sample(tmp_path, "p99 135 ms at 30 % load\n", "135 30") == ["135", "30"]


def test_git_sources_read_the_commit_section(tmp_path: Path):
    page = "<!-- sources: git:abc1234 -->\np99 121-146 ms with 5 ms bundles\n"
    assert _sample(tmp_path, page, evidence={"abc1234": "p99 121-146 ms with 5 ms bundles"}) == []
    assert _sample(tmp_path, page, evidence={"abc1234": "p99 121-147 ms with 5 ms bundles"}) == ["146"]
    with pytest.raises(LookupError):
        _sample(tmp_path, page)


def test_a_missing_source_file_is_an_error(tmp_path: Path):
    with pytest.raises(LookupError, match="no such file"):
        _sample(tmp_path, "<!-- sources: gone.md -->\n5 ms\n")


def test_code_links_comments_numbering_and_names_are_not_numbers():
    page = ("# 1. Bundle time\n\n<!-- sources: x -->\n1. first item\n- [2. Cost cuts](0002-cost.md#a-1)\n"
            "Run `mkdocs==1.6.1` or\n```bash\nmake demo 42\n```\n"
            "p99 int64 FLINK-39532 MiniLM-L6-v2 list<int32> see https://example.org/7 and 3 ms\n")
    assert numbers_of_page(page) == ["3"]


def test_number_forms():
    assert numbers_of_page("12,808 and 1,024; 0.96x; 1e-5; 2^256; 100-230 ms; 1.18\u00d7; 90 %") == [
        "12,808", "1,024", "0.96", "1e-5", "2", "256", "100", "230", "1.18", "90"]
    assert _value("1e-5") == _value("0.00001") and _value("12,808") == _value("12808")
