#!/usr/bin/env python3
"""make_tokenizer_refs.py - reference ids from Hugging Face `tokenizers` for the tokenizer tests.
Runs on the GPU machine (its python3 has tokenizers 0.23); needs only the repo's data/ and
tests/fixtures/tokenizer/corpus.jsonl (written by tools/make_tokenizer_corpus.py).

  python3 tools/make_tokenizer_refs.py [OUTDIR]      # default tests/fixtures/tokenizer

Writes into OUTDIR:
  ids-qwen3.txt   ids of every corpus string with data/qwen3-tokenizer/tokenizer.json, one line
                  per string, space-separated (an empty line for no ids)
  ids-qwen35.txt  the same with data/qwen35-regex-tokenizer/tokenizer.json
  hf-misc.jsonl   one JSON object a line, by "kind":
                    meta        versions, date, counts
                    nfc         {"i", "text"}: tokenizer.normalizer.normalize_str(corpus[i]) where it
                                differs from corpus[i]
                    decode      {"i", "text"}: tok.decode(ids) where it differs from the NFC text
                    decode_ids  {"ids", "text", "text_skip"}: decode of seeded random id sequences
                                (partial UTF-8 sequences, special tokens), skip_special_tokens
                                False / True
Tokenizer: tokenizers.Tokenizer.from_file, encode(s) with add_special_tokens=True (the default,
as transformers calls it; Qwen's post-processor adds nothing).
"""
import datetime
import hashlib
import json
import os
import platform
import random
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = [("qwen3", "data/qwen3-tokenizer/tokenizer.json"), ("qwen35", "data/qwen35-regex-tokenizer/tokenizer.json")]


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests/fixtures/tokenizer")
    os.makedirs(outdir, exist_ok=True)
    corpus_path = os.path.join(ROOT, "tests/fixtures/tokenizer/corpus.jsonl")
    raw = open(corpus_path, "rb").read()
    corpus = [json.loads(line) for line in raw.decode("ascii").splitlines()]
    misc = [{"kind": "meta", "tokenizers": tokenizers.__version__, "python": platform.python_version(),
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "n_strings": len(corpus), "corpus_sha256": hashlib.sha256(raw).hexdigest(),
             "encode": "Tokenizer.from_file(path).encode(s).ids"}]
    toks = {}
    for name, rel in FILES:
        tok = Tokenizer.from_file(os.path.join(ROOT, rel))
        toks[name] = tok
        all_ids = [tok.encode(s).ids for s in corpus]
        with open(os.path.join(outdir, f"ids-{name}.txt"), "w") as f:
            for ids in all_ids:
                f.write(" ".join(map(str, ids)) + "\n")
        print(f"{name}: {len(corpus)} strings, {sum(map(len, all_ids))} ids", flush=True)
        if name == "qwen3":
            for i, (s, ids) in enumerate(zip(corpus, all_ids)):
                nfc = tok.normalizer.normalize_str(s)
                if nfc != s:
                    misc.append({"kind": "nfc", "i": i, "text": nfc})
                dec = tok.decode(ids, skip_special_tokens=False)
                if dec != nfc:
                    misc.append({"kind": "decode", "i": i, "text": dec})
    # decode of seeded random id sequences: partial UTF-8, special tokens in between
    tok = toks["qwen3"]
    vocab_n = tok.get_vocab_size(with_added_tokens=True)
    rng = random.Random(7)
    specials = [tok.token_to_id(t) for t in ["<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<|im_start|>"]]
    emoji_ids = tok.encode("😶‍🌫️ 👨‍👩‍👧‍👦 中文字符 é").ids
    for k in range(300):
        n = rng.randint(1, 24)
        ids = []
        for _ in range(n):
            r = rng.random()
            if r < 0.15:
                ids.append(rng.choice(specials))
            elif r < 0.45:
                ids.append(rng.choice(emoji_ids))
            else:
                ids.append(rng.randrange(vocab_n))
        misc.append({"kind": "decode_ids", "ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                     "text_skip": tok.decode(ids, skip_special_tokens=True)})
    with open(os.path.join(outdir, "hf-misc.jsonl"), "w") as f:
        for m in misc:
            f.write(json.dumps(m, ensure_ascii=True) + "\n")
    print(f"hf-misc.jsonl: {len(misc)} records", flush=True)


if __name__ == "__main__":
    main()
