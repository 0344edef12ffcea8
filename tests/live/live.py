"""The live FSDP2 oracle: PyTorch's fully_shard on gloo, one process per
rank (tests/live/record.py), against the binary's
--simulate --pattern oracle --dump, element for element.

  live.py plans [NAME...]        every small plan in plans/ and tests/plans/ (or the named ones)
  live.py seeds A-B              property test: seeded random generic plans A..B
  live.py seeds A-B --budget S   ... as many of them as fit S seconds
  live.py seed N                 rerun one seed, verbose, keeping its files
  live.py batch LOG ARGS ...     each ARGS (one string: "plans", "seeds 7-7 --require frozen") over one
                                 pool of ranks, its output to LOG (make test's way)

Run it with the torch-env python (make torch-env); make test-live and
make test call it. Each seed writes build/live/plans/lp<N>.lua, generates
and builds it (make), simulates it, runs the live peer and compares; a
failing seed prints the one command that reruns it. The closing line
counts configurations run and matched.

Exit status: 0 every configuration matched, 1 a mismatch or an error.
"""
import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
LUA = os.environ.get("LUA", "lua5.4")
POOL_RANKS = 8
MAX_PLAN_NUMEL = 400_000  # the full parameters' elements: the JSON lists stay small
BUILD = os.path.join(ROOT, "build", "live")


# --------------------------------------------------------------- the pool

class Pool:
    """POOL_RANKS rank processes over one gloo process group, reused by
    every configuration; restarted after any error (a rank that raised
    leaves its peers waiting in a collective until the group's timeout)."""

    def __init__(self, timeout_s=60):
        self.timeout_s = timeout_s
        self.procs = []
        self.next_id = 0
        self.starts = 0
        self.torch_version = None

    def start(self):
        # torch is imported once, here, and the ranks are forked from this
        # process (before it starts any thread), so each rank starts in
        # milliseconds instead of importing torch again (seconds each on a
        # 2-core machine). LIVE_START=spawn imports it in each rank instead.
        import record  # noqa: F401
        # A restart after an error may come while the next seed's build
        # thread runs: forking a threaded process is unsafe, so restarts spawn.
        ctx = mp.get_context(os.environ.get("LIVE_START", "fork" if self.starts == 0 else "spawn"))
        fd, init = tempfile.mkstemp(prefix="commplan-live-pg.")
        os.close(fd)
        os.unlink(init)
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(POOL_RANKS)]
        self.procs = [ctx.Process(target=_worker, args=(r, POOL_RANKS, init, self.jobs[r], self.results, self.timeout_s),
                                  daemon=True) for r in range(POOL_RANKS)]
        for p in self.procs:
            p.start()
        ready = 0
        deadline = time.time() + 300
        while ready < POOL_RANKS:
            kind, rank, _, info = self.results.get(timeout=max(1, deadline - time.time()))
            if kind == "ready":
                ready += 1
                self.torch_version = info
        self.starts += 1

    def stop(self):
        for q in getattr(self, "jobs", []):
            try:
                q.put(None)
            except Exception:  # noqa: BLE001
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        self.procs = []

    def run(self, job, limit_s=300):
        """Runs job on every rank; returns None or the first error text."""
        if not self.procs:
            self.start()
        self.next_id += 1
        job = dict(job, id=self.next_id)
        for q in self.jobs:
            q.put(job)
        done, errors = set(), []
        deadline = time.time() + limit_s
        while len(done) < POOL_RANKS:
            try:
                kind, rank, jid, info = self.results.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                errors.append(f"no answer from ranks {sorted(set(range(POOL_RANKS)) - done)} in {limit_s} s")
                break
            if jid != job["id"]:
                continue
            if kind == "error":
                errors.append(f"rank {rank}: {info.strip()}")
                break
            done.add(rank)
        if errors:
            self.stop()
            return errors[0]
        return None


def _worker(rank, nranks, init, jobs, results, timeout_s):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import record
    record.worker_main(rank, nranks, init, jobs, results, timeout_s)


# ---------------------------------------------------------- binary side

TREE = ROOT  # whose generator and runtime build the binaries (--tree)


def sh(cmd, **kw):
    return subprocess.run(cmd, cwd=TREE, capture_output=True, text=True, **kw)


def build_plan(plan_file, name, out=None, generate_only=False):
    """make the plan's binary only (no libraries), generated into
    build/live/gen/<name> and built in build/live/bin/<name>: never into
    plans/<name>/ or build/<name>/, which make test and other builds use at
    the same time. Without the GPU backend (NVCC=/nonexistent): only
    --simulate runs here, the same host code either way, and nvcc's build of
    the plan's kernels cost seconds a plan. Returns (binary, plan.json) or
    raises BuildError. generate_only: the tables (plan.json) only, no
    compile (the binary's path is returned all the same; a later call builds
    it from the same tables)."""
    out = out or f"build/live/gen/{name}"
    bdir = f"build/live/bin/{name}"
    r = sh(["make", "--no-print-directory", "-s", "NVCC=/nonexistent", f"PLAN={plan_file}", f"OUT={out}",
            f"BUILD={bdir}", f"{bdir}/.generated" if generate_only else f"{bdir}/{name}"])
    if r.returncode != 0:
        raise BuildError((r.stderr or r.stdout).strip(), r.returncode)
    return os.path.join(TREE, bdir, name), os.path.join(TREE, out, "plan.json")


class BuildError(Exception):
    def __init__(self, msg, rc):
        super().__init__(msg)
        self.rc = rc


def simulate(binary, steps, dump, pattern="oracle"):
    shutil.rmtree(dump, ignore_errors=True)
    r = subprocess.run([binary, "--simulate", "--pattern", pattern, "--steps", str(steps), "--dump", dump, "--quiet"],
                       capture_output=True, text=True)
    return r.returncode, (r.stderr or r.stdout).strip()


# ------------------------------------------------------------- compare

def f32(x):
    if x is None:
        return None
    return struct.unpack("<f", struct.pack("<f", x))[0] if abs(x) < 3.5e38 or x != x else x


