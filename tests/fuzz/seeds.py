#!/usr/bin/env python3
"""seeds.py - seed corpora for the fuzz targets, made from the test fixtures at run time
(make fuzz calls it): python3 tests/fuzz/seeds.py OUTDIR, run from the repository root.
Each file is one input in the target's format (tests/fuzz/fuzz_*.c): a selector byte, then the
body. The small hand-written seeds and crash reproducers live in tests/fuzz/corpus/ instead."""
import glob
import json
import os
import sys

out = sys.argv[1]


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


# loader: configs (0), safetensors files (1), indexes (2); tokenizer.json seeds are committed
# (the real ones are megabytes)
for p in sorted(glob.glob("tests/bad/*/config.json") + glob.glob("tests/fixtures/*/config.json") + ["demo/config.json"]):
    put("fuzz_loader", "cfg-" + p.replace("/", "_"), b"\x00" + read(p))
for p in sorted(glob.glob("tests/bad/*/*.safetensors")):
    if os.path.getsize(p) <= 64 * 1024:
        put("fuzz_loader", "st-" + p.replace("/", "_"), b"\x01" + read(p))
for p in sorted(glob.glob("tests/bad/*/model.safetensors.index.json") + glob.glob("tests/fixtures/*/model.safetensors.index.json")):
    put("fuzz_loader", "idx-" + p.replace("/", "_"), b"\x02" + read(p))

# requests: every chat request of the template fixtures, as chat (0) and, with a prompt, as
# completions (1); tokenize (2) / detokenize (3) bodies from the tokenizer corpus
with open("tests/fixtures/chat/requests.json") as f:
    reqs = json.load(f)
for i, r in enumerate(reqs):
    put("fuzz_request", "chat-%03d" % i, b"\x00" + json.dumps(r["request"], ensure_ascii=False).encode())
texts = []
with open("tests/fixtures/tokenizer/corpus.jsonl", encoding="utf-8") as f:
    texts = [json.loads(line) for line in f][::10]
ids = []
with open("tests/fixtures/tokenizer/ids-qwen3.txt") as f:
    ids = [[int(x) for x in line.split()] for line in f][::10]
for i, t in enumerate(texts[:40]):
    put("fuzz_request", "cmpl-%03d" % i, b"\x01" + json.dumps({"prompt": t, "max_tokens": 4}).encode())
    put("fuzz_request", "tok-%03d" % i, b"\x02" + json.dumps({"content": t, "with_pieces": i % 2 == 0}).encode())
for i, v in enumerate(ids[:40]):
    put("fuzz_request", "detok-%03d" % i, b"\x03" + json.dumps({"tokens": v}).encode())

# tokenizer: texts (even selector) and their ids (odd selector, 3 bytes each)
for i, t in enumerate(texts):
    put("fuzz_tokenizer", "text-%03d" % i, b"\x00" + t.encode("utf-8", "surrogatepass"))
for i, v in enumerate(ids):
    put("fuzz_tokenizer", "ids-%03d" % i, b"\x01" + bytes([i % 2]) + b"".join(x.to_bytes(3, "little") for x in v))

# schema: every corpus schema (selector 0 with a walk seed) and the refused ones
with open("tests/fixtures/schemas/corpus.json", encoding="utf-8") as f:
    corpus = json.load(f)
with open("tests/fixtures/schemas/bad.json", encoding="utf-8") as f:
    corpus += json.load(f)
for i, c in enumerate(corpus):
    put("fuzz_schema", "schema-%03d" % i, bytes([(i * 8) & 0xf8]) + json.dumps(c["schema"], ensure_ascii=False).encode())
