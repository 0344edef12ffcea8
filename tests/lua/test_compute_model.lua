-- Issue 37, items 2 and 3: compute priced from shapes (gen/gemm_model.lua,
-- gen/unit_time.lua, gen/compute.lua) and held to torchtitan's published rows.
local H = require("helpers")
local plan = require("gen.plan")
local figures = require("gen.figures")
local compute = require("gen.compute")
local gemm_model = require("gen.gemm_model")

local T = {}

local KT = gemm_model.table("h100")
local RATES = { TFLOPS = 989, hbm_GBps = 3000 }

local function tflops(M, N, K, dtype)
  return 2 * M * N * K / gemm_model.gemm_us(KT, RATES, M, N, K, dtype) / 1e6
end

-- A large GEMM reaches the table's emax x the K factor; a thin one is
-- memory-bound; a ragged one wastes its partial tiles and last wave.
function T.gemm_efficiency_follows_the_shape()
  local big = tflops(16384, 16384, 8192, "bf16")
  assert(big > 0.75 * 989 and big <= 0.80 * 989, "large bf16 GEMM at " .. big)
  local thin = tflops(98304, 128, 4096, "bf16")
  assert(thin < 0.5 * big, "a 128-wide GEMM is memory-bound: " .. thin)
  -- (memory-bound: its time is its bytes at HBM speed)
  local bytes = 2 * (98304 * 4096 + 4096 * 128) + 2 * 98304 * 128
  H.eq(gemm_model.gemm_us(KT, RATES, 98304, 128, 4096, "bf16"), bytes / 3e6, "thin GEMM us")
  assert(tflops(16384, 16384, 512, "bf16") < 0.75 * big, "short K pays its prologue")
  -- 12 x 11 tiles of 128 x 256 fill the 132 SMs once; one more row of
  -- tiles starts a second wave that keeps 11 of them busy
  local full = tflops(1536, 2816, 8192, "bf16")
  assert(full >= big, "whole waves run as fast as a large GEMM")
  assert(tflops(1664, 2816, 8192, "bf16") < 0.6 * full, "a ragged last wave")
  local fp8 = tflops(16384, 16384, 8192, "fp8")
  assert(fp8 > 1.5 * big and fp8 < 2 * big, "fp8 at " .. fp8)
end

-- Causal attention does half the work; the backward 2.5x the forward's
-- FLOPs at a lower efficiency; short sequences run below long ones.
function T.attention_by_sequence_and_causality()
  local f, b, flops = gemm_model.attention_us(KT, RATES, 8192, 8192, 32, 128, true)
  local f2, _, flops2 = gemm_model.attention_us(KT, RATES, 8192, 8192, 32, 128, false)
  H.eq(flops2, 2 * flops, "non-causal FLOPs")
  H.eq(f2, 2 * f, "non-causal time")
  assert(b > 2.5 * f, "backward slower per FLOP")
  assert(gemm_model.attention_efficiency(KT, "fwd", 512, 128) < gemm_model.attention_efficiency(KT, "fwd", 8192, 128),
    "short sequences less efficient")
end

