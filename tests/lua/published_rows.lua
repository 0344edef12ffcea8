-- Published torchtitan throughput rows the compute model is held to
-- (issue 37, item 3), each as a plan and its published tokens/s per GPU.
-- Sources (pytorch/torchtitan at b5bcd76, fetched 2026-11-29):
--   benchmarks/llama3_h100_202412_torchtitan.md, Table 1 (Llama 3.1 8B,
--     8 GPUs, FSDP, local batch 2, selective AC) and Table 3 (the same on
--     128 GPUs); sequence length 8192 (torchtitan's llama3_8b.toml at
--     9dec370, the benchmark's commit).
--   benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: Llama 3.1 70B on
--     256 GPUs (FSDP 32, TP 8, torch.compile, full AC, local batch 16) and
--     8B on 64 GPUs (FSDP 8, TP 8, torch.compile, per-op SAC, local batch
--     12), vanilla and async TP, bf16 / float8 tensorwise / rowwise.
-- Both ran on Grand Teton hosts: 8 H100 96 GB HBM2e (2.4 TB/s) at the 500 W
-- power limit, 400 Gb/s RDMA per GPU (topology.preset = "h100_hbm2e").
local R = {}

local function row(t) R[#R + 1] = t end

local function plan_source(r)
  return string.format([[return {
  world_size = %d,
  parallel = { dp_shard = -1, tp = %d%s },
  model = { family = "llama", size = %q, seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8, preset = "h100_hbm2e" },
  training = { activation_checkpointing = %q, local_batch_size = %d, compile = %s, float8 = %q },
}]], r.world, r.tp or 1, r.async and ", async_tp = true" or "", r.size, r.ac, r.lbs, tostring(r.compile), r.float8)
end

local T1 = "llama3_h100_202412 Table 1"
local T3 = "llama3_h100_202412 Table 3"
for _, t in ipairs({ { T1, 8, { 5762, 6667, 8532 } }, { T3, 128, { 5605, 6514, 8380 } } }) do
  local src, world, tps = t[1], t[2], t[3]
  row({ src = src, name = "8B FSDP " .. world, world = world, size = "8b", ac = "selective", lbs = 2,
        compile = false, float8 = "none", tps = tps[1] })
  row({ src = src, name = "8B FSDP " .. world .. " compile", world = world, size = "8b", ac = "selective", lbs = 2,
        compile = true, float8 = "none", tps = tps[2] })
  row({ src = src, name = "8B FSDP " .. world .. " compile float8", world = world, size = "8b", ac = "selective",
        lbs = 2, compile = true, float8 = "tensorwise", tps = tps[3] })
end
local AT = "asyncTP_llama3_h100_2025-06"
for _, t in ipairs({
  { "70b", 256, "full", 16, { none = { 597.3, 652.4 }, tensorwise = { 809.8, 942.4 }, rowwise = { 599.6, 624.8 } } },
  { "8b", 64, "selective", 12, { none = { 4378, 4809.4 }, tensorwise = { 5078.1, 5570.1 }, rowwise = { 3708.5, 3914.9 } } },
}) do
  local size, world, ac, lbs, by = t[1], t[2], t[3], t[4], t[5]
  for _, f8 in ipairs({ "none", "tensorwise", "rowwise" }) do
    for i, async in ipairs({ false, true }) do
      row({ src = AT, name = string.format("%s FSDP %d TP 8 compile%s%s", size:upper(), world // 8,
              f8 == "none" and "" or " float8 " .. f8, async and " asyncTP" or ""),
            world = world, tp = 8, async = async, size = size, ac = ac, lbs = lbs, compile = true, float8 = f8,
            tps = by[f8][i] })
    end
  end
end
for _, r in ipairs(R) do r.source = plan_source(r) end

return R
