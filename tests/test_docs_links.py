"""The project's face stays true: the docs' links resolve to files in the tree, and every result file under
``benchmarks/results/`` is cited from ``docs/results.md`` (a result nobody cites is clutter; a citation of a
deleted file is a lie)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "benchmarks" / "results"

# [text](target) and ![alt](target); the target ends at whitespace or ')'.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _local_targets(doc: Path) -> list[str]:
    targets = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, in-page anchors
        targets.append(target.split("#", 1)[0])
    return targets


def _cited(doc: Path) -> set[Path]:
    return {(doc.parent / t).resolve() for t in _local_targets(doc)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve_to_files_in_the_tree(doc: Path) -> None:
    missing = [t for t in _local_targets(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_every_result_file_is_cited_from_the_results_page() -> None:
    cited = _cited(ROOT / "docs" / "results.md")
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert files, "benchmarks/results/ is empty"
    uncited = sorted(p.relative_to(ROOT).as_posix() for p in files if p.resolve() not in cited)
    assert not uncited, f"result files not cited from docs/results.md: {uncited}"


def test_readme_stays_short_and_free_of_history() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\bstop [0-9]+|20[0-9]{2}-[01][0-9]-[0-3][0-9]", text, re.IGNORECASE)
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "commit hashes belong in docs/results.md"
