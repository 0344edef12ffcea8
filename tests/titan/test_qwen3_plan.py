#!/usr/bin/env python3
"""commplan's qwen3 family (dense Qwen3, gen/models/qwen3.lua) against torchtitan 0.3's own Qwen3.

1. Wrapping: torchtitan's qwen3 dense models -- registry flavours (debugmodel, its non-fused qkv
   twin, 0.6B, the shipped plans/qwen3_8b.lua's 8B, 32B) and tiny untied ones built with its own
   _build_qwen3_layers -- on the meta device, parallelized by its own parallelize_qwen3
   (apply_fsdp_to_decoder) at the plan's mesh over a fake process group (FSDP and HSDP). Per unit:
   modules, reshard_after_forward, MixedPrecisionPolicy dtypes, gradient divide factor; per
   parameter: name, order, shape, dtype, placement with its mesh dims, rank 0's shard (sharded
   size, padded numel); all equal to plan.json (tests/titan/test_moe_plan.py's comparison).
2. Parameter counts: every registry flavour 0.6B .. 32B built on the meta device,
   sum(model.parameters()) (a tied table once) against gen/models/qwen3.lua's count.
3. One step's FSDP collectives on 4 CPU ranks over gloo, torchtitan's trainer path: the model built
   on the meta device, parallelize_qwen3, to_empty, init_weights (which re-ties a tied model), then
   the trainer's step body with CrossEntropyLoss (training.loss_chunks = 1), bf16 all-gathers, fp32
   reductions summed (set_force_sum_reduction_for_comms: gloo has no PREMUL_SUM); tied and untied,
   FSDP (dp_shard 4) and HSDP (2 x 2), 1 and 2 micro-batches, 3 steps. Every all-gather,
   reduce-scatter and all-reduce of every rank in issue order (kind, per-rank count, dtype, reduce
   op, the group's ranks) against plan.json's ops (tests/titan/test_chunked_loss.py's recorder and
   reader). The tie is checked live too: after init_weights tok_embeddings.weight is
   lm_head.weight, and after the step the two FSDP parameters hold one sharded tensor.
4. Activations: torchtitan's dense Qwen3 block (fused and unfused qkv; each with its FeedForward as
   FusedSwiGLU too, model.fused "swiglu") under no checkpointing,
   SelectiveAC and FullAC, the saved bytes (tests/titan/test_moe_acts.py's measurement) against
   qwen3.block_acts.
make test (COMMPLAN_TEST_TIER=quick): the gloo step's FSDP untied at 1 micro-batch and HSDP tied at 2
(tied and untied, FSDP and HSDP, 1 and 2 micro-batches each once), 2 steps (a model's first and a
steady-state one, as test_chunked_loss.py's quick tier), one "quick tier:" line; full: all 8, 3 steps.
Prints one "qwen3_plan:" summary line; exit 0 when everything agrees, 1 otherwise, 77 (SKIP)
without torch and torchtitan.
"""

import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "qwen3 family vs torchtitan's dense Qwen3 (tests/titan/test_qwen3_plan.py)"
OUT = os.path.join(E.ROOT, "build", "titan", "qwen3")
FSDP_SUM = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"}

DEBUG = dict(dim=256, n_layers=8, n_heads=16, n_kv_heads=8, head_dim=128, vocab_size=2048, hidden_dim=3072)
TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=250, hidden_dim=96)

# (case, commplan model table or the shipped plan's path, torchtitan flavour or None (TINY numbers
#  through its own builders), world, parallel). Every case on its own mesh.
CASES = [
    ("qwen3_debug", dict(DEBUG, family="qwen3", enable_weight_tying=True), "debugmodel", 4, {"dp_shard": -1}),
    ("qwen3_debug_unfused_hsdp", dict(DEBUG, family="qwen3", enable_weight_tying=True, fuse_qkv=False),
     "debugmodel_non_fused_qkv", 6, {"dp_replicate": 2, "dp_shard": -1}),
    ("qwen3_tiny_untied", dict(TINY, family="qwen3"), None, 3, {"dp_shard": -1}),
    ("qwen3_tiny_untied_unfused_hsdp", dict(TINY, family="qwen3", fuse_qkv=False), None, 8,
     {"dp_replicate": 2, "dp_shard": -1}),
    ("qwen3_0_6b", {"family": "qwen3", "size": "0.6b"}, "0.6B", 16, {"dp_shard": -1}),
    ("qwen3_8b", "plans/qwen3_8b.lua", "8B", 64, {"dp_shard": -1}),
    ("qwen3_32b_hsdp", {"family": "qwen3", "size": "32b"}, "32B", 128, {"dp_replicate": 2, "dp_shard": -1}),
]
# issue 41 (h41a): wrapped again under torchtitan's "always" and "never" reshard policies
POLICY_CASES = ("qwen3_debug", "qwen3_tiny_untied")
FLAVOURS = {"0.6b": "0.6B", "1.7b": "1.7B", "4b": "4B", "8b": "8B", "14b": "14B", "32b": "32B"}

