-- Compares what torchtitan 0.3's expert parallelism issued live on gloo
-- (tests/ep/torch_ep_record.py, one JSON per case) with commplan's tables
-- for the same model and mesh (issue 23, item 6).
--
-- Per case: the plan of the recorded model (its family's, c.family:
-- gen/models/deepseek_v3.lua, or mixtral / qwen3_moe's gen/models/moe.lua, with
-- the recorder's dims, world, dp_shard and ep; gradients summed, as
-- torchtitan's divide factor 1 does; the loss on whole logits, the
-- recorder's cross_entropy_loss: training.loss_chunks = 1) is generated; then per global rank the
-- step's collectives must be equal in order, one for one:
--   - FSDP's all-gathers and reduce-scatters: kind, the group's global
--     ranks (the dense groups on dp_shard, the experts' on efsdp), input and
--     output numel, dtype;
--   - the token counts' all-to-all (int64, experts per member x ep);
--   - the token all-to-alls: the ep group, which exchange it is (forward
--     dispatch / combine, then in backward the combine's and the dispatch's
--     gradients, named as the recorder's dispatcher labels; under
--     activation checkpointing, the case's "ac", first the recompute's
--     counts, dispatch and combine, which the recorder marks with the block
--     re-run), the row length
--     (dim), and every per-member split of the recorded routing within the
--     plan's capacity (the tables take the splits at run time);
--   - with tp > 1 (the case's tp), TP's activation collectives on the tp
--     group: kind, input and output numel, dtype, reduce op;
-- nothing else may be issued. Also each parameter's local shard shape on
-- every rank (the experts' split over ep and their Shard(0)/Shard(1) over
-- efsdp) equals the plan's.
-- With --dumps DIR, the reduced gradients too: the recorder (run with
-- --plans, the plans this script writes) made every FSDP unsharded gradient
-- commplan's oracle pattern for the parameter's id in this plan, so every
-- rank's every parameter's reduced local shard (dense ones over dp_shard,
-- experts over efsdp, Shard(0) or Shard(1)) must equal, float32 bit for bit,
-- the plan's binary's --simulate --pattern oracle --dump DIR/<case>.
--   lua5.4 tests/ep/compare_ep_live.lua [--dumps DIR] CASE.json...
--   lua5.4 tests/ep/compare_ep_live.lua --write-plans DIR SPEC.json...
--     (each case's plan file, DIR/ep_live_<case>.lua, from its spec:
--     tests/ep/ep_cases.py --specs)
-- Prints one line per case and a closing line with the totals; exit 1 on
-- the first difference.
package.path = "./?.lua;" .. package.path
local json = require("gen.json")
local plan = require("gen.plan")
local groups = require("gen.groups")

local fmt = string.format
local DTYPE = { float32 = "fp32", bfloat16 = "bf16", float16 = "fp16", int64 = "int64" }
-- The model keys of each recorded family (tests/ep/ep_cases.py's BASE and GQA_BASE).
local DS_KEYS = { "dim", "n_layers", "n_dense_layers", "n_heads", "vocab_size", "q_lora_rank", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "dense_hidden_dim", "moe_hidden_dim",
                  "num_experts", "num_shared_experts", "top_k" }
local GQA_KEYS = { "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "moe_hidden_dim", "num_experts",
                   "top_k" }
local KEYS = { deepseek_v3 = DS_KEYS, qwen3_moe = GQA_KEYS, mixtral = GQA_KEYS, gpt_oss = GQA_KEYS }

-- The plan of a case is named ep_live_<case> (its binary, its dump files).
local function plan_name(c) return "ep_live_" .. c.case end

-- The plan file of a recorded case.
local function plan_source(c)
  local m = {}
  local family = c.family or "deepseek_v3"
  for _, k in ipairs(assert(KEYS[family], "case family")) do
    local v = c.model[k]
    assert(math.type(v) == "integer", "case model field " .. k)
    m[#m + 1] = fmt("%s = %d", k, v)
  end
  -- (DeepSeek-V3's multi-token prediction where the case sets it)
  if c.model.num_mtp_layers then m[#m + 1] = fmt("num_mtp_layers = %d", c.model.num_mtp_layers) end
  return fmt([[return {
  world_size = %d,
  parallel = { dp_shard = %d, ep = %d%s },
  model = { family = %q, dtype = "fp32", seq_len = %d, %s },
  fsdp = { %sreduce_op = "sum" },
  training = { local_batch_size = %d, loss_chunks = 1%s },
}]], c.world, c.dp_shard, c.ep, ((c.tp or 1) > 1 and fmt(", tp = %d", c.tp) or "")
    .. (c.sp == false and ", sequence_parallel = false" or ""), family, c.seq, table.concat(m, ", "),
    -- (torchtitan's mixed_precision_param bf16 where the case says so; reductions fp32)
    c.param_dtype == "bf16" and 'param_dtype = "bf16", reduce_dtype = "fp32", ' or "",
    c.batch,
    (c.ac and c.ac ~= "none") and fmt(", activation_checkpointing = %q", c.ac) or "")
end

-- Per global rank, the group of family f that holds it.
local function members_of(f)
  local of = {}
  for col = 0, f.count - 1 do
    local m = groups.members(f, col)
    for _, r in ipairs(m) do of[r] = m end
  end
  return of
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function layer_of(unit_name) return (unit_name:match("^(layers%.%d+)") or unit_name:match("^(mtp_layers%.%d+)")) end

-- The TP class (its ops and layout) of global rank g: its coordinate in
-- its TP group (one class without TP).
local function class_of(p, g, fams)
  if not fams.tp then return p.tp_classes and p.tp_classes[1] or p end
  for i, r in ipairs(fams.tp[g]) do
    if r == g then return p.tp_classes[p.class_of[i - 1]] end
  end
end

local TP_KIND = { tp_all_gather = "all_gather", tp_reduce_scatter = "reduce_scatter", tp_all_reduce = "all_reduce" }

-- The expected events of one rank from its class's ops.
local function expected(p, g, fams)
  local out = {}
  local cls = class_of(p, g, fams)
  for _, o in ipairs(cls.ops) do
    if o.group and (o.kind == "all_gather" or o.kind == "reduce_scatter" or o.kind == "all_reduce"
                    or o.kind == "a2a_counts" or o.kind == "a2a" or TP_KIND[o.kind]) then
      local ranks = fams[o.group][g]
      local n = #ranks
      -- an FSDP group of one rank issues nothing (FSDP2 skips it)
      if n > 1 or o.kind == "a2a" or o.kind == "a2a_counts" then
        local unit = cls.layout.units[o.unit + 1].name
        local e = { op = o, ranks = ranks, unit = unit, layer = layer_of(unit) }
        if TP_KIND[o.kind] then
          -- TP's activation collectives (count: a shard of the sequence, the whole for an all-reduce)
          e.kind, e.dtype, e.tp, e.reduce_op = TP_KIND[o.kind], o.dtype, true, o.reduce_op
          e.in_numel = o.kind == "tp_reduce_scatter" and o.count * n or o.count
          e.out_numel = o.kind == "tp_all_gather" and o.count * n or o.count
        elseif o.kind == "all_gather" then
          e.kind, e.in_numel, e.out_numel, e.dtype = "all_gather", o.count, o.count * n, o.dtype
        elseif o.kind == "reduce_scatter" then
          e.kind, e.in_numel, e.out_numel, e.dtype = "reduce_scatter", o.count * n, o.count, o.dtype
        elseif o.kind == "all_reduce" then
          e.kind, e.in_numel, e.out_numel, e.dtype = "all_reduce", o.count, o.count, o.dtype
        elseif o.kind == "a2a_counts" then
          e.kind, e.in_numel, e.out_numel, e.dtype = "all_to_all", o.a2a_experts * n, o.a2a_experts * n, "int64"
          e.label = e.layer .. " counts"
        else
          e.kind, e.dtype = "all_to_all", o.dtype
          -- (activation checkpointing's recompute in backward: the forward's dispatcher steps again)
          local fwd = o.phase == "forward" or o.recompute
          local combine = o.a2a_combine == 1 or o.a2a_combine == true
          -- forward: dispatch, combine; backward: the combine's gradient, then the dispatch's
          e.label = e.layer .. (fwd and (combine and " combine" or " dispatch") or (combine and " dispatch bwd" or
            " combine bwd"))
        end
        out[#out + 1] = e
      end
    end
  end
  return out
end

local function show(e)
  return fmt("%s on [%s] in %s out %s %s%s", e.kind, table.concat(e.ranks, ","), tostring(e.in_numel),
    tostring(e.out_numel), tostring(e.dtype), e.label and (" (" .. e.label .. ")") or "")
end

-- A plan parameter's local shape on global rank g, from the plan's layout
-- (its shard dim and the rank's coordinate in the unit's shard group), as
-- torch.chunk gives it.
local function local_shape(u, prm, g, fams)
  -- (an experts unit's shapes are already the rank's ep slice: num_experts
  -- / ep on dim 0, prm.ep_full the whole)
  local shape = {}
  for i, d in ipairs(prm.shape) do shape[i] = d end
  -- (no shard family at dp_shard 1: tp alone, every parameter whole on its rank)
  local fam = fams[u.shard_group or "fsdp"]
  local group = fam and fam[g] or { g }
  local n = #group
  if n > 1 then
    local pos
    for i, r in ipairs(group) do if r == g then pos = i - 1 end end
    local dim = (prm.shard_dim or 0) + 1
    local chunk = (shape[dim] + n - 1) // n
    local start = pos * chunk
    shape[dim] = math.max(0, math.min(chunk, shape[dim] - start))
  end
  return shape
end

-- float32, bit for bit: the recorder writes each value as the double of the
-- float, the dump as %.9g.
local function f32(x) return string.unpack("<f", string.pack("<f", x)) end

-- The reduced gradients of a case against commplan's dump: dumps[rank] is
-- the plan's binary's --dump of that rank (its grads_local: every parameter's
-- local shard after the step). Every parameter of the recording's rank
-- (c.grads_subset: only those, in a recording trimmed for the Lua tests),
-- every element. Returns a difference, or nil and the counts.
local function check_grads(c, dumps)
  local n = { ranks = 0, params = 0, elements = 0 }
  for _, r in ipairs(c.ranks) do
    local g = r.rank
    local got, d = r.grads_local, dumps[g]
    if type(got) ~= "table" then
      return fmt("rank %d: no reduced gradients recorded (tests/ep/torch_ep_record.py --plans)", g)
    end
    if type(d) ~= "table" or type(d.grads_local) ~= "table" then return fmt("rank %d: no dump of commplan's", g) end
    local want = d.grads_local
    local names = {}
    for _, name in ipairs(c.grads_subset or {}) do names[#names + 1] = name end
    if not c.grads_subset then
      for _, prm in ipairs(r.params) do names[#names + 1] = prm.name end
      local dumped = 0
      for _ in pairs(want) do dumped = dumped + 1 end
      if dumped ~= #names then
        return fmt("rank %d: commplan's dump has %d parameters' gradients, torchtitan %d", g, dumped, #names)
      end
    end
    for _, name in ipairs(names) do
      local x, y = got[name], want[name]
      if not x then return fmt("rank %d: no reduced gradient of %s recorded", g, name) end
      if not y then return fmt("rank %d: %s has no gradient in commplan's dump", g, name) end
      local a, b = x.values, y.values
      if #a ~= #b then
        return fmt("rank %d: %s reduced gradient shard has %d elements live, %d in commplan's dump", g, name, #a, #b)
      end
      for i = 1, #a do
        if f32(a[i]) ~= f32(b[i]) then
          return fmt("rank %d: %s reduced gradient element %d: torchtitan %.9g, commplan %.9g", g, name, i - 1, a[i],
            b[i])
        end
      end
      n.params, n.elements = n.params + 1, n.elements + #a
    end
    n.ranks = n.ranks + 1
  end
  return nil, n
end

-- dumps: optional, as check_grads takes them.
local function check_case(c, dumps)
  local src = plan_source(c)
  local ok, p = pcall(plan.from_source, src, c.case .. ".lua")
  if not ok then return "commplan refuses the case: " .. tostring(p) end
  local fams = {}
  for name, f in pairs(p.groups.by_name) do fams[name] = members_of(f) end
  local colls, a2a, recomputed, tpc = 0, 0, 0, 0
  for _, r in ipairs(c.ranks) do
    local g = r.rank
    local want = expected(p, g, fams)
    local got = {}
    for _, e in ipairs(r.events) do
      -- (the recorder's "other": functional collectives' autograd wrappers, no collective)
      if e.kind ~= "barrier" and e.kind ~= "other" then got[#got + 1] = e end
    end
    for i = 1, math.max(#got, #want) do
      local x, y = got[i], want[i]
      if not x or not y then
        return fmt("rank %d event %d: recorded %s, plan %s", g, i - 1, x and (x.kind .. " " .. tostring(x.ep)) or
          "nothing", y and show(y) or "nothing")
      end
      local xd = DTYPE[x.dtype] or x.dtype
      local same = x.kind == y.kind and same_list(x.ranks, y.ranks) and xd == y.dtype
      if same and y.label then
        -- the recompute's (the recorder names the block re-run in backward) where the plan's is one
        same = x.ep == y.label and (x.recompute or "") == (y.op.recompute and y.layer or "")
        if same and y.op.kind == "a2a" then
          same = x.row == y.op.a2a_dim
          for _, k in ipairs({ "in_splits", "out_splits" }) do
            for _, rows in ipairs(x[k] or {}) do
              if rows > y.op.a2a_capacity then
                return fmt("rank %d event %d (%s): %d rows to one member, past the plan's capacity %d", g, i - 1,
                  y.label, rows, y.op.a2a_capacity)
              end
            end
          end
        else
          same = same and x.in_numel == y.in_numel and x.out_numel == y.out_numel
        end
      elseif same then
        same = x.in_numel == y.in_numel and x.out_numel == y.out_numel
        if same and y.tp then same = (x.reduce_op or "-") == (y.reduce_op or "-") end
      end
      if not same then
        return fmt("rank %d event %d: recorded %s on [%s] in %s out %s %s (%s%s%s), plan %s [%s]", g, i - 1, x.kind,
          table.concat(x.ranks, ","), tostring(x.in_numel), tostring(x.out_numel), tostring(x.dtype),
          type(x.ep) == "string" and x.ep ~= "" and x.ep or tostring(x.fsdp),
          type(x.row) == "number" and (", row " .. x.row) or "",
          (x.recompute or "") ~= "" and (", recompute of " .. x.recompute) or "", show(y), y.unit)
      end
      if y.op.kind == "a2a" or y.op.kind == "a2a_counts" then
        a2a = a2a + 1
        if y.op.recompute then recomputed = recomputed + 1 end
      elseif y.tp then tpc = tpc + 1
      else colls = colls + 1 end
    end
    -- every parameter's local shard
    local by_name = {}
    for _, u in ipairs(class_of(p, g, fams).layout.units) do
      for _, prm in ipairs(u.params) do by_name[prm.name] = { u, prm } end
    end
    for _, prm in ipairs(r.params) do
      local hit = by_name[prm.name]
      if not hit then return fmt("rank %d: torchtitan's parameter %s is not in the plan", g, prm.name) end
      local shape = local_shape(hit[1], hit[2], g, fams)
      if not same_list(shape, prm["local"]) then
        return fmt("rank %d: %s local shape [%s] live, [%s] in the plan", g, prm.name, table.concat(prm["local"], ","),
          table.concat(shape, ","))
      end
    end
  end
  local res = { colls = colls, a2a = a2a, recomputed = recomputed, tp = tpc, ranks = #c.ranks }
  if dumps then
    local diff, n = check_grads(c, dumps)
    if diff then return diff end
    res.grads = n
  end
  return nil, res
end

-- The gpt-oss TP cases can fail: the same recording against two wrong
-- plans of its Partial bias gradients (gen/parallel/tp_acts.lua's
-- DENSE.gpt_oss) must differ -- wo's bias taken for whole (its all-reduce
-- dropped), and the Partial all-reduces issued in reverse parameter order.
-- nil when both differ (or the case is no gpt-oss TP case), else the mutant
-- that matched.
local function gpt_oss_mutants(c)
  if c.family ~= "gpt_oss" or (c.tp or 1) == 1 then return nil, 0 end
  local tp_acts = require("gen.parallel.tp_acts")
  local fam = tp_acts.DENSE.gpt_oss
  local saved, dense = fam.partial_always, tp_acts.dense
  local kept = {}
  for _, pat in ipairs(saved) do if not pat:find("wo%", 1, true) then kept[#kept + 1] = pat end end
  local function reversed(ctx, lay, ...)
    dense(ctx, lay, ...)
    for _, u in ipairs(lay.units) do
      local acts, first = u.tp_acts or {}, nil
      for i, a in ipairs(acts) do if a.reducing_only and not first then first = i end end
      if first then
        local j = #acts
        while first < j do acts[first], acts[j], first, j = acts[j], acts[first], first + 1, j - 1 end
      end
    end
  end
  local mutants = { { "wo.bias's all-reduce dropped", function() fam.partial_always = kept end },
                    { "the Partial all-reduces reversed", function() tp_acts.dense = reversed end } }
  for _, m in ipairs(mutants) do
    m[2]()
    local ok, diff = pcall(check_case, c)
    fam.partial_always, tp_acts.dense = saved, dense
    if ok and diff == nil then return m[1], 0 end
  end
  return nil, #mutants
end

local function read_json(path)
  local fh, err = io.open(path, "rb")
  if not fh then return nil, err end
  local v = json.decode(fh:read("a"))
  fh:close()
  return v
end

-- DIR/<case>/ep_live_<case>.rank<r>.json, every rank of the case.
local function load_dumps(dir, c)
  local dumps = {}
  for _, r in ipairs(c.ranks) do
    local path = fmt("%s/%s/%s.rank%d.json", dir, c.case, plan_name(c), r.rank)
    local d, err = read_json(path)
    if not d then return nil, fmt("no dump of commplan's for rank %d: %s", r.rank, err) end
    dumps[r.rank] = d
  end
  return dumps
end

local function write_plans(dir, specs)
  for _, path in ipairs(specs) do
    local c = assert(read_json(path))
    local out = fmt("%s/%s.lua", dir, plan_name(c))
    local fh = assert(io.open(out, "wb"))
    fh:write(plan_source(c), "\n")
    fh:close()
  end
  return 0
end

local function main(argv)
  local files, dumps_dir = {}, nil
  local i = 1
  while i <= #argv do
    if argv[i] == "--dumps" then dumps_dir, i = argv[i + 1], i + 2
    elseif argv[i] == "--write-plans" then
      local specs = {}
      for j = i + 2, #argv do specs[#specs + 1] = argv[j] end
      return write_plans(argv[i + 1], specs)
    else files[#files + 1], i = argv[i], i + 1 end
  end
  if #files == 0 or (argv[#argv] == "--dumps") then
    io.stderr:write("usage: lua5.4 tests/ep/compare_ep_live.lua [--dumps DIR] CASE.json...\n"
      .. "       lua5.4 tests/ep/compare_ep_live.lua --write-plans DIR SPEC.json...\n")
    return 2
  end
  local total = { cases = 0, ranks = 0, colls = 0, a2a = 0, recomputed = 0, tp = 0, params = 0, elements = 0 }
  for _, path in ipairs(files) do
    local c = assert(read_json(path))
    local dumps, diff, res
    if dumps_dir then dumps, diff = load_dumps(dumps_dir, c) end
    if not diff then diff, res = check_case(c, dumps) end
    if diff then
      print(fmt("ep-live: DIFFERENCE %s (%s): %s", c.case, path, diff))
      return 1
    end
    local matched, differ = gpt_oss_mutants(c)
    if matched then
      print(fmt("ep-live: %s: the recording matched a wrong plan too (%s)", c.case, matched))
      return 1
    end
    if differ > 0 then
      print(fmt("ep-live: %s against %d wrong plans (wo.bias's all-reduce dropped; the Partial bias all-reduces "
        .. "reversed): each differs, as it must", c.case, differ))
    end
    local grads = res.grads and fmt(", reduced gradients equal element for element (%d parameter shards, %d elements)",
      res.grads.params, res.grads.elements) or ""
    local ac = (c.ac and c.ac ~= "none") and fmt(", %s checkpointing", c.ac) or ""
    local rec = res.recomputed > 0 and fmt(", %d of them the recompute's in backward", res.recomputed) or ""
    local tp = (c.tp or 1) > 1 and fmt(", tp %d", c.tp) or ""
    local tpc = (c.tp or 1) > 1 and fmt(", TP collectives equal (%d)", res.tp) or ""
    print(fmt("ep-live: %s (world %d, dp_shard %d%s, ep %d%s): %d ranks, FSDP collectives equal (%d)%s, token "
      .. "all-to-alls equal and within capacity (%d%s), every parameter's local shard equal%s", c.case, c.world,
      c.dp_shard, tp, c.ep, ac, res.ranks, res.colls, tpc, res.a2a, rec, grads))
    total.cases, total.ranks = total.cases + 1, total.ranks + res.ranks
    total.colls, total.a2a = total.colls + res.colls, total.a2a + res.a2a
    total.recomputed, total.tp = total.recomputed + res.recomputed, total.tp + res.tp
    if res.grads then total.params, total.elements = total.params + res.grads.params, total.elements + res.grads.elements end
  end
  print(fmt("ep-live: all %d cases equal: %d ranks, %d FSDP collectives, %d TP collectives, %d token all-to-alls "
    .. "(%d recomputed)%s", total.cases, total.ranks, total.colls, total.tp, total.a2a, total.recomputed,
    dumps_dir and fmt("; reduced gradients: %d ranks, %d parameter shards, %d elements compared, 0 differ",
      total.ranks, total.params, total.elements) or ""))
  return 0
end

if arg and arg[0] and arg[0]:match("compare_ep_live%.lua$") then
  os.exit(main(arg))
end

return { check_case = check_case, check_grads = check_grads, plan_source = plan_source, plan_name = plan_name,
         gpt_oss_mutants = gpt_oss_mutants }
