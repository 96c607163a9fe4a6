"""Every error the wallet package raises, under one root, `WalletError`.

A leaf of the wallet package: it imports no other wallet module (not even
for type hints), so every module may import it without forming a cycle.
"""

from __future__ import annotations


class WalletError(Exception):
    """Root of every error raised by the wallet package."""


class RouteError(WalletError, ValueError):
    """A server announcement, a layer range or a route that makes no sense."""


class NoRoute(WalletError):
    """No chain of usable servers covers the requested layers.

    Attributes:
        first: the first layer of the range that no usable server covers.
        last: the last layer of the uncovered run that starts at ``first``.
        trusted_only: only trusted peers (an allow-list) were considered.
        unregistered: servers do cover ``first``, but none of them is
            registered on the chain the client checks servers against.
    """

    unregistered = False  # a class default: subclasses may skip this __init__

    def __init__(self, first: int, last: int, trusted_only: bool = False, *,
                 unregistered: bool = False):
        self.first, self.last, self.trusted_only = first, last, trusted_only
        self.unregistered = unregistered
        if unregistered:  # else the user would look for a server that is there
            message = (f"layer {first} is served only by servers not registered on the chain; "
                       "pass --allow-unregistered for a private swarm")
        else:
            run = (f"layer {first} uncovered" if first == last
                   else f"layers {first}..{last} uncovered")
            message = f"no usable server covers layer {first} ({run})"
        if trusted_only:
            message += "; only trusted peers were considered"
        super().__init__(message)


class RouteBusy(NoRoute):
    """Servers cover the layers, but every usable one stayed full (busy) for the client's wait.

    Attributes:
        retry_after_ms: the servers' hint (or a second when they only
            announced themselves full).
    """

    def __init__(self, first: int, retry_after_ms: int):
        WalletError.__init__(self, f"every server that covers layer {first} is busy; "
                                   f"try again in {retry_after_ms / 1000:.1f} s")
        self.first = self.last = first
        self.trusted_only, self.retry_after_ms = False, retry_after_ms


class RemoteError(WalletError):
    """Networked inference failed: no peer reachable, no route, too many failures."""


class TooExpensive(NoRoute):
    """Servers cover the layers, but every usable one asks more than ``--max-price``.

    Attributes:
        first, last: the layer (both: one layer).
        cheapest: the least ask among the servers of that layer (base units
            per position per layer); max_price: the client's limit.
    """

    def __init__(self, first: int, cheapest: int, max_price: int):
        free = "free servers only (--max-price 0)" if max_price == 0 else (
            f"--max-price {max_price}")
        WalletError.__init__(self, f"every server that covers layer {first} asks more than "
                                   f"{free}: the cheapest asks {cheapest} base units per "
                                   f"position per layer (--max-price {cheapest} would fit)")
        self.first = self.last = first
        self.trusted_only, self.cheapest, self.max_price = False, cheapest, max_price


class SessionTooLong(NoRoute, RemoteError):
    """Servers cover a layer, but none of them takes what the generation needs.

    Raised before any session opens: a generation longer than every
    covering server's ``max_session_positions``, or (replacing a hop) chunks
    longer than every covering server's ``max_chunk_positions``. Waiting
    does not help, unlike `RouteBusy`.

    Attributes:
        first, last: the layer (both: one layer).
        needed: the positions asked for; cap: the largest any covering server takes.
    """

    def __init__(self, first: int, needed: int, cap: int, what: str = "session"):
        if what == "session":
            message = (f"a generation of {needed} positions (prompt + new tokens) is longer "
                       f"than every server that covers layer {first} takes: at most {cap} "
                       f"per session; ask for fewer tokens or a shorter prompt")
        else:
            message = (f"the route's inputs went in forward calls of {needed} positions, but "
                       f"every server that covers layer {first} runs at most {cap} per call")
        WalletError.__init__(self, message)
        self.first = self.last = first
        self.trusted_only, self.needed, self.cap = False, needed, cap


class HopFailed(RemoteError):
    """One server of the route failed (dead, stalled, refused or garbled).

    Attributes:
        session: the failed hop's session (a `wallet.client.session.HopSession`),
            when known; typed loosely so that this module stays a leaf.
        tab_ended: the server ended the session because its tab is near expiry
            (`node.wire.TAB_ENDS`): no fault of the server's; a new tab goes on.
    """

    def __init__(self, message: str, session: object | None = None, *,
                 tab_ended: bool = False):
        super().__init__(message)
        self.session = session
        self.tab_ended = tab_ended


class ServerBusy(RemoteError):
    """A server answered `Busy`."""

    def __init__(self, peer: str, retry_after_ms: int, reason: str, min_bid: int = 0):
        super().__init__(f"{peer} is busy ({reason}); retry after {retry_after_ms} ms")
        self.peer, self.retry_after_ms, self.min_bid = peer, retry_after_ms, min_bid


class BadEvidence(WalletError):
    """A spot-check evidence file the chain would refuse (unreadable, not holding, unsettled,
    too large to accuse with)."""
