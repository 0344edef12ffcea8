#!/usr/bin/env python3
"""commplan's llama plans against torchtitan's own Llama 3 wrapping and TP plan (issue 17, item 2).

torchtitan 0.3's llama3 model -- its registry's 8B, 70B and 405B, and tiny ones built with
torchtitan's own layer builder -- on the meta device, parallelized by torchtitan's own
parallelize_llama (models/llama3/parallelize.py: model.parallelize for TP, then
apply_fsdp_to_decoder) at the plan's mesh over a fake process group of the plan's world
size. Read back from the fully_shard state (FSDPState._fsdp_param_groups, FSDPParam), per
unit: its modules, reshard_after_forward (post_forward_mesh_info), the MixedPrecisionPolicy
dtypes and the gradient divide factor; per parameter: name, order, global and TP-local shape,
FSDP shard (sharded_size, padded_sharded_param_size), dtype, and the DTensor placements with
their mesh dims. All of it must equal the commplan plan's plan.json (plans/llama8b, llama70b,
llama405b, llama_tiny, llama_tiny_tp as shipped, and variants at other TP and HSDP degrees
written to build/titan/plans/), the placements derived from plan.json's shard_dim, tp_dim and
mesh as gen/parallel/tp.lua's tp.placements states them; every other TP rank's local shapes
(plan.json tp_classes) against torch's own Shard.local_shard_size_and_offset.

Four differences are declared, printed with their counts, and everything else must be equal:
  names      torchtitan 0.3 keeps q/k/v under attention.qkv_linear and calls the output
             projection lm_head; commplan's llama family has torchtitan 0.2's attention.wq/wk/wv
             and output (compared under that renaming);
  fused qkv  torchtitan 0.3's registry flavors fuse q, k, v into one attention.qkv_linear.wqkv
             (KV-group-interleaved rows); the llama family has three parameters, so its
             all-gather slots differ (compared as one parameter of their summed rows; the
             unfused build, fuse_qkv=False, is compared without it);
  reduce     the shipped llama plans average gradients (fsdp.reduce_op "avg"); torchtitan 0.3's
             parallelize sets the gradient divide factor to 1 (a sum; the loss divides by the
             global token count). Variants here use reduce_op = "sum" and must match;
  uneven TP  torchtitan's side, not commplan's: FSDP2's spmd_types path gives an unevenly
             TP-split parameter the DTensor global shape local x tp (llama_tiny_tp's 251-row
             vocabulary: 252 on TP rank 0, 250 on TP rank 1); the local shapes (126 / 125) are
             compared as they are. (On the meta device spmd_types' fake kernel gives every TP
             rank ceil(n / tp) rows, so the tiny models are built on CPU.)

The Python plan writer (python/commplan/titan.py) is checked on the same builds: from
torchtitan's unfused config with family="llama" it writes plans whose generated tables equal
the shipped ones (the fingerprint and every file but the line naming the source); from the
fused registry model (family "auto") a generic plan whose plan.json equals torchtitan with no
declared difference at all.
"""

import copy
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "Llama wrapping and TP plan (tests/titan/test_llama_plan.py)"
OUT = os.path.join(E.ROOT, "build", "titan")
FSDP_SUM = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"}

# (plan name, source: None = plans/<name>.lua as shipped, else (world, size or numbers, parallel) for
#  build/titan/plans/<name>.lua; compare the unfused build (fuse_qkv=False) too)
CASES = [
    ("llama8b", None, True),
    ("llama70b", None, False),
    ("llama405b_hsdp", None, False),
    ("llama_tiny", None, True),
    ("llama_tiny_tp", None, True),
    ("llama8b_hsdp8_tp2", (64, "8b", {"dp_replicate": 8, "dp_shard": -1, "tp": 2}), True),
    ("llama8b_tp8", (64, "8b", {"dp_shard": -1, "tp": 8}), False),
    ("llama70b_hsdp4_tp4", (1024, "70b", {"dp_replicate": 4, "dp_shard": -1, "tp": 4}), False),
    ("titan_debug_tp2", (8, "debugmodel", {"dp_shard": -1, "tp": 2}), True),
]
# make test (COMMPLAN_TEST_TIER=quick) leaves out llama405b_hsdp (llama70b's HSDP x TP wrapping at
# 16,384 ranks and 126 layers) and the variants (more TP / HSDP degrees of the meshes above;
# titan_debug_tp2 stays), and says so in one "quick tier:" line; make test-full and a run by hand
# compare every case.
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
FULL_ONLY = ("llama405b_hsdp", "llama8b_hsdp8_tp2", "llama8b_tp8", "llama70b_hsdp4_tp4")
FLAVOR = {"8b": "8B", "70b": "70B", "405b": "405B"}
DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# ---- commplan side ----

