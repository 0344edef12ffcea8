#!/usr/bin/env python3
"""commplan's fused layouts (model.fused, gen/models/fused.lua) against torchtitan 0.3's own overrides.

torchtitan's opt-in model overrides (torchtitan/overrides/: fused_swiglu.fused_swiglu,
fused_swiglu.fused_grouped_experts, fused_mla.fused_mla), applied as its Trainer applies them --
update_from_config, then config.override.apply_overrides on the Trainer.Config (trainer.py:352-358).

1. Wrapping: llama3 (the llama family, unfused q/k/v) and dense qwen3 with "swiglu", qwen3 MoE with
   "grouped_experts", DeepSeek-V3 with all three and with "mla" alone -- tiny models through
   torchtitan's own layer builders, on the meta device, parallelized by its own parallelize_llama /
   parallelize_qwen3 / parallelize_deepseekv3 over a fake process group at FSDP, HSDP and FSDP x TP 2
   (ep = 1). Per unit: modules, reshard_after_forward, MixedPrecisionPolicy dtypes, reduce op; per
   parameter: name, order, global and TP-local shape, dtype, DTensor placements over dp_replicate,
   dp_shard (_StridedShard under TP) and tp, rank 0's FSDP shard and padded numel; every TP rank's
   local shape: all equal to plan.json (tests/titan/test_llama_plan.py's comparison). Wrong plans
   must differ: the same model planned without model.fused disagrees with each fused torchtitan model
   (except "mla" alone, which keeps the stock parameters: its unfused plan must agree).
2. One training step on 4 CPU ranks over gloo, torchtitan's trainer path: dense qwen3 with the fused
   SwiGLU (the torchtitan::silu_and_mul op given a CPU kernel: the same silu(gate) * up), FSDP
   (dp_shard 4) and HSDP (2 x 2), 1 and 2 micro-batches, bf16 all-gathers, fp32 sums. Every
   all-gather / reduce-scatter / all-reduce of every rank in issue order against plan.json's ops
   (tests/titan/test_chunked_loss.py's recorder); and every reduced gradient shard -- the fused w13's
   among them -- after torchtitan's unsharded gradients are overwritten with commplan's oracle pattern,
   equal float32 bit for bit to the plan's binary's --simulate --pattern oracle --dump. The same for
   DeepSeek-V3 with all three fused layouts (the dense block's and shared experts' w13, the routed
   experts' w13 [E, F, 2, D]; fused MLA runs the stock path on CPU, fused_mla.py:836-837) at FSDP,
   1 micro-batch.
Prints one "fused_plan:" summary line; exit 0 when everything agrees, 1 otherwise, 77 (SKIP) without
torch and torchtitan.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "fused layouts vs torchtitan's overrides (tests/titan/test_fused_plan.py)"
OUT = os.path.join(E.ROOT, "build", "titan", "fused")
FSDP_SUM = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"}
TARGETS = {"swiglu": "torchtitan.overrides.fused_swiglu.fused_swiglu",
           "grouped_experts": "torchtitan.overrides.fused_swiglu.fused_grouped_experts",
           "mla": "torchtitan.overrides.fused_mla.fused_mla"}

LLAMA_TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=16, ffn_dim_multiplier=1.3)
QWEN3_TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=256, hidden_dim=96)
MOE_TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=256, moe_hidden_dim=48,
                num_experts=8, top_k=2)
DSV3_TINY = dict(dim=64, n_layers=3, n_dense_layers=1, n_heads=4, vocab_size=256, q_lora_rank=16, kv_lora_rank=32,
                 qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, dense_hidden_dim=96, moe_hidden_dim=32,
                 num_experts=4, num_shared_experts=2, top_k=2)

# (case, kind, commplan model table, world, parallel); every case on its own mesh (one process's
# DeviceMesh cache hands a second ParallelDims of one mesh the first one's mesh).
ALL3 = ["swiglu", "grouped_experts", "mla"]
CASES = [
    ("llama_swiglu", "llama", dict(LLAMA_TINY, family="llama", fused=["swiglu"]), 4, {"dp_shard": -1}),
    ("llama_swiglu_tp2", "llama", dict(LLAMA_TINY, family="llama", fused=["swiglu"]), 12,
     {"dp_shard": -1, "tp": 2}),
    ("qwen3_swiglu_hsdp", "qwen3", dict(QWEN3_TINY, family="qwen3", fused=["swiglu"]), 6,
     {"dp_replicate": 2, "dp_shard": -1}),
    ("qwen3_swiglu_tp2", "qwen3", dict(QWEN3_TINY, family="qwen3", fused=["swiglu"]), 4, {"dp_shard": -1, "tp": 2}),
    ("qwen3_moe_experts", "qwen3_moe", dict(MOE_TINY, family="qwen3_moe", fused=["grouped_experts"]), 16,
     {"dp_shard": -1}),  # 16 ranks > 8 experts: w2_EDF and w13 on Shard(1)
    ("qwen3_moe_experts_tp2", "qwen3_moe", dict(MOE_TINY, family="qwen3_moe", fused=["grouped_experts"]), 16,
     {"dp_shard": -1, "tp": 2}),  # ep = 1: the experts' hidden dim over TP
    ("dsv3_all3", "deepseek_v3", dict(DSV3_TINY, family="deepseek_v3", fused=ALL3), 3, {"dp_shard": -1}),
    ("dsv3_all3_tp2", "deepseek_v3", dict(DSV3_TINY, family="deepseek_v3", fused=ALL3), 8, {"dp_shard": -1, "tp": 2}),
    ("dsv3_mla", "deepseek_v3", dict(DSV3_TINY, family="deepseek_v3", fused=["mla"]), 2, {"dp_shard": -1}),
    # the plan writer: plan_from_titan(llama3 config, fused=["swiglu"]) applies torchtitan's own override
    # and writes the generic plan of the model it builds (torchtitan's names, w13 as it is)
    ("writer_llama_swiglu_tp2", "writer", dict(LLAMA_TINY, family="llama", fused=["swiglu"]), 6,
     {"dp_shard": -1, "tp": 2}),
]

# the gloo step
WORLD, SEQ, BATCH, STEPS = 4, 16, 1, 2
MESHES = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
# make test (COMMPLAN_TEST_TIER=quick): 1 micro-batch (2 plans built and simulated); make test-full: 1 and 2.
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
MICRO = (1,) if QUICK else (1, 2)
# the gloo steps: (key, kind, model, mesh, micro-batches): dense qwen3 with the fused SwiGLU on every mesh and
# micro-batch count; DeepSeek-V3 with all three fused layouts (the dense block's and shared experts' w13, the
# routed experts' w13 [E, F, 2, D]) at FSDP, 1 micro-batch
GLOO_RUNS = [("fused_%s_m%d" % (mn, m), "qwen3", dict(QWEN3_TINY, family="qwen3", fused=["swiglu"]), mn, m)
             for mn in MESHES for m in MICRO] + \
            [("fused_dsv3_fsdp_m1", "deepseek_v3", dict(DSV3_TINY, family="deepseek_v3", fused=ALL3), "fsdp", 1)]


# ---- torchtitan's side ----

def titan_config(kind, model):
    """torchtitan's config of the tiny model, through its own builders (the families' live tests')."""
    import test_llama_plan as L
    import test_moe_plan as M
    import test_qwen3_plan as Q3
    n = {k: v for k, v in model.items() if k not in ("family", "fused")}
    if kind in ("llama", "writer"):
        return L.titan_config(None, n, False)
    if kind == "qwen3":
        return Q3.titan_config(None, n, False, True)
    return M.titan_config("deepseek_v3" if kind == "deepseek_v3" else "qwen3", None, n)


