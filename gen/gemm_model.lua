-- Kernel prices from shapes (issue 37, item 2): microseconds of one GEMM
-- (M x K by K x N), of FlashAttention over a sequence, and of memory-bound
-- work, on a GPU given by its rates (gen/compute.lua's settings: dense BF16
-- peak gpu_TFLOPS, hbm_GBps) and its kernel table (gen/kernel_tables.lua,
-- by preset). Pure functions of numbers.
--
-- A GEMM runs at the dtype's peak x emax, less what its shape wastes:
--   tiles      the output is cut into tile x tile blocks (the better of
--              the two orientations); a partial tile computes a whole one
--   waves      the tiles run sms at a time; the last wave's idle SMs
--   K          each tile's main loop over K has a fixed prologue and
--              epilogue: K / (K + k_half)
-- and never faster than its operands and output cross HBM once (the
-- roofline: a GEMM with a small M, N or K is memory-bound).
local tables = require("gen.kernel_tables")

local gemm_model = {}

local function ceil_div(a, b) return (a + b - 1) // b end

-- The kernel table of a preset.
function gemm_model.table(preset)
  return tables[preset] or tables.h100
end

-- FLOPs per microsecond of a large GEMM in dtype: what a matmul known only
-- by its FLOPs runs at (async TP's fused matmuls, a generic unit's other
-- parameters).
function gemm_model.large_rate(kt, TFLOPS, dtype)
  local g = kt.gemm[dtype] or kt.gemm.bf16
  return TFLOPS * 1e6 * (kt.clock or 1) * (dtype == "fp8" and kt.fp8 or 1) * g.emax
end

-- The fraction of the dtype's peak a GEMM of this shape reaches (the
-- roofline aside).
function gemm_model.efficiency(kt, M, N, K, dtype)
  local g = kt.gemm[dtype] or kt.gemm.bf16
  local best = 0
  for _, o in ipairs({ { g.tile[1], g.tile[2] }, { g.tile[2], g.tile[1] } }) do
    local tm, tn = o[1], o[2]
    local tiles = ceil_div(M, tm) * ceil_div(N, tn)
    local waves = ceil_div(tiles, kt.sms)
    local e = (M * N) / (waves * kt.sms * tm * tn)
    if e > best then best = e end
  end
  return g.emax * best * K / (K + g.k_half)
end

-- The microseconds of an M x N x K GEMM: dtype "bf16" or "fp8" (its
-- operands' bytes; the output is bf16), rows_scaled: float8 rowwise's
-- scaled GEMM. rates = { TFLOPS (dense BF16 peak), hbm_GBps }.
function gemm_model.gemm_us(kt, rates, M, N, K, dtype, rows_scaled)
  if M <= 0 or N <= 0 or K <= 0 then return 0 end
  local peak = rates.TFLOPS * (kt.clock or 1) * (dtype == "fp8" and kt.fp8 or 1)
  local eff = gemm_model.efficiency(kt, M, N, K, dtype)
  if rows_scaled then eff = eff * kt.rowwise_gemm end
  local es = dtype == "fp8" and 1 or 2
  local compute_us = 2 * M * N * K / (peak * 1e6 * eff)
  local memory_us = (es * (M * K + K * N) + 2 * M * N) / (rates.hbm_GBps * 1e3)
  return math.max(compute_us, memory_us)
end

-- FlashAttention's efficiency (of the BF16 peak) for a pass over
-- sequences of seq tokens with head dim hd.
function gemm_model.attention_efficiency(kt, pass, seq, hd)
  local a = kt.attention
  local f = a.head_dim[hd]
  if not f then
    -- (another head dim: the nearest tabled one's factor)
    local best, dist = 1, math.huge
    for d, v in pairs(a.head_dim) do
      local dd = math.abs(d - hd)
      if dd < dist or (dd == dist and d < hd) then best, dist = v, dd end
    end
    f = best
  end
  return a[pass] * f * seq / (seq + a.s_half)
end

-- The microseconds of attention: q_tokens queries, each over kv_len keys
-- (a sequence's; causal: half the score matrix), heads local heads of
-- head dim hd: the forward's FLOPs (QK^T and AV: 4 x kv_len x hd per query
-- and head) and the backward's (2.5 x: five matmuls to the forward's two),
-- each at its efficiency. Returns fwd_us, bwd_us, fwd_flops.
function gemm_model.attention_us(kt, rates, q_tokens, kv_len, heads, hd, causal)
  local flops = 4 * q_tokens * kv_len * hd * heads
  if causal then flops = flops / 2 end
  local peak = rates.TFLOPS * (kt.clock or 1) * 1e6
  local fwd = flops / (peak * gemm_model.attention_efficiency(kt, "fwd", kv_len, hd))
  local bwd = 2.5 * flops / (peak * gemm_model.attention_efficiency(kt, "bwd", kv_len, hd))
  return fwd, bwd, flops
end

-- Bytes across HBM, in microseconds.
function gemm_model.bytes_us(rates, bytes)
  return bytes / (rates.hbm_GBps * 1e3)
end

return gemm_model
