"""proof_of_learning.step_plan: a step's units run phase by phase equal the local decomposed step.

No network here: one process plays every node, running all phases of a step
in `Phase.order` and delivering each push to an inbox, which checks the
plan's promises (every input exists before the phase that needs it; every
push has the names and shapes that receivers demand) and the result against
`compute.train.train_step_decomposed`.
"""

from __future__ import annotations

import pytest
import torch

from compute.blocks import add_grads
from compute.data import batch, load_corpus, make_model
from compute.train import average_replicas, make_sections, train_step_replicas
from proof_of_learning.errors import NoSuchPush
from node.mine.devnet import devnet_job
from proof_of_learning.step_plan import StepPlan
from proof_of_learning.units import named_digest
from node.wire.train import ACTIVATION, ATTN_SHARE, CLIENT, GRADIENT, MLP_PARTIAL

JOB, UNIT = b"j" * 32, b"u" * 32  # a job and unit id for certificates built outside a miner


def plan_for(k: int, device: str = "cpu", replicas: int = 1):
    config = devnet_job(2, 3, batch_size=2, seq_len=16, k=k, replicas=replicas)
    model = make_model(config).to(device)
    sections = make_sections(model, config)
    return config, model, sections, StepPlan(model, sections, (2, 16, config.model.dim),
                                             replicas)


def run_step(k: int, device: str = "cpu", replicas: int = 1):
    """Every phase of step 0 in `Phase.order`, then the update: (config, model, losses, grads)."""
    config, model, sections, plan = plan_for(k, device, replicas)
    corpus = load_corpus(config.data)
    shards = [[x.to(device) for x in batch(config, 0, r, replicas, corpus=corpus)]
              for r in range(replicas)]
    units = 2 * k * replicas
    phases = sorted((p for i in range(units) for p in plan.phases(i)), key=lambda p: p.order)
    assert sum(p.last for p in phases) == units  # one receipt per unit
    inbox, losses = {}, {}
    for phase in phases:
        needs = plan.needs(0, phase)
        assert all(key in inbox for key in needs), (phase, [n for n in needs if n not in inbox])
        result = plan.run(phase, 0, {key: inbox[key] for key in needs}, *shards[phase.replica])
        if result.loss is not None:
            losses[phase.replica] = result.loss
        for group, key, tensors in result.pushes:
            assert plan.producer(key) == phase.index  # whom a receiver takes this key from
            expect = plan.expected(key[2], key[3])
            assert {n: tuple(v.shape) for n, v in tensors.items()} == expect
            assert key[:2] == (0, phase.replica) and key not in inbox  # one message per key
            inbox[key] = tensors
    per_replica = []
    for r in range(replicas):
        grads = {}
        for key in plan.update_needs(0, r, range(k)):
            add_grads(grads, {n: v for n, v in inbox[key].items() if n != "g"})
        per_replica.append(grads)
    grads = average_replicas(per_replica)
    for opt in (*sections.optimizers, sections.client):
        opt.step(grads)
    return config, model, [losses[r] for r in range(replicas)], grads


@pytest.mark.parametrize("k, replicas", [(2, 1), (5, 1), (6, 1), (8, 1), (2, 3), (5, 2)])
def test_a_step_run_phase_by_phase_is_the_local_decomposed_step(k, replicas):
    config, model, losses, _ = run_step(k, replicas=replicas)
    reference = make_model(config)
    corpus = load_corpus(config.data)
    shards = [batch(config, 0, r, replicas, corpus=corpus) for r in range(replicas)]
    assert losses == train_step_replicas(reference, make_sections(reference, config), shards)
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(mine, theirs), name  # the same sums in the same order: bit for bit


def test_pushes_that_do_not_exist_in_the_job_are_refused():
    _, _, _, plan = plan_for(5)  # stages: (0, 1) pieces of layer 0, then 2, 3, 4 whole
    assert plan.stages == [(0, 1), (2,), (3,), (4,)]
    for what, section in [(ACTIVATION, 0), (ACTIVATION, 1), (GRADIENT, 1), (MLP_PARTIAL, 2),
                          (ATTN_SHARE, 1), (ACTIVATION, CLIENT), (99, 0)]:
        with pytest.raises(NoSuchPush):
            plan.expected(what, section)


