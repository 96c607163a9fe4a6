"""node.phases: a step's units run phase by phase equal the local decomposed step.

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
from compute.train import make_sections, train_step_decomposed
from node.devnet import devnet_job
from node.errors import BadPush
from node.phases import StepPlan
from node.train_protocol import ACTIVATION, ATTN_SHARE, CLIENT, GRADIENT, MLP_PARTIAL


def plan_for(k: int, device: str = "cpu"):
    config = devnet_job(2, 3, batch_size=2, seq_len=16, k=k)
    model = make_model(config).to(device)
    sections = make_sections(model, config)
    return config, model, sections, StepPlan(model, sections, (2, 16, config.model.dim))


def run_step(k: int, device: str = "cpu"):
    """Every phase of step 0 in `Phase.order`, then the update: (model, sections, losses)."""
    config, model, sections, plan = plan_for(k, device)
    ids, targets = (x.to(device) for x in batch(config, 0, corpus=load_corpus(config.data)))
    phases = sorted((p for i in range(2 * k) for p in plan.phases(i)), key=lambda p: p.order)
    assert sum(p.last for p in phases) == 2 * k  # one receipt per unit
    inbox, losses = {}, []
    for phase in phases:
        needs = plan.needs(0, phase)
        assert all(key in inbox for key in needs), (phase, [n for n in needs if n not in inbox])
        result = plan.run(phase, 0, {key: inbox[key] for key in needs}, ids, targets)
        losses += [] if result.loss is None else [result.loss]
        for group, t, what, section, tensors in result.pushes:
            expect = plan.expected(what, section)
            assert {n: tuple(v.shape) for n, v in tensors.items()} == expect
            assert (t, what, section) not in inbox  # one message per key
            inbox[(t, what, section)] = tensors
    grads = {}
    for key in plan.update_needs(0, range(k)):
        add_grads(grads, {n: v for n, v in inbox[key].items() if n != "g"})
    for opt in (*sections.optimizers, sections.client):
        opt.step(grads)
    return config, model, losses


@pytest.mark.parametrize("k", [2, 5, 6, 8])
def test_a_step_run_phase_by_phase_is_the_local_decomposed_step(k):
    config, model, losses = run_step(k)
    reference = make_model(config)
    ids, targets = batch(config, 0, corpus=load_corpus(config.data))
    loss = train_step_decomposed(reference, make_sections(reference, config), ids, targets)
    assert losses == [loss]
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_step_on_the_gpu_matches_the_cpu():
    """What `pnode start --gpu N` mines: the same phases with every tensor on the GPU."""
    _, on_gpu, gpu_losses = run_step(5, "cuda:0")
    _, on_cpu, cpu_losses = run_step(5)
    assert gpu_losses == pytest.approx(cpu_losses, rel=1e-4)
    for (name, a), b in zip(on_gpu.named_parameters(), on_cpu.parameters()):
        assert a.device.type == "cuda"
        assert torch.allclose(a.cpu(), b, atol=1e-4), name