def generate(plan_path, name):
    outdir = os.path.join(OUT, "gen", name)
    E.lua(["gen/commplan.lua", plan_path, os.path.relpath(outdir, E.ROOT)])
    with open(os.path.join(outdir, "plan.json")) as fh:
        return json.load(fh), outdir


def variant_plan(name, world, size, parallel):
    from commplan import plan_text
    if size == "debugmodel":  # torchtitan's debugmodel numbers (models/llama3/__init__.py)
        model = {"family": "llama", "dim": 256, "n_layers": 6, "n_heads": 16, "n_kv_heads": 16,
                 "vocab_size": 2048, "multiple_of": 256, "seq_len": 2048}
    else:
        model = {"family": "llama", "size": size, "seq_len": 8192}
    text = plan_text(name, world, model, parallel=parallel, fsdp=dict(FSDP_SUM), topology={"gpus_per_node": 8})
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    with open(path, "w") as fh:
        fh.write(text)
    return os.path.relpath(path, E.ROOT)


def placements(q, dr, tp):
    """A parameter's DTensor placements as (mesh dim, placement) from plan.json, as gen/parallel/tp.lua's
    tp.placements states them: Replicate over dp_replicate (HSDP), Shard(shard_dim) over
    dp_shard -- _StridedShard(dim, sf=tp) where TP splits the same dim first -- and
    Shard(tp_dim) or Replicate over tp."""
    out = []
    if dr > 1:
        out.append(("dp_replicate", "Replicate()"))
    sd, td = q["shard_dim"], q.get("tp_dim")
    if tp > 1 and td == sd:
        out.append(("dp_shard", "_StridedShard(dim=%d, sf=%d)" % (sd, tp)))
    else:
        out.append(("dp_shard", "Shard(dim=%d)" % sd))
    if tp > 1:
        out.append(("tp", "Shard(dim=%d)" % td if td is not None else "Replicate()"))
    return out


def commplan_units(plan, t=0):
    """plan.json -> the units as TP rank t holds them (its TP class), in forward order, the root
    first: [{name, raf, ag, reduce, rs_op, params: [{name, shape (full), local (TP rank t's),
    tp_local: {every TP rank: its local shape}, dtype, chunk, padded_numel, placements}]}]."""
    par = plan["parallel"]
    dr, tp = par["dp_replicate"], par["tp"]
    other = {}  # (param name, tp rank) -> its entry in a TP class beyond class 0
    for cls in plan.get("tp_classes", []):
        for u in cls["units"]:
            for q in u["params"]:
                for r in cls["tp_ranks"]:
                    other[(q["name"], r)] = q
    units = []
    for u in plan["units"]:
        ps = []
        for q in u["params"]:
            mine = other.get((q["name"], t), q)
            ps.append({"name": q["name"], "shape": q.get("full_shape", q["shape"]), "local": mine["shape"],
                       "tp_local": {r: other.get((q["name"], r), q)["shape"] for r in range(tp)},
                       "dtype": q["dtype"], "chunk": mine["chunk"], "padded_numel": mine["padded_numel"],
                       "shard_dim": q["shard_dim"], "placements": placements(q, dr, tp)})
        units.append({"name": u["name"], "raf": u["reshard_after_forward"], "ag": u["ag_dtype"],
                      "reduce": u["reduce_dtype"], "rs_op": u["rs_op"], "params": ps})
    return units


# ---- torchtitan side ----

