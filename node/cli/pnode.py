"""`pnode`: the command group, and the commands that set up and inspect a data dir.

Owns `main_group` with `init`, `produce`, `status` and `ledger show`; the
other commands live beside it (`node.cli.start`, `node.cli.train` with
devnet, `node.cli.verify` with proof). The commands only parse arguments,
call into ledger/ and node/, and print; no rule lives here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from ledger import crypto
from ledger.crypto import libp2p_peer_id
from ledger.genesis import DEFAULT_PARAMS, chain_params, new_genesis, node_registration
from ledger.types import tx_hash
from node.chain import node_status_view
from node.cli import common
from node.cli.common import (
    ask_node_or_store, coins, data_dir_option, emit, in_coins, json_option, parse_layers,
    passphrase_option, plural, read_view,
)
from node.cli.job import job
from node.cli.pol import pol
from node.cli.start import start
from node.cli.train import devnet, train
from node.cli.verify import proof, verify
from node.clock import now_ms
from node.datadir import DataDir, read_genesis_file
from node.errors import DataDirError
from node.datadir import read_public_key


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main_group() -> None:
    """pnode: a node of the pnode compute ledger.

    \b
    Examples:
      pnode init --data-dir ~/.pnode            # new private chain, keys, genesis
      pnode init --data-dir D --genesis G.json  # join an existing chain
      pnode produce --blocks 3                  # seal mempool txs into blocks (offline)
      pnode start --peers "$(cat A/node.addr)"  # run: sync, gossip, produce
      pnode job submit my-job.json              # post a training job, paid by deposit
      pnode job list                            # the training job and the queue
      pnode train --steps 200                   # train the default job locally
      pnode ledger show 1 --json
      pnode verify chain                        # exit 1 on the first bad block
      pnode pol export --out w.pol && pnode verify cert w.pol   # re-execute a window
    """


for command in (start, train, devnet, proof, verify, pol, job):  # the commands of node/cli's other modules
    main_group.add_command(command)


# -- init ---------------------------------------------------------------------------


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
@click.option("--layers", default="0:30", show_default=True,
              help="Layers served, START:END, as a new chain's genesis registers them. The "
                   "model is known only at `pnode start`: it refuses --layers the model lacks "
                   "and registers again the span it serves.")
@click.option("--slot-ms", type=click.IntRange(1, 600_000), default=DEFAULT_PARAMS["slot_ms"],
              show_default=True, help="Producer slot (timeout ladder step) of a new chain.")
@click.option("--job", "job_file", type=click.Path(dir_okay=False),
              help="The new chain's own training job (a job config, JSON; `pnode job template` "
                   "prints one) [default: the built-in default job].")
@click.option("--no-job", is_flag=True, help="Start the new chain without a job (nothing to "
              "mine until one is posted with `pnode job submit`).")
@passphrase_option
@json_option
def init(data_dir, genesis_file, chain_id, premine, alloc, bond, layers, slot_ms, job_file,
         no_job, passphrase_file, as_json) -> None:
    """Create a data dir: node, peer and wallet keys, genesis, chain store.

    A new chain carries its own training job from genesis (minted: one coin
    per accepted unit), so `pnode start` mines from the first blocks.

    \b
    Examples:
      PNODE_PASSPHRASE=secret pnode init --data-dir /tmp/n1 --chain-id mynet
      pnode init --data-dir /tmp/n2 --genesis /tmp/n1/genesis.json
      pnode init --data-dir /tmp/n3 --job my-job.json     # a chain that trains my-job.json
      pnode init --data-dir /tmp/n4 --no-job              # a chain that only serves
    """
    dd = DataDir(data_dir)
    if dd.genesis_file.exists() or dd.chain_dir.exists():
        raise DataDirError(f"{dd.path} is already initialised")  # before asking a passphrase
    if genesis_file and (chain_id or alloc or job_file or no_job):
        raise click.UsageError("--chain-id, --alloc, --job and --no-job make a new chain; "
                               "not with --genesis")
    if job_file and no_job:
        raise click.UsageError("--job and --no-job contradict each other")
    layer_range = parse_layers(layers)
    job_config = None if no_job or genesis_file else common.read_job_file(job_file, "--job")
    joined = read_genesis_file(Path(genesis_file)) if genesis_file else None
    secret = common.passphrase(passphrase_file, confirm=True)
    node_key, peer_key, wallet = (crypto.SigningKey(os.urandom(32)) for _ in range(3))
    genesis = joined or _new_genesis(chain_id, premine, alloc, bond, layer_range, slot_ms,
                                     node_key, peer_key, wallet, job_config)
    genesis_hash = dd.initialise(genesis, node_key, peer_key, wallet.seed(), secret)
    from libp2p.peer.id import ID  # here: the other commands need no libp2p

    info = {"data_dir": str(dd.path), "chain_id": genesis.chain_id,
            "genesis_hash": genesis_hash.hex(), "address": wallet.public.hex(),
            "node_key": node_key.public.hex(), "peer_id": ID(libp2p_peer_id(peer_key.public)).to_base58(),  # 12D3KooW.., as everywhere
            "joined": joined is not None,
            "jobs": [tx_hash(j).hex() for j in genesis.jobs]}
    emit(as_json, info, lambda: "\n".join(
        f"{k:13} {', '.join(v) or 'none' if isinstance(v, list) else v}"
        for k, v in info.items()))


def _new_genesis(chain_id, premine, alloc, bond, layers, slot_ms, node_key, peer_key, wallet,
                 job_config):
    allocations = {wallet.public: common.parse_coins(premine)}
    for item in alloc:
        address, _, coins = item.partition("=")
        account = common.parse_address(address)
        if account in allocations:
            raise click.BadParameter(f"{address} is allocated twice")
        allocations[account] = common.parse_coins(coins)
    chain_id = chain_id or f"pnode-{os.urandom(4).hex()}"
    if len(chain_id) > 64:
        raise click.BadParameter("--chain-id is at most 64 characters")
    params = chain_params(DEFAULT_PARAMS, wallet.public, slot_ms=slot_ms)
    reg = node_registration(chain_id, wallet, node_key, peer_key, layers,
                            common.parse_coins(bond))
    jobs = ()
    if job_config is not None:
        from proof_of_learning.units import job_tx  # torch loads with it

        jobs = (job_tx(job_config, chain_id, wallet, 1),)  # nonce 0 is the registration's
    return new_genesis(chain_id, now_ms(), params, allocations.items(), (reg,), jobs)


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


# -- ledger show / status / proof ------------------------------------------------------------


@main_group.command()
@data_dir_option
@click.option("--node", "node_prefix", metavar="KEY", help="Only this node key's receipts "
              "(hex; a prefix will do).")
@click.option("--job", "job_prefix", metavar="ID", help="Only this job's (hex; a prefix will do).")
@json_option
def receipts(data_dir, node_prefix, job_prefix, as_json) -> None:
    """The receipts in the chain's blocks, oldest first: ids that `pnode proof` takes.

    Asks the running node if there is one, else reads the data dir.

    \b
    Examples:
      pnode receipts --data-dir D
      pnode receipts --data-dir D --node 5a45 --json | jq -r '.receipts[-1].id'
      pnode proof "$(pnode receipts --data-dir D --json | jq -r '.receipts[0].id')" > r.proof
    """
    info = read_view(DataDir(data_dir), "receipts", node=node_prefix, job=job_prefix)
    emit(as_json, info, lambda: "\n".join(
        f"{r['height']:>7}  log {r['log_index']:>6}  {r['id']}  node {r['node_key'][:16]}..  "
        f"job {r['job_id'][:16]}.." for r in info["receipts"]) or "no receipts")


@main_group.group()
def ledger() -> None:
    """Inspect the local ledger."""


@ledger.command("show")
@click.argument("height", type=click.IntRange(0), required=False)
@data_dir_option
@json_option
def ledger_show(height, data_dir, as_json) -> None:
    """Show a block (default: the tip) with its header and transactions (each with its id).

    Asks the running node if there is one, else reads the data dir.

    \b
    Examples:
      pnode ledger show            # the tip
      pnode ledger show 0 --json   # genesis block as JSON
      pnode ledger show 12 --json | jq -r '.txs[].id'
    """
    doc = read_view(DataDir(data_dir), "block", height=height)
    emit(as_json, doc, lambda: _describe_block(doc))


def _describe_block(doc: dict) -> str:
    h = doc["header"]
    lines = [f"block {h['height']}  {doc['hash']}",
             f"  prev      {h['prev_hash']}", f"  time_ms   {h['time_ms']}",
             f"  producer  {h['producer']}", f"  txs_root  {h['txs_root']}",
             f"  log       {h['log_size']} receipts, root {h['log_root']}",
             f"  state     {h['state_root']}", f"  txs       {len(doc['txs'])}"]
    lines += [f"    {tx['type']:10} {tx['id']}" for tx in doc["txs"][:20]]
    if len(doc["txs"]) > 20:
        lines.append(f"    ... {len(doc['txs']) - 20} more (--json lists them all)")
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
    emit(as_json, in_coins(info, "balance", "bond"), lambda: _status_text(info))


#: Status fields in base units that are printed as coins.
_COIN_FIELDS = {"balance", "bond", "owed", "vouched", "lost"}  # base units; "settled" counts lanes


def _status_text(info: dict) -> str:
    """`pnode status` for people: one field a line, the swarm one server a line."""
    lines = [f"{key:16} {_plain(key, value)}" for key, value in info.items()
             if key not in ("peers", "swarm")]
    if "peers" in info:
        lines.append(f"{'peers':16} {len(info['peers'])} connected")
        lines += [f"  {p}" for p in info["peers"]]
    if info.get("swarm") is not None:
        lines.append(f"{'swarm':16} {plural(len(info['swarm']), 'server')} announced")
        lines += [f"  layers {s['layers'][0]:>3}:{s['layers'][1]:<3} {s['throughput']:7.1f} tok/s"
                  f"  load {s['load']}  price {s['price']}/position/layer  {s['peer_id']}"
                  for s in info["swarm"]]
    return "\n".join(lines)


def _plain(key: str, value) -> str:
    """A status value as a person reads it: coins, yes/no, "-" for none, no Python reprs."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in _COIN_FIELDS and isinstance(value, int):
        return coins(value)
    if key in ("layers", "serving") and isinstance(value, list) and len(value) == 2:
        return f"{value[0]}:{value[1]}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(k, v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(_plain(key, v) for v in value) or "none"
    return str(value)


def main() -> None:
    """Console entry point."""
    common.run(main_group)


if __name__ == "__main__":
    main()