def parallelize(kind, cfg, fused, parallelism, training, pd, device="meta"):
    """torchtitan's Trainer order: update_from_config (sharding declarations), the overrides
    (trainer.py:352-358), build, the family's parallelize."""
    import torch
    from torchtitan.config import CompileConfig, apply_overrides
    from torchtitan.config.override import OverrideConfig
    from torchtitan.trainer import Trainer
    if kind in ("llama", "writer"):
        from torchtitan.models.llama3 import model_registry, parallelize_llama as fn
        spec = model_registry("debugmodel")
    elif kind == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import model_registry, parallelize_deepseekv3 as fn
        spec = model_registry("debugmodel")
    else:
        from torchtitan.models.qwen3 import model_registry, parallelize_qwen3 as fn
        spec = model_registry("debugmodel_moe" if kind == "qwen3_moe" else "debugmodel")
    spec.model = cfg
    tc = Trainer.Config(model_spec=spec, parallelism=parallelism, training=training)
    cfg.update_from_config(config=tc)
    if fused:
        applied = apply_overrides(OverrideConfig(imports=[TARGETS[f] for f in fused]), tc)
        if not applied:
            raise AssertionError("torchtitan applied none of %s" % fused)
    with torch.device(device):
        model = tc.model_spec.model.build()
    return fn(model, parallel_dims=pd, training=training, parallelism=parallelism, compile_config=CompileConfig(),
              ac_config=None, dump_folder=os.path.join(OUT, "dump"))