def titan_config(size, numbers, fuse_qkv):
    """torchtitan's Llama3Model.Config: the registry's flavor (fused as it ships), or the same
    numbers through torchtitan's own layer builder with fuse_qkv=False; tiny ones from numbers."""
    import torchtitan.models.llama3 as L
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.llama3.model import Llama3Model
    if size in FLAVOR or size == "debugmodel":
        cfg = L.model_registry(FLAVOR.get(size, size)).model
        if fuse_qkv:
            return cfg
        att = cfg.layers[0].attention
        cfg = copy.deepcopy(cfg)
        cfg.layers = L._build_llama3_layers(
            fuse_qkv=False, n_layers=len(cfg.layers), dim=cfg.dim, n_heads=att.n_heads, n_kv_heads=att.n_kv_heads,
            hidden_dim=cfg.layers[0].feed_forward.w1.out_features, rope=att.rope, attn_backend="flex")
        return cfg
    n = numbers
    dim, hd = n["dim"], n["dim"] // n["n_heads"]
    return Llama3Model.Config(
        dim=dim, vocab_size=n["vocab_size"],
        tok_embeddings=Embedding.Config(num_embeddings=n["vocab_size"], embedding_dim=dim, param_init=L._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=L._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=n["vocab_size"], param_init=L._output_linear_init(dim)),
        layers=L._build_llama3_layers(
            fuse_qkv=fuse_qkv, n_layers=n["n_layers"], dim=dim, n_heads=n["n_heads"], n_kv_heads=n["n_kv_heads"],
            hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=n.get("multiple_of", 256),
                                              ffn_dim_multiplier=n.get("ffn_dim_multiplier")),
            rope=ComplexRoPE.Config(dim=hd, max_seq_len=131072, theta=500000, scaling="llama"),
            attn_backend="flex"))


def job(plan, src):
    from torchtitan.config import ParallelismConfig, TrainingConfig
    par = plan["parallel"]
    sp = src["parallel"].get("sequence_parallel")
    parallelism = ParallelismConfig(data_parallel_replicate_degree=par["dp_replicate"],
                                    data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=par["tp"],
                                    enable_sequence_parallel=True if sp is None else sp)
    f = plan["fsdp"]
    training = TrainingConfig(local_batch_size=1, seq_len=plan["seq_len"], dtype="float32",
                              mixed_precision_param=DTYPE[f.get("param_dtype") or "fp32"],
                              mixed_precision_reduce=DTYPE[f.get("reduce_dtype") or "fp32"])
    return parallelism, training


def parallelize(cfg, parallelism, training, pd, device="meta"):
    """torchtitan's own path: update_from_config (sharding declarations), build on the meta
    device (the tiny models on CPU, real tensors), parallelize_llama at the plan's mesh."""
    import torch
    from torchtitan.config import CompileConfig
    from torchtitan.models.llama3 import model_registry, parallelize_llama
    from torchtitan.trainer import Trainer
    spec = model_registry("debugmodel")
    spec.model = cfg
    cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
    with torch.device(device):
        model = cfg.build()
    return parallelize_llama(model, parallel_dims=pd, training=training, parallelism=parallelism,
                             compile_config=CompileConfig(), ac_config=None, dump_folder=os.path.join(OUT, "dump"))


def titan_units(model):
    """The fully_shard units of a parallelized model in forward order (module order), the root
    first: [{modules, raf, ag, reduce, rs_op, params: [...]}]."""
    from torch.distributed.fsdp import FSDPModule
    pnames = {id(p): n for n, p in model.named_parameters()}
    mnames = {id(m): n for n, m in model.named_modules()}
    dt = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    out, seen = [], set()
    for _, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        st = m._get_fsdp_state()
        if id(st) in seen:
            continue
        seen.add(id(st))
        groups = st._fsdp_param_groups
        assert len(groups) <= 1, "more than one FSDP param group in a dense unit"
        u = {"modules": [mnames[id(x)] for x in st._modules], "params": [], "raf": None, "ag": None,
             "reduce": None, "rs_op": None}
        if groups:
            g = groups[0]
            mp = g.fsdp_params[0].mp_policy
            f = g.gradient_divide_factor
            u.update(raf=g.post_forward_mesh_info is not None, ag=dt[str(mp.param_dtype)], reduce=dt[str(mp.reduce_dtype)],
                     rs_op="avg" if f is None else "sum" if f == 1.0 else "premul(%g)" % (1 / f))
            for fp in g.fsdp_params:
                sp = fp.sharded_param
                mesh = sp.device_mesh
                u["params"].append({
                    "name": pnames[id(sp)], "shape": list(sp.shape), "local": list(fp._orig_size),
                    "dtype": dt[str(sp.dtype)], "sharded": list(fp.sharded_size),
                    "padded_numel": int(fp.padded_sharded_param_size.numel()),
                    "placements": [(n, repr(p)) for n, p in zip(mesh.mesh_dim_names, sp.placements) if mesh.size(
                        mesh.mesh_dim_names.index(n)) > 1 or n == "dp_shard"]})
        out.append(u)
    return out


