"""Roots as filesystem boundaries (issue 40 item 6): the attacks that got through issue 32's path checks.

Each attack runs end to end (a real Redis, a real agent, a real receiver, real files, FIFOs, mounts and
processes), once through openat2 and once through the fallback walk (``FSTREAM_OPENAT2=0``):

* a hard link inside a root to a file outside it was sent;
* a bind mount inside a root was sent;
* a link to a FIFO outside, swapped in after the listing, was refused only after ``open`` followed it: the
  FIFO's writer outside was woken. Here the writer counts its opens, and the test's own open must be its first.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agentkit import make_files, transfer_swapping_after_listing
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.authz.policy import PolicyError, load_policy
from fstream_provider.authz.signing import resolve_signer
from fstream_provider.model.spec import TransferSpec
from transfer_agent.daemon.authorize import AgentPolicy
from transfer_agent.daemon.worker import Agent
from transfer_agent.storage.beneath import kernel_has_openat2
from transfer_agent.storage.contain import Guard, OutsideRootsError, SourceRoots

NS = Keys("roots")
WAYS = [pytest.param("1", id="openat2", marks=pytest.mark.skipif(not kernel_has_openat2(), reason="no openat2 here")),
        pytest.param("0", id="walk")]


@pytest.fixture(params=WAYS)
def way(request, monkeypatch) -> str:
    """openat2 or the walk of O_NOFOLLOW opens, for the agent's guard (read when a job is decided)."""
    monkeypatch.setenv("FSTREAM_OPENAT2", request.param)
    return request.param


@pytest.fixture
def site(tmp_path: Path, secret: Path, rx, redis_url: str, redis_client, way):
    """Root ``data/`` (``data/sra/s.dat``), a file and a FIFO outside it, a receiver, a signer the agent trusts."""
    base = Path(os.path.realpath(tmp_path))
    data, outside = base / "data", base / "outside"
    make_files(data / "sra", {"s.dat": 30_000}, seed=2)
    make_files(outside, {"secret.txt": 1000}, seed=3)
    store = JobStore(redis_client, keys=NS, signer=resolve_signer())
    return dict(data=data, outside=outside, dst=base / "dst", rx=rx, url=redis_url, client=redis_client,
                store=store, policy=AgentPolicy.local([str(data)], str(secret)), dest=f"fstream://127.0.0.1:{rx.port}")


def _run(site, sub: str, policy: AgentPolicy | None = None, swap=None):
    """Submit ``data/sra`` to ``dest/sub``, run one agent over it once, return the job."""
    job_id, _ = site["store"].submit(TransferSpec(sources=[str(site["data"] / "sra")],
                                                  destination=f"{site['dest']}/{sub}", tuner="fixed"))
    factory = None if swap is None else transfer_swapping_after_listing(swap)
    agent = Agent(site["url"], name=f"roots-{sub}", policy=policy or site["policy"], keys=NS, block_ms=100,
                  max_retries=0, **({"transfer_factory": factory} if factory else {}))
    agent.run(once=True)
    job = JobStore(site["client"], keys=NS).get(job_id)
    assert job is not None and job.terminal, job
    return job


def _landed(site, sub: str) -> list[str]:
    root = site["dst"] / sub
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _with(policy: AgentPolicy, roots: list, **kw) -> AgentPolicy:
    return dataclasses.replace(policy, roots=SourceRoots.of(roots, **kw))


# ---- the attacks, end to end ----------------------------------------------------------------------------------


def test_a_hard_link_to_a_file_outside_is_refused_unless_the_policy_allows_hard_links(site):
    link = site["data"] / "sra" / "leak.txt"
    os.link(site["outside"] / "secret.txt", link)
    job = _run(site, "hl")
    assert job.state == "failed", job
    assert f"file '{link}' refused: it has 2 hard links" in job.error and "allow_hardlinks = true" in job.error
    assert f"(source root {site['data']})" in job.error, job.error
    assert _landed(site, "hl") == ["s.dat"]
    job = _run(site, "hl-allowed", _with(site["policy"], [str(site["data"])], allow_hardlinks=True))
    assert job.state == "succeeded", job.error
    assert _landed(site, "hl-allowed") == ["leak.txt", "s.dat"]
    assert (site["dst"] / "hl-allowed" / "leak.txt").read_bytes() == (site["outside"] / "secret.txt").read_bytes()


