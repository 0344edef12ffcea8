"""python/commplan/diagnose.py without torch: Flight Recorder dumps made
from the plan's own expected trace (gen/expect.lua), one fault each, and
hostile dumps refused in one line naming the file and the field.

  python3 tests/python/test_diagnose.py      (closing line: "test_diagnose: N passed, M failed")
"""
import io
import json
import os
import pickle
import sys
import tempfile
from collections import OrderedDict
from contextlib import redirect_stderr, redirect_stdout

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from commplan import diagnose  # noqa: E402

PLAN = os.path.join(ROOT, "tests", "diagnose", "fr4.lua")
SYNC = os.path.join(ROOT, "tests", "diagnose", "fr4_sync.lua")
_EXP = {}


def exp_of(plan):
    if plan not in _EXP:
        _EXP[plan] = diagnose.expected(plan, [0, 1, 2, 3])
    return _EXP[plan]


def entries_of(rows, steps=1, drop=(), resize=None, stop=None):
    """A rank's entries as gloo's Flight Recorder writes FSDP2's step (reduce-scatter as all_reduce)."""
    out, seq, t = [], 0, 1_000_000_000
    for step in range(steps):
        flat = []
        for row in rows:
            for k in range(row.get("times", 1)):
                flat.append(row)
        for i, row in enumerate(flat):
            if (step, i) in drop:
                continue
            if stop is not None and (step, i) == stop:
                return out
            seq += 1
            t += 1000
            nin, nout = row["numel_in"], row["numel_out"]
            if resize and (step, i) == resize[0]:
                nin, nout = resize[1], resize[1] * 4
            op = "all_reduce" if row["op"] == "reduce_scatter" else row["op"]
            if op == "all_reduce":
                nout = nin
            out.append({"record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"],
                        "collective_seq_id": seq, "p2p_seq_id": 0, "profiling_name": "gloo:" + op,
                        "time_created_ns": t, "input_sizes": [[nin]], "input_dtypes": [row["dtype"]],
                        "output_sizes": [[nout]], "output_dtypes": [row["dtype"]], "state": "scheduled",
                        "is_p2p": False})
    return out


def write(dirname, rank, entries, completed=None, as_json=False):
    status = {}
    for e in entries:
        last = max(e["collective_seq_id"], status.get(str(e["pg_id"]), {}).get("last_enqueued_collective", 0))
        status[str(e["pg_id"])] = {"last_enqueued_collective": last, "last_started_collective": -1,
                                   "last_completed_collective": last if completed is None else completed}
    d = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}},
         "pg_status": status, "entries": entries}
    if as_json:
        with open(os.path.join(dirname, f"rank_{rank}.json"), "w") as f:
            json.dump(d, f)
    else:
        with open(os.path.join(dirname, f"rank_{rank}"), "wb") as f:
            pickle.dump(d, f)


def run(dirname, plan=PLAN):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = diagnose.main([dirname, plan])
    return rc, out.getvalue(), err.getvalue()


def case_agree():
    rows = exp_of(PLAN)["ranks"][0]["rows"]
    with tempfile.TemporaryDirectory() as d:
        for r in range(4):
            write(d, r, entries_of(rows, steps=2), as_json=(r == 3))
        rc, out, _ = run(d)
        assert rc == 0 and "nothing is pending" in out, out
        # the wrong plan: the same dumps against two micro-steps under sync_last depart
        rc, out, _ = run(d, SYNC)
        assert rc == 1 and "first departure from the plan: ranks 0-3 posted" in out, out


def case_skip():
    rows = exp_of(PLAN)["ranks"][0]["rows"]
    with tempfile.TemporaryDirectory() as d:
        for r in range(4):
            e = entries_of(rows, steps=2, drop={(1, 2)} if r == 1 else ())
            if r != 1:
                e = e[:11 + 3]  # the others stop in step 1's layers.1 all-gather, which rank 1 skipped
            write(d, r, e, completed=e[-1]["collective_seq_id"] - 1)
        rc, out, _ = run(d)
        assert rc == 1, out
        assert ("first departure from the plan: rank 1 posted all_gather 82 -> 328 Float as fsdp #14 (step 1) "
                "where the plan has all-gather of layers.1's parameters (forward") in out, out
        assert "it skipped the plan's all-gather of layers.1's parameters" in out, out


