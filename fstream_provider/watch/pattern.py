"""Globs the way Nextflow's ``channel.fromPath``/``watchPath`` read them: a base directory and a pattern.

``/data/run7/*.h5`` watches ``/data/run7`` and keeps the files whose path relative to it matches
``*.h5``: ``*`` and ``?`` stay within one path component, ``**`` crosses directories
(``/data/**/*.h5``), ``[abc]`` is a character class. A directory with no wildcard means every file
under it; a plain file means that file. Hidden files are left out unless asked for (see
:class:`~fstream_provider.watch.tree.TreeLister`).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Collection

from fstream_provider.watch.sources import walk_files
from fstream_provider.watch.stability import FileStat
from fstream_provider.watch.tree import TreeLister


def existing_base(pattern: str) -> tuple[str, re.Pattern[str] | None]:
    """:func:`split_glob`, refusing a pattern whose base directory does not exist (naming both)."""
    base, regex = split_glob(pattern)
    if not os.path.isdir(base):
        raise FileNotFoundError(f"watch {pattern!r}: directory {base!r} does not exist")
    return base, regex


def split_glob(pattern: str) -> tuple[str, re.Pattern[str] | None]:
    """(base directory, regex on the path relative to it); regex None: every file under the base."""
    path = os.path.abspath(os.path.expanduser(pattern))
    parts = path.split(os.sep)
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            base = os.sep.join(parts[:i]) or os.sep
            return base, re.compile(_translate("/".join(parts[i:])))
    if os.path.isdir(path):
        return path, None
    return os.path.dirname(path) or os.sep, re.compile(re.escape(os.path.basename(path)) + r"\Z")


def _translate(pat: str) -> str:
    out, i = [], 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out.append(r"(?:.*/)?")  # zero or more directories
            i += 3
            continue
        if pat.startswith("**", i):
            out.append(r".*")
            i += 2
            continue
        if c == "*":
            out.append(r"[^/]*")
        elif c == "?":
            out.append(r"[^/]")
        elif c == "[":
            j = pat.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pat[i + 1:j]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out) + r"\Z"


def list_matching(pattern: str, *, include_hidden: bool = False) -> list[str]:
    """The files ``pattern`` matches now, sorted, without a stat each (``channel.from_path``: a one-shot
    listing needs names only; whoever ships a file looks at it then). Hidden file names are skipped
    unless ``include_hidden``, as :class:`~fstream_provider.watch.tree.TreeLister` does."""
    base, regex = existing_base(pattern)
    prefix = base.rstrip(os.sep) + os.sep
    out = [e.path for e in walk_files(base) if (include_hidden or not e.name.startswith("."))
           and (regex is None or regex.match(e.path[len(prefix):]))]
    out.sort()
    return out


class PatternLister:
    """A :class:`TreeLister` over a glob's base directory that keeps only the files the glob matches.

    Each file's ``rel`` is its path relative to the base (where ``channel.transfer`` places it).
    """

    def __init__(self, pattern: str, *, use_inotify: bool = True, include_hidden: bool = False,
                 known=None) -> None:
        self.pattern = pattern
        self.base, self.regex = existing_base(pattern)
        self.tree = TreeLister([self.base], "", use_inotify=use_inotify, include_hidden=include_hidden, known=known)

    @property
    def last_listed(self) -> int:
        return self.tree.last_listed

    @property
    def notifying(self) -> bool:
        return self.tree.notifying

    def wait(self, timeout: float) -> bool:
        return self.tree.wait(timeout)

    def scan(self, recheck: Collection[str] = ()) -> list[FileStat]:
        files = self.tree.scan(recheck)
        return files if self.regex is None else [f for f in files if self.regex.match(f.rel)]

    def close(self) -> None:
        self.tree.close()
