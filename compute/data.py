"""Training jobs: what a job is, the bytes it learns from, and the batches of each step.

Owns a job's description (`JobConfig`: model, data, optimizer, batches,
partition), its initial model (`make_model`), its corpus (a seeded synthetic
text or a user's file) and which bytes each step sees (`batch`). Tokens are
bytes: the vocabulary is the 256 byte values, so no tokenizer is needed and a
file's SHA-256 names its token stream exactly. The default job (`JobConfig()`)
is a 4-layer, 0.8M-parameter model on synthetic text whose loss falls from
ln 256 = 5.55 to 1.04 in 200 steps (16 s on one CPU thread here;
bench/train_local_bench.py measures it).

Synthetic text. `synthetic_text(seed, n_chars)` writes short English-like
sentences from a few templates (who has how many of what, small sums, who
likes what), drawing every choice from a SHA-256 counter stream of the seed:
the same seed gives the same text on every machine and Python version. It has
enough structure for a tiny model to learn in a few hundred steps.

Batches. Step s of a job with seed S draws R * B windows of T + 1 bytes
(R replicas, B sequences each, T = seq_len) from a corpus of N bytes; window
j starts at

    u64be(SHA-256(b"pnode:batch:" || u64be(S) || u64be(s) || u64be(j))[:8]) mod (N - T)

Replica r takes windows [r * B, (r + 1) * B); inputs are a window's first T
bytes, targets its last T. So the replicas of a step split one global batch,
and a verifier recomputes any batch from (corpus hash, seed, step) with no
random-number library.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from compute.config import ModelConfig
from compute.errors import ComputeError, ConfigError
from compute.model import Transformer

BATCH_DOMAIN = b"pnode:batch:"
TEXT_DOMAIN = b"pnode:text:"
VOCAB_SIZE = 256
SOURCES = ("synthetic", "file")
_U64 = 1 << 64

_NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
_ITEMS = ("apples", "books", "coins", "pens", "cups", "stones")
_COLORS = ("red", "green", "blue", "black", "white")
_ANIMALS = ("cat", "dog", "fox", "owl", "horse")


class DataError(ComputeError, ValueError):
    """Training data is missing, empty, not UTF-8, too short, or a batch request is out of range."""


@dataclass(frozen=True, slots=True, eq=False)
class Corpus:
    """A token stream: tokens (N,) int64 byte values, and the SHA-256 of those bytes."""

    tokens: torch.Tensor
    sha256: str

    def __len__(self) -> int:
        return self.tokens.numel()


@dataclass(frozen=True, slots=True)
class DataSpec:
    """Where a job's corpus comes from.

    source: "synthetic" (seed, n_chars) or "file" (path, and sha256 in hex
    when the job pins the file's content; a job on chain names its file by
    sha256 alone, and each node says where its copy is with path).

    Raises:
        DataError: unknown source, n_chars < 1, a seed outside u64, or a file
            source without a path.
    """

    source: str = "synthetic"
    seed: int = 0
    n_chars: int = 100_000
    path: str = ""
    sha256: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise DataError(f"expected a data source in {SOURCES}, got {self.source!r}")
        if self.source == "synthetic" and (self.n_chars < 1 or not 0 <= self.seed < _U64):
            got = (self.n_chars, self.seed)
            raise DataError(f"expected n_chars >= 1 and a u64 seed, got {got}")
        if self.source == "file" and not (self.path or self.sha256):
            raise DataError("a file data source needs a path, or the sha256 of its content")


class _Draws:
    """Unbounded u64 draws from SHA-256(TEXT_DOMAIN || u64be(seed) || u64be(counter))."""

    def __init__(self, seed: int) -> None:
        self.prefix = TEXT_DOMAIN + seed.to_bytes(8, "big")
        self.counter = 0
        self.buffer: list[int] = []

    def below(self, n: int) -> int:
        """A draw in [0, n) (modulo bias below 2^-50 for the small n used here)."""
        if not self.buffer:
            digest = hashlib.sha256(self.prefix + self.counter.to_bytes(8, "big")).digest()
            self.buffer = [int.from_bytes(digest[i : i + 8], "big") for i in (24, 16, 8, 0)]
            self.counter += 1
        return self.buffer.pop() % n

    def pick(self, options: tuple[str, ...]) -> str:
        return options[self.below(len(options))]


def _sentence(d: _Draws) -> str:
    """One sentence from one of four templates."""
    a, b = d.pick(_NAMES), d.pick(_NAMES)
    kind = d.below(4)
    if kind == 0:
        x, y, item = d.below(10), d.below(10), d.pick(_ITEMS)
        return f"{a} has {x} {item}. {b} gives {a} {y} more. now {a} has {x + y} {item}.\n"
    if kind == 1:
        x, y = d.below(50), d.below(50)
        return f"{x} plus {y} is {x + y}.\n"
    if kind == 2:
        return f"{a} likes {d.pick(_ITEMS)} and {b} likes {d.pick(_ITEMS)}.\n"
    one, two = f"{d.pick(_COLORS)} {d.pick(_ANIMALS)}", f"{d.pick(_COLORS)} {d.pick(_ANIMALS)}"
    return f"the {one} sees the {two}.\n"


def synthetic_text(seed: int, n_chars: int) -> str:
    """Exactly n_chars characters of templated ASCII sentences, a function of seed only."""
    d, parts, size = _Draws(seed), [], 0
    while size < n_chars:
        parts.append(_sentence(d))
        size += len(parts[-1])
    return "".join(parts)[:n_chars]


def corpus_from_bytes(data: bytes, source: str = "text") -> Corpus:
    """The corpus of UTF-8 bytes.

    Raises:
        DataError: data is empty or not valid UTF-8 (the message names the
            first bad byte and its offset).
    """
    if not data:
        raise DataError(f"{source} is empty; expected UTF-8 text")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{source} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"({e.reason})"
        ) from None
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)  # (N,)
    return Corpus(tokens, hashlib.sha256(data).hexdigest())


def data_from_file(path: str | Path, sha256: str = "") -> Corpus:
    """The corpus of a user's UTF-8 text file.

    Args:
        path: the file.
        sha256: when given, the hex digest the file must have.
    Raises:
        DataError: the file cannot be read, is empty, is not UTF-8, or has
            another digest than sha256.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"cannot read training data {str(path)!r}: {e.strerror or e}") from None
    corpus = corpus_from_bytes(data, f"training data {str(path)!r}")
    if sha256 and corpus.sha256 != sha256.lower():
        raise DataError(f"expected {str(path)!r} to have SHA-256 {sha256}, it has {corpus.sha256}")
    return corpus


