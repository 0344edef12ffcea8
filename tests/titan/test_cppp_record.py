#!/usr/bin/env python3
"""Context parallel inside a pipeline (CP x PP), torchtitan 0.3 recorded live on gloo, against plan.json.

torchtitan's own path on CPU ranks over gloo, ParallelDims' mesh [pp 2, cp 2] (world 4) and, in the
full tier, [pp 2, dp_shard 2, cp 2] (world 8: FSDP over dp_shard x cp, 4 ranks, beside the cp pairs),
[pp 2, cp 2, tp 2] (world 8: CP x TP inside the stages, sequence parallel, loss parallel on the last)
and the 4D mesh [pp 2, dp_shard 2, cp 2, tp 2] (world 16), and gpt-oss on [pp 2, cp 2] (parallelize_gptoss
in each stage: flex with its sinks, block 0 windowed), pp outermost: its llama3 (tests/titan/test_cp_record.py's tiny model and CPU stand-ins), split and
parallelized by the
model's pipelining_fn, pipeline_llm (distributed/pipeline_parallel.py:65: _pipeline_module_split into
stages with torchtitan's own split, parallelize_llama on every stage's module, so FSDP over
dp_shard x cp and the CP attention inside each stage; _build_pipeline_schedule with
pipeline_parallel_microbatch_size 1: local_batch_size 2 -> 2 microbatches), and the trainer's PP step:
every microbatch fetched on its own and run through post_dataloading_process (trainer.py:695: the flex
block mask of its positions, prepare_context_parallel_input's head-tail sharding of inputs, labels,
positions and the mask on the cp mesh, annotate_input_spmd_types), then pp_forward_backward_step
(trainer.py:835): pp_schedule.step(arg_mbs, kwarg_mbs, target_mbs, losses, loss_kwargs) under the spmd
context. bf16 all-gathers, fp32 reductions (forced SUM: gloo has no PREMUL_SUM).

Recorded per rank, in issue order, through test_cp_record.py's dispatch-mode recorder: every
collective (kind, elements per rank, dtype, reduce op, the group's global ranks) and every
point-to-point op (c10d send / recv_: peer global rank, elements, dtype), over 2 steps; the schedule's
_initialize_stage (shape inference, first step only) is not recorded, as tests/pp leaves its "init"
phase out. commplan's side: plan.json of the same model, mesh and schedule, each global rank's pipeline
rank's op list (plan.json's pipeline.ranks[pp coordinate].ops): its collectives with their group's ranks
for that rank, its sends and receives with the peer pipeline rank's global rank (the pp group's member);
the CP K/V exchange is the tp_all_gather / tp_reduce_scatter ops on group "cp".

Checks: every rank, every step, every event equal: 0 differences; and the comparison can fail: the
recording against the plan without cp (dp_shard x cp as dp_shard: the same FSDP groups, no K/V
exchange, the activations seq_len long) differs. Schedules: 1F1B, GPipe (single-stage), Interleaved1F1B and
ZBVZeroBubble (two stages per rank: UNSHARD / REDUCE_GRAD actions, zero bubble's I and W);
COMMPLAN_TEST_TIER=quick: pp 2 x cp 2 with Interleaved1F1B; --cases MESH:SCHEDULE,... picks.

Prints one "cppp_record:" line; exit 0 when every check holds, 1 otherwise, 77 (SKIP) without torch and
torchtitan. --record-only records and prints the sequences.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_cp_record as C  # noqa: E402 (its recorder, stand-ins, model and plan.json readers)

E = C.E
NAME = "CP x PP collectives and sends/receives vs commplan's tables (tests/titan/test_cppp_record.py)"
OUT = os.path.join(E.ROOT, "build", "titan")
# name: the degrees (mesh [pp, dp_shard, cp, tp], pp outermost); its world is their product
MESHES = {"pp2_cp2": {"pp": 2, "cp": 2}, "pp2_dp2_cp2": {"pp": 2, "dp_shard": 2, "cp": 2},
          "pp2_cp2_tp2": {"pp": 2, "cp": 2, "tp": 2}, "pp2_dp2_cp2_tp2": {"pp": 2, "dp_shard": 2, "cp": 2, "tp": 2},
          # gpt-oss (test_cp_record.py's GPT_OSS, flex: sinks on its lse, block 0 windowed), parallelize_gptoss in
          # each stage
          "gpt_pp2_cp2": {"pp": 2, "cp": 2, "family": "gpt_oss"}}
SEQ, BATCH, MB_SIZE, STEPS = C.SEQ, C.BATCH, 1, 2
# --policy: torchtitan's fsdp_reshard_after_forward on both sides (issue 41: "always" under PP)
POLICY = ["default"]
SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble")
QUICK = ("Interleaved1F1B",)  # make test's quick tier: a multi-stage schedule (stages and p2p both ways)
# (the full tier: the 8-rank meshes, FSDP over dp_shard x cp = 4 ranks beside the cp pairs, and CP x TP
# inside the stages (sequence parallel); the 16-rank 4D mesh, FSDP 2 x CP 2 x TP 2 x PP 2: 1F1B)
FULL_MESHES = {"pp2_cp2": SCHEDULES, "pp2_dp2_cp2": ("1F1B",), "pp2_cp2_tp2": ("1F1B",),
               "pp2_dp2_cp2_tp2": ("1F1B",), "gpt_pp2_cp2": ("1F1B",)}


def world_of(par):
    return par["pp"] * par.get("dp_shard", 1) * par.get("cp", 1) * par.get("tp", 1)


# ---- torchtitan's side (one process per rank) ----

def record_p2p():
    """c10d's send / recv_ (what isend / irecv and batch_isend_irecv dispatch) recorded beside the
    collectives test_cp_record's dispatch mode records: its _record_dispatch, wrapped."""
    orig = C._record_dispatch
    if getattr(orig, "_cppp", False):
        return

    def rec(func, args, kwargs, out):
        name = func.overloadpacket.__name__
        if name not in ("send", "recv_"):
            return orig(func, args, kwargs, out)
        tensors, pg, peer = args[0], args[1], int(args[2])  # (tensors, process_group, dst/srcRank, tag)
        g = C._pg_ranks(pg)[peer]
        for t in tensors:
            C.REC.log.append({"kind": "send" if name == "send" else "recv", "peer": g, "count": int(t.numel()),
                              "dtype": C.DT.get(str(t.dtype), str(t.dtype)), "phase": C.REC.phase,
                              "shapes": {"in": [list(t.shape)]}, "via": "c10d." + name})
    rec._cppp = True
    C._record_dispatch = rec


