-- The kernel efficiency tables gen/gemm_model.lua prices compute with, per
-- GPU preset (gen/hardware.lua's names). Data only: bench/bench_compute.py
-- re-measures them on a GPU and writes a table of this shape (its output
-- replaces a preset's entry; the sources below are the published figures
-- this file holds until then).
--
--   sms            streaming multiprocessors (GEMM tiles run one wave per SM)
--   clock          the tensor cores' sustained rate under the GPU's power
--                  limit, a fraction of the preset's peak (default 1)
--   fp8            dense FP8 tensor-core peak / the dense BF16 peak (0: none)
--   gemm[dtype]    emax: the large-GEMM fraction of that dtype's peak;
--                  k_half: the K at which the main loop reaches half of it
--                  (prologue and epilogue per tile); tile: the output tile
--                  (rows x cols, either orientation)
--   attention      FlashAttention-2 (torch SDPA's flash backend), causal, as
--                  fractions of the BF16 peak at long sequences (fwd, bwd),
--                  s_half: the sequence length at which it reaches half;
--                  head_dim: the factor per head dim
--   rowwise_gemm   float8 rowwise scaling's GEMM (torch._scaled_mm with a
--                  scale per row: CUTLASS, not cuBLAS) as a fraction of the
--                  tensorwise one
--   elementwise    bytes moved per element of each memory-bound op of a
--                  transformer block (forward; the backward moves
--                  bwd_factor x as many), eager (one kernel per aten op)
--                  and compiled (torch.compile's inductor fuses each chain
--                  into one kernel: read the inputs once, write the output
--                  once)
--
-- Sources (H100 SXM; the H200's GEMMs and kernels are the H100's, its HBM
-- faster; B200 and A100 from their own figures where given). Which figures
-- are measured elsewhere and which are this model's assumptions:
--   GEMM, bf16 (measured elsewhere): stas00/ml-engineering, compute/
--     accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
--     table": H100 SXM 792.1 of 989 TFLOPS (80.1%), A100 SXM 267.9 of 312
--     (85.9%), GH200 821.0 of 989 (83.0%): emax.
--   GEMM, fp8 (assumed): 0.72 of the FP8 peak (1.8x a bf16 GEMM's rate);
--     k_half (assumed): 256 bf16, 256 fp8. Held only by the published
--     float8 rows (tests/compute_rows.lua); bench/bench_compute.py measures
--     both on a GPU.
--   Attention (measured elsewhere): Shah et al., FlashAttention-3
--     (arXiv:2407.08608), Figures 5-7: FlashAttention-2 (torch SDPA's flash
--     backend) on H100 SXM5, head dim 128, causal: roughly 330-370 TFLOPS
--     forward and 280-310 backward at 8k-16k tokens, about half of that at
--     512; head dim 64 about 0.8 of 128. A100: FlashAttention-2 (Dao,
--     arXiv:2307.08691), Figure 5: ~70% of the peak forward, ~60% backward.
--   Rowwise (assumed, 0.65): torchao's rowwise scaled GEMM (CUTLASS) below
--     cuBLAS's tensorwise one; torchtitan's asyncTP study (benchmarks/
--     asyncTP_llama3_h100_2025-06_torchtitan.md) has vanilla TP float8
--     rowwise below bf16 (its note: pytorch/torchtitan issue 1207).
--   Elementwise (counted): the ops torchtitan's Llama block runs (models/
--     common rmsnorm, rope, feed_forward): eager RMSNorm upcasts to fp32
--     and runs pow, mean, rsqrt, mul, type_as and the weight's mul (~30
--     bytes per element, with the residual add 36); RoPE through complex
--     fp32 (~24); SwiGLU's silu and mul (10 per hidden element); compiled,
--     each chain reads and writes once.
--   clock (fitted, one figure for the preset): the Grand Teton H100 at
--     500 W; NVIDIA publishes no sustained tensor-core rate at that limit
--     and torchtitan's benchmark says it does not know its peak (benchmarks/
--     llama3_h100_202412_torchtitan.md, footnote 2). 0.72 is the one value
--     chosen against the 18 published rows together (tests/compute_rows.lua),
--     no row fitted on its own.
local T = {}

local ELEMENTWISE = {
  -- per element of: the residual stream (norm + residual add, twice a
  -- block, on the rank's seq / tp tokens), q and k (RoPE), the FFN hidden
  -- (SwiGLU), the attention output (its transpose copy), and the logits
  -- (cross-entropy, fp32)
  eager = { norm = 36, rope = 24, swiglu = 10, attn_out = 4, logits = 40 },
  compiled = { norm = 8, rope = 4, swiglu = 6, attn_out = 4, logits = 12 },
  bwd_factor = 2,
}

local function h100_like(sms)
  return {
    sms = sms, fp8 = 2,
    gemm = { bf16 = { emax = 0.80, k_half = 256, tile = { 128, 256 } },
             fp8 = { emax = 0.72, k_half = 256, tile = { 128, 256 } } },
    rowwise_gemm = 0.65,
    attention = { fwd = 0.35, bwd = 0.30, s_half = 512, head_dim = { [64] = 0.8, [128] = 1.0, [256] = 0.95 } },
    elementwise = ELEMENTWISE,
  }
end

T.h100 = h100_like(132)
T.h200 = h100_like(132)
-- the Grand Teton H100 (96 GB HBM2e, 500 W): the H100's kernels, its tensor
-- cores at the clock the 500 W limit sustains (clock, below)
T.h100_hbm2e = h100_like(132)
T.h100_hbm2e.clock = 0.72
T.b200 = {
  sms = 148, fp8 = 2,
  gemm = { bf16 = { emax = 0.75, k_half = 128, tile = { 256, 256 } },
           fp8 = { emax = 0.66, k_half = 256, tile = { 256, 256 } } },
  rowwise_gemm = 0.85,
  attention = { fwd = 0.30, bwd = 0.25, s_half = 512, head_dim = { [64] = 0.8, [128] = 1.0, [256] = 0.95 } },
  elementwise = ELEMENTWISE,
}
T.a100 = {
  sms = 108, fp8 = 0,
  gemm = { bf16 = { emax = 0.86, k_half = 128, tile = { 128, 256 } } },
  rowwise_gemm = 0,
  -- FlashAttention-2 paper (Dao, arXiv:2307.08691), Figure 5: ~70% of the A100's peak forward
  -- at long sequences, ~60% backward (head dim 128)
  attention = { fwd = 0.65, bwd = 0.55, s_half = 512, head_dim = { [64] = 0.85, [128] = 1.0, [256] = 0.95 } },
  elementwise = ELEMENTWISE,
}

return T
