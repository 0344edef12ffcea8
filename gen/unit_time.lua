-- A unit's compute time from its shapes (issue 37, item 2): its forward,
-- backward and recompute microseconds per micro-step, from the work
-- gen/compute.lua describes (spec below), priced by gen/gemm_model.lua.
--
-- spec = {
--   T          the tokens its matmuls see (a micro-step's, on this rank)
--   linears    { out, in, fp8 (a float8 Linear), again (selective AC
--              recomputes its forward matmul), frozen (requires_grad=False:
--              no dW) } per weight, TP-local: the forward Y = X W^T (T x
--              out x in), the backward's dX (T x in x out) and dW (out x in
--              x T)
--   attention  { q_tokens, kv_len, heads, hd } (causal) or nil
--   elems      { norm, rope, swiglu, attn_out, logits }: elements per
--              micro-step each memory-bound op touches (the kernel table's
--              bytes per element, eager or compiled)
--   flops      FLOPs of anything else, at a large bf16 GEMM's rate
--   bytes      bytes of other memory-bound work per micro-step (an MoE's
--              router, permutation and combine), at HBM speed
--   recompute  "none" | "selective" | "full": what the backward reruns
-- }
--
-- Float8 (torchao's Float8Linear as torchtitan converts the blocks'
-- linears; the output projection stays bf16): the three GEMMs at FP8 peak
-- (rowwise's at its scaled kernel's efficiency; rowwise_with_gw_hp's dW in
-- bf16), plus the casts: each operand's absolute max read and its fp8 copy
-- written (5 bytes per bf16 element, read twice and written once):
--   tensorwise  X and W in forward, dY in backward, and the fp8 X^T and
--               W^T copies (2 bytes per element) the backward's GEMMs take
--   rowwise     X, W, dY each scaled along both axes (forward's rows and
--               backward's columns): twice tensorwise's casts
-- eager runs each cast as separate amax, scale and cast kernels (x 2).
local gemm_model = require("gen.gemm_model")

local unit_time = {}

local CAST = 5   -- bytes per bf16 element of an amax + cast to fp8
local TRANSPOSE = 2 -- bytes per element of an fp8 transposed copy

-- The bytes float8's casts move for one linear per micro-step: forward, backward.
local function cast_bytes(recipe, T, out, inn)
  local x, w, dy = T * inn, out * inn, T * out
  if recipe == "tensorwise" then
    return CAST * (x + w), CAST * dy + TRANSPOSE * (x + w)
  elseif recipe == "rowwise" then
    return CAST * (x + w), CAST * (2 * dy + w + x)
  end
  -- rowwise_with_gw_hp: dW in bf16, so no column-scaled X or dY
  return CAST * (x + w), CAST * (dy + w)
end

-- fwd_us, bwd_us, recompute_us of a unit described by spec, under settings s,
-- and bwd_w_us: the backward's weight-gradient part (the dW GEMMs and the
-- other FLOPs' third: zero bubble's W, gen/compute.lua backward_us).
function unit_time.of(s, spec)
  local kt, rates = s.kernels, { TFLOPS = s.gpu_TFLOPS, hbm_GBps = s.hbm_GBps }
  local recipe = s.float8
  local ew = s.compile and kt.elementwise.compiled or kt.elementwise.eager
  local cast_factor = s.compile and 1 or 2
  local T = spec.T
  local fwd, bwd, again, wgrad = 0, 0, 0, 0
  local cast_f, cast_b = 0, 0
  for _, l in ipairs(spec.linears or {}) do
    local f8 = l.fp8 and recipe ~= "none"
    local dt = f8 and "fp8" or "bf16"
    local rows = f8 and recipe ~= "tensorwise"
    local y = gemm_model.gemm_us(kt, rates, T, l.out, l["in"], dt, rows)
    local dx = gemm_model.gemm_us(kt, rates, T, l["in"], l.out, dt, rows)
    local wdt = (f8 and recipe == "rowwise_with_gw_hp") and "bf16" or dt
    -- (a frozen weight, requires_grad=False: no weight gradient, the input's alone)
    local dw = l.frozen and 0 or gemm_model.gemm_us(kt, rates, l.out, l["in"], T, wdt, rows and wdt == "fp8")
    fwd, bwd, wgrad = fwd + y, bwd + dx + dw, wgrad + dw
    if l.again then again = again + y end
    if f8 then
      local cf, cb = cast_bytes(recipe, T, l.out, l["in"])
      cast_f, cast_b = cast_f + cf * cast_factor, cast_b + cb * cast_factor
    end
  end
  local a = spec.attention
  local attn_f, attn_b = 0, 0
  if a then
    attn_f, attn_b = gemm_model.attention_us(kt, rates, a.q_tokens, a.kv_len, a.heads, a.hd, true)
  end
  local e = spec.elems or {}
  local bytes = (e.norm or 0) * ew.norm + (e.rope or 0) * ew.rope + (e.swiglu or 0) * ew.swiglu
    + (e.attn_out or 0) * ew.attn_out + (spec.bytes or 0)
  local mem_f = gemm_model.bytes_us(rates, bytes)
  local mem_b = mem_f * kt.elementwise.bwd_factor
  -- the cross-entropy's passes over the logits: half in forward, half in backward
  local logits = gemm_model.bytes_us(rates, (e.logits or 0) * ew.logits)
  local other = (spec.flops or 0) / gemm_model.large_rate(kt, s.gpu_TFLOPS, "bf16")
  local cf, cb = gemm_model.bytes_us(rates, cast_f), gemm_model.bytes_us(rates, cast_b)
  local f = fwd + attn_f + mem_f + cf + logits / 2 + other / 3
  local b = bwd + attn_b + mem_b + cb + logits / 2 + 2 * other / 3
  local r = 0
  if spec.recompute == "full" then
    r = f
  elseif spec.recompute == "selective" then
    -- torchtitan's op-level SAC saves attention and every other matmul's
    -- output; the rest of the forward (its elementwise work, the other
    -- matmuls and their casts) runs again
    r = again + mem_f + (fwd > 0 and cf * again / fwd or 0)
  end
  return f, b, r, wgrad + other / 3
end

return unit_time