# the gloo step
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
WORLD, SEQ, BATCH, STEPS = 4, 16, 1, (2 if QUICK else 3)
MESHES = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
MICRO = (1, 2)
TIES = (True, False)
# the gloo runs (mesh, tied, micro-batches): quick, one of each mesh, tie and micro-batch count
GLOO_QUICK = (("fsdp", False, 1), ("hsdp", True, 2))


def gloo_runs():
    return [(mn, tied, m) for mn in MESHES for tied in TIES for m in MICRO
            if not QUICK or (mn, tied, m) in GLOO_QUICK]


# ---- torchtitan's side ----

def titan_config(flavor, n=None, tied=False, fused=True):
    """A registry flavour's Qwen3Model.Config, or n's numbers through torchtitan's own builders."""
    import torchtitan.models.qwen3 as Q
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    if flavor:
        return Q.model_registry(flavor).model
    d, v, hd = n["dim"], n["vocab_size"], n["head_dim"]
    return Q.Qwen3Model.Config(
        vocab_size=v, dim=d, norm=Q._qwen3_norm(d), enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d,
                                        param_init=Q._EMBEDDING_SKIP_INIT if tied else Q._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=d, out_features=v, param_init=Q._LINEAR_INIT),
        layers=Q._build_qwen3_layers(
            fuse_qkv=fused, n_layers=n["n_layers"], dim=d, n_heads=n["n_heads"], n_kv_heads=n["n_kv_heads"],
            head_dim=hd, hidden_dim=n["hidden_dim"], attn_backend="flex",
            rope=CosSinRoPE.Config(dim=hd, max_seq_len=4096, theta=1000000.0)))


def parallelize(cfg, parallelism, training, pd):
    """torchtitan's path: update_from_config, build on the meta device, parallelize_qwen3."""
    import torch
    from torchtitan.config import CompileConfig
    from torchtitan.models.qwen3 import model_registry, parallelize_qwen3
    from torchtitan.trainer import Trainer
    spec = model_registry("debugmodel")
    spec.model = cfg
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
    with torch.device("meta"):
        model = cfg.build()
    return parallelize_qwen3(model, parallel_dims=pd, training=training, parallelism=parallelism,
                             compile_config=CompileConfig(), ac_config=None, dump_folder=os.path.join(OUT, "dump"))


def job(par, seq_len, f):
    from torchtitan.config import ParallelismConfig, TrainingConfig
    parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                    data_parallel_shard_degree=par.get("dp_shard", -1), tensor_parallel_degree=1)
    dt = {"fp32": "float32", "bf16": "bfloat16"}
    training = TrainingConfig(local_batch_size=BATCH, seq_len=seq_len, dtype="float32",
                              mixed_precision_param=dt[f.get("param_dtype") or "fp32"],
                              mixed_precision_reduce=dt[f.get("reduce_dtype") or "fp32"])
    return parallelism, training


# ---- commplan's side ----

def generate(path, name):
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", path, os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def write_plan(name, world, model, parallel, fsdp, training=None):
    from commplan import plan_text
    text = plan_text(name, world, model, parallel=dict(parallel), fsdp=dict(fsdp), training=training,
                     topology={"gpus_per_node": world if world <= 8 else 8})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    return os.path.relpath(path, E.ROOT)


def lua_counts():
    """gen/models/qwen3.lua's parameter count of every registry size."""
    code = ("package.path = './?.lua;' .. package.path\n"
            "local q = require('gen.models.qwen3')\n"
            "for _, s in ipairs({ %s }) do\n"
            "  local units, m = q.units({ file = 'x', source = '' }, { family = 'qwen3', size = s, dtype = 'fp32' })\n"
            "  print(s, q.count(units, m.config))\n"
            "end\n") % ", ".join("'%s'" % s for s in FLAVOURS)
    return {k: int(v) for k, v in (line.split() for line in E.lua(["-e", code]).splitlines())}


