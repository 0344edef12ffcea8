#!/usr/bin/env python3
"""The MoE activation model (gen/models/moe_acts.lua) against torch: the bytes autograd saves in
one forward of torchtitan 0.3's own MoE module (models/common/moe.py: router, token dispatch,
grouped experts, combine, shared experts) and of its own whole transformer blocks (attention and
MoE or dense FFN), ep = 1, with no activation checkpointing, under torchtitan's selective (op)
checkpointing (issue 23) and under its full checkpointing.

MoE module: each case builds a block's MoE with torchtitan's own layer builders (Qwen3's, as the
mixtral and qwen3_moe families; DeepSeek-V3's with shared experts, with and without route_norm and
node-limited routing) in bf16 on CPU and runs its forward on B x L tokens under
torch.autograd.graph.saved_tensors_hooks, counting every saved tensor's storage once, parameters
excluded (FSDP's unsharded parameters are the arena's, not activations). The router's gate runs
under torch.autocast(float32), which CUDA honours and CPU refuses (it warns and runs bf16): on CPU
the gate is called as CUDA autocast runs it, F.linear on fp32 casts of its input and weight. The
sum must equal moe_acts.moe's "none" bytes for the same numbers, less what belongs to the block
around the module (ffn_norm's input and rstd). Selective: the module wrapped by torchtitan's own
SelectiveAC._wrap_block (its policy, force-recomputing the router gate's matmul shape), counting
the outputs of the ops its policy marks MUST_SAVE in the forward, each storage once; that must
equal moe_acts.sac_matmuls over the module's matmuls (the gate's shape forced) plus moe_acts.moe's
sac bytes (topk's).

Whole blocks: torchtitan's Qwen3 MoE block (GQA attention with FlexAttention, fused and unfused
qkv, with Qwen3's q/k norms and without them: the mixtral family's block) and DeepSeek-V3's blocks
(MLA with q_lora_rank 0 and > 0; a dense block and an MoE block) and gpt-oss's block (sinks, biased
linears, the clamped SwiGLU with its expert biases) with flex attention and with varlen, its registry's
default (torch's _varlen_attn given a CPU kernel, varlen_on_cpu: its own saved set; measured in forward,
the backward being CUDA's), run on B x S tokens with a causal
block mask: "none" (saved_tensors_hooks, each storage once; parameters, buffers and the block
mask excluded) must equal moe_acts.block's saved + routed bytes; "selective" (the block wrapped by
SelectiveAC._wrap_block under its FQN: the MUST_SAVE outputs, each storage once, plus the block's
input) its saved bytes; "full" (FullAC's wrapper: an outer hook sees the block's input alone) its
saved bytes. The CPU stand-ins are tests/titan/test_llama_acts.py's (CUDA's fused RMSNorm kernel's
saved set; eager flex attention without max_scores, and under SelectiveAC the compiled region's
outputs: out, lse and the q, k, v inputs); the test checks that compiled flex_attention's AOT
forward graph returns exactly those for the GQA and MLA shapes (v's head dim differing from q's).
Prints one "moe_acts:" line; SKIP (77) without torch and torchtitan.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

NAME = "MoE saved-tensor bytes vs gen/models/moe_acts.lua (tests/titan/test_moe_acts.py)"
B, L = 2, 16
S = 128  # the whole blocks' sequence length (one flex block)


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



def lua_field(v):
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{ %s }" % ", ".join("%s = %s" % (k, lua_field(x)) for k, x in v.items())
    return str(v)


def lua_block(cfg, i):
    """moe_acts.block's bytes for block i of cfg, B x S tokens, bf16, ep 1: none (saved + routed),
    selective's and full's saved."""
    code = ("package.path = './?.lua;' .. package.path\n"
            "local acts = require('gen.models.moe_acts')\n"
            "local cfg = %s\n"
            "local T = %d\n"
            "local function b(ac) return acts.block(cfg, %d, 2, T, T * cfg.top_k, 1, ac) end\n"
            "local n, s, f = b('none'), b('selective'), b('full')\n"
            "print(string.format('%%d %%d %%d', n.saved + n.routed, s.saved, f.saved))\n"
            ) % (lua_field(cfg), B * S, i)
    return [int(x) for x in E.lua(["-e", code]).split()]


QWEN = dict(dim=64, n_heads=4, n_kv_heads=2, head_dim=16, moe_hidden_dim=48, num_experts=8, top_k=2)
GPT_OSS = dict(dim=64, n_heads=4, n_kv_heads=2, head_dim=16, moe_hidden_dim=48, num_experts=8, top_k=2)
DSV3 = dict(dim=64, n_dense_layers=1, n_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, dense_hidden_dim=96, moe_hidden_dim=24, num_experts=8, num_shared_experts=2, top_k=3)


def qwen3_block(fused, qk_norm):
    """torchtitan's Qwen3 MoE block; without q/k norms, the mixtral family's."""
    import torchtitan.models.qwen3 as Q
    from torchtitan.models.common import CosSinRoPE
    c = QWEN
    cfg = Q._build_qwen3_moe_layers(
        fuse_qkv=fused, n_layers=1, dim=c["dim"], n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"],
        head_dim=c["head_dim"], moe_hidden_dim=c["moe_hidden_dim"], num_experts=c["num_experts"], top_k=c["top_k"],
        attn_backend="flex", moe_comm_backend="standard",
        rope=CosSinRoPE.Config(dim=c["head_dim"], max_seq_len=4096, theta=1e6))[0]
    if not qk_norm:
        cfg.attention.qk_norm = None
    return cfg, dict(c, fuse_qkv=fused, qk_norm=qk_norm, router={"route_norm": True})


def gpt_oss_block(backend, i):
    """Block i of a small gpt-oss (its own builders, _build_gptoss_layers and _make_gptoss_attn_config with
    the case's heads; block 0 with the 128-token window, one flex block here), attention by backend."""
    import torchtitan.models.gpt_oss as G
    from torchtitan.models.common import CosSinRoPE
    c = GPT_OSS
    rope = CosSinRoPE.Config(dim=c["head_dim"], max_seq_len=4096, theta=150000.0)
    lc = G._build_gptoss_layers(dim=c["dim"], n_layers=2, hidden_dim=c["moe_hidden_dim"],
                                num_experts=c["num_experts"], top_k=c["top_k"], load_balance_coeff=1e-3,
                                attn_backend=backend, fuse_qkv=True, moe_comm_backend="standard", rope=rope)[i]
    lc.attention = G._make_gptoss_attn_config(
        dim=c["dim"], layer_id=i, attn_backend=backend, n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"],
        head_dim=c["head_dim"], sliding_window_size=lc.attention.sliding_window_size, fuse_qkv=True, rope=rope)
    return lc, dict(c, fuse_qkv=True, gpt_oss=True, attn_backend=backend, router={"route_norm": True})


def dsv3_block(ql, i):
    """Block i of a small DeepSeek-V3 (its own builder; the debugmodel's yarn rope)."""
    import dataclasses
    import torchtitan.models.deepseek_v3 as DS
    c = DSV3
    rope = DS.model_registry("debugmodel").model.layers[0].attention.rope
    cfgs = DS._build_dsv3_layers(
        n_layers=2, n_dense_layers=c["n_dense_layers"], dim=c["dim"], n_heads=c["n_heads"], q_lora_rank=ql,
        kv_lora_rank=c["kv_lora_rank"], qk_nope_head_dim=c["qk_nope_head_dim"],
        qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"], mscale=0.7,
        dense_hidden_dim=c["dense_hidden_dim"], moe_hidden_dim=c["moe_hidden_dim"], num_experts=c["num_experts"],
        num_shared_experts=c["num_shared_experts"], router_top_k=c["top_k"], router_score_func="softmax",
        attn_backend="flex", moe_comm_backend="standard", non_blocking_capacity_factor=None,
        rope=dataclasses.replace(rope, dim=c["qk_rope_head_dim"]))
    return cfgs[i], dict(c, q_lora_rank=ql, router={})


def build_block(cfg):
    import torch
    import torch.nn.functional as F
    blk = cfg.build().to(torch.bfloat16)
    torch.manual_seed(0)
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.02)
    moe = getattr(blk, "moe", None)
    if moe is not None:
        gate = moe.router.gate
        # CUDA's autocast(float32) (gpt-oss's gate with its bias: an fp32 addmm)
        gate.forward = lambda x: F.linear(x.float(), gate.weight.float(),
                                          None if gate.bias is None else gate.bias.float())
    return blk


