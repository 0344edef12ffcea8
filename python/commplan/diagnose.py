"""Diagnosis of a hang or a mismatch against the plan, from PyTorch's
Flight Recorder dumps (one per rank, as torch writes them on a timeout or
on demand: torch._C._distributed_c10d._dump_fr_trace_file / _dump_fr_trace
(pickle) or _dump_fr_trace_json).

    python3 -m commplan.diagnose DUMP_DIR PLAN.lua|plan.json [--prefix P]
    python3 -m commplan.diagnose expect PLAN [--rank R] [--json]

The plan's expected trace comes from gen/expect.lua (`lua5.4 gen/verbs.lua
expect PLAN --ranks A-B --json`): for every rank, each collective the step
issues on which group instance, its per-group sequence id, element counts
and dtype, and the plan's name for it. Each dump entry is placed by its
group and collective_seq_id (step = (id - 1) // per_step, the ids counted
after a job's setup collectives and a pipeline's shape inference where the
dumps show them: setup_prefix, shape_inference), and compared with the
plan's row there. The report, a few lines:

  which step and op each rank reached (ranks in the same state folded);
  the first departure from the plan: rank, step, op, and its kind (a
    collective the plan does not have there, one it skipped, a wrong size
    or dtype, a group the plan has no ops on);
  who waits for whom on which group instance, in the plan's words;
  where the dumps agree with the plan everywhere, that they do and what the
    plan cannot see (a rank not in any collective: slow compute or host
    code; every member posted and nothing completed: below the collective
    library), with the time each rank entered the op.

Input is bounded: at most MAX_FILES dumps of at most MAX_FILE_BYTES each,
MAX_TOTAL_BYTES in all and MAX_CURSOR_FILES cursor files, checked before a
byte is parsed; a pickle is read by an unpickler that
builds no object but dicts, lists, tuples, strings and numbers; a bad dump
is one line naming the file and the field. Exit status: 0 the dumps agree
with the plan, 1 a departure or a hang was found, 2 bad input.
"""
import io
import json
import os
import pickle
import re
import subprocess
import sys

MAX_FILES = 4096
MAX_FILE_BYTES = 64 << 20
MAX_ENTRIES = 1 << 20
MAX_TOTAL_BYTES = 2 << 30  # all the dumps and cursor files of one diagnosis, from st_size before parsing
MAX_CURSOR_FILES = 64


def _verbs(plan=None):
    """[lua, <root>/gen/verbs.lua]: the generator as the `commplan` command finds it
    (commplan/generator.py: COMMPLAN_ROOT, the checkout, or the copy installed as commplan/_root/;
    COMMPLAN_LUA, else LUA (the Makefile's), else lua5.4 on PATH)."""
    from . import generator
    from .errors import PlanError
    try:
        exe = os.environ.get("COMMPLAN_LUA") or os.environ.get("LUA") or generator.lua()
        return [exe, os.path.join(generator.find_root(plan), "gen", "verbs.lua")]
    except PlanError as e:
        raise BadInput(str(e)) from None


def _run_lua(cmd, **kw):
    try:
        return subprocess.run(cmd, **kw)
    except OSError as e:
        raise BadInput(f"{cmd[0]}: cannot run the Lua interpreter: {e.strerror or e}; install Lua 5.4 "
                       "or set COMMPLAN_LUA to it") from None
    except subprocess.TimeoutExpired:
        raise BadInput(f"{cmd[1]}: the expect verb ran past {kw.get('timeout')} s; give a smaller plan "
                       "or fewer ranks") from None


class BadInput(Exception):
    pass


# ------------------------------------------------------------ reading dumps

