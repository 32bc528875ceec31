#!/usr/bin/env python3
"""multiturn.py - prefix reuse over HTTP, as agents and chat clients use a server: a scripted
10-turn agent conversation (a system prompt of ~3,000 tokens with tool definitions, thinking on,
each turn adding 500-1,500 tokens of user or tool text and a generated reply), then the
interleaving cases: two clients alternating their conversations, a shared system prompt with
different questions, and a side request (a title, another system prompt) between agent steps.

Per request it prints the prompt tokens, the cached tokens the server reports
(usage.prompt_tokens_details.cached_tokens; llama-server: timings.cache_n), the reusable
prefix (the longest token prefix the prompt shares with an earlier request's prompt + output,
computed with the server's /apply-template and /tokenize, which strata and llama-server both
have) and the time to first token (from sending the request to the first streamed event that
carries a token; the server's own prompt_ms beside it when it reports timings).

    python3 bench/multiturn.py --url http://127.0.0.1:8080 [--turns 10] [--max-tokens 48]
                               [--forced] [--json out.json]

--forced: replies are teacher-forced to a scripted text (strata's strata_forced_output, accepted
with `strata serve --test-forced-output`), so a random-weight model writes in-vocabulary replies
of a fixed length; the server still runs every decode step. Python 3 standard library only. """
import argparse
import http.client
import json
import random
import sys
import time
import urllib.parse

WORDS = ("the of and to in is that for it as with was on be by this are from at or an have "
         "not which but all were when we there can more one has been their if would will what "
         "about so out up into them some could time these two may then do first any my now "
         "such like other how its our over also new after use most only well way years where "
         "system file value error function return request module server client cache token "
         "model layer buffer thread memory kernel device stream queue state parser config").split()


def text(rng, n_words):
    out, line = [], []
    for i in range(n_words):
        line.append(rng.choice(WORDS))
        if len(line) > 12 and rng.random() < 0.15:
            out.append(" ".join(line) + ".")
            line = []
    if line:
        out.append(" ".join(line) + ".")
    return "\n".join(out)


def tools(rng, n=8):
    res = []
    for i in range(n):
        props = {f"arg_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                              "description": text(rng, 12)} for j in range(5)}
        res.append({"type": "function", "function": {
            "name": f"tool_{i}", "description": text(rng, 40),
            "parameters": {"type": "object", "properties": props, "required": ["arg_0"]}}})
    return res


class Server:
    def __init__(self, url, model, api_key):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.model, self.key = model, api_key

    def _conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=600)

    def _headers(self):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def post(self, path, body):
        c = self._conn()
        c.request("POST", path, json.dumps(body), self._headers())
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status != 200:
            return None
        return json.loads(data)

    def ids(self, req):
        """the prompt's token ids, or None when the server has no /apply-template + /tokenize"""
        t = self.post("/apply-template", {k: req[k] for k in ("messages", "tools", "chat_template_kwargs") if k in req})
        if not t or "prompt" not in t:
            return None
        k = self.post("/tokenize", {"content": t["prompt"], "add_special": False, "parse_special": True})
        return k.get("tokens") if k else None

    def tokenize(self, s):
        k = self.post("/tokenize", {"content": s, "add_special": False, "parse_special": True})
        return k.get("tokens", []) if k else []

    def chat(self, req):
        body = dict(req, model=self.model, stream=True, stream_options={"include_usage": True})
        c = self._conn()
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", json.dumps(body), self._headers())
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        ttft = None
        content, reasoning, usage, timings = "", "", None, None
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        continue
                    j = json.loads(data)
                    if j.get("usage"):
                        usage = j["usage"]
                    if j.get("timings"):
                        timings = j["timings"]
                    for ch in j.get("choices") or []:
                        d = ch.get("delta") or {}
                        if ttft is None and (d.get("content") or d.get("reasoning_content") or
                                             d.get("tool_calls") or ch.get("finish_reason")):
                            ttft = time.perf_counter() - t0
                        content += d.get("content") or ""
                        reasoning += d.get("reasoning_content") or ""
        c.close()
        cached = None
        if usage and (usage.get("prompt_tokens_details") or {}).get("cached_tokens") is not None:
            cached = usage["prompt_tokens_details"]["cached_tokens"]
        elif timings and "cache_n" in timings:
            cached = timings["cache_n"]
        return {"ttft_ms": (ttft or 0) * 1e3, "content": content, "reasoning": reasoning,
                "prompt_tokens": (usage or {}).get("prompt_tokens"), "cached": cached,
                "server_prompt_ms": (timings or {}).get("prompt_ms"),
                "split": "/".join(f"{(timings or {})[k]:.1f}" for k in ("prompt_prepare_ms", "prompt_feed_ms")
                                  if k in (timings or {}))}


