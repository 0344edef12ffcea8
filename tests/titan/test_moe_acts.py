#!/usr/bin/env python3
"""The MoE activation model (gen/models/moe_acts.lua) against torch: the bytes autograd saves in
one forward of torchtitan 0.3's own MoE module (models/common/moe.py: router, token dispatch,
grouped experts, combine, shared experts), ep = 1, with no activation checkpointing and under
torchtitan's selective (op) checkpointing (issue 23).

Each case builds a block's MoE with torchtitan's own layer builders (Qwen3's, as the mixtral and
qwen3_moe families; DeepSeek-V3's with shared experts, with and without route_norm and node-limited
routing) in bf16 on CPU and runs its forward on B x L tokens under
torch.autograd.graph.saved_tensors_hooks, counting every saved tensor's storage once, parameters
excluded (FSDP's unsharded parameters are the arena's, not activations). The router's gate runs
under torch.autocast(float32), which CUDA honours and CPU refuses (it warns and runs bf16): on CPU
the gate is called as CUDA autocast runs it, F.linear on fp32 casts of its input and weight. The
sum must equal moe_acts.moe's "none" bytes for the same numbers, less what belongs to the block
around the module (ffn_norm's input and rstd). Selective: the module wrapped by torchtitan's own
SelectiveAC._wrap_block (its policy, force-recomputing the router gate's matmul shape), counting
the outputs of the ops its policy marks MUST_SAVE in the forward, each storage once; that must
equal moe_acts.sac_matmuls over the module's matmuls (the gate's shape forced) plus moe_acts.moe's
sac bytes (topk's). Prints one "moe_acts:" line; SKIP (77) without torch and torchtitan.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

NAME = "MoE saved-tensor bytes vs gen/models/moe_acts.lua (tests/titan/test_moe_acts.py)"
B, L = 2, 16


def lua_bytes(cfg):
    """moe_acts.moe's none + routed bytes of the module alone (ffn_norm's input and rstd taken off),
    and what SelectiveAC keeps of the module alone."""
    fields = ", ".join("%s = %s" % (k, ("true" if v is True else v)) for k, v in cfg.items() if k != "router")
    router = ", ".join("%s = %s" % (k, ("true" if v is True else v)) for k, v in cfg["router"].items())
    code = ("package.path = './?.lua;' .. package.path\n"
            "local acts = require('gen.models.moe_acts')\n"
            "local cfg = { %s, router = { %s } }\n"
            "local T = %d\n"
            "local m = acts.moe(cfg, 2, T, T * cfg.top_k, 1)\n"
            "print(string.format('%%d %%d', m.none + m.routed - 2 * T * cfg.dim - 4 * T,\n"
            "  acts.sac_matmuls(m.mms, 2, T, { cfg.dim, cfg.num_experts }) + m.sac))\n") % (fields, router, B * L)
    none, sac = E.lua(["-e", code]).split()
    return int(none), int(sac)


def build(moe_cfg):
    import torch
    import torch.nn.functional as F
    moe = moe_cfg.build().to(torch.bfloat16)
    torch.manual_seed(0)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.02)
    gate = moe.router.gate
    gate.forward = lambda x: F.linear(x.float(), gate.weight.float())  # CUDA's autocast(float32)
    return moe


def measure(moe_cfg, dim):
    """Bytes autograd saves in the module's forward (no checkpointing)."""
    import torch
    moe = build(moe_cfg)
    params = {p.untyped_storage().data_ptr() for p in moe.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen.setdefault(s.data_ptr(), s.nbytes())
        return t
    x = torch.randn(B, L, dim, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        moe(x)
    return sum(seen.values())


def measure_sac(moe_cfg, dim):
    """Bytes of the op outputs torchtitan's SelectiveAC policy saves in the module's forward."""
    import torch
    import torchtitan.distributed.activation_checkpoint as AC
    moe = build(moe_cfg)
    saved = {}
    real = AC.create_selective_checkpoint_contexts

    def contexts(policy, *args, **kwargs):
        def watched(ctx, func, *a, **k):
            got = policy(ctx, func, *a, **k)
            if not ctx.is_recompute and got == AC.CheckpointPolicy.MUST_SAVE:
                out = ctx.op_output if isinstance(ctx.op_output, (tuple, list)) else [ctx.op_output]
                for t in out:
                    if isinstance(t, torch.Tensor):
                        saved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            return got
        return real(watched, *args, **kwargs)
    AC.create_selective_checkpoint_contexts = contexts
    try:
        # the block's FQN, so that force_recompute_mm_shapes_by_fqns ("moe.router.gate") finds the gate
        wrapped = AC.SelectiveAC(AC.SelectiveAC.Config())._wrap_block(moe, base_fqn="layers.1.moe")
        x = torch.randn(B, L, dim, dtype=torch.bfloat16, requires_grad=True)
        wrapped(x).float().sum().backward()
    finally:
        AC.create_selective_checkpoint_contexts = real
    return sum(saved.values())


def cases():
    import torchtitan.models.deepseek_v3 as DS
    import torchtitan.models.qwen3 as Q
    from torchtitan.models.common import CosSinRoPE
    d, F, Ex, K = 64, 48, 8, 2
    layers = Q._build_qwen3_moe_layers(
        fuse_qkv=True, n_layers=1, dim=d, n_heads=4, n_kv_heads=2, head_dim=16, moe_hidden_dim=F, num_experts=Ex,
        top_k=K, attn_backend="flex", moe_comm_backend="standard",
        rope=CosSinRoPE.Config(dim=16, max_seq_len=4096, theta=1e6))
    yield ("qwen3/mixtral MoE (softmax, route_norm)", layers[0].moe, d,
           dict(dim=d, moe_hidden_dim=F, num_experts=Ex, top_k=K, router={"route_norm": True}))
    # deepseek_v3 "debugmodel": its last block's MoE (8 experts, top 3, 2 shared)
    ds = DS.model_registry("debugmodel").model
    lc = ds.layers[-1].moe
    r, F = lc.router, lc.routed_experts.inner_experts.hidden_dim
    n = dict(dim=ds.dim, moe_hidden_dim=F, num_experts=lc.num_experts, top_k=r.top_k,
             num_shared_experts=lc.shared_experts.w1.out_features // F)
    r.num_expert_groups, r.num_limited_groups, r.route_norm = None, None, False
    yield ("deepseek_v3 MoE (16B's router: no route_norm, no groups)", lc, ds.dim, dict(n, router={}))
    r.num_expert_groups, r.num_limited_groups, r.route_norm, r.score_func = 4, 2, True, "sigmoid"
    yield ("deepseek_v3 MoE (671B's router: sigmoid, route_norm, node-limited 4 groups, 2 chosen)", lc, ds.dim,
           dict(n, router={"route_norm": True, "groups": 4, "limited": 2}))


def main():
    E.need_titan(NAME)
    import warnings
    warnings.filterwarnings("ignore", message=".*autocast.*")
    bad = 0
    n = 0
    for name, moe_cfg, dim, cfg in cases():
        want, want_sac = lua_bytes(cfg)
        for mode, got, w in (("none", measure(moe_cfg, dim), want), ("selective", measure_sac(moe_cfg, dim), want_sac)):
            n += 1
            print("%s, %s: torch %d bytes, moe_acts %d%s" % (name, mode, got, w, "" if got == w else "  MISMATCH"))
            bad += got != w
    print("moe_acts: %d cases, %d equal, %d differ" % (n, n - bad, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