@lru_cache(maxsize=4)
def _synthetic_corpus(seed: int, n_chars: int) -> Corpus:
    return corpus_from_bytes(synthetic_text(seed, n_chars).encode("ascii"), "synthetic text")


def job_corpus(job: JobConfig) -> Corpus:
    """The tokens a job trains on: its data's bytes, or (``job.init`` set) the text in the
    model file's tokens. The corpus's sha256 is the data's either way.

    Raises:
        DataError: as `load_corpus`; ModelFileError: no model file ``job.init``.
    """
    corpus = load_corpus(job.data)
    return _tokenized(job.data, job.init, corpus.sha256) if job.init else corpus


@lru_cache(maxsize=2)
def _tokenized(spec: DataSpec, init: str, sha256: str) -> Corpus:
    from compute.pretrained import text_tokens

    tokens = text_tokens(bytes(load_corpus(spec).tokens.to(torch.uint8).tolist()), init)
    if tokens.numel() < 2:
        raise DataError("the training text is shorter than two tokens")
    return Corpus(tokens, sha256)


def load_corpus(spec: DataSpec) -> Corpus:
    """The corpus a DataSpec names (synthetic corpora are kept once built; files are re-read)."""
    if spec.source == "synthetic":
        return _synthetic_corpus(spec.seed, spec.n_chars)
    return data_from_file(spec.path, spec.sha256)