def common(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="strata")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--system-words", type=int, default=250, help="~3,000 tokens with the tools")
    ap.add_argument("--forced", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default=None)
    ap.add_argument("--pairs", default=None, help="writes 'cached:new,...' of the agent turns "
                    "(strata bench --pp-at)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    srv = Server(a.url, a.model, a.api_key)
    history = []  # (prompt ids + reply ids) of every earlier request
    rows = []

    def run(case, req):
        ids = srv.ids(req)
        req = dict(req, max_tokens=a.max_tokens, temperature=0)
        if a.forced:
            # a reply of about max_tokens tokens, reasoning then an answer
            req["strata_forced_output"] = (text(rng, a.max_tokens // 3) + "\n</think>\n\n" +
                                           text(rng, a.max_tokens // 3))
        r = srv.chat(req)
        reusable = None
        if ids is not None:
            reusable = max([common(ids, h) for h in history] + [0])
            reply = ("<think>\n" + r["reasoning"] + "\n</think>\n\n" if r["reasoning"] else "") + r["content"]
            history.append(ids + srv.tokenize(reply))
        row = dict(case=case, prompt=r["prompt_tokens"], cached=r["cached"], reusable=reusable,
                   ttft_ms=round(r["ttft_ms"], 2), server_prompt_ms=r["server_prompt_ms"])
        rows.append(row)
        pct = (f"{100.0 * r['cached'] / reusable:5.1f}%" if reusable and r["cached"] is not None
               else "    -")
        print(f"| {case:<28} | {r['prompt_tokens'] or '-':>6} | {r['cached'] if r['cached'] is not None else '-':>6} "
              f"| {reusable if reusable is not None else '-':>8} | {pct} | {r['ttft_ms']:8.2f} | "
              f"{r['server_prompt_ms'] if r['server_prompt_ms'] is not None else '-':>8} | {r['split'] or '-'} |",
              flush=True)
        return r

    print("| request | prompt | cached | reusable | cached / reusable | TTFT ms | server prompt_ms | "
          "its prepare / feed ms (strata) |")
    print("|---|---|---|---|---|---|---|---|")
    tl = tools(rng)
    system = {"role": "system", "content": "You are a coding agent working in a repository.\n" +
              text(rng, a.system_words)}
    kw = {"chat_template_kwargs": {"enable_thinking": True}}
    msgs = [system]
    for t in range(a.turns):
        n_words = rng.randint(330, 1000)  # 500-1,500 tokens
        if t % 2 == 1:
            msgs.append({"role": "tool", "tool_call_id": f"call_{t}", "content": text(rng, n_words)})
        else:
            msgs.append({"role": "user", "content": text(rng, n_words)})
        r = run(f"agent turn {t + 1}", {"messages": list(msgs), "tools": tl, **kw})
        msgs.append({"role": "assistant", "content": r["content"]})
        if t == 4:  # a side request between agent steps: a title, its own system prompt
            run("side request (title)", {"messages": [
                {"role": "system", "content": "Write a five-word title for the conversation."},
                {"role": "user", "content": msgs[1]["content"][:400]}], **kw})

    # two clients alternating their conversations, and a shared system prompt
    convs = [[system], [system]]
    for t in range(3):
        for k in range(2):
            convs[k].append({"role": "user", "content": text(rng, rng.randint(330, 700))})
            r = run(f"client {'AB'[k]} turn {t + 1}", {"messages": list(convs[k]), "tools": tl, **kw})
            convs[k].append({"role": "assistant", "content": r["content"]})
    for q in range(3):
        run(f"shared system, question {q + 1}", {"messages": [
            system, {"role": "user", "content": text(rng, 60)}], "tools": tl, **kw})

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else float("nan")
    agent = [r for r in rows if r["case"].startswith("agent turn") and r["case"] != "agent turn 1"]
    def ratio(rs):
        c = sum(r["cached"] or 0 for r in rs if r["reusable"])
        u = sum(r["reusable"] or 0 for r in rs if r["reusable"])
        return 100.0 * c / u if u else float("nan")
    print()
    print(f"agent turns 2-{a.turns}: cached / reusable {ratio(agent):.1f}%, mean TTFT "
          f"{mean([r['ttft_ms'] for r in agent]):.2f} ms")
    inter = [r for r in rows if r["case"].startswith(("client", "shared", "side")) and r["reusable"]]
    print(f"interleaving cases: cached / reusable {ratio(inter):.1f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.pairs:
        with open(a.pairs, "w") as f:
            f.write(",".join(f"{r['cached']}:{r['prompt'] - r['cached']}" for r in agent
                             if r["cached"] and r["prompt"] and r["prompt"] > r["cached"]))


if __name__ == "__main__":
    sys.exit(main())