def job(par, f, seq_len):
    from torchtitan.config import ParallelismConfig, TrainingConfig
    dt = {"fp32": "float32", "bf16": "bfloat16"}
    parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                    data_parallel_shard_degree=par.get("dp_shard", -1),
                                    tensor_parallel_degree=par.get("tp", 1), enable_sequence_parallel=True)
    training = TrainingConfig(local_batch_size=BATCH, seq_len=seq_len, dtype="float32",
                              mixed_precision_param=dt[f.get("param_dtype") or "fp32"],
                              mixed_precision_reduce=dt[f.get("reduce_dtype") or "fp32"])
    return parallelism, training


# ---- commplan's side ----

def generate(name, world, model, parallel, fsdp, training=None, seq_len=2048):
    from commplan import plan_text
    text = plan_text(name, world, dict(model, seq_len=seq_len), parallel=dict(parallel), fsdp=dict(fsdp),
                     training=training, topology={"gpus_per_node": world if world <= 8 else 4})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def generate_writer(name, world, model, parallel):
    """plan_from_titan's generic plan of torchtitan's llama3 (tiny numbers), fused as model says."""
    from commplan.titan import plan_from_titan
    text = plan_from_titan(titan_config("writer", model), name, world, parallel=dict(parallel), fsdp=dict(FSDP_SUM),
                           topology={"gpus_per_node": world}, seq_len=2048, fused=model.get("fused"))
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def compare(kind, plan, theirs, stats, declared):
    import test_llama_plan as L
    tp = plan["parallel"]["tp"]
    mine = L.commplan_units(plan)
    if kind == "llama":  # the llama family's names are torchtitan <= 0.2's (test_llama_plan.py's renaming)
        return L.compare(L.expected(mine, False, tp, declared), theirs, tp, stats, declared, rename=True)
    return L.compare(mine, theirs, tp, stats, declared, rename=False)


# ---- 1. wrapping ----

def run_case(case, stats, declared):
    import test_llama_plan as L
    from torchtitan.distributed.parallel_dims import ParallelDims
    name, kind, model, world, parallel = case
    gen = (lambda n, m: generate_writer(n, world, m, parallel)) if kind == "writer" else \
        (lambda n, m: generate(n, world, m, parallel, FSDP_SUM))
    plan = gen(name, model)
    stock = gen(name + "_stock", {k: v for k, v in model.items() if k != "fused"})
    par = plan["parallel"]
    parallelism, training = job({k: par[k] for k in ("dp_replicate", "dp_shard", "tp")}, plan["fsdp"], 2048)
    with E.fake_world(world):
        pd = ParallelDims.from_config(parallelism, world)
        pd.build_mesh()
        m = parallelize(kind, titan_config(kind, model), model["fused"], parallelism, training, pd)
        theirs = L.titan_units(m)
        w13 = sum(1 for n, _ in m.named_parameters() if n.endswith(".w13"))
        del m
    problems = ["%s: %s" % (name, p) for p in compare(kind, plan, theirs, stats, declared)]
    # the wrong plan: the same model without model.fused
    scratch = dict.fromkeys(stats, 0)
    wrong = compare(kind, stock, theirs, scratch, dict.fromkeys(declared, 0))
    if model["fused"] == ["mla"]:
        if wrong:  # fused MLA keeps the stock parameters (overrides/fused_mla.py:52-58)
            problems.append("%s: the unfused plan differs from torchtitan's fused-MLA model: %s" % (name, wrong[0]))
        if w13:
            problems.append("%s: %d w13 parameters under fused MLA alone" % (name, w13))
    elif not wrong:
        problems.append("%s: the plan without model.fused agrees with torchtitan's fused model (the check cannot "
                        "tell them apart)" % name)
    else:
        stats["wrong_caught"] += 1
    stats["w13"] += w13
    return problems


# ---- 2. the gloo step ----