class _DataUnpickler(pickle.Unpickler):
    """A Flight Recorder dump is dicts, lists, tuples, strings, numbers and
    None: any class reference is refused (no code runs while loading)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refuses the class {module}.{name}")


_RANK_RE = re.compile(r"(\d+)(\.json)?$")


def _int(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?\d{1,19}", v):
        return int(v)
    return None


def _check_entry(name, i, e):
    where = f"{name}: entries[{i}]"
    if not isinstance(e, dict):
        raise BadInput(f"{where}: not an object")
    pg = e.get("process_group")
    if not (isinstance(pg, (list, tuple)) and len(pg) == 2 and all(isinstance(x, str) for x in pg)):
        raise BadInput(f"{where}.process_group: expected [name, desc] strings")
    for k in ("collective_seq_id", "p2p_seq_id", "record_id", "time_created_ns"):
        if k in e and _int(e[k]) is None:
            raise BadInput(f"{where}.{k}: expected an integer, got {str(e[k])[:40]!r}")
    if "collective_seq_id" not in e:
        raise BadInput(f"{where}.collective_seq_id: missing")
    if not isinstance(e.get("profiling_name"), str):
        raise BadInput(f"{where}.profiling_name: expected a string")
    for k in ("input_sizes", "output_sizes"):
        v = e.get(k, [])
        if not (isinstance(v, list) and all(isinstance(s, list) and all(_int(x) is not None and _int(x) >= 0
                                                                        for x in s) for s in v)):
            raise BadInput(f"{where}.{k}: expected a list of lists of non-negative integers")
    for k in ("input_dtypes", "output_dtypes"):
        v = e.get(k, [])
        if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise BadInput(f"{where}.{k}: expected a list of dtype names")


def read_dump(path):
    """One dump (pickle or JSON) as a dict, its entries checked."""
    name = os.path.basename(path)
    st = os.stat(path)
    if st.st_size > MAX_FILE_BYTES:
        raise BadInput(f"{name}: {st.st_size} bytes, over the {MAX_FILE_BYTES >> 20} MiB a dump may have "
                       "(TORCH_FR_BUFFER_SIZE entries make a few MiB); give the dump directory of one job")
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    try:
        if data[:1] in (b"{", b"["):
            d = json.loads(data.decode("utf-8"))
        else:
            d = _DataUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 -- any parse failure is this file's
        raise BadInput(f"{name}: not a Flight Recorder dump (pickle or JSON): {str(e)[:120]}") from None
    if not isinstance(d, dict):
        raise BadInput(f"{name}: not a Flight Recorder dump: the top level is not a dict")
    entries = d.get("entries")
    if not isinstance(entries, list):
        raise BadInput(f"{name}: entries: missing or not a list")
    if len(entries) > MAX_ENTRIES:
        raise BadInput(f"{name}: entries: {len(entries)} of them, over {MAX_ENTRIES}")
    for i, e in enumerate(entries):
        _check_entry(name, i, e)
    st_ = d.get("pg_status", {})
    if not isinstance(st_, dict):
        raise BadInput(f"{name}: pg_status: not a dict")
    return d


def read_cursors(path, data):
    """The runtime's cursor file (runtime/executor.c cp_cursor_dump: one JSON line per rank, after one
    line naming the event, a "timeout" or a "failure", and the failing rank's line why, when the job's
    first failure wrote it)."""
    name = os.path.basename(path)
    out = []
    for i, line in enumerate(data.decode("utf-8", "replace").splitlines()):
        if not line.strip():
            continue
        try:
            c = json.loads(line)
        except ValueError:
            raise BadInput(f"{name}: line {i + 1}: not a JSON object (a cursor line cut short?)") from None
        keys = ("rank",) if isinstance(c, dict) and "event" in c else ("rank", "step", "op", "in_op")
        for k in keys:
            if not isinstance(c, dict) or _int(c.get(k)) is None:
                raise BadInput(f"{name}: line {i + 1}.{k}: expected an integer")
        if "event" in c and not (isinstance(c["event"], str) and isinstance(c.get("why", ""), str)):
            raise BadInput(f"{name}: line {i + 1}.event: expected an event name and a line why")
        out.append(c)
    for c in out:  # an event a signal wrote names no rank: the ranks whose cursors the file holds
        if "event" in c and _int(c["rank"]) < 0:
            c["ranks"] = [_int(x["rank"]) for x in out if "event" not in x]
    return out


def read_dir(path, prefix=None):
    """{rank: dump} of the files in path whose name ends in the rank; the
    runtime's cursor files (any name) under the key "cursors"."""
    if not os.path.isdir(path):
        raise BadInput(f"{path}: not a directory of Flight Recorder dumps")
    names = sorted(n for n in os.listdir(path) if not n.startswith("."))
    if len(names) > MAX_FILES:
        raise BadInput(f"{path}: {len(names)} files, over the {MAX_FILES} dumps one diagnosis reads")
    # First what will be read and its size (st_size, before a byte is parsed), then the reading.
    cursor_files, dump_files, total = [], [], 0
    for n in names:
        full = os.path.join(path, n)
        if not os.path.isfile(full) or os.path.islink(full):
            continue
        if prefix is not None and not n.startswith(prefix):
            continue
        size = os.path.getsize(full)
        if size <= MAX_FILE_BYTES:
            with open(full, "rb") as f:
                head = f.read(20)
            if head.startswith(b'{"commplan_cursor"'):
                cursor_files.append(full)
                total += size
                continue
        m = _RANK_RE.search(n)
        if not m:
            continue
        dump_files.append((n, full, int(m.group(1))))
        total += min(size, MAX_FILE_BYTES + 1)
    if len(cursor_files) > MAX_CURSOR_FILES:
        raise BadInput(f"{path}: {len(cursor_files)} cursor files, over the {MAX_CURSOR_FILES} one diagnosis "
                       "reads; give the directory of one job's cursors")
    if total > MAX_TOTAL_BYTES:
        raise BadInput(f"{path}: {total} bytes of dumps and cursors, over the {MAX_TOTAL_BYTES >> 20} MiB one "
                       "diagnosis reads; give the dumps of one job (or --prefix)")
    dumps = {}
    for full in cursor_files:
        with open(full, "rb") as f:
            dumps.setdefault("cursors", []).extend(read_cursors(full, f.read(MAX_FILE_BYTES)))
    for n, full, r in dump_files:
        if r in dumps:
            raise BadInput(f"{n}: a second dump of rank {r}; give the dump directory of one job (or --prefix)")
        dumps[r] = read_dump(full)
    if not dumps:
        raise BadInput(f"{path}: no dump files (<prefix><rank>, as TORCH_FR_DUMP_TEMP_FILE names them)")
    return dumps


# ------------------------------------------------------------ the plan

