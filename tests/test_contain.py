"""Source containment (issue 32): paths outside the roots, ``..``, symlinks and a link swapped in after accept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from transfer_agent.errors import RefusedError
from transfer_agent.storage import contain
from transfer_agent.storage.contain import OutsideRootsError, SourceRoots, literal_part


def _kernel_path(path: str) -> str:
    """What the kernel itself resolves ``path`` to (an O_PATH descriptor read back from /proc)."""
    fd = os.open(path, os.O_PATH)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


# ---- the property: accept iff the kernel-style resolution lies within the root --------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, str]:
    base = os.path.realpath(tmp_path_factory.mktemp("contain"))
    root, outside = f"{base}/root", f"{base}/outside"
    for d in ("root/a/b", "root/．．", "root/…", "root2/a", "root-old", "outside/a/b"):
        os.makedirs(f"{base}/{d}")
    os.symlink("a", f"{root}/in")                # inside -> inside
    os.symlink("../outside", f"{root}/out")      # relative link climbing out
    os.symlink(f"{outside}/a", f"{root}/abs")    # absolute link out
    os.symlink("in/b", f"{root}/deep")           # chain staying inside
    os.symlink("out/a", f"{root}/chain")         # chain ending outside
    return {"base": base, "root": root, "outside": outside}


COMPONENTS = st.sampled_from(["a", "b", "..", ".", "", "…", "．．", "in", "out", "abs", "deep", "chain", "root",
                              "root2", "root-old", "outside", "missing"])


@settings(max_examples=200, deadline=None)
@given(st.lists(COMPONENTS, max_size=8))
def test_check_source_accepts_iff_resolved_within_root(tree, comps: list[str]) -> None:
    root = tree["root"]
    joined = root + "/" + "/".join(comps)
    roots = SourceRoots.of([root])
    real = os.path.realpath(joined)
    inside = Path(real).is_relative_to(root)  # the oracle: pathlib, component-wise
    if os.path.exists(joined):
        assert _kernel_path(joined) == real  # and realpath is what the kernel would open
    if inside:
        assert roots.check_source(joined) == real
        assert roots.check_path(joined) == real
    else:
        with pytest.raises(OutsideRootsError) as exc:
            roots.check_source(joined)
        assert repr(joined) in str(exc.value) and f"({root})" in str(exc.value)
        assert (real == joined) or f"resolves to {real!r}" in str(exc.value)


NAMES = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(NAMES, st.lists(NAMES, max_size=3))
def test_contains_is_component_wise(suffix: str, rest: list[str]) -> None:
    roots = SourceRoots(("/x/data",))
    tail = "".join("/" + r for r in rest)
    assert not roots.contains("/x/data" + suffix + tail)  # /x/data2/..., /x/data-old: siblings, not children
    child = "/x/data/" + suffix + tail
    assert roots.contains(child) == (os.path.normpath(child) == child)


@pytest.mark.parametrize("path", ["/x/data2/f", "/x/data-old", "/x/dat", "/x", "/x/data/../data2", "x/data/f",
                                  "//x/data/f", "pipe:[7]", ""])
def test_contains_refuses_siblings_parents_and_unnormalised(path: str) -> None:
    assert not SourceRoots(("/x/data",)).contains(path)
    assert SourceRoots(("/x/data",)).contains("/x/data") and SourceRoots(("/",)).contains("/anything/at/all")


def test_message_names_source_resolution_and_roots(tmp_path: Path) -> None:
    (tmp_path / "data" / "lcls").mkdir(parents=True)
    root = os.path.realpath(tmp_path / "data" / "lcls")
    src = f"{root}/../../etc/passwd"
    with pytest.raises(OutsideRootsError) as exc:
        SourceRoots.of([root]).check_source(src)
    real = os.path.realpath(src)
    assert str(exc.value) == f"source {src!r} resolves to {real!r}, outside this agent's source roots ({root})"
    assert isinstance(exc.value, RefusedError) and not exc.value.retryable and exc.value.kind == "outside roots"


# ---- symlinks --------------------------------------------------------------------------------------------------


@pytest.fixture
def layout(tmp_path: Path) -> tuple[str, str, SourceRoots]:
    base = os.path.realpath(tmp_path)
    root, outside = f"{base}/root", f"{base}/outside"
    os.makedirs(f"{root}/run1")
    os.makedirs(f"{outside}/d")
    for f in (f"{root}/run1/x.h5", f"{outside}/secret", f"{outside}/d/x.h5"):
        Path(f).write_text("x")
    return root, outside, SourceRoots.of([root])


def _refused(fn, arg: str, *needles: str) -> str:
    with pytest.raises(OutsideRootsError) as exc:
        fn(arg)
    for n in needles:
        assert n in str(exc.value)
    return str(exc.value)


def test_links_out_of_the_root_are_refused(layout) -> None:
    root, outside, roots = layout
    os.symlink(f"{outside}/d", f"{root}/dirlink")
    os.symlink(f"{outside}/secret", f"{root}/filelink")
    os.symlink("../../outside", f"{root}/run1/rel")
    os.symlink("hop2", f"{root}/hop1")
    os.symlink("run1/rel", f"{root}/hop2")
    _refused(roots.check_source, f"{root}/dirlink", f"resolves to '{outside}/d'", f"({root})")
    _refused(roots.check_source, f"{root}/dirlink/*.h5", f"'{root}/dirlink/*.h5' resolves to '{outside}/d'")
    _refused(roots.check_path, f"{root}/filelink", f"'{root}/filelink' resolves to '{outside}/secret'")
    _refused(roots.check_source, f"{root}/run1/rel/secret", f"resolves to '{outside}/secret'")
    _refused(roots.check_source, f"{root}/hop1/d/x.h5", f"resolves to '{outside}/d/x.h5'")
    fd = os.open(f"{root}/filelink", os.O_RDONLY)
    try:
        _refused(lambda p: roots.check_fd(fd, p), f"{root}/filelink", f"opened '{outside}/secret'", f"({root})")
    finally:
        os.close(fd)


def test_links_that_stay_inside_are_accepted(layout) -> None:
    root, _, roots = layout
    os.symlink("run1", f"{root}/latest")
    os.symlink("latest/x.h5", f"{root}/newest.h5")
    assert roots.check_source(f"{root}/latest") == f"{root}/run1"
    assert roots.check_path(f"{root}/newest.h5") == f"{root}/run1/x.h5"
    assert roots.check_source(f"{root}/latest/../run1/x.h5") == f"{root}/run1/x.h5"


def test_dotdot_is_applied_after_the_link_as_the_kernel_does(layout) -> None:
    """``root/l/../secret`` with l -> outside/d is outside/secret; a lexical abspath would say root/secret."""
    root, outside, roots = layout
    os.symlink(f"{outside}/d", f"{root}/l")
    src = f"{root}/l/../secret"
    assert _kernel_path(src) == f"{outside}/secret"
    _refused(roots.check_source, src, f"resolves to '{outside}/secret'")


def test_root_given_through_a_symlink_is_resolved(layout, tmp_path: Path) -> None:
    root, outside, _ = layout
    os.symlink(root, tmp_path / "alias")
    roots = SourceRoots.of([tmp_path / "alias"])
    assert roots.roots == (root,)
    assert roots.check_source(f"{tmp_path}/alias/run1/x.h5") == f"{root}/run1/x.h5"
    assert roots.check_path(f"{root}/run1/x.h5") == f"{root}/run1/x.h5"
    _refused(roots.check_source, f"{tmp_path}/alias/../outside/secret", f"({root})")


def test_nested_and_two_roots(layout) -> None:
    root, outside, _ = layout
    nested = SourceRoots.of([root, f"{root}/run1"])
    assert nested.check_path(f"{root}/run1/x.h5") == f"{root}/run1/x.h5"
    two = SourceRoots.of([f"{root}/run1", f"{outside}/d", f"{root}/run1"])
    assert two.roots == (f"{root}/run1", f"{outside}/d") and two.describe() == f"{root}/run1, {outside}/d"
    assert two.check_path(f"{outside}/d/x.h5") == f"{outside}/d/x.h5"
    _refused(two.check_path, f"{outside}/secret",
             f"file '{outside}/secret' is outside this agent's source roots ({root}/run1, {outside}/d)")


def test_bind_mount_like_two_spellings(tmp_path: Path) -> None:
    """Root B is store/B reached through ``link`` (a sibling of root A pointing at store); A/via points into B."""
    base = os.path.realpath(tmp_path)
    os.makedirs(f"{base}/A")
    os.makedirs(f"{base}/store/B")
    os.makedirs(f"{base}/store/other")
    Path(f"{base}/store/B/f.h5").write_text("b")
    Path(f"{base}/store/other/g.h5").write_text("g")
    os.symlink(f"{base}/store", f"{base}/link")
    os.symlink("../store/B", f"{base}/A/via")
    both = SourceRoots.of([f"{base}/A", f"{base}/link/B"])
    assert both.roots == (f"{base}/A", f"{base}/store/B")
    for spelling in (f"{base}/link/B/f.h5", f"{base}/store/B/f.h5", f"{base}/A/via/f.h5"):
        assert both.check_path(spelling) == f"{base}/store/B/f.h5"
    _refused(both.check_path, f"{base}/link/other/g.h5", f"resolves to '{base}/store/other/g.h5'")
    _refused(both.check_source, f"{base}/A/via/../other/g.h5", f"resolves to '{base}/store/other/g.h5'")
    only_a = SourceRoots.of([f"{base}/A"])
    _refused(only_a.check_path, f"{base}/A/via/f.h5", f"resolves to '{base}/store/B/f.h5'", f"({base}/A)")


# ---- the descriptor check: a link swapped in after the job was accepted ----------------------------------------


def _swap_for_link(path: str, target: str) -> None:
    os.symlink(target, path + ".new")
    os.replace(path + ".new", path)


def test_link_swapped_in_after_accept_is_caught_on_the_descriptor(layout) -> None:
    root, outside, roots = layout
    path = f"{root}/f"
    Path(path).write_text("ok")
    assert roots.check_path(path) == path
    _swap_for_link(path, f"{outside}/secret")
    fd = os.open(path, os.O_RDONLY)
    try:
        msg = _refused(lambda p: roots.check_fd(fd, p), path, f"'{path}' opened '{outside}/secret'", f"({root})")
        assert "outside this agent's source roots" in msg
    finally:
        os.close(fd)


def test_name_swapped_back_after_the_open_does_not_fool_the_check(layout) -> None:
    """The race a name check loses: the link is there for the open, a regular file is back for the check."""
    root, outside, roots = layout
    path = f"{root}/f"
    os.symlink(f"{outside}/secret", path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.unlink(path)
        Path(path).write_text("innocent")
        assert roots.check_path(path) == path  # the name looks fine now
        _refused(lambda p: roots.check_fd(fd, p), path, f"opened '{outside}/secret'")
    finally:
        os.close(fd)


def test_file_opened_before_the_swap_is_the_one_sent(layout) -> None:
    root, outside, roots = layout
    path = f"{root}/f"
    Path(path).write_text("ok")
    fd = os.open(path, os.O_RDONLY)
    try:
        _swap_for_link(path, f"{outside}/secret")
        roots.check_fd(fd, path)  # the descriptor is still the inside file: accepted
        assert os.read(fd, 10) == b"ok"
    finally:
        os.close(fd)


def test_fifo_and_directory_are_not_regular_files(layout) -> None:
    root, _, roots = layout
    os.mkfifo(f"{root}/pipe")
    for path, kind in ((f"{root}/pipe", "a FIFO"), (f"{root}/run1", "a directory")):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            _refused(lambda p: roots.check_fd(fd, p), path, f"which is {kind}, not a regular file")
        finally:
            os.close(fd)


def test_without_proc_the_inode_is_compared(layout, tmp_path: Path, monkeypatch) -> None:
    root, outside, roots = layout
    monkeypatch.setattr(contain, "_PROC_FD", str(tmp_path / "no-proc"))
    path = f"{root}/f"
    Path(path).write_text("ok")
    fd = os.open(path, os.O_RDONLY)
    try:
        roots.check_fd(fd, path)  # same inode at realpath(path), inside: accepted
        Path(f"{root}/g").write_text("other")
        os.replace(f"{root}/g", path)  # a different file under the same inside name
        _refused(lambda p: roots.check_fd(fd, p), path, "not the one at")
    finally:
        os.close(fd)
    _swap_for_link(path, f"{outside}/secret")
    fd = os.open(path, os.O_RDONLY)
    try:
        _refused(lambda p: roots.check_fd(fd, p), path, f"opened '{outside}/secret'")
    finally:
        os.close(fd)


# ---- configuration, relative sources, globs ---------------------------------------------------------------------


def test_relative_sources_are_refused(layout, monkeypatch) -> None:
    root, _, roots = layout
    monkeypatch.chdir(root)
    for src in ("run1/x.h5", "./run1", "run*/x.h5", ""):
        _refused(roots.check_source, src, "must be absolute")


def test_no_roots_refuse_everything(layout) -> None:
    root, _, _ = layout
    none = SourceRoots.of([])
    assert none.roots == () and none.describe() == "none configured"
    assert not none.contains(root)
    for fn in (none.check_source, none.check_path):
        _refused(fn, f"{root}/run1/x.h5", "no source roots")
    fd = os.open(f"{root}/run1/x.h5", os.O_RDONLY)
    try:
        _refused(lambda p: none.check_fd(fd, p), f"{root}/run1/x.h5", "no source roots")
    finally:
        os.close(fd)


def test_bad_roots_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{tmp_path}/missing.*does not exist"):
        SourceRoots.of([tmp_path / "missing"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="file.*not a directory"):
        SourceRoots.of([str(tmp_path / "file")])
    with pytest.raises(ValueError, match="not an absolute, normalised path"):
        SourceRoots(("/a/../b",))


def test_glob_sources(layout) -> None:
    root, outside, roots = layout
    assert literal_part("/d/run42/*.h5") == "/d/run42" and literal_part("/d/**/x.h5") == "/d"
    assert literal_part("/*") == "/" and literal_part("/d/[ab]/x") == "/d" and literal_part("/d/x") == "/d/x"
    assert roots.check_source(f"{root}/run*/x.h5") == root
    assert roots.check_source(f"{root}/run1/**/*.h5") == f"{root}/run1"
    assert roots.check_source(f"{root}/not-yet/run*/x.h5") == f"{root}/not-yet"  # resolved as far as it exists
    _refused(roots.check_source, f"{root}/../etc/*", f"resolves to '{os.path.dirname(root)}/etc'", f"({root})")
    _refused(roots.check_source, f"{outside}/**/*.h5", f"resolves to '{outside}'")
    _refused(roots.check_source, f"{root}/*/../../outside/secret", "'..' after a wildcard")
    _refused(roots.check_source, f"{root}/x\x00y", "NUL")
