-- Generic model: the plan lists its units in fully_shard (wrapping) order,
-- root last, each with its parameters in registration order. gen/load has
-- checked every name (printable ASCII, length) and every shape.
local util = require("gen.util")

local generic = {}

-- C names the generated header reserves next to <NAME>_UNIT_<unit> and
-- <NAME>_PARAM_<param> (templates/plan.h.in): the counts.
generic.RESERVED = { COUNT = "the generated count enumerator" }

-- Names that map to one C identifier (util.c_ident: "a.b" and "a_b", "W"
-- and "w") would declare one enumerator twice: refused, naming both.
-- seen: identifier -> { name, path } of its first holder.
local function check_c_name(ctx, seen, kind, enum, name, path)
  local id = util.c_ident(name)
  local reserved = generic.RESERVED[id]
  if reserved then
    util.field_error(ctx, path, string.format("%s %q becomes the C name <NAME>_%s_%s, %s in plan.h; rename it",
      kind, name, enum, id, reserved))
  end
  local first = seen[id]
  if first then
    util.field_error(ctx, path, string.format("%s %q and %s %q (%s) both become the C name <NAME>_%s_%s "
      .. "(every character but letters and digits maps to _, case is folded); rename one", kind, name, kind,
      first.name, first.path, enum, id))
  end
  seen[id] = { name = name, path = path }
end

function generic.units(ctx, model)
  local seen_unit, seen_param = {}, {}
  local unit_ids, param_ids = {}, {}
  local units = {}
  for i, u in ipairs(model.units) do
    local path = string.format("model.units[%d]", i)
    if seen_unit[u.name] then
      util.field_error(ctx, path .. ".name", string.format("unit %q appears twice (units %d and %d); give each unit its own name",
        u.name, seen_unit[u.name], i))
    end
    seen_unit[u.name] = i
    check_c_name(ctx, unit_ids, "unit", "UNIT", u.name, path .. ".name")
    local params = {}
    for j, p in ipairs(u.params) do
      local ppath = string.format("%s.params[%d].name", path, j)
      if seen_param[p.name] then
        util.field_error(ctx, ppath, string.format(
          "parameter %q is already in unit %q; FSDP2 gives a parameter to one unit only (wrap both modules in one unit)",
          p.name, seen_param[p.name]))
      end
      seen_param[p.name] = u.name
      check_c_name(ctx, param_ids, "parameter", "PARAM", p.name, ppath)
      params[j] = { name = p.name, shape = p.shape, dtype = p.dtype, shard_dim = p.shard_dim, tp = p.tp }
    end
    -- torchtitan's [norm, lm_head] unit (ChunkedLossWrapper's, gen/parallel/fsdp_schedule.lua):
    -- the norm's weight, then lm_head's, as fully_shard([norm, lm_head]) orders them
    if u.loss_head and #u.params ~= 2 then
      util.field_error(ctx, path .. ".loss_head", string.format("unit %q has %d parameters; the loss head is "
        .. "torchtitan's [norm, lm_head] (distributed/fsdp.py:202-207): the norm's weight, then lm_head's, "
        .. "without biases; drop loss_head or wrap those two modules alone", u.name, #u.params))
    end
    units[i] = { name = u.name, params = params, reshard_after_forward = u.reshard_after_forward,
                 reshard_after_backward = u.reshard_after_backward,
                 forward_prefetch = u.forward_prefetch, backward_prefetch = u.backward_prefetch,
                 param_dtype = u.param_dtype, reduce_dtype = u.reduce_dtype, loss_head = u.loss_head or nil }
  end
  return units, { n_heads = model.n_heads, n_kv_heads = model.n_kv_heads, num_experts = model.num_experts,
                  seq_len = model.seq_len }
end

return generic
