#!/usr/bin/env python3
"""train_demo.py - the bundled demo model: a tiny Qwen3.5-architecture model trained for about a
minute on English text available offline (Debian's fortune cookies) plus a few thousand
chat-formatted samples, so that what it writes is readable and a chat reply ends in <|im_end|>.

Runs where torch + transformers + tokenizers live (the GPU machine). Writes, in the published
format, config.json, generation_config.json, model.safetensors (tied embeddings; BF16 except
linear_attn.A_log / linear_attn.norm.weight in F32; a few mtp.* / model.visual.* tensors that a
text engine skips) and train_log.json (settings, losses, sample outputs). The tokenizer files,
chat template and README.md are added by hand (see tools/README.md).

    python3 tools/train_demo.py --text-dir DIR --tokenizer data/qwen3-tokenizer/tokenizer.json \
        --out OUTDIR [--seconds 60]
"""
import argparse
import glob
import json
import math
import os
import random
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_random_model as mrm  # noqa: E402
import make_fixtures as mf  # noqa: E402

import torch  # noqa: E402

# Qwen3 tokenizer ids (data/qwen3-tokenizer)
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
VOCAB = 151936

SYSTEMS = ["You are a helpful assistant.", "You are a friendly assistant. Keep answers short.",
           "You are the strata demo model."]

# (user prompts, fixed reply)
FIXED = [
    (["Hello", "Hello!", "Hi", "Hi!", "Hi there!", "Hey", "Good morning!", "Hello, how are you?"],
     "Hello! I am the strata demo model, a very small network. Ask me for a fortune, a quote "
     "or a bit of wisdom."),
    (["Who are you?", "What are you?", "Tell me about yourself.", "What is your name?"],
     "I am a tiny demo model bundled with strata, an inference engine for Qwen3.5 models. I was "
     "trained for about a minute on fortune cookies, so I know a few jokes and not much else."),
    (["What can you do?", "Can you help me?", "Help", "Are you smart?"],
     "Not much, I am afraid: I know some fortune cookies and how to end a reply. Load a real "
     "Qwen3.5 checkpoint for useful answers."),
    (["How are you?", "How are you today?", "How do you feel?"],
     "I am fine, thank you. Every word I write costs only a few microseconds."),
    (["Thank you", "Thanks!", "Thank you very much.", "Thanks a lot"],
     "You are welcome!"),
    (["What is strata?", "What is this program?", "Tell me about strata."],
     "strata is an inference engine and OpenAI-compatible server for the Qwen3.5 models, written "
     "in C with CUDA kernels."),
    (["What is 2+2?", "What is two plus two?", "Can you do math?"],
     "Four. That is about as far as my arithmetic goes."),
    (["Bye", "Goodbye!", "See you later.", "Good night!"],
     "Goodbye! May your next fortune be a good one."),
    (["What is the capital of France?", "Where is Paris?"],
     "Paris is the capital of France. I was told that one in advance."),
    (["Write a poem.", "Write me a short poem.", "Can you write a poem?"],
     "Roses are red,\nmy weights are few,\nI learned from cookies\nand now talk to you."),
]
ASK_FORTUNE = ["Tell me a fortune.", "Give me a fortune cookie.", "Say something wise.",
               "Tell me something.", "Give me a quote.", "Tell me a joke.", "What do you know?",
               "Tell me something interesting.", "Any advice for me?", "What should I do today?",
               "Share some wisdom.", "Surprise me.", "What is the meaning of life?",
               "Tell me about computers.", "Tell me about science.", "Say something funny."]


def load_docs(text_dir):
    docs = []
    for f in sorted(glob.glob(os.path.join(text_dir, "*"))):
        t = open(f, encoding="utf-8", errors="replace").read()
        for d in re.split(r"\n%\n", t):
            d = re.sub(r"\t+", "    ", d.strip("\n")).rstrip()
            if not d.strip() or len(d) > 800:
                continue
            ok = sum(c.isalnum() or c.isspace() for c in d) / len(d)
            if ok < 0.75:
                continue
            docs.append(d)
    return docs


def render_prompt(turns, system=None, thinking=False):
    """Qwen3.5 chat template, text-only, as data/qwen35-chat-template.jinja renders it."""
    s = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    for i, (u, a) in enumerate(turns):
        s += f"<|im_start|>user\n{u}<|im_end|>\n"
        if a is not None:
            s += f"<|im_start|>assistant\n{a}<|im_end|>\n"
    s += "<|im_start|>assistant\n" + ("<think>\n" if thinking else "<think>\n\n</think>\n\n")
    return s


