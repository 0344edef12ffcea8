-- The expected trace: for a plan and a rank, the collectives, sends and
-- receives one training step issues, in PyTorch Flight Recorder's terms
-- (torch/distributed/flight_recorder/components/types.py's Op: the
-- collective, the process group's ranks, input/output element counts,
-- dtype as torch names it, the sequence id on the group), read from the
-- plan.json document alone (plandiff.load: a plan file generated in
-- memory, or a plan.json). Folded as plan.json folds: a repeated
-- micro-step's rows carry `times` and their group sequence ids advance
-- by `stride` per repetition.
--
-- Sequence ids: Flight Recorder numbers each process group's collectives
-- 1, 2, ... from the group's first (collective_seq_id; sends and receives
-- p2p_seq_id). Step s's k-th collective on a group instance (k from 1) is
-- id s * per_step + k when the job issues nothing but the plan's steps on
-- that group (python/commplan/diagnose.py reads it so; a collective of
-- the job's own on the plan's groups shows as a departure there).
--
-- Sizes are the elements the collective moves per rank, as torch's
-- tensors record them: all-gather in = count, out = count x group size;
-- reduce-scatter in = count x group size, out = count (gloo records
-- FSDP2's reduce-scatter as an all_reduce of the whole input:
-- diagnose.py accepts it as that); the expert-count exchange moves every
-- expert's count (count per member x EP degree, in and out); a token
-- all-to-all's splits follow the routing: only its group and dtype count.
--
-- A pipeline plan's rank runs its pipeline rank's tables (plan.json's
-- pipeline.ranks[]: each pipeline rank x TP class, unfolded); a send or
-- receive names its peer's global rank. A TP class beyond class 0
-- (plan.json tp_classes[]) moves its own units' slot counts.
local json = require("gen.json")
local util = require("gen.util")

local expect = {}

-- plan dtype -> torch's name in Flight Recorder's input_dtypes.
expect.TORCH_DTYPE = {
  fp32 = "Float", bf16 = "BFloat16", fp16 = "Half", fp64 = "Double",
  fp8 = "Float8_e4m3fn", fp8_e4m3 = "Float8_e4m3fn", fp8_e5m2 = "Float8_e5m2",
  int64 = "Long", int32 = "Int", uint8 = "Byte", int8 = "Char",
}

-- plan op kind -> the collective Flight Recorder records (its profiling
-- name without the backend prefix) and how its sizes follow from count.
expect.COLLECTIVE = {
  all_gather = "all_gather", tp_all_gather = "all_gather",
  reduce_scatter = "reduce_scatter", tp_reduce_scatter = "reduce_scatter",
  all_reduce = "all_reduce", tp_all_reduce = "all_reduce",
  a2a = "all_to_all", a2a_counts = "all_to_all",
  send = "send", recv = "recv",
}

local PHRASE = {
  all_gather = "all-gather of %s's parameters", reduce_scatter = "reduce-scatter of %s's gradients",
  all_reduce = "all-reduce of %s's gradients", tp_all_gather = "TP/CP all-gather of %s's activations",
  tp_reduce_scatter = "TP/CP reduce-scatter of %s's activations", tp_all_reduce = "TP all-reduce in %s",
  a2a = "expert all-to-all of %s's tokens", a2a_counts = "expert-count exchange of %s",
  send = "send of %s's activations", recv = "receive of %s's activations",
}

