"""`pnode train` (a job trained in this process) and `pnode devnet` (a local mining swarm)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from node.cli.common import emit, json_option, plural


@click.command()
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


@click.command()
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
@click.option("--audit-bps", type=click.IntRange(0, 10_000), default=None,
              help="Receipts audited by re-execution, in basis points [default: the devnet "
                   "preset's, 1000 = 10%].")
@click.option("--recheck-bps", type=click.IntRange(0, 10_000), default=None,
              help="Passes re-checked by a second verifier, in basis points [default: the "
                   "preset's, 1000].")
@click.option("--byzantine", type=click.IntRange(0, 16), default=0, show_default=True,
              help="How many nodes (node0, node1, ...) cheat, as --attack says.")
@click.option("--attack", default=None, metavar="KIND[,KIND...]",
              help="How the byzantine nodes cheat: random-update, scaled-gradients, "
                   "sub-threshold, stale-weights, wrong-data, replay, perturbed-forward, "
                   "wrong-loss-grad, copied, poisoned-push, lazy-verifier, "
                   "malicious-verifier, withholding, or several joined by + "
                   "(random-update+withholding); a comma list gives node i the i-th "
                   "(an empty entry: honest), else every byzantine node the one kind.")
@json_option
def devnet(n_nodes, steps, duration, data_dir, keep_running, replicas, gpu, audit_bps,
           recheck_bps, byzantine, attack, as_json) -> None:
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
      pnode devnet --byzantine 1 --attack scaled-gradients --json   # node0 cheats
      pnode devnet --nodes 4 --byzantine 3 --attack scaled-gradients,,lazy-verifier
    pnode devnet --nodes 3 --byzantine 1 --attack random-update+withholding
    """
    import tempfile

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from node.cli import devnet_run

    attacks = _attacks(byzantine, attack, n_nodes)
    if gpu is not None:
        from compute.device import resolve_device  # a clear error when there is no such GPU
        resolve_device(f"cuda:{gpu}")
    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="pnode-devnet-"))
    secret = os.environ.get("PNODE_PASSPHRASE", "devnet")
    err = Console(stderr=True)
    params = {name: v for name, v in (("audit_bps", audit_bps), ("recheck_bps", recheck_bps))
              if v is not None}
    dirs, job_file = devnet_run.create(root, n_nodes, steps, secret,
                                       job_overrides={"replicas": replicas}, params=params)
    say = (lambda line: None) if as_json else (lambda line: err.print(line))
    say(f"devnet in {root}: {n_nodes} nodes, job of {steps} steps"
        + (f", mining on cuda:{gpu}" if gpu is not None else ""))
    with devnet_run.Devnet(dirs, job_file, log=say, gpu=gpu, attacks=attacks) as net:
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
            devnet_run.settle(net, max(DEVNET_PARAMS["challenge_window"],
                                       DEVNET_PARAMS["verdict_window"] + 2) + 2)
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
        "no loss computed", f"supply {plural(info['supply'], 'coin')} ({info['minted']} minted)",
        "verdicts: {pass} pass, {fail} fail, {unavailable} unavailable".format(
            **info["verdicts"]),
        *(f"node{i}: {plural(n['units_accepted'], 'unit')} accepted, "  # whole coins
          f"{plural(n['coins'], 'coin')}"
          + (f", {plural(n['slashed'], 'coin')} slashed" if n["slashed"] else "")
          + (", jailed" if n["jailed"] else "")
          for i, n in enumerate(info["nodes"]))]))


def _attacks(byzantine: int, attack: str | None, n_nodes: int) -> dict[int, str]:
    """Node index -> how it cheats, from --byzantine and --attack (see their help)."""
    if (byzantine > 0) != (attack is not None) or byzantine > n_nodes:
        raise click.UsageError("--byzantine K and --attack KIND go together, K at most --nodes")
    if attack is None:
        return {}
    from node.pol import ATTACKS, attack_parts
    kinds = attack.split(",")
    if len(kinds) > 1 and len(kinds) != byzantine:
        raise click.UsageError(f"--attack lists {len(kinds)} kinds for {byzantine} byzantine "
                               "nodes")
    for kind in kinds:
        try:
            attack_parts(kind) if kind else None
        except ValueError as exc:
            raise click.UsageError(f"--attack: {exc} (kinds: {', '.join(ATTACKS)})") from None
    return {i: kinds[i if len(kinds) > 1 else 0] for i in range(byzantine)
            if kinds[i if len(kinds) > 1 else 0]}
