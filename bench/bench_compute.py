#!/usr/bin/env python3
"""Re-measure gen/kernel_tables.lua on this GPU (issue 37, item 2).

Times, with CUDA events, what commplan's compute model prices
(gen/gemm_model.lua, gen/unit_time.lua):

  gemm       torch.mm in bf16 over a grid of shapes, and torch._scaled_mm in
             float8 (e4m3) with one scale per tensor (tensorwise) and one per
             row (rowwise): emax (the best large shape's fraction of the
             dtype's peak), k_half (the K at which a large M x N GEMM reaches
             half of emax, from a K sweep), rowwise_gemm (rowwise / tensorwise)
  attention  torch SDPA (flash backend), causal, head dims 64 and 128,
             sequence lengths 512 .. 16384: fwd and bwd (fractions of the
             bf16 peak at the longest sequence), s_half, head_dim factors
  hbm        a device copy's rate (read + write), GB/s: topology.hbm_GBps

and writes the preset's entry in gen/kernel_tables.lua's shape (a Lua table)
to --out, with the measured figures and what they were measured on. Review
it, then replace the preset's entry in gen/kernel_tables.lua (generation
reads committed files only, so a measurement enters by a commit).

  python bench/bench_compute.py --preset h200 --peak-tflops 989 --out bench/calibration/kernels_h200.lua
  python bench/bench_compute.py --cpu-smoke --out /tmp/kernels.lua    # the script's own check, no GPU

--peak-tflops is the dense BF16 peak the fractions are of (the preset's
gpu_TFLOPS); FP8's is --fp8-ratio x it (2 on Hopper and Blackwell).
"""
import argparse
import datetime
import math
import sys

import torch
import torch.nn.functional as F


def timed(fn, iters, device):
    """Median seconds of fn() over iters runs (after two warm-ups)."""
    for _ in range(2):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    else:
        import time
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def gemm_rate(M, N, K, dtype, device, iters, rowwise=False):
    """FLOP/s of an M x K by K x N GEMM: bf16 (torch.mm) or fp8 (torch._scaled_mm)."""
    if dtype == "bf16":
        a = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        b = torch.randn(K, N, device=device, dtype=torch.bfloat16)
        fn = lambda: torch.mm(a, b)  # noqa: E731
    else:
        a = torch.randn(M, K, device=device).to(torch.float8_e4m3fn)
        # _scaled_mm takes the second operand column-major
        b = torch.randn(N, K, device=device).to(torch.float8_e4m3fn).t()
        if rowwise:
            sa = torch.ones(M, 1, device=device, dtype=torch.float32)
            sb = torch.ones(1, N, device=device, dtype=torch.float32)
        else:
            sa = torch.ones((), device=device, dtype=torch.float32)
            sb = torch.ones((), device=device, dtype=torch.float32)
        fn = lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
    return 2 * M * N * K / timed(fn, iters, device)