def block_mask(backend="flex"):
    """flex: a causal BlockMask; varlen: torchtitan's VarlenMetadata of B sequences of S tokens."""
    import torch
    if backend == "varlen":
        from torchtitan.models.common.attention import VarlenMetadata
        cu = torch.arange(0, B * S + 1, S, dtype=torch.int32)
        return VarlenMetadata(cu, cu, S, S)
    from torch.nn.attention.flex_attention import create_block_mask
    return create_block_mask(lambda b, h, q, k: q >= k, B, None, S, S, device="cpu")


def excluded(blk, m):
    import torch
    s = {t.untyped_storage().data_ptr() for t in list(blk.parameters()) + list(blk.buffers())}
    s |= {t.untyped_storage().data_ptr() for t in (m.as_tuple() if hasattr(m, "as_tuple") else tuple(m))
          if isinstance(t, torch.Tensor)}
    return s


def varlen_on_cpu():
    """torch.nn.attention.varlen's _varlen_attn (FlashAttention, CUDA only) with a CPU kernel: the causal
    (windowed) attention per sequence in eager ops, out, its fp32 lse (heads x tokens) and the uint64 x 2
    rng_state as the CUDA op returns them. Its autograd registration (_setup_context: what it saves) is
    torch's own; the backward stays CUDA's, so the varlen blocks are measured in forward alone."""
    import torch
    from torch.nn.attention import varlen as V

    def cpu(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None, window_size=None,
            enable_gqa=False, seqused_k=None, block_table=None, num_splits=None, backend=0):
        n, h, dh = query.shape
        left = (window_size or [-1, -1])[0]
        out = torch.empty(n, h, value.shape[-1], dtype=query.dtype)
        lse = torch.empty(h, n, dtype=torch.float32)
        cq = cu_seq_q.tolist()
        for s0, s1 in zip(cq[:-1], cq[1:]):
            q, k, v = (t[s0:s1].transpose(0, 1).float() for t in (query, key, value))
            k, v = k.repeat_interleave(h // k.shape[0], 0), v.repeat_interleave(h // v.shape[0], 0)
            s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else dh ** -0.5)
            i = torch.arange(s.shape[-1])
            mask = i[:, None] >= i[None, :]
            if left >= 0:
                mask &= (i[:, None] - i[None, :]) <= left
            s = s.masked_fill(~mask, float("-inf"))
            lse[:, s0:s1] = torch.logsumexp(s, -1)
            out[s0:s1] = (torch.softmax(s, -1) @ v).transpose(0, 1).to(out.dtype)
        return out, lse, torch.zeros(2, dtype=torch.uint64)
    V._varlen_attn.register_kernel("cpu")(cpu)


