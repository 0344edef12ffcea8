"""Loads a schedule CSV written by `make pipeline ... CSV=FILE` (gen/verbs.lua pipeline --csv) into
torch 2.15's own schedule class with _PipelineScheduleRuntime._load_csv(format="compute_only"), which
lowers it with torch's passes, and prints torch's lowered per-rank lists as JSON
({"lowered": {rank: [action strings]}}) for tests/pp/compare_csv.lua to hold against commplan's.
  torch_load_csv.py FILE SCHEDULE PP MICROBATCHES STAGES_PER_RANK
  torch_load_csv.py FILE SCHEDULE PP MICROBATCHES STAGES_PER_RANK OUT [FILE ... OUT]...
The second form loads several CSVs in one process (torch imported once), each JSON written to its OUT.
Stages are stubs (tests/pp/torch_schedule_dump.py's): nothing runs."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_schedule_dump as D  # noqa: E402


def lowered(path, name, pp, n, v):
    style = "v" if name in D.V_STYLE else "loop"
    num_stages = pp * v
    stages = [D.Stub(s, num_stages, pp, 0) for s in D.generate_rank_to_stage_mapping(pp, num_stages, style)[0]]
    sched = D.MULTI[name](stages, n)
    sched._load_csv(path, format="compute_only")
    return json.dumps({"lowered": D.fmt(sched.pipeline_order_with_comms)}, sort_keys=True)


def main():
    args = sys.argv[1:]
    if len(args) == 5:
        print(lowered(args[0], args[1], int(args[2]), int(args[3]), int(args[4])))
        return
    if not args or len(args) % 6:
        sys.exit("usage: torch_load_csv.py FILE SCHEDULE PP MICROBATCHES STAGES_PER_RANK [OUT [FILE ... OUT]...]")
    for i in range(0, len(args), 6):
        path, name, pp, n, v, out = args[i:i + 6]
        with open(out, "w") as fh:
            fh.write(lowered(path, name, int(pp), int(n), int(v)) + "\n")


if __name__ == "__main__":
    main()
