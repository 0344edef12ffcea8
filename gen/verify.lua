-- Stage 6: proofs over the plan; any failure means no output is written.
--  * coverage: every element of every parameter is rebuilt exactly once by
--    copy-out and owned by exactly one shard rank after reduce-scatter;
--  * bounds: every slot range lies inside its unit's fused buffer;
--  * schedule: a state machine per unit shows every compute sees unsharded
--    parameters, every collective's input is ready, every unit is reduced
--    exactly once per step and ends resharded;
--  * order: every communicator's members issue the same op sequence.
local layout = require("gen.layout")

local verify = {}

local function check(cond, fmt, ...)
  if not cond then error("internal error (plan verification failed): " .. string.format(fmt, ...), 0) end
end

function verify.coverage(lay)
  local W = lay.W
  for _, u in ipairs(lay.units) do
    local expect = 0
    for _, p in ipairs(u.params) do
      check(p.offset == expect, "%s: offset %d, expected %d", p.name, p.offset, expect)
      check(p.offset + p.padded <= u.total, "%s: slot range out of bounds", p.name)
      -- Ranks own disjoint runs [r*run, (r+1)*run) of each outer row; the
      -- union over ranks is [0, W*run) >= the row length, so every element
      -- has exactly one owner, and padding only trails (Shard(0)).
      check(W * p.run * p.outer >= p.numel, "%s: W*padded < numel", p.name)
      local full = p.shard_dim > 0 and W or p.numel // p.run
      local partial = p.shard_dim > 0 and 0 or p.numel % p.run
      local sum = full * p.run + partial
      check(p.shard_dim > 0 or sum == p.numel, "%s: shards cover %d of %d elements", p.name, sum, p.numel)
      check(p.shard_dim == 0 or p.outer * W * p.run == p.numel, "%s: Shard(%d) not exact", p.name, p.shard_dim)
      check(layout.valid(p, 0) <= p.padded and layout.valid(p, W - 1) >= 0, "%s: valid range", p.name)
      expect = expect + p.padded
    end
    check(expect == u.total, "%s: total %d != %d", u.name, u.total, expect)
  end
end

function verify.schedule(lay, ops, micro_steps)
  local state, reduced, grads = {}, {}, {}
  for _, u in ipairs(lay.units) do state[u.index] = "sharded"; reduced[u.index] = 0; grads[u.index] = 0 end
  local name = function(i) return lay.units[i + 1].name end
  for _, o in ipairs(ops) do
    local u, s = o.unit, state[o.unit]
    local k = o.kind
    if k == "copy_in" then check(s == "sharded", "copy_in of %s while %s", name(u), s); state[u] = "copied_in"
    elseif k == "all_gather" then check(s == "copied_in", "all_gather of %s while %s", name(u), s); state[u] = "gathered"
    elseif k == "copy_out" then check(s == "gathered", "copy_out of %s while %s", name(u), s); state[u] = "unsharded"
    elseif k == "forward" then check(s == "unsharded", "forward of %s on %s params", name(u), s)
    elseif k == "backward" then
      check(s == "unsharded", "backward of %s on %s params", name(u), s)
      grads[u] = grads[u] + 1
    elseif k == "reshard" then check(s == "unsharded", "reshard of %s while %s", name(u), s); state[u] = "sharded"
    elseif k == "pack" then
      check(grads[u] == micro_steps, "%s packed after %d of %d backward passes", name(u), grads[u], micro_steps)
      reduced[u] = reduced[u] + 1
    elseif k == "reduce_scatter" or k == "all_reduce" or k == "view_out" then
      check(reduced[u] == 1, "%s of %s before its pack", k, name(u))
    else check(false, "unknown op kind %s", tostring(k)) end
  end
  for _, uu in ipairs(lay.units) do
    check(state[uu.index] == "sharded", "%s ends the step %s", uu.name, state[uu.index])
    check(reduced[uu.index] == 1, "%s reduced %d times", uu.name, reduced[uu.index])
  end
end

-- Ops are rank-generic (the same list on every rank, counts from the unit
-- table), so members of a group issue identical sequences by construction;
-- this checks what that relies on: every collective names a known family,
-- its count is the unit's slot size, and the dtype matches the unit's.
function verify.order(lay, fams, ops)
  for _, o in ipairs(ops) do
    if o.group then
      local f = fams.by_name[o.group]
      check(f ~= nil, "op %d names unknown group %s", o.seq, o.group)
      local u = lay.units[o.unit + 1]
      check(o.count == u.total, "op %d count %d != slot %d", o.seq, o.count, u.total)
      local want = o.kind == "all_gather" and u.ag_dtype or u.reduce_dtype
      check(o.dtype == want, "op %d dtype %s != %s", o.seq, o.dtype, want)
    end
  end
end

function verify.all(lay, fams, ops, fsdp)
  verify.coverage(lay)
  verify.schedule(lay, ops, fsdp.micro_steps)
  verify.order(lay, fams, ops)
  return true
end

return verify
