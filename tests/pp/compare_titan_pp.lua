-- Compares what torchtitan 0.3's own pipeline (pipeline_llm, live on gloo:
-- tests/pp/torch_pp_titan_record.py) issued with commplan's pipeline tables
-- for the same model, mesh and schedule (issue 35): PP on qwen3, PP x EP on
-- DeepSeek-V3, Qwen3 MoE and gpt-oss, PP x TP on gpt-oss (its TP
-- collectives: kind, the tp group, numel, dtype, reduce op; and the
-- Partial bias gradients' all-reduces).
--
-- Per case the plan of the recorded job is generated (its proofs run: the
-- tables equal gen/parallel/pp_sequence.lua's sequence, the whole step
-- deadlock-free); then per global rank the step's events (phase "step":
-- the schedule's shape inference is not part of a step) must equal the
-- tables' (gen/parallel/pp_tables.lua's events, every pipeline rank's TP
-- class 0), in order, one for one:
--   - sends and receives: the peer's global rank, numel, dtype;
--   - FSDP's all-gathers and reduce-scatters (HSDP's all-reduces): the
--     group's global ranks (dense units on dp_shard, experts on efsdp),
--     input and output numel, dtype;
--   - EP's token counts' all-to-all: the ep group, int64, num_experts
--     elements (experts per member x ep);
--   - EP's token all-to-alls: the ep group, which of the dispatcher's steps
--     (dispatch / combine, " bwd" their gradients, the recompute's under
--     activation checkpointing), rows of dim elements, every recorded
--     per-member split within the plan's capacity (the tables take the
--     splits at run time);
-- nothing else may be issued.
--   lua5.4 tests/pp/compare_titan_pp.lua CASE.json...
-- One line per case and a closing line with the totals; exit 1 on the first
-- difference.
package.path = "./?.lua;" .. package.path
local json = require("gen.json")
local plan = require("gen.plan")
local tables = require("gen.parallel.pp_tables")
local seq = require("gen.parallel.pp_sequence")

local fmt = string.format
local DTYPE = { float32 = "fp32", bfloat16 = "bf16", int64 = "int64" }
local GQA_MOE = { "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "moe_hidden_dim", "num_experts",
                 "top_k" }