def attention_rates(seq, hd, heads, device, iters):
    """FLOP/s of causal SDPA forward and backward (the FLOPs gen/gemm_model.lua counts)."""
    b = max(1, 16384 // seq)
    q, k, v = (torch.randn(b, heads, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    flops = 4 * b * seq * seq * hd * heads / 2
    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), iters, device)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn_like(out)

    def both():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(g)

    total = timed(both, iters, device)
    return flops / fwd, 2.5 * flops / max(total - fwd, 1e-9)


def copy_rate(device, iters, n):
    x = torch.empty(n, device=device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return 2 * 2 * n / timed(lambda: y.copy_(x), iters, device)


def fit_half(xs, effs):
    """x_half in eff = emax * x / (x + x_half), from the largest x's eff as emax."""
    emax = effs[-1] * (xs[-1] + 256) / xs[-1]  # (first guess, refined below)
    best, best_err = 256, math.inf
    for h in [2 ** i for i in range(4, 13)] + [96, 192, 384, 768]:
        e = effs[-1] * (xs[-1] + h) / xs[-1]
        err = sum((e * x / (x + h) - y) ** 2 for x, y in zip(xs, effs))
        if err < best_err:
            best, best_err, emax = h, err, e
    return best, emax


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h100")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--fp8-ratio", type=float, default=2.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes on the CPU (bf16 only): checks the script and its output, measures nothing")
    o = ap.parse_args()
    device = "cpu" if o.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_compute: no CUDA device (use --cpu-smoke to check the script itself)")
    peak = o.peak_tflops * 1e12
    big = 256 if o.cpu_smoke else 8192
    iters = 3 if o.cpu_smoke else o.iters
    sms = 1 if o.cpu_smoke else torch.cuda.get_device_properties(0).multi_processor_count

    # GEMM: emax at the largest shape, k_half from a K sweep at M = N = big
    ks = [big // 16, big // 8, big // 4, big // 2, big]
    effs = [gemm_rate(big, big, k, "bf16", device, iters) / peak for k in ks]
    k_half, emax = fit_half(ks, effs)
    gemm = {"bf16": {"emax": emax, "k_half": k_half}}
    rowwise = 0.0
    if not o.cpu_smoke and o.fp8_ratio > 0:
        fp8_peak = peak * o.fp8_ratio
        effs8 = [gemm_rate(big, big, k, "fp8", device, iters) / fp8_peak for k in ks]
        k8, e8 = fit_half(ks, effs8)
        gemm["fp8"] = {"emax": e8, "k_half": k8}
        rowwise = gemm_rate(big, big, big, "fp8", device, iters, rowwise=True) / (effs8[-1] * fp8_peak)

    # attention: causal SDPA, head dims 64 and 128
    seqs = [128, 256] if o.cpu_smoke else [512, 1024, 2048, 4096, 8192, 16384]
    heads = 2 if o.cpu_smoke else 16
    by_hd = {}
    for hd in ([64] if o.cpu_smoke else [64, 128]):
        by_hd[hd] = [attention_rates(s, hd, heads, device, iters) for s in seqs]
    ref = by_hd.get(128, by_hd[64])
    s_half, fwd = fit_half(seqs, [r[0] / peak for r in ref])
    _, bwd = fit_half(seqs, [r[1] / peak for r in ref])
    head_dim = {hd: (rates[-1][0] / ref[-1][0]) for hd, rates in by_hd.items()}

    hbm = copy_rate(device, iters, (1 << 16) if o.cpu_smoke else (1 << 30)) / 1e9

    name = "cpu (smoke: not a measurement)" if o.cpu_smoke else torch.cuda.get_device_name(0)
    lines = [
        "-- gen/kernel_tables.lua entry measured by bench/bench_compute.py",
        "-- on %s, torch %s, %s UTC; peak %g TFLOPS bf16 (x %g fp8)" % (
            name, torch.__version__, datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), o.peak_tflops,
            o.fp8_ratio),
        "-- measured hbm (device copy, read + write): %.0f GB/s (topology.hbm_GBps)" % hbm,
        "return {",
        "  sms = %d, fp8 = %g," % (sms, o.fp8_ratio if "fp8" in gemm else 0),
        "  gemm = { bf16 = { emax = %.3f, k_half = %d, tile = { 128, 256 } }%s }," % (
            gemm["bf16"]["emax"], gemm["bf16"]["k_half"],
            (", fp8 = { emax = %.3f, k_half = %d, tile = { 128, 256 } }" % (gemm["fp8"]["emax"], gemm["fp8"]["k_half"]))
            if "fp8" in gemm else ""),
        "  rowwise_gemm = %.3f," % rowwise,
        "  attention = { fwd = %.3f, bwd = %.3f, s_half = %d, head_dim = { %s } }," % (
            fwd, bwd, s_half, ", ".join("[%d] = %.2f" % (hd, f) for hd, f in sorted(head_dim.items()))),
        "  -- elementwise: gen/kernel_tables.lua's counted bytes (not measured here)",
        "}",
    ]
    with open(o.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
