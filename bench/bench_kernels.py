#!/usr/bin/env python3
"""commplan's generated copy kernels against PyTorch FSDP2's own ops, in one
process on one GPU, on identical shapes and data: one Llama-3-70B decoder
layer at W = 8 and W = 64, bf16 and fp32.

  copy-out   torch.split_with_sizes_copy   vs  <plan>_kernel_launch(COPY_OUT)
  packing    torch._chunk_cat              vs  <plan>_kernel_launch(PACK)
  copy-in    torch._foreach_copy_          vs  <plan>_kernel_launch(COPY_IN)
  view-out   Tensor.copy_ / Tensor.add_    vs  <plan>_kernel_launch(VIEW_OUT / VIEW_OUT_ADD)
             (FSDP2 views the reduce-scatter output as the sharded grads on a
             first reduction and adds it into them on later ones; commplan
             copies or adds it into its own sharded-grads buffer)
  ceiling    best of cudaMemcpyAsync (tensor.copy_) of 1 and 2 GiB and a
             plain vectorized copy kernel (commplan's copy-in of a 1 GiB
             single-parameter plan); bytes read + written.

Every result is checked for equality with PyTorch's before it is timed.
Run from the repository root on the GPU machine:  python3 bench/bench_kernels.py
"""
import ctypes
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "bench")
COPY_IN, COPY_OUT, PACK, VIEW_OUT, VIEW_OUT_ADD = 0, 1, 2, 3, 4
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(name, plan_text):
    os.makedirs(os.path.join(WORK, "plans"), exist_ok=True)
    path = os.path.join(WORK, "plans", name + ".lua")
    with open(path, "w") as f:
        f.write(plan_text)
    out = os.path.join(WORK, name)
    subprocess.run(["make", "-s", "PLAN=" + path, "OUT=" + out, "build/%s/lib%s.so" % (name, name)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    lib = ctypes.CDLL(os.path.join(ROOT, "build", name, "lib%s.so" % name))
    fn = getattr(lib, name + "_kernel_launch")
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    with open(os.path.join(out, "plan.json")) as f:
        return fn, json.load(f)


def launcher(fn, op, unit, a, b):
    stream = torch.cuda.current_stream().cuda_stream
    def go():
        rc = fn(op, unit, 0, a.data_ptr(), b.data_ptr(), stream)
        if rc != 0:
            raise RuntimeError("kernel launch failed: cudaError %d" % rc)
    return go


def time_us(f, iters=50, repeats=5):
    """Best of `repeats` means over `iters` back-to-back launches."""
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            f()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) * 1000.0 / iters)
    return best