local FIELDS = { qwen3 = { "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "hidden_dim" },
                 qwen3_moe = GQA_MOE, mixtral = GQA_MOE, gpt_oss = GQA_MOE,
                 deepseek_v3 = { "dim", "n_layers", "n_dense_layers", "n_heads", "vocab_size", "q_lora_rank",
                                 "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                 "dense_hidden_dim", "moe_hidden_dim", "num_experts", "num_shared_experts",
                                 "top_k" } }

-- commplan's plan file of a recorded case (fp32, gradients summed: the
-- recorder forces SUM, torchtitan's divide factor is 1).
local function plan_source(s)
  local m = {}
  for _, k in ipairs(FIELDS[s.family]) do m[#m + 1] = fmt("%s = %d", k, s.model[k]) end
  if s.family == "qwen3" then m[#m + 1] = "enable_weight_tying = false" end
  return fmt([[return { world_size = %d, parallel = { pp = %d, dp_shard = %d%s%s },
  model = { family = %q, dtype = "fp32", seq_len = %d, %s },
  fsdp = { %sreduce_op = "sum"%s },
  training = { local_batch_size = %d, activation_checkpointing = %q },
  pipeline = { schedule = %q, microbatches = %d%s } }]], s.world, s.pp, s.dp_shard,
    s.ep > 1 and fmt(", ep = %d", s.ep) or "", (s.tp or 1) > 1 and fmt(", tp = %d", s.tp) or "", s.family, s.seq, table.concat(m, ", "),
    -- (torchtitan's mixed_precision_param bf16 where the case says so; reductions fp32)
    s.param_dtype == "bf16" and 'param_dtype = "bf16", reduce_dtype = "fp32", ' or "",
    (s.raf and s.raf ~= "default") and fmt(", reshard_after_forward_policy = %q", s.raf) or "", s.batch, s.ac or "none",
    s.schedule, s.batch, s.csv and fmt(", csv = %q", s.case .. ".csv") or "")
end

-- (issue 41) a case with torchtitan's pipeline_parallel_schedule_csv: its CSV beside the plan file in dir
local function write_csv(dir, s)
  if not s.csv then return end
  local fh = assert(io.open(fmt("%s/%s.csv", dir, s.case), "wb"))
  fh:write(s.csv)
  fh:close()
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- --policy P (a mutant, tests/pp/check_titan_pp.sh): the plan written with
-- fsdp.reshard_after_forward_policy = P whatever the recorded job set
local policy_override

local function compare(path, mutant)
  local rec = json.decode(assert(io.open(path)):read("a"))
  local s = rec.spec
  s.case = rec.case
  if policy_override then s.raf = policy_override end
  for k, v in pairs(mutant or {}) do s[k] = v end
  -- (the plan beside its CSV: --write-plans wrote both to the recording's specs directory)
  local dir = (path:match("^(.*)/[^/]*$") or ".") .. "/specs"
  local p = plan.from_source(plan_source(s), s.csv and (dir .. "/pp_titan_" .. rec.case .. ".lua")
    or ("pp_titan_" .. rec.case .. ".lua"))
  local inner = p.pipeline.stage_plan
  local W, R, E, TP = inner.dims.dp_shard, inner.dims.dp_replicate, inner.dims.ep, inner.dims.tp
  local first = {}
  for _, c in ipairs(p.tp_classes) do
    if (c.tp_class or 0) == 0 then first[c.pp_rank + 1] = { pp_rank = c.pp_rank, units = c.layout.units, ops = c.ops } end
  end
  -- (each a2a op's combine flag and phase, which events() reads from the ops)
  local want = tables.events(first, seq.mesh(s.pp, W, R, E, TP), W)
  if TP > 1 and E == 1 then
    -- TP inside each stage (mesh [pp, dp_shard, tp], tp innermost): the
    -- events of the mesh without tp, TP's collectives in them (opts.tp),
    -- copied to each TP rank t: global rank g' * TP + t, TP's on the ranks
    -- beside it
    local small = tables.events(first, seq.mesh(s.pp, W, R, E, 1), W, { tp = true })
    want = {}
    for g = 0, s.world - 1 do
      local t, ev = g % TP, {}
      for i, e in ipairs(small[g // TP + 1]) do
        local c = {}
        for k, v in pairs(e) do c[k] = v end
        c.ranks = nil
        if e.tp then
          c.ranks = {}
          for j = 0, TP - 1 do c.ranks[j + 1] = g - t + j end
          c.in_numel = e.op == "reduce_scatter" and e.count * TP or e.count
          c.out_numel = e.op == "all_gather" and e.count * TP or e.count
        else
          if e.ranks then
            c.ranks = {}
            for j, r in ipairs(e.ranks) do c.ranks[j] = r * TP + t end
          end
          c.peer = e.peer and e.peer * TP + t
        end
        ev[i] = c
      end
      want[g + 1] = ev
    end
  end
  local n, a2a, tpc = 0, 0, 0
  for g, r in ipairs(rec.ranks) do
    local got = {}
    for _, e in ipairs(r.events) do
      -- (funcol's _wrap_tensor_autograd, after a TP all-reduce: a wrapper, nothing on the wire)
      if e.phase == "step" and e.op ~= "_c10d_functional._wrap_tensor_autograd" then got[#got + 1] = e end
    end
    local w = want[g]
    local function fail(i, why)
      error(fmt("%s: global rank %d, event %d: %s (torchtitan: %s %s, commplan: %s %s)", rec.case, g - 1, i - 1,
        why, got[i] and got[i].kind or "nothing", got[i] and (got[i].ep or got[i].fsdp or "") or "",
        w[i] and w[i].op or "nothing", w[i] and (w[i].exchange or w[i].unit or "") or ""), 0)
    end
    for i = 1, math.max(#got, #w) do
      local x, y = got[i], w[i]
      if not x or not y then fail(i, "one side ends") end
      local dt = DTYPE[x.dtype] or x.dtype
      if y.op == "send" or y.op == "recv" then
        if x.kind ~= y.op or x.peer ~= y.peer or x.numel ~= y.numel or dt ~= y.dtype then
          fail(i, fmt("p2p: peer %s numel %s %s vs peer %s numel %s %s", tostring(x.peer), tostring(x.numel), dt,
            tostring(y.peer), tostring(y.numel), y.dtype))
        end
      elseif y.op == "a2a_counts" then
        if x.kind ~= "all_to_all" or not same_list(x.ranks, y.ranks) or dt ~= "int64"
          or x.in_numel ~= y.in_numel * #y.ranks or not (x.ep or ""):match(" counts$") then
          fail(i, "the token counts' exchange")
        end
        a2a = a2a + 1
      elseif y.op == "a2a" then
        local label = (x.ep or ""):match("^%S+ (.*)$")
        if x.kind ~= "all_to_all" or not same_list(x.ranks, y.ranks) or dt ~= y.dtype or label ~= y.exchange
          or x.row ~= s.model.dim then
          fail(i, fmt("token exchange %s (row %s) vs %s", tostring(label), tostring(x.row), y.exchange))
        end
        -- every member's rows within the plan's capacity (count = capacity x dim per member)
        for _, splits in ipairs({ x.in_splits or {}, x.out_splits or {} }) do
          for _, rows in ipairs(splits) do
            if rows * s.model.dim > y.in_numel then fail(i, fmt("%d rows beyond the capacity", rows)) end
          end
        end
        a2a = a2a + 1
      else
        if y.tp then tpc = tpc + 1 end
        if x.kind ~= y.op or not same_list(x.ranks, y.ranks) or x.in_numel ~= y.in_numel
          or x.out_numel ~= y.out_numel or dt ~= y.dtype
          or (y.tp and (x.reduce_op or "sum") ~= (y.reduce_op or "sum")) then
          fail(i, fmt("%s in %s out %s %s vs %s in %s out %s %s", tostring(x.kind), tostring(x.in_numel),
            tostring(x.out_numel), dt, y.op, tostring(y.in_numel), tostring(y.out_numel), y.dtype))
        end
      end
      n = n + 1
    end
  end
  return n, a2a, #rec.ranks, tpc
end

-- --write-plans DIR SPEC.json...: each case's plan file (DIR/pp_titan_<case>.lua)
-- and commplan's parameter ids per global rank (DIR/<case>.ids.json: the
-- oracle pattern's k, cp_pattern_param_id: 100 x the unit's index in the
-- rank's pipeline class + the parameter's index in the unit), for the
-- recorder's --ids before torch runs.
if arg[1] == "--write-plans" then
  local dir = arg[2]
  for i = 3, #arg do
    local rec = json.decode(assert(io.open(arg[i])):read("a"))
    rec.spec.case = rec.case
    local src = plan_source(rec.spec)
    local fh = assert(io.open(fmt("%s/pp_titan_%s.lua", dir, rec.case), "w"))
    fh:write(src, "\n")
    fh:close()
    write_csv(dir, rec.spec)
    local p = plan.from_source(src, fmt("%s/pp_titan_%s.lua", dir, rec.case))
    local by_pp = {}
    for _, c in ipairs(p.tp_classes) do
      local ids = {}
      for ui, u in ipairs(c.layout.units) do
        for j, q in ipairs(u.params) do ids[q.name] = 100 * (ui - 1) + (j - 1) end
      end
      by_pp[c.pp_rank] = ids
    end
    local ranks = {}
    local per = rec.spec.world // rec.spec.pp
    for g = 0, rec.spec.world - 1 do ranks[#ranks + 1] = by_pp[g // per] end
    fh = assert(io.open(fmt("%s/%s.ids.json", dir, rec.case), "w"))
    fh:write(json.encode({ case = rec.case, microbatches = rec.spec.batch, ranks = ranks }), "\n")
    fh:close()
  end
  os.exit(0)
end

-- --dumps DIR: the reduced gradients too, every rank's every parameter's
-- local shard, element for element (float32), against DIR/pp_titan_<case>.rank<r>.json
-- (the plan's binary's --simulate --pattern oracle --dump).
local dumps_dir
local files = {}
do
  local i = 1
  while i <= #arg do
    if arg[i] == "--dumps" then dumps_dir, i = arg[i + 1], i + 2
    elseif arg[i] == "--policy" then policy_override, i = arg[i + 1], i + 2
    else files[#files + 1] = arg[i]; i = i + 1 end
  end
end

local function f32(x) return string.unpack("<f", string.pack("<f", x)) end

local function check_grads(path)
  local rec = json.decode(assert(io.open(path)):read("a"))
  local n = 0
  for g, r in ipairs(rec.ranks) do
    local fh = io.open(fmt("%s/pp_titan_%s.rank%d.json", dumps_dir, rec.case, g - 1))
    if not fh then error(fmt("%s: rank %d: no dump of commplan's", rec.case, g - 1), 0) end
    local want = json.decode(fh:read("a")).grads_local
    fh:close()
    if type(r.grads_local) ~= "table" then error(fmt("%s: rank %d: no reduced gradients recorded", rec.case, g - 1), 0) end
    local names, dumped = {}, 0
    for name in pairs(r.grads_local) do names[#names + 1] = name end
    for _ in pairs(want) do dumped = dumped + 1 end
    table.sort(names)
    if dumped ~= #names then
      error(fmt("%s: rank %d: commplan's dump has %d parameters' gradients, torchtitan %d", rec.case, g - 1, dumped,
        #names), 0)
    end
    for _, name in ipairs(names) do
      local a, b = r.grads_local[name].values, want[name] and want[name].values
      if not b then error(fmt("%s: rank %d: %s has no gradient in commplan's dump", rec.case, g - 1, name), 0) end
      if #a ~= #b then error(fmt("%s: rank %d: %s: %d elements live, %d in commplan's dump", rec.case, g - 1, name,
        #a, #b), 0) end
      for i = 1, #a do
        if f32(a[i]) ~= f32(b[i]) then
          error(fmt("%s: rank %d: %s reduced gradient element %d: torchtitan %.9g, commplan %.9g", rec.case, g - 1,
            name, i - 1, a[i], b[i]), 0)
        end
      end
      n = n + #a
    end
  end
  return n
end

-- Wrong plans each recording of a family must differ from (the comparison
-- can fail): gpt-oss's held against mixtral's block of the same numbers
-- (no attention sinks, no q/k/v/o or expert biases: the same units, other
-- slots) and against GPipe for its 1F1B (the same collectives, another
-- order of sends and receives).
local MUTANTS = { gpt_oss = { { what = "mixtral's block (no sinks, no biases)", family = "mixtral" },
                              { what = "GPipe for 1F1B", schedule = "GPipe" } } }

local function check_mutants(path)
  local rec = json.decode(assert(io.open(path)):read("a"))
  local n = 0
  for _, m in ipairs(MUTANTS[rec.spec.family] or {}) do
    local wrong = {}
    for k, v in pairs(m) do if k ~= "what" then wrong[k] = v end end
    local ok, why = pcall(compare, path, wrong)
    if ok then error(fmt("%s: the wrong plan (%s) equals the recording", rec.case, m.what), 0) end
    print(fmt("pp-titan: %s against the wrong plan (%s) differs: %s", rec.case, m.what, why))
    n = n + 1
  end
  return n
end

local cases, events, a2as, elements, mutants = 0, 0, 0, 0, 0
for _, path in ipairs(files) do
  local ok, n, a2a, ranks, tpc = pcall(compare, path)
  if ok then
    local good, m = pcall(check_mutants, path)
    if not good then ok, n = false, m else mutants = mutants + m end
  end
  if ok and dumps_dir then
    local good, e = pcall(check_grads, path)
    if not good then ok, n = false, e else elements = elements + e end
  end
  if not ok then
    print("pp-titan: FAIL " .. tostring(n))
    os.exit(1)
  end
  print(fmt("pp-titan: %s equal: %d events on %d ranks (%d all-to-alls%s)", path:match("([^/]+)%.json$"), n, ranks,
    a2a, (tpc or 0) > 0 and fmt(", %d TP collectives", tpc) or ""))
  cases, events, a2as = cases + 1, events + n, a2as + a2a
end
print(fmt("pp-titan: %d cases, %d events (%d all-to-alls) equal to torchtitan's, in order%s%s", cases, events, a2as,
  dumps_dir and fmt("; reduced gradients: %d elements equal, float32 bit for bit", elements) or "",
  mutants > 0 and fmt("; %d wrong plans differ", mutants) or ""))
