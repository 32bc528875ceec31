#!/usr/bin/env python3
"""concurrency.py - many clients at once, as a server sees them (issue 27 item 5): for each
client count C (default 1, 4, 16, 64), C threads each send R streaming chat requests one after
another (a short user message of its own, max_tokens N, ignore_eos so every stream is N tokens
long); it prints the aggregate tokens/s (all tokens / wall time of the round), the per-stream
tokens/s (a stream's tokens after its first / the time from its first to its last token: the
median over the streams) and the time to first token p50 / p99, and checks that nothing was
lost or mixed (every request answered, N tokens each, each stream's text its own request's).

    python3 bench/concurrency.py --url http://127.0.0.1:8080 [--clients 1,4,16,64]
                                 [--requests 1] [--max-tokens 64] [--forced]

--forced: replies are teacher-forced (strata serve --test-forced-output) to a text naming the
client and request, so a random-weight model writes in-vocabulary replies and a mixed-up
stream shows; the server still runs every decode step. Python 3 standard library only. """
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def one(url, model, key, cid, rid, max_tokens, forced, started=None):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    tag = f"client {cid} request {rid}"
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "messages": [{"role": "user", "content": f"Hello from {tag}."}],
            "stream_options": {"include_usage": True}}
    if forced:
        body["strata_forced_output"] = " ".join([f"{tag}."] * max_tokens)
        body["chat_template_kwargs"] = {"enable_thinking": False}
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), h)
    r = c.getresponse()
    first = last = None
    text, usage, n_events, timings = "", None, 0, None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("timings"):
            timings = ev["timings"]
        for ch in ev.get("choices", []):
            d = ch.get("delta", {})
            piece = (d.get("content") or "") + (d.get("reasoning_content") or "")
            if piece:
                now = time.perf_counter()
                if first is None and started is not None:
                    started.wait()
                first = first or now
                last = now
                text += piece
                n_events += 1
    c.close()
    n = (usage or {}).get("completion_tokens", 0)
    return {"tag": tag, "status": r.status, "ttft": (first - t0) if first else None,
            "prompt_ms": timings.get("prompt_ms") if timings else None,
            "stream_s": (last - first) if first and last else None, "tokens": n, "text": text,
            "events": n_events}


def round_(a, clients):
    res, lock = [], threading.Lock()

    def worker(cid):
        for rid in range(a.requests):
            x = one(a.url, a.model, a.api_key, cid, rid, a.max_tokens, a.forced)
            with lock:
                res.append(x)

    th = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    ok = [x for x in res if x["status"] == 200 and x["tokens"] == a.max_tokens]
    mixed = [x for x in ok if a.forced and x["text"] and x["tag"] not in x["text"]]
    tok = sum(x["tokens"] for x in res)
    ttft = sorted(x["ttft"] * 1e3 for x in res if x["ttft"] is not None)
    per = [(x["tokens"] - 1) / x["stream_s"] for x in ok if x["stream_s"]]
    p = lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))] if ttft else float("nan")
    return {"clients": clients, "requests": len(res), "complete": len(ok), "mixed": len(mixed),
            "aggregate_tps": tok / wall, "per_stream_tps": statistics.median(per) if per else 0,
            "ttft_p50_ms": p(0.5), "ttft_p99_ms": p(0.99), "wall_s": wall}


def late(a, streaming):
    """A request arriving while `streaming` others stream (issue 27: its first token within 50 ms
    plus its own prefill): they start, and once all have their first token, one more request of
    the same shape is sent; its TTFT against the server's prompt_ms for it (its prefill + first
    token, timings.prompt_ms)."""
    res, lock, started = [], threading.Lock(), threading.Barrier(streaming + 1)

    def worker(cid):
        x = one(a.url, a.model, a.api_key, cid, 0, a.max_tokens * 4, a.forced, started)
        with lock:
            res.append(x)

    th = [threading.Thread(target=worker, args=(i,)) for i in range(streaming)]
    for t in th:
        t.start()
    started.wait()  # every stream has its first token
    time.sleep(0.05)
    x = one(a.url, a.model, a.api_key, streaming, 0, 8, a.forced)
    for t in th:
        t.join()
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="strata")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=1, help="per client, one after another")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--forced", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--late", type=int, default=0,
                    help="also: one request arriving while this many others stream")
    a = ap.parse_args()
    rows = []
    print("| clients | requests | complete | mixed | aggregate tok/s | per-stream tok/s | "
          "TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for c in [int(x) for x in a.clients.split(",")]:
        r = round_(a, c)
        rows.append(r)
        print(f"| {c} | {r['requests']} | {r['complete']} | {r['mixed']} | {r['aggregate_tps']:.1f} | "
              f"{r['per_stream_tps']:.1f} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} |", flush=True)
    if len(rows) > 1 and rows[0]["aggregate_tps"] > 0:
        for r in rows[1:]:
            print(f"{r['clients']} clients: aggregate {r['aggregate_tps'] / rows[0]['aggregate_tps']:.2f}x "
                  f"one client's, per-stream {100 * r['per_stream_tps'] / rows[0]['per_stream_tps']:.0f}%")
    if a.late:
        x = late(a, a.late)
        pm = x["prompt_ms"]
        print(f"a request arriving while {a.late} others stream: TTFT {x['ttft'] * 1e3:.1f} ms, its "
              f"prompt_ms (prefill + first token) {pm:.1f} ms, so {x['ttft'] * 1e3 - pm:.1f} ms beyond its own "
              f"prefill" if pm is not None else "a late request: no timings")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
