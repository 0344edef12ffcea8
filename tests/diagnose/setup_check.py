"""The diagnosis's setup rule without torch (tests/diagnose/faults.py runs it
first in every tier): a job's collectives before the plan's first step
(torchtitan's DTensor all-gathers of Bool masks at initialisation) are left
out of the step count only where they are none of the plan's collectives,
every rank of the group has the same, and the step's first op follows; each
check has a mutant that must depart.

  python3 tests/diagnose/setup_check.py    (closing line: "setup rule: N checks, M failed")
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import test_diagnose as T  # noqa: E402 -- dumps made from the plan's expected trace


def setup_entries(n, dtype="Bool", numel=64):
    """n setup all-gathers on the default group (ids 1..n)."""
    return [{"record_id": k, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": k + 1,
             "p2p_seq_id": 0, "profiling_name": "gloo:all_gather", "time_created_ns": 1000 + k,
             "input_sizes": [[numel]], "input_dtypes": [dtype], "output_sizes": [[numel * 4]],
             "output_dtypes": [dtype], "state": "scheduled", "is_p2p": False} for k in range(n)]


def shifted(rows, n, steps=2):
    """The step's entries after n setup entries: ids and record ids moved by n."""
    out = T.entries_of(rows, steps=steps)
    for e in out:
        e["collective_seq_id"] += n
        e["record_id"] += n
    return out


def dumps(d, per_rank):
    for r, es in per_rank.items():
        T.write(d, r, es)
    return T.run(d)


def main():
    rows = T.exp_of(T.PLAN)["ranks"][0]["rows"]
    checks = []
    with tempfile.TemporaryDirectory() as d:
        rc, out, _ = dumps(d, {r: setup_entries(3) + shifted(rows, 3) for r in range(4)})
        checks.append(("3 Bool setup all-gathers on every rank: left out, the steps agree",
                       rc == 0 and "the job's setup" in out and "3 on world (ranks 0-3)" in out
                       and "nothing is pending" in out, out))
    with tempfile.TemporaryDirectory() as d:
        per = {r: setup_entries(3) + shifted(rows, 3) for r in range(4)}
        per[2] = setup_entries(2) + shifted(rows, 2)
        rc, out, _ = dumps(d, per)
        checks.append(("mutant: rank 2 with 2 setup entries where the others have 3: no prefix, a departure",
                       rc == 1 and "the job's setup" not in out and "first departure from the plan" in out, out))
    with tempfile.TemporaryDirectory() as d:
        # a Float all-gather of the plan's first op's size before the step: one of the plan's collectives,
        # not setup; the ids are not shifted past it
        first = [x for x in rows if "ranks" in x][0]
        rc, out, _ = dumps(d, {r: setup_entries(1, "Float", first["numel_in"]) + shifted(rows, 1) for r in range(4)})
        checks.append(("mutant: an entry like the plan's first op before the step is not setup",
                       rc == 1 and "the job's setup" not in out and "first departure from the plan" in out, out))
    failed = 0
    for what, ok, out in checks:
        print(f"setup rule: {'ok' if ok else 'FAIL'}: {what}")
        if not ok:
            failed += 1
            print("    " + out.replace("\n", "\n    "))
    print(f"setup rule: {len(checks)} checks, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
