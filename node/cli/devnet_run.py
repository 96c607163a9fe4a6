"""`pnode devnet`: N real node processes on loopback train the devnet's job.

Owns the runner (specs/consensus.md section 6): it writes D/node<i> data
dirs (keys, the shared genesis of `node.mine.devnet`, a chain store) and
D/job.json, starts one `pnode start --no-serve --job D/job.json` process per
node (each dials the ones before it), follows their status over the control
sockets until every node has applied the job's last update (or the duration
is up), lets the chain run until every reward's challenge window has closed,
stops the processes (SIGTERM: a clean stop) and reads the summary from each
node's own chain store and loss log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger.state import ACCOUNT, JAIL, KEY_SUPPLY
from ledger.types import COIN, FAILING_REASONS, VERDICT_REASONS, Receipt, Verdict
from node.clock import now_ms
from node.control import ControlError, NodeNotRunning, control_call
from node.datadir import DataDir
from node.errors import NodeError
from node.datadir import read_public_key
from node.mine import BOND, DevnetKeys, devnet_genesis, devnet_job
from compute.jobfile import config_json
from node.node import ADDR_FILE, TRAIN_LOG

_ROOT = Path(__file__).resolve().parents[2]  # the repository root (node/cli/ is two down)
STOP_AGREE_S = 15.0  # the most `Devnet.stop` waits for the held nodes to share a tip


class DevnetError(NodeError):
    """A devnet that could not start or finish (a node died, a timeout)."""


def create(root: Path, n_nodes: int, steps: int, passphrase: str, *,
           job_overrides: dict | None = None, params: dict | None = None,
           spans: list[tuple[int, int]] | None = None) -> tuple[list[Path], Path]:
    """Write the node data dirs and D/job.json; returns (node dirs, job file).

    ``params`` overrides `DEVNET_PARAMS` (e.g. ``audit_bps``); ``spans``, the
    layers each node registers (default: `devnet_spans`).

    Raises:
        DevnetError: ``root`` already holds a devnet.
    """
    if root.exists() and any(root.iterdir()):
        raise DevnetError(f"{root} is not empty: give a new --data-dir")
    config = devnet_job(steps, n_nodes, **(job_overrides or {}))
    keys = [DevnetKeys.fresh() for _ in range(n_nodes)]
    genesis = devnet_genesis(f"devnet-{os.urandom(3).hex()}", keys, config,
                             now_ms(), spans=spans, **(params or {}))
    root.mkdir(parents=True, exist_ok=True)
    job_file = root / "job.json"
    job_file.write_text(config_json(config) + "\n")
    dirs = []
    for i, k in enumerate(keys):
        dd = DataDir(root / f"node{i}")
        dd.initialise(genesis, k.node, k.peer, k.wallet.seed(), passphrase)
        dirs.append(dd.path)
    return dirs, job_file


class Devnet:
    """The node processes of a devnet; `stop` (or leaving the `with`) stops them all."""

    def __init__(self, dirs: list[Path], job_file: Path, *, block_interval_ms: int = 200,
                 log: Callable[[str], None] = lambda line: None, gpu: int | None = None,
                 attacks: dict[int, str] | None = None):
        self.dirs, self.job_file, self.gpu = dirs, job_file, gpu
        self.attacks = attacks or {}  # node index: how it cheats (the attack battery)
        self.block_interval_ms, self.log = block_interval_ms, log
        self.procs: list[subprocess.Popen | None] = []
        self.addrs: list[str] = []

    def __enter__(self) -> Devnet:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, i: int, timeout: float = 120.0, wait_peers: int = 0) -> str:
        """Start node i (dialing every node already up); its address once it listens.

        ``wait_peers``: node i produces only once that many peers are
        connected (`pnode start --wait-peers`).
        """
        d = self.dirs[i]
        (d / ADDR_FILE).unlink(missing_ok=True)
        peers = [arg for a in self.addrs if a for arg in ("--peers", a)]
        out = open(d / "node.log", "a")
        proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "start", "--data-dir", str(d),
             "--listen", "/ip4/127.0.0.1/tcp/0", "--no-serve",
             "--log-level", "debug", "--log-file", "",  # all it says, into node.log below
             "--job", str(self.job_file), "--block-interval-ms", str(self.block_interval_ms),
             "--average-every", "5", "--wait-peers", str(wait_peers), *peers,
             *(["--gpu", str(self.gpu)] if self.gpu is not None else []),
             *(["--attack", self.attacks[i]] if i in self.attacks else [])],
            cwd=_ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        while len(self.procs) <= i:
            self.procs.append(None)
            self.addrs.append("")
        self.procs[i] = proc
        deadline = time.monotonic() + timeout
        addr_file = d / ADDR_FILE
        while not addr_file.exists() or not addr_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise DevnetError(f"node{i} did not start: see {d / 'node.log'}")
            time.sleep(0.05)
        self.addrs[i] = addr_file.read_text().strip()
        self.log(f"node{i} up: {self.addrs[i]}")
        return self.addrs[i]

    def kill(self, i: int) -> None:
        """SIGKILL node i (a crash, for tests)."""
        self.procs[i].kill()
        self.procs[i].wait()

    def status(self, i: int) -> dict[str, Any] | None:
        """Node i's `pnode status`, None when it is not answering."""
        try:
            return control_call(self.dirs[i], "status")
        except (NodeNotRunning, ControlError, OSError):
            return None

    def one_tip(self, nodes: list[int]) -> list[dict[str, Any]] | None:
        """The statuses of ``nodes`` when all answer and share one tip, else None."""
        states = [self.status(i) for i in nodes]
        if all(s is not None for s in states) and len({s["tip"] for s in states}) == 1:
            return states
        return None

    def stop(self) -> None:
        """Hold every producer, let the live nodes agree on one tip, then SIGTERM them.

        Stopping nodes that still produce would race the last block's gossip:
        a node stopped before it arrives ends one block behind the others.
        """
        live = [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]
        for i in live:
            try:
                control_call(self.dirs[i], "hold_production")
            except (NodeNotRunning, ControlError, OSError):
                pass
        deadline = time.monotonic() + STOP_AGREE_S
        while live and time.monotonic() < deadline and self.one_tip(live) is None:
            time.sleep(0.2)
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def follow(net: Devnet, steps: int, duration: float | None,
           progress: Callable[[int, int], None] = lambda step, height: None) -> bool:
    """Poll until every live node applied the last update; False if ``duration`` ran out."""
    began = time.monotonic()
    while duration is None or time.monotonic() - began < duration:
        live = [s for i in range(len(net.dirs)) if net.procs[i] is not None
                and net.procs[i].poll() is None and (s := net.status(i)) is not None]
        if not live:
            raise DevnetError("no node is running")
        # A node slashed below the bond (a caught cheater) gets no more work.
        live = [s for s in live if s.get("bond", BOND) >= BOND] or live
        if not live:
            raise DevnetError("no node is running")
        step = min((s.get("mining") or {}).get("step", 0) for s in live)
        progress(step, max(s["height"] for s in live))
        if step >= steps:
            return True
        time.sleep(0.3)
    return False


