-- Generic model: the plan lists its units in fully_shard (wrapping) order,
-- root last, each with its parameters in registration order.
local util = require("gen.util")

local generic = {}

function generic.units(ctx, model)
  local seen_unit, seen_param = {}, {}
  local units = {}
  for i, u in ipairs(model.units) do
    local path = string.format("model.units[%d]", i)
    if seen_unit[u.name] then
      util.field_error(ctx, path .. ".name", string.format("unit %q appears twice (units %d and %d); give each unit its own name",
        u.name, seen_unit[u.name], i))
    end
    seen_unit[u.name] = i
    local params = {}
    for j, p in ipairs(u.params) do
      if seen_param[p.name] then
        util.field_error(ctx, string.format("%s.params[%d].name", path, j), string.format(
          "parameter %q is already in unit %q; FSDP2 gives a parameter to one unit only (wrap both modules in one unit)",
          p.name, seen_param[p.name]))
      end
      seen_param[p.name] = u.name
      params[j] = { name = p.name, shape = p.shape, dtype = p.dtype, shard_dim = p.shard_dim }
    end
    units[i] = { name = u.name, params = params }
  end
  return units, { n_heads = model.n_heads, n_kv_heads = model.n_kv_heads, num_experts = model.num_experts,
                  seq_len = model.seq_len }
end

return generic
