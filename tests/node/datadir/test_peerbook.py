"""The peer book on a real LevelDB: kept across reopening, bounded, malformed entries skipped."""

from __future__ import annotations

import pytest

from ledger.errors import StoreLockedError
from node.datadir import DataDir, PeerBook
from node.datadir.peerbook import PEER_PREFIX

A = "/ip4/127.0.0.1/tcp/4411/p2p/12D3KooWA"
B = "/ip4/127.0.0.1/tcp/4412/p2p/12D3KooWB"


def test_entries_survive_reopening_most_recent_first(tmp_path):
    book = PeerBook(tmp_path / "peers")
    book.record(A, 1_000)
    book.record(B, 2_000)
    book.record(A, 3_000)  # seen again: one entry, its time moves on
    book.close()
    again = PeerBook(tmp_path / "peers")
    try:
        assert again.entries() == {A: 3_000, B: 2_000}
        assert again.addrs() == [A, B]
    finally:
        again.close()


def test_the_book_is_bounded_and_drops_the_least_recently_seen(tmp_path):
    book = PeerBook(tmp_path / "peers", limit=3)
    addrs = [f"/ip4/10.0.0.{i}/tcp/4411/p2p/12D3KooW{i}" for i in range(5)]
    for i, addr in enumerate(addrs):
        book.record(addr, 100 + i)
    assert book.addrs() == addrs[:1:-1]  # the three seen last, newest first
    book.record(addrs[2], 999)  # refreshed: it stays, and nothing else goes
    assert set(book.addrs()) == set(addrs[2:]) and book.addrs()[0] == addrs[2]
    book.close()


def test_malformed_entries_are_skipped_then_dropped(tmp_path):
    book = PeerBook(tmp_path / "peers")
    book.record(A, 5)
    book.store.write([(PEER_PREFIX + b"\xff\xfe", (1).to_bytes(8, "big")),  # not UTF-8
                      (PEER_PREFIX + b"/ip4/1.2.3.4/tcp/1", (1).to_bytes(8, "big")),  # no /p2p/
                      (PEER_PREFIX + B.encode(), b"\x01\x02")])  # not 8 bytes
    assert book.entries() == {A: 5}
    book.record(B, 7)  # a write sweeps the malformed ones away
    assert len(list(book.store.iterate(PEER_PREFIX))) == 2
    assert book.addrs() == [B, A]
    book.close()


@pytest.mark.parametrize("bad", ["/ip4/1.2.3.4/tcp/1", "not an addr", A.rsplit("/", 1)[0] + "/"])
def test_recording_a_non_peer_address_is_refused(tmp_path, bad):
    book = PeerBook(tmp_path / "peers")
    with pytest.raises(ValueError):
        book.record(bad, 1)
    assert book.entries() == {}
    book.close()


def test_the_data_dir_keeps_it_in_d_peers_one_holder_at_a_time(tmp_path):
    d = DataDir(tmp_path)
    book = d.open_peer_book()
    book.record(A, 1)
    with pytest.raises(StoreLockedError):
        PeerBook(d.peers_dir)
    book.close()
    assert (tmp_path / "peers" / "CURRENT").exists()
    book = d.open_peer_book()
    assert book.addrs() == [A]
    book.close()