def ceiling():
    best = 0.0
    for gib in (1, 2):
        n = gib * (1 << 30) // 4
        x, y = torch.empty(n, device="cuda"), torch.randn(n, device="cuda")
        us = time_us(lambda: x.copy_(y), iters=10)
        best = max(best, 2 * n * 4 / (us * 1e3))
        del x, y
    fn, _ = build("bench_copy1g", "return { world_size = 1, model = { units = { { name = 'root', params = { "
                  "{ name = 'x', shape = { %d } } } } } } }" % ((1 << 30) // 4))
    n = (1 << 30) // 4
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    us = time_us(launcher(fn, COPY_IN, 0, src, dst), iters=10)
    assert torch.equal(src, dst), "plain copy kernel wrong"
    return max(best, 2 * n * 4 / (us * 1e3))


def layer_plan(W, dtype):
    if dtype == "mixed":  # FSDP2's usual MixedPrecisionPolicy: fp32 shards, bf16 all-gather, fp32 reduce
        return ("return { world_size = %d, parallel = { dp_shard = -1 }, model = { family = 'llama', size = '70b', "
                "n_layers = 1, dtype = 'fp32' }, fsdp = { param_dtype = 'bf16', reduce_dtype = 'fp32' } }" % W)
    return ("return { world_size = %d, parallel = { dp_shard = -1 }, model = { family = 'llama', size = '70b', "
            "n_layers = 1, dtype = '%s' } }" % (W, dtype))


def bench_layer(W, dtype, ceil_gbs, rows):
    name = "bench_l70b_w%d_%s" % (W, dtype)
    fn, plan = build(name, layer_plan(W, dtype))
    unit = next(u for u in plan["units"] if u["name"] == "layers.0")
    ui, total = unit["index"], unit["slot_numel"]
    mixed = dtype == "mixed"
    t = torch.bfloat16 if mixed else DT[dtype]        # all-gather / unsharded dtype
    t_red = torch.float32 if mixed else t             # reduce-scatter dtype
    t_orig = torch.float32 if mixed else t            # sharded dtype
    params = unit["params"]
    padded = [p["padded_numel"] for p in params]
    g = torch.Generator(device="cuda").manual_seed(0)

    # copy-out: (W, total) -> per-parameter (W, padded)
    ag = torch.randn(W * total, device="cuda", generator=g).to(t)
    outs = [torch.empty(W * n, device="cuda", dtype=t) for n in padded]
    ours = torch.empty(W * total, device="cuda", dtype=t)
    torch_f = lambda: torch.split_with_sizes_copy(ag.view(W, total), padded, dim=1,
                                                  out=[o.view(W, n) for o, n in zip(outs, padded)])
    ours_f = launcher(fn, COPY_OUT, ui, ag, ours)
    torch_f(); ours_f(); torch.cuda.synchronize()
    for p, o in zip(params, outs):
        assert torch.equal(ours[W * p["offset"]: W * (p["offset"] + p["padded_numel"])], o), "copy-out differs"
    if not mixed:  # mixed precision's copy-out is the bf16 row
        rows.append(("copy-out", W, dtype, 2 * W * total * ag.element_size(), time_us(torch_f), time_us(ours_f)))
    del ag, outs, ours

    # packing: grads -> (W, total) with zero padding
    gbuf = torch.randn(unit["grads_numel"], device="cuda", generator=g).to(t)
    grads = [gbuf[p["grad_offset"]: p["grad_offset"] + p["numel"]].view(p["shape"]) for p in params]
    rs_t = torch.empty(W * total, device="cuda", dtype=t_red)
    rs_o = torch.empty(W * total, device="cuda", dtype=t_red)
    torch_f = lambda: torch._chunk_cat(grads, dim=0, num_chunks=W, out=rs_t.view(W, total))
    ours_f = launcher(fn, PACK, ui, gbuf, rs_o)
    try:
        torch_f()
    except RuntimeError:  # no cast inside _chunk_cat: cast each grad first, as a caller would
        torch_f = lambda: torch._chunk_cat([x.to(t_red) for x in grads], dim=0, num_chunks=W,
                                           out=rs_t.view(W, total))
        torch_f()
    ours_f(); torch.cuda.synchronize()
    assert torch.equal(rs_t, rs_o), "packing differs"
    numel = sum(p["numel"] for p in params)
    rows.append(("pack", W, "bf16>fp32" if mixed else dtype,
                 numel * gbuf.element_size() + W * total * rs_o.element_size(), time_us(torch_f), time_us(ours_f)))
    del gbuf, grads, rs_t, rs_o

    # copy-in: padded shards -> this rank's slot
    shard = torch.randn(total, device="cuda", generator=g).to(t_orig)
    shards = list(torch.split(shard, padded))
    ag_t = torch.empty(W * total, device="cuda", dtype=t)
    ag_o = torch.empty(W * total, device="cuda", dtype=t)
    slot = list(torch.split(ag_t[:total], padded))
    torch_f = lambda: torch._foreach_copy_(slot, shards)
    ours_f = launcher(fn, COPY_IN, ui, shard, ag_o)
    torch_f(); ours_f(); torch.cuda.synchronize()
    assert torch.equal(ag_t[:total], ag_o[:total]), "copy-in differs"
    rows.append(("copy-in", W, "fp32>bf16" if mixed else dtype,
                 total * (shard.element_size() + ag_o.element_size()), time_us(torch_f), time_us(ours_f)))
    del shard, shards, ag_t, ag_o, slot

    # view-out: the reduce-scatter output (total, reduce dtype) -> the sharded grads (orig dtype);
    # a step measured 7-9x the model's time for it (bench/RESULTS.md, fifth session)
    rs = torch.randn(total, device="cuda", generator=g).to(t_red)
    for op, name in ((VIEW_OUT, "view-out"), (VIEW_OUT_ADD, "view-out (add)")):
        base = torch.randn(total, device="cuda", generator=g).to(t_orig)
        sg_t, sg_o = base.clone(), base.clone()
        torch_f = (lambda: sg_t.copy_(rs)) if op == VIEW_OUT else (lambda: sg_t.add_(rs))
        ours_f = launcher(fn, op, ui, rs, sg_o)
        torch_f(); ours_f(); torch.cuda.synchronize()
        if op == VIEW_OUT:
            assert torch.equal(sg_t, sg_o), "view-out differs"
        else:  # one add each: the same sums
            assert torch.equal(sg_t, sg_o), "view-out (add) differs"
        nbytes = total * (rs.element_size() + (1 if op == VIEW_OUT else 2) * sg_o.element_size())
        rows.append((name, W, "fp32" if mixed else dtype, nbytes, time_us(torch_f), time_us(ours_f)))
        del base, sg_t, sg_o


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    ceil_gbs = ceiling()
    rows = []
    for W in (8, 64):
        for dtype in ("bf16", "fp32", "mixed"):
            bench_layer(W, dtype, ceil_gbs, rows)
    print("# %s, torch %s; ceiling %.0f GB/s (best device-to-device copy, read + write)"
          % (torch.cuda.get_device_name(), torch.__version__, ceil_gbs))
    print("| op | W | dtype (in>out) | MB moved | PyTorch us | commplan us | PyTorch GB/s | commplan GB/s | "
          "commplan % of ceiling | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for op, W, dtype, nbytes, t_us, o_us in rows:
        print("| %s | %d | %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f%% | %.2fx |" % (
            op, W, dtype, nbytes / 1e6, t_us, o_us, nbytes / (t_us * 1e3), nbytes / (o_us * 1e3),
            100.0 * nbytes / (o_us * 1e3) / ceil_gbs, t_us / o_us))
    return 0


if __name__ == "__main__":
    sys.exit(main())