def test_a_piece_with_both_halves_runs_attention_first_forward_and_last_backward():
    _, _, _, plan = plan_for(5)
    assert [p.kind for p in plan.phases(0)] == ["attention", "mlp"]
    assert [p.kind for p in plan.phases(1)] == ["mlp", "publish"]  # the layer's last piece
    assert [p.kind for p in plan.phases(9)] == ["mlp", "attention", "publish"]  # B0: first
    assert [p.kind for p in plan.phases(8)] == ["mlp"]
    assert [p.kind for p in plan.phases(2)] == ["whole"]


def assert_same_step(model, grads, ref_model, ref_grads) -> None:
    """One AdamW step on two devices agrees, up to float32 rounding, with the reference.

    The gradients must agree to rounding (1e-4 of each tensor's largest).
    AdamW's first step moves a weight by lr * g / (|g| + eps): lr times the
    sign of g where |g| is well above eps, but for a gradient at rounding
    level the step's size (and sign) follows g's last bits. Seen on an H200:
    the gradients agreed to 1.1e-6 of their scale, yet one weight of 90,112,
    whose gradient was 2e-7 of its tensor's largest, stepped 1.04e-4 apart.
    Every weight whose gradient stands clear of the rounding (above 1e-3 of
    the largest) must agree to 1e-5.
    """
    ref_params = dict(ref_model.named_parameters())
    assert grads.keys() == ref_grads.keys()
    for name, g_ref in ref_grads.items():
        g = grads[name].detach().cpu()
        scale = g_ref.abs().max()
        assert torch.allclose(g, g_ref, rtol=1e-3, atol=1e-4 * scale), name
        clear = g_ref.abs() > 1e-3 * scale
        w = dict(model.named_parameters())[name].detach().cpu()
        assert torch.allclose(w[clear], ref_params[name].detach()[clear], atol=1e-5), name


def test_the_cross_device_comparison_allows_rounding_and_catches_real_differences():
    config, model, _, grads = run_step(5)
    _, ref, _, ref_grads = run_step(5)
    assert_same_step(model, grads, ref, ref_grads)  # the same step, the same bits
    name = "layers.0.mlp.w_gate_up.weight"
    weight, g = dict(model.named_parameters())[name], grads[name]
    tiny = g.abs().argmin()
    with torch.no_grad():  # a rounding-level gradient of the other sign, and its step
        g.view(-1)[tiny] = -g.view(-1)[tiny] - 1e-12
        weight.view(-1)[tiny] += 2 * config.lr
    assert_same_step(model, grads, ref, ref_grads)
    with torch.no_grad():  # a real difference in a weight with a clear gradient
        weight.view(-1)[g.abs().argmax()] += 1e-3
    with pytest.raises(AssertionError):
        assert_same_step(model, grads, ref, ref_grads)
    g.view(-1)[g.abs().argmax()] *= 1.01  # a real difference in a gradient
    with torch.no_grad():
        weight.view(-1)[g.abs().argmax()] -= 1e-3
    with pytest.raises(AssertionError):
        assert_same_step(model, grads, ref, ref_grads)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_step_on_the_gpu_matches_the_cpu():
    """What `pnode start --gpu N` mines: the same phases with every tensor on the GPU."""
    _, on_gpu, gpu_losses, gpu_grads = run_step(5, "cuda:0")
    _, on_cpu, cpu_losses, cpu_grads = run_step(5)
    assert gpu_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert all(p.device.type == "cuda" for p in on_gpu.parameters())
    assert_same_step(on_gpu, gpu_grads, on_cpu, cpu_grads)




