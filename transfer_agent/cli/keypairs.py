"""``fstream keys new|list``: Ed25519 pairs for submitters (job signatures) and agents (outcome signatures) (issue 40).

``fstream keys new {submitter,agent} NAME --out DIR`` writes ``DIR/NAME.key`` (the private key, PKCS#8 PEM, mode
0600: it stays where it signs) and ``DIR/NAME.key.pub`` (one line, ``fstream-ed25519 <base64> NAME``: what the
verifying side lists), and prints the key id; an existing private key is never overwritten (``--file STEM`` makes a
second pair beside it, the first step of a rotation: docs/keys.md). ``fstream keys list PATH...`` shows, for each
key file (a directory: its ``*.key`` and ``*.pub``), whether it is private or public, its id and its name; never
a secret. The primitive and file formats are ``fstream_provider.authz.ed25519``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

KINDS = ("submitter", "agent")
USE = {
    "submitter": "give {priv} to the submitter (--submitter-key, $FSTREAM_SUBMITTER_KEY_FILE or the Airflow "
                 "connection's submitter_key_file) and list {pub} on every agent: [submitters.{name}] "
                 "public_key_file",
    "agent": "give {priv} to the agent ([agent] signing_key) and {pub} to the clients that trust its outcomes",
}


def add_pair_parsers(sub: Any) -> None:
    """``new`` and ``list`` under ``fstream keys``."""
    n = sub.add_parser("new", help="make an Ed25519 pair for a submitter or an agent (NAME.key 0600, NAME.key.pub)",
                       description=__doc__.split("\n\n")[0])
    n.add_argument("kind", choices=KINDS, help="who signs with it: a submitter (jobs) or an agent (outcomes)")
    n.add_argument("name", metavar="NAME", help="the submitter id or the agent's name (written in the public key)")
    n.add_argument("--out", required=True, metavar="DIR", help="the directory to write the pair in (made 0700)")
    n.add_argument("--file", metavar="STEM", help="file name without .key (default NAME; another stem makes a new "
                                                  "pair beside an existing one, to rotate)")
    n.set_defaults(func=cmd_new)
    ls = sub.add_parser("list", help="list Ed25519 key files: private or public, id, name (never a secret)")
    ls.add_argument("paths", nargs="+", metavar="PATH", help="key files, or directories of *.key and *.pub files")
    ls.set_defaults(func=cmd_list)


def cmd_new(args: argparse.Namespace) -> int:
    from fstream_provider.authz.ed25519 import PrivateKey, write_pair
    from fstream_provider.model.keyfile import KeyFileError
    from fstream_provider.authz.signing import check_submitter_id

    name = check_submitter_id(args.name)  # ids and agent names: the same characters (no spaces: a .pub's 3rd field)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    priv = out / f"{args.file or name}.key"
    key = PrivateKey.generate(name)
    try:
        pub = write_pair(priv, key)
    except KeyFileError as exc:
        raise KeyFileError(f"{exc}; to rotate, make the new pair beside it: fstream keys new {args.kind} {name} "
                           f"--out {out} --file {name}-2 (docs/keys.md)") from None
    print(f"{args.kind} {name}: key id {key.key_id}")
    print(f"  private {priv} (mode 0600)")
    print(f"  public  {pub}")
    print("  " + USE[args.kind].format(priv=priv, pub=pub, name=name))
    return 0


def describe(path: Path) -> str:
    """One line for one file: kind, id, name, path; or why it is not an FStream Ed25519 key (never its bytes)."""
    from fstream_provider.authz.ed25519 import PUBLIC_PREFIX, load_private, load_public
    from fstream_provider.model.keyfile import KeyFileError

    try:
        if path.read_bytes()[:len(PUBLIC_PREFIX)] == PUBLIC_PREFIX.encode():
            k = load_public(path)
            return f"public   {k.key_id}  {k.name or '-':<24} {path}"
        priv = load_private(path)
        pub, name, pair = path.with_name(path.name + ".pub"), "-", ""
        if pub.exists():
            try:
                other = load_public(pub)
                if other.key_id == priv.key_id:
                    name, pair = other.name or "-", "  (its .pub matches)"
                else:
                    pair = f"  ({pub.name} is ANOTHER key: {other.key_id})"
            except KeyFileError:
                pair = f"  ({pub.name} is not a public key)"
        return f"private  {priv.key_id}  {name:<24} {path}{pair}"
    except (KeyFileError, OSError) as exc:
        return f"not a key: {path}: {str(exc).splitlines()[0][:160]}"


def cmd_list(args: argparse.Namespace) -> int:
    files: list[Path] = []
    for p in map(Path, args.paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file() and f.suffix in (".key", ".pub"))
        else:
            files.append(p)
    print(f"{'kind':<8} {'key id':<16}  {'name':<24} file")
    bad = 0
    for f in files:
        line = describe(f)
        bad += line.startswith("not a key")
        print(line)
    return 1 if bad else 0