def expected(plan, ranks):
    """The expected trace (gen/expect.lua) of ranks lo..hi of the plan."""
    lo, hi = min(ranks), max(ranks)
    cmd = _verbs(plan) + ["expect", plan, "--ranks", f"{lo}-{hi}", "--json"]
    p = _run_lua(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise BadInput((p.stderr.strip().splitlines() or ["the expect verb failed"])[-1])
    try:
        return json.loads(p.stdout)
    except ValueError as e:
        raise BadInput(f"{plan}: the expect verb's output is not JSON ({str(e)[:80]}); "
                       "is the generator a commplan checkout's?") from None


def expand(rows):
    """{rank tuple: {id: row}} and {rank tuple: ids per step}: folded rows expanded."""
    by = {}
    for pos, row in enumerate(rows):
        if "ranks" not in row:
            continue
        key = group_key(row["group"], row["ranks"])
        ids = by.setdefault(key, {})
        for k in range(row.get("times", 1)):
            i = row["group_seq"] + k * row.get("stride", 0)
            ids[i] = dict(row, pos=pos, rep=k)
    return by, {k: max(v) for k, v in by.items()}


# ------------------------------------------------------------ matching

_OPS = {"all_gather": "all_gather", "_allgather_base": "all_gather", "allgather": "all_gather",
        "all_gather_into_tensor_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
        "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
        "reduce_scatter_tensor_coalesced": "reduce_scatter", "reducescatter": "reduce_scatter",
        "all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
        "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
        "all_to_allv": "all_to_all", "send": "send", "recv": "recv", "recv_any_source": "recv",
        "broadcast": "broadcast", "barrier": "barrier"}


def fr_op(entry):
    name = entry["profiling_name"].split(":", 1)[-1]
    return _OPS.get(name, name)


def numel(sizes):
    n = 0
    for s in sizes:
        k = 1
        for x in s:
            k *= _int(x)
        n += k
    return n


def matches(row, e):
    """'' when entry e is the row's collective, else what differs."""
    op, nin, nout = fr_op(e), numel(e.get("input_sizes", [])), numel(e.get("output_sizes", []))
    dt = (e.get("input_dtypes") or [None])[0]
    want = row["op"]
    # gloo records FSDP2's reduce-scatter as an all_reduce of the whole input
    gloo_rs = want == "reduce_scatter" and op == "all_reduce" and nin == row.get("numel_in") and nout == nin
    if op != want and not gloo_rs:
        return "collective"
    if row.get("numel_in") is not None and not gloo_rs and (nin != row.get("numel_in") or nout != row.get("numel_out")):
        return "size"
    if row.get("dtype") and dt and dt != row["dtype"]:
        return "dtype"
    return ""


def entry_text(e):
    dt = (e.get("input_dtypes") or ["?"])[0]
    return f"{fr_op(e)} {numel(e.get('input_sizes', []))} -> {numel(e.get('output_sizes', []))} {dt}"


def row_text(row):
    n = f"{row['numel_in']} -> {row['numel_out']} " if row.get("numel_in") is not None else ""
    return f"{row['op']} {n}{row.get('dtype', '')}"


class Group:
    """A process group of the dumps, placed on a plan group instance (its ranks)."""

    def __init__(self, name, desc):
        self.name, self.desc, self.ranks = name, desc, None


WORLD_SIZE = [0]


def group_key(family, ranks):
    """A plan group instance as torch's process groups tell them apart: a
    mesh dim's own group (family, ranks), and every dim spanning the whole
    world the default group, which DeviceMesh reuses for it
    (torch/distributed/device_mesh.py, "Reuse default_group")."""
    ranks = tuple(ranks)
    return ("world", ranks) if len(ranks) == WORLD_SIZE[0] else (family, ranks)


def place_groups(dumps, plan_rows, world):
    """{(rank, pg name): group_key of the plan instance} for every entry's group."""
    WORLD_SIZE[0] = world
    seen = {}
    for r, d in dumps.items():
        for e in d["entries"]:
            seen.setdefault(tuple(e["process_group"]), set()).add(r)
    fam = {}  # plan group family -> {rank: tuple}
    for r, rows in plan_rows.items():
        for row in rows:
            if "ranks" in row:
                fam.setdefault(row["group"], {})[r] = group_key(row["group"], row["ranks"])
            elif "pg_ranks" in row:
                fam.setdefault(row["pg"], {})[r] = group_key(row["pg"], row["pg_ranks"])
    place = {}
    for (name, desc), ranks_seen in seen.items():
        family = desc[5:] if desc.startswith("mesh_") else desc
        for r in ranks_seen:
            key = None
            if family in fam and r in fam[family]:
                key = fam[family][r]
            elif desc in ("default_pg", "mesh_default") or name == "0":
                key = ("world", tuple(range(world)))
            else:
                # the plan instances that hold r and every rank seen on this group
                cands = {t for f in fam.values() for rr, t in f.items() if rr == r and ranks_seen <= set(t[1])}
                if len(cands) == 1:
                    key = cands.pop()
            place[(r, name)] = key
    return place


def _fold(ranks):
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _pending(d, e):
    st = d.get("pg_status", {}).get(str(e.get("pg_id", "")))
    if isinstance(st, dict) and _int(st.get("last_completed_collective")) is not None:
        return _int(e["collective_seq_id"]) > _int(st["last_completed_collective"])
    return e.get("state") not in ("completed",)


def setup_prefix(entries, place, r, by):
    """{group key: k}: rank r's first k entries on a group (ids 1..k) are the
    job's setup, before the plan's first step (a torchtitan job's parameter
    initialisation and checks: DTensor's all-gathers of Bool masks, the
    pipeline group's all-reduce of an Int), when every collective the rank
    recorded before its first op of the step (in record order: the first
    entry that is its group's first op of the plan's step) is none of the
    plan's collectives on its group. Without such a prefix the ids count from
    the plan's step 0 (k = 0). diagnose() keeps a group's prefix only where
    every member with a dump has the same."""
    es = sorted((e for e in entries if not e.get("is_p2p")),
                key=lambda e: (_int(e.get("record_id", 0)), _int(e["collective_seq_id"])))
    out = {}
    for e in es:
        key = place.get((r, e["process_group"][0]))
        rows = by.get(key, {})
        if rows and 1 in rows and not matches(rows[1], e) and _int(e["collective_seq_id"]) == out.get(key, 0) + 1:
            return {k: v for k, v in out.items() if k is not None}
        if any(not matches(row, e) for row in rows.values()):
            return {}
        out[key] = _int(e["collective_seq_id"])
    return {}


def shape_inference(entries, place, r, by, skip):
    """{group key: j}: on a pipeline rank, torch.distributed.pipelining's
    shape inference (the schedule's _initialize_stage(s) before the first
    step: the stage's forward run once, torch/distributed/pipelining/stage.py
    _shape_inference) unshards the stage's FSDP units: the step's first j
    all-gathers, then the step begins again from its first. Where a group's
    entries after the setup are rows 1..j and then row 1 again, those j are
    left out too."""
    seqs = {}
    for e in entries:
        key = place.get((r, e["process_group"][0]))
        if not e.get("is_p2p") and key in by:
            seqs.setdefault(key, {})[_int(e["collective_seq_id"])] = e
    out = {}
    for key, es in seqs.items():
        rows, k0 = by[key], skip.get(key, 0)
        j = 0
        while (j + 1 in rows and rows[j + 1]["op"] == "all_gather" and k0 + j + 1 in es
               and not matches(rows[j + 1], es[k0 + j + 1])):
            j += 1
        nxt = es.get(k0 + j + 1)
        if j and nxt is not None and not matches(rows[1], nxt) and (j + 1 not in rows or matches(rows[j + 1], nxt)):
            out[key] = j
    return out


def _messages_between(r, rows, last, key):
    """Where rank r's plan has only sends and receives between the collective
    it last posted and its next on the group: what gloo's dumps cannot show."""
    n, msgs = len(rows), []
    for k in range(1, n):
        row = rows[(last["pos"] + k) % n]
        if "ranks" in row:
            if group_key(row["group"], row["ranks"]) == key:
                break
            continue
        if "pg_ranks" in row:
            msgs.append(row)
    if not msgs:
        return ""
    names = "; ".join(m["name"] for m in msgs[:3]) + ("; ..." if len(msgs) > 3 else "")
    return (f"; between them rank {r}'s plan has only {sum(m.get('times', 1) for m in msgs)} sends and receives "
            f"({names}), which the dumps do not record (gloo's Flight Recorder has no point-to-point ops): "
            f"rank {r} is in one of them or in compute, and a schedule of its own (other microbatches, another "
            "order) is what the dumps cannot tell from a slow rank")


def diagnose(dumps, exp):
    """The report's lines and whether something departed or hangs."""
    world = exp["world_size"]
    WORLD_SIZE[0] = world
    plan_rows = {x["rank"]: x["rows"] for x in exp["ranks"]}
    place = place_groups(dumps, plan_rows, world)
    lines = [f"plan {exp['plan']} ({exp['fingerprint']}), world {world}: {len(dumps)} dumps "
             f"(ranks {_fold(dumps)})"]
    missing = [r for r in sorted(plan_rows) if r not in dumps]
    state = {}      # rank -> (step, row, entry, pending)
    departures = []  # (step, pos, time, rank, text)
    posted = {}     # group key -> {rank: (seq, pending, entry, row, step, time)}
    unseen = {}     # sends and receives per step -> ranks whose dump records none
    setup = {}      # (group key, k) -> ranks whose first k entries on it are the job's setup
    skips = {r: setup_prefix(d["entries"], place, r, expand(plan_rows.get(r, []))[0]) for r, d in dumps.items()}
    for key in {k for s in skips.values() for k in s}:
        members = [r for r in dumps if r in key[1]]
        if len({skips[r].get(key, 0) for r in members}) > 1:  # the members disagree: no setup prefix
            for r in members:
                skips[r].pop(key, None)
    for r, sk in skips.items():
        for key, k in sk.items():
            setup.setdefault((key, k), []).append(r)
    inferred = {}   # (group key, j) -> pipeline ranks whose shape inference all-gathered the step's first j
    for r, d in dumps.items():
        if any("pg_ranks" in row for row in plan_rows.get(r, [])):
            for key, j in shape_inference(d["entries"], place, r, expand(plan_rows[r])[0], skips[r]).items():
                skips[r][key] = skips[r].get(key, 0) + j
                inferred.setdefault((key, j), []).append(r)
    for r, d in sorted(dumps.items()):
        by, per = expand(plan_rows.get(r, []))
        first = None
        last = None
        p2p_rows = {}  # pg rank tuple -> the rank's sends and receives over it, in the plan's order
        for row in plan_rows.get(r, []):
            if "pg_ranks" in row:
                p2p_rows.setdefault(group_key(row["pg"], row["pg_ranks"]), []).extend([row] * row.get("times", 1))
        p2p_seen = {}
        skip = skips.get(r, {})
        for e in sorted(d["entries"], key=lambda e: (_int(e.get("record_id", 0)), _int(e["collective_seq_id"]))):
            if e.get("is_p2p"):
                key = place.get((r, e["process_group"][0]))
                t = _int(e.get("time_created_ns", 0)) or 0
                plist = p2p_rows.get(key)
                if not plist:
                    if first is None:
                        first = (10 ** 9, 0, t, r, f"posted {entry_text(e)} on process group {e['process_group'][0]} "
                                                   f"({e['process_group'][1]}): the plan has no messages there")
                    continue
                k = p2p_seen.get(key, 0)
                p2p_seen[key] = k + 1
                step, row = k // len(plist), plist[k % len(plist)]
                op = fr_op(e)
                n = max(numel(e.get("input_sizes", [])), numel(e.get("output_sizes", [])))
                if (op != row["op"] or n != row["numel_in"]) and first is None:
                    kind = "a wrong size" if op == row["op"] else "a message the plan does not have there"
                    nxt = plist[(k + 1) % len(plist)]
                    if nxt["op"] == op and nxt["numel_in"] == n:
                        kind = f"its schedule differs: the plan has this {op} next ({nxt['name']})"
                    first = (step, row.get("seq", 0), t, r,
                             f"posted {op} of {n} elements as its message {k % len(plist) + 1} of the step (step "
                             f"{step}) where the plan has {row['name']}: {row['op']} of {row['numel_in']}; {kind}")
                continue
            seq = _int(e["collective_seq_id"])
            key = place.get((r, e["process_group"][0]))
            t = _int(e.get("time_created_ns", 0)) or 0
            if seq <= skip.get(key, 0):
                continue
            if key is None or key not in per:
                text = (f"posted {entry_text(e)} on process group {e['process_group'][0]} "
                        f"({e['process_group'][1]}), #{seq}: a group the plan has no collectives on for rank {r}")
                if first is None:
                    first = (10 ** 9, 0, t, r, text)
                continue
            n = per[key]
            step, i = (seq - skip.get(key, 0) - 1) // n, (seq - skip.get(key, 0) - 1) % n + 1
            row = by[key][i]
            why = matches(row, e)
            pend = _pending(d, e)
            last = (step, row, e, pend, key)
            posted.setdefault(key, {})[r] = (seq, pend, e, row, step, t)
            if why and first is None:
                kind = {"collective": "a collective the plan does not have there", "size": "a wrong size",
                        "dtype": "a wrong dtype"}[why]
                skipped = False
                for ahead in range(1, 4):
                    nxt = by[key].get((i - 1 + ahead) % n + 1)
                    if nxt and not matches(nxt, e):
                        kind = (f"it skipped the plan's {row['name'].split(' on ')[0]}" if ahead == 1 else
                                f"it skipped {ahead} of the plan's ops from {row['name'].split(' on ')[0]}")
                        skipped = True
                        break
                if not skipped:
                    same = [x for x in by[key].values() if not matches(x, e)]
                    if same:
                        kind += (f"; the plan issues {entry_text(e).split(' ')[0]} of this size as "
                                 f"{same[0]['name'].split(' on ')[0]}, #{same[0]['group_seq']} of a step")
                first = (step, row["pos"], t, r,
                         f"posted {entry_text(e)} as {row['group']} #{seq} (step {step}) where the plan "
                         f"has {row['name']}: {row_text(row)}; {kind}")
        if first:
            departures.append(first)
        if last:
            state[r] = last
        n_msgs = sum(len(v) for v in p2p_rows.values())
        if n_msgs and not p2p_seen:
            unseen.setdefault(n_msgs, []).append(r)
    # which step and op each rank reached
    groups = {}
    for r, (step, row, e, pend, _) in state.items():
        off = "" if not matches(row, e) else f", posting {entry_text(e)} there"
        groups.setdefault((step, _int(e["collective_seq_id"]), row["name"], row.get("rep", 0), pend, off),
                          []).append(r)
    for (step, seq, name, rep, pend, off), rs in sorted(groups.items(), key=lambda x: (x[0][:2], x[1])):
        rep_t = f" (repetition {rep + 1})" if rep else ""
        lines.append(f"{'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)}: step {step}, "
                     f"#{seq} {name}{rep_t}{off} ({'not completed' if pend else 'completed'})")
    if setup:
        parts = []
        for (key, k), rs in sorted(setup.items()):
            g = "world" if key[0] == "world" else f"{key[0]} [ranks {_fold(key[1])}]"
            parts.append(f"{k} on {g} ({'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)})")
        lines.append("before the plan's step 0, the job's setup (collectives the plan does not have, left out; "
                     "ids counted from the step's first): " + ", ".join(parts))
    for (key, j), rs in sorted(inferred.items()):
        lines.append(f"{'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)}: the pipeline's shape inference before "
                     f"step 0 all-gathered the step's first {j} units on {key[0]} [ranks {_fold(key[1])}] "
                     "(left out too)")
    for r in missing:
        lines.append(f"rank {r}: no dump (killed, or it wrote none)")
    for n, rs in sorted(unseen.items()):
        lines.append(f"{'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)}: the plan has {n} sends and receives per "
                     "step; the dump records none (gloo's Flight Recorder records no point-to-point ops), so the "
                     "pipeline's messages are not checked")
    # who waits for whom
    hang = False
    waits = []
    for key, per_rank in posted.items():
        # the frontier: the ranks that posted the group's latest id wait for
        # the members behind it (a collective completes only when every member
        # posted it; on gloo a timed-out one reads as completed)
        top = max(v[0] for v in per_rank.values())
        at_top = sorted(r for r, v in per_rank.items() if v[0] == top)
        behind = sorted(set(key[1]) - set(at_top))
        waiting = at_top if behind else sorted(r for r in at_top if per_rank[r][1])
        if not waiting:
            continue
        hang = True
        row = per_rank[waiting[0]][3]
        posts = {}
        for r in at_top:
            posts.setdefault(entry_text(per_rank[r][2]), []).append(r)
        if len(posts) > 1:
            waits.append(f"{row['group']} group {row['instance']} [ranks {_fold(key[1])}]: its members posted different "
                         f"collectives as #{top}: " + ", ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)} {t}"
                                                                for t, rs in posts.items())
                         + f"; the plan has {row_text(row)} ({row['name'].split(' on ')[0]})")
        elif behind:
            why = []
            for b in behind:
                if b not in dumps:
                    why.append(f"rank {b} (no dump)")
                elif b in per_rank:
                    s = per_rank[b]
                    why.append(f"rank {b} (last posted #{s[0]}, {s[3]['name'].split(' (')[0]}"
                               f"{', not completed' if s[1] else ', completed'})" + _messages_between(
                                   b, plan_rows.get(b, []), s[3], key))
                else:
                    why.append(f"rank {b} (posted nothing on it)")
            waits.append(f"{row['group']} group {row['instance']} [ranks {_fold(key[1])}]: "
                         f"{'rank' if len(waiting) == 1 else 'ranks'} {_fold(waiting)} "
                         f"wait{'s' if len(waiting) == 1 else ''} in #{top} ({row['name'].split(' on ')[0]}) for " + ", ".join(why))
        else:
            t0 = min(per_rank[r][5] for r in waiting)
            times = ", ".join(f"r{r} +{(per_rank[r][5] - t0) / 1e9:.3f} s" for r in waiting)
            waits.append(f"{row['group']} group {row['instance']} [ranks {_fold(key[1])}]: every member posted #{top} "
                         f"({row['name'].split(' on ')[0]}) and it did not complete: entry times {times}")
    if departures:
        departures.sort()
        folded = {}
        for d in departures:
            folded.setdefault(d[4], []).append(d[3])
        seen = []
        for d in departures:
            if d[4] not in seen:
                seen.append(d[4])
        for k, body in enumerate(seen[:3]):
            rs = folded[body]
            who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {_fold(rs)}"
            lines.append(("first departure from the plan: " if k == 0 else "  then: ") + f"{who} {body}")
    lines.extend(waits)
    if not departures:
        if hang:
            lines.append("the dumps agree with the plan everywhere they reach: the plan cannot see why a rank "
                         "has not posted (slow compute, host code, a dead process) or why a posted collective "
                         "does not complete (below the collective library: network, NCCL)")
        else:
            lines.append("the dumps agree with the plan everywhere they reach; nothing is pending")
    return lines, bool(departures) or hang or bool(missing)


