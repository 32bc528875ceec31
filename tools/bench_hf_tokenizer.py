#!/usr/bin/env python3
"""bench_hf_tokenizer.py - the Hugging Face `tokenizers` side of bench/bench_tokenizer.c: load
time of tokenizer.json and single-threaded encode throughput over the same length-prefixed corpus
(tools/make_tokenizer_corpus.py --bench), with the same id checksum.

  python3 tools/bench_hf_tokenizer.py CORPUS [TOKENIZER_JSON] [REPS]

One thread: RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false are set before tokenizers is
imported. Two ways are timed: a Python loop of encode(doc) and encode_batch(docs) (one rayon
thread, no per-call Python overhead); the table reports both.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import struct  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    corpus_path = sys.argv[1]
    tok_path = sys.argv[2] if len(sys.argv) > 2 else "data/qwen3-tokenizer/tokenizer.json"
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    loads = []
    for _ in range(5):
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(tok_path)
        loads.append((time.perf_counter() - t0) * 1e3)
    raw = open(corpus_path, "rb").read()
    docs, off = [], 0
    while off + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, off)
        docs.append(raw[off + 4: off + 4 + n].decode("utf-8"))
        off += 4 + n
    total = sum(len(d.encode("utf-8")) for d in docs)
    print(f"tokenizers {tokenizers.__version__}: {tok_path}")
    print(f"load: first {loads[0]:.1f} ms, best of 5 {min(loads):.1f} ms")
    best_loop, best_batch, encs = 1e30, 1e30, None
    for _ in range(reps):
        t0 = time.perf_counter()
        encs = [tok.encode(d) for d in docs]
        best_loop = min(best_loop, time.perf_counter() - t0)
    for _ in range(reps):
        t0 = time.perf_counter()
        tok.encode_batch(docs)
        best_batch = min(best_batch, time.perf_counter() - t0)
    n_tokens, s = 0, 0
    for e in encs:
        for i in e.ids:
            s = (s * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
        n_tokens += len(e.ids)
    print(f"corpus: {corpus_path}, {len(docs)} docs, {total / 1e6:.2f} MB, {n_tokens} tokens, checksum {s:016x}")
    print(f"| impl | threads | encode MB/s | tokens/s | best of {reps} (s) |\n|---|---|---|---|---|")
    print(f"| HF tokenizers {tokenizers.__version__}, encode() loop | 1 | {total / 1e6 / best_loop:.2f} | {n_tokens / best_loop:.0f} | {best_loop:.3f} |")
    print(f"| HF tokenizers {tokenizers.__version__}, encode_batch() | 1 | {total / 1e6 / best_batch:.2f} | {n_tokens / best_batch:.0f} | {best_batch:.3f} |")


if __name__ == "__main__":
    main()
