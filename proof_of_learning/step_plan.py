"""The phases of a training step's units: what each needs, computes and sends.

Owns `StepPlan`, the miner's map of a job's step (specs/consensus.md 5.4).
Sections fall into *stages*: a section of whole layers is a stage of its
own; the sections that each hold a piece of one layer (some of its query
heads and/or MLP slices, `compute.blocks.piece_of`) form one stage together.

A unit of whole layers is one phase. A unit of a piece runs half by half,
because the MLP half of a layer takes h_mid, which sums the attention
partials of every piece of the layer (`compute.train.forward_chain`):

- forward: ``attention`` (its heads' partial of h), ``mlp`` (its slices'
  partial of h_mid), then, for the layer's last piece only, ``publish``:
  h_mid plus every MLP partial, the layer's output, sent on as a whole
  unit would send it;
- backward: ``mlp`` (its share of dL/dh_mid and its weight gradients),
  ``attention`` (its share of dL/dh), then, for the layer's first piece
  only, ``publish``: dL/dh, sent down.

Every holder of a stage's sections gets every attention partial and share
of the stage, so any of them can rebuild h_mid, and each sums the weight
gradients of all pieces before stepping its slices, in the order
`compute.train.backward_chain` sums them: the swarm's update is the local
decomposed one, bit for bit.

A job with R data-parallel replicas has R copies of every unit, one per
shard of the step's batch (`compute.data.batch(job, step, r, R)`); every
message is keyed by its replica too, and the update averages the replicas'
gradients (`compute.train.average_replicas`).

A node runs its phases of a step in one global order (`Phase.order`) in
which every phase comes after the phases it needs, so a node assigned
several pieces of one layer never waits on itself.

Each phase digests what it read and produced as it runs (`PhaseResult`);
after a unit's last phase, `StepPlan.certificate` builds its `UnitCert`
(specs/pol.md 3.3), whose `cert_hash` its receipt signs.
"""

from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch

from compute.blocks import (
    HALF_PARAMS, Partial, add_grads, aggregate_grads, aggregate_heads, aggregate_mlp,
    backward_block,
    forward_block, piece_of,
)
from compute.device import compute_class, pinned_threads
from compute.model import Transformer
from compute.train import (
    Sections, average_replicas, embed_backward, head_loss_block, stages,
)
from ledger.crypto import ZERO32
from proof_of_learning.errors import NoSuchPush
from proof_of_learning.units import named_digest, tensor_digest, tensors_digest
from proof_of_learning.phases import (
    HALF_OF, Key, Phase, PhaseResult, StepReplica, Tensors, input_name, message_tensor,
)
from proof_of_learning.kinds import (
    ACTIVATION, ATTN_PARTIAL, ATTN_SHARE, CLIENT, EMBED_GRADS, GRADIENT, HEAD_GRADS, MLP_PARTIAL,
    MLP_SHARE, SECTION_GRADS, WHATS,
)
from proof_of_learning.certificate import (
    NONE_BITS, UnitCert, cert_hash, check_cert, digests, float32_bits,
)

_FORWARD_RANK = {"whole": 0, "attention": 0, "mlp": 1, "publish": 2}
_BACKWARD_RANK = {"whole": 0, "mlp": 0, "attention": 1, "publish": 2}


