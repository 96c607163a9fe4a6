"""A warm Petals client for bench/ttft_bench.py, run with the Petals environment's Python.

Not part of pnode (Petals is not a dependency): bench/ttft_bench.py starts
it with ``--petals-python`` and talks to it over stdin/stdout. It loads the
model once (a Petals 2.x `AutoDistributedModelForCausalLM` over the swarm of
INITIAL_PEER), then for each line ``N`` on stdin runs one greedy generation
of N tokens after PROMPT_IDS in a fresh inference session (Petals opens its
server sessions at the first step) and prints one JSON line: the generated
ids, the time to the first token (from entering the session) and the decode
rate after it. The embedding and head run locally, as in Petals' own client.

Usage:  PY bench/petals_client.py MODEL_DIR INITIAL_PEER DHT_PREFIX PROMPT_IDS(comma list)
"""

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from petals import AutoDistributedModelForCausalLM  # noqa: E402


def main() -> None:
    model_dir, peer, prefix, prompt = sys.argv[1:5]
    ids = torch.tensor([[int(t) for t in prompt.split(",")]])
    model = AutoDistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=[peer], dht_prefix=prefix, torch_dtype=torch.float32)
    embed, norm, head = model.transformer.word_embeddings, model.transformer.ln_f, model.lm_head
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        n = int(line)
        out, times = [], []
        with torch.inference_mode(), model.inference_session(max_length=ids.shape[1] + n) as s:
            began = time.perf_counter()
            x = ids
            for _ in range(n):
                h = s.step(embed(x))  # (1, T, C) through every server
                x = head(norm(h[:, -1:])).argmax(-1)  # (1, 1): greedy, no stop token
                out.append(int(x))
                times.append(time.perf_counter())
        print(json.dumps({"ids": out, "ttft": times[0] - began,
                          "rate": (n - 1) / (times[-1] - times[0])}), flush=True)


if __name__ == "__main__":
    main()