@pytest.mark.parametrize("k", [2, 6])
def test_weights_hash_names_what_each_unit_read_and_is_taken_before_the_update(k):
    """A unit's weights_hash is the digest of the union of its phases' read sets, as they ran."""
    from proof_of_learning.units import tensors_digest

    config, model, sections, plan = plan_for(k)
    corpus = load_corpus(config.data)
    ids, targets = batch(config, 0, 0, 1, corpus=corpus)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    phases = sorted((p for i in range(2 * k) for p in plan.phases(i)), key=lambda p: p.order)
    inbox, results = {}, {}
    for phase in phases:
        r = plan.run(phase, 0, {key: inbox[key] for key in plan.needs(0, phase)}, ids, targets)
        inbox.update({key: tensors for _, key, tensors in r.pushes})
        results.setdefault(phase.index, []).append((phase, r))
    for opt in (*sections.optimizers, sections.client):  # the weights move on...
        grads = {}
        for key in plan.update_needs(0, 0, range(k)):
            add_grads(grads, {n: v for n, v in inbox[key].items() if n != "g"})
        opt.step(grads)
    last = len(plan.stages) - 1
    for index, done in results.items():
        read = set().union(*(plan.read_weights(p) for p, _ in done))
        weights_hash = plan.receipt_hashes(JOB, 0, UNIT, index, [r for _, r in done])[0]
        # ...yet each receipt names the weights as its unit read them.
        assert weights_hash == tensors_digest({n: before[n] for n in read})
        phase = done[0][0]
        stage = plan.stage_of[phase.section]
        head = phase.forward and stage == last
        tied = model.config.tie_embeddings
        assert ("tok_emb.weight" in read) == (stage == 0 or (head and tied))
        assert ("norm.weight" in read) == head
        assert any(n.startswith("layers.") for n in read)


def certify_step(k: int, perturb: str | None = None):
    """Step 0 phase by phase: (plan, {index: [(phase, result)]}, loss, inbox).

    ``perturb``: a parameter nudged before the step.
    """
    torch.manual_seed(0)
    config, model, _, plan = plan_for(k)
    if perturb is not None:
        with torch.no_grad():
            dict(model.named_parameters())[perturb].view(-1)[0] += 1e-3
    ids, targets = batch(config, 0, 0, 1, corpus=load_corpus(config.data))
    phases = sorted((p for i in range(2 * k) for p in plan.phases(i)), key=lambda p: p.order)
    inbox, results, loss = {}, {}, None
    for phase in phases:
        r = plan.run(phase, 0, {key: inbox[key] for key in plan.needs(0, phase)}, ids, targets)
        inbox.update({key: tensors for _, key, tensors in r.pushes})
        results.setdefault(phase.index, []).append((phase, r))
        loss = r.loss if r.loss is not None else loss
    return plan, results, loss, inbox


def cert_hashes(k: int, perturb: str | None = None) -> list[bytes]:
    plan, results, _, _ = certify_step(k, perturb)
    return [plan.receipt_hashes(JOB, 0, UNIT, i, [r for _, r in results[i]])[3]
            for i in sorted(results)]


@pytest.mark.parametrize("k", [2, 6])
def test_every_unit_commits_a_well_formed_certificate_of_what_it_read_and_produced(k):
    """specs/pol.md 3.2-3.4: names, chaining digests, data, loss and gradients per unit."""
    from proof_of_learning.certificate import (
        NONE_BITS, check_cert, cert_hash, digest_map, float32_bits,
    )
    from ledger.crypto import ZERO32
    from proof_of_learning.units import tensor_digest, tensors_digest
    from node.wire.train import EMBED_GRADS, HEAD_GRADS, SECTION_GRADS, WHATS

    plan, results, loss, inbox = certify_step(k)
    last = len(plan.stages) - 1
    certs = {}
    for index, done in results.items():
        rs = [r for _, r in done]
        cert = plan.certificate(JOB, 0, UNIT, index, rs)
        check_cert(cert)
        hashes = plan.receipt_hashes(JOB, 0, UNIT, index, rs)
        assert hashes[0] == cert.weights_hash and hashes[3] == cert_hash(cert)
        assert (cert.job_id, cert.unit_id, cert.step, cert.index) == (JOB, UNIT, 0, index)
        certs[index] = (done, cert)
    producers = {}  # "W/s" -> the digest of the pushed tensor
    for index, (done, cert) in certs.items():
        for _, key, tensors in (p for _, r in done for p in r.pushes):
            if WHATS[key[2]] in ("attention partial", "MLP partial"):
                producers[f"{WHATS[key[2]]}/{key[3]}"] = tensor_digest(tensors["h"])
            elif WHATS[key[2]] in ("MLP share", "attention share"):
                producers[f"{WHATS[key[2]]}/{key[3]}"] = tensor_digest(tensors["g"])
    heads = 0
    for index, (done, cert) in certs.items():
        phase = done[0][0]
        stage = plan.stage_of[phase.section]
        inputs, outputs = digest_map(cert.inputs), digest_map(cert.outputs)
        # Partials and shares: a consumer's input is its producer's output, by name and digest.
        for name, digest in inputs.items():
            if "/" in name:
                assert producers[name] == digest, (index, name)
        for name, digest in outputs.items():
            if "/" in name:
                assert producers[name] == digest, (index, name)
        head = "g" in outputs
        heads += head
        if head:
            assert phase.forward and stage == last
            assert cert.loss_bits == float32_bits(loss) != NONE_BITS
        else:
            assert cert.loss_bits == NONE_BITS
        assert (cert.data_hash != ZERO32) == (stage == 0 or head)
        # grads_hash: every weight gradient the unit pushed, whatever the push.
        grads = {}
        for _, key, tensors in (p for _, r in done for p in r.pushes):
            if key[2] in (SECTION_GRADS, HEAD_GRADS, EMBED_GRADS) or WHATS[key[2]] in (
                    "MLP share", "attention share"):
                grads.update({n: v for n, v in tensors.items() if n != "g"})
        if grads:
            assert cert.grads_hash == tensors_digest(grads)
            norm = sum(float((v.double() ** 2).sum()) for _, v in sorted(grads.items())) ** 0.5
            assert cert.grad_norm_bits == float32_bits(norm)
        else:
            assert cert.grads_hash == ZERO32 and cert.grad_norm_bits == NONE_BITS
        # The receipt's input is the certificate's h (forward) or g (backward).
        assert hashes_input(plan, index, done) == inputs["h" if phase.forward else "g"]
    assert heads == 1  # one unit takes the loss
    # Stage 0's publishing backward commits the embedding's gradient.
    embed = [cert for done, cert in certs.values()
             if any(key[2] == EMBED_GRADS for _, r in done for _, key, _ in r.pushes)]
    assert len(embed) == 1 and embed[0].grads_hash != ZERO32


