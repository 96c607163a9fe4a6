"""A server's decode speed through its span: what its announcement says it does.

Owns `measure_throughput`, run on the torch thread when a span is loaded
(`node.serve.layer_server`) and on demand (`InferenceServer.measure_throughput`).
"""

from __future__ import annotations

import time

import torch

from compute.kvcache import KVCache
from compute.model import Transformer


def measure_throughput(model: Transformer, layers: range, device: torch.device | str = "cpu",
                       tokens: int = 8) -> float:
    """Decode tokens/s of ``model`` through ``layers`` (blocking: run it on the torch thread).

    One warm-up token, then the median of ``tokens`` single-token steps,
    the same calls a session makes; what `Announce` reports.
    """
    device = torch.device(device)
    cfg = model.config
    cache = KVCache(cfg, tokens + 1, layers=layers, device=device)
    h = torch.zeros(1, 1, cfg.dim, device=device)
    times = []
    with torch.inference_mode():
        for _ in range(tokens + 1):
            began = time.perf_counter()
            model.run_layers(h, layers.start, layers.stop, cache=cache)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - began)
    times = sorted(times[1:])
    return 1.0 / max(times[len(times) // 2], 1e-6)
