"""Redis passwords never on the command line (issue 40): ``ps`` and ``/proc/PID/cmdline`` show it to every user.

A command's Redis password comes from a file (``--redis-password-file FILE``, ``$FSTREAM_REDIS_PASSWORD_FILE`` or
``[redis] password-file``: the configuration layer resolves the three like any option), or inside a URL that is not
an argument (``$FSTREAM_REDIS_URL``, ``[redis] url``). An argument that is a URL carrying a password is refused
before anything runs (``refusal``), naming the argument and how to fix it.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

from transfer_agent.errors import FStreamError

ENV_URL = "FSTREAM_REDIS_URL"
ENV_PASSWORD_FILE = "FSTREAM_REDIS_PASSWORD_FILE"  # ``[redis] password-file`` (cli.config.REDIS_KEYS)
FIX = ("give the URL without the password (redis://USER@HOST:PORT/DB) and the password in a file: "
       f"--redis-password-file FILE (mode 0600), ${ENV_PASSWORD_FILE}, or password-file under [redis] in the "
       f"configuration file; or the whole URL in ${ENV_URL} or url under [redis] (docs/config.md)")


def add_redis_options(p: argparse.ArgumentParser, help: str) -> None:
    """``--redis URL`` (``help``) and ``--redis-password-file FILE``, for every command that reaches Redis."""
    p.add_argument("--redis", metavar="URL", help=f"{help}; without a password (refused here: `ps` shows arguments)")
    p.add_argument("--redis-password-file", metavar="FILE",
                   help=f"the Redis user's password (mode 0600; default ${ENV_PASSWORD_FILE}, else [redis] "
                        "password-file), for the URL's user (redis://USER@HOST:PORT/DB)")


def refusal(argv: Sequence[str]) -> str | None:
    """Why ``argv`` may not run: an argument that is a URL with a password in it (any option, or a source); None."""
    from fstream_provider.model.redis_url import is_redis_url, secret_in, without_password

    for i, arg in enumerate(argv):
        if "://" not in arg:  # the cheap test: a plain `send` pays for nothing else
            continue
        name, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        what = secret_in(value if eq else arg)
        if what is None:
            continue
        url = value if eq else arg
        shown = without_password(url)
        option = name if eq else argv[i - 1] if i and argv[i - 1].startswith("--") else f"argument {shown!r}"
        fix = FIX if is_redis_url(url) or option.startswith("--redis") else \
            "give it without the secret, and the secret in a file or the configuration file"
        return (f"{option}: the URL carries {what}, which every user of this host can read in the process list "
                f"(ps, /proc/PID/cmdline); refusing it: {fix}")
    return None


def read_password(path: str, what: str = "Redis password file") -> str:
    """The password in ``path``: mode 0600 (``model.keyfile``), one line of text without whitespace inside (surrounding
    whitespace stripped); ``FStreamError`` naming ``what``, the file and the reason. ``fstream redis-acl`` reads its
    password file with it too."""
    from fstream_provider.model.keyfile import KeyFileError, read_key_file

    try:
        data = read_key_file(path, what, min_bytes=1)
    except KeyFileError as exc:
        raise FStreamError(str(exc)) from None
    try:
        password = data.decode()
    except UnicodeDecodeError:
        raise FStreamError(f"{what} {path}: not UTF-8 text") from None
    if any(c.isspace() for c in password):
        raise FStreamError(f"{what} {path}: whitespace inside the password")
    return password


def resolve(args: argparse.Namespace) -> None:
    """With a password file: ``args.redis`` becomes the URL to use (``--redis``, else ``$FSTREAM_REDIS_URL``) with
    the file's password in it; in memory only, where ``resolve_redis_url`` finds it. ``FStreamError`` if wrong."""
    path = getattr(args, "redis_password_file", None)
    if not path:
        return
    from fstream_provider.model.redis_url import secret_in, with_password

    url = getattr(args, "redis", None) or os.environ.get(ENV_URL)
    if not url:
        raise FStreamError(f"--redis-password-file {path}: no Redis URL to use it with: give --redis "
                           f"redis://USER@HOST:PORT/DB, ${ENV_URL} or url under [redis] (the embedded server needs "
                           "no password)")
    if secret_in(url):
        raise FStreamError(f"--redis-password-file {path}: the Redis URL carries a password too; give one of them")
    args.redis = with_password(url, read_password(path))
