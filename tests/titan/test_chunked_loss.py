#!/usr/bin/env python3
"""torchtitan 0.3's training step, CrossEntropyLoss and ChunkedLossWrapper, recorded on gloo against
commplan's tables: every FSDP collective of every rank, in issue order, with its size, dtype,
reduce op and group; and every reduced gradient shard under ChunkedLossWrapper, element for element.

torchtitan's own path on 4 CPU ranks over gloo: its llama3 (tiny numbers, unfused q/k/v as the
llama family), parallelize_llama at FSDP (dp_shard 4) and HSDP (2 x 2), bf16 all-gathers and fp32
reductions (summed: set_force_sum_reduction_for_comms, gloo has no PREMUL_SUM), and the trainer's
step body (Trainer._forward_backward_body: pred = model(...); loss = loss_fn(pred, labels,
global_valid_tokens); loss.backward()) with the loss the trainer builds: CrossEntropyLoss, or
ChunkedLossWrapper (num_chunks 2 and 8) with set_lm_head(model.lm_head) and
model._skip_lm_head = True, as Trainer.__init__ does. 3 steps of 1 and of 2 micro-batches (torchtitan
reduces on every backward). Every all_gather_into_tensor / reduce_scatter_tensor / all_reduce FSDP2
issues is recorded per rank (count per rank, dtype, reduce op, the group's rank list).

The commplan side: the llama plans of the same model and mesh (build/titan/plans/chunked_*_c1.lua
and _c8.lua: fsdp.reduce_op "sum", fsdp.micro_steps, training.loss_chunks = 1 and 8), each plan.json's
op list's collectives per step, each group's rank list for that rank from plan.json's mesh.

What torchtitan does with ChunkedLossWrapper (components/loss.py lines 720-775 and torch 2.15's
grouped fully_shard([norm, lm_head])), and what commplan's loss_chunks >= 2 tables issue
(gen/parallel/fsdp_schedule.lua): the decoder forward all-gathers the [norm, lm_head] unit at the
norm as before; then the loss all-gathers it again (its explicit lm_head.unshard(): the wrapper's
set_reshard_after_forward(True) of the step before resharded it after the norm), runs the chunks
with gradient sync off but for the last, whose backward reduce-scatters (and with HSDP all-reduces)
lm_head.weight's gradient ALONE (the norm has none yet: FSDP2's foreach_reduce packs only
parameters with a gradient: commplan's partial reduction, plan.json's op "params"), then reshards.
The decoder backward then all-gathers the unit a third time at the norm's pre-backward (before
prefetching the last block), and its post-backward reduces norm.weight's gradient alone. So per
micro-batch the unit is all-gathered three times instead of once and reduced in two parts (lm_head,
then norm). num_chunks does not change any of it. One difference is not the tables': in a model's
very first forward the unit is still unsharded when the loss calls lm_head.unshard() (the
reshard-after-forward is set by that first loss), which then issues nothing -- step 1's first
micro-batch has one all-gather fewer, and the comparison leaves that one out of the tables' step.

Checks, 0 differences each: CrossEntropyLoss against the loss_chunks = 1 tables; ChunkedLossWrapper
against the loss_chunks = 8 tables; those tables against the order derived from the loss_chunks = 1
ones (the measured description above, applied to them). Gradients: every FSDP parameter's unsharded
gradient, where FSDP2's post-backward takes it to reduce, is overwritten with commplan's oracle
pattern (tests/ep/torch_ep_record.py's GradPattern: ((e + k) % 5 + 1) * (rank + 1) * (micro + 1), k
the parameter's id in the plan), so after the last step every rank's every reduced gradient shard
-- lm_head's reduced in the loss and the norm's in the decoder backward among them -- must equal,
float32 bit for bit, the loss_chunks = 8 plan's binary's --simulate --pattern oracle --dump.
Prints one "chunked_loss:" summary line; exit 0 when every check holds, 1 otherwise, 77 (SKIP)
without torch and torchtitan.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "ChunkedLossWrapper vs CrossEntropyLoss, collectives vs commplan's tables (tests/titan/test_chunked_loss.py)"
OUT = os.path.join(E.ROOT, "build", "titan")
WORLD = 4
TITAN = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=250, multiple_of=16, ffn_dim_multiplier=1.3)
SEQ, BATCH = 16, 1
MESHES = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
MICRO = (1, 2)
# make test (COMMPLAN_TEST_TIER=quick): 2 steps (a model's first and a steady-state one) and
# ChunkedLossWrapper at 8 chunks (2 gave 8's sequence exactly when measured), run on gloo at
# QUICK_RUNS (each loss, mesh and micro-batch count once; every plan's tables still held to the
# order derived from its loss_chunks = 1 ones), one "quick tier:" line; make test-full and a run by
# hand: 3 steps, 2 and 8 chunks, every mesh x micro-batches x chunks on gloo.
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
STEPS = 2 if QUICK else 3
CHUNKS = (1, 8) if QUICK else (1, 2, 8)
QUICK_RUNS = (("fsdp", 1, 1), ("fsdp", 1, 8), ("hsdp", 2, 8))  # (mesh, micro-batches, chunks)


def run_live(mesh_name, micro, chunks):
    """Whether this configuration runs on gloo (every one but in the quick tier)."""
    return not QUICK or (mesh_name, micro, chunks) in QUICK_RUNS
DT = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


# ---- torchtitan's side (one process per rank) ----

def install_recorder(log, on):
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    kinds = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
             "_all_gather_base": "all_gather", "reduce_scatter_single": "reduce_scatter",
             "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
             "all_reduce": "all_reduce"}
    depth = [0]

    def wrap(fn, kind):
        def hooked(*a, **k):
            if on[0] and depth[0] == 0:
                if kind == "all_reduce":
                    t = k.get("tensor", a[0] if a else None)
                    g = k.get("group", a[2] if len(a) > 2 else None)
                    op = k.get("op", a[1] if len(a) > 1 else dist.ReduceOp.SUM)
                    count, dtype = t.numel(), t.dtype
                else:
                    out = k.get("output_tensor", k.get("output", a[0] if a else None))
                    inp = k.get("input_tensor", k.get("input", a[1] if len(a) > 1 else None))
                    g = k.get("group", a[3] if kind == "reduce_scatter" and len(a) > 3 else
                              (a[2] if kind == "all_gather" and len(a) > 2 else None))
                    op = k.get("op", a[2] if kind == "reduce_scatter" and len(a) > 2 else None)
                    count = inp.numel() if kind == "all_gather" else out.numel()  # per-rank elements
                    dtype = inp.dtype
                ranks = dist.get_process_group_ranks(g) if g is not None else list(range(dist.get_world_size()))
                rop = None if op is None else str(getattr(op, "op", op)).split(".")[-1].lower()
                log.append((kind, int(count), DT[str(dtype)], rop, tuple(int(r) for r in ranks)))
            depth[0] += 1
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
        hooked._commplan_chunked = True
        return hooked

    for name, kind in kinds.items():
        for mod in (dist, c10d):
            fn = getattr(mod, name, None)
            if fn is not None and not hasattr(fn, "_commplan_chunked"):
                setattr(mod, name, wrap(fn, kind))


def titan_to_plan(name):
    """torchtitan 0.3's parameter name -> the llama family's (tests/titan/test_llama_plan.py's renaming)."""
    return name.replace("attention.qkv_linear.", "attention.").replace("lm_head.", "output.")


class GradPattern:
    """commplan's --pattern oracle gradients in torchtitan's real step (tests/ep/torch_ep_record.py's):
    each FSDP parameter's unsharded gradient, as FSDP2's post-backward takes it to reduce
    (FSDPParamGroup._get_unsharded_grad_to_reduce, torch 2.15), is overwritten with ((e + k) % 5 + 1) *
    (rank + 1) * (micro + 1): k the parameter's id in the plan (100 x its unit's index + its index in
    the unit), e the element's flat index, rank the global rank, micro the micro-batch."""

    def __init__(self):
        self.k = None     # torchtitan's name -> commplan's id; None: no injection
        self.names = {}   # id(sharded parameter) -> torchtitan's name
        self.rank = 0
        self.micro = 0
        self.count = {}   # torchtitan's name -> times overwritten


GP = GradPattern()


def install_grad_pattern():
    import torch
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as G
    orig = G.FSDPParamGroup._get_unsharded_grad_to_reduce

    def hooked(self, param):
        g = orig(self, param)
        if g is not None and GP.k is not None:
            name = GP.names[id(param.sharded_param)]
            idx = torch.arange(g.numel()).view(g.shape)
            with torch.no_grad():
                g.copy_((((idx + GP.k[name]) % 5 + 1) * (GP.rank + 1) * (GP.micro + 1)).to(torch.float32))
            GP.count[name] = GP.count.get(name, 0) + 1
        return g
    G.FSDPParamGroup._get_unsharded_grad_to_reduce = hooked


def worker(rank, init, out_dir, ids):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    E.cpu_training()
    import test_llama_plan as TL
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import get_spmd_context
    log, on = [], [False]
    install_recorder(log, on)
    install_grad_pattern()
    GP.rank = rank
    res, grads = {}, {}
    for mesh_name, par in MESHES.items():
        parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                        data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=1)
        training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                                  mixed_precision_param="bfloat16", mixed_precision_reduce="float32")
        pd = ParallelDims.from_config(parallelism, WORLD)
        pd.build_mesh()
        for chunks in CHUNKS:
            for micro in MICRO:
                if not run_live(mesh_name, micro, chunks):
                    continue
                key = "%s_c%d_m%d" % (mesh_name, chunks, micro)
                torch.manual_seed(0)
                model = TL.parallelize(TL.titan_config(None, TITAN, False), parallelism, training, pd, "cpu")
                for m in model.modules():
                    if isinstance(m, FSDPModule):
                        m.set_force_sum_reduction_for_comms(True)
                if chunks == 1:
                    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
                else:  # as Trainer.__init__ sets it up
                    loss_fn = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=chunks))
                    loss_fn.set_lm_head(model.lm_head)
                    model._skip_lm_head = True
                # the oracle pattern's gradients (the ids of the plan of this mesh and micro-batches)
                GP.names = {id(p): n for n, p in model.named_parameters()}
                GP.k = {n: ids[key][titan_to_plan(n)] for n, p in model.named_parameters()}
                GP.count = {}
                ctx = get_spmd_context(parallel_dims=pd)
                steps = []
                for step in range(STEPS):
                    del log[:]
                    on[0] = True
                    forward_backward(model, loss_fn, ctx, TITAN["vocab_size"], BATCH, SEQ, WORLD, rank, step, micro, GP)
                    on[0] = False
                    steps.append(list(log))
                    if step == STEPS - 1 and chunks > 1:
                        # the last step's reduced shards (each parameter overwritten once per micro-batch and step)
                        bad = {n: c for n, c in GP.count.items() if c != STEPS * micro}
                        if bad or len(GP.count) != len(GP.k):
                            raise AssertionError("gradient pattern: overwritten %s times, want %d each of %d"
                                                 % (bad or GP.count, STEPS * micro, len(GP.k)))
                        grads[key] = {titan_to_plan(n): (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
                                      .detach().reshape(-1).double().tolist() for n, p in model.named_parameters()}
                    for p in model.parameters():  # optimizer.zero_grad()
                        p.grad = None
                res[key] = steps
                GP.k = None
                del model
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump({"collectives": res, "grads": grads}, fh)
    dist.destroy_process_group()


# ---- commplan's side ----

def plan_name(mesh_name, micro, chunks):
    return "chunked_%s_m%d_c%d" % (mesh_name, micro, chunks)


def write_plan(mesh_name, micro, chunks):
    """The plan file (the plan writer's text) and its path."""
    from commplan import plan_text
    name = plan_name(mesh_name, micro, chunks)
    model = dict(TITAN, family="llama", seq_len=SEQ)
    text = plan_text(name, WORLD, model, parallel=dict(MESHES[mesh_name]),
                     fsdp={"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum", "micro_steps": micro},
                     training={"loss_chunks": chunks, "local_batch_size": BATCH})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    return name, path


def plan_for(mesh_name, micro, chunks):
    name, path = write_plan(mesh_name, micro, chunks)
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def simulate_cmd(names):
    """One shell command: each plan's binary built (make, its own OUT and BUILD) and simulated for STEPS
    steps with the oracle pattern, dumping every rank's reduced gradient shards."""
    cmds = []
    for name in names:
        plan = os.path.join("build", "titan", "plans", name + ".lua")
        gen, bin_dir = os.path.join("build", "titan", "gen", name), os.path.join("build", "titan", "bin", name)
        dump = os.path.join("build", "titan", "dump", name)
        cmds.append("make --no-print-directory -s PLAN=%s OUT=%s BUILD=%s %s/%s && rm -rf %s && %s/%s --simulate "
                    "--steps %d --pattern oracle --dump %s --quiet" % (plan, gen, bin_dir, bin_dir, name, dump, bin_dir,
                                                                       name, STEPS, dump))
    return " && ".join(cmds)


def param_ids(plan):
    """commplan's parameter ids (cp_pattern_param_id) by name, from plan.json."""
    return {q["name"]: 100 * u["index"] + j for u in plan["units"] for j, q in enumerate(u["params"])}


def group_ranks(plan, name, rank):
    """A group's rank list for rank, from plan.json's group (member dims' sizes and strides)."""
    g = next(x for x in plan["groups"] if x["name"] == name)
    sizes, strides = g["members"]["sizes"], g["members"]["strides"]
    base = rank
    for n, s in zip(sizes, strides):
        base -= ((rank // s) % n) * s
    out = [base]
    for n, s in zip(sizes, strides):
        out = [r + k * s for r in out for k in range(n)]
    return tuple(sorted(out))


def table_step(plan, rank):
    """One step's collectives of rank from the tables: (kind, count, dtype, reduce op, ranks, unit,
    micro-step, phase, params)."""
    out = []
    for o in plan["ops"]:
        if o["kind"] in ("all_gather", "reduce_scatter", "all_reduce") and o.get("group"):
            rop = o.get("reduce_op")
            out.append((o["kind"], o["count"], o["dtype"], rop, group_ranks(plan, o["group"], rank), o["unit"],
                        o["micro_step"], o["phase"], tuple(o.get("params", ()))))
    return out


def head_unit(plan):
    head = [u for u in plan["units"] if u["params"]][-1]
    assert [q["name"] for q in head["params"]] == ["norm.weight", "output.weight"], head["params"]
    return head


def chunked_order(plan, step):
    """ChunkedLossWrapper's order (module docstring) from the tables' CrossEntropyLoss order: per
    micro-step, after the forward's all-gathers, the head unit all-gathered again, lm_head's part
    reduced; the backward starts with a third all-gather of the head unit, and the head's own
    reduction covers the norm alone."""
    head = head_unit(plan)
    norm_n, out_n = (q["padded_numel"] for q in head["params"])
    res = []
    micros = sorted({s[6] for s in step})
    for m in micros:
        ops = [s for s in step if s[6] == m]
        fwd = [s for s in ops if s[7] == "forward"]
        bwd = [s for s in ops if s[7] != "forward"]
        ag = next(s for s in fwd if s[5] == head["name"] and s[0] == "all_gather")
        red = [s for s in bwd if s[5] == head["name"] and s[0] != "all_gather"]
        res += fwd
        res.append(ag)
        res += [(s[0], out_n) + s[2:] for s in red]
        res.append(ag)
        res += [(s[0], norm_n) + s[2:] if s in red else s for s in bwd]
    return [s[:5] for s in res]


def first_step(plan, table):
    """The tables' step as a model's very first one runs it under ChunkedLossWrapper (module docstring):
    micro-step 0's second all-gather of the head unit (the loss's lm_head.unshard()) issues nothing."""
    head = head_unit(plan)["name"]
    at = [i for i, s in enumerate(table) if s[6] == 0 and s[5] == head and s[0] == "all_gather"][1]
    return [s[:5] for i, s in enumerate(table) if i != at]


def diff(got, want):
    n = sum(1 for a, b in zip(got, want) if tuple(a) != tuple(b)) + abs(len(got) - len(want))
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if tuple(a) != tuple(b)),
                 None if len(got) == len(want) else min(len(got), len(want)))
    return n, first


def forward_backward(model, loss_fn, ctx, vocab, batch, seq, world, rank, step, micro, gp=None):
    """One step's micro-batches as torchtitan's Trainer._forward_backward_body runs them, the tokens
    seeded by rank, step and micro-batch so every side of a comparison trains on the same ones; gp:
    the gradient probe told the micro-batch (GP.micro), where the check has one."""
    import torch
    positions = torch.arange(seq).repeat(batch, 1)
    for mi in range(micro):
        if gp is not None:
            gp.micro = mi
        g = torch.Generator().manual_seed(1000 * rank + 10 * step + mi)
        t = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        extra = {"positions": positions, "attention_masks": model.get_attention_masks(positions=positions)}
        gvt = torch.tensor(batch * seq * world * micro)
        with ctx():
            pred = model(t[:, :-1], **extra)
            loss, _ = loss_fn(pred, t[:, 1:], gvt)
            del pred
            loss.backward()


def recorded(got):
    """A recorder's collectives (lists from JSON) as table_step's first five fields: (kind, count,
    dtype, reduce op, ranks tuple)."""
    return [tuple(x[:4]) + (tuple(x[4]),) for x in got]


def compare_step(key, rank, step, got, want, problems):
    """One rank-step's recorded collectives (recorded()) against the plan's (table_step()[:5]): the
    first difference appended to problems; returns how many were compared."""
    n, at = diff(got, want)
    if n:
        problems.append("%s rank %d step %d: %d differences, first at collective %s: torchtitan %r, "
                        "commplan's tables %r" % (key, rank, step + 1, n, at,
                                                  got[at] if at is not None and at < len(got) else None,
                                                  want[at] if at is not None and at < len(want) else None))
    return len(got)


def compare_grads(key, name, rec, problems, dump=None, world=WORLD, counted=None):
    """Every rank's reduced gradient shards from torchtitan (rec[r]["grads"][key]) against the binary's
    --dump (dump/NAME.rankR.json; dump defaults to OUT/dump/NAME): (elements compared, of them the
    parameters counted(name) selects: by default lm_head's and the norm's). Shared by the fused-layout,
    MTP, LoRA and reshard-policy checks."""
    import struct
    dump = dump or os.path.join(OUT, "dump", name)
    counted = counted or (lambda pname: pname in ("norm.weight", "output.weight"))
    n, tagged = 0, 0
    for r in range(world):
        path = os.path.join(dump, "%s.rank%d.json" % (name, r))
        try:
            with open(path) as fh:
                d = json.load(fh)["grads_local"]
        except (OSError, ValueError, KeyError) as e:
            problems.append("%s rank %d: no dump of commplan's (%s)" % (key, r, e))
            continue
        got = rec[r]["grads"][key]
        if sorted(got) != sorted(d):
            problems.append("%s rank %d: torchtitan's parameters %s, commplan's dump %s" % (key, r, sorted(got), sorted(d)))
        for pname in sorted(set(got) & set(d)):
            a, b = got[pname], d[pname]["values"]
            if len(a) != len(b):
                problems.append("%s rank %d: %s reduced gradient shard has %d elements live, %d in commplan's dump"
                                % (key, r, pname, len(a), len(b)))
                continue
            for i, (x, y) in enumerate(zip(a, b)):
                if struct.pack("<f", x) != struct.pack("<f", y):
                    problems.append("%s rank %d: %s reduced gradient element %d: torchtitan %r, commplan %r"
                                    % (key, r, pname, i, x, y))
                    break
            n += len(a)
            tagged += len(a) if counted(pname) else 0
    return n, tagged


def main():
    E.need_titan(NAME)
    import subprocess
    import tempfile
    import torch.multiprocessing as mp
    plans = {(mn, m, c): plan_for(mn, m, c) for mn in MESHES for m in MICRO for c in CHUNKS}
    ids = {"%s_c%d_m%d" % (mn, c, m): param_ids(p) for (mn, m, c), p in plans.items()}
    # the loss_chunks > 1 plans' binaries, built and simulated beside the torch run
    sims = [plan_name(mn, m, c) for mn in MESHES for m in MICRO for c in CHUNKS if c > 1 and run_live(mn, m, c)]
    log = open(os.path.join(OUT, "chunked_sim.log"), "w")
    sim = subprocess.Popen(["bash", "-c", simulate_cmd(sims)], cwd=E.ROOT, stdout=log, stderr=subprocess.STDOUT)
    # The ranks are forked from this process with what they import imported once, here (spawning
    # imported torch and torchtitan again in each rank); CHUNKED_START=spawn spawns them.
    start = os.environ.get("CHUNKED_START", "fork")
    if start == "fork":
        import test_llama_plan  # noqa: F401
        import torch.testing._internal.distributed.fake_pg  # noqa: F401
        import torchtitan.components.loss  # noqa: F401
        import torchtitan.config  # noqa: F401
        import torchtitan.distributed.utils  # noqa: F401
        import torchtitan.models.common.attention  # noqa: F401
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        mp.start_processes(worker, args=(os.path.join(tmp, "init"), tmp, ids), nprocs=WORLD, start_method=start)
        rec = []
        for r in range(WORLD):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                rec.append(json.load(fh))
    sim_rc = sim.wait()
    log.close()
    problems, compared, derived, grads, head_grads = [], 0, 0, 0, 0
    if sim_rc != 0:
        with open(os.path.join(OUT, "chunked_sim.log")) as fh:
            problems.append("building or simulating %s failed: %s" % (", ".join(sims), fh.read()[-2000:]))
    for mn in sorted(MESHES):
        for m in MICRO:
            for chunks in CHUNKS:
                key = "%s_c%d_m%d" % (mn, chunks, m)
                plan = plans[(mn, m, chunks)]
                for r in range(WORLD):
                    table = table_step(plan, r)
                    want = [s[:5] for s in table]
                    if chunks > 1:
                        # the chunked tables are the measured order applied to CrossEntropyLoss's
                        want_derived = chunked_order(plans[(mn, m, 1)], table_step(plans[(mn, m, 1)], r))
                        n, at = diff(want, want_derived)
                        derived += len(want)
                        if n:
                            problems.append("%s rank %d: commplan's loss_chunks = %d tables: %d differences from the "
                                            "order derived from its loss_chunks = 1 tables, first at collective %s: %r vs "
                                            "%r" % (key, r, chunks, n, at, want[at] if at < len(want) else None,
                                                    want_derived[at] if at < len(want_derived) else None))
                    for step, got in enumerate(rec[r]["collectives"].get(key, [])):
                        want_s = first_step(plan, table) if chunks > 1 and step == 0 else want
                        compared += compare_step(key, r, step, recorded(got), want_s, problems)
                parts = sum(1 for s in table_step(plan, 0) if s[8])
                if not run_live(mn, m, chunks):
                    continue
                print("%-14s %d ranks x %d steps: %d collectives per rank-step (commplan's loss_chunks = %d tables: %d%s)"
                      % (key, WORLD, STEPS, len(rec[0]["collectives"][key][-1]), chunks, len(table_step(plan, 0)),
                         ", %d of them a partial reduction's" % parts if parts else ""))
                if chunks > 1 and sim_rc == 0:
                    n, h = compare_grads(key, plan_name(mn, m, chunks), rec, problems)
                    grads, head_grads = grads + n, head_grads + h
    for p in problems[:20]:
        print("FAIL", p)
    print("chunked_loss: %d collectives compared, %d differences (CrossEntropyLoss vs the loss_chunks = 1 tables, "
          "ChunkedLossWrapper vs the loss_chunks = %s tables); %d collectives of those tables equal the order derived "
          "from the loss_chunks = 1 ones; %d reduced gradient elements (%d of norm.weight and output.weight) equal "
          "commplan's --simulate element for element; %d problems"
          % (compared, len([p for p in problems if "step" in p]), "/".join(str(c) for c in CHUNKS if c > 1),
             derived, grads, head_grads, len(problems)))
    if QUICK:
        print("quick tier: %d steps, ChunkedLossWrapper at 8 chunks, on gloo %s (every plan's tables against the "
              "derived order); make test-full runs 3 steps, 2 chunks too, every mesh x micro-batches x chunks on gloo"
              % (STEPS, ", ".join("%s_c%d_m%d" % (mn, c, m) for mn, m, c in QUICK_RUNS)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
