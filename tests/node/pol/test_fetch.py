"""node.pol.fetch over real libp2p hosts on 127.0.0.1: served, checked, refused.

A worker's archive (tests/node/pol/polkit.py) is served by one host; another
fetches its certificate, tensors and named sets by hash. A liar that serves
other bytes under a hash is passed over for the next peer and named in
``bad``; a malformed request resets the stream and marks its sender.
"""

from __future__ import annotations

import torch

from ledger.codec import encode
from ledger.types import tx_hash
from node.net import RequestError
from node.pol.archive import AUDITED_KEEP_STEPS, PolArchive, state_key
from node.pol.fetch import PolFetcher, serve_pol
from node.wire import CLIENT, MAX_POL_REQUEST, POL_PROTOCOL, PolRequest
from proof_of_learning.certificate import cert_hash, decode_cert, digest_map
from tests.node.netkit import eventually, ident, run
from node.net.host import open_host
from tests.node.pol.polkit import JOB, make_worker, run_step


def worker_archive():
    w = make_worker(2)
    run_step(w, 0)
    w.archive.keep_state(JOB, 1, CLIENT, w.replayer.part_state(CLIENT))  # a checkpoint at step 1
    return w, w.receipts[(0, 2)]  # a backward unit: inputs h and g, weight gradients


class Liar(PolArchive):
    """Answers every digest of an honest archive with other tensors, every hash with junk."""

    def __init__(self, honest: PolArchive, receipt):
        super().__init__()
        self.honest, self.cert = honest, receipt.cert_hash

    def encoded(self, key):
        return b"\x00junk" if key == self.cert else None

    def tensor(self, digest):
        return torch.ones(3) if self.honest.tensor(digest) is not None else None

    def named(self, key):
        kept = self.honest.named(key)
        return None if kept is None else {n: torch.zeros(2) for n in kept}

    def state(self, key):
        return {} if self.honest.state(key) is not None else None  # a state of nothing


def test_a_verifier_fetches_what_the_worker_kept_and_skips_a_liar():
    w, receipt = worker_archive()
    cert = decode_cert(w.archive.encoded(receipt.cert_hash))

    async def main():
        async with open_host(ident(1)) as worker, open_host(ident(2)) as liar, \
                open_host(ident(3)) as verifier:
            worker.set_request_handler(POL_PROTOCOL, serve_pol(w.archive),
                                       max_request_size=MAX_POL_REQUEST)
            liar.set_request_handler(POL_PROTOCOL, serve_pol(Liar(w.archive, receipt)),
                                     max_request_size=MAX_POL_REQUEST)
            await verifier.connect(worker.addrs[0])
            await verifier.connect(liar.addrs[0])
            fetcher = PolFetcher(verifier, wait_s=5)
            peers = [str(liar.peer_id), str(worker.peer_id)]  # the liar first
            raw = await fetcher.cert_bytes(peers, JOB, receipt.cert_hash)
            assert raw is not None and cert_hash(decode_cert(raw)) == receipt.cert_hash
            weights, _ = await fetcher.named(peers, JOB, cert.weights_hash)
            assert weights.keys() == w.archive.named(cert.weights_hash).keys()
            for name, digest in digest_map(cert.inputs).items():
                t = await fetcher.tensor(peers, JOB, digest)
                assert t is not None and torch.equal(t, w.archive.tensor(digest)), name
            grads, digests = await fetcher.named(peers, JOB, cert.grads_hash)
            kept = w.archive.named(cert.grads_hash)
            assert grads.keys() == kept.keys() == digests.keys()
            assert all(torch.equal(grads[n], kept[n]) for n in grads)
            state = await fetcher.state(peers, JOB, 1, CLIENT)
            kept = w.archive.state(state_key(JOB, 1, CLIENT))
            assert state.keys() == kept.keys() and all(torch.equal(state[n], kept[n])
                                                       for n in state)
            assert await fetcher.state(peers, JOB, 2, CLIENT) is None  # no checkpoint there
            assert set(fetcher.bad) == {str(liar.peer_id)}
            assert "state" in fetcher.bad[str(liar.peer_id)]
            # Nobody has it: None, which the judge turns into UNAVAILABLE.
            assert await fetcher.tensor([str(worker.peer_id)], JOB, b"\x07" * 32) is None
    run(main, deadline=60)


def test_a_malformed_request_resets_the_stream_and_marks_the_sender():
    async def main():
        async with open_host(ident(4)) as server, open_host(ident(5)) as client:
            server.set_request_handler(POL_PROTOCOL, serve_pol(PolArchive()),
                                       max_request_size=MAX_POL_REQUEST)
            await client.connect(server.addrs[0])
            for junk in (b"\x01\x02", encode(PolRequest(9, JOB, bytes(32)))):  # unknown kind
                try:
                    await client.request(server.peer_id, POL_PROTOCOL, junk, timeout=5)
                    raise AssertionError("a malformed request was answered")
                except RequestError:
                    pass
            await eventually(lambda: server.misbehaving.get(client.peer_id, 0) >= 2,
                             "the sender marked twice")
    run(main, deadline=30)


def test_pruning_forgets_by_step_but_keeps_the_weight_ring():
    w, receipt = worker_archive()
    a = w.archive
    assert a.receipts() == {tx_hash(r): 0 for r in w.receipts.values()}
    params = dict(w.model.named_parameters())
    a.keep_version(0, params)
    digests = a.version_digests(0)  # equal tensors (the norms' ones) share one digest
    assert digests.keys() == params.keys()
    assert all(torch.equal(a.tensor(digests[n]), params[n]) for n in params)
    ring = {"tok_emb.weight": a.tensor(digests["tok_emb.weight"])}
    a.forget(set(a.receipts()), step_now=a.keep_steps)  # step 0 is still among the last ones
    assert a.encoded(receipt.cert_hash) is not None and len(a.receipts()) == 4
    a.forget(set(), step_now=a.keep_steps + 1)  # not done: kept whatever its age
    assert len(a.receipts()) == 4
    audited = tx_hash(receipt)
    a.mark_audited({audited})  # drawn for an audit: kept much longer (a dispute's evidence)
    a.forget(set(a.receipts()), step_now=a.keep_steps + 1)
    assert a.receipts() == {audited: 0} and a.encoded(receipt.cert_hash) is not None
    a.forget({audited}, step_now=AUDITED_KEEP_STEPS + 1)
    assert a.receipts() == {} and a.encoded(receipt.cert_hash) is None
    assert torch.equal(a.tensor(a.version_digests(0)["tok_emb.weight"]), ring["tok_emb.weight"])
    for v in range(1, 20):  # the ring keeps the newest RING versions
        a.keep_version(v, dict(w.model.named_parameters()))
    assert a.versions() == list(range(20 - a.ring, 20))