def _row_count(row):
    """The count a collective's op issues per rank (the cursor's "count"), from the plan's row."""
    if row.get("numel_in") is None or row["op"] == "all_to_all":  # an exchange's count is not the row's elements
        return None
    return row["numel_out"] if row["op"] == "reduce_scatter" else row["numel_in"]


def _short(row):
    return row["name"].split(" on ")[0]


def _same(a, b):
    return a["op"] == b["op"] and a.get("numel_in") == b.get("numel_in") and a.get("dtype") == b.get("dtype")


def _skipped_text(lst, n, lp, d, step):
    """What a rank d collectives ahead of the others (at linear position lp of the group's list lst,
    n per step) skipped: the earliest op it may have skipped is the first from which every
    collective up to lp pairs with the one d later (kind, size, dtype: as a collective library pairs
    them), so the ranks met there unaware."""
    x = lp
    while x - 1 >= max(lp - 4 * n, 0) and _same(lst[(x - 1) % n], lst[(x - 1 + d) % n]):
        x -= 1
    what = "1 of the group's collectives" if d == 1 else f"{d} of the group's collectives"
    if x == lp:
        r = lst[lp % n]
        return f"it skipped {what}: op {r['seq']} ({_short(r)}){' and the next' if d > 1 else ''}"
    cands = [lst[k % n] for k in range(x, lp + 1)]
    ops = ", ".join(str(r["seq"]) for r in cands[:8]) + (", ..." if len(cands) > 8 else "")
    return (f"it skipped {what}, one of ops {ops} (from {_short(cands[0])}, step {x // n if x >= 0 else step}): "
            "the collectives between paired by kind and size, as the collective library pairs them")