def lua_block(n, fused, T, swiglu=False):
    code = ("package.path = './?.lua;' .. package.path\n"
            "local q = require('gen.models.qwen3')\n"
            "local cfg = { dim = %d, n_heads = %d, n_kv_heads = %d, head_dim = %d, hidden = %d, fuse_qkv = %s, "
            "qk_norm = true" + (", fused = { swiglu = true }" if swiglu else "") + " }\n"
            "local function b(ac) return q.block_acts(cfg, 2, %d, ac).saved end\n"
            "print(string.format('%%d %%d %%d', b('none'), b('selective'), b('full')))\n") % (
        n["dim"], n["n_heads"], n["n_kv_heads"], n["head_dim"], n["hidden_dim"], "true" if fused else "false", T)
    return [int(x) for x in E.lua(["-e", code]).split()]


# ---- 1. wrapping ----

def run_case(case, stats):
    from torchtitan.distributed.parallel_dims import ParallelDims
    import test_llama_plan as L
    import test_moe_plan as M
    name, model, flavor, world, parallel = case
    if isinstance(model, str):
        plan = generate(model, name)
        n, tied, fused = None, None, True
    else:
        plan = generate(write_plan(name, world, dict(model, seq_len=2048), parallel, FSDP_SUM), name)
        n, tied, fused = model, model.get("enable_weight_tying", False), model.get("fuse_qkv", True)
    par = plan["parallel"]
    parallelism, training = job({"dp_replicate": par["dp_replicate"], "dp_shard": par["dp_shard"]}, 2048,
                                plan["fsdp"])
    with E.fake_world(world), (E.member_groups_only() if world > 64 else L._null()):
        pd = ParallelDims.from_config(parallelism, world)
        pd.build_mesh()
        m = parallelize(titan_config(flavor, n, tied, fused), parallelism, training, pd)
        theirs = M.titan_units(m)
        del m
        out = ["%s: %s" % (name, p) for p in M.compare(M.commplan_units(plan), theirs, stats)]
        # issue 41 (h41a): torchtitan's "always" / "never" reshard policies (distributed/fsdp.py:183-204: the tied
        # [tok_embeddings, norm, lm_head] and the untied [norm, lm_head] reshard under "always" alone)
        for pol in (M.POLICIES if name in POLICY_CASES else ()):
            pname = "%s_%s" % (name, pol)
            mine = generate(write_plan(pname, world, dict(model, seq_len=2048), parallel,
                                       dict(FSDP_SUM, reshard_after_forward_policy=pol)), pname)
            m = parallelize(titan_config(flavor, n, tied, fused),
                            dataclasses.replace(parallelism, fsdp_reshard_after_forward=pol), training, pd)
            theirs = M.titan_units(m)
            del m
            stats["policies"] = stats.get("policies", 0) + 1
            out += ["%s (%s): %s" % (name, pol, p) for p in M.compare(M.commplan_units(mine), theirs, stats)]
    return out


# ---- 3. the gloo step ----

def worker(rank, init, out_dir):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    E.cpu_training()
    import test_chunked_loss as C
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import get_spmd_context
    log, on = [], [False]
    C.install_recorder(log, on)
    res, ties = {}, {}
    for mesh_name, par in MESHES.items():
        parallelism, training = job(par, SEQ, FSDP_SUM)
        pd = ParallelDims.from_config(parallelism, WORLD)
        pd.build_mesh()
        for tied in TIES:
            for micro in MICRO:
                if (mesh_name, tied, micro) not in gloo_runs():
                    continue
                torch.manual_seed(0)
                model = parallelize(titan_config(None, TINY, tied), parallelism, training, pd)
                model.to_empty(device="cpu")  # the trainer's order: parallelize, to_empty, init_weights
                with torch.no_grad():
                    model.init_weights(buffer_device=None)
                model.train()
                key = "%s_%s_m%d" % (mesh_name, "tied" if tied else "untied", micro)
                tie = {"attr_tied": model.tok_embeddings.weight is model.lm_head.weight}
                for mod in model.modules():
                    if isinstance(mod, FSDPModule):
                        mod.set_force_sum_reduction_for_comms(True)
                loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
                ctx = get_spmd_context(parallel_dims=pd)
                steps = []
                for step in range(STEPS):
                    del log[:]
                    on[0] = True
                    C.forward_backward(model, loss_fn, ctx, TINY["vocab_size"], BATCH, SEQ, WORLD, rank, step, micro)
                    on[0] = False
                    steps.append(list(log))
                    if step == 0:
                        st = model.tok_embeddings._get_fsdp_state()
                        fps = st._fsdp_param_groups[0].fsdp_params
                        sp = [fp.sharded_param for fp in fps]
                        tie.update(fsdp_params=len(fps), distinct_sharded=len({id(x) for x in sp}),
                                   model_params=len(list(model.parameters())),
                                   grad_shared=bool(tied) and fps[0].sharded_param.grad is fps[-1].sharded_param.grad)
                    for p in model.parameters():  # optimizer.zero_grad()
                        p.grad = None
                res[key] = steps
                ties[key] = tie
                del model
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump({"steps": res, "ties": ties}, fh)
    dist.destroy_process_group()


