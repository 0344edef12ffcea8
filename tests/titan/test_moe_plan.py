#!/usr/bin/env python3
"""commplan's MoE families against torchtitan 0.3's own MoE models and wrapping (issue 23, item 1).

torchtitan 0.3's qwen3 MoE flavours, deepseek_v3 and gpt_oss -- registry flavours and small ones built
with torchtitan's own layer builders -- and, for the mixtral family (torchtitan has no Mixtral),
torchtitan's Qwen3 MoE decoder without its q/k norms: each built on the meta device and
parallelized by torchtitan's own parallelize_qwen3 / parallelize_deepseekv3 / parallelize_gptoss
(apply_fsdp_to_decoder)
at the plan's mesh over a fake process group of the plan's world size (ep = 1: FSDP and HSDP).
Read back from the fully_shard state, per unit: its modules, reshard_after_forward, the
MixedPrecisionPolicy dtypes and the gradient divide factor; per parameter: name, order, shape,
dtype, FSDP placement with its mesh dims (Shard(0), or Shard(1) for the routed experts where the
FSDP mesh outnumbers them) and rank 0's shard (sharded size, padded numel). All of it must equal
the plan.json commplan generates from the family's plan (written with the Python writer's
plan_text), with no declared difference. The MoE buffers (expert_bias_E, tokens_per_expert_E) are
not parameters on either side.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "MoE families vs torchtitan (tests/titan/test_moe_plan.py)"
OUT = os.path.join(E.ROOT, "build", "titan", "moe")
FSDP_SUM = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"}

QWEN3_DEBUG = dict(dim=256, n_layers=8, n_heads=16, n_kv_heads=8, head_dim=128, vocab_size=2048, moe_hidden_dim=768,
                   num_experts=64, top_k=8)  # torchtitan's qwen3 "debugmodel_moe"
DSV3_DEBUG = dict(dim=256, n_layers=6, n_dense_layers=1, n_heads=16, vocab_size=2048, q_lora_rank=0, kv_lora_rank=512,
                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, dense_hidden_dim=1024,
                  moe_hidden_dim=256, num_experts=8, num_shared_experts=2, top_k=3)  # deepseek_v3 "debugmodel"
DSV3_TINY = dict(dim=64, n_layers=4, n_dense_layers=2, n_heads=4, vocab_size=96, q_lora_rank=16, kv_lora_rank=32,
                 qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, dense_hidden_dim=96, moe_hidden_dim=32,
                 num_experts=4, num_shared_experts=2, top_k=2)
MIX_TINY = dict(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=96, moe_hidden_dim=48, num_experts=8, top_k=2)

# (case, commplan model table, torchtitan: (kind, registry flavour or None), world, parallel).
# Every case on its own mesh: a second ParallelDims of one mesh in one process gets the first
# one's DeviceMesh back (a process-wide cache), which fully_shard refuses.
CASES = [
    ("qwen3_debug_moe", dict(QWEN3_DEBUG, family="qwen3_moe"), ("qwen3", "debugmodel_moe"), 8, {"dp_shard": -1}),
    ("qwen3_debug_moe_wide", dict(QWEN3_DEBUG, family="qwen3_moe"), ("qwen3", "debugmodel_moe"), 128,
     {"dp_shard": -1}),  # 128 ranks > 64 experts: Shard(1)
    ("qwen3_tiny_unfused_hsdp", dict(MIX_TINY, family="qwen3_moe", head_dim=8, fuse_qkv=False), ("qwen3", None), 16,
     {"dp_replicate": 4, "dp_shard": -1}),  # replicas x shards 16 > 8 experts: Shard(1) over dp_shard 4
    ("qwen3_30b_a3b", {"family": "qwen3_moe", "size": "30b-a3b"}, ("qwen3", "30B-A3B"), 64, {"dp_shard": -1}),
    ("mixtral_tiny", dict(MIX_TINY, family="mixtral"), ("mixtral", None), 4, {"dp_shard": -1}),
    ("mixtral_tiny_hsdp", dict(MIX_TINY, family="mixtral"), ("mixtral", None), 6,
     {"dp_replicate": 2, "dp_shard": -1}),  # 6 <= 8 experts: Shard(0), uneven over 3
    ("mixtral_8x7b", {"family": "mixtral", "size": "8x7b"}, ("mixtral", None), 32, {"dp_shard": -1}),
    ("dsv3_debug", dict(DSV3_DEBUG, family="deepseek_v3"), ("deepseek_v3", "debugmodel"), 2, {"dp_shard": -1}),
    ("dsv3_debug_hsdp", dict(DSV3_DEBUG, family="deepseek_v3"), ("deepseek_v3", "debugmodel"), 24,
     {"dp_replicate": 3, "dp_shard": -1}),  # 24 > 8 experts: Shard(1) over dp_shard 8
    ("dsv3_tiny_qlora", dict(DSV3_TINY, family="deepseek_v3"), ("deepseek_v3", None), 3, {"dp_shard": -1}),
    ("dsv3_tiny_noshared", dict(DSV3_TINY, family="deepseek_v3", n_dense_layers=0, num_shared_experts=0,
                                dense_hidden_dim=None), ("deepseek_v3", None), 12,
     {"dp_replicate": 3, "dp_shard": -1}),  # no shared experts, no dense block; 12 > 4: Shard(1) over 4
    ("dsv3_16b", {"family": "deepseek_v3", "size": "16b"}, ("deepseek_v3", "16B"), 48, {"dp_shard": -1}),
    # torchtitan's gpt-oss (parallelize_gptoss): sinks, biases, the experts' biases placed with their weights
    ("gptoss_20b_wide", {"family": "gpt_oss", "size": "20b"}, ("gpt_oss", "20b"), 40,
     {"dp_shard": -1}),  # 40 > 32 experts: Shard(1) on mlp1/mlp2 weights and biases
    ("gptoss_120b", {"family": "gpt_oss", "size": "120b"}, ("gpt_oss", "120b"), 16, {"dp_shard": -1}),
    ("gptoss_debug_hsdp", {"family": "gpt_oss", "size": "debugmodel"}, ("gpt_oss", "debugmodel"), 20,
     {"dp_replicate": 5, "dp_shard": -1}),  # 20 > 8 experts: Shard(1) over dp_shard 4
    ("dsv3_671b", {"family": "deepseek_v3", "size": "671b"}, ("deepseek_v3", "671B"), 512, {"dp_shard": -1}),
]
# issue 41 (h41a): these cases are parallelized again under torchtitan's "always" and "never" policies
POLICY_CASES = ("qwen3_debug_moe", "mixtral_tiny", "dsv3_debug")
POLICIES = ("always", "never")
MIXTRAL = {"8x7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=32000, moe_hidden_dim=14336,
                        num_experts=8, top_k=2)}


# ---- commplan side ----

def commplan_plan(name, world, model, parallel, fsdp=None):
    from commplan import plan_text
    model = {k: v for k, v in model.items() if v is not None}
    text = plan_text(name, world, dict(model, seq_len=2048), parallel=dict(parallel), fsdp=dict(FSDP_SUM, **(fsdp or {})),
                     topology={"gpus_per_node": world if world <= 8 else next(g for g in (8, 6, 4) if world % g == 0)})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(path, E.ROOT), os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh)


def commplan_units(plan):
    """plan.json's units, the root first, as torchtitan's are read back."""
    dr = plan["parallel"]["dp_replicate"]
    units = []
    for u in plan["units"]:
        ps = []
        for q in u["params"]:
            pl = ([("dp_replicate", "Replicate()")] if dr > 1 else []) + [("dp_shard", "Shard(dim=%d)" % q["shard_dim"])]
            sharded = list(q["shape"])
            sharded[q["shard_dim"]] = min(q["chunk"], q["shape"][q["shard_dim"]])  # rank 0's rows
            ps.append({"name": q["name"], "shape": q["shape"], "dtype": q["dtype"], "placements": pl,
                       "sharded": sharded, "padded_numel": q["padded_numel"]})
        units.append({"name": u["name"], "raf": u["reshard_after_forward"], "ag": u["ag_dtype"],
                      "reduce": u["reduce_dtype"], "rs_op": u["rs_op"], "params": ps})
    return units


# ---- torchtitan side ----

def titan_config(kind, flavor, model):
    """torchtitan's model config: the registry flavour, or the model table's numbers through
    torchtitan's own layer builders (mixtral: Qwen3's MoE builder without q/k norms)."""
    import torchtitan.models.deepseek_v3 as DS
    import torchtitan.models.qwen3 as Q
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
    if kind == "deepseek_v3":
        if flavor:  # (issue 41: num_mtp_layers, torchtitan's model_registry argument)
            return DS.model_registry(flavor, num_mtp_layers=model.get("num_mtp_layers") or 0).model
        n = model
        layers = DS._build_dsv3_layers(
            n_layers=n["n_layers"], n_dense_layers=n["n_dense_layers"], dim=n["dim"], n_heads=n["n_heads"],
            q_lora_rank=n["q_lora_rank"], kv_lora_rank=n["kv_lora_rank"], qk_nope_head_dim=n["qk_nope_head_dim"],
            qk_rope_head_dim=n["qk_rope_head_dim"], v_head_dim=n["v_head_dim"], mscale=0.70,
            dense_hidden_dim=n.get("dense_hidden_dim") or 1, moe_hidden_dim=n["moe_hidden_dim"],
            num_experts=n["num_experts"], num_shared_experts=max(n["num_shared_experts"], 1),
            router_top_k=n["top_k"], router_score_func="softmax", attn_backend="flex", moe_comm_backend="standard",
            non_blocking_capacity_factor=None,
            rope=ComplexRoPE.Config(dim=n["qk_rope_head_dim"], max_seq_len=4096 * 4, theta=10000.0, scaling="yarn",
                                    rope_factor=40.0, beta_fast=32.0, beta_slow=1.0, original_seq_len=4096))
        if n["num_shared_experts"] == 0:  # torchtitan's MoE without shared experts
            for lc in layers:
                if lc.moe is not None:
                    lc.moe.shared_experts = None
        d, v = n["dim"], n["vocab_size"]
        return DS.DeepSeekV3Model.Config(
            vocab_size=v, dim=d,
            tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d, param_init=DS._EMBEDDING_INIT),
            norm=RMSNorm.Config(normalized_shape=d, param_init=DS._NORM_INIT),
            lm_head=Linear.Config(in_features=d, out_features=v, param_init=DS._output_linear_init(d)),
            layers=layers, mtp_layers=DS._build_mtp_layers(layers[-1], dim=d,
                                                           num_mtp_layers=n.get("num_mtp_layers") or 0))
    if kind == "gpt_oss":
        import torchtitan.models.gpt_oss as G
        return G.model_registry(flavor).model
    if flavor:
        return Q.model_registry(flavor).model
    n = dict(MIXTRAL[model["size"]]) if "size" in model else model
    hd = n.get("head_dim") or n["dim"] // n["n_heads"]
    d, v = n["dim"], n["vocab_size"]
    layers = Q._build_qwen3_moe_layers(
        fuse_qkv=n.get("fuse_qkv", True), n_layers=n["n_layers"], dim=d, n_heads=n["n_heads"],
        n_kv_heads=n["n_kv_heads"], head_dim=hd, moe_hidden_dim=n["moe_hidden_dim"], num_experts=n["num_experts"],
        top_k=n["top_k"], attn_backend="flex", moe_comm_backend="standard",
        rope=CosSinRoPE.Config(dim=hd, max_seq_len=4096, theta=1000000.0))
    if kind == "mixtral":
        for lc in layers:
            lc.attention.qk_norm = None
    return Q.Qwen3Model.Config(
        vocab_size=v, dim=d, norm=Q._qwen3_norm(d),
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d, param_init=Q._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=d, out_features=v, param_init=Q._LINEAR_INIT), layers=layers)


def parallelize(kind, cfg, parallelism, training, pd):
    import torch
    from torchtitan.config import CompileConfig
    from torchtitan.trainer import Trainer
    if kind == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import model_registry, parallelize_deepseekv3 as fn
        spec = model_registry("debugmodel")
    elif kind == "gpt_oss":
        from torchtitan.models.gpt_oss import model_registry, parallelize_gptoss as fn
        spec = model_registry("debugmodel")
    else:
        from torchtitan.models.qwen3 import model_registry, parallelize_qwen3 as fn
        spec = model_registry("debugmodel_moe")
    spec.model = cfg
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
    with torch.device("meta"):
        model = cfg.build()
    return fn(model, parallel_dims=pd, training=training, parallelism=parallelism, compile_config=CompileConfig(),
              ac_config=None, dump_folder=os.path.join(OUT, "dump"))


def titan_units(model):
    import test_llama_plan as L
    units = L.titan_units(model)
    for u in units:
        u["name"] = "root" if u["modules"] == [""] else "_".join(u["modules"])
    return units


# ---- comparison ----

def compare(mine, theirs, stats):
    problems = []
    a, b = [u["name"] for u in mine], [u["name"] for u in theirs]
    if a != b:
        i = next(i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i])
        return ["units differ at unit %d: commplan %s, torchtitan %s" % (i, a[i:i + 3], b[i:i + 3])]
    for u, t in zip(mine, theirs):
        stats["units"] += 1
        if not u["params"]:
            if t["params"]:
                problems.append("%s: commplan's owns nothing, torchtitan's %d parameters" % (u["name"], len(t["params"])))
            continue
        for k in ("raf", "ag", "reduce", "rs_op"):
            if u[k] != t[k]:
                problems.append("%s: %s commplan %s, torchtitan %s" % (u["name"], k, u[k], t[k]))
        if [q["name"] for q in u["params"]] != [q["name"] for q in t["params"]]:
            problems.append("%s: parameters commplan %s, torchtitan %s" % (
                u["name"], [q["name"] for q in u["params"]], [q["name"] for q in t["params"]]))
            continue
        for q, r in zip(u["params"], t["params"]):
            stats["params"] += 1
            if q["placements"][-1][1] == "Shard(dim=1)":
                stats["shard1"] += 1
            bad = ["%s commplan %s, torchtitan %s" % (k, q[k], r[k])
                   for k in ("shape", "dtype", "placements", "sharded", "padded_numel") if q[k] != r[k]]
            if bad:
                problems.append("%s: %s" % (q["name"], "; ".join(bad)))
    return problems


def run_case(case, stats):
    from torchtitan.distributed.parallel_dims import ParallelDims
    import test_llama_plan as L
    name, model, (kind, flavor), world, parallel = case
    plan = commplan_plan(name, world, model, parallel)
    plan["seq_len"] = 2048
    parallelism, training = L.job(plan, {"parallel": {}})
    with E.fake_world(world), (E.member_groups_only() if world > 64 else L._null()):
        pd = ParallelDims.from_config(parallelism, world)
        pd.build_mesh()
        m = parallelize(kind, titan_config(kind, flavor, model), parallelism, training, pd)
        theirs = titan_units(m)
        del m
        out = ["%s: %s" % (name, p) for p in compare(commplan_units(plan), theirs, stats)]
        # issue 41 (h41a): torchtitan's fsdp_reshard_after_forward "always" / "never" (distributed/fsdp.py:183-204,
        # [norm, lm_head] resharded under "always" alone) vs fsdp.reshard_after_forward_policy, on the same mesh
        for pol in (POLICIES if name in POLICY_CASES else ()):
            mine = commplan_plan(name + "_" + pol, world, model, parallel, {"reshard_after_forward_policy": pol})
            m = parallelize(kind, titan_config(kind, flavor, model),
                            dataclasses.replace(parallelism, fsdp_reshard_after_forward=pol), training, pd)
            theirs = titan_units(m)
            del m
            stats["policies"] = stats.get("policies", 0) + 1
            out += ["%s (%s): %s" % (name, pol, p) for p in compare(commplan_units(mine), theirs, stats)]
    return out


def writer_gpt_oss():
    """commplan write --titan gpt_oss:FLAVOR's writer (commplan.titan.plan_from_titan) on torchtitan's own
    registry: the family's numbers read from the built model equal the registry's, and a model whose windows
    are not torchtitan's pattern is refused in one line. Problems, as compare's."""
    import dataclasses
    from commplan import PlanError
    from commplan.titan import gpt_oss_numbers, plan_from_titan
    from torchtitan.models.gpt_oss import model_registry
    want = {"debugmodel": dict(dim=256, n_layers=4, vocab_size=2048, num_experts=8),
            "20b": dict(dim=2880, n_layers=24, vocab_size=201088, num_experts=32)}
    problems = []
    for flavor, w in want.items():
        got = gpt_oss_numbers(model_registry(flavor))
        w = dict(w, family="gpt_oss", n_heads=64, n_kv_heads=8, head_dim=64, moe_hidden_dim=2880, top_k=4,
                 fuse_qkv=True, sliding_window=128, attn_backend="varlen")  # (model_registry's default)
        if got != w:
            problems.append("writer %s: %s, torchtitan's registry %s" % (flavor, got, w))
    text = plan_from_titan(model_registry("debugmodel"), "w", 4, parallel={"dp_shard": -1, "ep": 2}, seq_len=256)
    if 'family = "gpt_oss"' not in text or "sliding_window = 128" not in text:
        problems.append("writer: the plan text lacks the family or its window: " + text)
    # its attention backend written as built: flex (gpt_oss_debugmodel_flex's build), so the plan takes cp;
    # the registry's varlen (its default), which cp refuses as torchtitan does
    flex = gpt_oss_numbers(model_registry("debugmodel", attn_backend="flex"))
    if flex.get("attn_backend") != "flex" or gpt_oss_numbers(model_registry("debugmodel")).get("attn_backend") != "varlen":
        problems.append("writer: attn_backend %r for flex, %r for varlen" % (
            flex.get("attn_backend"), gpt_oss_numbers(model_registry("debugmodel")).get("attn_backend")))
    import tempfile
    for backend, cp_ok in (("flex", True), ("varlen", False)):
        text = plan_from_titan(model_registry("debugmodel", attn_backend=backend), "w", 8,
                               parallel={"dp_shard": 2, "tp": 2, "cp": 2}, seq_len=512)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "w.lua")
            with open(path, "w") as fh:
                fh.write(text)
            r = subprocess.run([E.LUA, "gen/commplan.lua", path, os.path.join(tmp, "out")], cwd=E.ROOT,
                               capture_output=True, text=True)
        if (r.returncode == 0) != cp_ok or (not cp_ok and "full_dtensor.py:44-52" not in r.stderr + r.stdout):
            problems.append("writer: %s at dp_shard 2 x tp 2 x cp 2: exit %d %s" % (
                backend, r.returncode, (r.stderr + r.stdout).strip()[-300:]))
    ms = model_registry("debugmodel")
    ms.model.layers[1].attention = dataclasses.replace(ms.model.layers[1].attention, sliding_window_size=64)
    try:
        gpt_oss_numbers(ms)
        problems.append("writer: a window on block 1 was not refused")
    except PlanError as e:
        if "block 1" not in str(e) or "\n" in str(e):
            problems.append("writer: refusal %r" % str(e))
    return problems


def main():
    E.need_titan(NAME)
    t0 = time.time()
    meshes = [(w, tuple(sorted(p.items()))) for _, _, _, w, p in CASES]
    assert len(meshes) == len(set(meshes)), "two cases on one mesh"
    only = set(sys.argv[1:])
    stats = dict.fromkeys(("cases", "units", "params", "shard1"), 0)
    problems, lines = [], []
    for case in CASES:
        if only and case[0] not in only:
            continue
        tc = time.time()
        problems += run_case(case, stats)
        stats["cases"] += 1
        lines.append("%s (%d ranks%s) %.1f s" % (case[0], case[3], "".join(
            ", %s=%d" % (k, v) for k, v in case[4].items() if v not in (1, -1)), time.time() - tc))
    if not only or any(n.startswith("gptoss") for n in only):
        problems += writer_gpt_oss()
    for p in problems[:40]:
        print("DISAGREE", p)
    if len(problems) > 40:
        print("... and %d more" % (len(problems) - 40))
    tv, ttv = E.versions()
    print("moe_plan: cases: " + "; ".join(lines))
    print("moe_plan: %d cases (and %d of them under torchtitan's \"always\" / \"never\" reshard policies), %d units, "
          "%d parameters (%d routed-expert weights on Shard(1)) compared with torchtitan %s (torch %s) in %.1f s: "
          "%d disagreements"
          % (stats["cases"], stats.get("policies", 0), stats["units"], stats["params"], stats["shard1"], ttv, tv,
             time.time() - t0, len(problems)))
    return 1 if problems or not stats["cases"] else 0


if __name__ == "__main__":
    sys.exit(main())
