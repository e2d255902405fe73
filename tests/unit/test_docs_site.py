"""The docs site: every page is in the nav, and the home page links every page of the nav."""

from __future__ import annotations

import re

import yaml

from tests.conftest import ROOT

DOCS = ROOT / "docs"


def nav_pages() -> set[str]:
    """The pages mkdocs.yml's nav names, as paths under docs/."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, str):
            found.add(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(config["nav"])
    return found


def test_every_page_is_in_the_nav() -> None:
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert "getting-started.md" in pages
    assert pages == nav_pages()


def test_the_home_page_links_every_page_of_the_nav() -> None:
    linked = set(re.findall(r"\]\(([^)#]+\.md)", (DOCS / "index.md").read_text()))
    assert nav_pages() - {"index.md"} == linked