def window_starts(n_tokens: int, seq_len: int, seed: int, step: int, count: int) -> list[int]:
    """Starts of the first `count` windows of a step (module docstring)."""
    prefix = BATCH_DOMAIN + seed.to_bytes(8, "big") + step.to_bytes(8, "big")
    span = n_tokens - seq_len
    return [
        int.from_bytes(hashlib.sha256(prefix + j.to_bytes(8, "big")).digest()[:8], "big") % span
        for j in range(count)
    ]


def batch_at(
    corpus: Corpus, *, seed: int, step: int, batch_size: int, seq_len: int,
    replica: int = 0, n_replicas: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of one replica at one step.

    Args:
        corpus: the token stream.
        seed, step: u64 each.
        batch_size, seq_len: B and T (>= 1).
        replica, n_replicas: 0 <= replica < n_replicas.
    Returns:
        (ids (B, T) int64, targets (B, T) int64), targets = ids shifted by one.
    Raises:
        DataError: arguments out of range, or a corpus of at most T tokens.
    """
    if not (0 <= seed < _U64 and 0 <= step < _U64 and batch_size >= 1 and seq_len >= 1):
        raise DataError(
            f"expected u64 seed and step, batch_size >= 1, seq_len >= 1, "
            f"got {seed}, {step}, {batch_size}, {seq_len}"
        )
    if not 0 <= replica < n_replicas:
        raise DataError(f"expected 0 <= replica < n_replicas, got {replica}, {n_replicas}")
    if len(corpus) <= seq_len:
        got = len(corpus)
        raise DataError(f"expected a corpus longer than seq_len {seq_len}, got {got} tokens")
    starts = window_starts(len(corpus), seq_len, seed, step, n_replicas * batch_size)
    mine = torch.tensor(starts[replica * batch_size : (replica + 1) * batch_size])  # (B,)
    windows = corpus.tokens[mine[:, None] + torch.arange(seq_len + 1)]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


# 4 layers, dim 128, 4 heads over 2 KV heads: about 0.8M parameters, bytes as tokens.
DEFAULT_MODEL = ModelConfig(
    vocab_size=VOCAB_SIZE, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=352,
    max_seq_len=128,
)


@dataclass(frozen=True, slots=True)
class JobConfig:
    """A training job: model, data, optimizer, batches, partition.

    lr, betas, eps, weight_decay: AdamW's (decay applies to every tensor);
    batch_size, seq_len: per replica and step; steps: length of the job;
    seed: weight init and batch draws; k: sections of the partition;
    mlp_slices: MLP slices per layer (None: `model_units`' default);
    init_std: std of the initial weights;
    replicas: data-parallel shards of every step: each draws its own
        batch_size sequences (`batch(job, step, r, replicas)`) and the step's
        update averages their gradients (`compute.train.average_replicas`);
    state_every: the job's checkpoint interval K: workers keep the full state
        (weights and AdamW moments) of every part they hold at the steps
        divisible by it, from which a joining node replays windows of K steps
        (specs/pol.md 8 and 10.3);
    threads: the intra-op CPU threads every unit runs with, on every node
        (`compute.device.pinned_threads`): a weight gradient's rounding
        depends on it, and a re-execution is bit-exact only at the same count;
    classes: the compute classes (`compute.device.compute_class`) whose
        units the job takes; () takes any. A job of one class is judged bit
        for bit; across classes a verifier applies a tolerance that a
        cheater can hide under (specs/pol.md 7.3), so a job that wants
        exactness names its class;
    init: "" (weights drawn from seed and init_std), or the hex SHA-256 of
        the model file the job starts from, a GGUF or a job's export
        (continued training, `compute.pretrained`): its weights are the
        initial model, ``model`` must be its config, and the text is read in
        its tokens.

    Raises:
        ConfigError: a value out of range (k an int >= 1, mlp_slices None or
            an int in 1..ffn_dim, replicas an int in 1..MAX_REPLICAS, state_every
            an int >= 1, threads an int in 1..256), or a
            vocabulary smaller than 256 (tokens are bytes).
    """

    model: ModelConfig = DEFAULT_MODEL
    data: DataSpec = field(default_factory=DataSpec)
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.01
    batch_size: int = 16
    seq_len: int = 64
    steps: int = 200
    seed: int = 0
    k: int = 2
    mlp_slices: int | None = None
    init_std: float = 0.02
    replicas: int = 1
    state_every: int = 16
    threads: int = 2
    init: str = ""
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ok = (
            self.lr > 0 and self.eps > 0 and self.weight_decay >= 0 and self.init_std > 0
            and all(0 <= b < 1 for b in self.betas) and len(self.betas) == 2
            and self.batch_size >= 1 and 1 <= self.seq_len <= self.model.max_seq_len
            and self.steps >= 0 and 0 <= self.seed < 1 << 64
        )
        if not ok:
            raise ConfigError(f"job hyperparameters out of range: {self}")
        if self.init and (len(self.init) != 64
                          or any(c not in "0123456789abcdef" for c in self.init)):
            raise ConfigError(f"expected init '' or a model file's SHA-256 in hex, "
                              f"got {self.init!r}")
        if self.model.vocab_size < VOCAB_SIZE:
            got = self.model.vocab_size
            raise ConfigError(f"byte tokens need vocab_size >= {VOCAB_SIZE}, got {got}")
        if not _is_int(self.k) or self.k < 1:
            raise ConfigError(f"expected k an int >= 1 (sections), got {self.k!r}")
        if not _is_int(self.replicas) or not 1 <= self.replicas <= MAX_REPLICAS:
            raise ConfigError(f"expected replicas an int in 1..{MAX_REPLICAS}, "
                              f"got {self.replicas!r}")
        if not _is_int(self.threads) or not 1 <= self.threads <= 256:
            raise ConfigError(f"expected threads an int in 1..256, got {self.threads!r}")
        if not isinstance(self.classes, tuple) or len(self.classes) > MAX_CLASSES or not all(
                isinstance(c, str) and 0 < len(c) <= 128 and all(" " <= ch <= "~" for ch in c)
                for c in self.classes):
            raise ConfigError(f"expected classes a list of at most {MAX_CLASSES} compute class "
                              f"names (printable ASCII, 1..128 characters), got "
                              f"{self.classes!r}")
        if not _is_int(self.state_every) or self.state_every < 1:
            raise ConfigError(f"expected state_every an int >= 1 (steps), "
                              f"got {self.state_every!r}")
        ffn = self.model.ffn_dim
        m = self.mlp_slices
        if m is not None and not (_is_int(m) and 1 <= m <= ffn):
            raise ConfigError(
                f"expected mlp_slices None or an int in 1..{ffn} (ffn_dim), got {m!r}"
            )


#: Most data-parallel replicas of a job (the ledger lists every replica's units).
MAX_REPLICAS = 256
#: Most compute classes a job may name.
MAX_CLASSES = 16


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def make_model(job: JobConfig) -> Transformer:
    """The job's initial model: N(0, init_std) weights drawn from a generator seeded by
    job.seed, or the weights of the model file ``job.init`` (`compute.pretrained`)."""
    if job.init:
        from compute.pretrained import pretrained_model

        return pretrained_model(job.init, job.model)
    model = Transformer(job.model)
    model.init_weights(torch.Generator().manual_seed(job.seed), std=job.init_std)
    return model.train()


def batch(
    job: JobConfig, step: int, replica: int = 0, n_replicas: int = 1,
    *, corpus: Corpus | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, targets), each (batch_size, seq_len) int64, of one replica at one step.

    Args:
        job: seed, batch_size, seq_len and the data spec.
        step, replica, n_replicas: as `batch_at`.
        corpus: the job's corpus if already loaded (else `load_corpus(job.data)`).
    Raises:
        DataError: as `load_corpus` and `batch_at`.
    """
    corpus = job_corpus(job) if corpus is None else corpus
    return batch_at(
        corpus, seed=job.seed, step=step, batch_size=job.batch_size, seq_len=job.seq_len,
        replica=replica, n_replicas=n_replicas,
    )
