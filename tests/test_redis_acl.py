"""Redis least privilege (issue 32): the submitter, agent and viewer ACL users against a real ``redis-server``
(7.0+) loaded with the generated ACL file, and the bus over TLS (``rediss://`` with ``ssl_ca_certs``)."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from fstream_provider.bus.acl import ROLES, acl_rules, acl_setuser_line, password_hash
from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import find_redis_server, free_port
import serverkit
from fstream_provider.bus.jobs import JobStore
from fstream_provider.bus.keys import Keys
from fstream_provider.authz.signing import Signer
from fstream_provider.model.spec import TransferSpec

NS = "tenant1"
K = Keys(NS)
PASSWORDS = {"admin": "admin-pw-0123456789", "submitter": "sub-pw-0123456789", "agent": "agent-pw-0123456789",
             "viewer": "view-pw-0123456789", "globby": "glob-pw-0123456789"}
NOPERM = redis.exceptions.NoPermissionError
# the submitter user "submitter" is for submitter id "sub-a" (issue 40: one Redis user per submitter)
SUB_A = Signer.generate("sub-a")


def _spec() -> TransferSpec:
    return TransferSpec(sources=["/tmp/x"], destination="fstream://h:1/p")


def _before_7() -> bool:
    """The servers these tests start are older than 7.0 (the floor's Redis 6.2: ACL rules without 7.0's parts)."""
    return int(serverkit.version_of(find_redis_server()).split(".")[0]) < 7


def _acl_file(path: Path, binary: str) -> Path:
    v = serverkit.version_of(binary)  # the lines `fstream redis-acl --server-version` prints for this server
    lines = [
        "user default off",  # nobody gets in without a user
        f"user admin on >{PASSWORDS['admin']} ~* &* +@all",
        acl_setuser_line("submitter", "submitter", PASSWORDS["submitter"], namespace=NS, server_version=v,
                         submitter="sub-a"),
        acl_setuser_line("agent", "agent", PASSWORDS["agent"], namespace=NS, server_version=v),
        # the hashed form, as `fstream redis-acl --password-file` prints it
        acl_setuser_line("viewer", "viewer", namespace=NS, password_hash=password_hash(PASSWORDS["viewer"]),
                         server_version=v),
        acl_setuser_line("submitter", "globby", PASSWORDS["globby"], namespace="x*", server_version=v, submitter="g"),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Server:
    """A ``redis-server`` this test started (and stops, by its own handle)."""

    port: int
    directory: Path
    scheme: str = "redis"
    query: str = ""
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def url(self, user: str) -> str:
        return f"{self.scheme}://{user}:{PASSWORDS[user]}@127.0.0.1:{self.port}/0{self.query}"

    def client(self, user: str) -> redis.Redis:
        return connect(self.url(user), retries=0)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / "redis.log").read_text(errors="replace")[-2000:]
        return ""


def _start(directory: Path, extra: list[str], scheme: str = "redis", query: str = "") -> Server:
    """Start redis-server with ``extra`` config lines on a free port; retries on a port taken meanwhile."""
    last = ""
    for _ in range(3):
        port = free_port()
        server = Server(port, directory, scheme, query)
        conf = directory / "redis.conf"
        listen = ["port 0", f"tls-port {port}"] if scheme == "rediss" else [f"port {port}"]
        binary = serverkit.tls_binary() if scheme == "rediss" else find_redis_server()
        conf.write_text("\n".join(["bind 127.0.0.1", *listen, f"dir {directory}", f"logfile {directory}/redis.log",
                                   'save ""', "appendonly no",
                                   f"aclfile {_acl_file(directory / 'users.acl', binary)}", *extra]) + "\n")
        server.proc = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if _ready(server):
                return server
        except BaseException:
            _stop(server)
            raise
        last = server.log()
        _stop(server)
    raise RuntimeError(f"redis-server did not start; log:\n{last}")


def _ready(server: Server, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.proc.poll() is None:
        c = server.client("admin")
        try:
            if c.ping():
                return True
        except redis.AuthenticationError:
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            time.sleep(0.02)  # waiting for a child process to listen: polled with a deadline
        finally:
            c.close()
    return False


def _stop(server: Server) -> None:
    proc = server.proc
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    server.proc = None


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[Server]:
    server = _start(tmp_path, [])
    try:
        yield server
    finally:
        _stop(server)


@pytest.fixture
def clients(acl_server: Server) -> Iterator[dict[str, redis.Redis]]:
    out = {name: acl_server.client(name) for name in ("admin", "submitter", "agent", "viewer", "globby")}
    try:
        yield out
    finally:
        for c in out.values():
            c.close()


def _denied(call, *args, **kwargs) -> str:
    with pytest.raises(NOPERM, match="(?i)no permissions") as err:  # redis-py's class for a NOPERM reply (Valkey: "No permissions to access a key")
        call(*args, **kwargs)
    return str(err.value)


def _claim_one(agent: redis.Redis) -> tuple[JobStore, str, str, int]:
    """What the agent's intake does: read one entry with the consumer group, claim it."""
    store = JobStore(agent, keys=K)
    store.ensure_group()
    resp = agent.xreadgroup(K.jobs_group(), "a1", {K.jobs_stream(): ">"}, count=1, block=1000)
    (_stream, [(entry_id, fields)]), = resp
    claim = store.claim(fields["job_id"], entry_id, worker="a1", max_deliveries=5)
    assert claim.outcome == "claimed", claim
    return store, fields["job_id"], entry_id, claim.attempt