def cpu_silu_and_mul():
    """torchtitan::silu_and_mul is registered for CUDA only (fused_swiglu.py:286-321): the same
    maths on CPU, so the fused module's forward and backward run there (rows past the grouped
    offsets included: the gradients are the oracle pattern's anyway)."""
    import torch
    import torch.nn.functional as Fn
    import torchtitan.overrides.fused_swiglu as FS

    def fwd(gate, up, offsets=None):
        return (Fn.silu(gate.float()) * up.float()).to(gate.dtype)

    def bwd(grad_out, gate, up, offsets=None):
        g, u, d = gate.float(), up.float(), grad_out.float()
        s = torch.sigmoid(g)
        return (d * u * s * (1 + g * (1 - s))).to(gate.dtype), (d * g * s).to(up.dtype)
    FS.silu_and_mul_op.register_kernel("cpu")(fwd)
    FS.silu_and_mul_backward_op.register_kernel("cpu")(bwd)


def worker(rank, init, out_dir, ids):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    E.cpu_training()
    cpu_silu_and_mul()
    import test_chunked_loss as C
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import get_spmd_context
    log, on = [], [False]
    C.install_recorder(log, on)
    C.install_grad_pattern()
    C.GP.rank = rank
    res, grads = {}, {}
    for mesh_name, par in MESHES.items():
        parallelism, training = job(par, FSDP_SUM, SEQ)
        pd = ParallelDims.from_config(parallelism, WORLD)
        pd.build_mesh()
        for key, kind, model_t, _, micro in [r for r in GLOO_RUNS if r[3] == mesh_name]:
            torch.manual_seed(0)
            model = parallelize(kind, titan_config(kind, model_t), model_t["fused"], parallelism, training, pd)
            model.to_empty(device="cpu")
            with torch.no_grad():
                model.init_weights(buffer_device=None)
            model.train()
            for mod in model.modules():
                if isinstance(mod, FSDPModule):
                    mod.set_force_sum_reduction_for_comms(True)
            C.GP.names = {id(p): n for n, p in model.named_parameters()}
            C.GP.k = {n: ids[key][n] for n, _ in model.named_parameters()}
            C.GP.count = {}
            loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
            ctx = get_spmd_context(parallel_dims=pd)
            steps = []
            for step in range(STEPS):
                del log[:]
                on[0] = True
                C.forward_backward(model, loss_fn, ctx, model_t["vocab_size"], BATCH, SEQ, WORLD, rank, step, micro, C.GP)
                on[0] = False
                steps.append(list(log))
                if step == STEPS - 1:
                    bad = {n: c for n, c in C.GP.count.items() if c != STEPS * micro}
                    if bad or len(C.GP.count) != len(C.GP.k):
                        raise AssertionError("gradient pattern: overwritten %s times, want %d each of %d"
                                             % (bad or C.GP.count, STEPS * micro, len(C.GP.k)))
                    grads[key] = {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
                                  .detach().reshape(-1).double().tolist() for n, p in model.named_parameters()}
                for p in model.parameters():  # optimizer.zero_grad()
                    p.grad = None
            res[key] = steps
            C.GP.k = None
            del model
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump({"steps": res, "grads": grads}, fh)
    dist.destroy_process_group()


