"""What a client asks of a generation over the swarm and what it gets back.

Owns `ClientConfig` (the client's tunables), `Served` (one server's part in
a generation) and `Generation` (the tokens, the route that served them and
its failovers), shared by `wallet.client.remote` and `wallet.client.session`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compute.codecs import CODECS
from wallet.errors import RemoteError


@dataclass(frozen=True)
class ClientConfig:
    """Tunables of the client.

    codec: wire encoding of hidden states both ways ("raw" keeps the output
        bit-identical to a local run; "fp16" halves the bytes).
    push: link the hops so that each pushes its outputs to the next
        (`wallet.client.remote`'s module docstring, step 4; the default: faster
        on loopback, where the hops share cores, and on a real network two
        one-way latencies per token fewer over three hops).
    step_timeout: seconds a step may take, plus ``step_timeout_per_token``
        per position it carries: past it the server counts as stalled.
    """

    codec: str = "raw"
    step_timeout: float = 5.0
    step_timeout_per_token: float = 0.02
    open_timeout: float = 10.0
    max_failovers: int = 8
    busy_wait: float = 15.0  # most seconds spent waiting on busy servers per hop
    push: bool = True
    # Spot checks (specs/network.md 9.5): the share of steps also run by other servers
    # (the first step always, unless 0), the seed of the draw (None: random), and where
    # the evidence of a mismatch is written (None: kept in memory only).
    spot_check_rate: float = 0.02
    spot_check_seed: int | None = None
    evidence_dir: str | None = None
    # A paying client asks the chain's height at most this often during a generation, to
    # move a hop to a new tab before its tab's last served height (specs/network.md 9.6).
    date_every_s: float = 2.0

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise RemoteError(f"unknown wire codec {self.codec!r}: expected one of {CODECS}")
        if not 0.0 <= self.spot_check_rate <= 1.0:
            raise RemoteError(f"spot check rate {self.spot_check_rate} is not in [0, 1]")


@dataclass(slots=True)
class Served:
    """One server's part in a generation, for the ``route`` of the result."""

    peer_id: str
    start: int
    end: int
    failed: bool = False

    def as_json(self) -> dict:
        return {"peer_id": self.peer_id, "start": self.start, "end": self.end,
                "failed": self.failed}


@dataclass(slots=True)
class Generation:
    """What `RemoteModel.generate` did."""

    token_ids: list[int] = field(default_factory=list)
    route: list[Served] = field(default_factory=list)
    failovers: int = 0
    wire_bytes: int = 0  # hidden-state payload bytes sent and received
    # Paid sessions: one dict per settled hop session (peer_id, layers, positions, bid,
    # amount, server_counted, tab, claim), and the tabs opened (id, locked).
    payments: list[dict] = field(default_factory=list)
    tabs: list[dict] = field(default_factory=list)
    spot_checks: SpotReport = field(default_factory=lambda: SpotReport())


@dataclass(slots=True)
class SpotReport:
    """What the generation's spot checks did (specs/network.md 9.5).

    run: steps checked; skipped: steps drawn but not checked (no other
    server holds the layers); mismatches: one dict per disagreement
    (`wallet.client.spotrules.Mismatch.as_json`).
    """

    run: int = 0
    skipped: int = 0
    mismatches: list[dict] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"run": self.run, "skipped": self.skipped, "mismatches": list(self.mismatches)}
