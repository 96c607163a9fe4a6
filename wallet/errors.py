"""Every error the wallet package raises, under one root, `WalletError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wallet.session import HopSession


class WalletError(Exception):
    """Root of every error raised by the wallet package."""


class WrongPassphraseError(WalletError):
    """The passphrase does not open this key file."""


class KeyFileError(WalletError):
    """A key file that is missing, unreadable or not in the expected format."""


class RouteError(WalletError, ValueError):
    """A server announcement, a layer range or a route that makes no sense."""


class NoRoute(WalletError):
    """No chain of usable servers covers the requested layers.

    Attributes:
        first: the first layer of the range that no usable server covers.
        last: the last layer of the uncovered run that starts at ``first``.
        trusted_only: only trusted peers (an allow-list) were considered.
    """

    def __init__(self, first: int, last: int, trusted_only: bool = False):
        self.first, self.last, self.trusted_only = first, last, trusted_only
        run = f"layer {first} uncovered" if first == last else f"layers {first}..{last} uncovered"
        message = f"no usable server covers layer {first} ({run})"
        if trusted_only:
            message += "; only trusted peers were considered"
        super().__init__(message)


class RemoteError(WalletError):
    """Networked inference failed: no peer reachable, no route, too many failures."""


class HopFailed(RemoteError):
    """One server of the route failed (dead, stalled, refused or garbled).

    Attributes:
        session: the failed hop's session, when known.
    """

    def __init__(self, message: str, session: HopSession | None = None):
        super().__init__(message)
        self.session = session


class ServerBusy(RemoteError):
    """A server answered `Busy`."""

    def __init__(self, peer: str, retry_after_ms: int, reason: str):
        super().__init__(f"{peer} is busy ({reason}); retry after {retry_after_ms} ms")
        self.peer, self.retry_after_ms = peer, retry_after_ms