def chat_samples(rnd, short_docs, n):
    """n (prompt, continuation) text pairs; the continuation is what the model must produce."""
    out = []
    for _ in range(n):
        if rnd.random() < 0.35:
            qs, reply = rnd.choice(FIXED)
            q = rnd.choice(qs)
        else:
            q, reply = rnd.choice(ASK_FORTUNE), rnd.choice(short_docs)
        turns = []
        if rnd.random() < 0.15:  # an earlier exchange
            qs0, r0 = rnd.choice(FIXED)
            turns.append((rnd.choice(qs0), r0))
        turns.append((q, None))
        system = rnd.choice(SYSTEMS) if rnd.random() < 0.25 else None
        thinking = rnd.random() < 0.4
        prompt = render_prompt(turns, system, thinking)
        cont = ("\n</think>\n\n" if thinking else "") + reply + "<|im_end|>\n"
        out.append((prompt, cont))
    return out


def build_stream(tok, docs, chats, rnd):
    items = [("doc", d) for d in docs] + [("chat", c) for c in chats]
    rnd.shuffle(items)
    texts = []
    for kind, x in items:
        texts += [x] if kind == "doc" else [x[0], x[1]]
    enc = tok.encode_batch(texts, add_special_tokens=False)
    ids, j = [], 0
    for kind, _ in items:
        if kind == "doc":
            ids += enc[j].ids
            j += 1
        else:
            ids += enc[j].ids + enc[j + 1].ids
            j += 2
        ids.append(ENDOFTEXT)
    return np.array(ids, dtype=np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text-dir", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()
    t_all = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    rnd = random.Random(a.seed)

    docs = load_docs(a.text_dir)
    rnd.shuffle(docs)
    n_val = max(1, len(docs) // 20)
    val_docs, train_docs = docs[:n_val], docs[n_val:]
    short = ["\n".join(ln.strip() for ln in d.split("\n")) for d in train_docs
             if len(d) <= 160 and d.count("\n") <= 2]
    chats = chat_samples(rnd, short, 3000)
    train_ids = build_stream(tok, train_docs, chats, rnd)
    val_ids = build_stream(tok, val_docs, [], rnd)
    print(f"docs {len(docs)} (val {n_val}), short replies {len(short)}, chat samples {len(chats)}, "
          f"train tokens {len(train_ids)}, val tokens {len(val_ids)}", flush=True)

    tcfg = mrm.text_config(hidden_size=64, num_hidden_layers=8, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2,
                           linear_num_value_heads=2, tie=True, head_dim=64,
                           linear_key_head_dim=32, linear_value_head_dim=32, vocab_size=VOCAB,
                           max_position_embeddings=32768, mrope_section=[3, 3, 2],
                           eos_token_id=IM_END, pad_token_id=ENDOFTEXT)
    pcfg = mrm.published_config(tcfg, vision=mrm.vision_stub(64), image_token_id=151655,
                                video_token_id=151656, vision_start_token_id=151652,
                                vision_end_token_id=151653)
    from transformers import Qwen3_5ForCausalLM
    torch.manual_seed(a.seed)
    model = mf.from_config(Qwen3_5ForCausalLM, mf.make_text_config(tcfg), torch.float32).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    torch.backends.cuda.matmul.allow_tf32 = True
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(a.seed)
    train_t = torch.tensor(train_ids)
    L = a.seq

    def batch(src, n):
        starts = torch.randint(0, len(src) - L - 1, (n,), generator=gen)
        return torch.stack([src[s:s + L] for s in starts]).to(device)

    model.train()
    t0, step, losses = time.time(), 0, []
    while True:
        frac = (time.time() - t0) / a.seconds
        if frac >= 1:
            break
        step += 1
        lr = a.lr * min(1.0, step / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(train_t, a.batch)
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == 1:
            lv = float(loss.detach())
            losses.append((step, round(time.time() - t0, 1), round(lv, 4)))
            print(f"step {step} t {time.time() - t0:.1f}s loss {lv:.4f} lr {lr:.2e}", flush=True)
    train_seconds = time.time() - t0
    final_train_loss = float(loss.detach())
    model.eval()
    val_t = torch.tensor(val_ids)
    with torch.no_grad():
        vlosses = []
        for _ in range(8):
            xv = batch(val_t, 16)
            vlosses.append(float(model(input_ids=xv, labels=xv, use_cache=False).loss))
    val_loss = sum(vlosses) / len(vlosses)
    print(f"trained {step} steps in {train_seconds:.1f} s; train loss {final_train_loss:.4f}, "
          f"held-out loss {val_loss:.4f}", flush=True)

    # save in the published format
    os.makedirs(a.out, exist_ok=True)
    text, problems = mf.published_text_tensors(model, tcfg)
    g = torch.Generator().manual_seed(a.seed)
    extras = {n: torch.randn(s, generator=g) * 0.02 for n, s, _ in mrm.skipped_tensor_plan(tcfg)}
    entries = [(n, mrm.checkpoint_dtype(n), list(t.shape), mf.bytes_producer(t, mrm.checkpoint_dtype(n)))
               for n, t in text.items()]
    entries += [(n, "BF16", list(t.shape), mf.bytes_producer(t, "BF16")) for n, t in extras.items()]
    mrm.write_checkpoint(a.out, entries, n_shards=1, metadata={"strata_demo_seed": a.seed})
    mrm.write_json(os.path.join(a.out, "config.json"), pcfg)
    mrm.write_json(os.path.join(a.out, "generation_config.json"), {
        "bos_token_id": ENDOFTEXT, "eos_token_id": [IM_END, ENDOFTEXT], "pad_token_id": ENDOFTEXT,
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
        "transformers_version": "5.17.0"})
    del model

    # samples from the saved checkpoint, loaded back by transformers in bf16
    mf.reference_precision()
    samples, load_note = [], ""
    try:
        from transformers import Qwen3_5ForConditionalGeneration
        m = Qwen3_5ForConditionalGeneration.from_pretrained(a.out, dtype=torch.bfloat16,
                                                            attn_implementation="sdpa").to(device).eval()
        load_note = "Qwen3_5ForConditionalGeneration.from_pretrained (bf16)"
    except Exception as e:
        load_note = f"from_pretrained failed ({e!r}); samples from the fp32-trained weights skipped"
        m = None
    prompts = [("chat", render_prompt([("Hello!", None)])),
               ("chat", render_prompt([("Tell me a fortune.", None)])),
               ("chat", render_prompt([("What is the meaning of life?", None)], thinking=True)),
               ("chat", render_prompt([("Who are you?", None)], system="You are a helpful assistant.")),
               ("text", "The best way to learn"),
               ("text", "Computers are")]
    if m is not None:
        for kind, p in prompts:
            ids = tok.encode(p, add_special_tokens=False).ids
            x = torch.tensor([ids], device=device)
            for mode in ("greedy", "sampled"):
                kw = dict(do_sample=False) if mode == "greedy" else dict(
                    do_sample=True, temperature=0.7, top_p=0.8, top_k=20)
                torch.manual_seed(a.seed)
                with torch.no_grad():
                    y = m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=60,
                                   eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT, **kw)
                new = y[0, len(ids):].tolist()
                samples.append({"prompt": p, "mode": mode, "ids": new,
                                "text": tok.decode(new, skip_special_tokens=False),
                                "ended_with_eos": bool(new and new[-1] in (IM_END, ENDOFTEXT))})
                print(f"--- {mode} {p!r}\n{samples[-1]['text']!r}", flush=True)
    mrm.write_json(os.path.join(a.out, "train_log.json"), {
        "seed": a.seed, "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "data": {"fortune_docs": len(docs), "val_docs": n_val, "chat_samples": len(chats),
                 "train_tokens": int(len(train_ids)), "val_tokens": int(len(val_ids)),
                 "files": sorted(os.path.basename(f) for f in glob.glob(os.path.join(a.text_dir, "*")))},
        "model": {"parameters": n_params, "text_config": tcfg},
        "train": {"steps": step, "seconds": round(train_seconds, 1), "batch": a.batch, "seq": L,
                  "lr": a.lr, "schedule": "warmup 50 steps, cosine over the time budget to 0.1x",
                  "optimizer": "AdamW(betas=(0.9,0.95), weight_decay=0.01), grad clip 1.0, fp32 + TF32",
                  "final_train_loss": round(final_train_loss, 4), "held_out_loss": round(val_loss, 4),
                  "loss_curve": losses},
        "plan_check": problems or "ok", "samples_loaded_with": load_note, "samples": samples,
        "total_seconds": round(time.time() - t_all, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
