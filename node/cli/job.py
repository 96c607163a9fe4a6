"""`pnode job`: post training jobs and follow them.

Owns the ``job`` command group: ``template`` (a job file to start from),
``submit`` (sign and queue a `Job`, locking its deposit), ``list``,
``show``, ``status`` and ``export`` (a job's weights, from the running node). The reading commands ask the running node, else
read the store (`node.cli.common.read_view`); what a job is and who pays
for it are the ledger's rules (`ledger.jobrules`, specs/consensus.md 5.2).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import click

from ledger.crypto import SigningKey
from ledger.jobrules import FEES_PER_UNIT, job_cost
from node.cli import common
from node.cli.common import (
    account_info, coins, data_dir_option, emit, format_coins, json_option, passphrase_option,
    read_view,
)
from node.datadir import DataDir
from node.datadir import read_key_file


@click.group()
def job() -> None:
    """Post training jobs to the chain and follow them.

    \b
    Examples:
      pnode job template > my-job.json          # the default job, to edit
      pnode job submit my-job.json              # locks the job's cost from this wallet
      pnode job list
      pnode job status 5e3c                     # a job id, or a prefix of one
      pnode job export 5e3c --out model.safetensors   # its weights, from the running node
    """


@job.command()
@click.option("--steps", type=click.IntRange(1, 10**9), default=None,
              help="Steps of the job [default: the default job's].")
@click.option("--model", "model", metavar="tiny|smollm2|FILE", default="tiny",
              show_default=True,
              help="tiny: the built-in 0.8M-parameter byte-level model, from random weights; "
                   "smollm2: continued training of the bundled SmolLM2-135M-Instruct (its "
                   "GGUF by hash, its tokens), on a text file you name in data.path; "
                   "FILE: continued training of that model, a Llama .gguf or a job's "
                   ".safetensors export (`pnode job export`); submit with --init-file FILE.")
def template(steps, model) -> None:
    """Print a job's config (JSON): a job file to edit and submit.

    The fields are `compute.data.JobConfig`'s: model (sizes), init (a GGUF
    file's SHA-256 to start from, or ""), data (synthetic text by seed and
    length, or a file by path), optimizer, batch, steps, k sections,
    replicas.

    \b
    Examples:
      pnode job template --steps 50 > small.json
      pnode job template --model smollm2 --steps 20 > smol.json   # then set data.path
      pnode job template --model tuned.gguf > more.json   # then: submit --init-file tuned.gguf
      pnode job template --model model.safetensors > again.json  # an export's job, continued
    """
    from dataclasses import replace

    from compute.jobfile import config_json

    if model not in ("tiny", "smollm2") and not model.endswith((".gguf", ".safetensors")):
        raise click.BadParameter(f"{model!r}: expected tiny, smollm2, a .gguf file or a job's "
                                 ".safetensors export", param_hint="--model")
    config = common.read_job_file(None, "")
    if model.endswith(".safetensors"):  # an export: its own job again, from its weights
        from compute.export import export_config

        sha = _init_sha(model, "--model")
        config = replace(export_config(Path(model)), init=sha)
    elif model != "tiny":
        from compute.data import DataSpec
        from compute.errors import ComputeError
        from compute.pretrained import pretrained_config

        sha = _init_sha(model, "--model")
        try:
            model_config = pretrained_config(sha, 256)
        except ComputeError as exc:
            raise click.BadParameter(f"{model}: {exc}", param_hint="--model") from None
        config = replace(config, model=model_config, init=sha, k=3,
                         batch_size=2, seq_len=128, lr=1e-4, steps=20,
                         data=DataSpec("file", path="notes.txt"))
    config = replace(config, steps=steps) if steps else config
    click.echo(json.dumps(json.loads(config_json(config)), indent=2, sort_keys=True))


@job.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--deposit", metavar="COINS",
              help="Coins to lock for the job's work [default: its cost on this chain; none "
                   "for the chain's job authority, whose jobs are paid by minting].")
@click.option("--wallet", "wallet_name", metavar="NAME",
              help="Pay from wallets/NAME.json instead of the default wallet.")
@click.option("--init-file", "init_file", type=click.Path(dir_okay=False, exists=True),
              help="The model file (.gguf, or a job's .safetensors export) whose SHA-256 the "
                   "job's \"init\" names (not needed for the bundled SmolLM2): kept in "
                   "DATA_DIR/data and served to the miners.")
@data_dir_option
@passphrase_option
@json_option
def submit(job_file, deposit, wallet_name, init_file, data_dir, passphrase_file,
           as_json) -> None:
    """Post the job of JOB_FILE, paid from this node's wallet.

    The deposit pays every unit's reward and its verifiers' fees; what the
    job does not spend comes back once it is finished. Jobs train one at a
    time: `pnode job list` shows the queue. A data file (``"data":
    {"source": "file", "path": "notes.txt"}``) is kept in DATA_DIR/data by
    its SHA-256, which the job names; this node serves it to the miners.
    So is the model file a job starts from (``"init"``: a GGUF, or a job's
    .safetensors export), given with --init-file unless it is the bundled
    SmolLM2.

    \b
    Examples:
      pnode job submit my-job.json
      pnode job submit my-job.json --deposit 500 --wallet carol --json
      pnode job submit more.json --init-file tuned.gguf   # continued training of an export
    """
    from proof_of_learning.units import job_plan, job_tx

    config = common.read_job_file(job_file, "JOB_FILE")
    dd = DataDir(data_dir)
    _shelve_init(dd, config.init, init_file, job_file)
    plan = _checked_plan(job_plan, config, job_file)
    config = _shelved(dd, config, job_file)
    params = read_view(dd, "params")["params"]
    n_units = 2 * plan.k * config.replicas
    cost = job_cost(SimpleNamespace(**params), config.steps, n_units)
    key = SigningKey(read_key_file(dd.wallet_path(wallet_name),
                                   common.passphrase(passphrase_file)))
    authority = key.public.hex() == params["job_authority"]
    units = _coins(deposit, "--deposit") if deposit is not None else 0 if authority else cost
    if 0 < units < cost:
        raise click.BadParameter(
            f"deposit short: the job needs at least {coins(cost)} ({config.steps} "
            f"steps x {n_units} units x (reward {format_coins(params['reward'])} + "
            f"{FEES_PER_UNIT} x fee {format_coins(params['verify_fee'])})), got "
            f"{format_coins(units)}", param_hint="--deposit")
    account = account_info(dd, key.public)
    if units > account["balance"]:
        raise click.BadParameter(f"the deposit, {coins(units)}, is more than the "
                                 f"wallet's balance, {format_coins(account['balance'])}",
                                 param_hint="--deposit")
    tx = _built(job_tx, config, job_file, account["chain_id"], key, account["next_nonce"], plan,
                units)
    job_id = common.submit_tx(dd, tx, account["running"])
    info = {"id": job_id.hex(), "steps": config.steps, "units": n_units,
            "deposit": format_coins(units), "deposit_units": units,
            "cost": format_coins(cost), "cost_units": cost, "running": account["running"]}
    emit(as_json, info, f"job {job_id.hex()} queued: {config.steps} steps x {n_units} units, "
                        f"deposit {coins(units)}"
                        f"{'' if units else ' (minted: the job authority)'}")


def _shelved(dd: DataDir, config, job_file: str):
    """``config`` with its data file put on the node's shelf and pinned by its sha256.

    A job names its data file by content alone; the running node serves it
    to miners over `/pnode/data/1.0.0` (`node.mine.DataShelf`).
    """
    from dataclasses import replace

    from compute.data import batch, load_corpus
    from compute.errors import ComputeError
    from node.mine import DataShelf

    data = config.data
    if data.source != "file":
        return config
    if not data.path:
        raise click.BadParameter(f"{job_file}: data.path must name the text file to train on",
                                 param_hint="JOB_FILE")
    try:
        corpus = load_corpus(data)  # UTF-8, long enough, and the sha256 if one is given
        batch(config, 0, 0, config.replicas, corpus=corpus)  # one sample at least: it can run
    except ComputeError as exc:
        raise click.BadParameter(f"{job_file}: {exc}", param_hint="JOB_FILE") from None
    sha = DataShelf(dd.path / "data").add(Path(data.path))
    assert sha == corpus.sha256  # a job's tokens are its file's bytes
    return replace(config, data=replace(data, sha256=sha,
                                        path=str(DataShelf(dd.path / "data").path(sha))))


def _init_sha(path: str, option: str) -> str:
    """The SHA-256 of a model file a job starts from ("smollm2": the bundled GGUF), known
    from now on in this process (`compute.pretrained`), once checked to be a model."""
    from compute.errors import ComputeError
    from compute.pretrained import bundled_sha256, pretrained_config, register_model_file

    if path == "smollm2":
        return bundled_sha256()
    if not path.endswith((".gguf", ".safetensors")):
        raise click.BadParameter(f"{path!r}: expected a .gguf file or a job's .safetensors "
                                 "export", param_hint=option)
    sha = register_model_file(Path(path))
    try:
        pretrained_config(sha, 1)  # a GGUF or an export, before a job is made of it
    except ComputeError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    return sha


def _shelve_init(dd: DataDir, init: str, init_file: str | None, job_file: str) -> None:
    """Make the job's ``init`` file known here and put it on the node's shelf: from
    ``--init-file``, else the shelf's copy (the bundled SmolLM2 needs neither)."""
    from compute.pretrained import bundled_sha256, register_model_file
    from node.mine import DataShelf

    shelf = DataShelf(dd.path / "data")
    if init_file is not None:
        sha = _init_sha(init_file, "--init-file")
        if sha != init:
            raise click.BadParameter(f"{init_file} has SHA-256 {sha[:16]}.., the job's init is "
                                     f"{init[:16] or 'empty'}..", param_hint="--init-file")
        shelf.add(Path(init_file))
    elif init and init != bundled_sha256():
        if not shelf.has(init):
            raise click.BadParameter(f"{job_file}: its init names the model file "
                                     f"{init[:16]}.., which is not the bundled SmolLM2: give "
                                     "it with --init-file FILE", param_hint="JOB_FILE")
        register_model_file(shelf.path(init), init)


