"""Push routing on the server side: a session linked to the next hop's session.

Owns `PushRouting`, the part of `node.serve.sessions.InferenceServer` that
links a session to the next hop (``Link``: dial it, open
``/pnode/inference-push/2.0.0`` with the session's token) and serves the
steps the previous hop pushes into a session (specs/network.md 9.3a), and
sends the client a signed copy of each answer it pushed on (`StepCopy`,
9.5). A mixin: the server's sessions, limits and `_step` are the server's own.
"""

from __future__ import annotations

import logging

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from ledger.codec import decode, encode
from node.net import FrameEOF, FrameReader, FrameTimeout, write_frame
from node.serve.admission import SessionRefused
from node.wire import (
    MAX_INFERENCE_FRAME, PUSH_PROTOCOL, Link, Linked, PushOpen, Step, StepCopy, StepResult,
)

log = logging.getLogger(__name__)


class PushRouting:
    """Linking sessions to the next hop, and the pushed steps coming in (a mixin)."""

    async def _link(self, s, msg: Link) -> None:
        """Link (or, with an empty peer id, unlink) the session to the next hop's."""
        await self._unlink(s)
        if not msg.peer_id:
            return
        try:
            with trio.fail_after(self.config.link_timeout):
                peer = ID.from_base58(msg.peer_id)
                if peer not in self.host.connected_peers():
                    addrs = [a for a in msg.addrs if a.endswith(f"/p2p/{msg.peer_id}")]
                    if not addrs:
                        raise SessionRefused("no address of the next hop names it")
                    await self.host.connect(addrs[0])
                stream = await self.host.open_stream(peer, PUSH_PROTOCOL)
                await write_frame(stream, encode(PushOpen(msg.token)))
        except Exception as exc:  # unreachable, refused, bad id: the client stays in charge
            await self._reply(s.client, Linked(False, f"{type(exc).__name__}: {exc}"[:256]))
            return
        s.link = stream
        await self._reply(s.client, Linked(True, ""))

    async def _unlink(self, s) -> None:
        link, s.link = s.link, None
        if link is not None:
            with trio.move_on_after(2.0, shield=True):
                try:
                    await link.close()
                except Exception:  # a dead hop's stream: nothing to close
                    pass

    async def _copy(self, s, answer: StepResult) -> None:
        """Send the client the signed answer of a step already pushed on (`StepCopy`).

        After the push, so the next hop is already running it: the copy is
        off the route's critical path. It lets the client localise a wrong
        answer from what it holds, without asking the route's hops (9.5). A
        client that cannot take it ends its session anyway: nothing to undo.
        """
        try:
            await self._reply(s.client, StepCopy(answer.pos, answer.hidden, answer.signature))
        except Exception as exc:
            log.info("copy to the client failed: %s: %s", type(exc).__name__, exc)

    async def _serve_push(self, stream: INetStream, peer: ID) -> None:
        """The previous hop's outputs: steps of the session its token names."""
        reader = FrameReader(stream)
        try:
            first = await reader.read_frame(4096, timeout=self.config.idle_timeout)
        except (FrameEOF, FrameTimeout):
            return
        s = self._by_token.get(decode(first, PushOpen).token)
        if s is None:
            return  # a session that ended (or never was): nothing to push into
        with trio.CancelScope() as scope:  # the session's end ends this stream too
            s.pushes.append(scope)
            while s.id in self.sessions:
                try:
                    data = await reader.read_frame(MAX_INFERENCE_FRAME,
                                                   timeout=self.config.idle_timeout)
                except (FrameEOF, FrameTimeout):
                    return
                self.pushed_steps += 1
                if not await self._step(s, decode(data, Step)):
                    return

