#!/usr/bin/env python3
"""The Llama activation model (gen/models/llama_acts.lua) against torch: torchtitan 0.3's own llama3
TransformerBlock (its _build_llama3_layers, FlexAttention, fused and unfused qkv) and its loss
(components/loss.py: CrossEntropyLoss, ChunkedLossWrapper) in bf16 on CPU.

Block, no checkpointing: the bytes autograd saves in one forward (saved_tensors_hooks, each storage
once; parameters, buffers and the shared block mask excluded) must equal llama_acts.block's "none".
Selective: the block wrapped by torchtitan's own SelectiveAC._wrap_block; the outputs of the ops its
policy marks MUST_SAVE in the forward, each storage once, plus the block's input, must equal
llama_acts.block's "selective". Full: under FullAC's wrapper an outer hook sees the block's input
alone (llama_acts.block's "full").

CPU stand-ins for what CUDA runs, each stated where it is made:
  - RMSNorm: torch's CPU path decomposes rms_norm (fp32 intermediates autograd keeps); CUDA runs
    aten::_fused_rms_norm, whose autograd node (FusedRmsNormBackward0) saves input, weight and
    rstd. The test runs the same kernel under a Function saving exactly those.
  - FlexAttention: torchtitan runs torch.compile(flex_attention); flex refuses backward on CPU, so
    the eager higher-order op runs with the device check lifted. Eager flex also saves max_scores,
    which compiled flex's backward never reads (flex_attention_backward takes none); it is dropped.
    Under SelectiveAC the compiled region is one inductor_compiled_code op in the save list, whose
    outputs are the AOT forward graph's: the attention output and logsumexp and the q, k, v it
    saves for backward (and the block mask's tensors). The test checks that graph's outputs
    (aot_autograd over flex_attention on CPU) and counts q, k, v with the eager op's out and lse.
Loss: the live bytes (a TorchDispatchMode over every op's output storages, freed by weakref) from
the final norm's output to the end of the loss's backward, parameters, their gradients, labels and
scalars excluded: what lives after the loss call (saved through the decoder's backward) and the most
the loss adds at its peak must equal llama_acts.head's saved and transient, for CrossEntropyLoss
and ChunkedLossWrapper with 2 and 8 chunks, one and two sequences. Prints one "llama_acts:" line;
SKIP (77) without torch and torchtitan.
"""

import importlib
import os
import sys
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

NAME = "Llama block and loss saved-tensor bytes vs gen/models/llama_acts.lua (tests/titan/test_llama_acts.py)"
B, S = 2, 128
D, H, KVH, F = 64, 4, 2, 96


def lua_block(fused, swiglu=False):
    code = ("package.path = './?.lua;' .. package.path\n"
            "local a = require('gen.models.llama_acts')\n"
            "local cfg = { dim = %d, n_heads = %d, n_kv_heads = %d, head_dim = %d, hidden = %d%s }\n"
            "local n, s, f = a.block(cfg, 2, %d, 'none'), a.block(cfg, 2, %d, 'selective', %s), a.block(cfg, 2, %d, 'full')\n"
            "print(string.format('%%d %%d %%d', n.saved, s.saved, f.saved))\n"
            ) % (D, H, KVH, D // H, F, ", fused = { swiglu = true }" if swiglu else "", B * S, B * S,
                 "true" if fused else "false", B * S)
    return [int(x) for x in E.lua(["-e", code]).split()]


def lua_head(T, d, V, chunks, b):
    code = ("package.path = './?.lua;' .. package.path\n"
            "local h = require('gen.models.llama_acts').head(%d, 2, %d, %d, %d, %d)\n"
            "print(string.format('%%d %%d', h.saved, h.transient))\n") % (T, d, V, chunks, b)
    return [int(x) for x in E.lua(["-e", code]).split()]


def cpu_stand_ins():
    """The CUDA kernels' saved sets on CPU (see the module's docstring)."""
    import torch
    import torch.nn.functional as Fn
    import torch.nn.attention.flex_attention as FA
    from torch._decomp import decompositions as DEC
    from torchtitan.models.common.attention import FlexAttention

    class FusedRMS(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, shape, weight, eps):
            y, rstd = torch.ops.aten._fused_rms_norm(x, list(shape), weight, eps)
            ctx.shape = list(shape)
            ctx.save_for_backward(x, weight, rstd)
            return y

        @staticmethod
        def backward(ctx, g):
            x, w, rstd = ctx.saved_tensors
            gx, gw = DEC._fused_rms_norm_backward(g, x, ctx.shape, rstd, w, [True, w is not None])
            return gx, None, gw, None

    Fn.rms_norm = lambda x, shape, weight=None, eps=None: FusedRMS.apply(x, shape, weight, eps)
    FA._validate_device = lambda *a: None
    FlexAttention._compiled_flex_attn = staticmethod(FA.flex_attention)
    hf = importlib.import_module("torch._higher_order_ops.flex_attention")
    real = hf.save_values_for_backward

    def no_max_scores(ctx, vals):
        vals = list(vals)
        vals[5] = vals[5].new_empty(0)  # max_scores
        return real(ctx, tuple(vals))
    hf.save_values_for_backward = no_max_scores


