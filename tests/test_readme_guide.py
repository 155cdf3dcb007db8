"""README.md is a short guide whose links lead somewhere (the docs site's own links are checked
by `mkdocs build --strict` in `make test`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(md: Path) -> set[str]:
    """The heading anchors of a Markdown page, as MkDocs (and GitHub) make them."""
    out = set()
    for line in md.read_text().splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            text = re.sub(r"[`*]", "", m.group(1)).strip().lower()
            out.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text)))
    return out


def test_the_readme_is_a_guide_of_at_most_300_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    headings = [ln for ln in lines if ln.startswith("## ")]
    for needed in ("## Quick start", "## The two commands", "## Concepts", "## Where to go next"):
        assert needed in headings, needed


def test_every_relative_link_of_the_readme_leads_to_a_file_and_heading() -> None:
    text = (ROOT / "README.md").read_text()
    own = _anchors(ROOT / "README.md")
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        page = ROOT / path if path else ROOT / "README.md"
        if not page.exists():
            bad.append(f"{target}: no file {path}")
        elif anchor and page.suffix == ".md" and anchor not in (
                own if not path else _anchors(page)):
            bad.append(f"{target}: no heading #{anchor} in {path or 'README.md'}")
    assert not bad, bad
