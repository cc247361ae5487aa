"""The provider's docs as the plugin serves them, with links that work where they are served (issue 41).

The how-to pages (``docs/airflow/*.md``) are served at ``/fstream/docs/{page}``, their images at
``/fstream/docs/img/{name}``, and the project's pages they link to (``docs/*.md``: architecture, authorization, ...)
at ``/fstream/docs/project/{page}``; all are installed with the wheel under ``share/doc/fstream`` (setup.cfg).
Links are written for the source tree (``../architecture.md``), so rendering rewrites each relative link to where
its target is served, relative to the page; a link to a file that is not served (``../BENCHMARKS.md``) becomes
plain text naming it, never a link to a 404. Headings get GitHub's anchors, so ``page.md#section`` links work too.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from urllib.parse import urlsplit

from fstream_provider.provider_info import DOC_PAGES, docs_dir

PROJECT = "project"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def root() -> Path:
    """The docs root: ``docs/`` of a checkout, ``share/doc/fstream`` of an installed wheel."""
    return docs_dir().parent


def url_of(source: str) -> str | None:
    """Where ``source`` (a path relative to the docs root: ``airflow/index.md``, ``architecture.md``) is served,
    relative to the plugin's mount (``docs/index.md``, ``docs/project/architecture.md``); None when it is not."""
    parts = source.split("/")
    if len(parts) == 2 and parts[0] == "airflow" and parts[1] in DOC_PAGES:
        return "docs/" + parts[1]
    if len(parts) == 3 and parts[:2] == ["airflow", "img"] and parts[2].endswith(".png") and _NAME.match(parts[2]):
        return "docs/img/" + parts[2] if (root() / source).is_file() else None
    if len(parts) == 1 and parts[0].endswith(".md") and _NAME.match(parts[0]) and (root() / parts[0]).is_file():
        return f"docs/{PROJECT}/{parts[0]}"
    return None


def project_page(page: str) -> Path | None:
    """The project page served as ``docs/project/{page}``, or None."""
    return root() / page if url_of(page) else None


def slug(heading: str, seen: dict[str, int] | None = None) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens; repeats get ``-1``, ..."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    if seen is not None:
        n = seen.get(s, 0)
        seen[s] = n + 1
        s = f"{s}-{n}" if n else s
    return s


def _relative(href: str) -> bool:
    u = urlsplit(href)
    return not (u.scheme or u.netloc or href.startswith(("#", "/")))


def render(source: str) -> str:
    """The page ``source`` (relative to the docs root) as HTML, its links pointing where their targets are served."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse((root() / source).read_text(encoding="utf-8"))
    here, base = posixpath.dirname(source), posixpath.dirname(url_of(source) or "docs/")
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            tok.attrSet("id", slug(tokens[i + 1].content, seen))
        for kid in tok.children or []:
            attr = "href" if kid.type == "link_open" else "src" if kid.type == "image" else None
            href = str(kid.attrGet(attr) or "") if attr else ""
            if not href or not _relative(href):
                continue
            path, _, anchor = href.partition("#")
            target = posixpath.normpath(posixpath.join(here, path))
            served = url_of(target)
            if served is not None:
                kid.attrSet(attr, posixpath.relpath(served, base) + (f"#{anchor}" if anchor else ""))
            elif kid.type == "link_open":  # not served here: the text stays, naming the file
                kid.tag, kid.attrs = "span", {"title": f"{target} in the FStream source tree (not served here)"}
                _close(tok.children, kid).tag = "span"
    return md.renderer.render(tokens, md.options, {})


def _close(children: list, opener: object) -> object:
    """The ``link_close`` that matches ``opener`` among an inline token's children."""
    depth = 0
    for kid in children[children.index(opener):]:
        depth += {"link_open": 1, "link_close": -1}.get(kid.type, 0)
        if depth == 0:
            return kid
    raise ValueError("unbalanced link")
