"""Jobs signed with Ed25519 and destinations default-deny (issue 40 items 4 and 5), with a real Redis, real agents
and real receivers.

Attack 4: whoever holds a copy of an agent's whole policy directory (every file the agent reads) tries to sign a
job as each submitter, with each file as an HMAC key (issue 32's envelope) and as an Ed25519 key, and by naming a
submitter's key id over a signature of its own: the agent refuses every one, while the real submitter (whose
private key never was in that directory) still moves a file. Attack 5: a policy that lists no destinations (for
the submitter or the agent) sends nowhere: the job is refused, saying so, and nothing changes under the second
receiver. Also: rotation (two public keys accepted, then the old one removed), the single-user pair made on first
use, and the refusal of issue 32's ``key_file`` and HMAC envelopes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from agentkit import make_files, start_receiver, wait_until
from fstream_provider.bus.audit import AuditLog
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.authz.ed25519 import PrivateKey, load_private, load_public, parse_public, write_pair
from fstream_provider.model.keyfile import KeyFileError
from fstream_provider.authz.policy import PolicyError
from fstream_provider.authz.signing import (NONCE_BYTES, JobAuth, Signer, canonical, local_key_file,
                                            resolve_signer)
from fstream_provider.model.spec import TransferSpec
from transfer_agent.daemon.authorize import AgentPolicy, Authorizer
from transfer_agent.daemon.worker import Agent

SUBMITTERS = ("a", "b", "c")


class _Envelope:
    """What a forger stores as a job's ``auth``: any JSON it likes."""

    def __init__(self, submitter: str, fields: dict) -> None:
        self.submitter, self.fields = submitter, fields

    def to_json(self) -> str:
        return json.dumps(self.fields, sort_keys=True)


class HmacForger:
    """Issue 32's signature (HMAC-SHA256 of the v1 canonical job) under a key the forger read from a file."""

    def __init__(self, submitter: str, key: bytes) -> None:
        self.submitter, self.key = submitter, key

    def sign(self, namespace: str, job_id: str, spec_json: str, *, now: float) -> _Envelope:
        nonce = os.urandom(NONCE_BYTES).hex()
        message = json.dumps(["fstream-job-v1", namespace, job_id, self.submitter, repr(float(now)), nonce,
                              spec_json]).encode()
        return _Envelope(self.submitter, {"submitter": self.submitter, "ts": now, "nonce": nonce,
                                          "tag": hmac.new(self.key, message, hashlib.sha256).hexdigest()})


class KeyIdForger:
    """A v2 envelope naming the submitter's key id (read from its public key) over a signature by another key."""

    def __init__(self, submitter: str, claimed_key_id: str) -> None:
        self.submitter, self.claimed, self.own = submitter, claimed_key_id, PrivateKey.generate()

    def sign(self, namespace: str, job_id: str, spec_json: str, *, now: float) -> JobAuth:
        nonce = os.urandom(NONCE_BYTES).hex()
        sig = self.own.sign(canonical(namespace, job_id, self.submitter, now, nonce, self.claimed, spec_json))
        return JobAuth(self.submitter, now, nonce, self.claimed, sig)


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root``: relative path -> sha256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _run_agent(url: str, policy: AgentPolicy, keys: Keys, name: str):
    agent = Agent(url, name=name, policy=policy, keys=keys, block_ms=100, poll_interval=0.1, flush_interval=0.05,
                  max_retries=0)
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    return agent, th


