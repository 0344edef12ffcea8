-- fr4.lua with two micro-steps under sync_last (set_requires_gradient_sync(False) on all but the last):
-- three layers on dp_shard = 4, each unit of its own size, so a departure
-- shows in Flight Recorder's sizes.
local function layer(b, w)
  local pre = "layers." .. b .. "."
  return { name = "layers." .. b, params = {
    { name = pre .. "w1", shape = { w, 8 } }, { name = pre .. "w2", shape = { 8, w } },
    { name = pre .. "norm", shape = { 8 } },
  } }
end

return {
  world_size = 4,
  parallel = { dp_shard = -1 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      layer(0, 12), layer(1, 16), layer(2, 20),
      { name = "root", params = {
        { name = "root.tok_embeddings", shape = { 24, 8 } },
        { name = "root.output", shape = { 24, 8 } },
      } },
    },
  },
  fsdp = { reshard_after_forward = true, micro_steps = 2, grad_accumulation = "sync_last" },
}