def block_none(cfg, dim, wrap=None, backend="flex"):
    """Bytes autograd saves in one forward of the block (or, wrapped, what an outer hook sees)."""
    import torch
    blk, m = build_block(cfg), block_mask(backend)
    if wrap:
        blk = wrap(blk)
    ex, seen, hold = excluded(blk, m), {}, []

    def pack(t):
        hold.append(t)  # no later storage reuses a freed one's address
        st = t.untyped_storage()
        if st.data_ptr() not in ex and st.nbytes() > 0:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t
    x = torch.randn(B, S, dim, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = blk(x, m)
    if backend != "varlen":  # (varlen's backward is CUDA's: the saved set is the forward's anyway)
        out.float().sum().backward()
    return sum(seen.values())


def block_selective(cfg, dim, fqn, backend="flex"):
    """The block's input and the outputs of the ops SelectiveAC marks MUST_SAVE (flex: the compiled
    region's out, lse, q, k, v), each storage once."""
    import torch
    import torchtitan.distributed.activation_checkpoint as AC
    blk, m = build_block(cfg), block_mask(backend)
    ex, saved, hold = excluded(blk, m), {}, []
    real = AC.create_selective_checkpoint_contexts

    def keep(t):
        hold.append(t)
        st = t.untyped_storage()
        if st.data_ptr() not in ex and st.nbytes() > 0:
            saved.setdefault(st.data_ptr(), st.nbytes())

    def contexts(policy, *a, **k):
        def watched(ctx, func, *args, **kw):
            got = policy(ctx, func, *args, **kw)
            if not ctx.is_recompute and got == AC.CheckpointPolicy.MUST_SAVE:
                out = ctx.op_output if isinstance(ctx.op_output, (tuple, list)) else [ctx.op_output]
                if func is torch._higher_order_ops.flex_attention:
                    out = list(out[:2]) + list(args[:3])  # the compiled region's: out, lse, q, k, v
                for t in out:
                    if isinstance(t, torch.Tensor):
                        keep(t)
            return got
        return real(watched, *a, **k)
    AC.create_selective_checkpoint_contexts = contexts
    try:
        # the block's FQN, so that force_recompute_mm_shapes_by_fqns ("moe.router.gate") finds the gate
        w = AC.SelectiveAC(AC.SelectiveAC.Config())._wrap_block(blk, base_fqn=fqn)
        x = torch.randn(B, S, dim, dtype=torch.bfloat16, requires_grad=True)
        keep(x)  # the checkpoint keeps the block's input
        out = w(x, m)
        if backend != "varlen":
            out.float().sum().backward()
    finally:
        AC.create_selective_checkpoint_contexts = real
    return sum(saved.values())


def block_full(cfg, dim, backend="flex"):
    import torchtitan.distributed.activation_checkpoint as AC
    return block_none(cfg, dim, wrap=lambda b: AC.FullAC(AC.FullAC.Config())._wrap_block(b, base_fqn="layers.1"),
                      backend=backend)


def compiled_flex_outputs(hq, hkv, dqk, dv):
    """Whether compiled flex_attention's AOT forward graph returns out, lse and its inputs q, k, v
    (then the block mask's tensors) and nothing else, for q (1, hq, S, dqk), k (1, hkv, S, dqk),
    v (1, hkv, S, dv)."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    got = []

    def fw(gm, _):
        out = [n for n in gm.graph.nodes if n.op == "output"][0]
        got.extend(out.args[0])
        return make_boxed_func(gm.forward)
    torch._dynamo.reset()
    f = torch.compile(flex_attention, backend=aot_autograd(fw_compiler=fw,
                                                           bw_compiler=lambda gm, _: make_boxed_func(gm.forward)))
    q = torch.randn(1, hq, S, dqk, requires_grad=True)
    k = torch.randn(1, hkv, S, dqk, requires_grad=True)
    v = torch.randn(1, hkv, S, dv, requires_grad=True)
    m = create_block_mask(lambda b, h, i, j: i >= j, 1, None, S, S, device="cpu")
    f(q, k, v, block_mask=m, enable_gqa=hq != hkv)[0].sum().backward()
    made = sorted(tuple(n.meta["val"].shape) for n in got if n.op != "placeholder")
    inputs = [tuple(n.meta["val"].shape) for n in got if n.op == "placeholder"]
    # out (the user's and the saved one) and lse; the inputs q, k, v, then the mask's (every dim 1)
    return (made == sorted([(1, hq, S), (1, hq, S, dv), (1, hq, S, dv)])
            and inputs[:3] == [(1, hq, S, dqk), (1, hkv, S, dqk), (1, hkv, S, dv)]
            and all(max(sh) == 1 for sh in inputs[3:]))


def block_cases():
    for fused in (True, False):
        for qk_norm in (True, False):
            cfg, lua = qwen3_block(fused, qk_norm)
            name = "%s block (GQA, %s qkv%s)" % ("qwen3_moe" if qk_norm else "mixtral",
                                                "fused" if fused else "unfused", ", q/k norms" if qk_norm else "")
            yield name, cfg, lua, 0
    for ql in (0, 12):
        for i in (0, 1):
            cfg, lua = dsv3_block(ql, i)
            yield ("deepseek_v3 %s block (MLA, q_lora_rank %d)" % ("dense" if i == 0 else "MoE", ql), cfg, lua, i)
    # issue 41 (hpp): model.fused "swiglu", torchtitan's FusedSwiGLU (overrides/fused_swiglu.py:440-457, its
    # fused_swiglu override's replacement of every FeedForward.Config, :486-505): the dense block's feed_forward
    # and the MoE block's shared experts
    import torchtitan.overrides.fused_swiglu as FS
    for i in (0, 1):
        cfg, lua = dsv3_block(0, i)
        owner, attr = (cfg, "feed_forward") if i == 0 else (cfg.moe, "shared_experts")
        fc = getattr(owner, attr)
        setattr(owner, attr, FS.FusedSwiGLU.Config(w1=fc.w1, w2=fc.w2, w3=fc.w3))
        yield ("deepseek_v3 %s block (MLA, q_lora_rank 0, fused SwiGLU w13)" % ("dense" if i == 0 else "MoE"), cfg,
               dict(lua, fused={"swiglu": True}), i)
    for backend in ("flex", "varlen"):
        cfg, lua = gpt_oss_block(backend, 0)
        yield "gpt_oss block (sinks, biases, %s)" % backend, cfg, lua, 0

def main():
    E.need_titan(NAME)
    import warnings
    warnings.filterwarnings("ignore")
    import test_llama_acts as LA
    LA.cpu_stand_ins()
    from test_fused_plan import cpu_silu_and_mul
    cpu_silu_and_mul()
    bad = 0
    n = 0

    def check(what, got, want):
        nonlocal bad, n
        n += 1
        bad += got != want
        print("%s: torch %d bytes, moe_acts %d%s" % (what, got, want, "" if got == want else "  MISMATCH"))
    for name, moe_cfg, dim, cfg in cases():
        want, want_sac = lua_bytes(cfg)
        check(name + ", none", measure(moe_cfg, dim), want)
        check(name + ", selective", measure_sac(moe_cfg, dim), want_sac)
    c, d = QWEN, DSV3
    for what, shape in (("GQA", (c["n_heads"], c["n_kv_heads"], c["head_dim"], c["head_dim"])),
                        ("MLA", (d["n_heads"], d["n_heads"], d["qk_nope_head_dim"] + d["qk_rope_head_dim"],
                                 d["v_head_dim"]))):
        n += 1
        if compiled_flex_outputs(*shape):
            print("compiled flex_attention's forward graph (%s shapes) returns out, lse, q, k, v (and the mask): "
                  "counted under SAC" % what)
        else:
            bad += 1
            print("compiled flex_attention's forward graph (%s shapes) outputs differ from out, lse, q, k, v  "
                  "MISMATCH" % what)
    varlen_on_cpu()
    for name, cfg, lua, i in block_cases():
        want = lua_block(lua, i)
        dim, be = lua["dim"], lua.get("attn_backend", "flex")
        check(name + ", none", block_none(cfg, dim, backend=be), want[0])
        check(name + ", selective", block_selective(cfg, dim, "layers.%d" % i, backend=be), want[1])
        if name.startswith(("qwen3_moe block (GQA, fused", "deepseek_v3", "gpt_oss")):
            check(name + ", full (FullAC: an outer hook sees the checkpoint's input alone)",
                  block_full(cfg, dim, backend=be), want[2])
    print("moe_acts: %d cases, %d equal, %d differ" % (n, n - bad, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