def _coins(text: str, option: str) -> int:
    try:
        return common.parse_coins(text)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=option) from None


def _checked_plan(job_plan, config, job_file):
    """The job's partition, or one line on why the model cannot be cut so."""
    from compute.errors import ComputeError

    try:
        return job_plan(config)
    except (ComputeError, ValueError) as exc:
        raise click.BadParameter(f"{job_file}: {exc}", param_hint="JOB_FILE") from None


def _built(job_tx, config, job_file, *args):
    """The signed job, or one line on why its data cannot be read."""
    from compute.errors import ComputeError

    try:
        return job_tx(config, *args)
    except (ComputeError, OSError) as exc:
        raise click.BadParameter(f"{job_file}: {exc}", param_hint="JOB_FILE") from None


@job.command("list")
@data_dir_option
@json_option
def list_jobs(data_dir, as_json) -> None:
    """The chain's jobs: the one training, the queue in order, the finished ones.

    \b
    Example:
      pnode job list --json | jq -r '.jobs[0].id'
    """
    info = read_view(DataDir(data_dir), "jobs")
    emit(as_json, info, lambda: "\n".join(
        f"{j['id'][:16]}..  {j['state']:18} step {j['step']:>6}/{j['steps']:<6} "
        f"{j['paid_by']:8} deposit {j['deposit']:>10}  escrow {j['escrow']:>10}"
        for j in info["jobs"]) or "no jobs on the chain")