# ---- comparison ----

RENAME = (("attention.wq.", "attention.qkv_linear.wq."), ("attention.wk.", "attention.qkv_linear.wk."),
          ("attention.wv.", "attention.qkv_linear.wv."))


def expected(units, fused, plan_tp, declared):
    """commplan's units as torchtitan would hold them under the declared differences: names
    (qkv_linear., lm_head) and, fused, wq/wk/wv as one wqkv of their summed rows."""
    out = []
    for u in units:
        ps = []
        for q in u["params"]:
            q = dict(q)
            n = q["name"]
            for old, new in RENAME:
                if old in n:
                    n = n.replace(old, new)
            if n == "output.weight":
                n = "lm_head.weight"
            if n != q["name"]:
                declared["names"] += 1
            q["name"] = n
            ps.append(q)
        if fused:
            merged, i = [], 0
            while i < len(ps):
                if ps[i]["name"].endswith("qkv_linear.wq.weight") and i + 2 < len(ps):
                    q, k, v = ps[i:i + 3]
                    f = dict(q, name=q["name"].replace(".wq.", ".wqkv."))
                    f["shape"] = [q["shape"][0] + k["shape"][0] + v["shape"][0]] + q["shape"][1:]
                    f["local"] = [q["local"][0] + k["local"][0] + v["local"][0]] + q["local"][1:]
                    f["tp_local"] = {t: [q["tp_local"][t][0] + k["tp_local"][t][0] + v["tp_local"][t][0]]
                                     + q["local"][1:] for t in q["tp_local"]}
                    same = q["placements"] == k["placements"] == v["placements"]
                    f["placements"] = q["placements"] if same else [("?", "wq/wk/wv placements differ")]
                    f["chunk"] = f["padded_numel"] = None  # the fused tensor's FSDP shard is its own
                    merged.append(f)
                    declared["fused"] += 1
                    i += 3
                else:
                    merged.append(ps[i])
                    i += 1
            ps = merged
        out.append(dict(u, params=ps))
    return out


def unit_name(modules, rename):
    name = "root" if modules == [""] else "_".join(modules)
    return name.replace("lm_head", "output") if rename else name