def case_behind():
    rows = exp_of(PLAN)["ranks"][0]["rows"]
    with tempfile.TemporaryDirectory() as d:
        for r in range(4):
            e = entries_of(rows, steps=2, stop=(1, 4) if r == 2 else (1, 5))
            write(d, r, e, completed=e[-1]["collective_seq_id"] - (0 if r == 2 else 1))
        rc, out, _ = run(d)
        assert rc == 1, out
        assert ("ranks 0,1,3 wait in #16 (all-gather of layers.2's parameters (backward, micro-step 0, stream "
                "all_gather)) for rank 2 (last posted #15") in out, out
        assert "the dumps agree with the plan everywhere they reach: the plan cannot see" in out, out


def case_missing_rank():
    rows = exp_of(PLAN)["ranks"][0]["rows"]
    with tempfile.TemporaryDirectory() as d:
        for r in (0, 1, 2):
            e = entries_of(rows, steps=1, stop=(0, 8))
            write(d, r, e, completed=e[-1]["collective_seq_id"] - 1)
        rc, out, _ = run(d)
        assert rc == 1 and "rank 3: no dump" in out and "for rank 3 (no dump)" in out, out


def entries_pp(rows, swap=None):
    """A pipeline rank's entries: each group by its DeviceMesh description, messages as p2p entries."""
    out, seq, p2p, t = [], {}, 0, 1_000_000_000
    order = list(rows)
    if swap:
        msgs = [i for i, row in enumerate(order) if "peer" in row]
        a, b = msgs[swap[0]], msgs[swap[1]]
        order[a], order[b] = order[b], order[a]
    pgs = {}
    for row in order:
        for _ in range(row.get("times", 1)):
            t += 1000
            fam = row.get("group") or row["pg"]
            name = pgs.setdefault(fam, str(len(pgs) + 1))
            e = {"record_id": len(out), "pg_id": int(name), "process_group": [name, "mesh_" + fam],
                 "time_created_ns": t, "input_dtypes": [row["dtype"]], "output_dtypes": [row["dtype"]],
                 "state": "scheduled", "p2p_seq_id": 0, "collective_seq_id": 0}
            if "peer" in row:
                p2p += 1
                e.update(is_p2p=True, p2p_seq_id=p2p, profiling_name="gloo:" + row["op"],
                         input_sizes=[[row["numel_in"]]], output_sizes=[[row["numel_in"]]])
            else:
                seq[fam] = seq.get(fam, 0) + 1
                e.update(is_p2p=False, collective_seq_id=seq[fam], profiling_name="gloo:" + row["op"],
                         input_sizes=[[row["numel_in"]]], output_sizes=[[row["numel_out"]]])
            out.append(e)
    return out


def case_pp_schedule():
    plan = os.path.join(ROOT, "tests", "plans", "llama_tiny_cppp.lua")
    exp = exp_of(plan)
    with tempfile.TemporaryDirectory() as d:
        for x in exp["ranks"]:
            write(d, x["rank"], entries_pp(x["rows"]))
        rc, out, _ = run(d, plan)
        assert rc == 0 and "nothing is pending" in out, out
    with tempfile.TemporaryDirectory() as d:
        for x in exp["ranks"]:
            write(d, x["rank"], entries_pp(x["rows"], swap=(1, 2) if x["rank"] == 2 else None))
        rc, out, _ = run(d, plan)
        assert rc == 1 and ("first departure from the plan: rank 2 posted recv of 16384 elements as its message 2 "
                            "of the step (step 0) where the plan has send of layers.") in out, out
        assert "its schedule differs: the plan has this recv next" in out, out


def case_runtime_cursor():
    """The runtime's cursor file (cp_cursor_write's lines): who waits in which collective for whom."""
    plan = os.path.join(ROOT, "tests", "diagnose", "fr4.lua")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "cursor_4242"), "w") as f:
            for r, (op, kind, unit) in enumerate([(3, "all_gather", "layers.0"), (3, "all_gather", "layers.0"),
                                                  (2, "forward", "root"), (3, "all_gather", "layers.0")]):
                f.write(json.dumps({"commplan_cursor": 1, "plan": "fr4", "rank": r, "step": 5, "op": op,
                                    "kind": kind, "unit": unit, "micro_step": 0, "in_op": 1}) + "\n")
        rc, out, _ = run(d)
        assert rc == 1 and "ranks 0,1,3 wait in all-gather of layers.0's parameters (forward, micro-step 0" in out, out
        assert "for rank 2 (step 5, op 2)" in out and "rank 2: step 5, in op 2 (forward of root" in out, out
        with open(os.path.join(d, "cursor_4242"), "a") as f:
            f.write('{"commplan_cursor": 1, "rank": "x"}\n')
        rc, out, err = run(d)
        assert rc == 2 and "cursor_4242: line 5.rank: expected an integer" in err, (out, err)


