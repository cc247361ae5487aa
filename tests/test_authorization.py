"""Authorization (issue 32) end to end: a real Redis, a real agent running a policy file, a real receiver.

The attack the issue reports (``fstream submit /etc/hostname /root/.bashrc --to .../loot``) is refused while a
file inside the allowed root still moves; jobs written straight into Redis, altered, replayed, naming key files,
outside a submitter's roots or destinations, or whose sources are links pointing out (also swapped in after the
job was accepted) are dead-lettered or fail with a reason that names the path and the roots; ``fstream audit``
lists what was decided.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from agentkit import make_files, transfer_swapping_after_listing, wait_until, write_secret
from fstream_provider.bus.audit import AuditLog
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.authz.ed25519 import PrivateKey, write_pair
from fstream_provider.authz.policy import PolicyError, load_policy
from fstream_provider.authz.signing import Signer
from fstream_provider.model.spec import TransferSpec
from transfer_agent.cli.main import main
from transfer_agent.daemon.authorize import AgentPolicy
from transfer_agent.daemon.worker import Agent

NS = Keys("authz")


@pytest.fixture
def site(tmp_path: Path, secret: Path, rx, redis_url: str, redis_client):
    """Allowed root ``data/`` (``data/lcls`` for submitter ``lcls``), a policy file, a running agent."""
    data = tmp_path / "data"
    make_files(data / "lcls" / "run1", {"a.dat": 40_000, "b.dat": 50_000}, seed=1)
    make_files(data / "sra", {"s.dat": 30_000}, seed=2)
    outside = tmp_path / "outside"
    make_files(outside, {"secret.txt": 1000}, seed=3)
    keys = {name: tmp_path / f"{name}.key" for name in ("lcls", "ops")}
    for name, path in keys.items():
        write_pair(path, PrivateKey.generate(name))  # the agent's policy names only the .pub
    policy = tmp_path / "policy.toml"
    policy.write_text(f"""
[agent]
roots = ["{data}"]
destinations = ["fstream://127.0.0.1:{rx.port}/"]
max_job_age = "1h"
[agent.keys]
default = "{secret}"
[submitters.lcls]
public_key_file = "{keys['lcls']}.pub"
roots = ["{data / 'lcls'}"]
destinations = ["fstream://127.0.0.1:{rx.port}/lcls"]
[submitters.ops]
public_key_file = ["{keys['ops']}.pub"]
""")
    agent = Agent(redis_url, name="authz-agent", policy=AgentPolicy.from_file(str(policy)), keys=NS, block_ms=100,
                  poll_interval=0.1, flush_interval=0.05, max_retries=0)
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    stores = {n: JobStore(redis_client, keys=NS, signer=Signer.from_file(n, str(k))) for n, k in keys.items()}
    site = dict(data=data, outside=outside, keys=keys, policy=policy, rx=rx, dst=tmp_path / "dst", stores=stores,
                client=redis_client, url=redis_url, agent=agent, dest=f"fstream://127.0.0.1:{rx.port}", thread=th)
    try:
        yield site
    finally:
        agent.stop()
        th.join(20)


def _stop_agent(site) -> None:
    """Stop the site's agent and wait for its thread: it reads no entry after this returns."""
    site["agent"].stop()
    site["thread"].join(20)
    assert not site["thread"].is_alive()


def _wait(site, job_id: str):
    store = site["stores"]["ops"]
    wait_until(lambda: (store.get(job_id) or None) is not None and store.get(job_id).terminal, 30,
               f"job {job_id} to end")
    return store.get(job_id)


def _dead_letter(site, job_id: str) -> dict:
    for _eid, fields in site["client"].xrevrange(NS.dead_letter()):
        if fields.get("job_id") == job_id:
            return fields
    raise AssertionError(f"job {job_id} is not in the dead letters")


