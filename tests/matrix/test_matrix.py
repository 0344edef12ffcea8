#!/usr/bin/env python3
"""The composition matrix (issue 35, item 2): every combination of degrees 1 and 2 over
(dp_replicate, dp_shard, cp, tp, pp, ep) for each family commplan has (llama, qwen3, mixtral,
qwen3_moe, deepseek_v3), 64 x 5 = 320 meshes, each decided by commplan's generator and by
torchtitan 0.3's own code, and the two compared.

commplan's side (tests/matrix/matrix_plans.lua, one Lua process): the family's tiny model at the
mesh (world = dp_replicate x dp_shard x cp x tp x pp; ep borrows from dp_shard x cp x tp, as
torchtitan's ParallelDims), local batch 2, seq_len 256, bf16 all-gathers, fp32 reductions, pp's
torchtitan defaults (1F1B, microbatch size 1): planned by gen/plan.lua with every proof it runs,
or refused with one plan error.

torchtitan's side, run live (one forked process per mesh: a fake process group of the world's
size, this process rank 0; DeviceMesh keeps process-wide caches, so one mesh per process): what
torchtitan's Trainer runs before its first step, in its order -- Trainer.Config's __post_init__
checks (trainer.py:118-177), ParallelDims(...) and build_mesh() (distributed/parallel_dims.py),
the sequence-length divisor (trainer.py:306-315, inline in Trainer.__init__: restated here),
update_from_config and the model built on the meta device, then the family's own pipelining_fn
(pp > 1: distributed/pipeline_parallel.py's pipeline_llm: stage split, _pipeline_module_split,
parallelize_fn on every stage, _build_pipeline_schedule) or parallelize_fn (trainer.py:440-500)
-- with the same tiny model built by torchtitan's own layer builders (tests/titan/test_*_plan.py's).
Accepted, or refused with its exception.

Verdicts, per mesh:
  planned     both accept; commplan's plan passed its proofs (gen/plan.lua raises otherwise);
              the simulation sample below builds and runs it;
  refused     both refuse, for the same reason (CAUSES: torchtitan's exception against the plan
              field commplan's one line names);
  ignored     torchtitan accepts ep > 1 on a family without routed experts (llama, qwen3) and
              leaves it unused -- checked live: every parameter's placements and mesh are those of
              the same mesh at ep = 1 -- and commplan refuses the setting that would be ignored
              (the generator's rule: a setting that changes nothing is refused, naming it);
  disagreement  anything else (one side plans what the other refuses): the test fails, naming it.

The simulation sample: planned meshes built with make (the plan's C tables and runtime) and run on
every rank with --simulate --steps 2 in the runtime's own arithmetic and with --arith nccl (NCCL's
reduction order); the quick tier takes one per family (its largest world: every degree at 2), make
test-full every planned mesh. With --emu, also the emulated GPU path
(tests/emu_check.sh) on the sample's first mesh.

torchtitan's verdicts are memoized beside the torch environment
(${COMMPLAN_CACHE:-~/.cache/commplan}/titan/matrix-<key>.json), keyed by the sha256 of torch's and
torchtitan's versions, torchtitan's source files that decide them and this file: a memoized
verdict only stands for torchtitan's own answer to the same question, and a cold cache recomputes
every one (~2 minutes on 2 cores).

Prints one "matrix:" summary line; exit 0 when there is no disagreement and every simulation
passed, 1 otherwise, 77 (SKIP) without torch and torchtitan.
"""

import argparse
import hashlib
import inspect
import itertools
import json
import os
import subprocess
import sys
import time
from multiprocessing import get_context

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "titan"))
import titan_env as E  # noqa: E402

NAME = "the composition matrix (tests/matrix/test_matrix.py)"
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
FAMILIES = ("llama", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3")
DEG = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
SEQ, BATCH = 256, 2
DENSE = ("llama", "qwen3")

# The tiny models: tests/matrix/matrix_plans.lua's MODELS, the same numbers.
LLAMA = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=16, ffn_dim_multiplier=1.3)
QWEN3 = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=256)
MOE = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, moe_hidden_dim=48, num_experts=4, top_k=2)
DSV3 = dict(dim=64, n_layers=3, n_dense_layers=1, n_heads=4, vocab_size=256, q_lora_rank=16, kv_lora_rank=32,
            qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, dense_hidden_dim=96, moe_hidden_dim=32,
            num_experts=4, num_shared_experts=1, top_k=2)


def cases():
    out = []
    for fam in FAMILIES:
        for c in itertools.product((1, 2), repeat=6):
            out.append((fam + "_" + "".join(map(str, c)), fam, dict(zip(DEG, c))))
    return out


def fmt(fam, d):
    return fam + " " + " ".join("%s=%d" % (k, d[k]) for k in DEG if d[k] > 1) if any(d[k] > 1 for k in DEG) \
        else fam + " (one rank)"


