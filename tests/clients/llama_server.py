"""Serves a GGUF model with llama.cpp's own HTTP server, in process, from the portable
`xllamacpp` wheel (a CPU build that runs on any x86-64, unlike the `-march=native`
prebuilt servers).

usage: llama_server.py MODEL_GGUF PORT N_CTX ALIAS

Prints one line, the listening address, once the model is loaded; serves until its
stdin closes (the test that started it dropped it) or it is killed.
"""

import os
import sys

# Busy-waiting OpenMP threads are 10-20x slower on a shared 2-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import xllamacpp  # noqa: E402

gguf, port, n_ctx, alias = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

params = xllamacpp.CommonParams()
params.model.path = gguf
params.model_alias = alias
params.n_ctx = n_ctx
params.n_parallel = 1
params.port = port
params.hostnames = ["127.0.0.1"]
params.cpuparams.n_threads = 2
params.cpuparams_batch.n_threads = 2
params.warmup = False

server = xllamacpp.Server(params)
print(server.listening_address, flush=True)
sys.stdin.read()