def test_a_copy_of_an_agents_policy_directory_signs_no_job(tmp_path, secret, rx, redis_url, redis_client):
    """Attack 4: with every file the agent reads, no submitter can be impersonated; the real one still can send."""
    etc, home = tmp_path / "etc-fstream", tmp_path / "submitters-home"
    data = make_files(tmp_path / "data", {"run.dat": 20_000}, seed=11)
    (etc / "keys").mkdir(parents=True)
    shutil.copy(secret, etc / "keys" / "default")
    os.chmod(etc / "keys" / "default", 0o600)
    (etc / "submitters").mkdir()
    home.mkdir()
    for s in SUBMITTERS:  # each submitter makes its pair at home and hands the agent its public key only
        write_pair(home / f"{s}.key", PrivateKey.generate(s), etc / "submitters" / f"{s}.key.pub")
    dest = f"fstream://127.0.0.1:{rx.port}"
    (etc / "policy.toml").write_text(
        f'[agent]\nroots = ["{data}"]\ndestinations = ["{dest}/"]\n[agent.keys]\ndefault = "{etc}/keys/default"\n'
        + "".join(f'[submitters.{s}]\npublic_key_file = "{etc}/submitters/{s}.key.pub"\n' for s in SUBMITTERS))
    keys = Keys("forge4")
    agent, th = _run_agent(redis_url, AgentPolicy.from_file(str(etc / "policy.toml")), keys, "forge-agent")
    try:
        stolen = tmp_path / "stolen"
        shutil.copytree(etc, stolen)
        files = sorted(p for p in stolen.rglob("*") if p.is_file())
        assert len(files) == 5  # policy.toml, the receiver key, three public keys
        forged: dict[str, str] = {}  # job id -> the reason its refusal must give
        for s in SUBMITTERS:
            for f in files:
                with pytest.raises(KeyFileError):  # no file of the agent's is anyone's private key
                    load_private(f)
                store = JobStore(redis_client, keys=keys, signer=HmacForger(s, f.read_bytes().strip()))
                job_id, _ = store.submit(TransferSpec(sources=[str(data)], destination=f"{dest}/{s}-{f.name}"))
                forged[job_id] = "signed with an HMAC shared key (fstream-job-v1), which agents no longer accept"
            claimed = load_public(stolen / "submitters" / f"{s}.key.pub").key_id
            store = JobStore(redis_client, keys=keys, signer=KeyIdForger(s, claimed))
            job_id, _ = store.submit(TransferSpec(sources=[str(data)], destination=f"{dest}/{s}-claimed"))
            forged[job_id] = f"wrong signature for submitter '{s}'"
        real = JobStore(redis_client, keys=keys, signer=Signer.from_file("a", home / "a.key"))
        ok, _ = real.submit(TransferSpec(sources=[str(data)], destination=f"{dest}/genuine"))
        viewer = JobStore(redis_client, keys=keys)
        wait_until(lambda: all((j := viewer.get(i)) is not None and j.terminal for i in [*forged, ok]), 60,
                   "every job decided")
    finally:
        agent.stop()
        th.join(20)
    assert len(forged) == 18
    for job_id, reason in forged.items():
        job = viewer.get(job_id)
        assert job.state == "failed" and reason in job.error, (job_id, job.error)
    assert viewer.get(ok).state == "succeeded", viewer.get(ok).error
    refused = [e for e in AuditLog(redis_client, keys).entries(count=100) if e.get("decision") == "refused"]
    hmac_refusals = [e["submitter"] for e in refused if "HMAC" in e.get("reason", "")]
    assert sorted(hmac_refusals) == sorted(SUBMITTERS * len(files))  # the audit names who still signs with HMAC
    assert sorted(_tree(tmp_path / "dst")) == ["genuine/run.dat"]


def test_a_policy_without_destinations_sends_nowhere(tmp_path, secret, rx, redis_url, redis_client):
    """Attack 5: no destinations for the submitter nor the agent: the job to a second receiver that shares the key
    is refused, saying why, and nothing under that receiver changes (another tenant's landed file stays whole)."""
    other = start_receiver(tmp_path / "dst2", secret)
    try:
        make_files(tmp_path / "dst2" / "a", {"x.dat": 5_000}, seed=21)  # another tenant's landed file
        before = _tree(tmp_path / "dst2")
        data = make_files(tmp_path / "data" / "a", {"x.dat": 9_000}, seed=22)
        signer = Signer.generate("tenant-b")
        policy = tmp_path / "policy.toml"
        policy.write_text(f'[agent]\nroots = ["{tmp_path / "data"}"]\n[agent.keys]\ndefault = "{secret}"\n'
                          f'[submitters.tenant-b]\npublic_key = "{signer.public.line()}"\n')
        keys = Keys("nodest5")
        store = JobStore(redis_client, keys=keys, signer=signer)
        job_id, _ = store.submit(TransferSpec(sources=[str(data)], destination=f"fstream://127.0.0.1:{other.port}/a"))
        nowhere = AgentPolicy.from_file(str(policy))
        assert "destinations none listed, so every job is refused" in nowhere.describe()  # the agent logs it at start
        Agent(redis_url, name="nodest", policy=nowhere, keys=keys, block_ms=100, max_retries=0).run(once=True)
        job = store.get(job_id)
        assert job.state == "failed", job
        assert ("no destination is allowed for submitter 'tenant-b': neither its entry nor [agent] lists "
                "destinations") in job.error, job.error
        assert _tree(tmp_path / "dst2") == before
        # the same agent with [agent] destinations naming the first receiver: that one is served, the second not
        policy.write_text(policy.read_text().replace("[agent.keys]", f'destinations = ["fstream://127.0.0.1:'
                                                                     f'{rx.port}/"]\n[agent.keys]'))
        to_other, _ = store.submit(TransferSpec(sources=[str(data)], destination=f"fstream://127.0.0.1:{other.port}/a"))
        to_rx, _ = store.submit(TransferSpec(sources=[str(data)], destination=f"fstream://127.0.0.1:{rx.port}/a"))
        agent, th = _run_agent(redis_url, AgentPolicy.from_file(str(policy)), keys, "withdest")
        try:
            wait_until(lambda: store.get(to_other).terminal and store.get(to_rx).terminal, 30, "both jobs decided")
        finally:
            agent.stop()
            th.join(20)
        assert store.get(to_rx).state == "succeeded", store.get(to_rx).error
        assert store.get(to_other).state == "failed" and "is not allowed for this agent" in store.get(to_other).error
        assert _tree(tmp_path / "dst2") == before
        assert _tree(tmp_path / "dst") == {"a/x.dat": hashlib.sha256((data / "x.dat").read_bytes()).hexdigest()}
    finally:
        other.stop()