local SRC = [[return {
  world_size = 8, parallel = { dp_shard = -1 },
  model = { family = "llama", size = "8b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8%s },
  training = { activation_checkpointing = "selective", local_batch_size = 2%s },
}]]

local function step(topo, tr)
  local p = plan.from_source(string.format(SRC, topo or "", tr or ""), "plans/t.lua")
  return figures.of(p), p
end

-- The modes: compile fuses the memory-bound work (faster), float8 runs the
-- blocks' GEMMs at FP8 (faster still), rowwise's casts and scaled GEMMs
-- cost more than tensorwise's; MFU is an output (it moves with them).
function T.modes_order_the_step()
  local eager = step()
  local compiled = step(nil, ", compile = true")
  local tw = step(nil, ", compile = true, float8 = \"tensorwise\"")
  local rw = step(nil, ", compile = true, float8 = \"rowwise\"")
  assert(compiled.step_us < eager.step_us, "compile faster")
  assert(tw.step_us < compiled.step_us, "float8 faster")
  assert(rw.step_us > tw.step_us, "rowwise slower than tensorwise")
  assert(compiled.throughput.mfu > eager.throughput.mfu, "MFU follows the step")
  H.eq(eager.settings.mfu, nil, "no mfu assumed")
end

-- topology.mfu stays an override: every FLOP at TFLOPS x mfu, as before.
function T.mfu_is_an_override()
  local f, p = step(", mfu = 0.4")
  local s = f.settings
  for _, u in ipairs(p.layout.units) do
    local r = f.per_unit[u.index]
    H.eq(r.fwd_us, r.fwd / (s.gpu_TFLOPS * 1e6 * 0.4), u.name .. " forward at the override")
  end
  local g = step()
  assert(math.abs(f.step_us - g.step_us) > 0.05 * g.step_us, "the override is not the shapes' price")
end

-- Refused where torchtitan refuses, one line naming the field.
function T.refusals_cite_torchtitan()
  H.plan_fails(string.format(SRC, ", preset = \"a100\"", ", float8 = \"rowwise\""), "training.float8",
    "float8.py:86-96")
  H.plan_fails((string.format(SRC, "", ", compile = false"):gsub("dp_shard = %-1", "dp_shard = -1, tp = 2, async_tp = true")),
    "training.compile", "configs.py:304-310")
end

local TP_SRC = [[return {
  world_size = 16, parallel = { dp_shard = -1, tp = 8%s },
  model = { family = "llama", size = "8b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = %q, local_batch_size = 2, compile = true%s },
}]]

local function tp_plan(ac, float8, async)
  return plan.from_source(string.format(TP_SRC, async and ", async_tp = true" or "", ac,
    float8 and string.format(", float8 = %q", float8) or ""), "plans/t.lua")
end

-- Checkpointing reruns TP's collectives in backward: full all of the
-- blocks' forward ones, selective (op SAC, which saves reduce-scatters
-- only) the all-gathers; none, nothing.
function T.checkpointing_regathers_tp_inputs()
  local timeline = require("gen.timeline")
  local kinds = {}
  for _, ac in ipairs({ "none", "selective", "full" }) do
    local p = tp_plan(ac)
    local k = {}
    for _, o in ipairs(timeline.recomputed(p, compute.settings(p))) do k[o.kind] = (k[o.kind] or 0) + 1 end
    kinds[ac] = k
  end
  H.eq(next(kinds.none), nil, "none reruns nothing")
  H.eq(kinds.selective.tp_reduce_scatter, nil, "SAC keeps the reduce-scatters' outputs")
  H.eq(kinds.selective.tp_all_gather, 64, "SAC regathers each block's two inputs")
  H.eq(kinds.full.tp_all_gather, 64, "full regathers them")
  H.eq(kinds.full.tp_reduce_scatter, 64, "full reruns the reduce-scatters")
end

-- Float8 tensorwise gathers the blocks' linears' inputs (and their output
-- gradients) in float8: half the bytes of bf16; rowwise gathers bf16.
function T.tensorwise_gathers_in_float8()
  local function ag_bytes(f8)
    local p = tp_plan("selective", f8)
    local n = 0
    for _, o in ipairs(p.ops) do
      if o.kind == "tp_all_gather" and o.f8_gather then n = n + o.size_bytes end
    end
    return n
  end
  local bf16, tw, rw = ag_bytes(nil), ag_bytes("tensorwise"), ag_bytes("rowwise")
  assert(bf16 > 0, "gathers feeding linears")
  H.eq(tw * 2, bf16, "tensorwise bytes")
  H.eq(rw, bf16, "rowwise bytes")
end

-- torch.compile defaults to async TP's setting (torchtitan runs async TP
-- compiled only); eager otherwise.
function T.compile_follows_async_tp()
  local p = plan.from_source(string.format(TP_SRC, ", async_tp = true", "selective", ""):gsub(", compile = true", ""),
    "plans/t.lua")
  local s = compute.settings(p)
  H.eq(s.compile, true, "async TP compiles")
  H.eq(s.defaulted.compile, true, "defaulted")
  p = plan.from_source(string.format(TP_SRC, "", "selective", ""):gsub(", compile = true", ""), "plans/t.lua")
  H.eq(compute.settings(p).compile, false, "eager by default")
end