@pytest.fixture
def bind_mount(site):
    """``data/sra/mnt`` bind-mounted from ``outside`` (root only; CI as a user skips with the reason)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a bind mount needs root here (an in-process agent cannot join an `unshare -rm` namespace)")
    mnt = site["data"] / "sra" / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "--bind", str(site["outside"]), str(mnt)], check=True)
    try:
        assert (mnt / "secret.txt").exists()
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_bind_mount_inside_a_root_is_refused_unless_the_root_spans_mounts(site, bind_mount):
    job = _run(site, "bind")
    assert job.state == "failed", job
    assert f"file '{bind_mount}/secret.txt' refused: it crosses a mount point" in job.error, job.error
    assert "span_mounts = true" in job.error and f"(source root {site['data']})" in job.error
    assert _landed(site, "bind") == ["s.dat"]
    spanning = _with(site["policy"], [{"path": str(site["data"]), "span_mounts": True}])
    job = _run(site, "bind-span", spanning)
    assert job.state == "succeeded", job.error
    assert _landed(site, "bind-span") == ["mnt/secret.txt", "s.dat"]


WRITER = r"""
import os, sys
fifo, n = sys.argv[1], 0
print("ready", flush=True)
while True:
    fd = os.open(fifo, os.O_WRONLY)   # blocks until someone opens the FIFO for reading
    n += 1
    try:
        os.write(fd, b"%d\n" % n)
    except BrokenPipeError:
        pass
    os.close(fd)
"""


def test_a_link_to_a_fifo_outside_swapped_in_after_the_listing_never_opens_the_fifo(site):
    """Issue 32's guard opened the link (non-blocking) and then refused the descriptor: the FIFO's writer had
    been woken. Now the name is opened beneath the root without following links: the writer's first open is the
    one this test makes afterwards."""
    fifo = site["outside"] / "fifo"
    os.mkfifo(fifo)
    victim = site["data"] / "sra" / "s.dat"

    def swap() -> None:
        if not victim.is_symlink():
            victim.unlink()
            victim.symlink_to(fifo)

    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(fifo)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
        done = threading.Event()
        box: dict = {}
        th = threading.Thread(target=lambda: (box.update(job=_run(site, "fifo", swap=swap)), done.set()), daemon=True)
        th.start()
        assert done.wait(60), "the agent blocked"
        job = box["job"]
        assert victim.is_symlink()
        with open(fifo, "rb") as f:  # the writer is still blocked in its first open: this open wakes it
            first = f.readline()
        assert first == b"1\n", f"the FIFO outside the root was opened {int(first) - 1} time(s) before the test's"
        assert job.state == "failed" and f"file '{victim}' refused" in job.error, job.error
        assert "symbolic link" in job.error and f"(source root {site['data']})" in job.error, job.error
    finally:
        writer.kill()
        writer.wait()
    assert _landed(site, "fifo") == []


# ---- the guard itself, both ways --------------------------------------------------------------------------------


class _F:
    def __init__(self, src: str) -> None:
        self.src = src


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    base = Path(os.path.realpath(tmp_path))
    root, outside = base / "root", base / "outside"
    make_files(root / "run1", {"a.dat": 100}, seed=1)
    make_files(outside, {"secret": 10}, seed=2)
    (root / "latest").symlink_to("run1")  # a link that stays inside: followed when listed, never at open
    os.mkfifo(root / "run1" / "pipe")
    return {"root": root, "outside": outside}


def _raise(_sf, exc: Exception) -> None:
    raise exc


def _open(guard: Guard, path: Path) -> bytes:
    admitted = guard.admit([_F(str(path))], _raise)
    assert [f.src for f in admitted] == [str(path)]
    fd, st = guard.open(str(path))
    try:
        assert os.fstat(fd).st_ino == st.st_ino
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


@pytest.mark.parametrize("openat2", [pytest.param(True, marks=pytest.mark.skipif(not kernel_has_openat2(),
                                                                                 reason="no openat2 here")), False],
                         ids=["openat2", "walk"])
def test_the_guard_opens_regular_files_beneath_the_root_and_refuses_the_rest(tree, openat2):
    root = tree["root"]
    guard = Guard(SourceRoots.of([root.parent]), SourceRoots.of([root]), openat2=openat2)
    assert guard.openat2 is openat2
    data = (root / "run1" / "a.dat").read_bytes()
    assert _open(guard, root / "run1" / "a.dat") == data
    assert _open(guard, root / "latest" / "a.dat") == data  # resolved at listing, opened by its real name
    with pytest.raises(OutsideRootsError, match=r"it is a FIFO, not a regular file") as exc:
        _open(guard, root / "run1" / "pipe")
    assert f"'{root}/run1/pipe'" in str(exc.value) and f"(source root {root})" in str(exc.value)
    # swapped after the listing: the directory becomes a link out, then the file a link out
    (root / "run2").mkdir()
    (root / "run2" / "b.dat").write_text("b")
    guard.admit([_F(str(root / "run2" / "b.dat"))], lambda sf, exc: pytest.fail(str(exc)))
    os.rename(root / "run2", root / "run2.old")
    (root / "run2").symlink_to(tree["outside"])
    (tree["outside"] / "b.dat").write_text("stolen")
    with pytest.raises(OutsideRootsError, match="symbolic link"):
        guard.open(str(root / "run2" / "b.dat"))
    (root / "run1" / "a.dat").unlink()
    (root / "run1" / "a.dat").symlink_to(tree["outside"] / "secret")
    with pytest.raises(OutsideRootsError, match="symbolic link"):
        guard.open(str(root / "run1" / "a.dat"))
    with pytest.raises(FileNotFoundError):
        guard.open(str(root / "run1" / "gone"))
    guard.close()


@pytest.mark.parametrize("openat2", [pytest.param(True, marks=pytest.mark.skipif(not kernel_has_openat2(),
                                                                                 reason="no openat2 here")), False],
                         ids=["openat2", "walk"])
def test_a_root_replaced_by_a_link_after_the_policy_was_loaded_is_not_followed(tree, openat2):
    """A submitter's root is opened beneath the agent's without following links: replacing it by a link out
    (by someone who may write the agent's root) does not move the boundary."""
    root = tree["root"]
    guard = Guard(SourceRoots.of([root]), SourceRoots.of([root / "run1"]), openat2=openat2)
    guard.admit([_F(str(root / "run1" / "a.dat"))], _raise)  # listed while run1 is a directory
    os.rename(root / "run1", root / "run1.old")
    (root / "run1").symlink_to(tree["outside"])
    (tree["outside"] / "a.dat").write_text("stolen")
    with pytest.raises(OutsideRootsError, match=rf"source root {root}/run1 is or passes through a symbolic link"):
        guard.open(str(root / "run1" / "a.dat"))


def test_policy_roots_take_span_mounts_entries_and_allow_hardlinks(tmp_path):
    data, big = tmp_path / "data", tmp_path / "big"
    data.mkdir()
    big.mkdir()
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[agent]\nroots = ["{data}", {{ path = "{big}", span_mounts = true }}]\n'
                      'allow_hardlinks = true\n')
    loaded = AgentPolicy.from_model(load_policy(policy))
    assert loaded.roots.roots == (str(data.resolve()), str(big.resolve()))
    assert loaded.roots.span_mounts == {str(big.resolve())} and loaded.roots.allow_hardlinks is True
    assert Guard(loaded.roots).allow_hardlinks is True and Guard(SourceRoots.of([data])).allow_hardlinks is False
    policy.write_text('[agent]\nroots = [{ path = "rel", span_mounts = true }]\n')
    with pytest.raises(PolicyError, match=r"agent.roots\[0\] = 'rel': a source root must be an absolute path"):
        load_policy(policy)
    policy.write_text(f'[agent]\nroots = [{{ path = "{data}", spans = true }}]\n')
    with pytest.raises(PolicyError, match="spans.*unknown key"):
        load_policy(policy)