def _landed(site) -> list[str]:
    root = site["dst"]
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_the_reported_attack_is_refused_and_a_file_inside_the_root_still_moves(site, tmp_path, capsys):
    """The issue's attack through the real CLI: sources outside the agent's roots, refused before a byte is read."""
    ns = ("--redis", site["url"], "--namespace", NS.namespace, "--submitter", "ops",
          "--submitter-key", str(site["keys"]["ops"]), "--tuner", "fixed")
    code = main(["submit", str(site["outside"] / "secret.txt"), "/etc/hostname", "--to", f"{site['dest']}/loot",
                 "--json", *ns])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "outside this agent's source roots" in err and str(site["data"]) in err, err
    assert not (site["dst"] / "loot").exists()
    code = main(["submit", str(site["data"] / "sra"), "--to", f"{site['dest']}/sra", "--json", *ns])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["result"]["verified_files"] == 1
    assert _landed(site) == ["sra/s.dat"]
    audit = AuditLog(site["client"], NS).entries(count=10)
    decisions = [(e["decision"], e["submitter"]) for e in audit if e["kind"] == "decision"]
    assert decisions == [("accepted", "ops"), ("refused", "ops")]  # newest first
    # the outcome's audit record follows the job's terminal state (runner: recorded, then audited): wait for it
    outcomes = wait_until(lambda: [e["outcome"] for e in AuditLog(site["client"], NS).entries(count=10)
                                   if e["kind"] == "outcome"], what="the outcome's audit record")
    assert outcomes == ["succeeded"]
    code = main(["audit", "--redis", site["url"], "--namespace", NS.namespace, "--decision", "refused"])
    listed = capsys.readouterr().out
    assert code == 0 and "refused" in listed and "secret.txt" in listed and "loot" in listed, listed


