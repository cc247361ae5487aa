"""Credentials inside Redis URLs: find them, add a password, strip it (no redis import: every argument is checked)."""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlsplit

# query parameters redis-py and ``bus.client`` read as passwords (``?password=``, Sentinel's ``?sentinel_password=``)
QUERY_SECRETS = ("password", "sentinel_password")
REDIS_SCHEMES = frozenset({"redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster",
                           "rediss+cluster"})


def _split(url: str) -> tuple[str, str, str, str]:
    """``(scheme, userinfo, hosts, rest)`` of ``scheme://[userinfo@]hosts[/rest]`` (hosts may be a list: Sentinel).
    In a Redis URL the user info runs to the last ``@`` before the query: a password written without
    percent-encoding may hold ``/`` (redis-py would fail on it, but it is a password all the same)."""
    scheme, _, after = url.partition("://")
    if scheme.lower() in REDIS_SCHEMES:
        head, q, query = after.partition("?")
        userinfo, at, rest = head.rpartition("@")
        netloc, slash, tail = (rest + q + query).partition("/") if at else after.partition("/")
        return scheme, userinfo, netloc, slash + tail
    netloc, slash, tail = after.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    return scheme, userinfo if at else "", hosts, slash + tail


def secret_in(text: str) -> str | None:
    """What secret a URL carries, in words (``"a password"``, ``"?sentinel_password="``), or None (not a URL too)."""
    if "://" not in text:
        return None
    scheme, userinfo, _hosts, rest = _split(text)
    if ":" in userinfo and userinfo.split(":", 1)[1]:
        return "a password"
    try:
        query = parse_qs(urlsplit(text).query)
    except ValueError:  # an unparsable host ("[::1"): its query by hand
        query = parse_qs(rest.partition("?")[2])
    return next((f"?{k}=" for k in QUERY_SECRETS if k in query), None)


def is_redis_url(text: str) -> bool:
    return text.split("://", 1)[0].lower() in REDIS_SCHEMES if "://" in text else False


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` (percent-encoded) in its user info, the user name kept: ``redis://USER:PW@HOST``."""
    scheme, userinfo, hosts, rest = _split(url)
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:{quote(password, safe='')}@{hosts}{rest}"


def masked(url: str) -> str:
    """``url`` with its password, and any password in its query, shown as ``***`` (for logs and messages)."""
    if secret_in(url) is None:
        return url
    scheme, userinfo, hosts, rest = _split(url)
    user, colon, password = userinfo.partition(":")
    path, sep, query = rest.partition("?")
    if sep:
        path += "?" + "&".join(f"{p.split('=', 1)[0]}=***" if p.split("=", 1)[0] in QUERY_SECRETS else p
                               for p in query.split("&"))
    auth = f"{user}:***@" if password else f"{user}@" if userinfo else ""
    return f"{scheme}://{auth}{hosts}{path}"


def without_password(url: str) -> str:
    """``url`` with no password in its user info (the user name kept) and no password in its query."""
    if "://" not in url:
        return url
    scheme, userinfo, hosts, rest = _split(url)
    user = userinfo.split(":", 1)[0]
    path, sep, query = rest.partition("?")
    if sep:
        kept = "&".join(p for p in query.split("&") if p.split("=", 1)[0] not in QUERY_SECRETS)
        path += f"?{kept}" if kept else ""
    return f"{scheme}://{user + '@' if user else ''}{hosts}{path}"