class StepPlan:
    """A job's stages and its units' phases, over the node's model and sections.

    Args:
        model: the job's model (its weights are read when a phase runs).
        sections: `compute.train.make_sections` of that model and job.
        hidden: the (B, T, C) shape of the states between layers.
        replicas: the job's data-parallel replicas.
        threads: the job's intra-op thread count, which every phase runs at
            (`compute.device.pinned_threads`; None: the caller's).
    """

    def __init__(self, model: Transformer, sections: Sections, hidden: tuple[int, int, int],
                 replicas: int = 1, threads: int | None = None):
        self.model, self.m, self.hidden = model, sections.mlp_slices, hidden
        self.replicas, self.threads = replicas, threads
        self._seen_weights: dict[str, tuple] = {}  # name: (stamp, digest, copy): _keep_weight
        self.forward, self.backward = sections.forward, sections.backward
        self.k = len(self.forward)
        index = {spec: s for s, spec in enumerate(self.forward)}
        self.stages = [tuple(index[spec] for spec in stage)
                       for stage in stages(model, self.forward, mlp_slices=self.m)]
        self.stage_of = {s: i for i, stage in enumerate(self.stages) for s in stage}
        self.pieces = [piece_of(model, spec, self.m) for spec in self.forward]
        # Digests of the weights by name when the caller took them already (a verifier
        # checked them on arrival): `run` neither copies nor digests the weights then.
        self.weight_digests: dict[str, bytes] | None = None

    @property
    def n_units(self) -> int:
        """Units per step: every section's forward and backward, for every replica."""
        return 2 * self.k * self.replicas

    def has(self, s: int, half: str) -> bool:
        """Whether section ``s`` is a piece with that half."""
        piece = self.pieces[s]
        return piece is not None and half in piece.halves

    def unit_of(self, index: int) -> tuple[int, int, bool]:
        """(replica, section, forward) of unit ``index`` (replica r's units: forward 0..k-1,
        then backward k-1..0)."""
        r, u = divmod(index, 2 * self.k)
        return r, (u if u < self.k else 2 * self.k - 1 - u), u < self.k

    def unit_index(self, replica: int, section: int, forward: bool) -> int:
        """The inverse of `unit_of`."""
        return replica * 2 * self.k + (section if forward else 2 * self.k - 1 - section)

    def phases(self, index: int) -> list[Phase]:
        """Unit ``index``'s phases in the order it runs them."""
        r, s, forward = self.unit_of(index)
        i = self.stage_of[s]
        if self.pieces[s] is None:
            kinds = ["whole"]
        else:
            kinds = list(self.pieces[s].halves)
            if not forward:
                kinds.reverse()
            if s == (self.stages[i][-1] if forward else self.stages[i][0]):
                kinds.append("publish")
        rank = _FORWARD_RANK if forward else _BACKWARD_RANK
        return [Phase(index, r, s, forward, kind,
                      (0, i, rank[kind], r, s) if forward else (1, -i, rank[kind], r, -s),
                      n == len(kinds) - 1) for n, kind in enumerate(kinds)]

    # -- what a phase needs ---------------------------------------------------------

    def _keys(self, t: int, r: int, what: int, stage: tuple[int, ...], half: str) -> list[Key]:
        return [(t, r, what, x) for x in stage if self.has(x, half)]

    def needs(self, t: int, phase: Phase) -> list[Key]:
        """The pushed messages phase needs, in the order `run` reads them."""
        i, r = self.stage_of[phase.section], phase.replica
        stage = self.stages[i]
        keys = [] if i == 0 else [(t, r, ACTIVATION, stage[0])]  # stage 0: the embedded batch
        attn = self._keys(t, r, ATTN_PARTIAL, stage, "attention")
        if phase.forward:
            more = {"whole": [], "attention": [], "mlp": attn,
                    "publish": attn + self._keys(t, r, MLP_PARTIAL, stage, "mlp")}
            return keys + more[phase.kind]
        keys.append((t, r, GRADIENT, stage[0]))
        shares = self._keys(t, r, MLP_SHARE, stage, "mlp")
        more = {"whole": [], "mlp": attn, "attention": shares,
                "publish": shares + self._keys(t, r, ATTN_SHARE, stage, "attention")}
        return keys + more[phase.kind]

    def update_needs(self, t: int, r: int, held: Sequence[int]) -> list[Key]:
        """The messages of replica ``r`` that holding ``held`` needs for step ``t``'s update.

        Pieces of a stage: every share of the stage, MLP halves first, in
        section order (`compute.train.backward_chain` sums in that order).
        """
        keys: list[Key] = []
        for s in held:
            if self.pieces[s] is None:
                keys.append((t, r, SECTION_GRADS, s))
                continue
            stage = self.stages[self.stage_of[s]]
            for key in (self._keys(t, r, MLP_SHARE, stage, "mlp")
                        + self._keys(t, r, ATTN_SHARE, stage, "attention")):
                if key not in keys:
                    keys.append(key)
        return [(t, r, HEAD_GRADS, CLIENT)] + keys + [(t, r, EMBED_GRADS, CLIENT)]

    def update_grads(self, messages: Sequence[Sequence[Tensors]]) -> Tensors:
        """A step's update from each replica's `update_needs` messages, in that order.

        Each replica's weight gradients summed (a piece's share carries dL/dh,
        ``g``, too: not a weight's), then averaged over the replicas
        (`compute.train.average_replicas`): what every holder steps its
        sections with, and the join-time replay too, so they agree bit for bit.
        """
        per_replica = []
        for named_list in messages:
            grads: Tensors = {}
            for named in named_list:
                add_grads(grads, {n: v for n, v in named.items() if n != "g"})
            per_replica.append(grads)
        return average_replicas(per_replica)

    def producer(self, key: Key) -> int:
        """The index of the unit that pushes message ``key`` (only its assignee may)."""
        _, r, what, s = key
        last, i = len(self.stages) - 1, self.stage_of.get(s, 0)
        forward = lambda x: self.unit_index(r, x, True)  # noqa: E731
        backward = lambda x: self.unit_index(r, x, False)  # noqa: E731
        if what == ACTIVATION:  # the previous stage's forward publisher
            return forward(self.stages[i - 1][-1])
        if what in (HEAD_GRADS, GRADIENT) and (what == HEAD_GRADS or i == last):
            return forward(self.stages[last][-1])  # the last forward: the loss
        if what == GRADIENT:  # the next stage's backward publisher
            return backward(self.stages[i + 1][0])
        if what in (ATTN_PARTIAL, MLP_PARTIAL):
            return forward(s)
        return backward(self.stages[0][0] if what == EMBED_GRADS else s)  # grads, shares

    def expected(self, what: int, section: int) -> dict[str, tuple[int, ...]]:
        """Names and shapes a push of ``what`` for ``section`` must hold.

        Raises:
            NoSuchPush: no such push exists in this job.
        """
        name = WHATS[what] if what < len(WHATS) else f"kind {what}"
        firsts = {stage[0]: i for i, stage in enumerate(self.stages)}
        if what == ACTIVATION and firsts.get(section, 0) > 0:
            return {"h": self.hidden}
        if what == GRADIENT and section in firsts:
            return {"g": self.hidden}
        if what == SECTION_GRADS and section < self.k and self.pieces[section] is None:
            return {f"layers.{i}.{n}": tuple(p.shape)
                    for i in range(self.forward[section].layer_start,
                                   self.forward[section].layer_end)
                    for n, p in self.model.layers[i].named_parameters()}
        half = HALF_OF.get(what)
        if half is not None and section < self.k and self.has(section, half):
            if what in (ATTN_PARTIAL, MLP_PARTIAL):
                return {"h": self.hidden}
            layer = self.pieces[section].layer
            params = dict(self.model.layers[layer].named_parameters())
            return {"g": self.hidden, **{f"layers.{layer}.{n}": tuple(params[n].shape)
                                         for n in HALF_PARAMS[half]}}
        if what in (HEAD_GRADS, EMBED_GRADS) and section == CLIENT:
            shapes = {n: tuple(p.shape) for n, p in self.model.named_parameters()}
            head = "tok_emb.weight" if self.model.config.tie_embeddings else "lm_head.weight"
            names = ("norm.weight", head) if what == HEAD_GRADS else ("tok_emb.weight",)
            return {n: shapes[n] for n in names}
        raise NoSuchPush(f"a {name} push for section {section} does not fit this job")

    # -- running a phase (on the torch thread) ----------------------------------------

    def run(self, phase: Phase, t: int, inputs: dict[Key, Tensors], ids: torch.Tensor,
            targets: torch.Tensor) -> PhaseResult:
        """Compute one phase of step ``t`` from its `needs` (module docstring).

        Args:
            phase: the phase.
            t: the step.
            inputs: the messages of `needs`, by key.
            ids, targets: the phase's replica's shard of step t's batch.
        """
        with pinned_threads(self.threads) if self.threads else contextlib.nullcontext():
            return self._run(phase, t, inputs, ids, targets)

    def _run(self, phase: Phase, t: int, inputs: dict[Key, Tensors], ids: torch.Tensor,
             targets: torch.Tensor) -> PhaseResult:
        t = (t, phase.replica)  # the key prefix of every message of this phase
        i = self.stage_of[phase.section]
        stage = self.stages[i]
        if i == 0:
            with torch.no_grad():
                h = self.model.embed(ids)  # (B, T, C)
        else:
            h = inputs[(*t, ACTIVATION, stage[0])]["h"]
        r = PhaseResult(inp=h)
        read, known = self.read_weights(phase), self.weight_digests
        r.weights = {n: known[n] for n in read} if known is not None else {
            n: self._keep_weight(r, n, p) for n, p in read.items()}
        r.inputs = self._input_digests(r, phase, t, h, inputs)
        head = phase.forward and i == len(self.stages) - 1 and phase.kind in ("whole", "publish")
        if i == 0 or head:  # it embeds the batch, or takes the loss
            r.data = tensors_digest({"ids": ids, "targets": targets})
        if phase.forward:
            self._run_forward(r, phase, t, stage, h, inputs, targets)
        else:
            r.inp = g = inputs[(*t, GRADIENT, stage[0])]["g"]
            self._run_backward(r, phase, t, stage, h, g, inputs, ids)
        return r

    def _keep_weight(self, r: PhaseResult, name: str, p: torch.Tensor) -> bytes:
        """``r.keep(p)``, but a weight unchanged since a phase kept it is not copied and
        hashed again (a section's forward and backward read the same weights).

        Unchanged means the same storage at the same version: every write to a
        parameter (the update, averaging, a fetched state, a re-execution's
        load) is an in-place ``copy_`` on it or a view of it, which bumps the
        version its views share. Attack note: a write through ``p.data`` would
        not, and a stale digest would certify weights the unit did not read;
        `tests/proof_of_learning/test_step_plan.py` checks every writer.
        """
        stamp = (p._version, p.data_ptr(), tuple(p.shape), p.dtype)
        seen = self._seen_weights.get(name)
        if seen is not None and seen[0] == stamp:
            r.kept[seen[1]] = seen[2]
            return seen[1]
        digest = r.keep(p)
        self._seen_weights[name] = (stamp, digest, r.kept[digest])
        return digest

    def _input_digests(self, r: PhaseResult, phase: Phase, t: StepReplica, h: torch.Tensor,
                       inputs: dict[Key, Tensors]) -> dict[str, bytes]:
        """A phase's certificate inputs: ``h`` and every message it reads (specs/pol.md 3.2)."""
        named = {"h": r.keep(h)}  # a pushed activation is h itself
        for key in self.needs(t[0], phase):
            what = key[2]
            if what == GRADIENT:
                named["g"] = r.keep(inputs[key]["g"])
            elif what != ACTIVATION:
                named[input_name(what, key[3])] = r.keep(inputs[key][message_tensor(what)])
        return named

    def read_weights(self, phase: Phase) -> Tensors:
        """The parameters a phase reads at its step, by model name (specs/pol.md 3.3).

        The layers of its section, or of a piece its half's ("publish" reads
        no layer weights); `tok_emb.weight` in the first stage (it embeds
        the batch, or takes the embedding's gradient); the final norm and the
        head in the last stage's forward. A unit's `weights_hash` is the
        digest of the union over its phases.
        """
        spec, piece = self.forward[phase.section], self.pieces[phase.section]
        params = dict(self.model.named_parameters())
        if piece is None:
            names = [f"layers.{i}.{n}" for i in range(spec.layer_start, spec.layer_end)
                     for n, _ in self.model.layers[i].named_parameters()]
        elif phase.kind in ("attention", "mlp"):
            names = [f"layers.{piece.layer}.{n}" for n in HALF_PARAMS[phase.kind]]
        else:
            names = []
        i = self.stage_of[phase.section]
        if i == 0:
            names.append("tok_emb.weight")
        if phase.forward and i == len(self.stages) - 1:
            tied = self.model.config.tie_embeddings
            names += ["norm.weight", "tok_emb.weight" if tied else "lm_head.weight"]
        return {n: params[n] for n in names}

    def _partials(self, t: StepReplica, what: int, stage: tuple[int, ...], half: str,
                  inputs: dict[Key, Tensors]) -> list[Partial]:
        return [Partial(self.pieces[x].layer, half, *self.pieces[x].span(half),
                        inputs[(*t, what, x)]["h"]) for x in stage if self.has(x, half)]

    def _shares(self, t: StepReplica, what: int, stage: tuple[int, ...], half: str,
                inputs: dict[Key, Tensors]) -> list[torch.Tensor]:
        return [inputs[(*t, what, x)]["g"] for x in stage if self.has(x, half)]

    def _h_mid(self, t, stage, h, inputs) -> torch.Tensor:
        layer = self.pieces[stage[0]].layer
        return aggregate_heads(self.model, layer,
                               self._partials(t, ATTN_PARTIAL, stage, "attention", inputs), h)

    def _run_forward(self, r: PhaseResult, phase: Phase, t: StepReplica, stage, h, inputs, targets):
        s, spec = phase.section, self.forward[phase.section]
        if phase.kind == "whole":
            y = forward_block(self.model, spec, h)
            r.out["y"] = y
            self._publish_forward(r, t, stage, y, targets)
        elif phase.kind == "attention":
            r.out["attention"] = a = forward_block(self.model, spec, h, half="attention",
                                                   mlp_slices=self.m)
            r.outputs[input_name(ATTN_PARTIAL, s)] = r.keep(a)
            r.pushes.append((stage, (*t, ATTN_PARTIAL, s), {"h": a}))
        elif phase.kind == "mlp":
            h_mid = self._h_mid(t, stage, h, inputs)
            r.out["mlp"] = p = forward_block(self.model, spec, h_mid, half="mlp",
                                             mlp_slices=self.m)
            r.outputs[input_name(MLP_PARTIAL, s)] = r.keep(p)
            r.pushes.append(((stage[-1],), (*t, MLP_PARTIAL, s), {"h": p}))  # the publisher's
        else:
            h_mid = self._h_mid(t, stage, h, inputs)
            y = aggregate_mlp(self.model, self.pieces[s].layer,
                              self._partials(t, MLP_PARTIAL, stage, "mlp", inputs), h_mid,
                              mlp_slices=self.m)
            self._publish_forward(r, t, stage, y, targets)

    def _publish_forward(self, r: PhaseResult, t: StepReplica, stage, y: torch.Tensor,
                         targets) -> None:
        """The stage's output: to the next stage, or (the last) into the loss and its gradient."""
        r.outputs["y"] = r.keep(y)
        i = self.stage_of[stage[0]]
        if i + 1 < len(self.stages):
            nxt = self.stages[i + 1]
            r.pushes.append((nxt, (*t, ACTIVATION, nxt[0]), {"h": y}))
            return
        loss, g, head_grads = head_loss_block(self.model, y, targets)
        r.loss = loss.item()
        r.outputs["g"] = r.keep(g)
        r.produced(head_grads)
        r.pushes.append((stage, (*t, GRADIENT, stage[0]), {"g": g}))
        r.pushes.append((CLIENT, (*t, HEAD_GRADS, CLIENT), head_grads))

    def _run_backward(self, r: PhaseResult, phase: Phase, t: StepReplica, stage, h, g, inputs, ids):
        s, spec, m = phase.section, self.backward[phase.section], self.m
        if phase.kind == "whole":
            g_in, grads = backward_block(self.model, spec, h, g)
            r.out["y"] = g_in
            r.produced(grads)
            r.pushes.append(((s,), (*t, SECTION_GRADS, s), grads))
            self._publish_backward(r, t, stage, g_in, ids)
            return
        g_mid = None
        if phase.kind != "mlp":
            g_mid = aggregate_grads(g, self._shares(t, MLP_SHARE, stage, "mlp", inputs))
        if phase.kind == "publish":
            g_in = aggregate_grads(g_mid, self._shares(t, ATTN_SHARE, stage, "attention",
                                                       inputs))
            self._publish_backward(r, t, stage, g_in, ids)
            return
        if phase.kind == "mlp":
            share, grads = backward_block(self.model, spec, self._h_mid(t, stage, h, inputs), g,
                                          half="mlp", mlp_slices=m)
        else:
            share, grads = backward_block(self.model, spec, h, g_mid, half="attention",
                                          mlp_slices=m)
        r.out[phase.kind] = share
        r.produced(grads)
        what = MLP_SHARE if phase.kind == "mlp" else ATTN_SHARE
        r.outputs[input_name(what, s)] = r.keep(share)
        r.pushes.append((stage, (*t, what, s), {"g": share, **grads}))

    def _publish_backward(self, r: PhaseResult, t: StepReplica, stage, g_in: torch.Tensor,
                          ids) -> None:
        """dL/d(the stage's input): to the stage below, or (stage 0) into the embedding."""
        r.outputs["y"] = r.keep(g_in)
        i = self.stage_of[stage[0]]
        if i > 0:
            below = self.stages[i - 1]
            r.pushes.append((below, (*t, GRADIENT, below[0]), {"g": g_in}))
        else:
            grads = embed_backward(self.model, ids, g_in)
            r.produced(grads)
            r.pushes.append((CLIENT, (*t, EMBED_GRADS, CLIENT), grads))

    # -- the receipt ------------------------------------------------------------------

    def certificate(self, job_id: bytes, step: int, unit: bytes, index: int,
                    results: Sequence[PhaseResult]) -> UnitCert:
        """Unit ``index``'s `UnitCert` at ``step`` (specs/pol.md 3.3) from its phases' results.

        Args:
            job_id: the job's id.
            step: the step the unit ran.
            unit: its id, `ledger.types.unit_id` (job_id, step, the job's unit).
            index: the unit's index into the job's units.
            results: its phases' results.

        Raises:
            ValueError: two phases digested one name differently.
            MalformedCertificate: the certificate breaks specs/pol.md 3.4.
            Either is a bug here, never something a peer sent.
        """
        merged: dict[str, dict] = {"weights": {}, "inputs": {}, "outputs": {}, "grads": {},
                                   "squares": {}}
        for r in results:
            for what, into in merged.items():
                for name, value in getattr(r, what).items():
                    if into.setdefault(name, value) != value:
                        raise ValueError(f"unit {index}: two phases differ on {what} {name!r}")
        grads, squares = merged["grads"], merged["squares"]
        norm = math.sqrt(sum(squares[n] for n in sorted(squares)))  # float64, rounded once
        cert = UnitCert(
            job_id=job_id, unit_id=unit, step=step, index=index,
            weights_hash=named_digest(merged["weights"]),
            data_hash=next((r.data for r in results if r.data != ZERO32), ZERO32),
            inputs=digests(merged["inputs"]), outputs=digests(merged["outputs"]),
            grads_hash=named_digest(grads) if grads else ZERO32,
            loss_bits=float32_bits(next((r.loss for r in results if r.loss is not None), None)),
            grad_norm_bits=float32_bits(norm) if grads else NONE_BITS,
            device=self.compute_class())
        check_cert(cert)
        return cert

    def compute_class(self) -> str:
        """The compute class this plan's units run in (`compute.device.compute_class`)."""
        device = next(self.model.parameters()).device
        return compute_class(device, self.threads or torch.get_num_threads())

    def receipt_hashes(self, job_id: bytes, step: int, unit: bytes, index: int,
                       results: Sequence[PhaseResult], cert: UnitCert | None = None
                       ) -> tuple[bytes, bytes, bytes, bytes]:
        """(weights, input, output, certificate) hashes of a unit from its phases' results.

        Whole layers: the states (forward) or gradient (backward) taken and
        passed on, so neighbouring receipts chain (specs/ledger.md 5.2); a
        piece: what it took, its partials or shares by half, and (publisher)
        what the stage passed on. The certificate hash is `cert_hash` of
        `certificate` (arguments and errors as there), or of ``cert`` when
        the caller built it already.
        """
        cert = cert or self.certificate(job_id, step, unit, index, results)
        out: Tensors = {}
        for r in results:
            out.update(r.out)
        whole = self.pieces[self.unit_of(index)[1]] is None
        out_hash = tensor_digest(out["y"]) if whole else tensors_digest(out)
        return cert.weights_hash, tensor_digest(results[0].inp), out_hash, cert_hash(cert)
