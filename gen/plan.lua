-- The pipeline: plan file -> the one plan table every renderer reads.
local load_plan = require("gen.load")
local dims = require("gen.dims")
local layout = require("gen.layout")
local groups = require("gen.groups")
local schedule = require("gen.schedule")
local verify = require("gen.verify")
local cost = require("gen.cost")
local memplan = require("gen.memplan")
local util = require("gen.util")

local plan = {}

plan.MODELS = { llama = require("gen.models.llama"), generic = require("gen.models.generic") }

-- FSDP/HSDP only for now: TP/CP/EP placements are not generated.
local function check_supported(ctx, d)
  for _, name in ipairs({ "tp", "cp", "ep" }) do
    if d[name] > 1 then
      util.field_error(ctx, "parallel." .. name, string.format(
        "%s=%d: commplan generates FSDP/HSDP plans (dp_shard, dp_replicate) only so far; set %s=1",
        name, d[name], name))
    end
  end
end

function plan.from_loaded(p)
  local ctx = p.ctx
  local d = dims.infer(ctx, p.parallel, p.world_size)
  local units, model_numbers = plan.MODELS[p.model.family].units(ctx, p.model)
  dims.validate_model(ctx, d, model_numbers)
  check_supported(ctx, d)
  local mesh = dims.mesh(d)
  local lay = layout.build(ctx, units, d, p.fsdp)
  local fams = groups.build(mesh)
  local ops = schedule.build(lay, fams, p.fsdp)
  verify.all(lay, fams, ops, p.fsdp)
  local predicted = cost.predict(ops, fams, p.topology)
  local arena = memplan.build(lay, ops)
  local memory = cost.memory(lay, ops, arena)
  return {
    name = p.name, source_file = p.source_file, world_size = p.world_size, dims = d, mesh = mesh,
    model = p.model, model_config = model_numbers.config, fsdp = p.fsdp, topology = p.topology,
    layout = lay, groups = fams, ops = ops, predicted = predicted, memory = memory, arena = arena,
  }
end

function plan.from_file(path)
  return plan.from_loaded(load_plan.file(path))
end

function plan.from_source(source, path)
  return plan.from_loaded(load_plan.source(source, path))
end

-- FNV-1a 64-bit over a string, as 16 hex digits.
function plan.fnv1a64(s)
  local h = 0xcbf29ce484222325
  for i = 1, #s do
    h = (h ~ s:byte(i)) * 0x100000001b3
  end
  return string.format("%016x", h)
end

return plan
