#!/usr/bin/env python3
"""A torchtitan 0.3 LoRA training step's collectives on gloo against the plan `commplan write
--titan llama3:debugmodel --lora-rank R --spmd-backend partial_dtensor` writes (issue 41).

torchtitan's side: its llama3 debugmodel with its own LoRAConverter (components/lora.py: every
Linear a LoRALinear whose base weight is frozen, trainable lora_a / lora_b; every other module's
own parameters frozen), as its registry builds it (model_registry("debugmodel",
converters=[LoRAConverter.Config(...)]), models/llama3/config_registry.py:155-171), parallelized by
its own parallelize_llama on 4 CPU ranks over gloo, FSDP (dp_shard 4; HSDP 2 x 2 in the full tier),
bf16 all-gathers and fp32 summed reductions, CrossEntropyLoss in the trainer's step body
(tests/titan/test_chunked_loss.py's harness: its recorder, its oracle gradient pattern), and
torchtitan's AdamW (OptimizersContainer, default_adamw) stepped after the last backward.

The backend: under torchtitan 0.3's default parallelism.spmd_backend = "spmd_types", parallelize
re-registers every parameter as a new nn.Parameter (protocols/module.py:313-315, requires_grad
True), so the LoRA freeze is undone and FSDP2 and the optimizer train every weight (the writer then
writes nothing frozen: tests/titan/test_lora_plan.py); "partial_dtensor" keeps the converter's
requires_grad (:373-378), the job configuration that trains adapters alone. Both run here (spmd_types
in the full tier), each against the plan the writer writes for it: under spmd_types nothing frozen,
every weight reduced and every one with AdamW state, as torchtitan trains it there.

Checks, 0 differences each: every rank's FSDP collectives of every step (kind, per-rank count,
dtype, reduce op, group ranks), in issue order, against the plan's tables -- every all-gather
carries its unit's whole slot, frozen weights included; every reduce-scatter and all-reduce
carries its unit's adapters' padded shards alone (plan.json rs_numel, compared with the slot);
torchtitan's frozen tok_embeddings runs no pre-backward (the frozen prefix:
gen/parallel/fsdp_layout.lua), its backward all-gather is layers.0's prefetch; every frozen
parameter left without a gradient and without optimizer state; every rank's reduced adapter
gradient shard after the last step against the plan binary's --simulate --pattern oracle --dump,
float32 bit for bit; AdamW's state bytes per rank equal to the plan's optimizer memory
(audit.memory.optimizer_bytes). And the check can fail: a mutant plan with one frozen weight made
trainable differs from torchtitan's run (the counts printed). Prints one "lora_step:" line; exit 0
when every check holds, 1 otherwise, 77 (SKIP) without torch and torchtitan.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402
import test_chunked_loss as CL  # noqa: E402

NAME = "a torchtitan LoRA step's collectives vs commplan write --lora-rank (tests/titan/test_lora_step.py)"
OUT = CL.OUT
WORLD = 4
FLAVOR, RANK, ALPHA = "debugmodel", 4, 8.0
BACKEND = "partial_dtensor"
SEQ, BATCH = 16, 1
# name -> (mesh, spmd_backend): the adapters-only job under partial_dtensor, and torchtitan's default
# spmd_types, which trains every weight (the plan the writer writes there has nothing frozen)
CASES = {"fsdp": ({"dp_shard": 4}, BACKEND), "hsdp": ({"dp_replicate": 2, "dp_shard": 2}, BACKEND),
         "fsdp_spmd_types": ({"dp_shard": 4}, "spmd_types")}
# make test (COMMPLAN_TEST_TIER=quick): FSDP under partial_dtensor alone ("quick tier:" line); make
# test-full and a run by hand: HSDP and spmd_types too. 2 steps each (a model's first and a steady one).
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
MESH_NAMES = ("fsdp",) if QUICK else ("fsdp", "hsdp", "fsdp_spmd_types")
STEPS = 2
# the mutant: one frozen base weight written trainable
MUTANT = "layers.0.attention.wo.weight"


def plan_name(mesh_name):
    return "lora_step_%s" % mesh_name


def write_plan(mesh_name):
    """The plan `commplan write` writes for this mesh (its command line, as a user runs it)."""
    name = plan_name(mesh_name)
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    par, backend = CASES[mesh_name]
    cmd = [sys.executable, "-m", "commplan", "write", "--titan", "llama3:" + FLAVOR, "--name", name,
           "--world-size", str(WORLD), "--dp-shard", str(par["dp_shard"]), "--seq-len", str(SEQ),
           "--local-batch-size", str(BATCH), "--lora-rank", str(RANK), "--spmd-backend", backend, "-o", path]
    if par.get("dp_replicate", 1) > 1:
        cmd[cmd.index("--dp-shard"):cmd.index("--dp-shard")] = ["--dp-replicate", str(par["dp_replicate"])]
    env = dict(os.environ, PYTHONPATH=os.path.join(E.ROOT, "python"))
    r = subprocess.run(cmd, cwd=E.ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("commplan write failed: %s" % (r.stderr or r.stdout)[-2000:])
    return name, path


def generate(name, path):
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def mutant_plan(name, path):
    """The plan with MUTANT written trainable, generated."""
    with open(path) as fh:
        text = fh.read()
    line = '{ name = "%s", shape = { 256, 256 }, frozen = true }' % MUTANT
    assert line in text, "the written plan lost %s" % MUTANT
    mpath = path.replace(".lua", "_mutant.lua")
    with open(mpath, "w") as fh:
        fh.write(text.replace(line, line.replace(", frozen = true", "")).replace(name, name + "_mutant"))
    return generate(name + "_mutant", mpath)


def worker(rank, init, out_dir, ids):
    import copy
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=WORLD)
    E.cpu_training()
    import test_llama_plan as TL
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.lora import LoRAConverter
    from torchtitan.components.optimizer.optimizer import default_adamw
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import get_spmd_context
    from torchtitan.models.llama3 import model_registry
    log, on = [], [False]
    CL.install_recorder(log, on)
    CL.install_grad_pattern()
    GP = CL.GP
    GP.rank = rank
    res, grads, frozen, opt_bytes, stateless = {}, {}, {}, {}, {}
    spec = model_registry(FLAVOR, converters=[LoRAConverter.Config(rank=RANK, alpha=ALPHA)])
    for mesh_name in MESH_NAMES:
        par, backend = CASES[mesh_name]
        training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                                  mixed_precision_param="bfloat16", mixed_precision_reduce="float32")
        parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                        data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=1,
                                        spmd_backend=backend)
        pd = ParallelDims.from_config(parallelism, WORLD)
        pd.build_mesh()
        torch.manual_seed(0)
        model = TL.parallelize(copy.deepcopy(spec.model), parallelism, training, pd, "cpu")
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
        ocfg = default_adamw()
        ocfg.implementation = "for-loop"  # (CPU: torchtitan's "fused" is CUDA's)
        opt = ocfg.build(model_parts=[model])
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
        key = mesh_name
        GP.names = {id(p): n for n, p in model.named_parameters()}
        GP.k = {n: ids[key][n] for n, p in model.named_parameters()}
        GP.count = {}
        ctx = get_spmd_context(parallel_dims=pd)
        steps = []
        for step in range(STEPS):
            del log[:]
            on[0] = True
            CL.forward_backward(model, loss_fn, ctx, spec.model.vocab_size, BATCH, SEQ, WORLD, rank, step, 1, GP)
            on[0] = False
            steps.append(list(log))
            if step == STEPS - 1:
                trainable = [n for n, p in model.named_parameters() if p.requires_grad]
                bad = {n: c for n, c in GP.count.items() if c != STEPS}
                if bad or sorted(GP.count) != sorted(trainable):
                    raise AssertionError("gradient pattern: overwritten %s times, want %d each of %d"
                                         % (bad or sorted(set(trainable) ^ set(GP.count)), STEPS, len(trainable)))
                grads[key] = {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
                              .detach().reshape(-1).double().tolist() for n, p in model.named_parameters()
                              if p.requires_grad}
                # frozen: requires_grad False and no gradient after the steps
                frozen[key] = sorted(n for n, p in model.named_parameters() if not p.requires_grad and p.grad is None)
                opt.step()
                st = [s for o in opt for s in o.state.values()]
                opt_bytes[key] = sum((v.to_local() if hasattr(v, "to_local") else v).numel() * v.element_size()
                                     for s in st for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
                held = {id(p) for o in opt for p in o.state}
                stateless[key] = sorted(n for n, p in model.named_parameters() if id(p) not in held)
            for p in model.parameters():  # optimizer.zero_grad()
                p.grad = None
        res[key] = steps
        GP.k = None
        del model, opt
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump({"collectives": res, "grads": grads, "frozen": frozen, "opt_bytes": opt_bytes,
                   "stateless": stateless}, fh)
    dist.destroy_process_group()


def main():
    E.need_titan(NAME)
    import tempfile
    import torch.multiprocessing as mp
    written = {mn: write_plan(mn) for mn in MESH_NAMES}
    plans = {mn: generate(*written[mn]) for mn in MESH_NAMES}
    mutants = {mn: mutant_plan(*written[mn]) for mn in MESH_NAMES if CASES[mn][1] != "spmd_types"}
    ids = {mn: CL.param_ids(p) for mn, p in plans.items()}
    names = [plan_name(mn) for mn in MESH_NAMES]
    CL.STEPS = STEPS  # (simulate_cmd's steps)
    log = open(os.path.join(OUT, "lora_step_sim.log"), "w")
    sim = subprocess.Popen(["bash", "-c", CL.simulate_cmd(names)], cwd=E.ROOT, stdout=log, stderr=subprocess.STDOUT)
    import test_llama_plan  # noqa: F401  (imported once, before the ranks fork)
    import torchtitan.components.loss  # noqa: F401
    import torchtitan.components.lora  # noqa: F401
    import torchtitan.components.optimizer.optimizer  # noqa: F401
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
    problems, compared, grads, mutant_diff = [], 0, 0, 0
    ag_frozen = rs_rows = 0
    if sim_rc != 0:
        with open(os.path.join(OUT, "lora_step_sim.log")) as fh:
            problems.append("building or simulating failed: %s" % fh.read()[-2000:])
    for mn in MESH_NAMES:
        plan = plans[mn]
        units = {u["name"]: u for u in plan["units"]}
        want_frozen = sorted(q["name"] for u in plan["units"] for q in u["params"] if q.get("frozen"))
        trainable = sorted(q["name"] for u in plan["units"] for q in u["params"] if not q.get("frozen"))
        # the plan: reduce-scatter rows hold the adapters' shards alone, all-gathers the whole slot
        lora = CASES[mn][1] != "spmd_types"
        if not lora and want_frozen:
            problems.append("%s: the writer wrote %d parameters frozen under spmd_types, which trains them all "
                            "(protocols/module.py:313-315)" % (mn, len(want_frozen)))
        for u in plan["units"]:
            if not u["params"] or not lora:
                continue
            adapters = sum(q["padded_numel"] for q in u["params"] if not q.get("frozen"))
            if u.get("rs_numel", u["slot_numel"]) != adapters or adapters >= u["slot_numel"]:
                problems.append("%s unit %s: reduce-scatter row %s, its adapters' shards %d, slot %d"
                                % (mn, u["name"], u.get("rs_numel"), adapters, u["slot_numel"]))
        for r in range(WORLD):
            table = CL.table_step(plan, r)
            want = [s[:5] for s in table]
            mwant = lora and [s[:5] for s in CL.table_step(mutants[mn], r)]
            for step, got in enumerate(rec[r]["collectives"][mn]):
                got = CL.recorded(got)
                compared += CL.compare_step(mn, r, step, got, want, problems)
                mutant_diff += CL.diff(got, mwant)[0] if lora else 0
            for s in table:
                u = units[s[5]]
                if s[0] == "all_gather" and any(q.get("frozen") for q in u["params"]):
                    ag_frozen += s[1] == u["slot_numel"]
                elif lora and s[0] in ("reduce_scatter", "all_reduce"):
                    rs_rows += s[1] == u["rs_numel"] < u["slot_numel"]
            if rec[r]["frozen"][mn] != want_frozen:
                problems.append("%s rank %d: torchtitan's frozen parameters without a gradient %d, the plan's frozen %d"
                                % (mn, r, len(rec[r]["frozen"][mn]), len(want_frozen)))
            if rec[r]["stateless"][mn] != want_frozen:
                problems.append("%s rank %d: AdamW holds no state for %s, the plan's frozen are %d parameters"
                                % (mn, r, rec[r]["stateless"][mn][:4], len(want_frozen)))
            if rec[r]["opt_bytes"][mn] != plan["audit"]["memory"]["optimizer_bytes"]:
                problems.append("%s rank %d: AdamW's state %d bytes, the plan's optimizer memory %d"
                                % (mn, r, rec[r]["opt_bytes"][mn], plan["audit"]["memory"]["optimizer_bytes"]))
        tok = units["tok_embeddings"]
        if lora and not (tok.get("no_pre_backward") and units["layers.0"].get("final_callback")):
            problems.append("%s: tok_embeddings is not planned as the frozen prefix" % mn)
        print("%-15s %d ranks x %d steps: %d collectives per rank-step (the tables: %d); %d parameters, %d frozen; "
              "AdamW %d bytes per rank" % (mn, WORLD, STEPS, len(rec[0]["collectives"][mn][-1]),
                                           len(CL.table_step(plan, 0)), len(want_frozen) + len(trainable),
                                           len(want_frozen), rec[0]["opt_bytes"][mn]))
        if sim_rc == 0:
            n, _ = CL.compare_grads(mn, plan_name(mn), rec, problems)
            grads += n
    if not mutant_diff:
        problems.append("the mutant plan (%s trainable) equals torchtitan's run: the check cannot tell" % MUTANT)
    for p in problems[:20]:
        print("FAIL", p)
    print("lora_step: %d collectives compared (%s), %d differences; in the tables of every rank, %d all-gathers "
          "of units with frozen weights carry the whole slot, %d reductions the adapters' shards alone; %d reduced gradient elements (the "
          "adapters' alone under partial_dtensor) equal commplan's --simulate element for element; AdamW state equal to the plan's optimizer memory; "
          "the mutant (%s trainable) differs in %d collectives; %d problems"
          % (compared, "/".join(MESH_NAMES), len([p for p in problems if " step " in p]), ag_frozen, rs_rows, grads,
             MUTANT, mutant_diff, len(problems)))
    if QUICK:
        print("quick tier: FSDP (dp_shard 4) under partial_dtensor; make test-full runs HSDP 2 x 2 and torchtitan's "
              "default spmd_types (every weight trained) too")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
