#!/usr/bin/env python3
"""ktrace.py - what bench/kernel_trace.c recorded, as phases and per-kernel time.

    python3 bench/ktrace.py ktrace.csv[.xz] [--gap US] [--show SPEC] [--top N]

A phase is a run of kernels with no idle gap longer than --gap us (default 30) between one
kernel's start and the latest end before it: a prefill call, a decode step between its host
syncs. Phases with the same kernel count in a row are folded into one line. --show picks the
phases broken down by kernel: "longest" (default), "last", "n=K" (every phase of K kernels,
averaged: the same graph replayed), or indices "3,7".

A kernel's time is its exclusive time on the critical path: from max(its start, the latest end
before it) to its end, so a programmatic dependent launch's early start (its prologue overlapping
the kernel before) is not counted twice; the rest of a phase's span is idle. Names fold template
arguments unless --args."""
import argparse
import collections
import lzma
import re
import sys


def load(path):
    op = lzma.open if path.endswith(".xz") else open
    ks = []
    with op(path, "rt") as f:
        for line in f:
            p = line.rstrip("\n").split(",", 7)
            if len(p) < 8:
                continue
            ks.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), int(p[6]), p[7]))
    ks.sort()
    return ks


def phases(ks, gap_ns):
    out, cur, hi = [], [], None
    for k in ks:
        if cur and k[0] - hi > gap_ns:
            out.append(cur)
            cur = []
        if not cur:
            hi = k[1]
        cur.append(k)
        hi = max(hi, k[1])
    if cur:
        out.append(cur)
    return out


def short(name, args):
    if args:
        return name
    name = re.sub(r"\(.*\)$", "", name)  # parameter list
    name = re.sub(r"^(void|static) ", "", name)
    return name


def exclusive(ph):
    """(name, exclusive ns) per kernel, idle ns, span ns"""
    res, hi, idle = [], ph[0][0], 0
    for k in ph:
        if k[0] > hi:
            idle += k[0] - hi
        res.append((k, max(0, k[1] - max(k[0], hi))))
        hi = max(hi, k[1])
    return res, idle, hi - ph[0][0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--gap", type=float, default=30.0)
    ap.add_argument("--show", default="longest")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--args", action="store_true", help="keep template arguments in names")
    ap.add_argument("--order", action="store_true", help="list one phase's kernels in order")
    a = ap.parse_args()
    ks = load(a.csv)
    if not ks:
        sys.exit("ktrace: no kernels in " + a.csv)
    ph = phases(ks, int(a.gap * 1e3))
    print(f"{len(ks)} kernels in {len(ph)} phases (gap > {a.gap:g} us)")
    i = 0
    while i < len(ph):
        j = i
        while j + 1 < len(ph) and len(ph[j + 1]) == len(ph[i]):
            j += 1
        spans = [exclusive(p)[2] / 1e3 for p in ph[i:j + 1]]
        g = "graph" if ph[i][0][2] else "stream"
        first = short(ph[i][0][7], False)[:48]
        if j == i:
            print(f"  phase {i}: {len(ph[i])} kernels ({g}), span {spans[0]:.1f} us, first {first}")
        else:
            print(f"  phases {i}-{j}: {j - i + 1} x {len(ph[i])} kernels ({g}), span mean "
                  f"{sum(spans) / len(spans):.1f} us (min {min(spans):.1f}), first {first}")
        i = j + 1
    if a.show == "longest":
        pick = [max(range(len(ph)), key=lambda t: exclusive(ph[t])[2])]
    elif a.show == "last":
        pick = [len(ph) - 1]
    elif a.show.startswith("n="):
        n = int(a.show[2:])
        pick = [t for t in range(len(ph)) if len(ph[t]) == n]
    else:
        pick = [int(t) for t in a.show.split(",")]
    if not pick:
        sys.exit("ktrace: no phase matches --show " + a.show)
    tot = collections.defaultdict(float)
    cnt = collections.Counter()
    idle = span = 0.0
    for t in pick:
        res, d, s = exclusive(ph[t])
        idle += d
        span += s
        for k, ex in res:
            nm = short(k[7], a.args)
            tot[nm] += ex
            cnt[nm] += 1
    m = len(pick)
    print(f"\nphase{'s' if m > 1 else ''} {a.show} ({m}): span {span / m / 1e3:.1f} us, "
          f"idle {idle / m / 1e3:.1f} us, {sum(cnt.values()) / m:.0f} kernels (per phase)\n")
    print("| kernel | per phase | exclusive us | share | us each |")
    print("|---|---|---|---|---|")
    for nm, ns in sorted(tot.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"| {nm[:90]} | {cnt[nm] / m:g} | {ns / m / 1e3:.1f} | {100 * ns / span:.1f}% | "
              f"{ns / cnt[nm] / 1e3:.2f} |")
    if a.order and m >= 1:
        res, _, _ = exclusive(ph[pick[0]])
        t0 = ph[pick[0]][0][0]
        print("\n| start us | dur us | excl us | grid x block | regs | kernel |\n|---|---|---|---|---|---|")
        for k, ex in res:
            print(f"| {(k[0] - t0) / 1e3:.1f} | {(k[1] - k[0]) / 1e3:.1f} | {ex / 1e3:.1f} | "
                  f"{k[4]} x {k[5]} | {k[6]} | {short(k[7], a.args)[:80]} |")


if __name__ == "__main__":
    main()