def world(d):
    return d["dp_replicate"] * d["dp_shard"] * d["cp"] * d["tp"] * d["pp"]


# ---- commplan ----

def commplan_side(cs, plan_dir):
    os.makedirs(plan_dir, exist_ok=True)
    text = "".join("%s %s %s\n" % (cid, fam, " ".join(str(d[k]) for k in DEG)) for cid, fam, d in cs)
    out = E.lua(["tests/matrix/matrix_plans.lua", plan_dir], text)
    res = {}
    for line in out.splitlines():
        r = json.loads(line)
        res[r["id"]] = r
    assert len(res) == len(cs), "matrix_plans.lua lost cases"
    return res


# ---- torchtitan ----

def titan_model(fam):
    """The family's model spec (its parallelize_fn and pipelining_fn) with the tiny model's config,
    built by torchtitan's own layer builders (as tests/titan/test_*_plan.py build them)."""
    if fam == "llama":
        import test_llama_plan as L
        from torchtitan.models.llama3 import model_registry
        spec, cfg = model_registry("debugmodel"), L.titan_config("tiny", LLAMA, False)
    elif fam == "qwen3":
        import test_qwen3_plan as Q
        from torchtitan.models.qwen3 import model_registry
        spec, cfg = model_registry("debugmodel"), Q.titan_config(None, QWEN3)
    else:
        import test_moe_plan as M
        if fam == "deepseek_v3":
            from torchtitan.models.deepseek_v3 import model_registry
            spec, cfg = model_registry("debugmodel"), M.titan_config("deepseek_v3", None, DSV3)
        else:
            from torchtitan.models.qwen3 import model_registry
            model = dict(MOE, head_dim=16) if fam == "qwen3_moe" else dict(MOE)
            spec, cfg = model_registry("debugmodel_moe"), M.titan_config(fam, None, model)
    spec.model = cfg
    return spec, cfg


def titan_case(fam, d):
    """torchtitan's verdict for one mesh (run in a fresh process): {"ok": True, "params": [...]} or
    {"ok": False, "why": "<exception>"}."""
    import torch
    E.cpu_titan()
    import torch.testing._internal.distributed.fake_pg  # noqa: F401
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.trainer import Trainer
    w = world(d)
    try:
        parallelism = ParallelismConfig(
            data_parallel_replicate_degree=d["dp_replicate"], data_parallel_shard_degree=d["dp_shard"],
            context_parallel_degree=d["cp"], tensor_parallel_degree=d["tp"], pipeline_parallel_degree=d["pp"],
            expert_parallel_degree=d["ep"], enable_sequence_parallel=True)
        training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                                  mixed_precision_param="bfloat16", mixed_precision_reduce="float32",
                                  disable_cuda_graphs=True)
        spec, cfg = titan_model(fam)
        config = Trainer.Config(model_spec=spec, parallelism=parallelism, training=training)
        with E.fake_world(w):
            pd = ParallelDims.from_config(parallelism, w)
            pd.build_mesh()
            # trainer.py:306-315 (inline in Trainer.__init__)
            div = (pd.tp if parallelism.enable_sequence_parallel else 1) * (2 * pd.cp if pd.cp > 1 else 1)
            if SEQ % div:
                raise ValueError("Training sequence length (%d) must be divisible by %d for the configured "
                                 "sequence/context parallelism." % (SEQ, div))
            cfg.update_from_config(config=config)
            with torch.device("meta"):
                model = cfg.build()
            dump = os.path.join(ROOT, "build", "matrix", "dump")
            if pd.pp_enabled:
                if not spec.pipelining_fn:
                    raise RuntimeError("Pipeline Parallel is enabled but %s does not support pipelining" % spec.name)
                _, parts, _, _ = spec.pipelining_fn(
                    model, parallel_dims=pd, training=training, parallelism=parallelism,
                    compile_config=CompileConfig(), ac_config=None, dump_folder=dump, device=torch.device("cpu"),
                    model_config=cfg, parallelize_fn=spec.parallelize_fn,
                    loss_fn=CrossEntropyLoss(CrossEntropyLoss.Config()))
            else:
                parts = [spec.parallelize_fn(model, parallel_dims=pd, training=training, parallelism=parallelism,
                                             compile_config=CompileConfig(), ac_config=None, dump_folder=dump)]
            params = []
            for m in parts:
                for n, q in m.named_parameters():
                    pl = getattr(q, "placements", None)
                    mesh = getattr(q, "device_mesh", None)
                    params.append([n, str(pl), list(mesh.mesh_dim_names or ()) if mesh is not None else None,
                                   list(q.shape)])
        return {"ok": True, "params": params}
    except Exception as e:  # noqa: BLE001 - torchtitan's refusals are ValueError, AssertionError, ...
        msg = " ".join(str(e).split())
        return {"ok": False, "why": "%s: %s" % (type(e).__name__, msg[:400])}


