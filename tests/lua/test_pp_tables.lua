-- gen/parallel/pp_tables.lua: each pipeline rank's tables, against what
-- torch.distributed.pipelining + fully_shard issue (gen/parallel/
-- pp_sequence.lua's expected events, which tests/pp/check_pipeline_live.sh
-- holds to torch 2.15 live): every global rank's sends, receives and FSDP
-- collectives, in order, field by field.
local H = require("helpers")
local load = require("gen.load")
local plan = require("gen.plan")
local report = require("gen.pipeline")
local tables = require("gen.parallel.pp_tables")
local seq = require("gen.parallel.pp_sequence")
local pipeline_audit = require("gen.pipeline_audit")
local fold = require("gen.fold")
local T = {}

local SRC = H.read("tests/pp/plans/pp_tiny.lua")

local function loaded(src) return load.source(src, "tests/pp/plans/pp_tiny.lua") end

local function variant(schedule, pp, mb, world)
  return (SRC:gsub('schedule = "1F1B", microbatches = 4', string.format('schedule = %q, microbatches = %d', schedule, mb))
    :gsub("pp = 2,", "pp = " .. pp .. ","):gsub("world_size = 4", "world_size = " .. world)
    :gsub("local_batch_size = 4", "local_batch_size = " .. mb))
end

