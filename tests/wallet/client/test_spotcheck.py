"""Spot checks (specs/network.md 9.5) over real hosts serving the real SmolLM2, and their rules.

A lying server serves its real layers but shifts outputs it answers (after
the forward, before it signs): a fault no honest server makes, so it is made
by wrapping that server's `_forward` (tests/wallet/client/spotkit.py).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace

import pytest
import torch

from compute.wiretensor import decode_tensor
from node.wire import ServerInfo
from tests.node.netkit import run
from tests.wallet.client.spotkit import attract, lie, lie_on_decode
from tests.wallet.client.test_remote import PROMPT, local_tokens, parts, swarm  # noqa: F401 (fixtures)
from wallet.client import InferRequest
from wallet.client.remote import ClientConfig, open_remote
from wallet.client.route import cap_throughput, plan_route
from node.wire import check_evidence, history_of
from wallet.client.spotrules import TOLERANCE, agree, load_evidence


@pytest.mark.parametrize("push", (True, False))
def test_a_lying_server_is_caught_at_the_first_step_settled_excluded_and_replaced(
        gguf_reader, parts, local_tokens, tmp_path, push):  # noqa: F811
    """A, L, C route; L lies. The first step's check disagrees, L's replay loses to H1
    and H2 (two of three), L is banned and replaced, and the tokens are the local ones."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (10, 20), (10, 20)]
            hosts, servers = await swarm(stack, gguf_reader, spans)
            liar = str(hosts[1].peer_id)
            lie(servers[1])
            await attract(servers[1])
            config = ClientConfig(push=push, spot_check_seed=1, evidence_dir=str(tmp_path))
            async with open_remote([hosts[0].addrs[0]], parts, config=config) as client:
                await client.refresh()
                assert [h.peer_id for h in client.directory.plan(0, 30)][1] == liar
                result = await client.generate(InferRequest(PROMPT, max_tokens=8))
                banned = set(client.directory.banned)
                # The ban outlives the generation: the next one does not route through L.
                again = await client.generate(InferRequest(PROMPT, max_tokens=2))
            assert result.token_ids == local_tokens(8)
            checks = result.spot_checks
            assert checks.run >= 1 and len(checks.mismatches) == 1
            m = checks.mismatches[0]
            assert (m["pos"], m["layers"], m["peer_id"], m["loser"]) == (0, [10, 20], liar, liar)
            assert {m["checker"], m["third"]} == {str(hosts[3].peer_id), str(hosts[4].peer_id)}
            assert m["verified"] and banned == {liar}
            assert [s.failed for s in result.route if s.peer_id == liar] == [True]
            assert liar not in {s.peer_id for s in again.route}
            assert again.spot_checks.mismatches == []
            # The evidence: the same input, three signed answers, the liar's rejected.
            evidence = load_evidence(m["evidence"])
            assert evidence.verified() and evidence.loser == 0
            assert evidence.answers[0].public_key == servers[1].identity.public_key
            outs = [decode_tensor(a.hidden) for a in evidence.answers]
            assert agree(outs[1], outs[2]) and not agree(outs[0], outs[1])
            forged = replace(evidence.answers[0], hidden=evidence.answers[1].hidden)
            assert not forged.verified()  # the liar cannot disown its answer
    run(main, deadline=180)


