-- fsdp.symm_mem (torchtitan's enable_fsdp_symm_mem) on plans/fsdp4.lua's
-- model: the all-gather outputs and reduce-scatter inputs and outputs in
-- one symmetric window per rank (gen/memplan.lua, gen/symm.lua), which
-- runtime/gpu.c allocates with ncclMemAlloc and registers on the fsdp
-- communicator; the emulator checks every rank's offsets agree.
local function layer(b)
  local pre = "layers." .. b .. ".p."
  local function p(name, shape) return { name = pre .. name, shape = shape } end
  return { name = "layers." .. b, params = {
    p("wq", { 12, 12 }), p("wk", { 4, 12 }), p("wv", { 4, 12 }), p("wo", { 12, 12 }),
    p("w1", { 20, 12 }), p("w2", { 12, 20 }), p("w3", { 20, 12 }),
    p("attn_norm", { 12 }), p("bias", { 5 }),
  } }
end

return {
  world_size = 4,
  parallel = { dp_shard = -1 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      layer(0), layer(1),
      { name = "root", params = {
        { name = "root.tok_embeddings", shape = { 37, 12 } },
        { name = "root.output", shape = { 37, 12 } },
      } },
    },
  },
  fsdp = { reshard_after_forward = true, symm_mem = true, micro_steps = 2 },
}
