#!/usr/bin/env python3
"""ncu_sass.py - read an Nsight Compute source page (`ncu -i REP --page source --csv
--print-source cuda,sass`, as scripts/gpu-profile.sh writes it to $OUT/sass-N.csv.gz) here,
where ncu is not installed: the kernel's SASS in address order with each instruction's warp
stall samples and top stall reasons, and the samples summed per range of addresses.

    python3 tools/ncu_sass.py sass-1.csv.gz                 stall summary + busiest source lines
    python3 tools/ncu_sass.py sass-1.csv.gz --all           + every instruction, address order
    python3 tools/ncu_sass.py sass-1.csv.gz --split 1fc0,3d40,4cc0
                                                            samples before / between / after those
                                                            offsets (e.g. the wait, phase stamps)

Samples count warps caught at an instruction (not cycles); under ncu a kernel runs alone, with
cold caches unless --cache-control none, so read them for where a latency chain waits, not for
how long a phase takes in the decode graph (STRATA_TRACE=1 says that).
"""
import csv
import gzip
import sys
from collections import Counter


def num(x):
    try:
        return int(x)
    except ValueError:
        return 0


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    hdr, src, line, insts = None, None, "", {}
    for r in csv.reader(opener(path, "rt")):
        if len(r) == 2:
            if r[0] == "File Path":
                src = r[1].rsplit("/", 1)[-1]
            continue
        if r and r[0] == "Line No":
            hdr = r
            continue
        if hdr is None or len(r) < 5:
            continue
        if r[0]:  # a source line: the instructions below are its
            line = f"{src}:{r[0]}"
            continue
        if not r[2].startswith("0x"):
            continue
        addr = int(r[2], 16)
        if addr in insts:  # inlined code appears under each of its source lines
            continue
        d = dict(zip(hdr[4:], r[4:]))
        stalls = sorted(((num(d[h]), h[6:]) for h in hdr if h.startswith("stall_") and "Not Issued" not in h),
                        reverse=True)
        insts[addr] = (num(d.get("Warp Stall Sampling (All Samples)", "0")), d.get("Instructions Executed", ""),
                       r[3].strip(), line, stalls)
    base = min(insts) if insts else 0
    return [(a - base,) + insts[a] for a in sorted(insts)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = read(sys.argv[1])
    total = sum(r[1] for r in rows)
    reasons = Counter()
    for r in rows:
        for n, h in r[5]:
            reasons[h] += n
    print(f"{len(rows)} instructions, {total} samples")
    print("stalls: " + " ".join(f"{h}={n}" for h, n in reasons.most_common() if n))
    by_line = Counter()
    for r in rows:
        by_line[r[4]] += r[1]
    print("\nbusiest source lines:")
    for ln, n in by_line.most_common(15):
        print(f"  {n:6d}  {ln}")
    if "--split" in sys.argv:
        cuts = [int(x, 16) for x in sys.argv[sys.argv.index("--split") + 1].split(",")]
        edges = [0] + cuts + [1 << 40]
        print("\nsamples by address range:")
        for lo, hi in zip(edges, edges[1:]):
            n = sum(r[1] for r in rows if lo <= r[0] < hi)
            print(f"  [{lo:5x}, {hi if hi < 1 << 40 else 0:5x}) {n:6d}  ({100.0 * n / max(total, 1):.0f}%)")
    if "--all" in sys.argv:
        print("\noffset samples executed instruction / source / top stalls:")
        for off, n, ex, ins, ln, st in rows:
            top = " ".join(f"{h}={v}" for v, h in st[:2] if v)
            print(f"{off:5x} {n:5d} {ex:>6} {ins[:58]:58s} {ln:24s} {top}")


if __name__ == "__main__":
    main()
