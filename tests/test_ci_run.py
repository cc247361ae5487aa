"""CI cannot stay green with the WAN tests skipped (issue 26 item 6).

``.ci/run`` fails when ``bench/install-deps.sh`` fails as root on an apt-get machine, and after a good
install exports ``FSTREAM_REQUIRE_WAN=1``, under which a WAN test that finds a tool missing fails instead
of skipping (``tests/wankit.py``). The script runs for real in a copy of the repository's layout; root,
apt-get, the install and ``make test`` are stand-ins (CI must not install packages or run the suite here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import wankit

REPO = Path(__file__).resolve().parent.parent


def _ci_run(tmp_path: Path, *, uid: int, apt: bool, install_ok: bool,
            new_user_ok: bool = True) -> tuple[subprocess.CompletedProcess, Path]:
    """Run a copy of ``.ci/run`` with stand-ins; return the result and the log the stand-ins wrote."""
    repo, stubs, tools = tmp_path / "repo", tmp_path / "stubs", tmp_path / "tools"
    for d in (repo / ".ci", repo / "bench", stubs, tools):
        d.mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", repo / ".ci" / "run")
    log = tmp_path / "log"
    (repo / ".ci" / "new-user.sh").write_text(  # stand-in: creates no user here
        f'echo "new-user" >> "{log}"\n' + ("" if new_user_ok else "exit 3\n"))
    (repo / "bench" / "install-deps.sh").write_text(
        f'echo install >> "{log}"\n' + ("exit 0\n" if install_ok else 'echo "E: apt failed" >&2\nexit 100\n'))
    stub = {"id": f'echo {uid}\n',
            "make": f'echo "make $* REQUIRE=${{FSTREAM_REQUIRE_WAN:-}}${{FSTREAM_REQUIRE_SERVERS:-}}" >> "{log}"\n'}
    if apt:
        stub["apt-get"] = "exit 0\n"
    for name, body in stub.items():
        (stubs / name).write_text("#!/bin/sh\n" + body)
        (stubs / name).chmod(0o755)
    for tool in ("bash", "dirname", "mktemp", "cat", "rm"):  # nothing else on PATH: no real apt-get, id or make
        (tools / tool).symlink_to(shutil.which(tool))
    env = {k: v for k, v in os.environ.items() if k not in (wankit.REQUIRE_ENV, "FSTREAM_REQUIRE_SERVERS")}  # CI sets both
    env["PATH"] = f"{stubs}:{tools}"
    cp = subprocess.run([shutil.which("bash"), str(repo / ".ci" / "run")], capture_output=True, text=True,
                        env=env, timeout=60)
    return cp, log


def _log(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_failed_install_as_root_with_apt_fails_ci_loudly_before_the_tests(tmp_path):
    cp, log = _ci_run(tmp_path, uid=0, apt=True, install_ok=False)
    assert cp.returncode != 0
    assert ".ci/run: bench/install-deps.sh failed" in cp.stderr and "failing CI instead of" in cp.stderr
    assert _log(log) == ["install"], "the tests ran after a failed install"


def test_a_good_install_runs_the_tests_requiring_the_wan_tools(tmp_path):
    cp, log = _ci_run(tmp_path, uid=0, apt=True, install_ok=True)
    assert cp.returncode == 0, cp.stderr
    lines = _log(log)  # the new user's demo runs while this checkout installs: those two in either order
    assert lines[0] == "install" and sorted(lines[1:3]) == ["make install REQUIRE=11", "new-user"], lines
    assert lines[3:] == ["make test REQUIRE=11"]  # WAN tools and the server matrix required


@pytest.mark.parametrize("uid, apt, first", [(1000, True, []), (0, False, ["new-user"])],
                         ids=["not-root", "no-apt-get"])
def test_without_root_or_apt_nothing_is_installed_and_the_wan_tests_may_skip(tmp_path, uid, apt, first):
    cp, log = _ci_run(tmp_path, uid=uid, apt=apt, install_ok=False)
    assert cp.returncode == 0, cp.stderr
    lines = _log(log)
    assert sorted(lines[:-1]) == sorted([*first, "make install REQUIRE="]) and lines[-1] == "make test REQUIRE="


def test_a_failed_new_user_demo_fails_ci_before_the_tests(tmp_path):
    cp, log = _ci_run(tmp_path, uid=0, apt=True, install_ok=True, new_user_ok=False)
    assert cp.returncode != 0 and "make demo failed as a new user" in cp.stderr
    lines = _log(log)
    assert lines[0] == "install" and sorted(lines[1:]) == ["make install REQUIRE=11", "new-user"], \
        f"the tests ran after the new user's demo failed: {lines}"


# -- the skip guard ---------------------------------------------------------------------------
@pytest.fixture
def root_host_without_tools(tmp_path, monkeypatch):
    """Root with a TUN device but none of the tools on PATH (being root and the device are stand-ins)."""
    tun = tmp_path / "tun"
    tun.touch()
    monkeypatch.setattr(wankit, "TUN", tun)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv(wankit.REQUIRE_ENV, raising=False)
    return monkeypatch


def test_a_missing_tool_skips_saying_which(root_host_without_tools):
    with pytest.raises(pytest.skip.Exception, match=r"WAN testbed: missing ip, tc, iperf3, cc \(C compiler\), "
                                                    r"ss \(iproute2\)$"):
        wankit.require_wan("WAN testbed")


def test_a_missing_tool_fails_when_the_tools_are_required(root_host_without_tools):
    root_host_without_tools.setenv(wankit.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"disk limit: missing ip, .*, losetup; FSTREAM_REQUIRE_WAN=1"):
        wankit.require_wan("disk limit", extra_tools=["losetup"])


def test_what_no_install_can_fix_still_skips_when_the_tools_are_required(root_host_without_tools, tmp_path):
    root_host_without_tools.setenv(wankit.REQUIRE_ENV, "1")
    root_host_without_tools.setattr(wankit, "TUN", tmp_path / "no-tun")
    with pytest.raises(pytest.skip.Exception, match="no-tun is missing"):
        wankit.require_wan("WAN testbed")
    root_host_without_tools.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        wankit.require_wan("WAN testbed")


@pytest.mark.wan
def test_the_wan_and_fault_wan_tests_fail_instead_of_skipping_when_required(tmp_path):
    """The real test files under FSTREAM_REQUIRE_WAN=1 with no tool on PATH: failures, not skips."""
    if wankit.host_reason():
        pytest.skip(f"WAN testbed: {wankit.host_reason()}")
    empty = tmp_path / "empty"
    empty.mkdir()
    select = ["tests/test_wan.py", "tests/faults/test_faults_wan.py", "-k",
              "selfcheck_measures or disk_write_cap or blackhole_30s", "-p", "no:cacheprovider", "-q", "-rfEs"]
    env = {k: v for k, v in os.environ.items() if k not in ("CC", wankit.REQUIRE_ENV)}
    env.update(PATH=str(empty), FSTREAM_FAULT_SEEDS="1")
    runs = {}
    for required in ("", "1"):
        cp = subprocess.run([sys.executable, "-m", "pytest", *select], cwd=REPO, capture_output=True, text=True,
                            env={**env, wankit.REQUIRE_ENV: required}, timeout=300)
        runs[required] = cp
    skipped, failed = runs[""], runs["1"]
    assert skipped.returncode == 0 and "3 skipped" in skipped.stdout, skipped.stdout[-2000:]
    assert failed.returncode == 1 and "skipped" not in failed.stdout.splitlines()[-1], failed.stdout[-2000:]
    assert failed.stdout.count("FSTREAM_REQUIRE_WAN=1 (set by .ci/run") >= 3, failed.stdout[-3000:]