def cursors(d, name, rows, event=None):
    """A cursor file as cp_cursor_dump writes it: rows (rank, step, op, kind, unit, count, in_op)."""
    with open(os.path.join(d, name), "w") as f:
        if event:
            f.write(json.dumps(dict({"commplan_cursor": 1, "plan": "fr4"}, **event)) + "\n")
        for r, step, op, kind, unit, count, inside in rows:
            f.write(json.dumps({"commplan_cursor": 1, "plan": "fr4", "rank": r, "step": step, "op": op, "kind": kind,
                                "unit": unit, "micro_step": 0, "count": count, "in_op": inside}) + "\n")


def case_runtime_cursor_faults():
    """The cursors of a fault (runtime_faults.py's): a rank ahead of its group skipped what the others wait in;
    a count the plan does not have; a rank without a cursor waited for; each mutant of the cursors differs."""
    plan = os.path.join(ROOT, "tests", "diagnose", "fr4.lua")
    ag7, ag11 = (7, "all_gather", "layers.1", 66, 1), (11, "all_gather", "layers.2", 82, 1)
    with tempfile.TemporaryDirectory() as d:
        cursors(d, "cursor_1", [(r, 1) + (ag11 if r == 1 else ag7) for r in range(4)],
                {"event": "failure", "rank": 2, "why": "rank 2: all_gather on group fsdp disagrees"})
        rc, out, _ = run(d, plan)
        assert rc == 1 and "the runtime's failure on rank 2: all_gather on group fsdp disagrees" in out, out
        assert ("first departure from the plan: rank 1 is in op 11 (all-gather of layers.2's parameters (forward"
                in out and "it skipped 1 of the group's collectives: op 7 (all-gather of layers.1's" in out), out
    with tempfile.TemporaryDirectory() as d:  # the mutant: every rank where the plan has them
        cursors(d, "cursor_1", [(r, 1) + ag7 for r in range(4)])
        rc, out, _ = run(d, plan)
        assert "departure" not in out and "skipped" not in out, out
    with tempfile.TemporaryDirectory() as d:
        cursors(d, "cursor_1", [(r, 0, 3, "all_gather", "layers.0", 49 if r == 2 else 50, 1) for r in range(4)])
        rc, out, _ = run(d, plan)
        assert rc == 1 and ("first departure from the plan: rank 2 issued op 3 (all-gather of layers.0's parameters"
                            in out and "with 49 elements per rank where the plan has 50: a wrong size" in out), out
    with tempfile.TemporaryDirectory() as d:  # a process per rank; rank 3 killed, the others' SIGTERM lines folded
        for r in range(3):
            cursors(d, "cursor_%d" % (100 + r), [(r, 1) + ag11],
                    {"event": "terminated", "rank": -1, "why": "SIGTERM: the launcher stopped this process"})
        rc, out, _ = run(d, plan)
        assert rc == 1 and "the runtime's terminated on ranks 0-2: SIGTERM" in out, out
        assert "rank 3: no cursor" in out and "for rank 3 (no cursor: killed?)" in out, out


def refused(make, want):
    with tempfile.TemporaryDirectory() as d:
        make(d)
        rc, out, err = run(d)
        assert rc == 2 and not out and len(err.strip().splitlines()) == 1 and want in err, (rc, out, err)


def case_hostile():
    rows = exp_of(PLAN)["ranks"][0]["rows"]

    def with_class(d):
        with open(os.path.join(d, "rank_0"), "wb") as f:
            pickle.dump(OrderedDict(entries=[]), f)
    refused(with_class, "rank_0: not a Flight Recorder dump (pickle or JSON): refuses the class collections.OrderedDict")

    def bad_field(d):
        e = entries_of(rows)
        e[2]["input_sizes"] = [["x"]]
        write(d, 1, e)
    refused(bad_field, "rank_1: entries[2].input_sizes: expected a list of lists of non-negative integers")

    def bad_group(d):
        e = entries_of(rows)
        e[0]["process_group"] = "0"
        write(d, 0, e, as_json=True)
    refused(bad_group, "rank_0.json: entries[0].process_group: expected [name, desc] strings")

    def too_big(d):
        write(d, 0, entries_of(rows))
    saved = diagnose.MAX_FILE_BYTES
    diagnose.MAX_FILE_BYTES = 100
    try:
        refused(too_big, "rank_0: ")
        refused(too_big, "bytes, over the 0 MiB a dump may have")
    finally:
        diagnose.MAX_FILE_BYTES = saved

    def too_many(d):
        for r in range(3):
            write(d, r, [])
    saved = diagnose.MAX_FILES
    diagnose.MAX_FILES = 2
    try:
        refused(too_many, "3 files, over the 2 dumps one diagnosis reads")
    finally:
        diagnose.MAX_FILES = saved

    def not_a_dump(d):
        with open(os.path.join(d, "rank_0"), "wb") as f:
            f.write(b"\x00garbage")
    refused(not_a_dump, "rank_0: not a Flight Recorder dump")

    def past_world(d):
        write(d, 7, entries_of(rows))
    refused(past_world, "rank 7's dump: plan fr4 has world_size 4")