-- The mesh coordinate of rank r along an axis of global stride s and size n.
local function digit(r, s, n) return (r // s) % n end

-- The global ranks of rank r's instance of a group family (plan.json's
-- closed form: members' axes vary, the others stay r's), and the
-- instance's index (its color, ncclCommSplit's).
function expect.instance(group, r)
  local m = group.members
  local base = r
  for i, s in ipairs(m.sizes) do base = base - digit(r, m.strides[i], s) * m.strides[i] end
  local color, mult = 0, 1
  for i = #group.colors.sizes, 1, -1 do
    color = color + digit(r, group.colors.strides[i], group.colors.sizes[i]) * mult
    mult = mult * group.colors.sizes[i]
  end
  local ranks = { base }
  for i = #m.sizes, 1, -1 do
    local nxt = {}
    for d = 0, m.sizes[i] - 1 do
      for _, b in ipairs(ranks) do nxt[#nxt + 1] = b + d * m.strides[i] end
    end
    ranks = nxt
  end
  table.sort(ranks)
  return ranks, color
end

local function mesh_digit(doc, r, axis)
  for i, name in ipairs(doc.mesh.names) do
    if name == axis then return digit(r, doc.mesh.strides[i], doc.mesh.sizes[i]), doc.mesh.strides[i] end
  end
end

-- The tables rank r runs: ops, units (by name), and the repeat block.
local function tables_of(doc, r)
  local units = {}
  for _, u in ipairs(doc.units) do units[u.name] = u end
  local tp = mesh_digit(doc, r, "tp")
  local class = 0
  for _, c in ipairs(doc.tp_classes or {}) do
    for _, t in ipairs(c.tp_ranks) do
      if t == tp then class = c.class end
    end
  end
  local class_units = {}
  if class > 0 then
    for _, c in ipairs(doc.tp_classes) do
      if c.class == class then for _, u in ipairs(c.units) do class_units[u.name] = u end end
    end
  end
  if doc.pipeline then
    local pp = mesh_digit(doc, r, "pp") or 0
    for _, t in ipairs(doc.pipeline.ranks) do
      if t.pp_rank == pp and (t.tp_class or 0) == class then
        return t.ops, units, class_units, nil, pp, class
      end
    end
    util.plan_error(string.format("plan %s: pipeline.ranks has no tables for pipeline rank %d (TP class %d); "
      .. "regenerate the plan.json", doc.plan, pp, class))
  end
  return doc.ops, units, class_units, doc["repeat"], nil, class
end

local function range_text(ranks)
  local n = #ranks
  if n <= 2 then return table.concat(ranks, ",") end
  local step = ranks[2] - ranks[1]
  for i = 3, n do if ranks[i] - ranks[i - 1] ~= step then return table.concat(ranks, ",") end end
  if step == 1 then return string.format("%d-%d", ranks[1], ranks[n]) end
  return string.format("%d-%d step %d", ranks[1], ranks[n], step)
end
expect.range_text = range_text

-- The expected rows of rank r: one per collective / send / receive the
-- step issues (a folded row stands for `times` issues).
function expect.rows(doc, r)
  if r < 0 or r >= doc.world_size then
    util.plan_error(string.format("--rank %d: plan %s has world_size %d; give a rank in 0..%d", r, doc.plan,
      doc.world_size, doc.world_size - 1))
  end
  local ops, _, class_units, rep, pp = tables_of(doc, r)
  local groups = {}
  for _, g in ipairs(doc.groups) do groups[g.name] = g end
  local per_group = {} -- instance key -> ids issued so far in the step
  local stride = {}    -- instance key -> ids per repetition of the repeat block
  local times_of = {}
  if rep then
    for seq = rep.first_seq, rep.first_seq + rep.ops - 1 do times_of[seq] = rep.times end
  end
  local rows = {}
  local pp_axis_stride = doc.pipeline and select(2, mesh_digit(doc, r, "pp"))
  -- first pass: each repeated row's group counts once per repetition
  for _, o in ipairs(ops) do
    if times_of[o.seq] and o.group then
      local key = o.group .. "#" .. select(2, expect.instance(groups[o.group], r))
      stride[key] = (stride[key] or 0) + 1
    end
  end
  for _, o in ipairs(ops) do
    local coll = expect.COLLECTIVE[o.kind]
    if coll and (o.group or coll == "send" or coll == "recv") then
      local row = { seq = o.seq, kind = o.kind, op = coll, unit = o.unit, phase = o.phase,
        micro_step = o.micro_step, stream = o.stream, dtype = expect.TORCH_DTYPE[o.dtype] or o.dtype,
        plan_dtype = o.dtype, times = times_of[o.seq] }
      local count = o.count
      local cu = class_units[o.unit]
      if cu and count then
        for _, u in ipairs(doc.units) do
          if u.name == o.unit and u.slot_numel == count then count = cu.slot_numel end
        end
      end
      local gsize = 1
      if o.group then
        local ranks, color = expect.instance(groups[o.group], r)
        local key = o.group .. "#" .. color
        gsize = #ranks
        per_group[key] = (per_group[key] or 0) + 1
        row.group, row.instance, row.ranks = o.group, color, ranks
        row.group_seq = per_group[key]
        if row.times then row.stride = stride[key] end
      else
        -- a pipeline message: its peer's global rank (pipeline rank o.peer)
        row.peer = r + (o.peer - pp) * pp_axis_stride
        row.batch, row.tag = o.batch, o.tag
        local key = coll .. "@" .. row.peer
        per_group[key] = (per_group[key] or 0) + 1
        row.group_seq = per_group[key]
        -- the process group the message goes over: the rank's pipeline group
        if groups.pp then row.pg, row.pg_ranks = "pp", (expect.instance(groups.pp, r)) end
      end
      if coll == "all_gather" then row.numel_in, row.numel_out = count, count * gsize
      elseif coll == "reduce_scatter" then row.numel_in, row.numel_out = count * gsize, count
      elseif o.kind == "a2a_counts" then
        -- torchtitan's exchange of num_tokens_per_expert: every expert's count, all_to_all_single
        row.numel_in, row.numel_out = count * gsize, count * gsize
        -- counts are int64 (routing_map_BLE.sum, torchtitan/models/common/moe.py:437; the plan
        -- prices and places them at 8 bytes, cost.lua / memplan.lua), whatever the unit's dtype
        row.dtype, row.plan_dtype = "Long", "int64"
      elseif coll ~= "all_to_all" then row.numel_in, row.numel_out = count, count end
      row.reduce_op = o.reduce_op
      rows[#rows + 1] = row
    end
    if rep and o.seq == rep.first_seq + rep.ops - 1 then
      -- past the repeated block: its other repetitions' ids
      for key, n in pairs(stride) do per_group[key] = (per_group[key] or 0) + n * (rep.times - 1) end
    end
  end
  return rows, per_group
end

-- The plan's name for a row: "reduce-scatter of layers.17's gradients
-- (backward, micro-step 0, stream reduce_scatter) on fsdp group 3 [ranks 12-15]".
function expect.name(row)
  local what = string.format(PHRASE[row.kind] or (row.kind .. " of %s"), row.unit or "?")
  local ms = row.times and string.format("micro-steps %d-%d", row.micro_step, row.micro_step + row.times - 1)
    or ("micro-step " .. tostring(row.micro_step))
  local where
  if row.group then
    where = string.format("on %s group %d [ranks %s]", row.group, row.instance, range_text(row.ranks))
  else
    where = string.format("%s rank %d", row.op == "send" and "to" or "from", row.peer)
  end
  return string.format("%s (%s%s, stream %s) %s", what, row.phase and (row.phase .. ", ") or "", ms,
    row.stream or "?", where)
end

local function row_object(row)
  local kv = { "seq", row.seq, "op", row.op, "kind", row.kind }
  local function add(k, v) if v ~= nil then kv[#kv + 1] = k; kv[#kv + 1] = v end end
  add("group", row.group); add("instance", row.instance); add("ranks", row.ranks); add("peer", row.peer)
  add("pg", row.pg); add("pg_ranks", row.pg_ranks)
  add("group_seq", row.group_seq); add("times", row.times); add("stride", row.stride)
  add("numel_in", row.numel_in); add("numel_out", row.numel_out); add("dtype", row.dtype)
  add("reduce_op", row.reduce_op); add("unit", row.unit); add("phase", row.phase)
  add("micro_step", row.micro_step); add("stream", row.stream); add("name", expect.name(row))
  return json.object(kv)
end

-- The document `expect --json` writes: the plan's identity and, per
-- rank asked for, its rows and each group instance's ids per step.
function expect.document(doc, ranks)
  local out = {}
  for _, r in ipairs(ranks) do
    local rows, per_group = expect.rows(doc, r)
    local objs = {}
    for i, row in ipairs(rows) do objs[i] = row_object(row) end
    local keys = {}
    for k in pairs(per_group) do keys[#keys + 1] = k end
    table.sort(keys)
    local pg = {}
    for _, k in ipairs(keys) do pg[#pg + 1] = k; pg[#pg + 1] = per_group[k] end
    out[#out + 1] = json.object({ "rank", r, "per_step", json.object(pg), "rows", objs })
  end
  return json.object({ "schema", "commplan-expect/1", "plan", doc.plan, "fingerprint", doc.fingerprint,
    "world_size", doc.world_size, "ranks", out })
end

-- The text form: one line per row, "x N" on a folded row.
function expect.text(doc, r)
  local rows, per_group = expect.rows(doc, r)
  local lines = { string.format("plan %s (fingerprint %s), rank %d of %d: %d collectives and messages per step "
    .. "(Flight Recorder terms: group sequence id, collective, elements in -> out, dtype)", doc.plan,
    doc.fingerprint, r, doc.world_size, 0) }
  local total = 0
  for _, row in ipairs(rows) do
    total = total + (row.times or 1)
    local id = row.times and string.format("%d+%dk", row.group_seq, row.stride or 1) or tostring(row.group_seq)
    local size = row.numel_in and string.format("%d -> %d", row.numel_in, row.numel_out) or "splits by routing"
    lines[#lines + 1] = string.format("  %-12s #%-7s %-14s %-18s %-9s %s%s", row.group or ("peer " .. row.peer), id,
      row.op, size, row.dtype or "", expect.name(row), row.times and string.format("  x %d", row.times) or "")
  end
  lines[1] = lines[1]:gsub(": 0 collectives", ": " .. total .. " collectives")
  local keys = {}
  for k in pairs(per_group) do keys[#keys + 1] = k end
  table.sort(keys)
  local per = {}
  for _, k in ipairs(keys) do per[#per + 1] = k .. " " .. per_group[k] end
  lines[#lines + 1] = "  per step on each group instance (#color): " .. table.concat(per, ", ")
  return table.concat(lines, "\n") .. "\n"
end

return expect
