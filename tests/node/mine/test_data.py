"""`/pnode/data/1.0.0` between real libp2p hosts on 127.0.0.1: a job's data file by its hash.

A file of several ranges arrives whole and checked; a peer without it, or
with other bytes under the name, is passed over; nobody having it is a
clear error; a malformed request is refused and scores the asker.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import trio

from node.errors import DataUnavailable
from node.mine import DataShelf, file_sha256
from node.net.host import open_host
from node.wire import DATA_PROTOCOL, MAX_DATA_CHUNK
from tests.node.netkit import eventually, ident, run


def test_a_file_of_several_ranges_comes_whole_from_the_peer_that_has_it(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_bytes(os.urandom(3 * MAX_DATA_CHUNK + 12345))
    sha = hashlib.sha256(text.read_bytes()).hexdigest()

    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b, \
                open_host(ident(3)) as empty:
            owner = DataShelf(tmp_path / "a", a)
            assert owner.add(text) == sha == file_sha256(owner.path(sha))
            owner.install()
            DataShelf(tmp_path / "e", empty).install()
            miner = DataShelf(tmp_path / "b", b)
            for peer in (a, empty):
                await b.connect(peer.addrs[0])
            got = await miner.fetch(sha, [empty.peer_id, a.peer_id])  # the empty one first
            assert got.read_bytes() == text.read_bytes() and miner.has(sha)
            assert owner.served == text.stat().st_size
            assert not list((tmp_path / "b").glob(".*"))  # no partial file left behind
    run(main, 60)


def test_other_bytes_under_the_name_are_refused_and_nobody_having_it_is_an_error(tmp_path):
    real = tmp_path / "real.txt"
    real.write_bytes(b"the real data " * 1000)
    sha = file_sha256(real)

    async def main():
        async with open_host(ident(1)) as liar, open_host(ident(2)) as b:
            shelf = DataShelf(tmp_path / "liar", liar)
            (tmp_path / "liar").mkdir()
            shelf.path(sha).write_bytes(b"something else " * 1000)  # a lie under the real name
            shelf.install()
            await b.connect(liar.addrs[0])
            miner = DataShelf(tmp_path / "b", b)
            with pytest.raises(DataUnavailable, match="no peer has the file"):
                await miner.fetch(sha, [liar.peer_id])
            assert not miner.has(sha) and not list((tmp_path / "b").glob("*"))
            with pytest.raises(ValueError, match="not a SHA-256"):
                miner.path("../../etc/passwd")
    run(main, 30)


def test_a_malformed_request_is_refused_and_marks_the_peer(tmp_path):
    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b:
            DataShelf(tmp_path / "a", a).install()
            await b.connect(a.addrs[0])
            with pytest.raises(Exception):
                await b.request(a.peer_id, DATA_PROTOCOL, b"\x93\x01\x02", timeout=5)
            await eventually(lambda: b.peer_id in a.misbehaving, "the asker to be marked")
    run(main, 30)


def test_a_kept_file_is_not_fetched_again(tmp_path):
    src = tmp_path / "x.txt"
    src.write_text("already here " * 100)

    async def main():
        shelf = DataShelf(tmp_path / "s")
        sha = shelf.add(src)
        assert await shelf.fetch(sha, []) == shelf.path(sha)  # no peer needed
    trio.run(main)


def test_a_jobs_initial_model_comes_by_its_hash_like_the_data(tmp_path):
    """A job may start from any GGUF by hash (an earlier job's export): a miner that lacks
    it fetches it from the submitter's shelf, and `compute.pretrained` then finds it. The
    bundled SmolLM2 and files already known need no fetch. (`model_file` maps a hash to a
    path; a file of random bytes stands for the GGUF here.)"""
    from compute.errors import ModelFileError
    from compute.pretrained import bundled_sha256, model_file

    tuned = tmp_path / "tuned.gguf"
    tuned.write_bytes(os.urandom(MAX_DATA_CHUNK + 99))
    sha = file_sha256(tuned)

    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b:
            owner = DataShelf(tmp_path / "a", a)
            owner.add(tuned)
            owner.install()
            miner = DataShelf(tmp_path / "b", b)
            bundled = await miner.resolve_model(bundled_sha256(), [])  # no peer asked
            assert bundled == model_file(bundled_sha256()) and not (tmp_path / "b").exists()
            with pytest.raises(ModelFileError):
                model_file(sha)
            with pytest.raises(DataUnavailable, match="no peer has the file"):
                await miner.resolve_model(sha, [])
            await b.connect(a.addrs[0])
            got = await miner.resolve_model(sha, [a.peer_id])
            assert got == miner.path(sha) == model_file(sha)
            assert got.read_bytes() == tuned.read_bytes()
            assert await miner.resolve_model(sha, []) == got  # known now: no peer needed
    run(main, 60)
