"""An inference server's forward calls: a step checked, run in fair turns, metered.

Owns `ForwardCalls`, the part of `node.serve.sessions.InferenceServer` that
turns a session's `Step` into forward calls on the process's one torch
thread (specs/network.md 9.3): the step's checks against the session
(`_check_step`), its chunks (or a free session's pieces, `_piece`) each
one turn of the fair queue (`_forward`), and the compute each call used,
metered per session, per client and for the server (`_charge`). A mixin:
the sessions, scheduler and model are the server's own.
"""

from __future__ import annotations

import logging
import time

import torch

from compute.wiretensor import TooManyElements, WireTensorError, decode_tensor, encode_tensor
from node import torch_thread
from node.serve.admission import Meter, SessionRefused
from node.torch_thread import tensor_work
from node.wire import Step

log = logging.getLogger(__name__)

#: Most client peer ids whose compute `InferenceServer.usage` keeps (the lightest go first).
_MAX_PEERS_METERED = 1024


class ForwardCalls:
    """A session's steps as forward calls on the torch thread (a mixin)."""

    async def _check_step(self, step: Step, s) -> torch.Tensor:
        """The step's hidden states, checked against the session. Raises SessionRefused."""
        if step.pos > s.cache.length:
            # A step may restart earlier positions (pos < length: roll back) but never skip.
            raise SessionRefused(f"step at position {step.pos}, the session holds "
                                 f"{s.cache.length}")
        dim = self.model.config.dim
        room = s.cache.max_len - step.pos
        try:  # never decode more than the budget can take (int8 expands 4x)
            hidden = await tensor_work(decode_tensor, step.hidden, max(room, 1) * dim,
                                       rows=len(step.hidden) // (dim * 4))
        except TooManyElements as exc:
            raise SessionRefused(f"step past the session budget of {s.cache.max_len} "
                                 f"positions: {exc}") from None
        except WireTensorError as exc:
            raise SessionRefused(f"bad hidden states: {exc}") from None
        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[2] != dim \
                or hidden.shape[1] == 0:
            raise SessionRefused(f"expected hidden states (1, T>0, {dim}), "
                                 f"got {tuple(hidden.shape)}")
        t = hidden.shape[1]
        if step.chunks and sum(step.chunks) != t:
            raise SessionRefused(f"chunks sum to {sum(step.chunks)}, the step has {t} positions")
        cap = self.config.max_chunk_positions
        if max(step.chunks or (t,)) > cap:
            # One forward call holds the compute thread: its length is what the cap bounds.
            raise SessionRefused(f"a forward call of {max(step.chunks or (t,))} positions "
                                 f"exceeds this server's cap of {cap} positions per call "
                                 f"(max_chunk_positions): split the step into chunks")
        if t > room:
            raise SessionRefused(f"step to position {step.pos + t} exceeds the session budget "
                                 f"of {s.cache.max_len}")
        return hidden.to(torch.float32)

    async def _forward(self, s, step: Step, hidden: torch.Tensor) -> bytes:
        """Run the session's layers on the step, one forward call per chunk (or piece).

        Each call is its own job on the torch thread, in its turn in the
        fair queue, so a long replay (many chunks) takes turns with the
        other sessions' decode steps instead of holding the server for its
        whole length. A free session's chunk is run in pieces of at most
        ``free_call_positions`` while another client has a session open
        (`_piece`): the longest a decode step then waits behind it.

        Raises:
            SessionRefused: the forward call failed (out of memory, a device
                error), or the session was reclaimed (a pushed step into it).
        """
        outs, pos = [], step.pos
        for n in step.chunks or (hidden.shape[1],):
            end = pos + n
            while pos < end:
                if s.reclaimed:
                    raise SessionRefused(s.reclaimed)
                try:
                    async with self.scheduler.turn(s.meter, s.flow):  # one call at a time
                        k = self._piece(s, end - pos)  # decided with the turn: who is here now
                        chunk = hidden[:, pos - step.pos: pos - step.pos + k]
                        out, seconds = await torch_thread.run_sync(
                            self._timed, s, chunk, pos, priority=s.meter.priority)
                        self._charge(s, k, seconds)
                    outs.append(out)
                except Exception as exc:  # the server's fault, not the client's: no score
                    log.warning("forward failed in a session of %s: %s: %s", s.peer,
                                type(exc).__name__, exc)
                    raise SessionRefused(f"forward failed: {type(exc).__name__}: "
                                         f"{exc}") from None
                pos += k
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return await tensor_work(encode_tensor, out, s.codec, rows=out.shape[1])

    def _piece(self, s, positions: int) -> int:
        """How many of a call's ``positions`` to run in this turn.

        All of them for a paid session, or when no other client has a
        session open (a lone client's calls are the ones it sent, so its
        outputs are bit for bit those of the chunks it chose); else at
        most ``free_call_positions``: pieces of one chunk agree with the
        whole call within the spot checks' tolerance, not bit for bit.
        """
        cap = self.config.free_call_positions
        if s.paid or positions <= cap:
            return positions
        if all(o.flow_key == s.flow_key or o.reclaimed for o in self.sessions.values()):
            return positions
        return cap

    def _charge(self, s, positions: int = 0, seconds: float = 0.0,
                steps: int = 0) -> None:
        """Meter a forward call (or a step): the session's, its client's and the server's."""
        usage = self.usage.get(s.account)
        if usage is None:
            if len(self.usage) >= _MAX_PEERS_METERED:  # keep the heavy ones visible
                del self.usage[min(self.usage, key=lambda p: self.usage[p].forward_s)]
            usage = self.usage[s.account] = Meter()
        for meter in (s.meter, usage, self.compute, *([s.flow] if s.flow else [])):
            meter.add(positions, seconds, steps)

    def _timed(self, s, chunk: torch.Tensor, pos: int) -> tuple[torch.Tensor, float]:
        """`_run` and its seconds (on the torch thread: the wait in its queue is not counted)."""
        began = time.perf_counter()
        out = self._run(s, chunk, pos)
        return out, time.perf_counter() - began

    def _run(self, s, chunk: torch.Tensor, pos: int) -> torch.Tensor:
        """One forward call (on the torch thread); the output back on the CPU."""
        with torch.inference_mode():
            out = s.model.run_layers(chunk.to(self.device), s.start, s.end, pos=pos,
                                     cache=s.cache)
        return out.to("cpu")