def compare(mine, theirs, tp, stats, declared, shipped_avg=False, rename=True):
    """commplan's expected units against torchtitan's; a list of problems."""
    from torch.distributed.tensor import Shard
    problems = []
    names = [unit_name(t["modules"], rename) for t in theirs]
    if [u["name"] for u in mine] != names:
        bad = next(i for i, (a, b) in enumerate(zip([u["name"] for u in mine] + [None] * len(names), names + [None] * len(mine))) if a != b)
        return ["units differ at unit %d: commplan %s, torchtitan %s" % (bad, [u["name"] for u in mine][bad:bad + 3],
                                                                          names[bad:bad + 3])]
    for u, t in zip(mine, theirs):
        stats["units"] += 1
        if not u["params"]:
            if t["params"]:
                problems.append("%s: commplan's root owns nothing, torchtitan's %d parameters" % (u["name"], len(t["params"])))
            continue
        for k in ("raf", "ag", "reduce"):
            if u[k] != t[k]:
                problems.append("%s: %s commplan %s, torchtitan %s" % (u["name"], k, u[k], t[k]))
        if u["rs_op"] != t["rs_op"]:
            if shipped_avg and u["rs_op"] == "avg" and t["rs_op"] == "sum":
                declared["reduce"] += 1
            else:
                problems.append("%s: reduce commplan %s, torchtitan %s" % (u["name"], u["rs_op"], t["rs_op"]))
        if [q["name"] for q in u["params"]] != [q["name"] for q in t["params"]]:
            problems.append("%s: parameters commplan %s, torchtitan %s" % (
                u["name"], [q["name"] for q in u["params"]], [q["name"] for q in t["params"]]))
            continue
        for q, r in zip(u["params"], t["params"]):
            stats["params"] += 1
            stats["placements"] += len(r["placements"])
            bad = []
            td = next((int(p[len("Shard(dim="):-1]) for n, p in r["placements"] if n == "tp" and p.startswith("Shard")),
                      None)
            if q["shape"] != r["shape"]:
                # spmd_types + FSDP2 give an unevenly TP-split parameter the global shape
                # local x tp (252 rows for a 251-row vocabulary split 126 / 125).
                if td is not None and q["shape"][td] % tp and r["shape"][td] == r["local"][td] * tp and \
                        q["shape"][:td] + q["shape"][td + 1:] == r["shape"][:td] + r["shape"][td + 1:]:
                    declared["uneven"] += 1
                else:
                    bad.append("shape commplan %s, torchtitan %s" % (q["shape"], r["shape"]))
            for k in ("local", "dtype", "placements"):
                if q[k] != r[k]:
                    bad.append("%s commplan %s, torchtitan %s" % (k, q[k], r[k]))
            if q["chunk"] is not None:
                sd = q.get("shard_dim", 0)  # (Shard(1): the MoE families' routed experts on a wide mesh)
                rows = q["local"][sd]
                if r["padded_numel"] != q["padded_numel"] or r["sharded"][sd] != min(q["chunk"], rows):
                    bad.append("FSDP shard commplan chunk %d padded %d, torchtitan rank 0 %s padded %d" % (
                        q["chunk"], q["padded_numel"], r["sharded"], r["padded_numel"]))
            if td is not None:
                for t_rank, shape in q["tp_local"].items():
                    size, _ = Shard.local_shard_size_and_offset(q["shape"][td], tp, t_rank)
                    want = q["shape"][:td] + [int(size)] + q["shape"][td + 1:]
                    stats["tp_local"] += 1
                    if shape != want:
                        bad.append("TP rank %d local shape commplan %s, torch.chunk's %s" % (t_rank, shape, want))
            if bad:
                problems.append("%s: %s" % (q["name"], "; ".join(bad)))
    return problems


def tables_equal(a, b):
    """Two generated plan directories hold the same tables: every file equal but the lines naming
    the plan file they came from (the fingerprint is in those lines and must match)."""
    diffs = []
    for f in sorted(set(os.listdir(a)) | set(os.listdir(b))):
        pa, pb = os.path.join(a, f), os.path.join(b, f)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            diffs.append(f + " (missing)")
            continue
        with open(pa) as fa, open(pb) as fb:
            la, lb = fa.read().splitlines(), fb.read().splitlines()
        if [_unsourced(x) for x in la] != [_unsourced(x) for x in lb]:
            diffs.append(f)
    return diffs


def _unsourced(line):
    """A generated line without the plan file's path (the generated-by comment, plan.json's source)."""
    if "generated by commplan from " in line:
        # the path runs to a ';' (most headers) or to the end of its token (timeline.svg's title)
        return re.sub(r"generated by commplan from [^;\s<\"]+", "generated by commplan from", line)
    if line.lstrip().startswith('"source":'):
        return '"source"'
    return line


def setup(name, src):
    """A case's commplan side (generated now) and torchtitan job settings."""
    plan_path = "plans/%s.lua" % name if src is None else variant_plan(name, *src)
    plan, _ = generate(plan_path, name)
    table = plan_file(plan_path)
    mc = table["model"]
    plan["seq_len"] = mc.get("seq_len") or 2048
    parallelism, training = job(plan, table)
    return {
        "name": name, "src": src, "plan_path": plan_path, "plan": plan, "table": table,
        "world": plan["world_size"], "par": plan["parallel"],
        "size": mc.get("size") or (src[1] if src and src[1] == "debugmodel" else None),
        "numbers": {k: mc[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of",
                                       "ffn_dim_multiplier") if k in mc},
        "parallelism": parallelism, "training": training,
        # Tiny models on CPU (real tensors: spmd_types' meta kernel gives every TP rank
        # ceil(n / tp) rows, its CPU one torch.chunk's), the rest on the meta device.
        "device": "cpu" if plan["world_size"] <= 8 else "meta",
    }


