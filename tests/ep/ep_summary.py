#!/usr/bin/env python3
"""Summaries of tests/ep/torch_ep_record.py's JSON (one line per case), or
with --events the full per-rank sequence of one case.

    ep_summary.py build/ep/live/*.json
    ep_summary.py --events [--rank R] build/ep/live/dp4_ep2.json
Exit 1 when a case failed or its ranks disagree on the sequence's shape
(the op kinds and groups, in order, differ between ranks)."""
import collections
import json
import sys


def line(case):
    if case.get("failed"):
        return "ep-live %s: FAILED %s" % (case["case"], case["failed"]), False
    r0 = case["ranks"][0]
    count = collections.Counter()
    for e in r0["events"]:
        count[(e["phase"][0], e["kind"], e["group"], len(e["ranks"]))] += 1
    shape = [[(e["kind"], e["group"], e["phase"]) for e in r["events"]] for r in case["ranks"]]
    same = all(s == shape[0] for s in shape)
    parts = ["%s %s x%d on %s(%d)" % ({"f": "fwd", "b": "bwd"}.get(ph, ph), k, n, g, size)
             for (ph, k, g, size), n in sorted(count.items(), key=lambda kv: (kv[0][0] != "f", kv[0][1], kv[0][2]))]
    ex = sorted({p["placements"][0][1] for p in r0["params"] if "inner_experts" in p["name"] and p["placements"]})
    lay = sorted(r0["routing"])
    splits = [e["in_splits"] for e in r0["events"] if e["ep"].endswith("dispatch")][:1]
    txt = ("ep-live %s: world %d dp_shard %d ep %d efsdp %s, %d events per rank (rank 0): %s; experts' efsdp "
           "placement %s; MoE layers %s, rank 0 tokens per expert %s, dispatch in_splits %s; ranks agree: %s; "
           "step %.2f s" % (case["case"], case["world"], case["dp_shard"], case["ep"], case["efsdp"],
                            len(r0["events"]), "; ".join(parts), "/".join(ex) or "-", ",".join(lay),
                            r0["routing"][lay[0]]["tokens_per_expert"] if lay else "-", splits[0] if splits else "-",
                            "yes" if same else "NO", max(r["seconds"] for r in case["ranks"])))
    return txt, same


def events(case, rank):
    r = case["ranks"][rank]
    for e in r["events"]:
        extra = ""
        if e["kind"] == "all_to_all":
            extra = " in_splits=%s out_splits=%s row=%s" % (e.get("in_splits"), e.get("out_splits"), e.get("row"))
        if e.get("reduce_op"):
            extra += " op=%s" % e["reduce_op"]
        print("%3d %-8s %-14s %-12s %-13s in %5d out %5d %-7s%s  [%s]" % (
            e["i"], e["phase"], e["kind"], e["group"], e["ranks"], e["in_numel"], e["out_numel"], e["dtype"], extra,
            e["fsdp"] or e["ep"] or e["module"]))


def main():
    args = sys.argv[1:]
    ev = "--events" in args
    rank = 0
    if "--rank" in args:
        rank = int(args[args.index("--rank") + 1])
        del args[args.index("--rank"):args.index("--rank") + 2]
    ok = True
    for p in [a for a in args if not a.startswith("--")]:
        with open(p) as f:
            case = json.load(f)
        if ev:
            print("== %s rank %d" % (case["case"], rank))
            events(case, rank)
            continue
        txt, good = line(case)
        print(txt)
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