@job.command()
@click.argument("job_id")
@data_dir_option
@json_option
def show(job_id, data_dir, as_json) -> None:
    """Everything about one job: spec, commitments, deposit, its open step's units.

    \b
    Example:
      pnode job show 5e3c --json | jq .spec
    """
    info = read_view(DataDir(data_dir), "job", job=job_id)
    emit(as_json, info, lambda: _describe(info, full=True))


@job.command()
@click.argument("job_id")
@data_dir_option
@json_option
def status(job_id, data_dir, as_json) -> None:
    """One job's progress: its state, step, the open step's units and who has them.

    \b
    Example:
      pnode job status 5e3c
    """
    info = read_view(DataDir(data_dir), "job", job=job_id)
    emit(as_json, info, lambda: _describe(info, full=False))


@job.command()
@click.argument("job_id")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Where to write the weights: .safetensors (any job) or .gguf (a job "
                   "whose model descends from a GGUF).")
@data_dir_option
@json_option
def export(job_id, out, data_dir, as_json) -> None:
    """Write a job's trained weights, as of the last update applied, to a file.

    The running node on --data-dir writes it: its own sections, and every
    other section's weights from one of its holders at the same step.

    .safetensors keeps the model's own tensors and, in its metadata, the
    job, the step and the job's config (``pnode_job``, ``pnode_step``,
    ``pnode_config``): `pwallet infer --local --model` runs it, and a
    next job can start from it (`pnode job template --model FILE`).

    .gguf is llama.cpp's format with the tokenizer and chat template of
    the GGUF the job's model descends from: `pwallet infer --model`,
    `pnode start --model` (a server of the trained model) and llama.cpp
    run it. A byte-level job has no tokenizer for one.

    \b
    Examples:
      pnode job export 5e3c --out model.safetensors
      pnode job export 5e3c --out smollm2-tuned.gguf
      pnode start --data-dir D2 --model smollm2-tuned.gguf --layers 0:30
    """
    from compute.export import FORMATS
    from node.control import NodeNotRunning, control_call

    path = Path(out).resolve()
    if path.suffix not in FORMATS:
        raise click.BadParameter(f"{out}: expected a file name ending in "
                                 f"{' or '.join(FORMATS)}", param_hint="--out")
    if not path.parent.is_dir():
        raise click.BadParameter(f"{path.parent} is not a directory", param_hint="--out")
    try:
        info = control_call(DataDir(data_dir).path, "export_job", job=job_id, out=str(path))
    except NodeNotRunning:
        raise click.UsageError(f"export asks the running node that mined the job; none runs on "
                               f"{DataDir(data_dir).path} (the weights live in a running "
                               "miner's memory)") from None
    info.pop("ok", None)
    emit(as_json, info, f"wrote {info['out']}: job {info['job'][:16]}.. at step {info['step']}, "
                        f"{info['parameters']:,} parameters, {info['bytes']:,} bytes, sha256 "
                        f"{info['sha256'][:16]}..")


def _describe(info: dict, *, full: bool) -> str:
    lines = [f"job {info['id']}", f"  state     {info['state']}, step {info['step']} of "
             f"{info['steps']} ({info['units']} units a step)",
             f"  paid by   {info['paid_by']}: deposit {coins(info['deposit'])}, "
             f"{info['escrow']} left in escrow, {info['receipts_pending']} receipts pending"]
    for u in info["open_step"]:
        lines.append(f"    unit {u['index']:>3} layers {u['layers'][0]}:{u['layers'][1]}  "
                     f"{'done' if u['done'] else 'due by ' + str(u['deadline'])}  "
                     f"node {u['node_key'][:16]}..")
    if full:
        lines += [f"  creator   {info['creator']}", f"  posted    at height {info['posted']}",
                  f"  model     {info['model_hash']}", f"  data      {info['data_hash']}",
                  f"  hyper     {info['hyper_hash']}",
                  "  spec      " + json.dumps(info["spec"], sort_keys=True)]
    return "\n".join(lines)

