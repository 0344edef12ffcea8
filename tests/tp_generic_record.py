#!/usr/bin/env python3
"""Generic decoders from a Hugging Face config.json under TP, recorded live (issue 37, item 1):
Qwen2's q/k/v biases, Llama's attention_bias / mlp_bias and tied embeddings, written by
commplan.hf_config as generic plans under torchtitan's Llama names and planned by the generator
with torchtitan's Llama TP plan (gen/parallel/tp.lua, gen/models/generic.lua's decoder).

The live side is torch alone: a tiny decoder of those shapes (torchtitan's Llama names, SDPA,
no RoPE: it moves no data), parallelized by torch's own styles as torchtitan's Llama plan applies
them (tok_embeddings RowwiseParallel to Shard(1), attention_norm / ffn_norm / norm
SequenceParallel, PrepareModuleInput Shard(1) -> Replicate before attention and feed_forward,
wq/wk/wv/w1/w3 ColwiseParallel, wo/w2 RowwiseParallel to Shard(1), output ColwiseParallel from
Shard(1) to Shard(-1) under loss_parallel; without sequence parallelism the plan without the
norms' styles, each module's input one Replicate DTensor), a tied output re-tied to the embedding's DTensor after
parallelize_module (Hugging Face's tie_weights: one parameter, Shard(0) for both styles), then
fully_shard per block, [tok_embeddings] / [norm, output] (tied: [tok_embeddings, norm, output],
one unit) and the root over dp_shard, on gloo, one process per rank, one step with
loss_parallel's cross entropy. Every TP collective, in order (kind, phase, count, reduce op:
tests/tp_record.py's recorder and comparison) against the plan's TP ops, and every FSDP
parameter's name, placements and TP-local shape against the plan's TP class.

    tests/tp_generic_record.py                 # every config (quick tier: two)
    tests/tp_generic_record.py --configs qwen2_tp2_sp

Needs torch (make torch-env); anywhere else one "SKIP tp_generic_record: ..." line and exit 0.
"""
import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "titan"))
sys.path.insert(0, os.path.join(ROOT, "python"))