def settle(net: Devnet, blocks: int, timeout: float = 120.0) -> None:
    """Let the chain grow ``blocks`` more blocks and the live nodes agree on one tip."""
    live = [i for i, p in enumerate(net.procs) if p is not None and p.poll() is None]
    heights = [s["height"] for i in live if (s := net.status(i)) is not None]
    if not heights:
        raise DevnetError("no node is answering")
    start = max(heights)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = net.one_tip(live)
        if states is not None and min(s["height"] for s in states) >= start + blocks:
            return
        time.sleep(0.3)
    raise DevnetError(f"the nodes did not agree on a tip {blocks} blocks on")


def _step_means(losses: dict[tuple[int, int], float]) -> list[float]:
    """Each step's loss: the mean over its replicas, in replica order (as `train_local`)."""
    by_step: dict[int, list[tuple[int, float]]] = {}
    for (step, replica), loss in losses.items():
        by_step.setdefault(step, []).append((replica, loss))
    return [sum(loss for _, loss in sorted(by_step[s])) / len(by_step[s]) for s in sorted(by_step)]


def summary(dirs: list[Path]) -> dict[str, Any]:
    """The scripting contract's JSON, read from each (stopped) node's store and loss log."""
    tips, nodes, losses = [], [], {}
    heights, supply, minted = [], None, None
    wallets = [read_public_key(DataDir(d).wallet_file) for d in dirs]
    node_keys = [DataDir(d).node_key().public for d in dirs]
    strikes: list[int] = []  # per node, on the tallest chain: deadlines missed (jail)
    audits: dict[str, Any] = {}
    for d, wallet in zip(dirs, wallets):
        dd = DataDir(d)
        with dd.open_chain() as db:
            node_key = dd.node_key().public
            if not heights or db.height > max(heights):
                strikes = [getattr(db.state.get(JAIL + w), "strikes", 0) for w in wallets]
                audits = _audits(db, wallets, node_keys)
            accepted = sum(isinstance(tx, Receipt) and tx.node_key == node_key
                           for block in db.iter_blocks() for tx in block.txs)
            account = db.state.get(ACCOUNT + wallet)
            s = db.state.get(KEY_SUPPLY)
            supply = (s.premine + s.minted - s.burned) / COIN
            minted = s.minted / COIN
            tips.append(db.tip_hash.hex())
            heights.append(db.height)
            nodes.append({"data_dir": str(d), "units_accepted": accepted,
                          # Rewards only (bonds are not balance): whole coins, one per accepted unit.
            "coins": account.balance // COIN if account else 0,
                          "balance": account.balance if account else 0})
        log_file = d / TRAIN_LOG
        if log_file.exists():
            for line in log_file.read_text().splitlines():
                item = json.loads(line)
                losses.setdefault((item["step"], item.get("replica", 0)), item["loss"])
    ordered = _step_means(losses)
    for i, (node, n) in enumerate(zip(nodes, strikes)):
        node.update(strikes=n, slashed=audits["slashed"][i], jailed=audits["jailed"][i],
                    verified=audits["verified"][i])
    return {"height": max(heights), "tips": tips, "nodes": nodes,
            "verdicts": audits["verdicts"],
            "loss_first": ordered[0] if ordered else None,
            "loss_last": ordered[-1] if ordered else None,
            "losses": ordered, "supply": supply, "minted": minted}


