"""A lying server loses its bond, end to end: caught, accused, re-run, slashed (issue 28 item 7).

Six registered servers on loopback, each a node in all but the CLI
(tests/wallet/paidkit.py): layers 0:10, four holders of 10:20, and 20:30.
The route's 10:20 server lies on decode steps and answers replays honestly.
A paying client checking every step, its prompt longer than a lane's credit
(so the checkers' replays pay ahead), catches it from the hops' own signed
steps (specs/network.md 9.5) and writes the evidence; another account's
`SpotFraud` of it goes on chain; the three verifiers the chain draws among the other 10:20 holders
re-run the steps on their own layers (`node.pol.SpotVoter`) and vote; the
case is upheld: the liar's bond is slashed and the accuser paid from it
(specs/ledger.md 5.2).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from ledger import spotrules
from ledger.records import SpotCase
from ledger.state import ACCOUNT, SPOT
from node.pol import SpotVoter
from tests.ledger.chainkit import balance
from tests.node.netkit import eventually, run
from tests.wallet.client.spotkit import attract, lie_on_decode
from tests.wallet.client.test_remote import parts  # noqa: F401 (fixture)
from tests.wallet.paidkit import paid_swarm
from tests.wallet.test_paid_limits import LONG
from wallet.accuse import read_evidence, spot_fraud
from wallet.client import InferRequest
from wallet.client.remote import ClientConfig, open_remote

SPANS = ((0, 10), (10, 20), (10, 20), (10, 20), (10, 20), (20, 30))
LIAR = 1


def test_a_server_caught_lying_is_slashed_on_chain_and_its_accuser_paid(
        tmp_path, gguf_reader, parts):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader, prices=(5,) * len(SPANS),
                                     spans=SPANS, users=2)
            liar = swarm.servers[LIAR]
            lied = lie_on_decode(liar.server)
            await attract(liar.server)
            holders = [s for k, s in enumerate(swarm.servers)
                       if s.span == (10, 20) and k != LIAR]
            voters = [SpotVoter(s.service, s.txs, s.node, lambda s=s: s.server.inference)
                      for s in holders]
            for s, voter in zip(holders, voters):  # each honest holder re-runs what it is drawn for
                s.nursery.start_soon(voter.run)
            config = ClientConfig(spot_check_rate=1.0, evidence_dir=str(tmp_path / "evidence"))
            payer = swarm.payer(swarm.net.users[0], max_price=10)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=config, payer=payer) as client:
                result = await client.generate(InferRequest(LONG, max_tokens=4))
            assert lied, "the liar was never routed through"
            caught = [m for m in result.spot_checks.mismatches
                      if m["loser"] == str(liar.host.peer_id)]
            assert caught and caught[0]["verified"] and caught[0]["evidence"]
            # The evidence file it wrote accuses it on chain (from another account here, so
            # that the accuser's balance moves by the case alone).
            user = swarm.net.users[1]
            evidence = read_evidence(caught[0]["evidence"])
            account = swarm.db.state.get(ACCOUNT + user.public)
            deposit = spotrules.MIN_SPOT_DEPOSIT * 3
            fraud, _ = spot_fraud(evidence, user, swarm.net.genesis.chain_id, account.nonce,
                                  deposit)
            bond_before = swarm.db.state.get(ACCOUNT + liar.wallet.public).bond
            user_before = balance(swarm.db, user.public)
            await swarm.servers[0].txs.submit(fraud)
            cid = spotrules.case_id(evidence.answers[evidence.loser])

            def case() -> SpotCase | None:
                return swarm.db.state.get(SPOT + cid)
            await eventually(lambda: case() is not None and case().status not in (
                spotrules.CASE_DUE, spotrules.CASE_OPEN), "the case judged", 90)
            judged = case()
            assert judged.status == spotrules.UPHELD, judged
            bond_after = swarm.db.state.get(ACCOUNT + liar.wallet.public).bond
            assert bond_after < bond_before  # slashed
            gained = balance(swarm.db, user.public) - user_before
            assert gained > 0  # the deposit back and a share of the slash
            assert sum(v.sent["disagrees"] for v in voters) >= 2  # re-run, a majority of 3
    run(main, deadline=240)