def preload():
    """Import what every child needs once, before forking (a child then only builds and
    parallelizes): torchtitan's trainer, the families' models and the model builders."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401
    import torchtitan.trainer  # noqa: F401
    import torchtitan.models.llama3  # noqa: F401
    import torchtitan.models.qwen3  # noqa: F401
    import torchtitan.models.deepseek_v3  # noqa: F401
    import torchtitan.components.loss  # noqa: F401
    import test_llama_plan  # noqa: F401
    import test_qwen3_plan  # noqa: F401
    import test_moe_plan  # noqa: F401


def _child(args):
    fam, d = args
    return titan_case(fam, d)


def cache_key():
    import torch
    from importlib.metadata import version
    import torchtitan
    h = hashlib.sha256()
    h.update(("%s %s\n" % (torch.__version__, version("torchtitan"))).encode())
    base = os.path.dirname(torchtitan.__file__)
    for rel in ("distributed/parallel_dims.py", "distributed/pipeline_parallel.py", "trainer.py",
                "models/llama3/parallelize.py", "models/qwen3/parallelize.py",
                "models/deepseek_v3/parallelize.py", "distributed/full_dtensor.py", "distributed/fsdp.py",
                "models/common/moe.py", "distributed/context_parallel/api.py"):
        p = os.path.join(base, rel)
        if os.path.exists(p):
            with open(p, "rb") as f:
                h.update(f.read())
    for fn in (titan_case, titan_model):
        h.update(inspect.getsource(fn).encode())
    h.update(repr((LLAMA, QWEN3, MOE, DSV3, SEQ, BATCH)).encode())
    return h.hexdigest()[:16]


def titan_side(cs, jobs):
    cache_dir = os.path.join(os.environ.get("COMMPLAN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "commplan"), "titan")
    path = os.path.join(cache_dir, "matrix-%s.json" % cache_key())
    memo = {}
    if os.path.exists(path):
        with open(path) as f:
            memo = json.load(f)
    todo = [(cid, fam, d) for cid, fam, d in cs if cid not in memo]
    if todo:
        preload()
        ctx = get_context("fork")
        with ctx.Pool(jobs, maxtasksperchild=1) as pool:
            for (cid, _, _), r in zip(todo, pool.imap(_child, [(fam, d) for _, fam, d in todo])):
                memo[cid] = r
        os.makedirs(cache_dir, exist_ok=True)
        tmp = path + ".tmp.%d" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(memo, f, sort_keys=True)
        os.replace(tmp, path)
    return memo, len(todo)


# ---- the comparison ----

# torchtitan's refusals by what they are about, and the plan fields commplan's refusal of the same
# mesh must name: both must refuse for the same reason, not just both refuse. A torchtitan
# refusal matching none is a disagreement until it is classified here.
CAUSES = (
    # ParallelDims.build_mesh: efsdp = dp_shard * cp * tp // ep is 0 (ep does not divide what it borrows)
    ("unflatten", ("parallel.ep",)),
    # trainer.py:306-315, pipeline_parallel.py's batch / microbatch checks, the CP block mask
    ("sequence length", ("model.seq_len",)),
    ("microbatch", ("pipeline.microbatch_size", "training.local_batch_size", "pipeline.microbatches")),
    ("stages", ("parallel.pp", "pipeline.schedule", "pipeline.layers_per_stage")),
    ("CP is not supported", ("parallel.cp",)),
)


def same_cause(why, field):
    for needle, fields in CAUSES:
        if needle in why:
            return field in fields
    return False

def ep_ignored(fam, d, titan):
    """torchtitan accepted ep > 1 on a family without routed experts and left it unused: every
    parameter's placements, mesh and shape equal those at ep = 1 (the same mesh otherwise)."""
    if fam not in DENSE or d["ep"] == 1:
        return False
    base = dict(d, ep=1)
    cid = fam + "_" + "".join(str(base[k]) for k in DEG)
    a, b = titan[fam + "_" + "".join(str(d[k]) for k in DEG)], titan[cid]
    return a["ok"] and b["ok"] and a["params"] == b["params"]