def load_dump(path):
    """The binary's dump prints non-finite values as C's inf / nan, which
    JSON has no word for; read them as Python's json does its own."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"(?<=[\[,:])(-?)inf(?=[\],}])", r"\1Infinity", text)
    text = re.sub(r"(?<=[\[,:])-?nan(?=[\],}])", "NaN", text)
    return json.loads(text)


def compare(name, world, live_dir, bin_dir, max_report=12, unit_of=None):
    """The checks of tests/oracle_check.lua: shards, grads, marks, every
    collective (op, dtype, reduce op, sizes, ranks, full in and out, float32
    bit for bit) and per-communicator sequences. The binary's TP activation
    collectives (tp_*: placeholder data around placeholder compute) are left
    out and counted. Returns (checks, mismatches[list], skipped_tp, causes):
    causes names where the two first part ways, in causal order (see CAUSES)."""
    bad, checks, skipped = [], 0, 0
    unit_of = unit_of or {}
    diverged = {}  # unit -> {"first": (index, kind, op)} | "params_local" | "grads_local" | "sequence"

    def fail(msg):
        bad.append(msg)

    def same_list(what, a, b):
        nonlocal checks
        checks += 1
        if len(a) != len(b):
            fail(f"{what}: binary has {len(a)} elements, FSDP2 {len(b)}")
            return False
        for i, (x, y) in enumerate(zip(a, b)):
            fx, fy = f32(x), f32(y)
            if fx != fy and not (fx != fx and fy != fy):
                fail(f"{what}: element {i} is {x!r} in the binary, {y!r} in FSDP2")
                return False
        return True

    for r in range(world):
        tag = f"{name} rank {r}"
        try:
            o = load_dump(os.path.join(live_dir, f"{name}.rank{r}.json"))
            d = load_dump(os.path.join(bin_dir, f"{name}.rank{r}.json"))
        except OSError as e:
            fail(f"{tag}: {e}")
            continue
        for key in ("params_local", "grads_local"):
            for pname, v in o[key].items():
                if pname not in d[key]:
                    fail(f"{tag}: no {key} for {pname} in the binary's dump")
                elif not same_list(f"{tag} {key} {pname}", d[key][pname]["values"], v["values"]):
                    diverged.setdefault(unit_of.get(pname, "?"), {})[key] = True
        dlog = []
        for e in d["log"]:
            if e["op"].startswith("tp_"):
                skipped += 1
            else:
                dlog.append(e)

        def marks(log):
            t, n = [], 0
            for e in log:
                if e["op"] == "mark":
                    t.append(f"{e['what']}@{n}")
                else:
                    n += 1
            return " ".join(t)

        checks += 1
        if marks(o["log"]) != marks(dlog):
            fail(f"{tag}: marks {marks(dlog)} in the binary, {marks(o['log'])} in FSDP2")
        ol = [e for e in o["log"] if e["op"] != "mark"]
        dl = [e for e in dlog if e["op"] != "mark"]
        checks += 1
        if len(ol) != len(dl):
            diverged.setdefault("(all units)", {})["sequence"] = True
            fail(f"{tag}: {len(dl)} collectives in the binary, {len(ol)} in FSDP2: binary "
                 f"{[(e['op'], e.get('unit'), e['in_numel']) for e in dl]}, FSDP2 {[(e['op'], e['in_numel']) for e in ol]}")
        per_o, per_d = {}, {}
        for i, (a, b) in enumerate(zip(dl, ol)):
            what = f"{tag} collective {i} ({a['op']} of {a.get('unit')})"
            checks += 1
            ka = (a["op"], a["dtype"], a.get("reduce_op", ""), a["in_numel"], a["out_numel"])
            kb = (b["op"], b["dtype"], b.get("reduce_op", ""), b["in_numel"], b["out_numel"])
            if ka != kb:
                fail(f"{what}: binary {ka}, FSDP2 {kb}")
                diverged.setdefault(a.get("unit"), {})["sequence"] = True
            same_list(what + " ranks", a["ranks"], b["ranks"])
            for part in ("in", "out"):
                if not same_list(f"{what} {part}", a[part], b[part]):
                    first = diverged.setdefault(a.get("unit"), {}).get("first")
                    here = (i, 0 if part == "in" else 1, a["op"])
                    if first is None or here < first:
                        diverged[a.get("unit")]["first"] = here
        for e in ol:
            per_o.setdefault(tuple(e["ranks"]), []).append((e["op"], e["in_numel"]))
        for e in dl:
            per_d.setdefault(tuple(e["ranks"]), []).append((e["op"], e["in_numel"]))
        for key, seq in per_o.items():
            checks += 1
            if per_d.get(key) != seq:
                fail(f"{tag}: communicator {list(key)}: binary {per_d.get(key)}, FSDP2 {seq}")
    return (checks, bad[:max_report] + ([f"... {len(bad) - max_report} more"] if len(bad) > max_report else []), skipped,
            causes_of(diverged))


def viewout_stage(plan, world, bin_dir, rec_dir=None):
    """FSDP2's view-out (post-divide in the reduce dtype with div_, then the
    cast to the parameter's dtype: _fsdp_collectives.foreach_reduce) applied
    by torch to the binary's own last reduce output of each unit, against
    the binary's sharded grads: a view-out difference shows here even where
    the reductions before it already differ. Returns the units that differ.
    A unit the plan reduces in parts (ChunkedLossWrapper's [norm, lm_head]:
    plan.json's op "params"; under sync_last still on every micro-step) has
    no one last reduce output that makes its grads: left out."""
    import torch
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    T = plan["parallel"]["tp"]
    offsets = {}
    for u in plan["units"]:
        # (the reduce output's layout: a unit with frozen parameters packs its trainable ones alone)
        offsets[(0, u["name"])] = {q["name"]: q.get("rs_offset", q["offset"]) for q in u["params"]}
    tp_class = {}
    for c in plan.get("tp_classes") or []:
        for t in c["tp_ranks"]:
            tp_class[t] = c["class"]
        for u in c["units"]:
            offsets[(c["class"], u["name"])] = {q["name"]: q.get("rs_offset", q["offset"]) for q in u["params"]}
    parted = {op["unit"] for op in plan["ops"] if op.get("params")}
    # (a unit with its own accumulation other than sync_last adds several reductions into its grads)
    units = {u["name"]: u for u in plan["units"] if u["name"] not in parted
             and u.get("grad_accumulation", "sync_last") == "sync_last"}
    bad = set()
    for r in range(world):
        d = load_dump(os.path.join(bin_dir, f"{plan['plan']}.rank{r}.json"))
        last = {}
        for e in d["log"]:
            if e["op"] in ("reduce_scatter", "all_reduce"):
                last[e["unit"]] = e
        cls = tp_class.get(r % T, 0)
        for name, u in units.items():
            if u["root"] is not None and not u["params"]:
                continue
            e = last.get(name)
            red = dt[u["reduce_dtype"]]
            for q in u["params"]:
                if q.get("frozen"):  # (no gradient)
                    continue
                got = d["grads_local"][q["name"]]["values"]
                n = len(got)
                if n == 0:
                    continue
                if e is None:  # a one-rank group: no collective to start from
                    break
                off = offsets[(cls, name)][q["name"]]
                v = torch.tensor(e["out"][off:off + n], dtype=torch.float64).to(red)
                if u["post_divide"] != 1:
                    v.div_(u["post_divide"])
                want = v.to(dt[u["orig_dtype"]]).to(torch.float64).tolist()
                if [f32(x) for x in got] != [f32(x) for x in want]:
                    bad.add(name)
    return sorted(bad)


CAUSES = {
    "viewout_stage": "view-out stage (FSDP2's post-divide and cast applied to the binary's own reduce output "
                     "differ from its grads)",
    "simulate": "the binary's simulation",
    "peer": "the live peer (FSDP2 raised or a rank hung)",
    "sequence": "collective sequence (ops, sizes, order or marks)",
    "shards": "local parameter shards",
    "ag_input": "all-gather input (the parameter shard's cast)",
    "rs_input": "reduce-scatter input (packing: micro-step accumulation dtype, the reduce cast, the pre-divide)",
    "ar_input": "all-reduce input (dp_shard 1: the packing, as for a reduce-scatter input)",
    "arith": "collective arithmetic (same inputs, different sums: the host backend's reduction vs gloo's)",
    "viewout": "sharded grads with every collective equal (view-out: the post-divide and the cast back)",
}


def causes_of(diverged):
    """Per unit, the first place the binary and FSDP2 part ways: the
    sequence, a shard, the earliest collective of the unit whose input
    differs (what fed it) or whose output alone differs (the reduction:
    same inputs on this rank), else the final grads (view-out). Returns
    {cause: [units]}."""
    out = {}
    for unit, d in diverged.items():
        if d.get("sequence"):
            c = "sequence"
        elif d.get("params_local"):
            c = "shards"
        elif d.get("first"):
            i, part, op = d["first"]
            c = "arith" if part == 1 else {"all_gather": "ag_input", "reduce_scatter": "rs_input"}.get(op, "ar_input")
        else:
            c = "viewout"
        out.setdefault(c, []).append(str(unit))
    return out


# ----------------------------------------------------------- accumulation

def accumulation_of(plan):
    """The gradient-accumulation mode plan.json's fsdp.grad_accumulation
    names ("fsdp2_default" | "sync_last" | "all_reduce_last", HSDP's deferred
    all-reduce | "step_end", pipelining's single reduction). A plan without the field (binaries
    before issue 16 item 3) reduces on its last micro-step only and
    overwrites: FSDP2 under set_requires_gradient_sync(False) on the others."""
    v = plan.get("fsdp", {}).get("grad_accumulation")
    alias = {None: "sync_last", "every": "fsdp2_default", "reduce_every_micro_step": "fsdp2_default",
             "no_sync": "sync_last", "defer_reduce": "sync_last", "defer_all_reduce": "all_reduce_last"}
    return alias.get(v, v)


# ---------------------------------------------------------------- plans

SKIP_PLANS = {"llama8b", "llama8b_cp", "llama70b", "llama405b", "llama405b_hsdp", "deepseek_v3", "deepseek_v3_pp", "llama405b_4d",
              "mixtral8x7b", "qwen3_8b",
              "gdiv_premul",  # PREMUL_SUM (set_gradient_divide_factor on fp32/bf16): gloo has none; the emulated GPU path checks it
              # units called more than once a forward (DeepSeek-V3's MTP): the chained stand-in calls each once;
              # torchtitan's own MTP model holds it (tests/titan/test_mtp.py)
              "fsdp4_dsv3_mtp"}


def small_plans(names=None):
    """(name, plan file, OUT) for every plan small enough to run here."""
    out = []
    for d in ("plans", "tests/plans"):
        for f in sorted(os.listdir(os.path.join(TREE, d))):
            if not f.endswith(".lua"):
                continue
            n = f[:-4]
            if names and n not in names:
                continue
            if n in SKIP_PLANS:
                continue
            out.append((n, f"{d}/{f}", None))
    return out


def plan_size(plan_json):
    plan = json.load(open(plan_json))
    numel = 0
    for u in plan["units"]:
        for q in u["params"]:
            n = 1
            for x in q.get("full_shape", q["shape"]):
                n *= x
            numel += n
    return plan, numel


# ------------------------------------------------------- property plans

def tree_knows(key):
    """Whether the generator of the tree under test takes a plan key (an
    older checkout refuses keys it does not know)."""
    try:
        return key in open(os.path.join(TREE, "gen", "load.lua")).read()
    except OSError:
        return False


def gen_seed(seed, attempt=0):
    """A random generic plan for this seed (attempt > 0: the generator
    refused the earlier draws). Returns (lua text, steps, description)."""
    rng = random.Random(seed * 1000 + attempt)
    # mp_divide and mp_accum aim at the two dtype questions of issue 16:
    # fp16 reduction over 3, 5, 6 or 7 ranks (a post-divide of 1.5, 2.5,
    # 3.5) back into fp32/bf16, and 16-bit compute with an fp32 reduce
    # over 5-8 micro-steps (sums that 16 bits cannot hold).
    kind = rng.choice(["fsdp", "fsdp", "hsdp", "hsdp", "fsdp_tp", "hsdp_tp", "ddp", "fsdp_odd", "hsdp_odd",
                       "mp_divide", "mp_accum"])
    R = S = T = 1
    if kind == "mp_divide":
        R, S = rng.choice([(1, 3), (1, 5), (1, 6), (1, 7), (2, 3), (3, 2)])
    elif kind == "mp_accum":
        R, S, T = rng.choice([(1, 8, 1), (2, 4, 1), (1, 4, 2), (2, 2, 2), (1, 6, 1), (4, 2, 1)])
    if kind == "fsdp":
        S = rng.choice([1, 2, 3, 4, 5, 6, 7, 8])
    elif kind == "fsdp_odd":  # shard groups that are not powers of two: fp16's post-divide 1.5, 2.5, 3.5
        S = rng.choice([3, 5, 6, 7])
    elif kind == "hsdp":
        R, S = rng.choice([(2, 2), (2, 3), (2, 4), (4, 2), (3, 2)])
    elif kind == "hsdp_odd":
        R, S = rng.choice([(3, 2), (2, 3), (3, 1), (5, 1), (7, 1)])
    elif kind == "fsdp_tp":
        S, T = rng.choice([(2, 2), (2, 3), (3, 2), (4, 2), (2, 4), (1, 2)])
    elif kind == "hsdp_tp":
        R, S, T = 2, 2, 2
    elif kind == "ddp":
        R = rng.choice([2, 3, 4])
    world = R * S * T
    dts = ["fp32", "bf16", "fp16"]
    n_units = rng.randint(1, 5)
    micro = rng.randint(1, 4) if rng.random() < 0.8 else rng.randint(5, 8)
    steps = rng.randint(1, 3)
    reduce_op = "sum" if rng.random() < 0.15 else "avg"
    plan_mp = {}
    if rng.random() < 0.3:
        plan_mp["param_dtype"] = rng.choice(dts)
        if rng.random() < 0.7:
            plan_mp["reduce_dtype"] = rng.choice(dts)
    dims_pool = [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16]
    any_tp = False
    units = []
    for ui in range(n_units + 1):
        is_root = ui == n_units
        uname = "root" if is_root else f"u{ui}"
        n_params = 0 if (is_root and rng.random() < 0.6) else rng.randint(1, 3)
        dtype = rng.choice(dts)
        params = []
        for j in range(n_params):
            nd = rng.choice([1, 1, 2, 2, 2, 3])
            shape = [rng.choice(dims_pool) for _ in range(nd)]
            p = {"name": f"{uname}.w{j}", "shape": shape, "dtype": dtype}
            tp = None
            if T > 1 and rng.random() < 0.7:
                opts = ["colwise", "replicate"] + (["rowwise"] if nd >= 2 else []) + [f"shard({k})" for k in range(nd)]
                tp = rng.choice(opts)
            if nd >= 2 and rng.random() < 0.3:
                k = rng.randint(1, nd - 1)
                tp_dim = {"colwise": 0, "rowwise": 1}.get(tp, int(tp[6:-1]) if tp and tp.startswith("shard(") else None)
                if tp_dim != k:
                    shape[k] = S * rng.choice([1, 1, 2, 3])
                    p["shard_dim"] = k
            if tp and tp != "replicate":
                # torch.chunk leaving a TP rank no rows: an empty TP-local
                # tensor, which FSDP2 cannot reduce (the generator refuses it).
                n = shape[{"colwise": 0, "rowwise": 1}.get(tp, int(tp[6:-1]) if tp.startswith("shard(") else 0)]
                per = -(-n // T)
                if -(-n // per) < T:
                    tp = "replicate"
            if tp:
                p["tp"] = tp
                any_tp = any_tp or tp != "replicate"
            params.append(p)
        u = {"name": uname, "params": params}
        if not is_root and rng.random() < 0.5:
            u["reshard_after_forward"] = rng.random() < 0.6
        if rng.random() < 0.6:
            u["param_dtype"] = rng.choice(dts)
            if rng.random() < 0.8:
                u["reduce_dtype"] = rng.choice(dts)
        units.append(u)
    if kind in ("mp_divide", "mp_accum"):
        if kind == "mp_divide":
            micro = rng.choice([1, 1, 2])
        else:
            micro = rng.randint(5, 8)
        plan_mp = {}
        for u in units:
            if rng.random() < 0.75:
                if kind == "mp_divide":
                    orig, ag, red = rng.choice(["fp32", "bf16"]), rng.choice([None, "fp32"]), "fp16"
                else:
                    orig, ag, red = rng.choice(["fp32", "fp32", "bf16"]), rng.choice(["bf16", "bf16", "fp16"]), "fp32"
                for p in u["params"]:
                    p["dtype"] = orig
                u.pop("param_dtype", None)
                u.pop("reduce_dtype", None)
                if ag:
                    u["param_dtype"] = ag
                u["reduce_dtype"] = red
    if T > 1 and not any_tp:  # TP over a model with no TP placement is refused
        for u in units:
            for p in u["params"]:
                if "shard_dim" not in p:
                    n = p["shape"][0]
                    if -(-n // -(-n // T)) < T:  # no empty TP-local tensor (see above)
                        p["shape"][0] = T * n
                    p["tp"] = "colwise"
                    any_tp = True
                    break
            if any_tp:
                break
    par = {}
    if R > 1:
        par["dp_replicate"] = R
    par["dp_shard"] = S
    if T > 1:
        par["tp"] = T

    def lua(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "{ " + ", ".join(lua(x) for x in v) + " }"
        return "{ " + ", ".join(f"{k} = {lua(x)}" for k, x in v.items()) + " }"

    fsdp = {"micro_steps": micro, "reduce_op": reduce_op}
    fsdp.update(plan_mp)
    mixed_ag = draw_mixed_ag(seed, attempt, units, plan_mp)
    pattern = "unique" if rng.random() < 0.5 else "oracle"
    if kind == "mp_divide":  # the oracle pattern's sums divide exactly by 1.5, 2.5 and 3.5
        pattern = "unique"
    if micro > 1 and tree_knows("grad_accumulation"):  # drawn last: older trees' seeds keep their plans
        fsdp["grad_accumulation"] = "sync_last" if rng.random() < 0.5 else "fsdp2_default"
        # HSDP's deferred all-reduce, drawn after the others so earlier seeds keep their plans
        if R > 1 and fsdp["grad_accumulation"] == "fsdp2_default" and tree_knows("all_reduce_last") \
                and rng.random() < 0.5:
            fsdp["grad_accumulation"] = "all_reduce_last"
        # pipelining's end-of-step reduction, drawn last for the same reason
        elif fsdp["grad_accumulation"] == "sync_last" and tree_knows("step_end") and rng.random() < 0.4:
            fsdp["grad_accumulation"] = "step_end"
    reduction = draw_reduction(rng, fsdp, units, S) if tree_knows("force_sum_reduction_for_comms") else ""
    if micro > 1 and tree_knows("unit_accumulation"):
        reduction += draw_unit_accumulation(rng, fsdp, units, R)
    if tree_knows("ignored_params"):
        reduction += draw_ignored(rng, units)
    # CPUOffloadPolicy (issue 39), drawn last so earlier seeds keep their plans: plan-wide
    # and per unit, with every option above (on gloo its copies are no-ops: the draw checks
    # the collectives and reduced gradients under the policy; record.py offload_of)
    if tree_knows("cpu_offload") and rng.random() < 0.35:
        if rng.random() < 0.5:
            fsdp["cpu_offload"] = True
            if rng.random() < 0.3:
                fsdp["pin_memory"] = False
        for u in units:
            if any(not p.get("ignored") for p in u["params"]) and rng.random() < 0.4:
                u["cpu_offload"] = rng.random() < 0.7
                if u["cpu_offload"] and rng.random() < 0.3:
                    u["pin_memory"] = False
        if fsdp.get("cpu_offload") or any(u.get("cpu_offload") for u in units):
            reduction += ", cpu_offload"
    # issue 39 (h39a): set_reshard_after_backward(False) before all but the last micro-step, plan-wide
    # and per unit, over every mode above (not step_end, which sets it itself); drawn after the
    # others so earlier seeds keep their plans
    knobs = ""
    if micro > 1 and fsdp.get("grad_accumulation") != "step_end" and tree_knows("reshard_after_backward") \
            and rng.random() < 0.4:
        if rng.random() < 0.5:
            fsdp["reshard_after_backward"] = False
        for u in units:
            # (a unit FSDP2 manages no parameter of has nothing to keep: refused)
            if rng.random() < 0.4 and any(not p.get("ignored") for p in u["params"]):
                u["reshard_after_backward"] = rng.random() < 0.5
        knobs += " reshard_after_backward"
    # issue 39 (h39a): explicit prefetching (set_modules_to_forward_prefetch / _backward_prefetch) on
    # some units: forward lists of later units, backward lists of earlier ones (the root's: any layer),
    # over every mode above but step_end; drawn last for the same reason
    if fsdp.get("grad_accumulation") != "step_end" and tree_knows("forward_prefetch") and rng.random() < 0.35:
        names = [u["name"] for u in units if any(not p.get("ignored") for p in u["params"])]
        layers = [n for n in names if n != "root"]
        for i, u in enumerate(units):
            if u["name"] not in names or rng.random() < 0.4:
                continue
            me = u["name"]
            later = layers if me == "root" else layers[layers.index(me) + 1:]
            earlier = layers if me == "root" else layers[:layers.index(me)]
            if later and rng.random() < 0.6:
                u["forward_prefetch"] = rng.sample(later, rng.randint(1, min(2, len(later))))
            if earlier and rng.random() < 0.6:
                u["backward_prefetch"] = rng.sample(earlier, rng.randint(1, min(2, len(earlier))))
        if any("forward_prefetch" in u or "backward_prefetch" in u for u in units):
            knobs += " prefetch"
    # issue 39 (h39r): fully_shard(reshard_after_forward=k) with an int k (a divisor of the shard group's
    # S ranks: 1 < k < S reshards to post-forward groups of k ranks; 1 and S are False and True), plan-wide
    # and per unit, over every option above; not with TP (FSDP2 refuses DTensor parameters,
    # _fsdp_param.py:970-974) or on a unit with a parameter on shard_dim > 0 (FSDP2's backward copy-out
    # fails, _fsdp_collectives.py:573); drawn last so earlier seeds keep their plans
    ks = [k for k in range(2, S) if S % k == 0]
    if T == 1 and ks and tree_knows("bool_or_int") and rng.random() < 0.7:
        layers = [u for u in units if u["name"] != "root"]
        can = [u for u in layers if not any(p.get("shard_dim") for p in u["params"])]
        if layers and len(can) == len(layers) and rng.random() < 0.5:
            fsdp["reshard_after_forward"] = rng.choice(ks)
        for u in can:
            if rng.random() < 0.4:
                u["reshard_after_forward"] = rng.choice(ks + [True, False, 1, S])
        if "reshard_after_forward" in fsdp or any(isinstance(u.get("reshard_after_forward"), int)
                                                   and not isinstance(u.get("reshard_after_forward"), bool)
                                                   for u in layers):
            knobs += " raf_int"
    # issue 41 (h39u): frozen parameters (requires_grad=False, torchtitan's LoRA), drawn last so
    # earlier seeds keep their plans
    if tree_knows("frozen"):
        knobs += draw_frozen(rng, units)
    # issue 39 (h39v): set_unshard_in_backward(False), drawn after h39u's frozen draw so earlier
    # seeds keep their plans
    if tree_knows("unshard_in_backward"):
        knobs += draw_unshard_in_backward(rng, fsdp, units, S)
    # issue 41 (hlora): an input needing no gradient (model.input_requires_grad = false, the frozen
    # prefix), drawn last and only where parameters are frozen, so earlier draws are unchanged
    no_input_grad = False
    if tree_knows("input_requires_grad") and " frozen" in knobs and fsdp.get("grad_accumulation") != "step_end":
        no_input_grad, part = draw_frozen_prefix(rng, units)
        knobs += part
    lines = [f"-- live property test seed {seed} (attempt {attempt}): tests/live/live.py seed {seed}",
             "return {", f"  world_size = {world},", f"  parallel = {lua(par)},",
             "  model = { family = \"generic\"%s, units = {" % (", input_requires_grad = false" if no_input_grad
                                                               else "")]
    for u in units:
        lines.append(f"    {lua(u)},")
    lines += ["  } },", f"  fsdp = {lua(fsdp)},", "}"]
    desc = (f"{kind} {'x'.join(str(x) for x in (R, S, T))}, {n_units}+root units, micro {micro}"
            f"{' ' + fsdp['grad_accumulation'] if 'grad_accumulation' in fsdp else ''}, steps {steps}, "
            f"{fsdp.get('reduce_op', 'factor')}{reduction}, pattern {pattern}{knobs}"
            f"{', mixed all-gather dtypes in ' + str(mixed_ag) + ' units' if mixed_ag else ''}")
    return "\n".join(lines) + "\n", steps, desc, pattern


def draw_unit_accumulation(rng, fsdp, units, R):
    """Per-unit set_requires_gradient_sync / set_requires_all_reduce (recurse=False) over the
    plan's grad_accumulation (issue 39), drawn after the others. Not under step_end
    (pipelining reduces every unit at its end, whatever a unit set). Returns the description's part."""
    if fsdp.get("grad_accumulation") == "step_end" or rng.random() >= 0.4:
        return ""
    modes = ["fsdp2_default", "sync_last"] + (["all_reduce_last"] if R > 1 else [])
    n = 0
    for u in units:
        if u["params"] and rng.random() < 0.5:
            u["grad_accumulation"] = rng.choice(modes)
            n += 1
    return f", {n} units' own accumulation" if n else ""


def draw_frozen(rng, units):
    """Frozen parameters (issue 41: requires_grad=False, all-gathered, never reduced): some of
    the parameters FSDP2 manages, any unit (a unit may lose every gradient), with every option
    above. Returns the description's part."""
    if rng.random() >= 0.35:
        return ""
    n = 0
    for u in units:
        for p in u["params"]:
            if not p.get("ignored") and rng.random() < 0.4:
                p["frozen"] = True
                n += 1
    return f" {n} frozen" if n else ""


def draw_unshard_in_backward(rng, fsdp, units, S):
    """FSDPModule.set_unshard_in_backward(False) (issue 39) on some units (the root too, where it
    changes nothing): the live peer's taps need no parameter values in backward. Not on a unit
    resharding to a post-forward group (1 < k < S: refused, gen/parallel/fsdp_layout.lua) nor on
    one FSDP2 manages no parameter of. Returns the description's part."""
    if rng.random() >= 0.4:
        return ""

    def post_forward(v):
        return not isinstance(v, bool) and isinstance(v, int) and 1 < v < S
    n = 0
    for u in units:
        raf = u.get("reshard_after_forward", fsdp.get("reshard_after_forward"))
        if post_forward(raf) or not any(not p.get("ignored") for p in u["params"]):
            continue
        if rng.random() < 0.5:
            u["unshard_in_backward"] = False
            n += 1
    return f" {n} unshard_in_backward=False" if n else ""


def draw_frozen_prefix(rng, units):
    """The model's input without a gradient (issue 41: model.input_requires_grad = false; the
    leading all-frozen units run no pre-backward, gen/parallel/fsdp_layout.lua frozen_prefix), half
    the time with every parameter of the first unit frozen too, while a trainable one remains. Not
    under step_end (the generator refuses a frozen prefix there: gen/parallel/fsdp.lua buffers).
    Returns (drawn, the description's part)."""
    if rng.random() >= 0.5:
        return False, ""
    first = next((u for u in units if u["name"] != "root" and u["params"]), None)
    if first is not None and rng.random() < 0.5:
        rest = [p for u in units if u is not first for p in u["params"] if not p.get("ignored")]
        if any(not p.get("frozen") for p in rest):
            for p in first["params"]:
                if not p.get("ignored"):
                    p["frozen"] = True
    if all(p.get("frozen") or p.get("ignored") for u in units for p in u["params"]):
        return False, ""
    return True, " input_requires_grad=False"


def draw_ignored(rng, units):
    """fully_shard's ignored_params (issue 39): some parameters without a shard_dim or a TP
    placement marked ignored (a unit may lose all of its own), drawn after the others."""
    if rng.random() >= 0.3:
        return ""
    n = 0
    for u in units:
        for p in u["params"]:
            if "shard_dim" not in p and "tp" not in p and "param_dtype" not in p and rng.random() < 0.4:
                p["ignored"] = True
                n += 1
        # a unit with its own reduction setters keeps a parameter FSDP2 manages
        # (else the setters change nothing, which the generator refuses)
        own = ("gradient_divide_factor", "force_sum_reduction_for_comms", "grad_accumulation")
        if u["params"] and all(p.get("ignored") for p in u["params"]) and any(k in u for k in own):
            u["params"][0].pop("ignored", None)
            n -= 1
    if all(p.get("ignored") for u in units for p in u["params"]):  # some parameter FSDP shards (else refused)
        for u in units:
            for p in u["params"]:
                p.pop("ignored", None)
                n -= 1
                break
            else:
                continue
            break
    return f", {n} ignored params" if n else ""


def draw_reduction(rng, fsdp, units, S):
    """FSDPModule's reduction setters (issue 39): set_gradient_divide_factor and
    set_force_sum_reduction_for_comms, plan-wide (fsdp) and per unit, drawn last so
    earlier draws keep their plans. gloo has no PREMUL_SUM (FSDP2's reduce-scatter op
    for a factor other than the shard group's size on fp32/bf16), so such a unit is
    forced to sum; the emulated GPU path checks PREMUL_SUM. Returns the description's part."""
    if rng.random() >= 0.4:
        return ""
    choices = [S, S, 1, 2, 3, 1.5, 2.5, 6, 7, 12]
    if rng.random() < 0.5:
        fsdp.pop("reduce_op", None)  # reduce_op decides the factor too: one of the two
        fsdp["gradient_divide_factor"] = rng.choice(choices)
    if rng.random() < 0.5:
        fsdp["force_sum_reduction_for_comms"] = rng.random() < 0.7
    for u in units:
        if u["params"] and rng.random() < 0.4:
            u["gradient_divide_factor"] = rng.choice(choices)
        if u["params"] and rng.random() < 0.3:
            u["force_sum_reduction_for_comms"] = rng.random() < 0.5
    plan_factor = fsdp.get("gradient_divide_factor", 1 if fsdp.get("reduce_op") == "sum" else None)
    n = 0
    for u in units:
        if not u["params"]:
            continue
        red = u.get("reduce_dtype") or fsdp.get("reduce_dtype") or u["params"][0]["dtype"]
        f = u.get("gradient_divide_factor", plan_factor)
        force = u.get("force_sum_reduction_for_comms", fsdp.get("force_sum_reduction_for_comms", False))
        if f is not None and not force and red != "fp16" and S > 1 and f not in (S, 1):
            u["force_sum_reduction_for_comms"] = True
        n += "gradient_divide_factor" in u or "force_sum_reduction_for_comms" in u
    return (f", divide factor {fsdp.get('gradient_divide_factor', '-')}"
            f"{' forced' if fsdp.get('force_sum_reduction_for_comms') else ''}, {n} units' own")


def draw_mixed_ag(seed, attempt, units, plan_mp):
    """Issue 39: a parameter's own param_dtype (MixedPrecisionPolicy's
    param_dtype_override_fn keeping it in its dtype), which makes FSDP2
    all-gather the unit as raw bytes (uint8). Drawn from a stream of its
    own, so every other draw of a seed stays as it was; combined with
    whatever the seed drew (HSDP, TP, micro-steps, accumulation, reduce
    dtypes). Returns how many units it made mixed."""
    if not tree_knows("param_dtype_override_fn"):
        return 0
    rng = random.Random(seed * 7919 + attempt * 104729 + 39)
    if rng.random() >= 0.45:
        return 0
    n = 0
    for u in units:
        ag = u.get("param_dtype") or plan_mp.get("param_dtype")
        ps = u["params"]
        if not ag or len(ps) < 2 or all(p["dtype"] == ag for p in ps):
            continue
        keep = [p for p in ps if p["dtype"] != ag and rng.random() < 0.5]
        if not keep or len(keep) == len(ps):
            keep = [rng.choice([p for p in ps if p["dtype"] != ag])]
        if len(keep) < len(ps):
            for p in keep:
                p["param_dtype"] = p["dtype"]
            n += 1
    return n


def prepare_seed(seed, keep=False):
    """Writes, generates and builds seed's plan; returns a dict with the
    binary and plan.json, or the reason it could not."""
    name = f"lp{seed}"
    pdir = os.path.join(BUILD, "plans")
    os.makedirs(pdir, exist_ok=True)
    t0 = time.time()
    refused = []
    for attempt in range(30):
        text, steps, desc, pattern = gen_seed(seed, attempt)
        pf = os.path.join(pdir, name + ".lua")
        with open(pf, "w") as f:
            f.write(text)
        rel = os.path.relpath(pf, ROOT)
        try:
            binary, pj = build_plan(rel if TREE == ROOT else pf, name)
            return {"name": name, "seed": seed, "binary": binary, "plan_json": pj, "steps": steps, "desc": desc,
                    "pattern": pattern,
                    "plan_file": rel, "build_s": time.time() - t0, "refused": refused}
        except BuildError as e:
            if "error" in str(e).lower() and e.rc == 2 and ".lua:" in str(e):
                refused.append(str(e).splitlines()[-1][:200])
                continue
            return {"name": name, "seed": seed, "error": f"build failed: {e}", "desc": desc, "plan_file": rel}
    return {"name": name, "seed": seed, "error": "the generator refused 30 draws: " + "; ".join(refused[-3:]),
            "desc": "", "plan_file": ""}


def cleanup_seed(name):
    shutil.rmtree(os.path.join(TREE, "build", "live", "bin", name), ignore_errors=True)
    shutil.rmtree(os.path.join(TREE, "build", "live", "gen", name), ignore_errors=True)
    shutil.rmtree(os.path.join(BUILD, "dump", name), ignore_errors=True)
    shutil.rmtree(os.path.join(BUILD, "rec", name), ignore_errors=True)


# ------------------------------------------------------------------ run

def unique_scaled():
    """Whether the binary's unique pattern scales odd micro-steps' 16-bit
    grads by 2^-6 (runtime/check.c of the tree the binaries come from)."""
    try:
        return "0x1p-6f" in open(os.path.join(TREE, "runtime", "check.c")).read()
    except OSError:
        return False


def check_one(pool, name, binary, plan_json, steps, accumulation=None, verbose=False, pattern="oracle"):
    """Simulate, record live, compare. Returns (ok, summary, details, causes)."""
    plan, numel = plan_size(plan_json)
    world = plan["world_size"]
    dump = os.path.join(BUILD, "dump", name)
    rec = os.path.join(BUILD, "rec", name)
    rc, err = simulate(binary, steps, dump, pattern)
    if rc != 0:
        return False, f"the binary's --simulate exited {rc}", [err], {"simulate": []}
    shutil.rmtree(rec, ignore_errors=True)
    acc = accumulation or accumulation_of(plan)
    t0 = time.time()
    e = pool.run({"name": name, "plan_json": plan_json, "out_dir": rec, "steps": steps, "accumulation": acc,
                  "pattern": pattern, "unique_scaled": unique_scaled()})
    t_live = time.time() - t0
    if e:
        last = e.strip().splitlines()[-1] if e.strip() else "?"
        return False, f"the live FSDP2 peer failed: {last}", e.splitlines()[-25:], {"peer": [last[:120]]}
    unit_of = {q["name"]: u["name"] for u in plan["units"] for q in u["params"]}
    checks, bad, skipped, causes = compare(name, world, rec, dump, unit_of=unit_of)
    if acc == "sync_last" and plan["fsdp"].get("micro_steps", 1) >= 1:
        try:
            vo = viewout_stage(plan, world, dump)
        except Exception as ex:  # noqa: BLE001 - a diagnostic: say so, do not hide the run
            vo = [f"(stage check failed: {ex})"]
        if vo:
            causes["viewout_stage"] = vo
            bad = bad + [f"view-out stage: units {' '.join(vo)}: FSDP2's post-divide in the reduce dtype and cast "
                         f"back, applied to the binary's own reduce output, differ from the binary's grads"]
    note = f", {skipped} activation collectives (TP's, CP's K/V) not compared" if skipped else ""
    why = ("; first difference: " + "; ".join(f"{CAUSES[c]} [units {' '.join(us)}]" for c, us in sorted(causes.items()))
           if causes else "")
    summary = (f"{world} ranks, {checks} checks, {len(bad)} mismatches{note} (live {t_live:.1f} s, pattern {pattern}, "
               f"accumulation {acc}){why}")
    return not bad, summary, bad, causes


def main(argv=None, pool=None, pool_s=0.0):
    """One live.py command; with pool (live.py batch's, started pool_s seconds before), over that pool,
    which it leaves running."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["plans", "seeds", "seed", "recordings"])
    ap.add_argument("args", nargs="*")
    ap.add_argument("--budget", type=float, default=0, help="seconds: stop starting seeds after this")
    ap.add_argument("--min-seeds", type=int, default=0,
                    help="run at least this many seeds whatever the budget says (a busy machine must not thin the check)")
    ap.add_argument("--accumulation", choices=["fsdp2_default", "sync_last", "all_reduce_last", "step_end"],
                    help="override the plan's gradient-accumulation mode on the FSDP2 side")
    ap.add_argument("--pattern", choices=["oracle", "unique"],
                    help="the binary's value pattern (plans: oracle; seeds: each seed draws one)")
    ap.add_argument("--steps", type=int, default=2, help="plans mode: training steps per plan (default 2)")
    ap.add_argument("--keep", action="store_true", help="keep each seed's build, dump and recording")
    ap.add_argument("--tree", help="build the binaries from this checkout's generator and runtime "
                    "(e.g. a git worktree of an older commit); plans mode takes its plans too")
    ap.add_argument("--require", metavar="KNOB", action="append", default=[],
                    help="seeds mode: fail unless every seed run drew KNOB (a word of its description: "
                    "raf_int, frozen, cpu_offload, ...), so a knob-specific seed line checks what it says")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    global TREE, BUILD
    if a.tree:
        TREE = os.path.abspath(a.tree)
        if TREE != ROOT:  # plans, dumps and recordings of another tree's runs apart from this tree's
            BUILD = os.path.join(ROOT, "build", "live-" + os.path.basename(TREE.rstrip("/")))
    tree_arg = f" TREE={a.tree}" if a.tree else ""
    t_start = time.time() - pool_s  # (a seeds budget counts the pool's start, batch's too)
    own_pool = pool is None
    if own_pool:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below: stop the ranks
        pool = Pool()
        pool.start()
    print(f"live: torch {pool.torch_version}, {POOL_RANKS} gloo rank processes started in {time.time() - t_start:.1f} s",
          flush=True)
    ran = matched = 0
    failed = []
    try:
        if a.what == "recordings":
            # torch 2.15 against the torch 2.11 recordings (tests/oracle/, gloo):
            # the same model and values, one step, compared by the recordings'
            # own checker (tests/oracle_check.lua).
            for name in ("fsdp4", "hsdp2x2", "fsdp2_tp2"):
                pf = f"plans/{name}.lua" if os.path.exists(os.path.join(ROOT, "plans", name + ".lua")) else \
                    f"tests/plans/{name}.lua"
                _, pj = build_plan(pf, name)
                rec = os.path.join(BUILD, "rec-2.11", name)
                shutil.rmtree(rec, ignore_errors=True)
                e = pool.run({"name": name, "plan_json": pj, "out_dir": rec, "steps": 1, "accumulation": "sync_last",
                              "pattern": "oracle"})
                r = subprocess.run([LUA, "tests/oracle_check.lua", "tests/oracle", rec, name], cwd=ROOT,
                                   capture_output=True, text=True) if not e else None
                ran += 1
                if r is not None and r.returncode == 0:
                    matched += 1
                    print(f"  ok    {name}: torch {pool.torch_version} {r.stdout.strip()} against the torch 2.11 recording")
                else:
                    failed.append(name)
                    print(f"  FAIL  {name}: " + (e.splitlines()[-1] if e else (r.stdout + r.stderr).strip()))
            print(f"live recordings: {ran} configs run, {matched} matched the torch 2.11 recordings (torch "
                  f"{pool.torch_version} live){': ' + ' '.join(failed) + ' differ' if failed else ''}")
        elif a.what == "plans":
            for name, pf, out in small_plans(set(a.args) or None):
                try:
                    # (generated first: a plan skipped below is never compiled)
                    _, pj = build_plan(pf, name, out, generate_only=True)
                except BuildError as e:
                    print(f"  FAIL  {name}: build: {e}")
                    failed.append(name)
                    ran += 1
                    continue
                plan, numel = plan_size(pj)
                if plan["world_size"] > POOL_RANKS or numel > MAX_PLAN_NUMEL:
                    print(f"  SKIP  {name}: world {plan['world_size']}, {numel} elements (too big for the live peer)")
                    continue
                if (plan.get("parallel") or {}).get("pp", 1) > 1:
                    # (a pipeline plan is held live by tests/pp/ and tests/titan/test_cppp_record.py, which run
                    # torch's schedules; this peer builds dp_replicate x dp_shard (x cp) x tp meshes only)
                    print(f"  SKIP  {name}: pp {plan['parallel']['pp']} (pipeline plans: tests/pp/, "
                          "tests/titan/test_cppp_record.py)")
                    continue
                if (plan.get("parallel") or {}).get("ep", 1) > 1:
                    # (an expert-parallel plan is held live by tests/ep/check_ep_live.sh against torchtitan's EP)
                    print(f"  SKIP  {name}: ep {plan['parallel']['ep']} (expert-parallel plans: tests/ep/)")
                    continue
                try:
                    binary, pj = build_plan(pf, name, out)
                except BuildError as e:
                    print(f"  FAIL  {name}: build: {e}")
                    failed.append(name)
                    ran += 1
                    continue
                steps = a.steps
                a.pattern = a.pattern or "oracle"
                ok, summary, bad, _ = check_one(pool, name, binary, pj, steps, a.accumulation, a.verbose, a.pattern)
                ran += 1
                print(f"  {'ok  ' if ok else 'FAIL'}  {name} ({pf}, {steps} steps): {summary}", flush=True)
                if ok:
                    matched += 1
                else:
                    failed.append(name)
                    for b in bad:
                        print("        | " + b)
                    print(f"        rerun: make test-live PLANS={name}{tree_arg}")
            print(f"live plans: {ran} configs run, {matched} matched FSDP2 (torch {pool.torch_version}), "
                  f"{ran - matched} differ{': ' + ' '.join(failed) if failed else ''}")
        else:
            if a.what == "seed":
                seeds = [int(a.args[0])]
            else:
                lo, _, hi = (a.args[0] if a.args else "1-20").partition("-")
                seeds = list(range(int(lo), int(hi or lo) + 1))
            prep_q = {}
            by_cause = {}
            t_build = t_live_total = 0.0

            def prep(s):
                prep_q[s] = prepare_seed(s)

            nxt = None
            for i, s in enumerate(seeds):
                if a.budget and time.time() - t_start > a.budget and ran >= a.min_seeds:
                    print(f"  (budget of {a.budget:.0f} s spent after {ran} seeds; seeds from {s} on: "
                          f"make test-live SEEDS={s}-{seeds[-1]}{tree_arg})")
                    break
                if nxt is None:
                    prep(s)
                else:
                    nxt.join()
                # build the next seed while this one runs
                nxt = None
                if i + 1 < len(seeds):
                    nxt = threading.Thread(target=prep, args=(seeds[i + 1],))
                    nxt.start()
                info = prep_q.pop(s)
                ran += 1
                missing = [k for k in a.require if k not in info["desc"].replace(",", " ").split()]
                if missing and "error" not in info:
                    print(f"  FAIL  seed {s} [{info['desc']}]: draws no {', '.join(missing)} (--require): "
                          f"pick a seed that does (tests/live/live.py gen_seed)")
                    failed.append(s)
                    continue
                if "error" in info:
                    print(f"  FAIL  seed {s} [{info['desc']}]: {info['error']}")
                    failed.append(s)
                    continue
                t_build += info["build_s"]
                t0 = time.time()
                ok, summary, bad, causes = check_one(pool, info["name"], info["binary"], info["plan_json"],
                                                     info["steps"], a.accumulation, a.verbose,
                                                     a.pattern or info["pattern"])
                for c in causes:
                    by_cause.setdefault(c, []).append(s)
                t_live_total += time.time() - t0
                if ok:
                    matched += 1
                    if a.verbose or a.what == "seed":
                        print(f"  ok    seed {s} [{info['desc']}]: {summary}", flush=True)
                    if not (a.keep or a.what == "seed"):
                        cleanup_seed(info["name"])
                else:
                    failed.append(s)
                    print(f"  FAIL  seed {s} [{info['desc']}]: {summary}", flush=True)
                    for b in bad:
                        print("        | " + b)
                    print(f"        plan: {info['plan_file']}; rerun: make test-live SEEDS={s}{tree_arg}")
                    if a.what != "seed" and not a.keep:  # the rerun rebuilds it; keep the plan, dump and recording
                        shutil.rmtree(os.path.join(TREE, "build", "live", "bin", info["name"]), ignore_errors=True)
            if nxt is not None:
                nxt.join()
            per = (time.time() - t_start) / max(ran, 1)
            print(f"live seeds: {ran} configs run ({seeds[0]}-{seeds[0] + ran - 1 if ran else seeds[0]}), {matched} matched "
                  f"FSDP2 (torch {pool.torch_version}), {ran - matched} differ"
                  f"{': seeds ' + ' '.join(map(str, failed[:40])) if failed else ''}; "
                  f"{per:.2f} s a seed (build {t_build / max(ran, 1):.2f} s overlapped, simulate+live+compare "
                  f"{t_live_total / max(ran, 1):.2f} s)")
            for c, ss in sorted(by_cause.items()):
                print(f"  first difference at the {CAUSES.get(c, c)}: seeds {' '.join(map(str, ss[:30]))}"
                      f"{' ...' if len(ss) > 30 else ''}")
    finally:
        if own_pool:
            pool.stop()
    return 0 if ran and matched == ran else 1


def batch(argv):
    """live.py batch LOG ARGS [LOG ARGS ...]: each ARGS (one string: "plans", "seeds 7-7 --require frozen", ...)
    run by main over one pool of ranks, torch imported and the ranks started once; its output written to LOG,
    then "live batch: rc N LOG (S s)" printed. make test runs its live.py commands so. Exit status: the worst."""
    import contextlib
    import shlex
    import traceback
    if len(argv) % 2:
        sys.exit("live.py batch: LOG ARGS pairs")
    t_start = time.time()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below: stop the ranks
    pool = Pool()
    pool.start()
    pool_s = time.time() - t_start
    print(f"live batch: torch {pool.torch_version}, {POOL_RANKS} gloo rank processes started in {pool_s:.1f} s",
          flush=True)
    worst = 0
    try:
        for log_path, args in zip(argv[0::2], argv[1::2]):
            t0 = time.time()
            with open(log_path, "w") as fh, contextlib.redirect_stdout(fh):
                try:
                    rc = main(shlex.split(args), pool, pool_s)
                except Exception:  # noqa: BLE001 (one command's error; the next ones still run)
                    traceback.print_exc(file=fh)
                    rc = 1
            print(f"live batch: rc {rc} {log_path} ({time.time() - t0:.1f} s)", flush=True)
            worst = max(worst, rc)
    finally:
        pool.stop()
    return worst


if __name__ == "__main__":
    sys.exit(batch(sys.argv[2:]) if sys.argv[1:2] == ["batch"] else main())