def check_rank(S, t, builds, stats, declared, problems, writer=None):
    """torchtitan built as global rank t (TP coordinate t, every other coordinate 0), fused and
    unfused, against commplan's units as TP rank t holds them; at rank 0 also the writer's
    generic plan from the fused model."""
    from torchtitan.distributed.parallel_dims import ParallelDims
    from commplan.titan import plan_from_titan
    name, plan, par, world = S["name"], S["plan"], S["par"], S["world"]
    mine = commplan_units(plan, t)
    shipped_avg = S["src"] is None and mine[1]["rs_op"] == "avg"
    with E.fake_world(world, rank=t), (E.member_groups_only() if world > 64 else _null()):
        pd = ParallelDims.from_config(S["parallelism"], world)
        pd.build_mesh()
        for fused in builds:
            model = parallelize(titan_config(S["size"], S["numbers"], fused), S["parallelism"], S["training"], pd,
                                S["device"])
            theirs = titan_units(model)
            ps = compare(expected(mine, fused, par["tp"], declared), theirs, par["tp"], stats, declared, shipped_avg)
            what = ("fused" if fused else "unfused") + (", as TP rank %d" % t if t else "")
            problems += ["%s (%s): %s" % (name, what, p) for p in ps]
            if t:
                stats["tp_ranks"] += 1
            # The writer, from the fused registry model as torchtitan parallelized it: a generic
            # plan equal to torchtitan with nothing declared.
            if writer is not None and fused and name in WRITER_GENERIC:
                wname = "titan_" + name if not name.startswith("titan_") else name + "_w"
                text = plan_from_titan(titan_config(S["size"], S["numbers"], True), wname, world, parallel=dict(par),
                                       seq_len=plan["seq_len"], topology={"gpus_per_node": 8})
                wpath = os.path.join(OUT, "plans", wname + ".lua")
                os.makedirs(os.path.dirname(wpath), exist_ok=True)
                with open(wpath, "w") as fh:
                    fh.write(text)
                wplan, _ = generate(os.path.relpath(wpath, E.ROOT), wname)
                none = {"names": 0, "fused": 0, "reduce": 0, "uneven": 0}
                ps = compare(expected(commplan_units(wplan), False, par["tp"], none), theirs, par["tp"], stats, none,
                             rename=False)
                if any(v for k, v in none.items() if k != "uneven"):
                    ps.append("the written plan needed declared differences %s" % none)
                problems += ["%s (writer, generic): %s" % (name, p) for p in ps]
                writer.append("%s generic" % name)
            del model


WRITER_GENERIC = ("llama8b", "llama70b", "llama_tiny_tp", "titan_debug_tp2")
WRITER_LLAMA = ("llama8b", "llama70b", "llama_tiny", "llama_tiny_tp")  # shipped plans (405B: the same code, 5 s more)