def gloo_check():
    import tempfile
    import torch.multiprocessing as mp
    import test_chunked_loss as C
    plans = {}
    for mn, tied, m in gloo_runs():
        name = "qwen3_gloo_%s_%s_m%d" % (mn, "tied" if tied else "untied", m)
        plans[(mn, tied, m)] = generate(write_plan(
            name, WORLD, dict(TINY, family="qwen3", enable_weight_tying=tied, seq_len=SEQ), MESHES[mn],
            dict(FSDP_SUM, micro_steps=m), {"loss_chunks": 1, "local_batch_size": BATCH}), name)
    os.makedirs(OUT, exist_ok=True)
    # The ranks forked from this process, torch and torchtitan imported once here (tests/tp_record.py's
    # way; main runs this first, before this process makes a process group or a mesh); spawning
    # imported them again in every rank, seconds of CPU each. TITAN_START=spawn imports them per rank.
    start = os.environ.get("TITAN_START", "fork")
    if start == "fork":
        import torch.distributed.fsdp  # noqa: F401
        import torchtitan.components.loss  # noqa: F401
        import torchtitan.distributed.parallel_dims  # noqa: F401
        import torchtitan.distributed.utils  # noqa: F401
        import torchtitan.models.qwen3  # noqa: F401
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        mp.start_processes(worker, args=(os.path.join(tmp, "init"), tmp), nprocs=WORLD, start_method=start)
        rec = []
        for r in range(WORLD):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                rec.append(json.load(fh))
    problems, compared, lines = [], 0, []
    for (mn, tied, m), plan in sorted(plans.items()):
        key = "%s_%s_m%d" % (mn, "tied" if tied else "untied", m)
        for r in range(WORLD):
            want = [s[:5] for s in C.table_step(plan, r)]
            for step, got in enumerate(rec[r]["steps"][key]):
                compared += C.compare_step(key, r, step, C.recorded(got), want, problems)
        tie = rec[0]["ties"][key]
        head = plan["units"][1] if tied else plan["units"][-1]
        if tied:
            # re-tied by init_states; FSDP's two parameters share the one sharded tensor and its grad
            ok = (tie["attr_tied"] and tie["fsdp_params"] == 3 and tie["distinct_sharded"] == 2
                  and tie["grad_shared"] and [q["name"] for q in head["params"]] ==
                  ["tok_embeddings.weight", "norm.weight", "lm_head.weight"])
            if not ok:
                problems.append("%s: the tie as measured %s differs from gen/models/qwen3.lua's account" % (key, tie))
        ag = [s for s in C.table_step(plan, 0) if s[5] == head["name"] and s[0] == "all_gather"]
        rs = [s for s in C.table_step(plan, 0) if s[5] == head["name"] and s[0] == "reduce_scatter"]
        lines.append("%s: %d collectives per rank-step, [%s] %d all-gather(s) of %d and %d reduce-scatter(s) "
                     "per step" % (key, len(rec[0]["steps"][key][-1]), head["name"], len(ag), ag[0][1] if ag else 0,
                                   len(rs)))
    return problems, compared, lines


# ---- main ----