def diagnose_cursors(cursors, exp):
    """The runtime's cursors (step, table op, in it or done, its count) against the plan: which rank is
    where, the first departure (a rank ahead of its group: it skipped; a count the plan does not have;
    a message its sender passed), and who waits for whom in the plan's words."""
    world = exp["world_size"]
    events = [c for c in cursors if "event" in c]
    by_rank = {}
    for c in cursors:
        if "event" not in c:
            by_rank[_int(c["rank"])] = c
    rows_by_seq, coll, recvs, sends = {}, {}, {}, {}
    for x in exp["ranks"]:
        r = x["rank"]
        for row in sorted(x["rows"], key=lambda w: w["seq"]):
            rows_by_seq.setdefault(r, {})[row["seq"]] = row
            if "ranks" in row:
                coll.setdefault(r, {}).setdefault(group_key(row["group"], row["ranks"]), []).append(row)
            elif "peer" in row:
                (recvs if row["op"] == "recv" else sends).setdefault(r, {}).setdefault(row["peer"], []).append(row)
    lines = [f"plan {exp['plan']} ({exp['fingerprint']}), world {world}: the runtime's cursors of ranks "
             f"{_fold(by_rank) if by_rank else 'none'}"]
    if any(c.get("plan") != exp["plan"] for c in cursors):
        lines.append(f"the cursors name plan {sorted({str(c.get('plan')) for c in cursors})}, not {exp['plan']}")
    evs = {}
    for e in events:
        rs = e.get("ranks") if _int(e["rank"]) < 0 else [_int(e["rank"])]
        why = re.sub(r"^rank \d+: ", "", str(e.get("why", "")))[:400]  # the same line from every rank, folded
        evs.setdefault((str(e["event"]), why), []).extend(rs or [])
    for (ev, why), rs in list(evs.items())[:4]:
        who = f" on {'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)}" if rs else ""
        lines.append(f"the runtime's {ev}{who}: {why}")
    groups = {}
    for r, c in by_rank.items():
        what = (f"op {c['op']} ({c.get('kind', '?')} of {c.get('unit', '?')}, micro-step {c.get('micro_step', '?')})")
        groups.setdefault((_int(c["step"]), _int(c["op"]), what, _int(c["in_op"])), []).append(r)
    for (step, op, what, inside), rs in sorted(groups.items()):
        lines.append(f"{'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)}: step {step}, {'in' if inside else 'done with'} "
                     f"{what}")
    missing = [r for r in range(world) if r not in by_rank] if len(by_rank) < world else []
    for r in missing:
        lines.append(f"rank {r}: no cursor (its process was killed, or wrote none)")
    pos = {r: (_int(c["step"]), _int(c["op"])) for r, c in by_rank.items()}

    def inside(r):
        c = by_rank[r]
        return rows_by_seq.get(r, {}).get(_int(c["op"])) if _int(c["in_op"]) else None

    def entered(r, lst):
        """How many of the group's collectives (list lst, in table order) rank r entered, all steps."""
        step, op = pos[r]
        return step * len(lst) + sum(1 for w in lst if w["seq"] <= op)

    departures, waits = [], []
    keys = {}
    for r, per in coll.items():
        for key, lst in per.items():
            keys.setdefault(key, lst)
    for key, lst in sorted(keys.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        members = list(key[1])
        there = {r: inside(r) for r in members if r in by_rank}
        waiting = {r: row for r, row in there.items() if row is not None and "ranks" in row
                   and group_key(row["group"], row["ranks"]) == key}
        if not waiting:
            continue
        n = len(lst)
        gname = f"{lst[0]['group']} group {lst[0]['instance']} [ranks {_fold(members)}]"
        at = {}
        for r in waiting:
            at.setdefault(entered(r, coll[r][key]), []).append(r)
        # the position most waiting members hold (ties: the earliest)
        main = max(at, key=lambda k: (len(at[k]), -k))
        main_rs = at[main]
        mrow = waiting[main_rs[0]]
        for k, rs in sorted(at.items()):
            if k == main:
                continue
            row = waiting[rs[0]]
            who = f"{'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)}"
            if k > main:
                why = _skipped_text(coll[rs[0]][key], n, main - 1, k - main, pos[rs[0]][0])
                micro = ""
                if row.get("micro_step") != mrow.get("micro_step"):
                    micro = (f"; {who} {'is' if len(rs) == 1 else 'are'} in micro-step {row.get('micro_step')} where "
                             f"the others are in micro-step {mrow.get('micro_step')}: its micro-steps differ from the plan's")
                departures.append((pos[rs[0]][0], f"{who} {'is' if len(rs) == 1 else 'are'} in op {row['seq']} "
                                   f"({_short(row)}) where {'rank' if len(main_rs) == 1 else 'ranks'} {_fold(main_rs)} "
                                   f"{'is' if len(main_rs) == 1 else 'are'} in op {mrow['seq']} ({_short(mrow)}) on "
                                   f"{gname}: {why}{micro}"))
            else:
                departures.append((pos[rs[0]][0], f"{who} {'is' if len(rs) == 1 else 'are'} in op {row['seq']} "
                                   f"({_short(row)}), {main - k} of the group's collectives behind ranks "
                                   f"{_fold(main_rs)} in op {mrow['seq']} ({_short(mrow)}) on {gname}: they "
                                   "skipped what it waits in, or it issued one the plan does not have there"))
        if len(at) == 1:
            wrong = {}
            for r, row in waiting.items():
                want, got = _row_count(row), _int(by_rank[r].get("count"))
                if want is not None and got is not None and got != want:
                    wrong.setdefault(got, []).append(r)
            for got, rs in sorted(wrong.items()):
                row = waiting[rs[0]]
                departures.append((pos[rs[0]][0], f"{'rank' if len(rs) == 1 else 'ranks'} {_fold(rs)} issued op "
                                   f"{row['seq']} ({_short(row)}) with {got} elements per rank where the plan has "
                                   f"{_row_count(row)}: a wrong size, on {gname}"))
        behind = []
        for m in members:
            if m in waiting:
                continue
            if m not in by_rank:
                behind.append(f"rank {m} (no cursor: killed?)")
                continue
            if entered(m, coll[m][key]) >= min(at):
                continue
            row = there.get(m)
            c = by_rank[m]
            doing = (f" waiting in {_short(row)}{' on ' + row['name'].split(' on ')[-1] if ' on ' in row['name'] else ''}"
                     if row is not None and "name" in row else
                     f" {'in' if _int(c['in_op']) else 'done with'} {c.get('kind', '?')} of {c.get('unit', '?')}: in "
                     "no collective (compute or host code the plan cannot see, or a dead or stopped rank)")
            behind.append(f"rank {m} (step {pos[m][0]}, op {pos[m][1]}){doing}")
        if behind:
            low = at[min(at)]
            waits.append(f"{'rank' if len(low) == 1 else 'ranks'} {_fold(low)} wait{'s' if len(low) == 1 else ''} in "
                         f"{waiting[low[0]]['name']} for " + ", ".join(behind))
    # pipeline messages: a receive's sender, against the plan's send of that message
    for r, c in sorted(by_rank.items()):
        row = inside(r)
        if row is None or row.get("op") != "recv":
            continue
        p = row["peer"]
        mine = recvs[r][p]
        k = mine.index(row)
        theirs = sends.get(p, {}).get(r, [])
        if k >= len(theirs):
            continue
        snd = theirs[k]
        if p not in by_rank:
            waits.append(f"rank {r} waits in op {row['seq']} ({row['name']}) for rank {p} (no cursor: killed?)")
            continue
        ps, po = pos[p]
        past = ps > pos[r][0] or (ps == pos[r][0] and (po > snd["seq"] or (po == snd["seq"] and not _int(by_rank[p]["in_op"]))))
        if past:
            departures.append((pos[r][0], f"rank {p} passed op {snd['seq']} ({_short(snd)}) without rank {r} receiving "
                               f"it (rank {r} waits in op {row['seq']}, its receive; rank {p} is at step {ps}, op {po}): "
                               f"rank {p} skipped its send, or its schedule differs from the plan's"))
        else:
            waits.append(f"rank {r} waits in op {row['seq']} ({row['name']}) for rank {p}, which has not reached its "
                         f"send (op {snd['seq']}): rank {p} is at step {ps}, op {po} ({by_rank[p].get('kind', '?')} of "
                         f"{by_rank[p].get('unit', '?')})")
    if departures:
        departures.sort(key=lambda d: d[0])
        for k, (_, body) in enumerate(departures[:3]):
            lines.append(("first departure from the plan: " if k == 0 else "  then: ") + body)
    lines.extend(waits)
    if missing and not waits and not departures and by_rank:
        last = all(not _int(by_rank[r]["in_op"]) and pos[r][1] >= max(rows_by_seq.get(r, {0: None})) for r in by_rank)
        waits.append(f"{'rank' if len(by_rank) == 1 else 'ranks'} {_fold(by_rank)} stopped while "
                     f"{'rank' if len(missing) == 1 else 'ranks'} {_fold(missing)} wrote no cursor (killed?)"
                     + ("; they had issued their whole step's collectives (a GPU rank's cursor is the op its host "
                        "enqueued last: the collective its device waits in is not in it)" if last else ""))
        lines.append(waits[-1])
    if not departures and not waits:
        lines.append("no rank waits in a collective for a member behind it: the cursors agree with the plan's order")
    elif not departures:
        lines.append("the cursors agree with the plan's order everywhere they reach: the plan cannot see why a rank "
                     "has not come (slow compute, host code, a dead process)")
    return lines, bool(departures or waits or missing or events)


def _one_line(msg):
    return " ".join(str(msg).split())


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["expect"]:
        try:
            return _run_lua(_verbs() + argv).returncode
        except BadInput as e:
            print(f"diagnose: {_one_line(e)}", file=sys.stderr)
            return 2
    prefix = None
    if "--prefix" in argv:
        i = argv.index("--prefix")
        if i + 1 >= len(argv):
            print("diagnose: --prefix needs a value", file=sys.stderr)
            return 2
        prefix = argv[i + 1]
        del argv[i:i + 2]
    if len(argv) != 2 or argv[0].startswith("-"):
        print("usage: python3 -m commplan.diagnose DUMP_DIR PLAN.lua|plan.json [--prefix P]\n"
              "       python3 -m commplan.diagnose expect PLAN [--rank R | --ranks A-B | --ranks all] [--json]",
              file=sys.stderr)
        return 2
    try:
        dumps = read_dir(argv[0], prefix)
        exp = expected(argv[1], [0])
        cursors = dumps.pop("cursors", None)
        if cursors and not dumps:
            exp = expected(argv[1], [0, exp["world_size"] - 1] if exp["world_size"] <= 4096 else [0])
            lines, bad = diagnose_cursors(cursors, exp)
            sys.stdout.write("\n".join(lines) + "\n")
            return 1 if bad else 0
        if not dumps:
            raise BadInput(f"{argv[0]}: no dump files (<prefix><rank>, as TORCH_FR_DUMP_TEMP_FILE names them)")
        if max(dumps) >= exp["world_size"]:
            raise BadInput(f"rank {max(dumps)}'s dump: plan {exp['plan']} has world_size {exp['world_size']}")
        lo, hi = (0, exp["world_size"] - 1) if exp["world_size"] <= 4096 else (min(dumps), max(dumps))
        if hi - lo >= 4096:
            raise BadInput(f"dumps of ranks {lo}..{hi}: one diagnosis reads a span of at most 4096 ranks "
                           "(the expected trace of each); give the dumps of one region of the job")
        exp = expected(argv[1], [lo, hi])
        lines, bad = diagnose(dumps, exp)
    except BadInput as e:
        print(f"diagnose: {_one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # an unreadable dump or directory: bad input, one line
        print(f"diagnose: {e.filename or argv[0]}: cannot read it: {e.strerror or e}; give a readable dump "
              "directory", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as e:  # a dump or plan this reader did not foresee: still one line
        print(f"diagnose: {argv[0]} against {argv[1]}: unexpected {type(e).__name__}: {_one_line(str(e)[:200])}; "
              "are these Flight Recorder dumps of this plan's job?", file=sys.stderr)
        return 2
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (| head): what it read is the report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
