"""node.mine.step_plan: a step's units run phase by phase equal the local decomposed step.

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
from node.errors import BadPush
from node.mine.devnet import devnet_job
from node.mine.step_plan import StepPlan
from node.wire.train import ACTIVATION, ATTN_SHARE, CLIENT, GRADIENT, MLP_PARTIAL


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
        with pytest.raises(BadPush):
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
    from node.mine.jobs import tensors_digest

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
        weights_hash = plan.receipt_hashes(index, [r for _, r in done])[0]
        # ...yet each receipt names the weights as its unit read them.
        assert weights_hash == tensors_digest({n: before[n] for n in read})
        phase = done[0][0]
        stage = plan.stage_of[phase.section]
        head = phase.forward and stage == last
        tied = model.config.tie_embeddings
        assert ("tok_emb.weight" in read) == (stage == 0 or (head and tied))
        assert ("norm.weight" in read) == head
        assert any(n.startswith("layers.") for n in read)