def test_a_job_written_straight_into_redis_without_a_tag_is_dead_lettered(site):
    client, job_id = site["client"], "forged0001"
    spec = TransferSpec(sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/forged")
    client.hset(NS.job(job_id), mapping={"job_id": job_id, "state": "queued", "attempt": 0, "deliveries": 0,
                                         "spec": spec.to_json(), "created_at": 0, "updated_at": 0})
    client.xadd(NS.jobs_stream(), {"job_id": job_id})
    job = _wait(site, job_id)
    assert job.state == "failed" and "unsigned" in job.error
    assert "unsigned" in _dead_letter(site, job_id)["reason"]
    assert _landed(site) == []


def test_a_signed_job_altered_in_redis_is_refused(site):
    store = site["stores"]["ops"]
    agent_store = JobStore(site["client"], keys=NS)
    _stop_agent(site)  # hold the job while it is altered
    job_id, _ = store.submit(TransferSpec(sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/x"))
    spec = json.loads(site["client"].hget(NS.job(job_id), "spec"))
    spec["sources"] = [str(site["outside"])]
    site["client"].hset(NS.job(job_id), "spec", json.dumps(spec, sort_keys=True))
    again = Agent(site["url"], name="authz-2", policy=AgentPolicy.from_file(str(site["policy"])), keys=NS,
                  block_ms=100)
    again.run(once=True)
    job = agent_store.get(job_id)
    assert job.state == "failed" and "wrong signature for submitter 'ops'" in job.error
    assert _landed(site) == []


def test_a_replayed_job_is_refused(site):
    """A finished job re-created under its id with a new stream entry: the nonce names the first use."""
    store, client = site["stores"]["ops"], site["client"]
    job_id, _ = store.submit(TransferSpec(sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/once"))
    assert _wait(site, job_id).state == "succeeded"
    for p in (site["dst"] / "once").iterdir():
        p.unlink()
    saved = client.hgetall(NS.job(job_id))
    client.delete(NS.job(job_id))
    # the copy names its own new entry as the one it was submitted under (issue 40: an entry that is not the job's
    # own is ignored before the replay guard is even asked, tests/test_tenant_isolation.py)
    entry = f"{int(time.time() * 1000) + 1000}-0"
    client.hset(NS.job(job_id), mapping={**saved, "state": "queued", "attempt": 0, "deliveries": 0, "error": "",
                                         "result": "", "stream_id": entry})
    client.persist(NS.job(job_id))
    client.xadd(NS.jobs_stream(), {"job_id": job_id}, id=entry)
    wait_until(lambda: client.hget(NS.job(job_id), "state") == "failed", 30, "the replay to be refused")
    assert "replayed" in client.hget(NS.job(job_id), "error")
    assert list((site["dst"] / "once").iterdir()) == []


def test_submitter_roots_destinations_and_key_files_bound_the_job(site):
    lcls = site["stores"]["lcls"]
    ops = site["stores"]["ops"]
    cases = {
        "outside submitter lcls's source roots": lcls.submit(TransferSpec(
            sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/lcls/x"))[0],
        "/elsewhere is not allowed for submitter 'lcls'": lcls.submit(TransferSpec(
            sources=[str(site["data"] / "lcls")], destination=f"{site['dest']}/elsewhere"))[0],
        "names a key file on the agent's host (secret_file='/root/.ssh/id_rsa')": ops.submit(TransferSpec(
            sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/k", secret_file="/root/.ssh/id_rsa"))[0],
        "submitter 'ops' may not use key 'other'": ops.submit(TransferSpec(
            sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/k", key="other"))[0],
    }
    for expected, job_id in cases.items():
        job = _wait(site, job_id)
        assert job.state == "failed" and expected in job.error, (expected, job.error)
        assert expected in _dead_letter(site, job_id)["reason"]
    ok, _ = lcls.submit(TransferSpec(sources=[str(site["data"] / "lcls" / "run1")], destination=f"{site['dest']}/lcls/r1"))
    assert _wait(site, ok).state == "succeeded"
    assert _landed(site) == ["lcls/r1/a.dat", "lcls/r1/b.dat"]


def test_links_inside_the_root_that_point_outside_are_refused(site):
    data, ops = site["data"], site["stores"]["ops"]
    (data / "escape").symlink_to(site["outside"])
    job_id, _ = ops.submit(TransferSpec(sources=[str(data / "escape")], destination=f"{site['dest']}/l1"))
    job = _wait(site, job_id)
    assert job.state == "failed" and "resolves to" in job.error and str(site["outside"]) in job.error
    # a link to a file outside, inside a directory source: that file fails, the others move
    (data / "sra" / "leak.txt").symlink_to(site["outside"] / "secret.txt")
    job_id, _ = ops.submit(TransferSpec(sources=[str(data / "sra")], destination=f"{site['dest']}/l2"))
    job = _wait(site, job_id)
    assert job.state == "failed" and "leak.txt" in job.error and "outside" in job.error
    assert _landed(site) == ["l2/s.dat"]


def test_a_link_swapped_in_after_the_job_was_accepted_is_refused_at_open(site, redis_url, tmp_path):
    """The file is a regular file when the job is accepted and listed; a link to a secret replaces it before it
    is opened: the open beneath the root refuses it (it follows no link)."""
    _stop_agent(site)
    victim = site["data"] / "sra" / "s.dat"

    def swap() -> None:
        if victim.is_file() and not victim.is_symlink():
            victim.unlink()
            victim.symlink_to(site["outside"] / "secret.txt")

    job_id, _ = site["stores"]["ops"].submit(TransferSpec(sources=[str(site["data"] / "sra")],
                                                         destination=f"{site['dest']}/swap", tuner="fixed"))
    agent = Agent(redis_url, name="authz-3", policy=AgentPolicy.from_file(str(site["policy"])), keys=NS,
                  block_ms=100, max_retries=0, transfer_factory=transfer_swapping_after_listing(swap))
    agent.run(once=True)
    job = JobStore(site["client"], keys=NS).get(job_id)
    assert victim.is_symlink()
    assert job.state == "failed" and "s.dat" in job.error and "symbolic link" in job.error, job.error
    assert _landed(site) == []


def test_policy_file_errors_name_the_file_the_key_the_value_and_the_reason(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('[agent]\nroots = ["relative/dir"]\nmax_job_age = "soon"\n[agent.keys]\nx = {}\n'
                   '[submitters.s]\nkey_file = "/k"\nkeys = ["nope"]\nroot = []\n')
    with pytest.raises(PolicyError) as exc:
        load_policy(bad)
    msg = str(exc.value)
    assert str(bad) in msg and "submitters.s.root" in msg and "unknown key" in msg, msg
    bad.write_text('[agent]\nroots = ["relative/dir"]\nmax_job_age = "soon"\n[agent.keys]\nx = {}\n'
                   '[submitters.s]\nkey_file = "/k"\nkeys = ["nope"]\n')
    with pytest.raises(PolicyError) as exc:
        load_policy(bad)
    msg = str(exc.value)
    for part in ("agent.roots[0] = 'relative/dir'", "absolute", "agent.max_job_age = 'soon'", "agent.keys.x",
                 "submitters.s.keys = 'nope'", "not a key of [agent.keys]", "submitters.s.key_file = '/k'",
                 "HMAC submitter keys are no longer accepted", "fstream keys new submitter s --out DIR"):
        assert part in msg, (part, msg)


def test_an_agent_without_roots_refuses_to_start_and_one_without_a_policy_serves_nothing(redis_url, redis_client,
                                                                                         capsys, tmp_path):
    assert main(["agent", "--redis", redis_url, "--namespace", "authz0", "--once"]) == 2
    assert "no source roots" in capsys.readouterr().err
    src = make_files(tmp_path / "src", {"f": 10}, seed=4)
    store = JobStore(redis_client, keys=Keys("authz0"), signer=Signer.generate("anyone"))
    job_id, _ = store.submit(TransferSpec(sources=[str(src)], destination="fstream://127.0.0.1:9/x"))
    Agent(redis_url, name="deny", keys=Keys("authz0"), block_ms=100).run(once=True)
    job = store.get(job_id)
    assert job.state == "failed" and "submitter 'anyone' is not configured on this agent" in job.error


def test_a_watched_stream_refuses_a_link_that_appears_later_and_keeps_moving(site):
    """``--watch``: files found by later scans are checked like the first listing (and at open)."""
    data, ops = site["data"], site["stores"]["ops"]
    live = data / "live"
    make_files(live, {"first.dat": 20_000}, seed=5)
    job_id, _ = ops.submit(TransferSpec(sources=[str(live)], destination=f"{site['dest']}/w", watch=True,
                                        interval_s=0.2, idle_exit_s=2.0, tuner="fixed"))
    wait_until(lambda: (site["dst"] / "w" / "first.dat").exists(), 30, "the first file to land")
    (live / "leak.txt").symlink_to(site["outside"] / "secret.txt")
    make_files(live, {"second.dat": 20_000}, seed=6)
    job = _wait(site, job_id)
    assert job.state == "failed" and "leak.txt" in job.error and "outside" in job.error, job.error
    assert _landed(site) == ["w/first.dat", "w/second.dat"]


def test_a_glob_match_or_dotdot_through_a_link_cannot_list_another_tree(site):
    """The listing is by text, the check by resolution: a directory link among a glob's matches is refused
    with its files (none of them opened), a '..' component in a source is refused outright."""
    data, ops = site["data"], site["stores"]["ops"]
    make_files(data / "g" / "ok", {"ok.dat": 10_000}, seed=7)
    (data / "g" / "x").symlink_to(site["outside"])
    job_id, _ = ops.submit(TransferSpec(sources=[str(data / "g" / "*")], destination=f"{site['dest']}/g"))
    job = _wait(site, job_id)
    assert job.state == "failed" and "secret.txt" in job.error and "outside this agent's source roots" in job.error
    assert _landed(site) == ["g/ok/ok.dat"]
    (data / "deep" / "a" / "b").mkdir(parents=True)
    (data / "l").symlink_to(data / "deep" / "a" / "b")
    sneaky = f"{data}/l/../../../../outside"  # resolves inside (links first), lists /…/outside by text
    job_id, _ = ops.submit(TransferSpec(sources=[sneaky], destination=f"{site['dest']}/s"))
    job = _wait(site, job_id)
    assert job.state == "failed" and "a '..' component is not accepted" in job.error, job.error


def test_a_malformed_signature_is_refused_and_the_agent_goes_on(site):
    """A job naming a configured submitter with a nonce and tag no signer makes: refused, not an exception that
    leaves the entry pending (review of issue 32), and the next job still runs."""
    client, job_id = site["client"], "badauth001"
    spec = TransferSpec(sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/bad")
    client.hset(NS.job(job_id), mapping={"job_id": job_id, "state": "queued", "attempt": 0, "deliveries": 0,
                                         "spec": spec.to_json(), "created_at": 0, "updated_at": 0,
                                         "auth": json.dumps({"v": "fstream-job-v2", "submitter": "ops", "ts": 1e9,
                                                             "nonce": "\ud800", "key_id": "0" * 16,
                                                             "sig": "é" * 128})})
    client.xadd(NS.jobs_stream(), {"job_id": job_id})
    job = _wait(site, job_id)
    assert job.state == "failed" and "malformed submitter signature" in job.error
    ok, _ = site["stores"]["ops"].submit(TransferSpec(sources=[str(site["data"] / "sra")],
                                                      destination=f"{site['dest']}/after"))
    assert _wait(site, ok).state == "succeeded"


def test_a_redelivery_older_than_the_max_age_passes_and_a_copy_does_not(redis_client, tmp_path):
    """The age bounds when a job is first taken; a retry, reclaim or resumed preemption of the same entry later
    passes, a re-enqueue by `fstream reconcile` keeps it the same job, a copy under another entry is a replay."""
    from fstream_provider.bus.reconcile import _rebind_nonce
    from transfer_agent.daemon.authorize import Authorizer

    key = write_secret(tmp_path / "k")
    data = make_files(tmp_path / "data", {"f": 10}, seed=8)
    signer = Signer.generate("s")
    policy = AgentPolicy.local([data], key, submitter="s", public_key=signer.public)
    store = JobStore(redis_client, keys=NS, signer=signer)
    job_id, _ = store.submit(TransferSpec(sources=[str(data)], destination="fstream://h:1/x"))
    spec_json, auth = redis_client.hmget(NS.job(job_id), "spec", "auth")
    spec = TransferSpec.from_json(spec_json)
    now = [json.loads(auth)["ts"]]
    authz = Authorizer(policy, redis_client, NS, clock=lambda: now[0])
    assert authz.decide(job_id, "1-0", spec, spec_json, auth).accepted
    now[0] += 30 * 86400  # a month later: the same entry again (a preempted job resumed)
    assert authz.decide(job_id, "1-0", spec, spec_json, auth).accepted
    copy = authz.decide(job_id, "2-0", spec, spec_json, auth)
    assert not copy.accepted and f"replayed: its nonce was already used by job {job_id}" in copy.reason
    _rebind_nonce(redis_client, NS, job_id, "3-0")  # reconcile re-enqueued it as entry 3-0
    assert authz.decide(job_id, "3-0", spec, spec_json, auth).accepted
    assert not authz.decide(job_id, "1-0", spec, spec_json, auth).accepted


def test_a_scheduling_agent_refuses_forged_jobs_before_its_board_and_goes_on(site, redis_url):
    """SEAL/STEAL intake: a job with a malformed signature and one with a spec that does not parse are dead-lettered
    at admission (never on the board, whose size estimate would list their sources), and a signed job behind
    them still runs (review of issue 32: an exception here left the agent re-reading them for ever)."""
    import socket

    _stop_agent(site)
    client, dst = site["client"], f"127.0.0.1:{site['rx'].port}"
    client.hset(NS.sched_config(), mapping={f"cap:{dst}": 1e9, f"unit:{dst}": 1e9,
                                            f"cap:{socket.gethostname()}": 1e9, f"unit:{socket.gethostname()}": 1e9})
    spec = TransferSpec(sources=[str(site["data"] / "sra")], destination=f"{site['dest']}/forged")
    bad_auth = json.dumps({"v": "fstream-job-v2", "submitter": "ops", "ts": 1e9, "nonce": "zz", "key_id": "x",
                           "sig": "é" * 128})
    forged = {"badsig00001": (spec.to_json(), bad_auth),
              "badspec0001": ('{"sources": 5}', "")}
    for job_id, (spec_json, auth) in forged.items():
        client.hset(NS.job(job_id), mapping={"job_id": job_id, "state": "queued", "attempt": 0, "deliveries": 0,
                                             "spec": spec_json, "auth": auth, "created_at": 0, "updated_at": 0})
        client.xadd(NS.jobs_stream(), {"job_id": job_id})
    ok, _ = site["stores"]["ops"].submit(TransferSpec(sources=[str(site["data"] / "sra")],
                                                      destination=f"{site['dest']}/sched"))
    agent = Agent(redis_url, name="authz-sched", policy=AgentPolicy.from_file(str(site["policy"])), keys=NS,
                  scheduler="seal", sched_interval=0.1, block_ms=100, poll_interval=0.1, flush_interval=0.05)
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    try:
        wait_until(lambda: client.hget(NS.job(ok), "state") == "succeeded", 30, "the signed job to run")
    finally:
        agent.stop()
        th.join(20)
    for job_id, why in (("badsig00001", "malformed submitter signature"), ("badspec0001", "unsigned")):
        assert client.hget(NS.job(job_id), "state") == "failed" and why in client.hget(NS.job(job_id), "error")
        assert why in _dead_letter(site, job_id)["reason"]
    assert client.hkeys(NS.sched_tasks()) == []
    assert _landed(site) == ["sched/s.dat"]


def test_a_fifo_swapped_in_after_the_listing_is_refused_without_blocking(site, redis_url):
    """An agent's open of a source is non-blocking: a FIFO with no writer put in a file's place after the
    listing is opened at once and refused (not a regular file) instead of hanging the channel."""
    _stop_agent(site)
    victim = site["data"] / "sra" / "s.dat"

    def swap() -> None:
        if not victim.is_fifo():
            victim.unlink()
            os.mkfifo(victim)

    job_id, _ = site["stores"]["ops"].submit(TransferSpec(sources=[str(site["data"] / "sra")],
                                                         destination=f"{site['dest']}/fifo", tuner="fixed"))
    done = threading.Event()
    agent = Agent(redis_url, name="authz-4", policy=AgentPolicy.from_file(str(site["policy"])), keys=NS,
                  block_ms=100, max_retries=0, transfer_factory=transfer_swapping_after_listing(swap))
    th = threading.Thread(target=lambda: (agent.run(once=True), done.set()), daemon=True)
    th.start()
    assert done.wait(30), "the agent blocked on the FIFO"
    job = JobStore(site["client"], keys=NS).get(job_id)
    assert job.state == "failed" and "s.dat" in job.error and "not a regular file" in job.error, job.error