def hashes_input(plan, index, done) -> bytes:
    return plan.receipt_hashes(JOB, 0, UNIT, index, [r for _, r in done])[1]


@pytest.mark.parametrize("k", [2, 6])
def test_a_step_certifies_the_same_twice_and_differently_for_other_weights(k):
    """Re-execution reproduces every cert hash (what a verifier relies on); a nudge does not."""
    first = cert_hashes(k)
    assert cert_hashes(k) == first
    assert len(set(first)) == len(first)
    nudged = cert_hashes(k, perturb="layers.0.attn.wqkv.weight")
    assert all(a != b for a, b in zip(first, nudged))  # layer 0 moves every unit's numbers


def test_every_writer_of_the_weights_makes_a_unit_hash_them_again():
    """`StepPlan._keep_weight` hashes a weight again only when its version moved: every
    way this code base writes weights must move it (an update, averaging's and a fetched
    state's load, a re-execution's load), or a unit would certify weights it did not read."""
    from proof_of_learning.reexecute import Reexecutor
    from proof_of_learning.units import tensors_digest
    config, model, sections, plan = plan_for(2)
    ids, targets = batch(config, 0, 0, 1, corpus=load_corpus(config.data))
    phase = next(p for p in plan.phases(0))

    def weights_hash():
        r = plan.run(phase, 0, {}, ids, targets)
        truth = tensors_digest(dict(plan.read_weights(phase)))
        return named_digest(r.weights), truth

    cached, truth = weights_hash()
    assert cached == truth and weights_hash() == (truth, truth)  # unchanged: the same
    opt = sections.optimizers[0]
    grads = {n: torch.ones_like(p) for n, p in model.named_parameters()}
    for write in (lambda: opt.step(grads),
                  lambda: opt.load_weights({k: w + 1 for k, w in opt.weights().items()}),
                  lambda: opt.load_state(opt.state_dict() | {
                      k: w * 2 for k, w in opt.weights().items()})):
        write()
        cached, truth = weights_hash()
        assert cached == truth, "a writer the cache did not see"
    rx = Reexecutor(config)
    rx.plan.run(phase, 0, {}, ids, targets)  # its cache filled with the scratch weights
    params = dict(rx.model.named_parameters())
    rx._load(0, {n: params[n].detach() + 3 for n in rx.read_set(0)})
    r = rx.plan.run(phase, 0, {}, ids, targets)
    assert named_digest(r.weights) == tensors_digest(dict(rx.plan.read_weights(phase)))
