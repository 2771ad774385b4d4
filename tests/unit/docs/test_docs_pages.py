"""The docs tree: generated pages equal their generator's output; the README is short and its links hold."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import aisp_docs_gen_pages as gen
import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"



def test_options_page_holds_the_generated_options_table():
    text = (DOCS / "options.md").read_text(encoding="utf-8")
    block = gen.OPTIONS_BLOCK.search(text)
    assert block is not None, "docs/options.md has no options-table block"
    assert block.group(2) == gen.options_markdown(), "run `python docs/gen_pages.py`"


def test_performance_page_is_what_the_generator_renders_from_the_reports():
    committed = (DOCS / "performance.md").read_text(encoding="utf-8")
    assert committed == gen.performance_page(), "run `python docs/gen_pages.py`"


def test_performance_page_carries_the_reports_tables():
    page = gen.performance_page()
    report = (ROOT / "bench" / "REPORT.md").read_text(encoding="utf-8")
    for line in report.splitlines():
        if line.startswith("| "):
            assert line in page


def _git_has(commit: str) -> bool:
    try:
        done = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                              capture_output=True, check=False)
    except OSError:
        return False
    return done.returncode == 0


def test_evidence_page_holds_every_cited_commit_verbatim():
    cited = gen.cited_commits(gen.hand_written_pages())
    sections = gen.evidence_sections((DOCS / "evidence" / "commits.md").read_text(encoding="utf-8"))
    assert list(sections) == cited, "run `python docs/gen_pages.py`"
    checked = [c for c in cited if _git_has(c)]  # a shallow clone may lack them: the file is the record
    for commit in checked:
        assert sections[commit] == gen.commit_message(commit), commit


def test_evidence_page_renders_and_parses_back():
    messages = {"abc1234": "one line\n", "def5678": "title\n\n- a 1.5 ms point\n"}
    text = gen.evidence_page(list(messages), message=messages.__getitem__)
    assert gen.evidence_sections(text) == messages


def test_readme_is_at_most_200_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, len(lines)


def test_readme_keeps_the_two_setup_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^make demo +# ", readme, re.M)
    assert re.search(r"^make test +# ", readme, re.M)


_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (its default slugify)."""
    import unicodedata

    text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", heading)  # inline markup does not reach the id
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors_of(markdown: str) -> set[str]:
    """The heading anchors of a Markdown page, fenced code left out."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def relative_links(markdown: str) -> list[str]:
    """Targets of the page's Markdown links that are not URLs or in-page anchors (code left out)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in _LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file, or anchor in it, does not exist."""
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        if path.startswith("/"):
            broken.append(f"{target} (absolute)")
            continue
        file = (page.parent / path).resolve()
        if not file.is_file():
            broken.append(f"{target} (no such file)")
        elif anchor and anchor not in anchors_of(file.read_text(encoding="utf-8")):
            broken.append(f"{target} (no such anchor)")
    return broken


def test_readme_links_point_at_existing_files_and_anchors():
    readme = ROOT / "README.md"
    assert relative_links(readme.read_text(encoding="utf-8")), "the README links into docs/"
    assert broken_links(readme) == []


def test_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path):
    (tmp_path / "b.md").write_text("# Title\n\n## The `make demo` output\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md) [ok](b.md#the-make-demo-output) [x](c.md) [y](b.md#nope) "
                    "[web](https://example.org) `[code](d.md)`\n", encoding="utf-8")
    assert broken_links(page) == ["c.md (no such file)", "b.md#nope (no such anchor)"]


def test_slugs_match_what_mkdocs_builds():
    assert _slug("What `make demo` prints") == "what-make-demo-prints"
    assert _slug("Latency, Kafka in → Kafka out") == "latency-kafka-in-kafka-out"


def _reasons() -> list[str]:
    from pyflink_aisp.outcome import Reason

    return sorted(r.value for r in Reason)


def test_dead_letter_page_lists_every_reason_once():
    page = (DOCS / "dead-letters.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", page, re.M)
    assert sorted(rows) == _reasons()


@pytest.mark.parametrize("page", ["README.md", "docs/layout.md"])
def test_layout_names_every_floor_of_the_import_contracts(page: str):
    """Each area of the floors contract in pyproject.toml (what `lint-imports` holds) is on the page,
    as `name/` for a package and `name.py` for a module, and so are the backends' own floor."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    floors = next(c for c in config["contracts"] if c.get("containers") == ["pyflink_aisp"])
    areas = [name.strip() for layer in floors["layers"] for name in re.split(r"[|:]", layer)]
    assert len(areas) > 10
    text = (ROOT / page).read_text(encoding="utf-8")
    for area in areas:
        shown = f"{area}/" if (ROOT / "pyflink_aisp" / area).is_dir() else f"{area}.py"
        assert f"`{shown}" in text or f"/{shown}`" in text, (page, shown)
    assert "inference/handlers/" in text and "lint-imports" in text