# --------------------------------------------------------------------------------------------- the rules
def test_rules_are_scoped_to_the_namespace_and_name_no_dangerous_command():
    for role in ROLES:
        rules = acl_rules(role, submitter="s" if role == "submitter" else None)
        assert rules[:5] == ["on", "resetkeys", "resetchannels", "clearselectors", "-@all"]
        patterns = [r for r in rules if "~" in r or r.startswith("&")]
        # the namespace slot {fstream}:..., or a family with its own slot {fstream:<family>...} (issue 28)
        assert patterns and all("{fstream}:" in r or "{fstream:" in r for r in patterns), patterns
        assert "+@all" not in rules and "+@dangerous" not in rules and "allkeys" not in rules
    assert "%R~{fstream}:*" in acl_rules("viewer") and "+@write" not in acl_rules("viewer")
    submitter = acl_rules("submitter", submitter="s")
    assert not {"+xreadgroup", "+xack", "+xclaim", "+xautoclaim", "+del"} & set(submitter)
    assert not any("audit" in r or "nonce" in r or "pool" in r or "sched" in r for r in submitter)
    assert acl_rules("viewer", "a*b?[c]")[5] == r"%R~{a\*b\?\[c\]}:*"  # the namespace cannot widen a pattern


def test_bad_role_names_and_lines():
    with pytest.raises(ValueError, match=r"'admin'.*submitter, agent, viewer"):
        acl_rules("admin")
    with pytest.raises(ValueError, match="'root'"):
        acl_setuser_line("root", "u", "pw")
    for bad in ("", "a b", "{x}"):
        with pytest.raises(ValueError):
            acl_rules("agent", bad)
    with pytest.raises(ValueError):
        acl_setuser_line("agent", "two words", "pw")
    with pytest.raises(ValueError):
        acl_setuser_line("agent", "u", "pass word")
    line = acl_setuser_line("agent", "fs-agent", "s3cret", password_hash="ab" * 32)
    assert line.startswith("user fs-agent on #" + "ab" * 32 + " resetkeys ") and "s3cret" not in line
    assert acl_setuser_line("viewer", "v", "pw").startswith("user v on >pw resetkeys")
    assert ">" not in acl_setuser_line("viewer", "v") and "nopass" not in acl_setuser_line("viewer", "v")