def simulate(cid, plan_dir, log):
    """make the plan, then --simulate --steps 2 in both arithmetics: (ok, why)."""
    plan = os.path.join(plan_dir, cid + ".lua")
    name = "matrix_" + cid
    link = os.path.join(plan_dir, name + ".lua")
    if not os.path.exists(link):
        os.symlink(cid + ".lua", link)
    rel = os.path.relpath(link, ROOT)
    steps = [["make", "--no-print-directory", "-s", "PLAN=" + rel],
             [os.path.join(ROOT, "build", name, name), "--simulate", "--steps", "2", "--quiet"],
             [os.path.join(ROOT, "build", name, name), "--simulate", "--steps", "2", "--arith", "nccl", "--quiet"]]
    del plan
    for cmd in steps:
        r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        log.write("$ %s\n%s" % (" ".join(cmd), r.stdout))
        if r.returncode != 0:
            tail = r.stdout.strip().splitlines()[-1:] or [""]
            return False, "%s exited %d: %s" % (os.path.basename(cmd[0]), r.returncode, tail[0])
    return True, ""


def sample(planned):
    """The quick tier's simulation sample: per family its planned mesh of the largest world (ties:
    the most degrees > 1): llama's and qwen3's every dense degree at 2 (5-D, 32 ranks), the MoE
    families' 6-D meshes with ep 2."""
    by = {}
    for cid, fam, d in planned:
        score = (world(d), sum(d[k] > 1 for k in DEG))
        if fam not in by or score > by[fam][0]:
            by[fam] = (score, cid)
    return sorted(cid for _, cid in by.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-simulate", action="store_true", help="compare verdicts only")
    ap.add_argument("--all", action="store_true", help="simulate every planned mesh (make test-full's tier)")
    ap.add_argument("--family", choices=FAMILIES, action="append", help="only these families")
    ap.add_argument("--table", action="store_true", help="print every mesh's verdicts")
    a = ap.parse_args()
    E.need_titan(NAME)
    t0 = time.time()
    cs = [c for c in cases() if not a.family or c[1] in a.family]
    plan_dir = os.path.join(ROOT, "build", "matrix", "plans")
    mine = commplan_side(cs, plan_dir)
    titan, fresh = titan_side(cases() if a.family else cs, a.jobs)
    counts = {"planned": 0, "refused": 0, "ignored": 0, "disagreement": 0}
    per_fam = {f: dict(counts) for f in FAMILIES}
    bad, planned = [], []
    for cid, fam, d in cs:
        m, t = mine[cid], titan[cid]
        if m["ok"] and t["ok"]:
            v = "planned"
            planned.append((cid, fam, d))
        elif not m["ok"] and not t["ok"] and same_cause(t["why"], m["field"]):
            v = "refused"
        elif not m["ok"] and "needs routed experts" in m["msg"] and ep_ignored(fam, d, titan):
            v = "ignored"
        else:
            v = "disagreement"
            bad.append("%s: commplan %s; torchtitan %s%s" % (
                fmt(fam, d), "plans it" if m["ok"] else "refuses: " + m["msg"],
                "accepts it" if t["ok"] else "refuses: " + t["why"],
                " (both refuse, for different reasons)" if not m["ok"] and not t["ok"] else ""))
        counts[v] += 1
        per_fam[fam][v] += 1
        if a.table:
            print("%-13s %-44s %s" % (v, fmt(fam, d), "" if m["ok"] else m["msg"][:150]))
    for fam in FAMILIES:
        if a.family and fam not in a.family:
            continue
        c = per_fam[fam]
        print("%-12s planned %2d  refused as torchtitan refuses %2d  ep ignored by torchtitan, refused %2d  "
              "disagreements %d" % (fam, c["planned"], c["refused"], c["ignored"], c["disagreement"]))
    for b in bad:
        print("DISAGREEMENT " + b)
    sims, sim_bad = [], []
    if not a.no_simulate and planned:
        todo = [c for c, _, _ in planned] if (a.all or not QUICK) else sample(planned)
        os.makedirs(os.path.join(ROOT, "build", "matrix"), exist_ok=True)
        with open(os.path.join(ROOT, "build", "matrix", "simulate.log"), "w") as log:
            for cid in todo:
                ok, why = simulate(cid, plan_dir, log)
                sims.append(cid)
                if not ok:
                    sim_bad.append("%s: %s" % (cid, why))
                    print("SIMULATION FAILED " + sim_bad[-1])
        if QUICK and not a.all:
            print("quick tier: simulated %d planned meshes (each family's largest, every degree at 2); "
                  "make test-full simulates all %d" % (len(sims), len(planned)))
    print("matrix: %d meshes over %d families: %d planned (proofs passed; %d simulated on every rank in both "
          "arithmetics, %d failed), %d refused as torchtitan refuses, %d ep on a dense family (ignored by "
          "torchtitan, refused), %d disagreements; torchtitan run live on %d (%d memoized) in %.0f s" % (
              len(cs), len(set(f for _, f, _ in cs)), counts["planned"], len(sims), len(sim_bad),
              counts["refused"], counts["ignored"], counts["disagreement"], fresh, len(cs) - fresh
              if not a.family else 0, time.time() - t0))
    return 1 if bad or sim_bad else 0


if __name__ == "__main__":
    sys.exit(main())