def test_the_most_specific_roots_decide_on_hard_links(tree):
    root = tree["root"]
    os.link(root / "run1" / "a.dat", root / "run1" / "twin.dat")
    agent_allows = SourceRoots.of([root], allow_hardlinks=True)
    assert _open(Guard(agent_allows, SourceRoots.of([root])), root / "run1" / "twin.dat")
    with pytest.raises(OutsideRootsError, match="2 hard links"):
        _open(Guard(agent_allows, SourceRoots.of([root], allow_hardlinks=False)), root / "run1" / "twin.dat")


GUARD_IN_NAMESPACE = r"""
import os, subprocess, sys
from transfer_agent.storage.contain import Guard, OutsideRootsError, SourceRoots
root, outside, way = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
os.mkdir(f"{root}/mnt")
subprocess.run(["mount", "--bind", outside, f"{root}/mnt"], check=True)
class F:
    src = f"{root}/mnt/secret"
for roots in (SourceRoots.of([root]), SourceRoots.of([{"path": root, "span_mounts": True}])):
    guard = Guard(roots, openat2=way)
    assert guard.admit([F()], lambda sf, exc: sys.exit(f"admit refused: {exc}"))
    try:
        fd, _ = guard.open(F.src)
        print("read", os.read(fd, 100).decode())
    except OutsideRootsError as exc:
        print("refused", exc)
"""


@pytest.mark.parametrize("openat2", [pytest.param(True, marks=pytest.mark.skipif(not kernel_has_openat2(),
                                                                                 reason="no openat2 here")), False],
                         ids=["openat2", "walk"])
def test_a_bind_mount_is_refused_in_a_user_namespace_without_root(tmp_path, openat2):
    """The mount rule where CI is not root: ``unshare -rm`` (a user and mount namespace of its own) may bind-mount;
    the guard in there refuses the mount unless the root spans mounts."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("unshare -rm is not allowed here (user namespaces disabled), so no bind mount can be made")
    base = Path(os.path.realpath(tmp_path))
    (base / "root").mkdir()
    (base / "outside").mkdir()
    (base / "outside" / "secret").write_text("s3cret")
    repo = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(["unshare", "-rm", sys.executable, "-c", GUARD_IN_NAMESPACE, str(base / "root"),
                          str(base / "outside"), "1" if openat2 else "0"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": repo})
    assert out.returncode == 0, out.stderr
    refused, spanned = out.stdout.splitlines()
    assert refused == (f"refused file '{base}/root/mnt/secret' refused: it crosses a mount point (a root reads only "
                       f"its own file system unless it is declared with span_mounts = true) (source root {base}/root)")
    assert spanned == "read s3cret"
