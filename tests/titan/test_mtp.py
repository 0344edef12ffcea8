#!/usr/bin/env python3
"""DeepSeek-V3's multi-token prediction (model.num_mtp_layers) against torchtitan 0.3 (issue 41).

torchtitan's MTPDecoder (models/deepseek_v3/mtp.py) runs tok_embeddings once per depth more and
lm_head once per depth more, and apply_fsdp_to_mtp_decoder (mtp.py:281-320) wraps each MTP block as
one more fully_shard unit: FSDP2's hooks then run per call (a unit all-gathered again in forward
after its reshard, [norm, lm_head]'s post-backward hook firing once before its gradient exists, so
the backward gathers it again). commplan's tables follow the forward-call order the model gives
(gen/models/deepseek_v3.lua calls; gen/parallel/fsdp_schedule.lua calls_micro).

1. Wrapping, on a fake process group: torchtitan's deepseek_v3 (DSV3_TINY of tests/titan/test_moe_plan.py,
   and the registry's debugmodel as deepseek_v3_debugmodel_mtp sets it, num_mtp_layers = 1) with
   num_mtp_layers built by its own _build_mtp_layers / model_registry and parallelized by its own
   parallelize_deepseekv3: every unit's parameters (name, order, shape, dtype, placement, shard) and
   settings against plan.json (test_moe_plan.py's compare).
2. A step on gloo, 4 CPU ranks, FSDP (dp_shard 4), bf16 all-gathers, fp32 summed reductions, 2 steps
   of torchtitan's MTPLoss in the trainer's step body (tests/titan/test_chunked_loss.py's harness):
   every rank's FSDP collectives in issue order against the plan's tables, and every reduced
   gradient shard after the last step against the plan's binary's --simulate --pattern oracle
   --dump, float32 bit for bit. The check can fail: the tables of the same plan with one forward
   per unit (the model's call order dropped) differ from torchtitan's collectives (counted).
make test (COMMPLAN_TEST_TIER=quick): num_mtp_layers 2 on gloo for 1 step, one wrapping case (mtp_tiny_2_hsdp)
(one "quick tier:" line); full: 1 and 2 at FSDP, HSDP (2 x 2) with 2 micro-batches, torchtitan's "always" and
"never" reshard policies (2 micro-batches), 2 steps each, every wrapping case. The gloo ranks are forked from
this process with torch and torchtitan imported once, before the wrapping cases make meshes here
(test_fused_plan.py's way; TITAN_START=spawn spawns them).
Prints one "mtp:" line; exit 0 when every check holds, 1 otherwise, 77 (SKIP) without torchtitan.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "DeepSeek-V3 multi-token prediction vs torchtitan (tests/titan/test_mtp.py)"
OUT = os.path.join(E.ROOT, "build", "titan", "mtp")
FSDP_SUM = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"}
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
# (quick: one step; the second step's collectives repeat the first's, its gradients only accumulate twice)
WORLD, SEQ, BATCH, STEPS = 4, 16, 1, (1 if QUICK else 2)
MESHES = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
# the gloo runs: (key, num_mtp_layers, mesh, micro-batches, torchtitan's fsdp_reshard_after_forward)
RUNS = [("mtp2", 2, "fsdp", 1, "default")] + ([] if QUICK else [
    ("mtp1", 1, "fsdp", 1, "default"), ("mtp1_hsdp_m2", 1, "hsdp", 2, "default"),
    ("mtp2_always", 2, "fsdp", 1, "always"), ("mtp1_never_m2", 1, "fsdp", 2, "never")])


def tiny(n):
    import test_moe_plan as M
    return dict(M.DSV3_TINY, family="deepseek_v3", num_mtp_layers=n)


# (case, model, torchtitan (kind, flavour), world, parallel) as test_moe_plan.py's CASES
WRAP_CASES = [
    ("mtp_tiny_1", None, ("deepseek_v3", None), 4, {"dp_shard": -1}),
    ("mtp_tiny_2_hsdp", None, ("deepseek_v3", None), 8, {"dp_replicate": 2, "dp_shard": -1}),
    ("mtp_debug_1", None, ("deepseek_v3", "debugmodel"), 2, {"dp_shard": -1}),
]


def wrap_cases():
    import test_moe_plan as M
    out = []
    for name, _, kf, world, par in WRAP_CASES:
        if QUICK and name != "mtp_tiny_2_hsdp":  # quick: num_mtp_layers 2 under HSDP, the one that holds both
            continue
        model = tiny(2 if "_2" in name else 1) if kf[1] is None else dict(M.DSV3_DEBUG, family="deepseek_v3",
                                                                          num_mtp_layers=1)
        out.append((name, model, kf, world, par))
    return out


# ---- torchtitan's side (one process per rank) ----

def worker(rank, init, out_dir, ids):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    E.cpu_training()
    import test_chunked_loss as C
    import test_fused_plan as F
    import test_moe_plan as M
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import get_spmd_context
    from torchtitan.models.deepseek_v3.mtp import MTPLoss
    log, on = [], [False]
    C.install_recorder(log, on)
    C.install_grad_pattern()
    C.GP.rank = rank
    import dataclasses
    res, grads = {}, {}
    for mesh_name in MESHES:
        parallelism, training = F.job(MESHES[mesh_name], FSDP_SUM, SEQ)
        pd = ParallelDims.from_config(parallelism, WORLD)
        pd.build_mesh()
        for key, n, _, micro, pol in [r for r in RUNS if r[2] == mesh_name]:
            model_t = tiny(n)
            torch.manual_seed(0)
            model = F.parallelize("deepseek_v3", M.titan_config("deepseek_v3", None, model_t), None,
                                  dataclasses.replace(parallelism, fsdp_reshard_after_forward=pol), training, pd)
            model.to_empty(device="cpu")
            with torch.no_grad():
                model.init_weights(buffer_device=None)
            model.train()
            for mod in model.modules():
                if isinstance(mod, FSDPModule):
                    mod.set_force_sum_reduction_for_comms(True)
            C.GP.names = {id(p): nm for nm, p in model.named_parameters()}
            C.GP.k = {nm: ids[key][nm] for nm, _ in model.named_parameters()}
            C.GP.count = {}
            # torchtitan's deepseek_v3_debugmodel_mtp loss (config_registry.py:73-79), given the positions as
            # Trainer._forward_backward_body does (trainer.py:815-822)
            mtp = MTPLoss(MTPLoss.Config())
            positions = torch.arange(SEQ).repeat(BATCH, 1)

            def loss_fn(pred, labels, gvt):
                return mtp(pred, labels, gvt, positions=positions)
            ctx = get_spmd_context(parallel_dims=pd)
            steps = []
            for step in range(STEPS):
                del log[:]
                on[0] = True
                C.forward_backward(model, loss_fn, ctx, model_t["vocab_size"], BATCH, SEQ, WORLD, rank, step, micro,
                                   C.GP)
                on[0] = False
                steps.append(list(log))
                if step == STEPS - 1:
                    bad = {nm: c for nm, c in C.GP.count.items() if c != STEPS * micro}
                    if bad or len(C.GP.count) != len(C.GP.k):
                        raise AssertionError("gradient pattern: overwritten %s times, want %d each of %d"
                                             % (bad or C.GP.count, STEPS * micro, len(C.GP.k)))
                    grads[key] = {nm: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
                                  .detach().reshape(-1).double().tolist() for nm, p in model.named_parameters()}
                for p in model.parameters():  # optimizer.zero_grad()
                    p.grad = None
            res[key] = steps
            C.GP.k = None
            del model
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump({"steps": res, "grads": grads}, fh)
    dist.destroy_process_group()


# ---- commplan's side ----

def plan_path(key, n, mesh, micro, pol):
    from commplan import plan_text
    f = dict(FSDP_SUM, micro_steps=micro)
    if pol != "default":
        f["reshard_after_forward_policy"] = pol
    text = plan_text(key, WORLD, dict(tiny(n), seq_len=SEQ), parallel=dict(MESHES[mesh]), fsdp=f,
                     training={"local_batch_size": BATCH})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", key + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    return path


def generate(key, path, one_forward=False):
    """plan.json of the plan; one_forward: the mutant, the model's call order dropped (one forward and
    one backward per unit, the schedule before issue 41's MTP)."""
    outdir = os.path.join(OUT, "gen", key + ("_one_forward" if one_forward else ""))
    pre = ['-e', 'package.path="./?.lua;"..package.path; require("gen.models.deepseek_v3").calls = '
           'function() return nil end'] if one_forward else []
    subprocess.run(["lua5.4"] + pre + ["gen/commplan.lua", os.path.relpath(path, E.ROOT),
                                       os.path.relpath(outdir, E.ROOT)], cwd=E.ROOT, check=True)
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def simulate(keys):
    cmds = []
    for key in keys:
        plan = os.path.join("build", "titan", "mtp", "plans", key + ".lua")
        gen, bin_dir, dump = (os.path.join("build", "titan", "mtp", d, key) for d in ("gen", "bin", "dump"))
        cmds.append("make --no-print-directory -s PLAN=%s OUT=%s BUILD=%s %s/%s && rm -rf %s && %s/%s --simulate "
                    "--steps %d --pattern oracle --dump %s --quiet" % (plan, gen, bin_dir, bin_dir, key, dump,
                                                                       bin_dir, key, STEPS, dump))
    return subprocess.Popen(["bash", "-c", " && ".join(cmds)], cwd=E.ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def compare_grads(key, rec, problems):
    """test_chunked_loss.compare_grads on this check's dumps: (elements compared, of them the MTP blocks')."""
    import test_chunked_loss as C
    return C.compare_grads(key, key, rec, problems, dump=os.path.join(OUT, "dump", key), world=WORLD,
                           counted=lambda pname: pname.startswith("mtp_layers."))


def gloo_check():
    import torch.multiprocessing as mp
    import test_chunked_loss as C
    keys = {r[0]: r for r in RUNS}
    paths = {k: plan_path(*r) for k, r in keys.items()}
    plans = {k: generate(k, paths[k]) for k in keys}
    mutants = {k: generate(k, paths[k], True) for k in keys}
    ids = {k: C.param_ids(p) for k, p in plans.items()}
    sim = simulate(sorted(keys))
    # The ranks forked from this process with what they import imported once, here (test_fused_plan.py's
    # way; main runs this before the wrapping cases make meshes in this process); spawning imported torch and
    # torchtitan again in every rank, seconds of CPU each. TITAN_START=spawn spawns them.
    start = os.environ.get("TITAN_START", "fork")
    if start == "fork":
        import test_fused_plan  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        import torchtitan.distributed.parallel_dims  # noqa: F401
        import torchtitan.distributed.utils  # noqa: F401
        import torchtitan.models.deepseek_v3.mtp  # noqa: F401
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        mp.start_processes(worker, args=(os.path.join(tmp, "init"), tmp, ids), nprocs=WORLD, start_method=start)
        rec = []
        for r in range(WORLD):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                rec.append(json.load(fh))
    sim_out = sim.communicate()[0].decode(errors="replace")
    problems, stats, lines = [], dict(collectives=0, grads=0, mtp_grads=0, mutant=0), []
    if sim.returncode != 0:
        problems.append("building or simulating the plans failed: %s" % sim_out[-2000:])
    for key in sorted(keys):
        for r in range(WORLD):
            want = [s[:5] for s in C.table_step(plans[key], r)]
            mut = [s[:5] for s in C.table_step(mutants[key], r)]
            for step, got in enumerate(rec[r]["steps"][key]):
                got = C.recorded(got)
                stats["collectives"] += C.compare_step(key, r, step, got, want, problems)
                bad, _ = C.diff(got, mut)
                if not bad:
                    problems.append("%s rank %d step %d: the one-forward mutant's tables equal torchtitan's "
                                    "collectives" % (key, r, step + 1))
                stats["mutant"] += bad
        if sim.returncode == 0:
            g, m = compare_grads(key, rec, problems)
            stats["grads"] += g
            stats["mtp_grads"] += m
        lines.append("%s: %d collectives per rank-step (one-forward mutant: %d)"
                     % (key, len(rec[0]["steps"][key][-1]), len(C.table_step(mutants[key], 0))))
    return problems, stats, lines


def writer_check():
    """commplan write --titan deepseek_v3:...'s reader (commplan.titan.deepseek_v3_numbers) on torchtitan's own
    registry and config_registry: the numbers equal the family's (test_moe_plan.py's DSV3_DEBUG), num_mtp_layers
    read from the config (1 in deepseek_v3_debugmodel_mtp, config_registry.py:73-79; 2 from model_registry), and
    the plan it writes generates. Problems, as compare's."""
    import test_moe_plan as M
    from commplan.titan import deepseek_v3_numbers, plan_from_titan
    from torchtitan.models.deepseek_v3 import config_registry, model_registry
    problems = []
    base = dict(M.DSV3_DEBUG, family="deepseek_v3", route_norm=False, n_expert_groups=0, n_limited_groups=0,
                attn_backend="flex")  # (model_registry's default attention, models/deepseek_v3/__init__.py:618)
    for what, ms, n in (("debugmodel", model_registry("debugmodel"), 0),
                        ("debugmodel, num_mtp_layers=2", model_registry("debugmodel", num_mtp_layers=2), 2),
                        ("deepseek_v3_debugmodel_mtp", config_registry.deepseek_v3_debugmodel_mtp().model_spec, 1)):
        want = dict(base, **({"num_mtp_layers": n} if n else {}))
        got = deepseek_v3_numbers(ms)
        if got != want:
            problems.append("writer %s: %s, torchtitan's %s" % (what, got, want))
    text = plan_from_titan(config_registry.deepseek_v3_debugmodel_mtp().model_spec, "mtp_writer", 4,
                           parallel={"dp_shard": -1}, seq_len=64)
    if "num_mtp_layers = 1" not in text:
        problems.append("writer: the plan text lacks num_mtp_layers: " + text)
    path = os.path.join(OUT, "plans", "mtp_writer.lua")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    r = subprocess.run(["lua5.4", "gen/commplan.lua", os.path.relpath(path, E.ROOT),
                        os.path.relpath(os.path.join(OUT, "gen", "mtp_writer"), E.ROOT)], cwd=E.ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        problems.append("writer: the written plan does not generate: " + r.stderr.strip()[-300:])
    return problems


def flops_check():
    """Model FLOPs per token (MFU) with MTP: torchtitan's DeepSeekV3Model.Config.get_nparams_and_flops (models/
    deepseek_v3/model.py:216-229, models/utils.py get_moe_model_nparams_and_flops) of its registry's 16B with 0, 1
    and 2 MTP depths, built on the meta device, against commplan's compute.model_flops_per_token of the plan."""
    import torch
    from torchtitan.models.deepseek_v3 import model_registry
    problems, seq = [], 4096
    for n in (0, 1, 2):
        spec = model_registry("16B", num_mtp_layers=n) if n else model_registry("16B")
        with torch.device("meta"):
            m = spec.model.build()
        want = spec.model.get_nparams_and_flops(m, seq)[1]
        lua = ('package.path="./?.lua;"..package.path; local p = require("gen.plan").from_source("return { world_size '
               '= 8, parallel = { dp_shard = 8 }, model = { family = \'deepseek_v3\', size = \'16b\', seq_len = %d, '
               'num_mtp_layers = %d } }", "t.lua"); local c = require("gen.compute"); '
               'print(c.model_flops_per_token(p, c.settings(p)))' % (seq, n))
        got = subprocess.run(["lua5.4", "-e", lua], cwd=E.ROOT, capture_output=True, text=True).stdout.strip()
        if got != str(want):
            problems.append("model FLOPs per token, 16B with %d MTP depths: commplan %s, torchtitan %d" % (n, got, want))
    return problems


def main():
    E.need_titan(NAME)
    t0 = time.time()
    import test_moe_plan as M
    os.makedirs(OUT, exist_ok=True)
    only = set(sys.argv[1:])
    problems, lines = [], []
    wstats = dict.fromkeys(("cases", "units", "params", "shard1"), 0)
    # The gloo step first: its ranks are forked from this process (gloo_check), before the wrapping
    # cases below make meshes here (a forked rank must not inherit them).
    stats = dict(collectives=0, grads=0, mtp_grads=0, mutant=0)
    if not only or "gloo" in only:
        ps, stats, glines = gloo_check()
        problems += ps
        lines += glines
    if not only or "wrap" in only:
        for case in wrap_cases():
            problems += M.run_case(case, wstats)
            wstats["cases"] += 1
    if not only or "writer" in only:
        problems += writer_check()
    if not only or "flops" in only:
        problems += flops_check()
    for ln in lines:
        print("  " + ln)
    for p in problems[:40]:
        print("DISAGREE", p)
    if QUICK:
        print("quick tier: num_mtp_layers 2 at FSDP on gloo for 1 step, the wrapping case mtp_tiny_2_hsdp; make "
              "test-full also runs 1, HSDP x 2 micro-batches, the \"always\" and \"never\" policies, 2 steps each, "
              "and the wrapping cases mtp_tiny_1, mtp_debug_1")
    tv, ttv = E.versions()
    print("mtp: %d wrapping cases (%d units, %d parameters), the writer's numbers of 3 torchtitan configs, "
          "16B's model FLOPs per token with 0-2 depths, "
          "%d collectives on gloo (%s; %d step%s), %d reduced gradient elements (%d of the MTP blocks) equal to --simulate; the one-forward mutant differs in "
          "%d collectives; torchtitan %s (torch %s), %.1f s: %d disagreements"
          % (wstats["cases"], wstats["units"], wstats["params"], stats["collectives"],
             ", ".join(r[0] for r in RUNS), STEPS, "s" if STEPS > 1 else "", stats["grads"], stats["mtp_grads"], stats["mutant"], ttv, tv,
             time.time() - t0, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