SEQ, BATCH = 32, 2
BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "intermediate_size": 96, "vocab_size": 250, "hidden_act": "silu"}
MODELS = {
    "qwen2": dict(BASE, model_type="qwen2", tie_word_embeddings=False),
    "qwen2_tied": dict(BASE, model_type="qwen2", tie_word_embeddings=True),
    "llama_bias": dict(BASE, model_type="llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
    "llama_bias_tied": dict(BASE, model_type="llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
}
CONFIGS = {  # name: (world, dp_shard, sequence_parallel, model)
    "qwen2_tp2_sp": (2, 1, True, "qwen2"), "qwen2_tied_dp2_tp2_sp": (4, 2, True, "qwen2_tied"),
    "llama_bias_tp2_nosp": (2, 1, False, "llama_bias"), "llama_bias_dp2_tp2_sp": (4, 2, True, "llama_bias"),
    "llama_bias_tied_tp2_sp": (2, 1, True, "llama_bias_tied"),
    "llama_bias_tied_dp2_tp2_nosp": (4, 2, False, "llama_bias_tied"),
}
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
QUICK_CONFIGS = ("llama_bias_tied_tp2_sp", "llama_bias_dp2_tp2_sp")


def skip(why):
    print("SKIP tp_generic_record: %s" % why)
    sys.exit(0)


def shapes(config):
    """The model's numbers as commplan.hf_config reads them."""
    from commplan import hf
    return hf._shapes(dict(config), "config")


def build(s):
    """A tiny decoder of the config's shapes under torchtitan's Llama names."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            q, kv = s["n_heads"] * s["head_dim"], s["n_kv_heads"] * s["head_dim"]
            self.wq = nn.Linear(s["dim"], q, bias="q" in s["attn_bias"])
            self.wk = nn.Linear(s["dim"], kv, bias="k" in s["attn_bias"])
            self.wv = nn.Linear(s["dim"], kv, bias="v" in s["attn_bias"])
            self.wo = nn.Linear(q, s["dim"], bias="o" in s["attn_bias"])

        def forward(self, x):
            b, n = x.shape[0], x.shape[1]
            hd = s["head_dim"]
            xq = self.wq(x).view(b, n, -1, hd).transpose(1, 2)
            xk = self.wk(x).view(b, n, -1, hd).transpose(1, 2)
            xv = self.wv(x).view(b, n, -1, hd).transpose(1, 2)
            rep = xq.shape[1] // xk.shape[1]
            xk, xv = xk.repeat_interleave(rep, 1), xv.repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
            return self.wo(o.transpose(1, 2).reshape(b, n, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(s["dim"], s["hidden"], bias=s["mlp_bias"])
            self.w2 = nn.Linear(s["hidden"], s["dim"], bias=s["mlp_bias"])
            self.w3 = nn.Linear(s["dim"], s["hidden"], bias=s["mlp_bias"])

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.feed_forward = FeedForward()
            self.attention_norm = nn.RMSNorm(s["dim"])
            self.ffn_norm = nn.RMSNorm(s["dim"])

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(s["vocab"], s["dim"])
            self.layers = nn.ModuleDict({str(i): Block() for i in range(s["n_layers"])})
            self.norm = nn.RMSNorm(s["dim"])
            self.output = nn.Linear(s["dim"], s["vocab"], bias=False)
            if s["tied"]:
                self.output.weight = self.tok_embeddings.weight

        def forward(self, tokens):
            h = self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h)
            return self.output(self.norm(h))

    torch.manual_seed(0)
    return Decoder()


def parallelize(model, s, mesh, sp):
    """torchtitan's Llama TP plan (its classic parallelize_llama: apply_tp) with torch's styles, then
    fully_shard as hf_units wraps the model."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    from torch.distributed.fsdp import fully_shard
    tp = mesh["tp"]
    top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
           "output": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
                                     use_local_output=False)}
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, tp, top)
    for block in model.layers.values():
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=Shard(1) if sp
                                                                                   else Replicate()),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate())}
        if sp:
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                         "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                         "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                            desired_input_layouts=(Replicate(),))})
        else:
            # without sequence parallelism the module's input is one Replicate DTensor (torchtitan 0.3:
            # I -> R at the module's input, decoder_sharding.py:101-139): one all-reduce of its gradient,
            # not one per linear; the norms stay whole on every TP rank
            plan.update({m: PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
                         for m in ("attention", "feed_forward")})
        parallelize_module(block, tp, plan)
    if s["tied"]:
        # parallelize_module registered a new DTensor parameter on each module: re-tied (one parameter)
        model.output.weight = model.tok_embeddings.weight
    dp = mesh["dp_shard"]
    if s["tied"]:
        fully_shard([model.tok_embeddings, model.norm, model.output], mesh=dp, reshard_after_forward=False)
    else:
        fully_shard(model.tok_embeddings, mesh=dp)
    for block in model.layers.values():
        fully_shard(block, mesh=dp)
    if not s["tied"]:
        fully_shard([model.norm, model.output], mesh=dp, reshard_after_forward=False)
    fully_shard(model, mesh=dp)
    return model


def units_of(model):
    """Every FSDP unit's parameters: name, placements over (dp_shard, tp), TP-local shape (forward order)."""
    from torch.distributed.fsdp import FSDPModule
    pnames = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        pnames.setdefault(id(p), n)
    out, seen = [], set()
    for _, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        st = m._get_fsdp_state()
        if id(st) in seen:
            continue
        seen.add(id(st))
        u = {"params": []}
        for g in st._fsdp_param_groups:
            for fp in g.fsdp_params:
                sp = fp.sharded_param
                mesh = sp.device_mesh
                pl = [(n, repr(p)) for n, p in zip(mesh.mesh_dim_names, sp.placements)]
                if "tp" not in mesh.mesh_dim_names:
                    # a plain tensor on every TP rank (the norms without sequence parallelism) is
                    # replicated over TP, which torchtitan 0.3 declares (decoder_sharding.py:101-139)
                    pl.append(("tp", "Replicate()"))
                u["params"].append({"name": pnames[id(sp)], "local": list(fp._orig_size), "placements": pl})
        out.append(u)
    return out


