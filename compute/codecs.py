"""The names of the wire tensor codecs, in id order (torch-free).

`compute.wiretensor` encodes and decodes with them (a codec's id is its index
here); a command line offers them as choices before torch loads, which must
not happen while a client still sets up how its OpenMP threads wait
(`node.torch_thread.share_cpus_politely`).
"""

CODECS = ("raw", "fp16", "bf16", "int8")