@pytest.mark.parametrize("push", (True, False))
def test_a_liar_honest_on_replays_is_caught_from_its_own_signed_answers(
        gguf_reader, parts, local_tokens, smol_tokenizer, tmp_path, push):  # noqa: F811
    """A, L, C route; L lies on every decode step but answers prompts and replays
    honestly. Every step is checked: the first decode step's check disagrees, and L is
    judged on the very steps it ran (from the client's log, L never asked again): H1
    and H2 run them and outvote it. L is banned, the evidence holds L's signed answer
    after the history its claim names, and the tokens are the local ones."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (10, 20), (10, 20)]
            hosts, servers = await swarm(stack, gguf_reader, spans)
            liar = str(hosts[1].peer_id)
            lied = lie_on_decode(servers[1])
            await attract(servers[1])
            config = ClientConfig(push=push, spot_check_rate=1.0, spot_check_seed=1,
                                  evidence_dir=str(tmp_path))
            async with open_remote([hosts[0].addrs[0]], parts, config=config) as client:
                await client.refresh()
                assert [h.peer_id for h in client.directory.plan(0, 30)][1] == liar
                result = await client.generate(InferRequest(PROMPT, max_tokens=4))
                banned = set(client.directory.banned)
            prompt = len(smol_tokenizer.encode_chat([{"role": "user", "content": PROMPT}]))
            assert lied == [prompt]  # it lied once; replays and checkers got honest answers
            assert result.token_ids == local_tokens(4)
            [m] = result.spot_checks.mismatches
            assert (m["pos"], m["layers"], m["peer_id"], m["loser"]) == (prompt, [10, 20],
                                                                          liar, liar)
            assert m["verified"] and banned == {liar}
            assert [s.failed for s in result.route if s.peer_id == liar] == [True]
            evidence = load_evidence(m["evidence"])
            assert check_evidence(evidence) is None and evidence.loser == 0
            assert [s.pos for s in evidence.steps] == [0, prompt]
            assert evidence.answers[0].public_key == servers[1].identity.public_key
            assert {a.claim.history for a in evidence.answers} == {history_of(evidence.steps)}
            outs = [decode_tensor(a.hidden) for a in evidence.answers]
            assert agree(outs[1], outs[2]) and not agree(outs[0], outs[1])
            # Another history under the same signed answer does not hold.
            assert check_evidence(replace(evidence, steps=evidence.steps[1:])) is not None
    run(main, deadline=180)


def test_a_hop_that_withholds_its_copies_is_settled_by_the_replay_fallback(
        gguf_reader, parts, local_tokens, tmp_path):  # noqa: F811
    """Linked L lies on every step and sends no `StepCopy`: its log (and C's inputs) are
    incomplete, so the client falls back to replaying the route hop by hop, where L's
    lie shows against H1 and H2; the evidence is the replay, one step."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (10, 20), (10, 20)]
            hosts, servers = await swarm(stack, gguf_reader, spans)
            liar = str(hosts[1].peer_id)
            lie(servers[1])

            async def withhold(s, answer):
                pass
            servers[1].inference._copy = withhold
            await attract(servers[1])
            config = ClientConfig(push=True, spot_check_seed=1, evidence_dir=str(tmp_path))
            async with open_remote([hosts[0].addrs[0]], parts, config=config) as client:
                await client.refresh()
                result = await client.generate(InferRequest(PROMPT, max_tokens=3))
                assert set(client.directory.banned) == {liar}
            assert result.token_ids == local_tokens(3)
            [m] = result.spot_checks.mismatches
            assert (m["pos"], m["loser"], m["verified"]) == (0, liar, True)
            evidence = load_evidence(m["evidence"])
            assert [s.pos for s in evidence.steps] == [0] and evidence.loser == 0
    run(main, deadline=180)


@pytest.mark.parametrize("push", (True, False))
def test_a_check_covers_every_earlier_step(gguf_reader, parts, smol_tokenizer, push):  # noqa: F811
    """L lies at the first decode step only, which the draw does not check (seed 1 at
    rate 0.5 checks steps 0 and 3): step 3's check compares every row the route
    answered, so the old lie is found, and L is judged on its logged answer there."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (10, 20), (10, 20)]
            hosts, servers = await swarm(stack, gguf_reader, spans)
            liar = str(hosts[1].peer_id)
            prompt = len(smol_tokenizer.encode_chat([{"role": "user", "content": PROMPT}]))
            lied = lie_on_decode(servers[1], only={prompt})
            await attract(servers[1])
            config = ClientConfig(push=push, spot_check_rate=0.5, spot_check_seed=1)
            async with open_remote([hosts[0].addrs[0]], parts, config=config) as client:
                await client.refresh()
                result = await client.generate(InferRequest(PROMPT, max_tokens=4))
                banned = set(client.directory.banned)
            assert lied == [prompt] and result.spot_checks.run == 2
            [m] = result.spot_checks.mismatches
            assert (m["pos"], m["loser"], m["verified"]) == (prompt, liar, True)
            assert banned == {liar}
    run(main, deadline=180)


def test_honest_servers_agree_at_every_step_and_rate_0_checks_nothing(
        gguf_reader, parts, local_tokens):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            hosts, _ = await swarm(stack, gguf_reader, [(0, 15), (15, 30), (0, 30)])
            entry = hosts[0].addrs[0]
            # Client-driven, so every hop's decode steps are timed whichever route is cheapest.
            async with open_remote([entry], parts, config=ClientConfig(
                    spot_check_rate=1.0, push=False)) as client:
                every = await client.generate(InferRequest(PROMPT, max_tokens=8))
                timed = {peer for peer, times in client.directory.step_times.items() if times}
            async with open_remote([entry], parts,
                                   config=ClientConfig(spot_check_rate=0.0)) as client:
                none = await client.generate(InferRequest(PROMPT, max_tokens=8))
            assert every.token_ids == none.token_ids == local_tokens(8)
            assert every.spot_checks.run == len(every.token_ids)
            assert every.spot_checks.mismatches == [] and every.spot_checks.skipped == 0
            assert none.spot_checks.as_json() == {"run": 0, "skipped": 0, "mismatches": []}
            # Checkers are not part of the route (it covers the layers once, in order:
            # which servers it takes may differ between runs, their speeds are measured);
            # a client-driven hop's steps were timed.
            for route in (every.route, none.route):
                spans = [(s.start, s.end) for s in route]
                assert spans[0][0] == 0 and spans[-1][1] == 30
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert timed == {s.peer_id for s in every.route}
    run(main, deadline=150)


def test_the_draw_is_the_first_step_and_a_seeded_share():
    import random

    from wallet.client.spotcheck import SpotChecker

    class Run:  # what SpotChecker reads of a RouteRun at construction
        config = ClientConfig(spot_check_rate=0.25)

    def drawn(seed: int) -> list[int]:
        checker = SpotChecker(Run(), random.Random(seed), None)
        return [step for step in range(400) if checker.wants(step)]
    a, b = drawn(7), drawn(7)
    assert a == b and a[0] == 0 and 60 < len(a) < 140
    assert drawn(8) != a
    Run.config = ClientConfig(spot_check_rate=0.0)
    assert drawn(7) == []


def test_agreement_is_per_row_within_the_codecs_tolerance():
    torch.manual_seed(0)
    a = torch.randn(1, 5, 576) * 10
    a[..., 7] = 5000.0  # an outlier channel, as SmolLM2's hidden states have
    assert agree(a, a.clone())
    row_max = a.abs().amax(dim=-1, keepdim=True)
    assert agree(a, a + 0.5 * TOLERANCE["raw"] * row_max)
    assert not agree(a, a + 2 * TOLERANCE["raw"] * row_max)
    assert agree(a, a + 2 * TOLERANCE["raw"] * row_max, "fp16")
    one_row = a.clone()
    one_row[0, 3] += 0.01 * row_max[0, 3]
    assert not agree(a, one_row)
    nan = a.clone()
    nan[0, 0, 0] = float("nan")
    assert not agree(a, nan) and not agree(a, a[:, :4])


def test_a_server_announcing_a_huge_throughput_stops_attracting_routes_once_measured():
    fast_liar = ServerInfo("L", 0, 30, 1e9)
    honest = ServerInfo("H", 0, 30, 20.0)
    assert plan_route([fast_liar, honest], 0, 30)[0].peer_id == "L"
    # The client timed L: 5 tokens/s through its 30 layers.
    capped = cap_throughput([fast_liar, honest], {"L": 5.0})
    assert [s.throughput for s in capped] == [5.0, 20.0]
    assert plan_route(capped, 0, 30)[0].peer_id == "H"
    # Measuring never raises an announcement, and nonsense figures are ignored.
    assert cap_throughput([honest], {"H": 1e9})[0].throughput == 20.0
    assert cap_throughput([honest], {"H": float("nan")})[0].throughput == 20.0
    assert cap_throughput([honest], {"H": 0.0})[0].throughput == 20.0


def test_the_directory_measures_step_times_net_of_the_round_trip():
    from wallet.client.directory import SwarmDirectory

    directory = SwarmDirectory(None, "m")
    directory.rtt["L"] = 0.01
    directory.servers = lambda: [ServerInfo("L", 0, 30, 1e9), ServerInfo("H", 0, 30, 20.0)]
    for seconds in (0.21, 0.23, 0.22):  # 0.2 s of compute for 30 layers: 5 tokens/s
        directory.record_step("L", 30, seconds)
    assert directory.measured()["L"] == pytest.approx(1 / 0.21, rel=1e-6)
    assert directory.throughput("L") == pytest.approx(1 / 0.21, rel=1e-6)
    assert directory.throughput("H") == 20.0
    assert [h.peer_id for h in directory.plan(0, 30)] == ["H"]