def main():
    E.need_titan(NAME)
    from commplan.titan import plan_from_titan
    if sys.argv[1:2] == ["--as-tp-rank"]:
        # One build as another TP rank, in a process of its own: a second ParallelDims of the same
        # mesh in one process gets the first one's DeviceMesh back for its DTensors (a process-wide
        # cache in torch/spmd_types), and fully_shard refuses the mismatch.
        name, t = sys.argv[2], int(sys.argv[3])
        case = next(c for c in CASES if c[0] == name)
        stats = dict.fromkeys(("units", "params", "placements", "tp_local", "tp_ranks"), 0)
        declared = dict.fromkeys(("names", "fused", "reduce", "uneven"), 0)
        problems = []
        check_rank(setup(name, case[1]), t, [True] + ([False] if case[2] else []), stats, declared, problems)
        print("RESULT " + json.dumps({"stats": stats, "declared": declared, "problems": problems}))
        return 0
    t0 = time.time()
    stats = dict.fromkeys(("units", "params", "placements", "tp_local", "tp_ranks"), 0)
    declared = dict.fromkeys(("names", "fused", "reduce", "uneven"), 0)
    problems, lines, writer = [], [], []
    meshes = [(w, tuple(sorted(p.items()))) for _, src, _ in CASES if src for w, _, p in [src]]
    assert len(meshes) == len(set(meshes)), "two cases on one mesh: see --as-tp-rank"
    cases = [c for c in CASES if not (QUICK and c[0] in FULL_ONLY)]
    for name, src, unfused in cases:
        tc = time.time()
        S = setup(name, src)
        plan, world, par = S["plan"], S["world"], S["par"]
        builds = [True] + ([False] if unfused else [])
        check_rank(S, 0, builds, stats, declared, problems, writer)
        # TP ranks whose TP class differs from TP rank 0's (uneven splits), each in a process of its own.
        for t in sorted({r for cls in plan.get("tp_classes", []) for r in cls["tp_ranks"]}):
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--as-tp-rank", name, str(t)],
                               capture_output=True, text=True, cwd=E.ROOT)
            res = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode != 0 or not res:
                problems.append("%s as TP rank %d: the build failed: %s" % (name, t, (p.stdout + p.stderr).strip()[-800:]))
                continue
            r = json.loads(res[-1][len("RESULT "):])
            for k, v in r["stats"].items():
                stats[k] += v
            for k, v in r["declared"].items():
                declared[k] += v
            problems += r["problems"]
        # The writer from torchtitan's unfused config, family llama: the shipped tables exactly.
        if name in WRITER_LLAMA:
            table = S["table"]
            shipped = {k: table.get(k) for k in ("parallel", "fsdp", "topology", "training")}
            text = plan_from_titan(titan_config(S["size"], S["numbers"], False), name, world,
                                   seq_len=table["model"].get("seq_len"), family="llama", **shipped)
            wdir = os.path.join(OUT, "writer")
            os.makedirs(wdir, exist_ok=True)
            with open(os.path.join(wdir, name + ".lua"), "w") as fh:
                fh.write(text)
            _, got = generate(os.path.relpath(os.path.join(wdir, name + ".lua"), E.ROOT), "writer_" + name)
            d = tables_equal(got, os.path.join(OUT, "gen", name))
            if d:
                problems.append("%s (writer, llama family): generated tables differ from the shipped plan's: %s" % (name, d))
            writer.append("%s llama" % name)
        lines.append("%s (%d ranks, %s%s) %.1f s" % (name, world, ", ".join("%s=%d" % (k, v) for k, v in par.items() if v != 1),
                                                   ", unfused too" if unfused else "", time.time() - tc))
    for p in problems[:40]:
        print("DISAGREE", p)
    if len(problems) > 40:
        print("... and %d more" % (len(problems) - 40))
    print("llama_plan: cases: " + "; ".join(lines))
    tv, ttv = E.versions()
    print("llama_plan: declared differences (torchtitan %s / %s): names %d parameters (attention.qkv_linear.*, "
          "lm_head), fused qkv %d (wq+wk+wv = wqkv), reduce %d units (shipped plans average; torchtitan sums), "
          "uneven TP %d parameters (spmd_types' DTensor claims global = local x tp)"
          % (tv, ttv, declared["names"], declared["fused"], declared["reduce"], declared["uneven"]))
    print("llama_plan: plan writer (python/commplan/titan.py): %s" % ", ".join(writer))
    print("llama_plan: %d units, %d parameters, %d placements (%d mesh-dim entries), %d TP-local shapes compared "
          "(%d builds as another TP rank) in %.1f s: %d disagreements"
          % (stats["units"], stats["params"], stats["params"], stats["placements"], stats["tp_local"],
             stats["tp_ranks"], time.time() - t0, len(problems)))
    if QUICK:
        print("quick tier: %d of %d cases (not %s); make test-full compares all %d"
              % (len(cases), len(CASES), ", ".join(FULL_ONLY), len(CASES)))
    return 1 if problems else 0


def plan_file(path):
    """A plan file's table (model, parallel, fsdp, topology, training) as JSON, read by Lua."""
    code = ("package.path='./?.lua;'..package.path; local j=require('gen.json'); local t=dofile(%s); "
            "print(j.encode({model=t.model, parallel=t.parallel, fsdp=t.fsdp, topology=t.topology, "
            "training=t.training}))" % json.dumps(path))
    return json.loads(E.lua(["-e", code]))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