def simulate(names):
    cmds = []
    for name in names:
        plan = os.path.join("build", "titan", "fused", "plans", name + ".lua")
        gen, bin_dir = (os.path.join("build", "titan", "fused", d, name) for d in ("gen", "bin"))
        dump = os.path.join("build", "titan", "fused", "dump", name)
        cmds.append("make --no-print-directory -s PLAN=%s OUT=%s BUILD=%s %s/%s && rm -rf %s && %s/%s --simulate "
                    "--steps %d --pattern oracle --dump %s --quiet" % (plan, gen, bin_dir, bin_dir, name, dump,
                                                                       bin_dir, name, STEPS, dump))
    return subprocess.Popen(["bash", "-c", " && ".join(cmds)], cwd=E.ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def compare_grads(key, rec, problems):
    """test_chunked_loss.compare_grads on this check's dumps: (elements compared, of them the fused w13's)."""
    import test_chunked_loss as C
    return C.compare_grads(key, key, rec, problems, dump=os.path.join(OUT, "dump", key), world=WORLD,
                           counted=lambda pname: pname.endswith(".w13"))


def gloo_check():
    import tempfile
    import torch.multiprocessing as mp
    import test_chunked_loss as C
    plans = {key: generate(key, WORLD, model, MESHES[mn], dict(FSDP_SUM, micro_steps=m),
                           {"loss_chunks": 1, "local_batch_size": BATCH}, SEQ)
             for key, _, model, mn, m in GLOO_RUNS}
    ids = {key: C.param_ids(p) for key, p in plans.items()}
    sim = simulate([r[0] for r in GLOO_RUNS])
    # The ranks forked from this process with what they import imported once, here (test_qwen3_plan.py's
    # way; main runs this before the wrapping cases make meshes in this process); spawning imported torch and
    # torchtitan again in every rank, seconds of CPU each. TITAN_START=spawn spawns them.
    start = os.environ.get("TITAN_START", "fork")
    if start == "fork":
        import torch.distributed.fsdp  # noqa: F401
        import torchtitan.components.loss  # noqa: F401
        import torchtitan.distributed.parallel_dims  # noqa: F401
        import torchtitan.distributed.utils  # noqa: F401
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        mp.start_processes(worker, args=(os.path.join(tmp, "init"), tmp, ids), nprocs=WORLD, start_method=start)
        rec = []
        for r in range(WORLD):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                rec.append(json.load(fh))
    sim_out = sim.communicate()[0].decode(errors="replace")
    problems, compared, grads, w13, lines = [], 0, 0, 0, []
    if sim.returncode != 0:
        problems.append("building or simulating the plans failed: %s" % sim_out[-2000:])
    for key, plan in sorted(plans.items()):
        for r in range(WORLD):
            want = [s[:5] for s in C.table_step(plan, r)]
            for step, got in enumerate(rec[r]["steps"][key]):
                compared += C.compare_step(key, r, step, C.recorded(got), want, problems)
        if sim.returncode == 0:
            g, w = compare_grads(key, rec, problems)
            grads, w13 = grads + g, w13 + w
        lines.append("%s: %d collectives per rank-step" % (key, len(rec[0]["steps"][key][-1])))
    return problems, compared, grads, w13, lines


# ---- main ----

def main():
    E.need_titan(NAME)
    t0 = time.time()
    meshes = [(w, tuple(sorted(p.items()))) for _, _, _, w, p in CASES]
    assert len(meshes) == len(set(meshes)), "two cases on one mesh"
    only = set(sys.argv[1:])
    stats = dict.fromkeys(("cases", "units", "params", "placements", "tp_local", "w13", "wrong_caught"), 0)
    declared = dict.fromkeys(("names", "uneven", "reduce", "fused"), 0)
    problems, lines = [], []
    # The gloo step first: its ranks are forked from this process (gloo_check), before the wrapping
    # cases below make meshes here (a forked rank must not inherit them).
    compared = grads = w13 = 0
    glines = []
    if not only or "gloo" in only:
        ps, compared, grads, w13, glines = gloo_check()
        problems += ps
    for case in CASES:
        if only and case[0] not in only and "wrap" not in only:
            continue
        tc = time.time()
        problems += run_case(case, stats, declared)
        stats["cases"] += 1
        lines.append("%s (%d ranks%s) %.1f s" % (case[0], case[3], "".join(
            ", %s=%d" % (k, v) for k, v in case[4].items() if v not in (1, -1)), time.time() - tc))
    print("fused_plan: wrapping: " + "; ".join(lines))
    for g in glines:
        print("  " + g)
    for p in problems[:40]:
        print("DISAGREE", p)
    if len(problems) > 40:
        print("... and %d more" % (len(problems) - 40))
    tv, ttv = E.versions()
    print("fused_plan: %d wrapping cases (%d units, %d parameters of which %d fused w13, %d placements, %d TP-local "
          "shapes; %d unfused plans told apart from the fused models), %d collectives on gloo (qwen3's fused SwiGLU: "
          "FSDP and HSDP, %s micro-batches; DeepSeek-V3 with all three: FSDP), %d reduced gradient elements (%d of w13) equal to --simulate, compared with torchtitan %s "
          "(torch %s) in %.1f s: %d disagreements"
          % (stats["cases"], stats["units"], stats["params"], stats["w13"], stats["placements"], stats["tp_local"],
             stats["wrong_caught"], compared, " and ".join(map(str, MICRO)), grads, w13, ttv, tv, time.time() - t0,
             len(problems)))
    if QUICK:
        print("quick tier: the gloo step at 1 micro-batch; make test-full runs 2 micro-batches too")
    return 1 if problems or not stats["cases"] and not compared else 0


if __name__ == "__main__":
    sys.exit(main())
