"""Every relative link in docs/ names a file that exists, and its ``#anchor`` a heading of that file (issue 41).

The plugin serves these pages (``fstream_provider.ui.doc_pages``); tests/test_live_view_page.py follows the links
of the served pages. Here: the source tree, parsed with markdown-it as the plugin parses it.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

from fstream_provider.ui.doc_pages import slug

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def _tokens(path: Path) -> list:
    return MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))


def _links(path: Path) -> list[str]:
    out = []
    for tok in _tokens(path):
        for kid in tok.children or []:
            attr = {"link_open": "href", "image": "src"}.get(kid.type)
            href = kid.attrGet(attr) if attr else None
            if href:
                out.append(str(href))
    return out


def _anchors(path: Path) -> set[str]:
    toks, seen = _tokens(path), {}
    return {slug(toks[i + 1].content, seen) for i, t in enumerate(toks) if t.type == "heading_open"}


def test_the_anchors_are_githubs():
    assert slug("Least-privilege ACL users and TLS") == "least-privilege-acl-users-and-tls"
    assert slug("`fstream` connection: URI form, *Test connection*") == "fstream-connection-uri-form-test-connection"
    seen: dict[str, int] = {}
    assert [slug("Files", seen), slug("Files", seen)] == ["files", "files-1"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_relative_link_resolves(page):
    bad = []
    for href in _links(page):
        u = urlsplit(href)
        if u.scheme or u.netloc:
            continue
        target = page if not u.path else (page.parent / unquote(u.path)).resolve()
        if not target.exists():
            bad.append(f"{href}: no {posixpath.relpath(target, REPO)}")
        elif u.fragment and target.suffix == ".md" and u.fragment not in _anchors(target):
            bad.append(f"{href}: no heading #{u.fragment} in {target.relative_to(REPO)}")
    assert not bad, bad
