"""Error classes: every failure says whether it is retryable (network, timeout, stall) or terminal."""

from __future__ import annotations


class FStreamError(Exception):
    """Base error. ``retryable`` tells a worker whether another attempt can succeed.

    :param message: what went wrong, naming the file or peer.
    :param retryable: True for network/timeout/stall problems, False for auth, disk full,
        source modified, checksum mismatch after retries, bad input.
    """

    retryable = False
    kind = "error"

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable

    def describe(self) -> str:
        return f"{self} ({'retryable' if self.retryable else 'terminal'}: {self.kind})"


class ProtocolError(FStreamError):
    """Malformed or unexpected frame."""

    kind = "protocol"


class AuthError(FStreamError):
    """Authentication failed (wrong or missing secret, bad certificate)."""

    kind = "auth"


class NetworkError(FStreamError):
    """Connection refused, reset, or closed early."""

    retryable = True
    kind = "network"


class StallError(FStreamError):
    """Progress fell below the floor for too long."""

    retryable = True
    kind = "stall"


class RefusedError(FStreamError):
    """The receiver refused a file (bad path, no space, stale attempt)."""

    kind = "refused"


class SourceModifiedError(FStreamError):
    """A source file changed while it was being sent."""

    kind = "source modified"


class SourceVanishedError(SourceModifiedError):
    """A source file disappeared (renamed or deleted) before it could be opened."""

    kind = "source vanished"


class SourceRefusedError(SourceModifiedError):
    """A source file the agent's policy does not let it read (outside its source roots, not a regular file):
    that file fails, terminally, the rest of the job goes on."""

    kind = "source refused"


class ChecksumError(FStreamError):
    """The destination content did not match the source checksum."""

    retryable = True
    kind = "checksum"


class CancelledError(FStreamError):
    """The job was cancelled."""

    kind = "cancelled"
