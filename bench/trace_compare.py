#!/usr/bin/env python3
"""A plan's measured step (the binary's --trace FILE on a GPU) beside its
predicted one (plans/<name>/trace.json), op for op by the ops' sequence
numbers: per op kind, how many ops, the predicted and measured time summed,
their ratio and the median of the per-op ratios (measured / predicted).

With --standin (one-rank communicators) the collectives' measured times
say nothing about the network: only the copy kernels' rows (copy-in,
copy-out, pack, view-out: HBM-bound) compare the cost model's memory
bandwidth with the GPU's. Standard library only (runs on the GPU machine).

  bench/trace_compare.py PREDICTED.json MEASURED.json
"""
import json
import statistics
import sys


def events(path):
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for e in doc.get("traceEvents", []):
        if e.get("ph") != "X" or "seq" not in e.get("args", {}):
            continue
        out.setdefault(e["args"]["seq"], []).append(e)
    return doc.get("otherData", {}), out


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: trace_compare.py PREDICTED.json MEASURED.json")
    pmeta, pred = events(argv[1])
    mmeta, meas = events(argv[2])
    if not pmeta.get("fingerprint") or pmeta.get("fingerprint") != mmeta.get("fingerprint"):
        sys.exit("trace_compare: %s and %s are different plans (fingerprints %s, %s): regenerate or rebuild"
                 % (argv[1], argv[2], pmeta.get("fingerprint"), mmeta.get("fingerprint")))
    rows = {}
    for seq, ms in meas.items():
        ps = pred.get(seq)
        if not ps:
            continue
        kind = ms[0]["name"].split(" ", 1)[0]
        p = sum(e["dur"] for e in ps)
        m = sum(e["dur"] for e in ms)
        r = rows.setdefault(kind, {"n": 0, "p": 0.0, "m": 0.0, "ratios": []})
        r["n"] += 1
        r["p"] += p
        r["m"] += m
        if p > 0:
            r["ratios"].append(m / p)
    print("%s: measured step (rank %s%s) beside the predicted one, %d ops matched"
          % (mmeta.get("plan"), mmeta.get("rank"), ", stand-in communicators" if mmeta.get("standin") else "",
             sum(r["n"] for r in rows.values())))
    print("| op | ops | predicted us | measured us | measured / predicted | median per op |")
    print("|---|---|---|---|---|---|")
    for kind in sorted(rows, key=lambda k: -rows[k]["p"]):
        r = rows[kind]
        med = statistics.median(r["ratios"]) if r["ratios"] else float("nan")
        print("| %s | %d | %.1f | %.1f | %.2f | %.2f |" % (kind, r["n"], r["p"], r["m"],
                                                         r["m"] / r["p"] if r["p"] else float("nan"), med))
    print("step: predicted %.1f us, measured %.1f us" % (pmeta.get("step_us", 0.0), mmeta.get("step_us", 0.0)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
