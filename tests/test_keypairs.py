"""``fstream keys new|list`` (issue 40): Ed25519 pairs for submitters and agents, listed by id and name, never a
secret; an existing private key is never overwritten, and a second pair beside it starts a rotation."""

from __future__ import annotations

import os

from fstream_provider.authz.ed25519 import load_private, load_public
from fstream_provider.authz.signing import Signer
from transfer_agent.cli.main import main


def test_new_writes_a_private_0600_and_a_public_pair_for_both_kinds(tmp_path, capsys):
    out = tmp_path / "keys"
    assert main(["keys", "new", "submitter", "lcls-daq", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert main(["keys", "new", "agent", "dtn1", "--out", str(out)]) == 0
    said_agent = capsys.readouterr().out
    sub, agent = load_private(out / "lcls-daq.key"), load_private(out / "dtn1.key")
    assert os.stat(out / "lcls-daq.key").st_mode & 0o777 == 0o600 and os.stat(out).st_mode & 0o777 == 0o700
    pub = load_public(out / "lcls-daq.key.pub")
    assert (pub.key_id, pub.name) == (sub.key_id, "lcls-daq") and load_public(out / "dtn1.key.pub").name == "dtn1"
    assert f"submitter lcls-daq: key id {sub.key_id}" in said and "[submitters.lcls-daq] public_key_file" in said
    assert f"agent dtn1: key id {agent.key_id}" in said_agent and "[agent] signing_key" in said_agent
    signer = Signer.from_file("lcls-daq", out / "lcls-daq.key")  # what --submitter-key reads
    assert signer.public == pub.__class__(pub.raw, "lcls-daq")


def test_new_never_overwrites_a_key_and_says_how_to_rotate(tmp_path, capsys):
    out = tmp_path / "keys"
    assert main(["keys", "new", "submitter", "s1", "--out", str(out)]) == 0
    before = (out / "s1.key").read_bytes()
    capsys.readouterr()
    assert main(["keys", "new", "submitter", "s1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists (refusing to overwrite a key)" in err and f"--out {out} --file s1-2" in err, err
    assert (out / "s1.key").read_bytes() == before
    assert main(["keys", "new", "submitter", "s1", "--out", str(out), "--file", "s1-2"]) == 0
    old, new = load_public(out / "s1.key.pub"), load_public(out / "s1-2.key.pub")
    assert old.key_id != new.key_id and old.name == new.name == "s1"


def test_list_shows_kind_id_and_name_and_never_a_secret(tmp_path, capsys):
    out = tmp_path / "keys"
    for kind, name in (("submitter", "a"), ("agent", "dtn1")):
        assert main(["keys", "new", kind, name, "--out", str(out)]) == 0
    (out / "a.key.pub").rename(out / "moved.pub")  # a private key without its .pub beside it
    (out / "junk.key").write_text("not a key\n")
    (out / "junk.key").chmod(0o600)
    capsys.readouterr()
    assert main(["keys", "list", str(out)]) == 1  # one file is not a key
    listed = capsys.readouterr().out
    a, dtn1 = load_private(out / "a.key"), load_private(out / "dtn1.key")
    assert f"private  {dtn1.key_id}  dtn1" in listed and "(its .pub matches)" in listed
    assert f"public   {dtn1.key_id}  dtn1" in listed and f"public   {a.key_id}  a" in listed
    assert f"private  {a.key_id}  -" in listed and f"not a key: {out / 'junk.key'}" in listed
    for f in ("a.key", "dtn1.key"):
        body = [line for line in (out / f).read_text().splitlines() if not line.startswith("-----")]
        assert body and not any(line in listed for line in body)
    assert main(["keys", "list", str(out / "dtn1.key.pub")]) == 0
