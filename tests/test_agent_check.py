"""``fstream agent --check`` on the first start (issue 39): the units' ``ExecStartPre`` passes on a bus where no
agent has run yet (no jobs stream, no consumer group: the agent makes them when it starts, and says so), and
still fails on a real problem, naming the thing checked and the reason. A real redis-server, the real command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import authkit
import serverkit
from agentkit import write_secret
from fstream_provider.bus.acl import acl_rules
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys

FSTREAM = (sys.executable, "-m", "transfer_agent.cli")
GROUP = "jobs consumer group present"


def _check(redis_url: str, policy: str, namespace: str = "chk") -> subprocess.CompletedProcess:
    """``fstream agent --check``; a URL with a password goes in ``$FSTREAM_REDIS_URL`` (refused in argv, issue 40)."""
    secret = "@" in redis_url
    return subprocess.run([*FSTREAM, "agent", *(() if secret else ("--redis", redis_url)), "--namespace", namespace,
                           "--policy", policy, "--check"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **({"FSTREAM_REDIS_URL": redis_url} if secret else {})})


@pytest.fixture
def policy(tmp_path: Path) -> str:
    root = tmp_path / "src"
    root.mkdir()
    return authkit.policy_file(tmp_path, write_secret(tmp_path / "secret"), roots=(str(root),))


def _as_user(url: str, user: str, password: str) -> str:
    return url.replace("redis://", f"redis://{user}:{password}@", 1)


def test_check_passes_on_an_empty_bus_and_says_the_agent_creates_the_group(redis_url: str, redis_client: Any,
                                                                             policy: str) -> None:
    assert redis_client.dbsize() == 0  # a fresh Redis: no agent has ever run
    r = _check(redis_url, policy)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ready\n")
    assert (f"ok: {GROUP}: no stream '{{chk}}:jobs' yet (first start on this bus, or Redis lost its data): the "
            "agent creates it and group 'agents' when it starts") in r.stdout
    assert redis_client.dbsize() == 0  # the check changed nothing


def test_check_passes_when_the_stream_has_no_group_yet_and_when_it_has_one(redis_url: str, redis_client: Any,
                                                                           policy: str) -> None:
    redis_client.xadd("{chk}:jobs", {"job_id": "x"})  # the stream without the agents' group
    r = _check(redis_url, policy)
    assert r.returncode == 0 and (f"ok: {GROUP}: no group 'agents' on stream '{{chk}}:jobs' yet (no agent has "
                                  "started on this namespace): the agent creates it when it starts") in r.stdout, r.stdout
    JobStore(redis_client, keys=Keys("chk")).ensure_group()
    r = _check(redis_url, policy)
    assert r.returncode == 0 and f"ok: {GROUP}: group 'agents' on stream '{{chk}}:jobs'" in r.stdout, r.stdout


def test_check_fails_when_redis_is_unreachable(policy: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        r = _check(f"redis://127.0.0.1:{s.getsockname()[1]}/0", policy)
    assert r.returncode == 1 and "failed: redis reachable: " in r.stdout and "ConnectionError" in r.stdout, r.stdout
    assert f"failed: {GROUP}: Redis unreachable" in r.stdout


def test_check_fails_on_bad_credentials_naming_them(redis_url: str, redis_client: Any, policy: str) -> None:
    redis_client.execute_command("ACL", "SETUSER", "dtn1-agent", ">right-password", *acl_rules("agent", "chk", serverkit.chosen_version()))
    r = _check(_as_user(redis_url, "dtn1-agent", "wrong-password"), policy)
    assert r.returncode == 1 and "failed: redis reachable: " in r.stdout, r.stdout
    assert "AuthenticationError" in r.stdout and "wrong-password" not in r.stdout + r.stderr
    r = _check(_as_user(redis_url, "dtn1-agent", "right-password"), policy)  # the same user, the right password
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_fails_when_the_acl_user_may_not_read_the_stream(redis_url: str, redis_client: Any,
                                                               policy: str) -> None:
    """A user of another namespace's role reaches Redis but may not read ``{chk}:jobs``: not a first start, and the
    reason is Redis's refusal, not a missing group."""
    redis_client.execute_command("ACL", "SETUSER", "other-agent", ">pw", *acl_rules("agent", "other", serverkit.chosen_version()))
    r = _check(_as_user(redis_url, "other-agent", "pw"), policy)
    assert r.returncode == 1 and "ok: redis reachable" in r.stdout, r.stdout
    assert f"failed: {GROUP}: XINFO GROUPS {{chk}}:jobs refused: NoPermissionError" in r.stdout, r.stdout


def test_check_fails_when_the_stream_key_holds_something_else(redis_url: str, redis_client: Any,
                                                              policy: str) -> None:
    redis_client.set("{chk}:jobs", "not a stream")
    r = _check(redis_url, policy)
    assert r.returncode == 1 and f"failed: {GROUP}: XINFO GROUPS {{chk}}:jobs refused:" in r.stdout, r.stdout
    assert "WRONGTYPE" in r.stdout


def test_check_still_fails_on_a_bad_policy_or_a_missing_root(tmp_path: Path, redis_url: str) -> None:
    secret = write_secret(tmp_path / "secret")
    missing = tmp_path / "no-such-root"
    r = _check(redis_url, authkit.policy_file(tmp_path, secret, roots=(str(missing),)))
    assert r.returncode == 2 and f"source root '{missing}': does not exist" in r.stderr, r.stderr
    bad = tmp_path / "bad-policy.toml"
    bad.write_text("[agent]\nroots = 7\n")
    r = _check(redis_url, str(bad))
    assert r.returncode == 2 and "roots" in r.stderr, r.stderr