def case_bounds_and_errors():
    """A total-bytes budget and a cursor-file count, checked before parsing; a missing Lua, an
    unreadable dump: one line, exit 2, through python -m commplan.diagnose and `commplan diagnose`."""
    rows = exp_of(PLAN)["ranks"][0]["rows"]

    def two_dumps(d):
        write(d, 0, entries_of(rows))
        write(d, 1, entries_of(rows))
    saved = diagnose.MAX_TOTAL_BYTES
    diagnose.MAX_TOTAL_BYTES = os.path.getsize(__file__) // 1000  # well under two dumps
    try:
        refused(two_dumps, "bytes of dumps and cursors, over the 0 MiB one diagnosis reads")
    finally:
        diagnose.MAX_TOTAL_BYTES = saved

    def sparse(d):  # 4 sparse files of 60 MiB each: 240 MiB by st_size, nothing on disk
        for r in range(4):
            with open(os.path.join(d, f"rank_{r}"), "wb") as f:
                f.truncate(60 << 20)
    diagnose.MAX_TOTAL_BYTES = 200 << 20
    try:
        refused(sparse, "over the 200 MiB one diagnosis reads")
    finally:
        diagnose.MAX_TOTAL_BYTES = saved

    def cursors(d):
        for i in range(3):
            with open(os.path.join(d, f"cursor_{i}"), "w") as f:
                f.write(json.dumps({"commplan_cursor": 1, "plan": "fr4", "rank": i, "step": 1, "op": 0,
                                    "in_op": 0}) + "\n")
    saved_c = diagnose.MAX_CURSOR_FILES
    diagnose.MAX_CURSOR_FILES = 2
    try:
        refused(cursors, "3 cursor files, over the 2 one diagnosis reads")
    finally:
        diagnose.MAX_CURSOR_FILES = saved_c

    if os.geteuid() != 0:
        def unreadable(d):
            write(d, 0, entries_of(rows))
            os.chmod(os.path.join(d, "rank_0"), 0)
        refused(unreadable, "rank_0: cannot read it: Permission denied")

    # an OSError reading a dump (EIO; as root chmod 0 reads anyway) and a plan's trace without a
    # field: one line each, exit 2, no traceback
    import errno
    saved_rd, saved_exp = diagnose.read_dump, diagnose.expected

    def eio(path):
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)
    diagnose.read_dump = eio
    try:
        refused(lambda d: write(d, 0, entries_of(rows)), "rank_0: cannot read it: Input/output error")
    finally:
        diagnose.read_dump = saved_rd
    diagnose.expected = lambda plan, ranks: {"plan": "fr4"}
    try:
        refused(lambda d: write(d, 0, entries_of(rows)), "unexpected KeyError: 'world_size'")
    finally:
        diagnose.expected = saved_exp

    import subprocess
    with tempfile.TemporaryDirectory() as d:
        write(d, 0, entries_of(rows))
        env = dict(os.environ, COMMPLAN_LUA="/nonexistent/lua5.4", PYTHONPATH=os.path.join(ROOT, "python"))
        for cmd in ([sys.executable, "-m", "commplan.diagnose", d, PLAN],
                    [sys.executable, "-m", "commplan", "diagnose", d, PLAN],
                    [sys.executable, "-m", "commplan", "expect", PLAN]):
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            lines = p.stderr.strip().splitlines()
            assert p.returncode == 2 and len(lines) == 1 and "/nonexistent/lua5.4: cannot run the Lua interpreter" \
                in lines[0] and "COMMPLAN_LUA" in lines[0], (cmd, p.returncode, p.stderr)


def main():
    passed = failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("case_"):
            try:
                fn()
                passed += 1
            except AssertionError as e:
                failed += 1
                print(f"FAIL {name}: {str(e)[:2000]}")
    print(f"test_diagnose: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