def _audits(db, wallets: list[bytes], node_keys: list[bytes]) -> dict[str, Any]:
    """The chain's verdicts by outcome and reason; per node, the verdicts it signed, the
    coins of bond slashed and whether it is jailed now."""
    reasons = {name: 0 for name in VERDICT_REASONS}
    signed = dict.fromkeys(node_keys, 0)
    for block in db.iter_blocks():
        for tx in block.txs:
            if isinstance(tx, Verdict):
                reasons[VERDICT_REASONS[tx.reason]] += 1
                if tx.verifier in signed:
                    signed[tx.verifier] += 1
    fails = sum(n for name, n in reasons.items()
                if VERDICT_REASONS.index(name) in FAILING_REASONS)
    slashed, jailed = [], []
    for w in wallets:
        account = db.state.get(ACCOUNT + w)
        slashed.append((BOND - (account.bond if account else 0)) / COIN)
        jail = db.state.get(JAIL + w)
        jailed.append(jail is not None and jail.until > db.height)
    return {"verdicts": {"pass": reasons["pass"], "fail": fails,
                         "unavailable": reasons["unavailable"],
                         "reasons": {n: c for n, c in reasons.items() if c}},
            "slashed": slashed, "jailed": jailed, "verified": [signed[k] for k in node_keys]}