def main():
    E.need_titan(NAME)
    import torch
    t0 = time.time()
    only = set(sys.argv[1:])
    stats = dict.fromkeys(("cases", "units", "params", "shard1"), 0)
    problems, lines = [], []
    # 3. the gloo step, run first: its ranks are forked from this process before it makes a process group
    compared, glines = 0, []
    if not only or "gloo" in only:
        ps, compared, glines = gloo_check()
        problems += ps
    # 1. wrapping
    for case in CASES:
        if only and case[0] not in only and "wrap" not in only:
            continue
        tc = time.time()
        problems += run_case(case, stats)
        stats["cases"] += 1
        lines.append("%s (%d ranks%s) %.1f s" % (case[0], case[3], "".join(
            ", %s=%d" % (k, v) for k, v in case[4].items() if v not in (1, -1)), time.time() - tc))
    print("qwen3_plan: wrapping: " + "; ".join(lines))
    # 2. parameter counts
    counts, ncount = lua_counts(), 0
    if not only or "counts" in only:
        for size, flavor in FLAVOURS.items():
            with torch.device("meta"):
                model = titan_config(flavor).build()
            theirs = sum(p.numel() for p in model.parameters())
            ncount += 1
            print("  %s: torchtitan %d parameters, commplan %d%s" % (flavor, theirs, counts[size],
                                                                     "" if theirs == counts[size] else "  MISMATCH"))
            if theirs != counts[size]:
                problems.append("%s: torchtitan counts %d parameters, commplan %d" % (flavor, theirs, counts[size]))
            del model
    # 3. the gloo step's lines (run above)
    for g in glines:
        print("  " + g)
    # 4. activations
    nacts = 0
    if not only or "acts" in only:
        import warnings
        warnings.filterwarnings("ignore")
        import test_llama_acts as LA
        import test_moe_acts as MA
        import torchtitan.models.qwen3 as Q
        from torchtitan.models.common import CosSinRoPE
        LA.cpu_stand_ins()
        # model.fused "swiglu" (issue 41, hpp2): the block's FeedForward replaced by torchtitan's FusedSwiGLU
        # (overrides/fused_swiglu.py:440-457, as its override replaces every FeedForward.Config, :486-505), its
        # silu_and_mul given test_fused_plan.py's CPU kernel
        import torchtitan.overrides.fused_swiglu as FS
        from test_fused_plan import cpu_silu_and_mul
        cpu_silu_and_mul()
        n = TINY
        for fused, swiglu in ((True, False), (False, False), (True, True), (False, True)):
            cfg = Q._build_qwen3_layers(
                fuse_qkv=fused, n_layers=1, dim=n["dim"], n_heads=n["n_heads"], n_kv_heads=n["n_kv_heads"],
                head_dim=n["head_dim"], hidden_dim=n["hidden_dim"], attn_backend="flex",
                rope=CosSinRoPE.Config(dim=n["head_dim"], max_seq_len=4096, theta=1e6))[0]
            if swiglu:
                fc = cfg.feed_forward
                cfg.feed_forward = FS.FusedSwiGLU.Config(w1=fc.w1, w2=fc.w2, w3=fc.w3)
            want = lua_block(n, fused, MA.B * MA.S, swiglu)
            got = [MA.block_none(cfg, n["dim"]), MA.block_selective(cfg, n["dim"], "layers.0"),
                   MA.block_full(cfg, n["dim"])]
            for ac, g, w in zip(("none", "selective", "full"), got, want):
                nacts += 1
                what = "dense qwen3 block (%s qkv%s), %s" % ("fused" if fused else "unfused",
                                                           ", fused SwiGLU w13" if swiglu else "", ac)
                print("  %s: torch %d bytes, qwen3.block_acts %d%s" % (what, g, w, "" if g == w else "  MISMATCH"))
                if g != w:
                    problems.append("%s: torch saves %d bytes, commplan %d" % (what, g, w))
    for p in problems[:40]:
        print("DISAGREE", p)
    if len(problems) > 40:
        print("... and %d more" % (len(problems) - 40))
    if QUICK:
        print("quick tier: the gloo step's fsdp_untied_m1 and hsdp_tied_m2, 2 steps; make test-full runs all 8 "
              "(FSDP and HSDP x tied and untied x 1 and 2 micro-batches), 3 steps")
    tv, ttv = E.versions()
    print("qwen3_plan: %d wrapping cases (%d of them again under \"always\" / \"never\" reshard policies; %d units, "
          "%d parameters), %d parameter counts, %d collectives on gloo "
          "(%s; %d steps), %d activation cases compared with torchtitan %s "
          "(torch %s) in %.1f s: %d disagreements"
          % (stats["cases"], stats.get("policies", 0), stats["units"], stats["params"], ncount, compared,
             ", ".join("%s_%s_m%d" % (mn, "tied" if t else "untied", m) for mn, t, m in gloo_runs()), STEPS, nacts, ttv,
             tv, time.time() - t0,
             len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
