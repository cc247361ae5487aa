"""Ed25519 key files (issue 40): what a signer holds is private, what a verifier holds cannot sign."""

from __future__ import annotations

import os

import pytest

from fstream_provider.authz import ed25519
from fstream_provider.model.keyfile import KeyFileError


def test_a_pair_signs_and_only_its_public_key_verifies(tmp_path):
    key = ed25519.ensure_pair(tmp_path / "agent.key", "agent-a")
    assert os.stat(tmp_path / "agent.key").st_mode & 0o777 == 0o600
    public = ed25519.load_public(tmp_path / "agent.key.pub")
    assert public.key_id == key.key_id and public.name == "agent-a"
    sig = key.sign(b"outcome")
    assert public.verify(b"outcome", sig)
    assert not public.verify(b"outcome!", sig)
    assert not ed25519.PrivateKey.generate().public.verify(b"outcome", sig)
    assert not public.verify(b"outcome", "00" * 64) and not public.verify(b"outcome", "not hex")
    assert ed25519.ensure_pair(tmp_path / "agent.key").key_id == key.key_id  # made once, then read
    assert "PRIVATE" not in repr(key) and key.pem().decode() not in repr(key)


def test_bad_files_are_refused_naming_the_file_and_reason(tmp_path):
    p = tmp_path / "k"
    ed25519.write_pair(p, ed25519.PrivateKey.generate())
    with pytest.raises(KeyFileError, match="exists"):
        ed25519.write_pair(p, ed25519.PrivateKey.generate())
    os.chmod(p, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        ed25519.load_private(p)
    bad = tmp_path / "bad"
    bad.write_text("not a key\n")
    os.chmod(bad, 0o600)
    with pytest.raises(ed25519.KeyFormatError, match="PKCS#8"):
        ed25519.load_private(bad)
    with pytest.raises(ed25519.KeyFormatError, match="expected 'fstream-ed25519"):
        ed25519.parse_public("ssh-ed25519 AAAA x")
    with pytest.raises(ed25519.KeyFormatError, match="32"):
        ed25519.parse_public("fstream-ed25519 AAAA")