def _decide(redis_client, policy: AgentPolicy, signer: Signer, ns: Keys, data: Path):
    store = JobStore(redis_client, keys=ns, signer=signer)
    job_id, _ = store.submit(TransferSpec(sources=[str(data)], destination="fstream://127.0.0.1:9/x"))
    spec_json, auth = redis_client.hmget(ns.job(job_id), "spec", "auth")
    return Authorizer(policy, redis_client, ns).decide(job_id, "1-0", TransferSpec.from_json(spec_json), spec_json,
                                                       auth)


def test_rotation_accepts_both_keys_in_the_window_then_only_the_new_one(tmp_path, secret, redis_client):
    data = make_files(tmp_path / "data", {"f": 10}, seed=31)
    old, new = Signer.generate("lcls-daq"), Signer.generate("lcls-daq")
    ns = Keys("rotate40")
    policy = tmp_path / "policy.toml"
    body = (f'[agent]\nroots = ["{data}"]\ndestinations = ["fstream://127.0.0.1:9/"]\n[agent.keys]\n'
            f'default = "{secret}"\n'
            f'[submitters.lcls-daq]\npublic_key = [{{}}]\n')
    policy.write_text(body.replace("{}", f'"{old.public.line()}", "{new.public.line()}"'))
    both = AgentPolicy.from_file(str(policy))
    assert _decide(redis_client, both, old, ns, data).accepted and _decide(redis_client, both, new, ns, data).accepted
    policy.write_text(body.replace("{}", f'"{new.public.line()}"'))  # the window passed: the old key removed
    only_new = AgentPolicy.from_file(str(policy))
    assert _decide(redis_client, only_new, new, ns, data).accepted
    refused = _decide(redis_client, only_new, old, ns, data)
    assert not refused.accepted
    assert (f"signed with key {old.key.key_id}, not one of submitter 'lcls-daq''s public keys on this agent "
            f"({new.key.key_id})") in refused.reason


def test_the_single_user_pair_is_made_on_first_use_and_the_root_agent_trusts_it(tmp_path, monkeypatch, secret,
                                                                                redis_client):
    monkeypatch.setenv("FSTREAM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("FSTREAM_SUBMITTER", raising=False)
    monkeypatch.delenv("FSTREAM_SUBMITTER_KEY_FILE", raising=False)
    data = make_files(tmp_path / "data", {"f": 10}, seed=32)
    signer = resolve_signer()  # what `fstream submit` signs with, no setup
    key = local_key_file()
    assert signer.submitter == "local" and key.parent == tmp_path / "state"
    assert os.stat(key).st_mode & 0o777 == 0o600
    assert parse_public(Path(f"{key}.pub").read_text()).key_id == signer.key.key_id
    policy = AgentPolicy.local([data], secret)  # `fstream agent --root DATA`: trusts that public key
    assert policy.submitters["local"].public_keys == (signer.public,) and policy.any_destination
    decision = _decide(redis_client, policy, signer, Keys("local40"), data)
    assert decision.accepted, decision.reason
    other = _decide(redis_client, policy, Signer.generate("local"), Keys("local40"), data)  # same id, another key
    assert not other.accepted and "not one of submitter 'local''s public keys" in other.reason


def test_hmac_key_files_are_refused_at_policy_load_naming_the_entry_and_the_fix(tmp_path):
    key = tmp_path / "lcls-daq.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o600)
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[agent]\nroots = ["/data"]\n[submitters.lcls-daq]\nkey_file = "{key}"\n')
    with pytest.raises(PolicyError) as exc:
        AgentPolicy.from_file(str(policy))
    msg = str(exc.value)
    assert f"submitters.lcls-daq.key_file = '{key}'" in msg and "HMAC submitter keys are no longer accepted" in msg
    assert "fstream keys new submitter lcls-daq --out DIR" in msg and "DIR/lcls-daq.key.pub" in msg, msg
    policy.write_text('[agent]\nroots = ["/data"]\n[submitters.x]\npublic_key = "fstream-ed25519 AAAA"\n'
                      '[submitters.y]\nroots = ["/data"]\n')
    with pytest.raises(PolicyError) as exc:
        AgentPolicy.from_file(str(policy))
    assert "submitters.x.public_key[0]" in str(exc.value) and "submitters.y = 'y': give its public_key_file" \
        in str(exc.value)
    with pytest.raises(ValueError, match="HMAC keys are no longer accepted"):
        Signer("lcls-daq", b"0123456789abcdef0123")  # a client still holding an HMAC key


def test_an_inline_connection_key_is_the_pem_or_its_one_line_body(tmp_path):
    pem = PrivateKey.generate("x").pem().decode()
    body = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
    assert Signer.from_pem("x", pem).key.key_id == Signer.from_pem("x", body).key.key_id
    with pytest.raises(ValueError, match="not an Ed25519 private key"):
        Signer.from_pem("x", "ab" * 32)  # an issue-32 inline HMAC secret