def paused_init(sched):
    """The schedule's _initialize_stage(s) (shape inference on the first step) runs unrecorded."""
    for name in ("_initialize_stage", "_initialize_stages"):
        fn = getattr(sched, name, None)
        if fn is None:
            continue

        def hooked(*a, _fn=fn, **k):
            saved, C.REC.log = C.REC.log, None
            try:
                return _fn(*a, **k)
            finally:
                C.REC.log = saved
        setattr(sched, name, hooked)


def worker(rank, init, out_dir, par, schedules):
    POLICY[0] = os.environ.get("CPPP_POLICY", "default")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    world, ds, cp, tp = world_of(par), par.get("dp_shard", 1), par["cp"], par.get("tp", 1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    C.cpu_stand_ins()
    record_p2p()
    import test_llama_plan as TL
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.context_parallel import prepare_context_parallel_input
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context, set_spmd_backend
    from torchtitan.config import DebugConfig
    from torchtitan.trainer import Trainer
    if par.get("family") == "gpt_oss":
        sys.path.insert(0, os.path.join(E.ROOT, "tests", "ep"))
        import torch_ep_record as TE
        from torchtitan.models.gpt_oss import model_registry, parallelize_gptoss as parallelize_fn
    else:
        from torchtitan.models.llama3 import model_registry, parallelize_llama as parallelize_fn
    mode = C.make_mode()
    set_spmd_backend("spmd_types")
    res, pd = {}, None
    for schedule in schedules:
        parallelism = ParallelismConfig(data_parallel_shard_degree=ds, context_parallel_degree=cp,
                                        tensor_parallel_degree=tp, enable_sequence_parallel=True,
                                        pipeline_parallel_degree=par["pp"], pipeline_parallel_schedule=schedule,
                                        pipeline_parallel_microbatch_size=MB_SIZE, spmd_backend="spmd_types",
                                        fsdp_reshard_after_forward=POLICY[0])
        training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                                  mixed_precision_param="bfloat16", mixed_precision_reduce="float32",
                                  disable_cuda_graphs=True)  # (trainer.py:184: CUDA graphs refuse PP)
        if pd is None:  # one ParallelDims for every case (a second of the same mesh confuses fully_shard)
            pd = ParallelDims.from_config(parallelism, world)
            pd.build_mesh()
        torch.manual_seed(0)
        if par.get("family") == "gpt_oss":  # (torchtitan's round-robin routing: the routing fixed and known)
            cfg = TE.titan_gpt_oss_config(C.GPT_OSS, max_seq_len=SEQ)
            spec = model_registry("debugmodel", attn_backend="flex")
        else:
            cfg = TL.titan_config(None, C.TITAN, False)
            spec = model_registry("debugmodel")
        spec.model = cfg
        cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training,
                                                     debug=DebugConfig(moe_force_load_balance=True)))
        with torch.device("cpu"):
            model = cfg.build()
        # (the vocabulary, which loss parallelism's vocab shards need under TP, as test_cp_record.py gives it)
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=C.TITAN["vocab_size"]))
        sched, parts, has_first, has_last = spec.pipelining_fn(
            model, parallel_dims=pd, training=training, parallelism=parallelism, compile_config=CompileConfig(),
            ac_config=None, dump_folder=os.path.join(OUT, "dump"), device=torch.device("cpu"), model_config=cfg,
            parallelize_fn=parallelize_fn, loss_fn=loss_fn)
        for part in parts:
            if par.get("family") == "gpt_oss":  # (its build leaves the weights empty: torchtitan's init, as
                with torch.no_grad():           # tests/pp/torch_pp_titan_record.py runs it)
                    part.init_weights(buffer_device=torch.device("cpu"))
            for m in part.modules():
                if isinstance(m, FSDPModule):
                    m.set_force_sum_reduction_for_comms(True)
        paused_init(sched)
        cp_mesh = pd.get_mesh("cp")
        steps, losses_out = [], []
        for step in range(STEPS):
            # the data shard (mesh [pp, dp_shard, cp, tp]): a cp x tp group's ranks read the same batch
            g = torch.Generator().manual_seed(1000 * ((rank // (cp * tp)) % ds) + step)
            t = torch.randint(0, C.TITAN["vocab_size"], (BATCH, SEQ + 1), generator=g)
            arg_mbs, kwarg_mbs, target_mbs = [], [], []
            for i in range(BATCH // MB_SIZE):  # the trainer fetches each microbatch on its own
                inputs, labels = t[i * MB_SIZE:(i + 1) * MB_SIZE, :-1], t[i * MB_SIZE:(i + 1) * MB_SIZE, 1:]
                positions = torch.arange(SEQ).repeat(MB_SIZE, 1)
                extra = {"positions": positions, "attention_masks": parts[0].get_attention_masks(positions=positions)}
                inputs, labels, extra = prepare_context_parallel_input(inputs, labels, extra, cp_mesh, "cpu",
                                                                       "headtail")
                inputs, labels, extra = annotate_input_spmd_types(pd, inputs, labels, extra)
                arg_mbs.append((inputs,))
                kwarg_mbs.append(extra)
                target_mbs.append(labels)
            gvt = torch.tensor(BATCH * SEQ)
            losses = [] if has_last else None
            C.REC.log, C.REC.phase = [], "step"
            with get_spmd_context(parallel_dims=pd)(), mode:
                sched.step(arg_mbs=arg_mbs if has_first else None, kwarg_mbs=kwarg_mbs,
                           target_mbs=target_mbs if has_last else None, losses=losses,
                           loss_kwargs={"global_valid_tokens": gvt}, return_outputs=False)
            steps.append(C.REC.log)
            C.REC.log = None
            if losses:
                losses_out.append(float(sum(float(x) for x in losses)))
            for part in parts:
                for p in part.parameters():
                    p.grad = None
        res[schedule] = {"steps": steps, "losses": losses_out, "pp": _ranks(pd, "pp"), "cp": _ranks(pd, "cp")}
        del sched, parts, model
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump(res, fh)
    dist.destroy_process_group()


def _ranks(pd, name):
    return C._pg_ranks(pd.get_mesh(name).get_group())


def record(par, schedules, out_dir):
    # (the workers are spawned: the policy travels in the environment)
    os.environ["CPPP_POLICY"] = POLICY[0]
    import tempfile
    import torch.multiprocessing as mp
    os.makedirs(out_dir, exist_ok=True)
    # The ranks forked from this process with what they import imported once, here (no process group
    # or mesh is made in this process); spawning imported torch and torchtitan again in every rank,
    # seconds of CPU each. TITAN_START=spawn spawns them.
    start = os.environ.get("TITAN_START", "fork")
    if start == "fork":
        import test_llama_plan  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        import torchtitan.components.loss  # noqa: F401
        import torchtitan.config  # noqa: F401
        import torchtitan.distributed.context_parallel  # noqa: F401
        import torchtitan.distributed.parallel_dims  # noqa: F401
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        mp.start_processes(worker, args=(os.path.join(tmp, "init"), out_dir, par, schedules), nprocs=world_of(par),
                           start_method=start)
    out = []
    for r in range(world_of(par)):
        with open(os.path.join(out_dir, "rank%d.json" % r)) as fh:
            out.append(json.load(fh))
    return out


# ---- commplan's side ----

def plan_for(name, parallel, schedule):
    """commplan's plan.json of the model, mesh and schedule (test_cp_record's plan, with a pipeline)."""
    from commplan import plan_text
    parallel = dict(parallel)
    family = parallel.pop("family", "llama")
    model = dict({"llama": C.TITAN, "gpt_oss": dict(C.GPT_OSS, attn_backend="flex")}[family], family=family,
                 seq_len=SEQ)
    text = plan_text(name, world_of(parallel), model, parallel=parallel,
                     fsdp=dict({"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"},
                               **({"reshard_after_forward_policy": POLICY[0]} if POLICY[0] != "default" else {})),
                     training={"local_batch_size": BATCH, "loss_chunks": 1})
    # (plan_text has no pipeline section: appended as docs/plan-files.md writes it)
    text = text.rstrip()
    assert text.endswith("}")
    text = text[:-1] + '  pipeline = { schedule = "%s", microbatches = %d },\n}\n' % (schedule, BATCH // MB_SIZE)
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def table_kinds(plan, rank):
    """The step's events of table_step by group: "send", "recv", "fsdp all_gather", "cp all_gather", ..."""
    pp_ranks = C.group_ranks(plan, "pp", rank)
    out = []
    for o in plan["pipeline"]["ranks"][pp_ranks.index(rank)]["ops"]:
        if o["kind"] in ("send", "recv"):
            out.append(o["kind"])
        elif o["kind"] in C.TABLE_KIND and o.get("group"):
            out.append("%s %s" % (o["group"], C.TABLE_KIND[o["kind"]]))
    return out


def table_step(plan, rank):
    """One step of global rank `rank` from plan.json: its pipeline rank's ops (pp outermost: the pp
    group's index of rank), collectives as (kind, count, dtype, reduce op, group ranks), sends and
    receives as (send|recv, peer global rank, count, dtype). (A pipeline rank's op list in plan.json
    carries a reduce_op only where it is not the default, sum: loss parallelism's max.)"""
    pp_ranks = C.group_ranks(plan, "pp", rank)
    ops = plan["pipeline"]["ranks"][pp_ranks.index(rank)]["ops"]
    out = []
    for o in ops:
        if o["kind"] in ("send", "recv"):
            out.append((o["kind"], pp_ranks[o["peer"]], o["count"], o["dtype"]))
        elif o["kind"] in C.TABLE_KIND and o.get("group"):
            k = C.TABLE_KIND[o["kind"]]
            out.append((k, o["count"], o["dtype"], o.get("reduce_op", "sum") if k != "all_gather" else None,
                        tuple(C.group_ranks(plan, o["group"], rank))))
    return out


def recorded(step):
    out = []
    for e in step:
        if e["kind"] in ("send", "recv"):
            out.append((e["kind"], e["peer"], e["count"], e["dtype"]))
        else:
            out.append((e["kind"], e["count"], e["dtype"], e["reduce_op"], tuple(sorted(e["ranks"]))))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--record-only", action="store_true", help="record and print the sequences; no commplan")
    quick = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
    ap.add_argument("--cases", default=None, help="MESH:SCHEDULE,... (default: the tier's; meshes %s, schedules %s)"
                    % (", ".join(MESHES), ", ".join(SCHEDULES)))
    ap.add_argument("--policy", default="default", choices=("default", "always", "never"),
                    help="torchtitan's fsdp_reshard_after_forward, the plan's fsdp.reshard_after_forward_policy")
    a = ap.parse_args()
    POLICY[0] = a.policy
    E.need_titan(NAME)
    if a.cases:
        cases = [tuple(c.split(":", 1)) for c in a.cases.split(",") if c]
    else:
        cases = [("pp2_cp2", s) for s in QUICK] if quick else [(m, s) for m, ss in FULL_MESHES.items() for s in ss]
    for m, s in cases:
        if m not in MESHES or s not in SCHEDULES:
            sys.exit("test_cppp_record: case %s:%s: meshes %s, schedules %s" % (m, s, ", ".join(MESHES),
                                                                              ", ".join(SCHEDULES)))
    meshes = sorted({m for m, _ in cases}, key=list(MESHES).index)
    plans = {}
    if not a.record_only:  # (commplan first: a refusal costs no torch run)
        for m, s in cases:
            plans[m, s] = plan_for("cppp_%s_%s" % (m, s.lower()), MESHES[m], s)
    rec = {}
    for m in meshes:  # one launch per mesh, its schedules one after the other
        rec[m] = record(MESHES[m], [s for x, s in cases if x == m], os.path.join(OUT, "cppp_record", m))
    if a.record_only:
        for m, s in cases:
            for r, rr in enumerate(rec[m]):
                print("== %s %s rank %d (pp %s, cp %s)" % (m, s, r, rr[s]["pp"], rr[s]["cp"]))
                for e in rr[s]["steps"][0]:
                    print("  ", e["kind"], e.get("peer", e.get("ranks")), e["count"], e["dtype"], e["shapes"],
                          e["via"])
        return 0
    problems, compared, kinds, ranks = [], 0, {}, 0
    for m, s in cases:
        for r, rr in enumerate(rec[m]):
            want = table_step(plans[m, s], r)
            ranks += 1
            for step, got in enumerate(rr[s]["steps"]):
                got = recorded(got)
                n, at = C.diff(got, want)
                compared += len(got)
                if not n:
                    for key in table_kinds(plans[m, s], r):
                        kinds[key] = kinds.get(key, 0) + 1
                else:
                    problems.append("%s %s rank %d step %d: %d differences, first at event %s: torchtitan %r, "
                                    "commplan %r" % (m, s, r, step + 1, n, at, got[at] if at is not None and
                                                     at < len(got) else None, want[at] if at is not None and
                                                     at < len(want) else None))
        print("  %-12s %-15s %d ranks x %d steps: %d events per step on rank 0, commplan's tables %d; losses %s" % (
            m, s, len(rec[m]), STEPS, len(rec[m][0][s]["steps"][0]), len(table_step(plans[m, s], 0)),
            ", ".join("%.4f" % x for x in next(rr[s]["losses"] for rr in rec[m] if rr[s]["losses"]))))
    # The comparison can fail: the recording against the plan without cp (dp_shard in its place).
    m, s = cases[0]
    par = MESHES[m]
    nocp = {"pp": par["pp"], "dp_shard": par.get("dp_shard", 1) * par["cp"]}
    if par.get("tp", 1) > 1:
        nocp["tp"] = par["tp"]
    if "family" in par:
        nocp["family"] = par["family"]
    other = plan_for("cppp_nocp", nocp, s)
    n, at = C.diff(recorded(rec[m][0][s]["steps"][0]), table_step(other, 0))
    if n == 0:
        problems.append("%s %s: the plan without cp (%s) matched the recording too" % (m, s, nocp))
    else:
        print("  %-12s %-15s against the plan without cp (pp %d x dp_shard %d): %d differences (first at event %d), "
              "as it must" % (m, s, nocp["pp"], nocp["dp_shard"], n, at))
    for p in problems[:20]:
        print("FAIL", p)
    from importlib.metadata import version
    print("cppp_record: %d events compared (equal: %s) over %d cases (%s) x %d steps, %d rank-cases, from torchtitan %s "
          "(torch %s): %d differences" % (
              compared, ", ".join("%d %s" % (v, k) for k, v in sorted(kinds.items())), len(cases),
              ", ".join("%s %s" % c for c in cases), STEPS, ranks, version("torchtitan"), E.versions()[0], len(problems)))
    if quick and not a.cases:
        print("quick tier: pp2_cp2 with %s; make test-full runs %s" % (
            ", ".join(QUICK), "; ".join("%s with %s" % (m, ", ".join(ss)) for m, ss in FULL_MESHES.items())))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