def test_cli_prints_the_hashed_line_and_refuses_an_open_password_file(tmp_path, capsys):
    from transfer_agent.cli.main import main

    pw = tmp_path / "pw"
    pw.write_text("hunter2-hunter2\n")
    pw.chmod(0o600)
    assert main(["redis-acl", "--role", "submitter", "--submitter", "lcls", "--user", "airflow", "--namespace", NS,
                 "--password-file", str(pw)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == acl_setuser_line("submitter", "airflow", namespace=NS, password_hash=password_hash("hunter2-hunter2"),
                                   submitter="lcls")
    assert main(["redis-acl", "--role", "submitter", "--user", "airflow"]) == 2  # whose? refused, not guessed
    assert "give the submitter id" in capsys.readouterr().err
    assert "hunter2" not in out
    pw.chmod(0o644)
    assert main(["redis-acl", "--role", "agent", "--user", "a", "--password-file", str(pw)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["redis-acl", "--role", "admin", "--user", "a"])
    assert "invalid choice: 'admin'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- the roles
def test_submitter_submits_follows_and_cancels_but_takes_nothing(clients):
    sub, admin = clients["submitter"], clients["admin"]
    store = JobStore(sub, keys=K, signer=SUB_A)
    job_id, created = store.submit(_spec(), idempotency_key="dag/run/task/-1")
    assert created and store.get(job_id).state == "queued"
    assert store.submit(_spec(), idempotency_key="dag/run/task/-1") == (job_id, False)
    [(_id, event)] = store.events(job_id)
    assert event["kind"] == "queued"
    assert [j.job_id for j in store.list()] == [job_id]
    assert store.dead_letters() == [] and store.dead_letter_count() is None  # they name every tenant's jobs
    assert store.cancel(job_id) and store.get(job_id).state == "cancelled"
    assert store.events(job_id)[-1][1]["kind"] == "done"
    assert store.wait(job_id, timeout=5).state == "cancelled"
    assert sub.smembers(K.agents()) == set() and sub.hgetall(K.agent("a1")) == {}  # the hook's check, status

    stream, group = K.jobs_stream(), K.jobs_group()
    assert "xreadgroup" in _denied(sub.xreadgroup, group, "thief", {stream: ">"}, count=1)
    entry = admin.xrange(stream)[0][0]
    _denied(sub.xack, stream, group, entry)
    _denied(sub.xclaim, stream, group, "thief", 0, [entry])
    _denied(sub.xautoclaim, stream, group, "thief", 0)
    _denied(sub.xpending_range, stream, group, min="-", max="+", count=10)
    _denied(sub.xadd, K.audit(), {"kind": "decision", "job_id": job_id})
    _denied(sub.set, K.nonce("x", "y"), 1)
    _denied(sub.set, f"{{{NS}}}:nonce:x:y", 1)
    _denied(sub.hset, K.pool("a", "b"), "policy", "greedy")
    _denied(sub.hset, K.sched_tasks(), job_id, "{}")
    _denied(sub.xadd, K.history(), {"row": "{}"})
    _denied(sub.delete, K.job(job_id))
    _denied(sub.hgetall, "{other}:job:1")
    _denied(sub.hset, "{other}:job:1", "state", "queued")
    for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"), ("ACL", "LIST"),
                    ("INFO",), ("SAVE",), ("CLIENT", "KILL", "ID", "999999"), ("SCRIPT", "FLUSH")):
        _denied(sub.execute_command, *command)
    # Lua runs with the caller's rights: neither the declared keys nor the commands a script calls get around them
    _denied(sub.eval, "return redis.call('XADD', KEYS[1], '*', 'k', 'v')", 1, K.audit())
    with pytest.raises(redis.ResponseError, match="(?i)no permissions|can't run this command"):
        sub.eval("return redis.call('XREADGROUP', 'GROUP', ARGV[1], 'x', 'COUNT', 1, 'STREAMS', KEYS[1], '>')",
                 1, stream, group)
    # ... and a script's declared keys need read *and* write: the heartbeats it may read directly are refused
    _denied(sub.xlen, K.dead_letter())
    assert sub.smembers(K.agents()) == set()
    if _before_7():  # Redis 6.2 has no read-only key patterns: the documented weaker separation (bus/acl.py)
        assert sub.eval("return redis.call('SMEMBERS', KEYS[1])", 1, K.agents()) == []
    else:
        _denied(sub.eval, "return redis.call('SMEMBERS', KEYS[1])", 1, K.agents())
    assert admin.xlen(K.audit()) == 0 and admin.exists(K.nonce("x", "y")) == 0


def test_submitter_keeps_the_new_files_watcher_state(acl_server, clients):
    """The Airflow side also runs the new-files sensor and trigger: seen sets, pending batches, looks."""
    import asyncio

    from fstream_provider.bus.client import connect_async
    from fstream_provider.watch.pending import PendingBatches
    from fstream_provider.watch.stability import FileStat

    async def trigger_side() -> None:
        client = connect_async(acl_server.url("submitter"), retries=0)
        try:
            scope = Keys.owned("sub-a", "scope")  # the hook's FStreamSettings.scope_key
            batches = PendingBatches(client, K.seen(scope), K.pending(scope))
            files = [FileStat("/data/a.h5", 10, 1.0), FileStat("/data/b.h5", 20, 2.0)]
            assert await batches.aclaim(files) == files and await batches.aunseen(files) == []
            [(batch_id, _claimed_at, pending)] = await batches.pending()
            assert batch_id == batches.last_batch_id and pending == files
            await batches.release(batch_id)
            assert (await batches.take_redeliverable(0.0))[0] == batch_id
            await batches.ack(batch_id)
            assert await batches.pending() == []
        finally:
            await client.aclose()

    asyncio.run(trigger_side())
    sub = clients["submitter"]
    scope = Keys.owned("sub-a", "scope")
    assert sub.set(K.looks(scope), "{}", ex=3600) and sub.get(K.looks(scope)) == "{}"
    _denied(sub.set, "{other}:looks:scope", "{}")
    _denied(sub.set, K.looks("scope"), "{}")  # a scope of no submitter's (agents' only)
    _denied(sub.sadd, K.seen(Keys.owned("sub-b", "scope")), "/data/x")  # another submitter's


def test_agent_claims_finishes_audits_but_administers_nothing(clients):
    sub, agent, admin = clients["submitter"], clients["agent"], clients["admin"]
    job_id, _ = JobStore(sub, keys=K, signer=SUB_A).submit(_spec())
    store, claimed_id, entry_id, attempt = _claim_one(agent)
    assert claimed_id == job_id and store.get(job_id).state == "running"
    assert store.touch(job_id, attempt, entry_id, "a1") == (True, False)  # XCLAIM JUSTID inside the fence
    log = [("log", time.time(), {"message": "hi"})]
    assert store.publish(job_id, attempt, log, {"progress": "{}"}) == (True, False)
    # a cancel while running is requested (CANCEL + PUBLISH on the job's channel), as the submitter
    assert JobStore(sub, keys=K, signer=SUB_A).cancel(job_id)
    assert store.publish(job_id, attempt, []) == (True, True)
    assert store.finish(job_id, attempt, entry_id, state="cancelled", error="cancelled by user")
    assert store.get(job_id).state == "cancelled"
    assert admin.xpending(K.jobs_stream(), K.jobs_group())["pending"] == 0

    assert agent.xadd(K.audit(), {"kind": "decision", "job_id": job_id, "decision": "accepted"})
    assert agent.set(K.nonce("airflow", "00ff"), f"{job_id} {entry_id}", nx=True, ex=3600)
    assert agent.xinfo_groups(K.jobs_stream())[0]["name"] == K.jobs_group()
    assert agent.xautoclaim(K.jobs_stream(), K.jobs_group(), "a2", 0)[1] == []
    assert agent.hset(K.pool("a", "b"), "policy", "greedy") == 1 and agent.time()
    with agent.pipeline(transaction=True) as pipe:  # the scheduler's WATCH/MULTI
        pipe.watch(K.sched_tasks())
        pipe.multi()
        pipe.hset(K.sched_tasks(), job_id, "{}")
        pipe.execute()
    assert K.sched_tasks() in set(agent.scan_iter(match="{" + NS + "}:*"))
    assert store.trim_acked() >= 0
    assert agent.delete(K.sched_tasks()) == 1

    for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"), ("ACL", "LIST"),
                    ("INFO",), ("SAVE",), ("CLIENT", "KILL", "ID", "999999"), ("SCRIPT", "FLUSH"), ("CLIENT", "LIST"),
                    ("FUNCTION", "FLUSH"), ("SWAPDB", "0", "1")):
        if command[0] == "FUNCTION" and _before_7():  # no Functions before 7.0: nothing to deny
            with pytest.raises(redis.ResponseError, match="unknown command"):
                agent.execute_command(*command)
            continue
        _denied(agent.execute_command, *command)
    _denied(agent.set, "{other}:job:1", "x")
    _denied(agent.publish, "{other}:job:1:cancel", "cancel")
    assert admin.exists("{other}:job:1") == 0


def test_viewer_reads_everything_and_writes_nothing(clients):
    sub, viewer, admin = clients["submitter"], clients["viewer"], clients["admin"]
    job_id, _ = JobStore(sub, keys=K, signer=SUB_A).submit(_spec())
    clients["agent"].sadd(K.job_owners(), "sub-a")  # what an agent serving sub-a writes with each heartbeat
    view = JobStore(viewer, keys=K)
    assert view.get(job_id).state == "queued" and [j.job_id for j in view.list()] == [job_id]
    assert view.events(job_id)[0][1]["kind"] == "queued"
    assert view.dead_letters() == [] and viewer.time()
    assert viewer.xinfo_groups(K.jobs_stream())[0]["name"] == K.jobs_group()
    ps = viewer.pubsub()
    try:
        ps.subscribe(K.cancel_channel(job_id))
        assert ps.get_message(timeout=2)["type"] == "subscribe"
        ps.psubscribe("{" + NS + "}:*")  # a pattern is compared literally with the allowed one
        assert ps.get_message(timeout=2)["type"] == "psubscribe"
        _denied(lambda: (ps.psubscribe("{" + NS + "}:job:*:cancel"), ps.get_message(timeout=2)))
    finally:
        ps.close()

    _denied(view.submit, _spec())
    _denied(view.cancel, job_id)
    assert admin.hget(K.job(job_id), "state") == "queued"
    _denied(viewer.hset, K.job(job_id), "state", "failed")
    _denied(viewer.xadd, K.job_events(job_id), {"kind": "log"})
    _denied(viewer.xadd, K.audit(), {"kind": "decision"})
    _denied(viewer.delete, K.job(job_id))
    _denied(viewer.set, K.looks("s"), "{}")
    _denied(viewer.publish, K.cancel_channel(job_id), "cancel")
    _denied(viewer.xreadgroup, K.jobs_group(), "v", {K.jobs_stream(): ">"})
    _denied(viewer.eval, "return 1", 0)
    if _before_7():  # no EVAL_RO before 7.0
        with pytest.raises(redis.ResponseError, match="unknown command"):
            viewer.execute_command("EVAL_RO", "return 1", "0")
    else:
        _denied(viewer.execute_command, "EVAL_RO", "return 1", "0")
    _denied(viewer.hgetall, "{other}:job:1")
    for command in (("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "*")):
        _denied(viewer.execute_command, *command)


def test_a_namespace_with_glob_characters_does_not_widen_the_user(clients):
    globby, admin = clients["globby"], clients["admin"]
    admin.hset("{xy}:job:g%3A1", "job_id", "g:1")
    admin.hset("{x*}:job:g%3A1", "job_id", "g:1")
    assert globby.hgetall("{x*}:job:g%3A1") == {"job_id": "g:1"}
    _denied(globby.hgetall, "{xy}:job:g%3A1")


def test_default_user_off_means_no_anonymous_access(acl_server):
    anon = connect(f"redis://127.0.0.1:{acl_server.port}/0", retries=0)
    try:
        with pytest.raises(redis.AuthenticationError):
            anon.get("{fstream}:jobs")
    finally:
        anon.close()
    wrong = connect(f"redis://agent:wrong@127.0.0.1:{acl_server.port}/0", retries=0)
    try:
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
    finally:
        wrong.close()


# ------------------------------------------------------------------------------------------------- TLS
def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fstream test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(key_file, 0o600)
    return ca_file, cert_file, key_file


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[Server]:
    ca, cert, key = _certificates(tmp_path)
    server = _start(tmp_path, [f"tls-cert-file {cert}", f"tls-key-file {key}", f"tls-ca-cert-file {ca}",
                               "tls-auth-clients no"], scheme="rediss", query=f"?ssl_ca_certs={ca}")
    try:
        yield server
    finally:
        _stop(server)


def test_tls_with_acl_users_and_no_plaintext(tls_server):
    sub = connect(tls_server.url("submitter"), retries=0)  # rediss://submitter:pw@127.0.0.1:P/0?ssl_ca_certs=CA
    viewer = connect(tls_server.url("viewer"), retries=0)
    try:
        store = JobStore(sub, keys=K, signer=SUB_A)
        job_id, created = store.submit(_spec())
        assert created and store.get(job_id).state == "queued"
        assert JobStore(viewer, keys=K).get(job_id).state == "queued"
        _denied(sub.xreadgroup, K.jobs_group(), "thief", {K.jobs_stream(): ">"})
        assert sub.connection_pool.connection_kwargs["ssl_ca_certs"].endswith("ca.pem")
    finally:
        sub.close()
        viewer.close()
    # the same port without TLS, and TLS without trusting the CA, are refused
    plain = f"redis://submitter:{PASSWORDS['submitter']}@127.0.0.1:{tls_server.port}/0"
    untrusted = f"rediss://submitter:{PASSWORDS['submitter']}@127.0.0.1:{tls_server.port}/0"
    for url, why in ((plain, "reset by peer|closed"), (untrusted, "CERTIFICATE_VERIFY_FAILED")):
        c = connect(url, retries=0, socket_timeout=3, connect_timeout=3)
        try:
            with pytest.raises(redis.ConnectionError, match=why):
                c.ping()
        finally:
            c.close()


def test_rules_for_redis_6_2_leave_out_what_7_0_added_and_load_there(tmp_path, monkeypatch):
    """The floor's Redis 6.2 refuses 7.0's ACL syntax (%R~, clearselectors, -cmd|sub, 7.0 commands): every role's
    line for 6.2 has none of it and is accepted by a real 6.2, which the 7.0 line is not."""
    for role in ROLES:
        who = "sub-a" if role == "submitter" else None
        legacy = acl_rules(role, NS, server_version="6.2", submitter=who)
        assert not [r for r in legacy if r.startswith("%") or r == "clearselectors" or r.startswith("-script|")]
        assert acl_rules(role, NS, server_version="7.0", submitter=who) == acl_rules(role, NS, submitter=who)
    with pytest.raises(ValueError, match="server version 'latest'"):
        acl_rules("agent", NS, server_version="latest")
    monkeypatch.setenv("FSTREAM_EMBEDDED_SERVER", serverkit.server("redis-6.2"))
    from fstream_provider.bus.embedded import RedisServer

    with RedisServer(str(tmp_path / "r62")) as srv:
        c = connect(srv.url)
        try:
            for role in ROLES:
                who = "sub-a" if role == "submitter" else None
                assert c.execute_command("ACL", "SETUSER", f"{role}-62",
                                         *acl_rules(role, NS, "6.2", submitter=who)) in ("OK", b"OK")
                with pytest.raises(redis.ResponseError, match="(?i)syntax error|unknown command"):
                    c.execute_command("ACL", "SETUSER", f"{role}-70", *acl_rules(role, NS, "7.0", submitter=who))
        finally:
            c.close()