def rank_main(rank, world, init_file, name, out_dir):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor.parallel import loss_parallel
    import tp_record as R

    torch.set_num_threads(1)
    world, dp, sp, mname = CONFIGS[name]
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    s = shapes(MODELS[mname])
    mesh = init_device_mesh("cpu", (dp, 2), mesh_dim_names=("dp_shard", "tp"))
    model = build(s)
    model = parallelize(model, s, mesh, sp)
    units = units_of(model)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    rec = R.Recorder()
    mode = R.install(rec)
    tp_ranks = [int(r) for r in dist.get_process_group_ranks(mesh["tp"].get_group())]
    dp_coord = mesh["dp_shard"].get_local_rank()
    tokens = torch.randint(0, s["vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(dp_coord))
    with mode:
        rec.phase = "forward"
        pred = model(tokens)
        with loss_parallel():
            rec.phase = "loss"
            loss = F.cross_entropy(pred.flatten(0, 1), tokens.flatten(0, 1))
            rec.phase = "backward"
            loss.backward()
    tp_log = [e for e in rec.log if e["ranks"] == tp_ranks]
    with open(os.path.join(out_dir, "%s.rank%d.json" % (name, rank)), "w") as f:
        json.dump({"config": name, "rank": rank, "tp": tp_log, "units": units,
                   "tp_coord": mesh["tp"].get_local_rank()}, f, indent=1)
    dist.destroy_process_group()


def plan_json(name, out_dir, sequence_parallel=None):
    """The plan commplan.hf_config writes for the config's model (a generic plan), generated."""
    import commplan
    import titan_env as E
    world, dp, sp, mname = CONFIGS[name]
    if sequence_parallel is not None:
        sp, name = sequence_parallel, name + "_flipped"
    model = commplan.hf_config(dict(MODELS[mname]), dtype="fp32", seq_len=SEQ)
    assert model["family"] == "generic", model["family"]
    text = commplan.plan_text(name, world, model, parallel={"dp_shard": dp, "tp": 2, "sequence_parallel": sp},
                              training={"local_batch_size": BATCH})
    lua_path = os.path.join(out_dir, "tp_generic_%s.lua" % name)
    with open(lua_path, "w") as f:
        f.write(text)
    gen = os.path.join(out_dir, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(lua_path, ROOT), os.path.relpath(gen, ROOT)])
    with open(os.path.join(gen, "plan.json")) as f:
        return json.load(f)


def compare_units(plan, rec):
    """Each FSDP parameter live (name, placements, TP-local shape) against the plan's TP class."""
    import test_llama_plan as TL
    import tp_record as R
    return R.units_differ(TL.commplan_units(plan, rec["tp_coord"]), rec, "torch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(QUICK_CONFIGS if QUICK else CONFIGS))
    a = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
        import torch.distributed.tensor.parallel  # noqa: F401
    except Exception as e:  # noqa: BLE001
        skip("torch is not importable by %s (%s); make torch-env builds it" % (sys.executable, e))
    import tp_record as R
    names, out_dir = R.picked("tp_generic_record", a.configs, CONFIGS)
    # The ranks forked from this process, torch imported once here (tests/tp_record.py's way: this
    # process builds no mesh and starts no thread; spawning imported torch again in every rank, seconds
    # of CPU each). TP_RECORD_START=spawn imports it in each rank instead.
    start = os.environ.get("TP_RECORD_START", "fork")
    if start == "fork":
        import torch.distributed.fsdp  # noqa: F401
        import torch.nn.functional  # noqa: F401
    for c in names:
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(rank_main, args=(CONFIGS[c][0], os.path.join(tmp, "init"), c, out_dir),
                               nprocs=CONFIGS[c][0], join=True, start_method=start)
    bad, total, params, lines = R.check_recordings(
        names, {c: CONFIGS[c][0] for c in names}, out_dir, lambda c: plan_json(c, out_dir), compare_units,
        lambda c, rec, ours, n: "  ok    %s (%d ranks): %d TP collectives in order on every rank (%s), %d parameters"
        % (c, CONFIGS[c][0], len(rec["tp"]), R.kinds_text(rec), n))
    # The comparison can fail: the first config against its plan with sequence parallelism flipped.
    m_bad, line = R.mutant_check(names[0], out_dir, R.plan_ops(plan_json(names[0], out_dir, not CONFIGS[names[0]][2])),
                                 "sequence_parallel flipped")
    bad += m_bad
    (print if m_bad else lines.append)(line)  # a FAIL at once, an ok among the ok lines
    print("\n".join(lines))
    print("tp_generic_record: %d configs x ranks, %d TP collectives recorded from torch %s, %d parameters' "
          "placements and TP-local shapes, %d differ" % (sum(CONFIGS[c][0] for c in names), total, torch.__version__,
                                                         params, bad))
    R.finish(names, CONFIGS, bad)


if __name__ == "__main__":
    main()