local function same(got, want, what)
  for g = 1, math.max(#got, #want) do
    local a, b = got[g] or {}, want[g] or {}
    for i = 1, math.max(#a, #b) do
      local x, y = a[i], b[i]
      if not x or not y then
        error(string.format("%s: global rank %d: event %d: tables %s, torch %s", what, g - 1, i - 1,
          x and x.op or "nothing", y and y.op or "nothing"))
      end
      for _, k in ipairs({ "op", "peer", "numel", "dtype", "batch", "unit", "in_numel", "out_numel" }) do
        if x[k] ~= y[k] then
          error(string.format("%s: global rank %d: event %d (%s): %s is %s in the tables, %s in torch's", what,
            g - 1, i - 1, y.op, k, tostring(x[k]), tostring(y[k])))
        end
      end
      if y.ranks then H.list_eq(x.ranks, y.ranks, what .. " group") end
    end
  end
end

-- Every schedule whose actions the tables run, at pp 2 and 4 (one and two
-- stages per rank), FSDP over 2: the tables issue what torch issues.
function T.tables_issue_what_torch_issues()
  local n = 0
  for _, case in ipairs({ { "GPipe", 2, 4, 4 }, { "1F1B", 2, 4, 4 }, { "1F1B", 4, 8, 8 },
                          { "Interleaved1F1B", 2, 4, 4 }, { "LoopedBFS", 2, 4, 4 },
                          { "Interleaved1F1B", 2, 8, 4 }, { "InterleavedZeroBubble", 2, 4, 4 },
                          { "ZBVZeroBubble", 2, 4, 4 }, { "DualPipeV", 2, 4, 4 }, { "DualPipeV", 2, 8, 4 } }) do
    local name, pp, mb, world = table.unpack(case)
    local t = report.tables(loaded(variant(name, pp, mb, world)))
    local W = t.p.dims.dp_shard
    local mesh = seq.mesh(pp, W)
    local got = tables.events(t.classes, mesh, W)
    local want = seq.expected(t.sched, { dp_shard = W, act_numel = t.act.numel, act_dtype = t.act.dtype,
                                         stage_fsdp = t.stage_fsdp })
    same(got, want, string.format("%s pp%d mb%d", name, pp, mb))
    n = n + 1
  end
  H.eq(n, 10, "cases")
  -- HSDP x PP (tests/pp/plans/pp_tiny_lbfs.lua: pp 2 x dp_replicate 2 x
  -- dp_shard 2): every rank's all-reduces too, on its replicate group
  local t = report.tables(load.source(H.read("tests/pp/plans/pp_tiny_lbfs.lua"), "tests/pp/plans/pp_tiny_lbfs.lua"))
  local W, R = t.p.dims.dp_shard, t.p.dims.dp_replicate
  H.eq(R, 2, "replicas")
  local mesh = seq.mesh(2, W, R)
  local got = tables.events(t.classes, mesh, W)
  local want = seq.expected(t.sched, { dp_shard = W, dp_replicate = R, act_numel = t.act.numel,
                                       act_dtype = t.act.dtype, stage_fsdp = t.stage_fsdp })
  same(got, want, "LoopedBFS pp2 x HSDP 2x2")
  local ar = 0
  for _, e in ipairs(got[1]) do if e.op == "all_reduce" then ar = ar + 1 end end
  assert(ar > 0, "HSDP all-reduces among rank 0's events")
  -- dp_replicate alone (dp_shard 1, torchtitan's fully_shard on a
  -- (dp_replicate, fsdp = 1) mesh): FSDP2 issues no all-gather or
  -- reduce-scatter on a group of one rank, only the all-reduces; the plan
  -- builds (it was an internal error) and its tables issue exactly those
  local src = H.read("tests/pp/plans/pp_tiny_lbfs.lua"):gsub("world_size = 8", "world_size = 4")
    :gsub("dp_shard = %-1", "dp_shard = 1")
  t = report.tables(load.source(src, "pp_tiny_lbfs_dr2.lua"))
  H.eq(t.p.dims.dp_shard * 10 + t.p.dims.dp_replicate, 12, "dp_shard 1 x dp_replicate 2")
  got = tables.events(t.classes, seq.mesh(2, 1, 2), 1)
  want = seq.expected(t.sched, { dp_shard = 1, dp_replicate = 2, act_numel = t.act.numel, act_dtype = t.act.dtype,
                                 stage_fsdp = t.stage_fsdp })
  same(got, want, "LoopedBFS pp2 x dp_replicate 2")
  local kinds = {}
  for _, e in ipairs(want[1]) do kinds[e.op] = (kinds[e.op] or 0) + 1 end
  assert(kinds.all_reduce and not kinds.all_gather and not kinds.reduce_scatter, "only all-reduces")
  assert(plan.from_source(src, "pp_tiny_lbfs_dr2.lua").pipeline, "the plan builds")
end

-- Each rank holds its stages' units, renumbered, and only them; the step
-- ends with every unit resharded; messages sit on stage boundaries.
function T.rank_tables_hold_their_stages()
  local t = report.tables(loaded(variant("Interleaved1F1B", 2, 4, 4)))
  H.eq(#t.classes, 2, "a class per pipeline rank")
  for r, cls in ipairs(t.classes) do
    for i, u in ipairs(cls.units) do H.eq(u.index, i - 1, "renumbered") end
    H.eq(#cls.stages, 2, "two stages per rank")
    local live = {}
    for _, o in ipairs(cls.ops) do
      assert(o.unit >= 0 and o.unit < #cls.units, "op unit in range")
      if o.kind == "copy_out" then live[o.unit] = true elseif o.kind == "reshard" then live[o.unit] = nil end
      if o.kind == "send" or o.kind == "recv" then
        H.eq(cls.units[o.unit + 1].pp_numel, t.act.numel, "message unit")
        assert(o.peer ~= r - 1, "a peer on another rank")
        assert(o.tag >= 0 and o.tag < 2 * t.sched.num_stages, "tag")
      end
    end
    H.eq(next(live), nil, "every unit resharded at the end of the step")
  end
end

-- Zero bubble's split backward: I is the input gradient alone
-- (backward_input, no weight grads), W the weight gradient (backward, which
-- writes them), each once per unit and microbatch; on the first stage I
-- runs nothing and W the whole backward (stage.py:1318-1321: its units
-- have no backward_input, their backward the whole one); an action the
-- tables do not know is refused by name.
function T.split_backward_runs_as_input_then_weight()
  local t = report.tables(loaded(variant("ZBVZeroBubble", 2, 4, 4)))
  local whole = 0
  for _, cls in ipairs(t.classes) do
    local n = {}
    local first = {}
    for _, u in ipairs(t.stage_units[0]) do
      if cls.unit_of[0] and cls.unit_of[0][u.index] then first[cls.unit_of[0][u.index].index] = true end
    end
    for _, o in ipairs(cls.ops) do
      if o.kind == "backward_input" or o.kind == "backward" then
        local k = o.kind .. ":" .. o.unit .. ":" .. o.micro_step
        n[k] = (n[k] or 0) + 1
        if first[o.unit] then
          H.eq(o.kind == "backward" and o.grads == nil, true, "the first stage's whole backward at W: " .. k)
          whole = whole + 1
        elseif o.kind == "backward" then
          assert(n["backward_input:" .. o.unit .. ":" .. o.micro_step], "W after its I: " .. k)
        end
      end
    end
    for k, c in pairs(n) do H.eq(c, 1, k) end
  end
  assert(whole > 0, "the first stage's units")
  local ok, err = pcall(tables.rank_tables, nil, { schedule = "X", lowered = { { { type = "Z" } } } })
  H.eq(ok, false, "an unknown action is refused")
  assert(tostring(err):find("Z, which the tables do not run yet", 1, true), tostring(err))
end

-- Zero bubble's split backward priced (gen/compute.lua backward_us, one
-- rule for the tables' ops and the timed run): on every stage but the
-- first, I (the dX part, attention's backward, the recompute) and W (the
-- dW GEMMs) add up to the stage's B, I the larger; on the first stage I
-- computes nothing and W the whole B (stage.py:1318-1321, 1393-1415). The
-- tables' ops price the same way, unit by unit; and the timed step of
-- InterleavedZeroBubble grows over an even split of the backward (less of
-- it is deferrable W to fill the bubble with).
function T.split_backward_priced_as_input_and_weight()
  local compute = require("gen.compute")
  local function near(got, want, what)
    assert(math.abs(got - want) <= 1e-9 * math.max(1, math.abs(want)), string.format("%s: %.17g vs %.17g", what, got, want))
  end
  local function run(name)
    local rec = {}
    local row = report.plan_row(loaded(variant(name, 2, 4, 4)), { record = rec })
    local d = {}
    for _, a in ipairs(rec) do if a.mb == 0 then d[a.stage .. a.type] = a.finish - a.start end end
    return d, row.sim.step_us
  end
  local b = run("Interleaved1F1B")
  for _, name in ipairs({ "ZBVZeroBubble", "InterleavedZeroBubble" }) do
    local d = run(name)
    H.eq(d["0I"], 0, name .. ": the first stage's I")
    near(d["0W"], b["0B"], name .. ": the first stage's W is its B")
    for st = 1, 3 do
      near(d[st .. "I"] + d[st .. "W"], b[st .. "B"], name .. ": I + W = B on stage " .. st)
      assert(d[st .. "I"] > d[st .. "W"] and d[st .. "W"] > 0, name .. ": I > W > 0 on stage " .. st)
    end
  end
  local _, step = run("InterleavedZeroBubble")
  local real = compute.backward_us
  compute.backward_us = function(r, part)
    if part == "weight" then return r.bwd_us / 2 end
    return (part == "input" and r.bwd_us / 2 or r.bwd_us) + r.recompute_us
  end
  local ok, why, even = pcall(run, "InterleavedZeroBubble")
  compute.backward_us = real
  assert(ok, why)
  assert(step > even, string.format("the step over the even split's: %g vs %g", step, even))
  -- the tables' I and W ops, unit by unit: their sum the unit's backward
  local t = report.tables(loaded(variant("ZBVZeroBubble", 2, 4, 4)))
  local s = compute.settings(t.p)
  local pu = compute.units(t.p, s)
  local seen, priced = 0, 0
  for _, cls in ipairs(t.classes) do
    local view = setmetatable({ layout = { units = cls.units, W = t.p.layout.W } }, { __index = t.p })
    local per_unit, sum = {}, {}
    for _, u in ipairs(cls.units) do per_unit[u.index] = pu[u.global] end
    for _, o in ipairs(cls.ops) do
      if o.kind == "backward_input" or o.kind == "backward" then
        local k = o.unit .. ":" .. o.micro_step
        local us = compute.op_us(view, s, per_unit, o)
        sum[k] = (sum[k] or 0) + us
        if o.kind == "backward_input" and us > 0 then priced = priced + 1 end
      end
    end
    for k, us in pairs(sum) do
      local u = cls.units[tonumber(k:match("^(%d+)")) + 1]
      near(us, compute.backward_us(per_unit[u.index]), "I + W of unit " .. u.name)
      seen = seen + 1
    end
  end
  assert(seen > 0 and priced > 0, "split backward ops, I's priced")
end

-- pipeline.csv: a schedule imported from torch's CSV format (as
-- _load_csv takes it) runs as the schedule it writes: the CSV commplan
-- writes for Interleaved1F1B, read back, gives the same tables; a CSV for
-- another pipeline and a single-stage class are refused with the field.
function T.csv_schedule_in_the_plan_file()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local src = variant("Interleaved1F1B", 2, 4, 4)
  local csv = report.csv(loaded(src))
  local fh = assert(io.open(dir .. "/s.csv", "w")); fh:write(csv); fh:close()
  local path = dir .. "/p.lua"
  local with = src:gsub("pipeline = {", 'pipeline = { csv = "s.csv",')
  local a = report.tables(load.source(with, path))
  local b = report.tables(loaded(src))
  H.eq(a.sched.schedule, "Interleaved1F1B (CSV)", "the imported schedule")
  local mesh = seq.mesh(2, 2)
  local ea, eb = tables.events(a.classes, mesh, 2), tables.events(b.classes, mesh, 2)
  for g = 1, #eb do
    H.eq(#ea[g], #eb[g], "events of rank " .. (g - 1))
    for i = 1, #eb[g] do H.eq(ea[g][i].op .. tostring(ea[g][i].peer), eb[g][i].op .. tostring(eb[g][i].peer), "event") end
  end
  -- a third row repeating the first: refused by its row count, before anything is lowered
  fh = assert(io.open(dir .. "/s.csv", "w")); fh:write(csv .. csv:match("^[^\n]*\n")); fh:close()
  H.plan_fails_with(function() report.tables(load.source(with, path)) end, "pipeline.csv:",
    "s.csv has 3 rows; the plan's pipeline has 2 ranks (parallel.pp)")
  -- the second row holding the first row's first cell: two ranks run stage 0
  fh = assert(io.open(dir .. "/s.csv", "w")); fh:write((csv:gsub("\n,1F0,", "\n,0F0,", 1))); fh:close()
  H.plan_fails_with(function() report.tables(load.source(with, path)) end, "pipeline.csv:",
    "stage 0 is also on rank 0", "fix the file")
  H.plan_fails_with(function() report.tables(load.source(with:gsub('"Interleaved1F1B"', '"1F1B"'), path)) end,
    "pipeline.csv:", "torch loads no CSV for it")
  H.plan_fails_with(function() report.tables(load.source(with:gsub('"s.csv"', '"none.csv"'), path)) end,
    "pipeline.csv:", "none.csv does not exist")
  -- a microbatch past the plan's four, named as such
  fh = assert(io.open(dir .. "/s.csv", "w")); fh:write((csv:gsub("0F0,", "0F9,", 1))); fh:close()
  H.plan_fails_with(function() report.tables(load.source(with, path)) end, "pipeline.csv:",
    "0F9 names microbatch 9, and the step has microbatches 0..3")
  H.plan_fails_with(function() report.tables(load.source(with:gsub('"s.csv"', '"a\\1b.csv"'), path)) end,
    "pipeline.csv:", "it holds a control character")
  fh = assert(io.open(dir .. "/e.csv", "w")); fh:write("\n"); fh:close()
  H.plan_fails_with(function() report.tables(load.source(with:gsub('"s.csv"', '"e.csv"'), path)) end,
    "pipeline.csv:", "e.csv is empty")
  os.execute("rm -rf " .. dir)
end

-- The generator builds a pipeline plan into tables: a class per pipeline
-- rank (its own units and ops) over the whole world's mesh; plan.c holds
-- every class and the runtime's class map; the same input gives the same
-- bytes; what the tables cannot run yet is refused with the field.
function T.generator_builds_pipeline_tables()
  local p = plan.from_source(SRC, "tests/pp/plans/pp_tiny.lua")
  H.eq(#p.tp_classes, 2, "a class per pipeline rank")
  H.eq(p.pp.size, 2, "pp")
  H.eq(p.mesh.names[1], "pp", "pp outermost")
  local audit = require("gen.audit")
  p.source_file = "tests/pp/plans/pp_tiny.lua"
  local fp = audit.fingerprint(p)
  H.eq(audit.fingerprint(plan.from_source(SRC, "tests/pp/plans/pp_tiny.lua")), fp, "deterministic")
  local templates = {}
  for _, t in ipairs({ "plan.h.in", "plan.c.in", "plan_kernels.cu.in" }) do templates[t] = H.read("templates/" .. t) end
  local files = require("gen.emit").render(p, fp, templates)
  local c = files["plan.c"]
  assert(c:find("static const int class_of%[2%] = { 0, 1 };"), "class map by pp coordinate")
  assert(c:find(".pp_size = 2", 1, true) and c:find("CP_OP_SEND", 1, true) and c:find("CP_OP_RECV", 1, true), "p2p ops")
  assert(c:find(".batch = 1", 1, true), "a coalesced batch (1F1B's)")
  local md = audit.schedule_md(p, fp)
  assert(md:find("cannot deadlock", 1, true) and md:find("| 1 | 1 | layers.2-3, norm_output |", 1, true), md)
  local doc = require("gen.json").decode(audit.json(p, fp))
  H.eq(#doc.pipeline.ranks, 2, "plan.json: the ranks")
  -- throughput from the timed run of the plan's schedule, torchtitan's formulas
  local th = doc.pipeline.throughput
  assert(th and th.step_us > 0 and th.mfu > 0 and th.mfu < 1, "plan.json: throughput")
  local s = require("gen.compute").settings(p.pipeline.stage_plan)
  -- (the stage plan is one microbatch's: 4 of them per step)
  H.eq(th.tokens_per_s_per_gpu, tonumber(string.format("%.1f", s.tokens * 4 / (th.step_us / 1e6 * 2))),
    "tokens per step / (step x tp x pp)")
  H.eq(doc.audit.throughput.tokens_per_s_per_gpu, th.tokens_per_s_per_gpu, "the audit's throughput is the pipeline's")
  assert(md:find("| throughput | ", 1, true), "SCHEDULE.md: throughput")
  local zbv = plan.from_source(SRC:gsub('"1F1B"', '"ZBVZeroBubble"'), "tests/pp/plans/pp_tiny.lua")
  H.eq(#zbv.tp_classes, 2, "zero bubble builds")
  -- FSDP x TP x PP: a class per (pipeline rank, TP class); TP's activation
  -- collectives in every unit's forward and backward
  local tp = plan.from_file("tests/pp/plans/pp_tiny_tp.lua")
  H.eq(#tp.tp_classes, 4, "2 pipeline ranks x 2 TP classes (vocab 251 splits 126 / 125)")
  H.list_eq({ tp.class_of[0], tp.class_of[1], tp.class_of[2], tp.class_of[3] }, { 1, 2, 3, 4 }, "class_of")
  local tp_ops = 0
  for _, o in ipairs(tp.tp_classes[3].ops) do if o.group == "tp" then tp_ops = tp_ops + 1 end end
  assert(tp_ops > 0, "TP collectives in pipeline rank 1's tables")
  -- each microbatch's TP collectives carry that microbatch's activations
  -- (local batch 4 / 4 microbatches = 1 sequence of 16 tokens x dim 64;
  -- sequence parallel: a TP rank's shard is half), never the whole batch's
  for _, cls in ipairs(tp.tp_classes) do
    for _, o in ipairs(cls.ops) do
      if o.group == "tp" and (o.kind == "tp_all_gather" or o.kind == "tp_reduce_scatter") and
         cls.layout.units[o.unit + 1].name:match("^layers") then
        H.eq(o.count, 16 * 64 // 2, "TP collective of one microbatch: " .. o.kind)
      end
    end
  end
  H.eq(tp.pipeline.act.numel, 16 * 64 // 2, "the activation sent: one microbatch's, TP rank's shard")
end

-- torchtitan's defaults (config/configs.py: pipeline_parallel_schedule
-- "1F1B", pipeline_parallel_microbatch_size 1): a plan that gives only pp
-- runs 1F1B over local_batch_size microbatches, the same tables as the plan
-- that names them; microbatch_size divides the batch, as torchtitan checks.
function T.torchtitan_pipeline_defaults()
  local named = plan.from_source(SRC, "tests/pp/plans/pp_tiny.lua")
  local bare = plan.from_source((SRC:gsub("pipeline = %b{},?", "")), "tests/pp/plans/pp_tiny.lua")
  H.eq(bare.pipeline.sched.schedule, "1F1B", "the default schedule")
  H.eq(bare.pipeline.sched.microbatches, 4, "local_batch_size / 1 microbatches")
  -- (the fingerprint covers every class's units and ops)
  H.eq(#bare.tp_classes, #named.tp_classes, "as many classes")
  local audit = require("gen.audit")
  H.eq(audit.fingerprint(bare), audit.fingerprint(named), "the same tables")
  local by_size = plan.from_source((SRC:gsub("microbatches = 4", "microbatch_size = 2")), "tests/pp/plans/pp_tiny.lua")
  H.eq(by_size.pipeline.sched.microbatches, 2, "local_batch_size 4 / microbatch_size 2")
  H.plan_fails((SRC:gsub("microbatches = 4", "microbatch_size = 3")), "pipeline.microbatch_size:",
    "3 does not divide local_batch_size=4", "pipeline_parallel.py:306")
  H.plan_fails((SRC:gsub("microbatches = 4", "microbatches = 4, microbatch_size = 2")), "pipeline.microbatches:",
    "local_batch_size=4 / microbatch_size=2 makes 2")
  H.eq(plan.from_source((SRC:gsub("microbatches = 4", "microbatches = 2, microbatch_size = 2")),
    "tests/pp/plans/pp_tiny.lua").pipeline.sched.microbatches, 2, "both given, consistent")
  -- the field to fix is the one the user wrote (or must write)
  local no_batch = SRC:gsub("pipeline = %b{},?", ""):gsub("local_batch_size = 4,?", "")
  H.plan_fails(no_batch, "training.local_batch_size:", "missing", "microbatch_size")
  H.plan_fails((SRC:gsub("local_batch_size = 4", "local_batch_size = 100000"):gsub("pipeline = %b{},?", "")),
    "training.local_batch_size:", "makes 100000 microbatches", "set pipeline.microbatch_size")
  -- a CSV names its schedule class: without one, that is what is refused
  H.plan_fails((SRC:gsub('schedule = "1F1B", microbatches = 4', 'csv = "x.csv", microbatches = 4')),
    "pipeline.csv:", "needs pipeline.schedule")
end

-- FSDP as torchtitan runs it under PP (no reshard after forward,
-- gradients reduced after the last microbatch): a plan that sets either
-- otherwise is refused, naming the field, not silently overridden; the
-- values PP runs anyway are accepted.
function T.fsdp_settings_pp_would_override_are_refused()
  local function with(extra)
    local src, n = SRC:gsub('fsdp = {', "fsdp = { " .. extra .. ",", 1)
    H.eq(n, 1, "the plan's fsdp section")
    return src
  end
  H.plan_fails(with("reshard_after_forward = true"), "fsdp.reshard_after_forward:", "distributed/fsdp.py:54-77",
    "reshard_after_forward_policy = \"always\"")
  H.plan_fails(with("grad_accumulation = \"sync_last\""), "fsdp.grad_accumulation:", "\"sync_last\"", "step_end")
  local p = plan.from_source(with("reshard_after_forward = false, grad_accumulation = \"step_end\""),
    "tests/pp/plans/pp_tiny.lua")
  H.eq(p.fsdp.reshard_after_forward, false, "runs without reshard after forward")
end

-- SCHEDULE.md's op table of a pipeline rank (issue 34, item 3): folded
-- three times, and still every op of the rank's tables stands in exactly
-- one row, in issue order; llama405b's report (rank 0's table, the others'
-- counts) shrinks from 7,612 lines to ~200.
function T.folded_op_tables_cover_every_op()
  for _, path in ipairs({ "tests/pp/plans/pp_tiny.lua", "tests/pp/plans/pp_tiny_tp.lua", "plans/llama405b.lua" }) do
    local p = plan.from_source(H.read(path), path)
    for _, c in ipairs(p.tp_classes) do
      local rows, n, prev, seen = pipeline_audit.folded_ops(c, p.dims.pp), 0, -1, {}
      for _, r in ipairs(rows) do
        n = n + r.n
        local first = tonumber(r.seq:match("^(%d+)"))
        assert(first > prev, path .. ": rows in issue order at " .. r.seq)
        prev = first
        -- what the row says of every op it stands for: each op once, the row's first op first, its
        -- compute ops of the row's kind (the rest the TP collectives inside them), their microbatches
        -- inside the row's range and their units among the row's
        H.eq(#r.ops, r.n, path .. ": row " .. r.seq .. " lists its ops")
        H.eq(r.ops[1].seq, first, path .. ": row " .. r.seq .. " starts at its first op")
        -- (micro-batch `3`, `0-7`, or a round's rows folded again: `3-6 .. 11-14 (every 8)`)
        local nums = {}
        for x in r.micro:gsub("%(every %d+%)", ""):gmatch("%d+") do nums[#nums + 1] = tonumber(x) end
        local lo, hi = nums[1], nums[#nums]
        for _, o in ipairs(r.ops) do
          assert(not seen[o.seq], path .. ": op " .. o.seq .. " in two rows")
          seen[o.seq] = true
          assert(o.kind == r.kind or o.kind:match("^tp_"), path .. ": op " .. o.seq .. " (" .. o.kind .. ") in a "
            .. r.kind .. " row")
          assert(o.micro_step >= lo and o.micro_step <= hi, path .. ": op " .. o.seq .. " microbatch " .. o.micro_step
            .. " outside row " .. r.seq .. "'s " .. r.micro)
          local name = c.layout.units[o.unit + 1].name
          local tpl, num = fold.template(name)
          local a, b = r.units:match("(%d+)%-(%d+)")
          a, b = tonumber(a), tonumber(b)
          assert(r.units == name or r.units:find(" .. ", 1, true) or (a and tpl == fold.template((r.units:gsub(
            "%d+%-%d+", "0"))) and num >= math.min(a, b) and num <= math.max(a, b)), path .. ": op " .. o.seq .. " of "
            .. name .. " in a row of " .. r.units)
        end
      end
      H.eq(n, #c.ops, path .. " pipeline rank " .. c.pp_rank .. ": ops the folded rows stand for")
    end
  end
  -- 1F1B at 32 microbatches: the steady state (forward k, backward k-1, their sends and receives and
  -- batches moving with them) folds to one row each; every op still stands in one row
  local src32 = H.read("tests/pp/plans/pp_tiny.lua"):gsub("microbatches = 4", "microbatches = 32")
    :gsub("local_batch_size = 4", "local_batch_size = 32")
  local p32 = plan.from_source(src32, "tests/pp/plans/pp_tiny.lua")
  for _, c in ipairs(p32.tp_classes) do
    local rows, n = pipeline_audit.folded_ops(c, p32.dims.pp), 0
    for _, r in ipairs(rows) do n = n + r.n end
    H.eq(n, #c.ops, "pp_tiny x 32: ops the folded rows stand for")
    assert(#rows < 40, "pp_tiny x 32, pipeline rank " .. c.pp_rank .. ": " .. #rows .. " rows")
  end
  local md = H.read("plans/llama405b/SCHEDULE.md")
  local _, lines = md:gsub("\n", "")
  assert(lines <= 400, "llama405b's SCHEDULE.md has " .. lines .. " lines")
  assert(md:find("| forward | layers.0-6 | 0-7 | compute | with tp: all_gather, reduce_scatter", 1, true),
    "a stage's forwards of microbatches 0-7, TP inside, one row")
end

-- CP x PP (docs/pipeline.md, docs/context-parallel.md): the stage mesh
-- carries cp (FSDP over dp_shard x cp), each block's K/V all-gathers (one
-- microbatch x seq_len / cp x n_kv_heads x head_dim) and their gradients'
-- reduce-scatters run inside every microbatch's F and B of the stage, the
-- activations sent between stages are seq_len / cp long; the sequences are
-- tests/titan/test_cppp_record.py's (torchtitan's pipeline_llm on gloo).
function T.cp_inside_pipeline_stages()
  local SRC_CP = H.read("tests/plans/llama_tiny_cppp.lua")
  local p = plan.from_source(SRC_CP, "tests/plans/llama_tiny_cppp.lua")
  H.list_eq(p.mesh.names, { "pp", "cp" }, "mesh: pp outermost, then cp")
  local stage = p.pipeline.stage_plan
  H.eq(stage.dims.cp, 2, "the stage mesh carries cp")
  H.eq(stage.layout.W, 2, "FSDP inside a stage over dp_shard x cp")
  local kv, act = 1 * (512 // 2) * 2 * 16, 1 * (512 // 2) * 64 -- microbatch x seq/cp x (kv heads x head_dim | dim)
  H.eq(p.pipeline.act.numel, act, "the activation between stages: seq_len / cp tokens")
  local nocp = plan.from_source(SRC_CP:gsub("cp = 2", "dp_shard = 2"), "tests/plans/llama_tiny_cppp.lua")
  H.eq(nocp.pipeline.act.numel, 2 * act, "without cp the same mesh sends the whole sequence")
  local function seq_of(cls)
    local out = {}
    for _, o in ipairs(cls.ops) do
      if o.kind == "send" or o.kind == "recv" then out[#out + 1] = string.format("%s %d %d", o.kind, o.peer, o.count)
      elseif o.group then out[#out + 1] = string.format("%s %s %d", o.kind, o.group, o.count) end
    end
    return out
  end
  local AG, RS = "tp_all_gather cp " .. kv, "tp_reduce_scatter cp " .. kv
  local send0, recv0, send1, recv1 = "send 1 " .. act, "recv 1 " .. act, "send 0 " .. act, "recv 0 " .. act
  H.list_eq(seq_of(p.tp_classes[1]), { "all_gather fsdp 8000", "all_gather fsdp 27712", AG, AG, send0, AG, AG, send0,
    recv0, RS, RS, recv0, RS, RS, "reduce_scatter fsdp 27712", "reduce_scatter fsdp 8000" },
    "pipeline rank 0 (tok_embeddings, layers.0), 1F1B over 2 microbatches")
  -- (1F1B: layers.1's pre-forward gathers it, its K/V exchange runs, then norm_output is gathered)
  H.list_eq(seq_of(p.tp_classes[2]), { recv1, "all_gather fsdp 27712", AG, AG, "all_gather fsdp 8032", RS, RS, send1,
    recv1, AG, AG, RS, RS, send1, "reduce_scatter fsdp 8032", "reduce_scatter fsdp 27712" },
    "pipeline rank 1 (layers.1, norm_output)")
  -- every schedule, with FSDP and HSDP beside cp and activation checkpointing:
  -- each pipeline rank's blocks exchange K/V in every microbatch (cp.prove_class per rank)
  local cp_mod = require("gen.parallel.cp")
  for _, v in ipairs({ { "Interleaved1F1B", "dp_shard = 2", "none" }, { "ZBVZeroBubble", "dp_replicate = 2", "full" },
                       { "DualPipeV", "dp_shard = 2", "selective" } }) do
    local src = SRC_CP:gsub('"1F1B", microbatches = 2', string.format("%q, microbatches = 4", v[1]))
      :gsub("cp = 2 }", "cp = 2, " .. v[2] .. " }"):gsub("world_size = 4", "world_size = 8")
      :gsub("n_layers = 2", "n_layers = 4"):gsub("local_batch_size = 2", string.format("local_batch_size = 4, "
      .. "activation_checkpointing = %q", v[3]))
    local q = plan.from_source(src, "tests/plans/llama_tiny_cppp.lua")
    local per = v[3] == "none" and 4 or 6 -- K, V (and their recompute) gathered, 2 gradients scattered
    for _, cls in ipairs(q.tp_classes) do
      local n, blocks = 0, 0
      for _, o in ipairs(cls.ops) do n = n + (o.group == "cp" and 1 or 0) end
      for _, u in ipairs(cls.layout.units) do blocks = blocks + (u.cp_acts and 1 or 0) end
      H.eq(n, per * 4 * blocks, v[1] .. " pipeline rank " .. cls.pp_rank .. ": cp collectives per block per microbatch")
    end
  end
  -- the proof can fail: a pipeline rank's tables missing one K/V all-gather
  local cls = p.tp_classes[2]
  local ops = {}
  for _, o in ipairs(cls.ops) do ops[#ops + 1] = o end
  for i, o in ipairs(ops) do
    if o.group == "cp" then table.remove(ops, i); break end
  end
  local ok, err = pcall(cp_mod.prove_class, cls.layout, ops, { fsdp = p.fsdp })
  assert(not ok and tostring(err):find("cp collectives in forward/backward", 1, true), tostring(err))
  -- the audit prices the K/V exchange inside each stage's compute
  local audit = require("gen.audit")
  local md = audit.schedule_md(p, audit.fingerprint(p))
  assert(md:find("CP's K/V all-gathers and reduce-scatters run inside each stage's compute", 1, true), "SCHEDULE.md")
  assert(p.pipeline.row.sim and nocp.pipeline.row.sim, "timed runs")
end

-- torchtitan's "always" policy with PP x EP (DeepSeek-V3, pp 2 x dp_shard 4,
-- ep 2: each MoE block a state of two groups, dense on fsdp and experts on
-- efsdp 2): each pipeline rank's all-gathers in the order torchtitan's
-- pipeline_llm issued them on gloo (tests/pp/check_titan_pp_always.sh,
-- dsv3_pp2_dp4_ep2_always): every forward gathers again, a backward its own
-- state's groups in forward order, then the state before it last to first;
-- an F after a B gathers nothing. The "default" policy's tables gather each
-- unit once.
function T.always_policy_pp_ep_gather_order()
  local src = [[return { world_size = 8, parallel = { pp = 2, dp_shard = 4, ep = 2 },
  model = { family = "deepseek_v3", dtype = "fp32", seq_len = 6, dim = 16, n_layers = 3, n_dense_layers = 1,
    n_heads = 2, vocab_size = 64, q_lora_rank = 0, kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 4,
    v_head_dim = 4, dense_hidden_dim = 32, moe_hidden_dim = 8, num_experts = 8, num_shared_experts = 1, top_k = 2 },
  fsdp = { reduce_op = "sum"POLICY },
  training = { local_batch_size = 2, activation_checkpointing = "none" },
  pipeline = { schedule = "1F1B", microbatches = 2 } }]]
  local function gathers(policy)
    local p = plan.from_source((src:gsub("POLICY", policy)), "tests/pp/plans/t.lua")
    local out = {}
    for _, c in ipairs(p.tp_classes) do
      local t = {}
      for _, o in ipairs(c.ops) do
        if o.kind == "all_gather" then t[#t + 1] = c.layout.units[o.unit + 1].name end
      end
      out[c.pp_rank + 1] = table.concat(t, " ")
    end
    return out
  end
  local g = gathers(', reshard_after_forward_policy = "always"')
  H.eq(g[1], "tok_embeddings layers.0 layers.1 layers.1.experts tok_embeddings layers.0 layers.1 layers.1.experts "
    .. "layers.1 layers.1.experts layers.0 tok_embeddings", "pp rank 0: F0 F1 B0 (B1 none)")
  H.eq(g[2], "layers.2 layers.2.experts norm_lm_head norm_lm_head layers.2.experts layers.2 norm_lm_head "
    .. "layers.2.experts layers.2", "pp rank 1: F0 B0 (F1 none) B1")
  local d = gathers("")
  H.eq(d[1], "tok_embeddings layers.0 layers.1 layers.1.experts", "default: once")
end

return T