def compiled_flex_outputs():
    """The AOT forward graph's outputs for flex_attention (what inductor_compiled_code returns):
    True when they are out, q, k, v, lse and the mask's tensors, nothing else."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    got = []

    def fw(gm, _):
        out = [n for n in gm.graph.nodes if n.op == "output"][0]
        got.extend(out.args[0])
        return make_boxed_func(gm.forward)
    f = torch.compile(flex_attention, backend=aot_autograd(fw_compiler=fw, bw_compiler=lambda gm, _: make_boxed_func(gm.forward)))
    q = torch.randn(1, 4, 128, 16, requires_grad=True)
    k = torch.randn(1, 2, 128, 16, requires_grad=True)
    v = torch.randn(1, 2, 128, 16, requires_grad=True)
    m = create_block_mask(lambda b, h, i, j: i >= j, 1, None, 128, 128, device="cpu")
    f(q, k, v, block_mask=m, enable_gqa=True)[0].sum().backward()
    made = sorted(tuple(n.meta["val"].shape) for n in got if n.op != "placeholder")
    inputs = [tuple(n.meta["val"].shape) for n in got if n.op == "placeholder"]
    # out (the user's and the saved one) and lse; the inputs q, k, v, then the block mask's tensors
    # (one 128-token block: every dim 1)
    return (made == [(1, 4, 128), (1, 4, 128, 16), (1, 4, 128, 16)]
            and inputs[:3] == [(1, 4, 128, 16), (1, 2, 128, 16), (1, 2, 128, 16)]
            and all(max(sh) == 1 for sh in inputs[3:]))


def build_block(fused, swiglu=False):
    """swiglu: the block's FeedForward replaced by torchtitan's FusedSwiGLU (overrides/fused_swiglu.py:
    440-457, what its fused_swiglu override builds from the same FeedForward.Config, :486-505), its
    torchtitan::silu_and_mul given tests/titan/test_fused_plan.py's CPU kernel (the op is CUDA-only)."""
    import torch
    import torchtitan.models.llama3 as L3
    from torchtitan.models.common import ComplexRoPE
    cfg = L3._build_llama3_layers(n_layers=1, dim=D, n_heads=H, n_kv_heads=KVH, hidden_dim=F, fuse_qkv=fused,
                                  rope=ComplexRoPE.Config(dim=D // H, max_seq_len=4096, theta=500000, scaling="llama"),
                                  attn_backend="flex")[0]
    blk = cfg.build()
    if swiglu:
        import torchtitan.overrides.fused_swiglu as FS
        fc = cfg.feed_forward
        blk.feed_forward = FS.FusedSwiGLU(FS.FusedSwiGLU.Config(w1=fc.w1, w2=fc.w2, w3=fc.w3))
    blk = blk.to(torch.bfloat16)
    torch.manual_seed(0)
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return blk


def mask():
    from torch.nn.attention.flex_attention import create_block_mask
    return create_block_mask(lambda b, h, q, k: q >= k, B, None, S, S, device="cpu")


def excluded(blk, m):
    import torch
    s = {t.untyped_storage().data_ptr() for t in list(blk.parameters()) + list(blk.buffers())}
    s |= {t.untyped_storage().data_ptr() for t in m.as_tuple() if isinstance(t, torch.Tensor)}
    return s


def block_none(fused, wrap=None, swiglu=False):
    import torch
    blk, m = build_block(fused, swiglu), mask()
    if wrap:
        blk = wrap(blk)
    ex, seen = excluded(blk, m), {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in ex and st.nbytes() > 0:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t
    x = torch.randn(B, S, D, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = blk(x, m)
    out.float().sum().backward()
    return sum(seen.values())


def block_selective(fused, swiglu=False):
    import torch
    import torchtitan.distributed.activation_checkpoint as AC
    blk, m = build_block(fused, swiglu), mask()
    ex, saved, hold = excluded(blk, m), {}, []
    real = AC.create_selective_checkpoint_contexts

    def keep(t):
        # held, so that no later storage reuses the address of one the eager run frees (the
        # compiled region's q and k, which eager flex does not keep)
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
        w = AC.SelectiveAC(AC.SelectiveAC.Config())._wrap_block(blk, base_fqn="layers.0")
        x = torch.randn(B, S, D, dtype=torch.bfloat16, requires_grad=True)
        keep(x)  # the checkpoint keeps the block's input
        w(x, m).float().sum().backward()
    finally:
        AC.create_selective_checkpoint_contexts = real
    return sum(saved.values())


def full_outer():
    """Bytes an outer saved_tensors_hooks sees under FullAC: the checkpointed block's input alone."""
    import torchtitan.distributed.activation_checkpoint as AC
    return block_none(False, wrap=lambda b: AC.FullAC(AC.FullAC.Config())._wrap_block(b, base_fqn="layers.0"))


def loss_bytes(chunks, b, s, d, V):
    """(live after the loss call, the most the loss adds over it) for the final norm + lm_head + loss."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

    class Live(TorchDispatchMode):
        def __init__(self, skip):
            super().__init__()
            self.skip, self.seen, self.refs, self.cur, self.peak = skip, WeakIdKeyDictionary(), [], 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    st = t.untyped_storage()
                    if st not in self.seen and st.data_ptr() not in self.skip():
                        n = st.nbytes()
                        self.seen[st] = n
                        self.cur += n
                        self.refs.append(weakref.ref(st, lambda _, n=n: self._gone(n)))
            self.peak = max(self.peak, self.cur)
            return out

        def _gone(self, n):
            self.cur -= n

    torch.manual_seed(0)
    norm = torch.nn.RMSNorm(d).to(torch.bfloat16)
    head = torch.nn.Linear(d, V, bias=False).to(torch.bfloat16)
    x = torch.randn(b, s, d, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (b, s))
    fixed = {t.untyped_storage().data_ptr() for t in (norm.weight, head.weight, labels)}

    def skip():  # parameters, labels and the weight's gradient (FSDP's unsharded gradient, not an activation)
        g = head.weight.grad
        return fixed | ({g.untyped_storage().data_ptr()} if g is not None else set())
    if chunks > 1:
        loss_fn = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=chunks))
        loss_fn.set_lm_head(head)
    else:
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
    with Live(skip) as live:
        pred = norm(x) if chunks > 1 else head(norm(x))
        loss, _ = loss_fn(pred, labels)
        del pred
        after = live.cur
        g = head.weight.grad  # the chunks' lm_head gradient, made before skip() could name it
        if g is not None and g.untyped_storage() in live.seen:
            after -= g.untyped_storage().nbytes()
        loss.backward()
    # the norm's input (the last block's output) is x, made outside: counted as the model counts it
    # (the peak is in a later chunk's backward, the gradient held there too: the difference is the loss's)
    return after + 2 * x.numel(), live.peak - after - (g.untyped_storage().nbytes() if g is not None else 0)


def main():
    E.need_titan(NAME)
    import warnings
    warnings.filterwarnings("ignore")
    cpu_stand_ins()
    from test_fused_plan import cpu_silu_and_mul
    cpu_silu_and_mul()
    bad = n = 0

    def check(what, got, want):
        nonlocal bad, n
        n += 1
        bad += got != want
        print("%s: torch %d bytes, llama_acts %d%s" % (what, got, want, "" if got == want else "  MISMATCH"))
    n += 1
    if compiled_flex_outputs():
        print("compiled flex_attention's forward graph returns out, lse, q, k, v (and the mask): counted under SAC")
    else:
        bad += 1
        print("compiled flex_attention's forward graph outputs differ from out, lse, q, k, v  MISMATCH")
    for fused in (False, True):
        none, sel, full = lua_block(fused)
        what = "llama3 block (%s qkv)" % ("fused" if fused else "unfused")
        check(what + ", none", block_none(fused), none)
        check(what + ", selective", block_selective(fused), sel)
    # issue 41 (hpp): model.fused "swiglu", torchtitan's FusedSwiGLU in the same block
    for fused in (False, True):
        none, sel, _ = lua_block(fused, swiglu=True)
        what = "llama3 block (%s qkv, fused SwiGLU w13)" % ("fused" if fused else "unfused")
        check(what + ", none", block_none(fused, swiglu=True), none)
        check(what + ", selective", block_selective(fused, swiglu=True), sel)
    check("llama3 block, full (FullAC: an outer hook sees the checkpoint's input alone)", full_outer(), full)
    for chunks, b in ((1, 2), (2, 2), (8, 2), (8, 1)):
        s = 256 // b
        want = lua_head(b * s, D, 1000, chunks, b)
        got = loss_bytes(chunks, b, s, D, 1000)
        what = "loss (%s, %d x %d tokens)" % ("CrossEntropyLoss" if chunks == 1 else
                                               "ChunkedLossWrapper, %d chunks" % chunks, b, s)
        check(what + ", saved", got[0], want[0])
        check(what + ", peak", got[1], want[1])
    print("llama_acts: %d cases, %d equal, %d differ" % (n, n - bad, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
