#!/usr/bin/env python3
"""torchtitan 0.3's reshard policy (parallelism.fsdp_reshard_after_forward = "default" / "always" /
"never") recorded on gloo against commplan's tables of fsdp.reshard_after_forward_policy (issue 41).

torchtitan's side: its llama3 (tiny, unfused q/k/v as the llama family) parallelized by its own
parallelize_llama with ParallelismConfig(fsdp_reshard_after_forward=POLICY) on 4 CPU ranks over gloo,
FSDP (dp_shard 4) and HSDP (2 x 2), bf16 all-gathers and fp32 summed reductions, CrossEntropyLoss in
the trainer's step body (tests/titan/test_chunked_loss.py's harness: its recorder, its oracle gradient
pattern). apply_fsdp_to_decoder (distributed/fsdp.py:183-204) gives the blocks and the embedding
get_fsdp_reshard_after_forward_policy(policy, pp_enabled) (:54-77) and [norm, lm_head]
`policy == "always"`: under "always" that unit is resharded after forward and the backward
all-gathers it again before anything else; under "never" no unit is, and the backward all-gathers
nothing.

Checks, 0 differences each: every rank's FSDP collectives of every step (kind, per-rank count,
dtype, reduce op, group ranks), in issue order, against the plan's tables (plan_text's llama plan
with fsdp.reshard_after_forward_policy; "default" written without it); every rank's reduced gradient
shard after the last step against the plan's binary's --simulate --pattern oracle --dump, float32
bit for bit. And the check can fail: torchtitan's "always" and "never" runs each differ from the
"default" tables (the counts printed). Prints one "reshard_policy:" line; exit 0 when every check
holds, 1 otherwise, 77 (SKIP) without torch and torchtitan.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402
import test_chunked_loss as CL  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "torchtitan's fsdp_reshard_after_forward vs fsdp.reshard_after_forward_policy (tests/titan/test_reshard_policy.py)"
OUT = CL.OUT
WORLD = CL.WORLD
POLICIES = ("default", "always", "never")
MESHES = CL.MESHES
# make test (COMMPLAN_TEST_TIER=quick): FSDP alone, 1 micro-batch, 2 steps ("quick tier:" line);
# make test-full and a run by hand: FSDP and HSDP, 1 and 2 micro-batches, 2 steps.
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
MESH_NAMES = ("fsdp",) if QUICK else tuple(sorted(MESHES))
MICRO = (1,) if QUICK else (1, 2)
STEPS = 2


def key_of(mesh_name, pol, micro):
    return "%s_%s_m%d" % (mesh_name, pol, micro)


def worker(rank, init, out_dir, ids):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    E.cpu_training()
    import test_llama_plan as TL
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import get_spmd_context
    log, on = [], [False]
    CL.install_recorder(log, on)
    CL.install_grad_pattern()
    GP = CL.GP
    GP.rank = rank
    res, grads, rafs = {}, {}, {}
    for mesh_name in MESH_NAMES:
        par = MESHES[mesh_name]
        training = TrainingConfig(local_batch_size=CL.BATCH, seq_len=CL.SEQ, dtype="float32",
                                  mixed_precision_param="bfloat16", mixed_precision_reduce="float32")
        pd = None  # one mesh per mesh shape (FSDP2 wants the parameters' DTensor mesh object)
        for pol in POLICIES:
            parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                            data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=1,
                                            fsdp_reshard_after_forward=pol)
            if pd is None:
                pd = ParallelDims.from_config(parallelism, WORLD)
                pd.build_mesh()
            for micro in MICRO:
                key = key_of(mesh_name, pol, micro)
                torch.manual_seed(0)
                model = TL.parallelize(TL.titan_config(None, CL.TITAN, False), parallelism, training, pd, "cpu")
                for m in model.modules():
                    if isinstance(m, FSDPModule):
                        m.set_force_sum_reduction_for_comms(True)
                # each unit's reshard_after_forward as torchtitan set it (post_forward_mesh_info)
                rafs[key] = {n or "root": m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None
                             for n, m in model.named_modules()
                             if isinstance(m, FSDPModule) and m._get_fsdp_state()._fsdp_param_group is not None}
                loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
                GP.names = {id(p): n for n, p in model.named_parameters()}
                GP.k = {n: ids[key][CL.titan_to_plan(n)] for n, p in model.named_parameters()}
                GP.count = {}
                ctx = get_spmd_context(parallel_dims=pd)
                steps = []
                for step in range(STEPS):
                    del log[:]
                    on[0] = True
                    CL.forward_backward(model, loss_fn, ctx, CL.TITAN["vocab_size"], CL.BATCH, CL.SEQ, WORLD, rank, step,
                                        micro, GP)
                    on[0] = False
                    steps.append(list(log))
                    if step == STEPS - 1:
                        bad = {n: c for n, c in GP.count.items() if c != STEPS * micro}
                        if bad or len(GP.count) != len(GP.k):
                            raise AssertionError("gradient pattern: overwritten %s times, want %d each of %d"
                                                 % (bad or GP.count, STEPS * micro, len(GP.k)))
                        grads[key] = {CL.titan_to_plan(n): (p.grad.to_local() if hasattr(p.grad, "to_local")
                                                            else p.grad).detach().reshape(-1).double().tolist()
                                      for n, p in model.named_parameters()}
                    for p in model.parameters():  # optimizer.zero_grad()
                        p.grad = None
                res[key] = steps
                GP.k = None
                del model
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump({"collectives": res, "grads": grads, "rafs": rafs}, fh)
    dist.destroy_process_group()


def plan_name(mesh_name, pol, micro):
    return "rpolicy_%s_%s_m%d" % (mesh_name, pol, micro)


def plan_for(mesh_name, pol, micro):
    """The plan writer's llama plan for this mesh and policy, generated; its plan.json."""
    from commplan import plan_text
    name = plan_name(mesh_name, pol, micro)
    fsdp = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum", "micro_steps": micro}
    if pol != "default":
        fsdp["reshard_after_forward_policy"] = pol
    text = plan_text(name, WORLD, dict(CL.TITAN, family="llama", seq_len=CL.SEQ), parallel=dict(MESHES[mesh_name]),
                     fsdp=fsdp, training={"loss_chunks": 1, "local_batch_size": CL.BATCH})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def main():
    E.need_titan(NAME)
    import subprocess
    import tempfile
    import torch.multiprocessing as mp
    cases = [(mn, pol, m) for mn in MESH_NAMES for pol in POLICIES for m in MICRO]
    plans = {c: plan_for(*c) for c in cases}
    ids = {key_of(*c): CL.param_ids(p) for c, p in plans.items()}
    names = [plan_name(*c) for c in cases]
    CL.STEPS = STEPS  # (simulate_cmd's steps)
    log = open(os.path.join(OUT, "rpolicy_sim.log"), "w")
    sim = subprocess.Popen(["bash", "-c", CL.simulate_cmd(names)], cwd=E.ROOT, stdout=log, stderr=subprocess.STDOUT)
    import test_llama_plan  # noqa: F401  (imported once, before the ranks fork)
    import torchtitan.components.loss  # noqa: F401
    import torchtitan.config  # noqa: F401
    import torchtitan.distributed.utils  # noqa: F401
    import torchtitan.models.common.attention  # noqa: F401
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        mp.start_processes(worker, args=(os.path.join(tmp, "init"), tmp, ids), nprocs=WORLD, start_method="fork")
        rec = []
        for r in range(WORLD):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                rec.append(json.load(fh))
    sim_rc = sim.wait()
    log.close()
    problems, compared, grads, head_bwd_ag, mutant = [], 0, 0, 0, {}
    if sim_rc != 0:
        with open(os.path.join(OUT, "rpolicy_sim.log")) as fh:
            problems.append("building or simulating failed: %s" % fh.read()[-2000:])
    for c in cases:
        mn, pol, m = c
        key, plan = key_of(*c), plans[c]
        head = CL.head_unit(plan)
        # the units' reshard_after_forward: torchtitan's fully_shard state vs plan.json
        want_raf = {u["name"]: bool(u["reshard_after_forward"]) for u in plan["units"] if u["params"]}
        got_raf = {("norm_output" if n in ("norm", "lm_head") else n): v for n, v in rec[0]["rafs"][key].items()
                   if n != "root"}
        if got_raf != want_raf:
            problems.append("%s: units' reshard_after_forward: torchtitan %r, plan.json %r" % (key, got_raf, want_raf))
        for r in range(WORLD):
            table = CL.table_step(plan, r)
            want = [s[:5] for s in table]
            head_bwd_ag += sum(1 for s in table if s[5] == head["name"] and s[0] == "all_gather" and s[7] != "forward")
            default_want = [s[:5] for s in CL.table_step(plans[(mn, "default", m)], r)]
            for step, got in enumerate(rec[r]["collectives"][key]):
                got = CL.recorded(got)
                compared += CL.compare_step(key, r, step, got, want, problems)
                if pol != "default":
                    mutant[pol] = mutant.get(pol, 0) + CL.diff(got, default_want)[0]
        print("%-20s %d ranks x %d steps: %d collectives per rank-step (the tables: %d; head unit %s reshards "
              "after forward: %s)" % (key, WORLD, STEPS, len(rec[0]["collectives"][key][-1]), len(CL.table_step(plan, 0)),
                                      head["name"], bool(head["reshard_after_forward"])))
        if sim_rc == 0:
            n, _ = CL.compare_grads(key, plan_name(*c), rec, problems)
            grads += n
    for pol in ("always", "never"):
        if not mutant.get(pol):
            problems.append("torchtitan's %r run equals the \"default\" tables: the check cannot tell them apart" % pol)
    for p in problems[:20]:
        print("FAIL", p)
    print("reshard_policy: %d collectives compared (policies %s), %d differences; %d of the tables' backward "
          "all-gathers are the head unit's (\"always\"); torchtitan's \"always\" / \"never\" runs differ from the "
          "\"default\" tables in %d / %d collectives; %d reduced gradient elements equal commplan's --simulate "
          "element for element; %d problems"
          % (compared, "/".join(POLICIES), len([p for p in problems if " step " in p]), head_bwd_ag,
             mutant.get("always", 0), mutant.get("never", 0), grads, len(problems)))
    if QUICK:
        print("quick tier: FSDP at 1 micro-batch; make test-full runs HSDP and 2 micro-batches too")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