-- An MoE block prices its attention (quadratic in the sequence: twice the
-- tokens in half the sequences leave its matmuls' FLOPs and double its
-- attention's); its experts unit has none.
function T.moe_blocks_price_their_attention()
  local src = H.read("plans/mixtral8x7b.lua")
  local function block(seq, lbs)
    local p = plan.from_source(src:gsub("seq_len = 4096", "seq_len = " .. seq)
      :gsub("local_batch_size = 4", "local_batch_size = " .. lbs), "plans/mixtral8x7b.lua")
    local per = compute.units(p, compute.settings(p))
    for _, u in ipairs(p.layout.units) do
      if u.name == "layers.0" then return per[u.index], p.model_config, p.dims.tp or 1 end
    end
  end
  local a, cfg, tp = block(4096, 4)
  local b = block(8192, 2)
  H.eq(b.fwd - a.fwd, 4 * 4 * 4096 * 4096 * (cfg.n_heads // tp) * cfg.head_dim, "attention FLOPs added")
  assert(b.fwd_us > a.fwd_us, "longer sequences: slower attention")
end

-- The optimizer step at HBM speed: fused AdamW over the rank's sharded
-- parameters (param, grad, two moments read; param, moments written: 7 x
-- their bytes), SGD 3 x, none without an optimizer or under the mfu
-- override; it ends the step (and the trace) on the compute stream.
function T.optimizer_step_at_hbm_speed()
  local f, p = step()
  local s = f.settings
  local numel = 0
  for _, u in ipairs(p.layout.units) do numel = numel + u.total end
  H.eq(compute.optimizer_us(p, s), 7 * 4 * numel / (s.hbm_GBps * 1e3), "fused AdamW: 28 bytes per fp32 element")
  local g = step(nil, ", optimizer = \"sgd\"")
  local n = step(nil, ", optimizer = \"none\"")
  H.eq(g.timeline.optimizer_us, 3 * 4 * numel / (s.hbm_GBps * 1e3), "SGD: 12 bytes")
  H.eq(n.timeline.optimizer_us, 0, "no optimizer")
  local d = f.step_us - n.step_us
  assert(math.abs(d - compute.optimizer_us(p, s)) < 1, "the step grows by it: " .. d)
  H.eq(step(", mfu = 0.4").timeline.optimizer_us, 0, "the mfu override prices FLOPs only")
end

-- An MoE block's memory-bound work (router, permutation, combine) at HBM
-- speed: the experts' unit costs more than its GEMMs and attention alone,
-- by the bytes of its routed rows.
function T.moe_memory_bound_work()
  local p = plan.from_source(H.read("plans/mixtral8x7b.lua"), "plans/mixtral8x7b.lua")
  local s = compute.settings(p)
  local per = compute.units(p, s)
  local unit_time = require("gen.unit_time")
  local orig = unit_time.of
  local seen = 0
  unit_time.of = function(st, spec)
    seen = seen + (spec.bytes or 0)
    return orig(st, spec)
  end
  local ok, err = pcall(compute.units, p, s)
  unit_time.of = orig
  assert(ok, err)
  local cfg = p.model_config
  local T_ = s.tokens // ((p.dims and p.dims.tp) or 1)
  -- every block: (5 x top_k + 1) rows of dim and the router's 3 fp32 passes over its scores
  local e = require("gen.util").DTYPE_BYTES[p.layout.units[2].ag_dtype]
  local want = cfg.n_layers * ((5 * T_ * cfg.top_k + T_) * cfg.dim * e + 12 * T_ * cfg.num_experts)
  H.eq(seen, want, "the MoE bytes priced")
  assert(per[p.layout.units[2].index].fwd_us > 0, "priced")
end

-- Issue 37, item 3: every published row within 15% (tests/compute_rows.lua
-- prints them); the mfu = 0.4 override misses some by more: the rows can fail.
function T.published_rows_within_15_percent()
  local res = require("tests.compute_rows").predict()
  local missed = 0
  for _, x in ipairs(res) do
    if math.abs(x.ratio - 1) > 0.15 then
      error(string.format("%s (%s): predicted %.1f, published %.1f (%.3f)", x.name, x.src, x.predicted, x.published,
        x.ratio))
    end
    if math.abs(x.override_ratio - 1) > 0.15 then missed = missed + 1 end
  end
  H.eq(#res, 18, "rows")
  assert(missed >= 6, "the mfu override misses " .. missed .. " rows")
end

return T
