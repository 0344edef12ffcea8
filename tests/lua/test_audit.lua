-- The audit: closed-form groups, plan.json against its JSON Schema and
-- independent of the world's size, SCHEDULE.md summary first and folded
-- (a mesh change reads as a short diff), the predicted timeline and its
-- Chrome trace, whole-rank memory, FLOPs, the plan diff and the advisor.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local json = require("gen.json")
local dims = require("gen.dims")
local groups = require("gen.groups")
local jsonschema = require("gen.jsonschema")
local trace = require("gen.trace")
local compute = require("gen.compute")
local fold = require("gen.fold")
local plandiff = require("gen.plandiff")
local util = require("gen.util")
local T = {}

local read = H.read

local function write(path, s)
  local fh = assert(io.open(path, "wb"))
  fh:write(s)
  fh:close()
end

local plan_files = H.plan_files

local function gen(src, path)
  local p = plan.from_source(src, path)
  local fp = audit.fingerprint(p)
  return p, fp
end

-- The enumeration the closed form replaced: every rank's coordinates.
local function brute_groups(mesh, axis_names)
  local in_family = {}
  for _, n in ipairs(axis_names) do in_family[mesh.index[n]] = true end
  local inst = {}
  for rank = 0, mesh.world_size - 1 do
    local c = dims.coords(mesh, rank)
    local color, key = 0, 0
    for i = 1, #mesh.sizes do
      if in_family[i] then key = key * mesh.sizes[i] + c[i] else color = color * mesh.sizes[i] + c[i] end
    end
    inst[color + 1] = inst[color + 1] or {}
    inst[color + 1][key + 1] = rank
  end
  return inst
end

local MESHES = {
  { { dp_replicate = 2, dp_shard = 3, cp = 2, tp = 2 }, 24 },
  { { dp_replicate = 4, dp_shard = 2, tp = 2 }, 16 },
  { { dp_shard = 6, tp = 4 }, 24 },
  { { dp_replicate = 3, dp_shard = 5 }, 15 },
  { { dp_shard = 1 }, 1 },
}

function T.closed_form_groups_match_enumeration()
  for _, m in ipairs(MESHES) do
    local mesh = dims.mesh(dims.infer(nil, m[1], m[2]))
    local fams = groups.build(mesh)
    for _, f in ipairs(fams.list) do
      local want = brute_groups(mesh, f.axis_names)
      H.eq(f.count, #want, f.name .. " count")
      for c = 0, f.count - 1 do
        H.list_eq(groups.members(f, c), want[c + 1], f.name .. " group " .. c)
        for k = 0, f.size - 1 do H.eq(groups.rank(f, c, k), want[c + 1][k + 1], f.name .. " rank") end
      end
      H.list_eq(f.instances[f.count], want[f.count], f.name .. " instances (lazy)")
    end
  end
end

function T.intra_node_and_nodes_in_closed_form()
  for _, m in ipairs(MESHES) do
    local mesh = dims.mesh(dims.infer(nil, m[1], m[2]))
    for _, f in ipairs(groups.build(mesh).list) do
      local want = brute_groups(mesh, f.axis_names)
      for _, g in ipairs({ 1, 2, 3, 4, 5, 6, 8, 12, 16 }) do
        local intra, nodes = true, 0
        for _, inst in ipairs(want) do
          local seen, n = {}, 0
          for _, r in ipairs(inst) do
            if not seen[r // g] then seen[r // g] = true; n = n + 1 end
          end
          if n > 1 then intra = false end
          nodes = math.max(nodes, n)
        end
        H.eq(groups.intra_node(f, g), intra, string.format("%s intra_node(%d)", f.name, g))
        local got = groups.nodes_spanned(f, g)
        assert(got >= nodes and got <= f.size, string.format("%s nodes_spanned(%d) = %d, groups span %d",
          f.name, g, got, nodes))
      end
    end
  end
end

local SCHEMA
local function schema()
  SCHEMA = SCHEMA or json.decode(read("docs/plan-json.schema.json"))
  return SCHEMA
end

function T.every_plan_json_matches_the_schema()
  for _, path in ipairs(H.dense_plan_files()) do
    local p, fp = gen(read(path), path)
    local doc = json.decode(audit.json(p, fp))
    local err = jsonschema.validate(doc, schema())
    if err then error(path .. ": " .. err) end
  end
end

-- A shipped pipeline plan's plan.json (gen/audit.lua's, as every plan's):
-- the schema's sections, the audit included, and every pipeline rank's
-- tables, every op of each; its SCHEDULE.md has the dense summary's rows,
-- their numbers the figures'.
function T.pipeline_plan_json_holds_every_rank()
  local n = 0
  for _, path in ipairs(plan_files()) do
    local p = plan.from_file(path)
    if p.pipeline then
      n = n + 1
      p.source_file = path
      local fp = audit.fingerprint(p)
      local doc = json.decode(audit.json(p, fp))
      local err = jsonschema.validate(doc, schema())
      if err then error(path .. ": " .. err) end
      H.eq(#doc.pipeline.ranks, #p.tp_classes, path .. ": a rank entry per pipeline rank (x TP class)")
      for i, c in ipairs(p.tp_classes) do
        H.eq(#doc.pipeline.ranks[i].ops, #c.ops, path .. ": every op of pipeline rank " .. c.pp_rank)
      end
      H.eq(#doc.ops, #p.tp_classes[1].ops, path .. ": the top-level ops are pipeline rank 0's")
      local a = audit.analysis(p)
      assert(doc.pipeline.throughput.tokens_per_s_per_gpu > 0, path .. ": throughput")
      H.eq(doc.audit.timeline.step_us, a.step_us, path .. ": the audit's step")
      H.eq(doc.audit.timeline.step_us, doc.pipeline.throughput.step_us, path .. ": one step")
      H.eq(doc.audit.timeline.exposed_comm_us, a.exposed_us, path .. ": exposed communication")
      H.eq(doc.audit.memory.fits, a.memory.fits, path .. ": the verdict")
      local md = audit.schedule_md(p, fp)
      local us, human = audit.us_text, audit.human
      for _, want in ipairs({
        "| step | " .. us(a.step_us) .. " predicted = compute " .. us(a.compute_us) .. " + exposed communication "
          .. us(a.exposed_us),
        string.format("bubble %.1f%% over every rank", 100 * a.pipeline.bubble),
        "| memory | " .. human(a.memory.total_bytes) .. " of " .. human(a.memory.gpu_bytes),
        string.format("on pipeline rank %d, the most at its peak of any rank: %s", a.memory.rank,
          a.memory.fits and "fits" or "**does not fit**"),
        -- (the throughput row where torchtitan's FLOPs formula is modelled: the llama and qwen3 families)
        a.throughput.mfu and "| throughput | " .. audit.commas(math.floor(a.throughput.tokens_per_s_per_gpu + 0.5))
          .. " tokens/s per GPU" or "| step | ",
        a.throughput.mfu and string.format("MFU %.1f%%", 100 * a.throughput.mfu) or "| step | ",
        "### Pipeline", "### Pipeline rank 0's ops in issue order",
      }) do
        assert(md:find(want, 1, true), path .. ": SCHEDULE.md lacks " .. want)
      end
      assert(not md:find("## Audit (make pipeline)", 1, true), path .. ": no embedded make pipeline text")
      local _, lines = md:gsub("\n", "")
      assert(lines <= 400, path .. ": SCHEDULE.md has " .. lines .. " lines")
    end
  end
  assert(n >= 1, "shipped pipeline plans: " .. n)
end

function T.schema_refuses_what_it_must()
  local p, fp = gen(read("plans/hsdp2x2.lua"), "plans/hsdp2x2.lua")
  local text = audit.json(p, fp)
  H.eq(jsonschema.validate(json.decode(text), schema()), nil, "good doc")
  local cases = {
    { function(d) d.ops = nil end, "required property \"ops\"" },
    { function(d) d.schema = 1 end, "constant" },
    { function(d) d.extra = 1 end, "not in the schema" },
    { function(d) d.world_size = "4" end, "not of type integer" },
    { function(d) d.groups[1].example_ranks.first_group = { 0, 1, 2, 3, 4 } end, "maxItems" },
    { function(d) d.ops[1].kind = "broadcast" end, "enum" },
    { function(d) d.units[1].arena.ag.offset = -1 end, "minimum" },
    { function(d) d.audit.memory.fits = nil end, "fits" },
  }
  for i, c in ipairs(cases) do
    local d = json.decode(text)
    c[1](d)
    local err = jsonschema.validate(d, schema())
    assert(err and err:find(c[2], 1, true), string.format("case %d: want %q, got %s", i, c[2], tostring(err)))
  end
end

-- llama70b with the world (and dp_replicate) scaled by `factor`.
local function scaled_70b(factor)
  local src = read("plans/llama70b.lua")
  local rep = tonumber(src:match("dp_replicate = (%d+)"))
  local world = tonumber(src:match("world_size = (%d+)"))
  src = src:gsub("world_size = %d+", "world_size = " .. world * factor, 1)
  src = src:gsub("dp_replicate = %d+", "dp_replicate = " .. rep * factor, 1)
  return src, world * factor
end

function T.plan_json_does_not_grow_with_the_world()
  local small_src = scaled_70b(1)
  local big_src, world = scaled_70b(1024)
  assert(world >= 1 << 20, "a 1M-rank plan")
  local t0 = os.clock()
  local pb, fpb = gen(big_src, "plans/llama70b.lua")
  local big = audit.json(pb, fpb)
  local secs = os.clock() - t0
  local ps, fps = gen(small_src, "plans/llama70b.lua")
  local small = audit.json(ps, fps)
  assert(math.abs(#big - #small) <= 0.01 * #small, string.format("plan.json %d bytes at %d ranks vs %d", #big,
    world, #small))
  assert(secs < 20, string.format("1M-rank generation took %.1f s", secs))
  local doc = json.decode(big)
  H.eq(doc.world_size, world, "world")
  for _, g in ipairs(doc.groups) do assert(#g.example_ranks.first_group <= 4, "a handful of example ranks") end
end

function T.schedule_md_summary_first_and_folded()
  local p, fp = gen(read("plans/llama70b.lua"), "plans/llama70b.lua")
  local md = audit.schedule_md(p, fp)
  local summary = md:find("## Summary", 1, true)
  local details = md:find("## Details", 1, true)
  assert(summary and details and summary < details, "summary before details")
  local head = md:sub(1, details)
  for _, want in ipairs({ "| world |", "| memory |", "| step |", "exposed", "### Communication per rank",
                          "inter-node", "### Memory per rank", "### Warnings" }) do
    assert(head:find(want, 1, true), "summary lacks " .. want)
  end
  local _, summary_lines = head:gsub("\n", "")
  assert(summary_lines <= 60, "summary fits one screen: " .. summary_lines .. " lines")
  assert(md:find("layers.0-79", 1, true), "identical units folded")
  local _, n = md:gsub("\n", "")
  assert(n < #p.ops / 4, string.format("SCHEDULE.md has %d lines for %d ops", n, #p.ops))
end

local function sh(cmd)
  local ph = io.popen(cmd)
  local out = ph:read("a")
  ph:close()
  return out
end

function T.mesh_change_is_a_short_diff()
  local src = read("plans/llama70b.lua")
  local a_src = src
  local rep = tonumber(src:match("dp_replicate = (%d+)"))
  local b_src = src:gsub("dp_replicate = %d+", "dp_replicate = " .. rep // 2, 1)
  os.execute("mkdir -p build/test_audit/a build/test_audit/b")
  local pa, fa = gen(a_src, "plans/llama70b.lua")
  local pb, fb = gen(b_src, "plans/llama70b.lua")
  write("build/test_audit/a/SCHEDULE.md", audit.schedule_md(pa, fa))
  write("build/test_audit/b/SCHEDULE.md", audit.schedule_md(pb, fb))
  local n = tonumber(sh("diff build/test_audit/a/SCHEDULE.md build/test_audit/b/SCHEDULE.md | wc -l"))
  -- (under 70: with compute priced from shapes the two meshes' critical
  -- paths split a layer apart, two rows more than the figures' own)
  assert(n > 0 and n < 70, "SCHEDULE.md diff of " .. n .. " lines")
  local text = plandiff.compare(json.decode(audit.json(pa, fa)), json.decode(audit.json(pb, fb)), "a", "b")
  for _, want in ipairs({ string.format("dp_replicate: size %d -> %d", rep, rep // 2), "memory per rank:",
                          "total:", "communication exposed:", "ops:" }) do
    assert(text:find(want, 1, true), "plan diff lacks " .. want .. "\n" .. text)
  end
  local _, lines = text:gsub("\n", "")
  assert(lines < 60, "plan diff of " .. lines .. " lines")
end

function T.plan_diff_loads_files_and_json()
  local a = plandiff.load("plans/fsdp4.lua")
  local p, fp = gen(read("plans/hsdp2x2.lua"), "plans/hsdp2x2.lua")
  os.execute("mkdir -p build/test_audit")
  write("build/test_audit/hsdp2x2.json", audit.json(p, fp))
  local b = plandiff.load("build/test_audit/hsdp2x2.json")
  local text = plandiff.compare(a, b)
  assert(text:find("+ dp_replicate", 1, true), text)
  local same = plandiff.compare(a, a)
  assert(same:find("no op added, removed or resized", 1, true), same)
  local ok, err = pcall(plandiff.load, "no-such-rev:plans/x/plan.json")
  assert(not ok and tostring(err.msg or err):find("git show", 1, true), tostring(err))
  ok, err = pcall(plandiff.load, "HEAD;rm -rf /:plans/x")
  assert(not ok and tostring(err.msg or err):find("revision", 1, true), tostring(err))
  -- a plan.json is held to its schema before a field is read (issue 33:
  -- schema 2 with no mesh was an internal error); an empty operand is named
  write("build/test_audit/no_mesh.json", '{"ops": [], "schema": 2}')
  ok, err = pcall(plandiff.load, "build/test_audit/no_mesh.json")
  assert(not ok and util.is_plan_error(err), tostring(err))
  assert(tostring(err.msg or err):find("build/test_audit/no_mesh.json: not a plan.json commplan wrote (", 1, true),
    tostring(err))
  ok, err = pcall(plandiff.load, "")
  assert(not ok and util.is_plan_error(err) and tostring(err.msg or err):find("^an empty operand: no such file"),
    tostring(err))
  H.eq(plandiff.names_text({ "layers.0", "layers.1", "layers.2", "layers.5", "root" }), "layers.0-2,5, root", "names")
  H.eq(plandiff.names_text({ "layers.0", "layers.0", "layers.1", "layers.1" }), "layers.0-1", "each unit once")
  -- a pipeline plan against a plan without pp (as REV:plans/llama405b.lua
  -- from before it became the pipeline plan): refused, both named, saying why
  for _, pair in ipairs({ { "plans/llama405b_hsdp.lua", "plans/llama405b.lua" },
                          { "plans/llama405b.lua", "plans/llama405b_hsdp.lua" } }) do
    ok, err = pcall(plandiff.pipeline_compare, pair[1], pair[2])
    local msg = tostring(not ok and (err.msg or err))
    assert(msg:find("plans/llama405b_hsdp.lua: not a pipeline plan, while plans/llama405b.lua is one", 1, true)
      and msg:find("may have been the other kind", 1, true), msg)
  end
  H.eq(plandiff.pipeline_compare("plans/fsdp4.lua", "plans/hsdp2x2.lua"), nil, "neither a pipeline plan")
end

-- Every TP class is visible: plan.json tp_classes[] (schema-checked),
-- a line per extra class in SCHEDULE.md, and the diff of a change that
-- alters only TP rank 2's split (block.up 10 -> 11 rows: 4/4/2 -> 4/4/3).
function T.tp_classes_in_plan_json_schedule_and_diff()
  local src = read("plans/tp3_uneven.lua")
  local p, fp = gen(src, "plans/tp3_uneven.lua")
  local doc = json.decode(audit.json(p, fp))
  H.eq(jsonschema.validate(doc, schema()), nil, "schema")
  H.eq(#doc.tp_classes, 1, "one class beyond class 0")
  local c = doc.tp_classes[1]
  H.eq(c.class, 1, "class number"); H.eq(table.concat(c.tp_ranks, ","), "2", "TP rank 2")
  local block
  for _, u in ipairs(c.units) do if u.name == "block" then block = u end end
  H.eq(block.slot_numel, 17, "block slot on TP rank 2: (2x8 + 2 + 8x1 + 8) / 2")
  H.eq(table.concat(block.params[1].shape, "x"), "2x8", "block.up on TP rank 2")
  local md = audit.schedule_md(p, fp)
  assert(md:find("TP ranks 0, 1 (class 0) hold the layout above", 1, true), md)
  assert(md:find("\n%- TP rank 2 %(class 1; arena [^)]*%): root: slot 128 B as TP rank 0's; embed %(3, 8%), "
    .. "head %(3, 8%); block: slot 68 B, all%-gather buffer 136 B %(TP rank 0: 136 B, 272 B%); block.up %(2, 8%)"), md)
  local l70 = json.decode(audit.json(gen(read("plans/llama70b.lua"), "plans/llama70b.lua")))
  H.eq(#l70.tp_classes, 0, "llama70b: every TP rank holds class 0's layout")
  H.eq(json.decode(audit.json(gen(read("plans/fsdp4.lua"), "plans/fsdp4.lua"))).tp_classes, nil, "no TP, no key")
  local b_src = src:gsub("shape = { 10, 8 }, tp = \"colwise\"", "shape = { 11, 8 }, tp = \"colwise\"", 1)
  assert(b_src ~= src, "the edit applies")
  local pb, fb = gen(b_src, "plans/tp3_uneven.lua")
  local text = plandiff.compare(doc, json.decode(audit.json(pb, fb)), "a", "b")
  assert(not text:find("layouts unchanged on every TP rank", 1, true), text)
  assert(text:find("units on TP ranks 0, 1 (class 0): layouts unchanged", 1, true), text)
  assert(text:find("units on TP rank 2 (class 1):\n  block: slot 17 -> 25 elements per rank; 1 parameter(s) added, "
    .. "removed or reshaped; padding 0 -> 8 elements", 1, true), text)
  local same = plandiff.compare(doc, doc, "a", "a")
  assert(same:find("units: layouts unchanged on every TP rank", 1, true), same)
  -- A plan.json from before tp_classes says so instead of a false change.
  local old = json.decode(audit.json(p, fp))
  old.tp_classes = nil
  text = plandiff.compare(old, doc, "a", "b")
  assert(text:find("A's plan.json predates tp_classes", 1, true), text)
end

local function check_timeline(p, tl)
  local last_on = {}
  for _, o in ipairs(p.ops) do
    local r = tl.ops[o.seq]
    assert(r.start >= -1e-9 and r.finish >= r.start - 1e-9, "op " .. o.seq .. " times")
    for _, w in ipairs(p.arena.waits[o.seq] or {}) do
      assert(r.start >= tl.ops[w].finish - 1e-6, string.format("op %d starts before op %d it waits for", o.seq, w))
    end
    local prev = last_on[o.stream]
    if prev then assert(r.start >= tl.ops[prev].finish - 1e-6, "stream order " .. o.stream) end
    last_on[o.stream] = o.seq
  end
  assert(tl.step_us >= tl.compute_busy_us - 1e-6, "step >= compute")
  assert(math.abs(tl.exposed_us - (tl.step_us - tl.compute_busy_us)) < 1e-6, "exposed = step - compute busy")
  local sum = 0
  for _, us in pairs(tl.exposed_by) do sum = sum + us end
  for _, us in pairs(tl.recompute_by) do sum = sum + us end
  assert(math.abs(sum - tl.exposed_us) <= 1e-6 * math.max(1, tl.step_us), string.format(
    "exposed attributed %.3f of %.3f us", sum, tl.exposed_us))
end

-- Full checkpointing reruns the transformer blocks' forward TP collectives
-- in backward (torchtitan's full AC wraps each block, not the embedding,
-- the output or the loss): the tp row counts them (collectives, bytes,
-- predicted), so exposed never exceeds predicted, and the warnings name the
-- recompute, not tp_all_gather.
function T.recompute_tp_collectives_counted_and_attributed()
  local p, fp = gen(read("plans/llama70b.lua"), "plans/llama70b.lua")
  local a = audit.analysis(p)
  H.eq(a.settings.activation_checkpointing, "full", "llama70b checkpoints fully")
  local rec = a.recompute.tp
  local fwd = { ops = 0, us = 0, size = 0 }
  for _, o in ipairs(p.ops) do
    if o.group == "tp" and o.phase == "forward" and p.layout.units[o.unit + 1].name:match("^layers%.") then
      fwd.ops, fwd.us, fwd.size = fwd.ops + 1, fwd.us + o.predicted_us, fwd.size + o.size_bytes
    end
  end
  H.eq(rec.ops, fwd.ops, "every block's forward TP collective recomputed once")
  H.eq(rec.ops, 80 * 4, "80 blocks x (2 gathers + 2 reduce-scatters), nothing else")
  H.eq(rec.size_bytes, fwd.size, "recompute bytes")
  local doc = json.decode(audit.json(p, fp))
  local tp_row
  for _, g in ipairs(doc.audit.by_group) do if g.group == "tp" then tp_row = g end end
  local alone_tp = p.predicted.per_family.tp.us + rec.us
  H.eq(tp_row.recomputed_ops, rec.ops, "plan.json by_group counts the recompute")
  assert(math.abs(tp_row.alone_us - alone_tp) <= 1e-3, "tp alone with the recompute")
  assert(tp_row.exposed_us <= tp_row.predicted_us, string.format("tp exposed %g > predicted %g",
    tp_row.exposed_us, tp_row.predicted_us))
  H.eq(doc.audit.recompute_by_group[1].group, "tp", "plan.json recompute row")
  H.eq(doc.audit.recompute_by_group[1].ops, fwd.ops, "plan.json recompute ops")
  local md = audit.schedule_md(p, fp)
  local row = md:match("\n(| tp | [^\n]*)")
  -- 164 all-reduces: the norm weights' gradients (two per block, the final norm) and loss_parallel's
  -- three, none recomputed.
  assert(row:find("322 TP reduce-scatter, 322 TP all-gather, 164 TP all-reduce + 160 TP all-gather, "
    .. "160 TP reduce-scatter recomputed in backward (full checkpointing)", 1, true), row)
  local cells = {}
  for c in row:gmatch("| ([^|]*) ") do cells[#cells + 1] = c end
  H.eq(cells[8], cells[9], "tp in the step = exposed (all on the compute stream)")
  H.eq(cells[7], audit.us_text(tp_row.alone_us), "tp alone with the recompute")
  H.eq(cells[8], audit.us_text(tp_row.predicted_us), "tp in the step with the recompute")
  -- Each warning's total is its own ops': forward tp_all_gather is the
  -- forward's, the recompute has rows of its own.
  local fwd_ag = 0
  for _, o in ipairs(p.ops) do
    if o.kind == "tp_all_gather" and o.phase == "forward" then fwd_ag = fwd_ag + o.predicted_us end
  end
  local want = string.format("exposed tp_all_gather (forward) of layers.0-79, norm_output: %s over",
    audit.us_text(fwd_ag))
  local found, rs_rec = false, false
  for _, text in ipairs(a.warnings) do
    if text:find(want, 1, true) then found = true end
    if text:find("exposed tp_reduce_scatter (backward recompute)", 1, true) then rs_rec = true end
  end
  assert(found, want .. "\n" .. table.concat(a.warnings, "\n"))
  assert(rs_rec, "recomputed reduce-scatters named as such")
  -- Without checkpointing nothing is recomputed.
  local pn = gen(read("plans/llama70b.lua"):gsub('activation_checkpointing = "full"', 'activation_checkpointing = "none"'),
    "plans/llama70b.lua")
  H.eq(next(audit.analysis(pn).recompute), nil, "no recompute")
end

-- The critical path line names the compute stream's TP collectives apart
-- from its compute (they are not compute: "compute 0.2 us" beside a
-- compute stream of 291 us read as a contradiction).
function T.critical_path_names_tp_collectives_apart()
  local p = gen(read("plans/llama70b.lua"), "plans/llama70b.lua")
  local a = audit.analysis(p)
  local text = audit.critical_text(p, a.timeline)
  local whole, comp, tpc = text:match("compute stream ([%d.]+ %a+): ([%d.]+ %a+) compute %+ ([%d.]+ %a+) TP collectives")
  assert(whole, text)
  local function us(x)
    local v, u = x:match("([%d.]+) (%a+)")
    return tonumber(v) * ({ us = 1, ms = 1e3, s = 1e6 })[u]
  end
  -- Figures print with 3 significant digits: compare within 1%.
  assert(us(comp) <= a.timeline.compute_busy_us * 1.01 + 0.05, text .. " vs compute " .. a.timeline.compute_busy_us)
  assert(math.abs(us(comp) + us(tpc) - us(whole)) <= 0.01 * us(whole) + 0.15, text)
  assert(us(tpc) > 0, "TP collectives on the compute stream: " .. text)
  local pf = gen(read("plans/fsdp4.lua"), "plans/fsdp4.lua")
  local tf = audit.critical_text(pf, audit.analysis(pf).timeline)
  assert(not tf:find("TP collectives", 1, true) and tf:find("compute [%d.]+ %a+"), tf)
end

function T.timeline_obeys_streams_and_waits()
  for _, path in ipairs({ "plans/fsdp4.lua", "plans/hsdp4x2_fp16.lua", "plans/fsdp8_uneven.lua",
                          "plans/llama70b.lua", "plans/llama_tiny_tp.lua" }) do
    local p = plan.from_source(read(path), path)
    check_timeline(p, audit.analysis(p).timeline)
  end
end

function T.trace_is_valid_chrome_trace_events()
  for _, path in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/llama70b.lua", "plans/llama_tiny_tp.lua" }) do
    local p, fp = gen(read(path), path)
    local text = audit.trace_json(p, fp)
    H.eq(text, audit.trace_json(plan.from_source(read(path), path), fp), path .. " deterministic")
    local doc = json.decode(text)
    local err = trace.validate(doc)
    if err then error(path .. ": " .. err) end
    assert(doc.otherData.generator:find("do not edit", 1, true), "generated, do not edit")
    H.eq(doc.otherData.fingerprint, fp, "fingerprint")
    local x, names = 0, {}
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == "X" and e.name == "optimizer step" then
        -- (the step's optimizer, after the last op: compute.optimizer_us)
        H.eq(e.tid, 1, "the optimizer on the compute stream")
      elseif e.ph == "X" then
        x = x + 1
        assert(e.tid >= 1 and e.tid <= 5, "a track per stream")
      elseif e.name == "thread_name" then names[e.tid] = e.args.name end
    end
    H.eq(x, #p.ops, path .. " one event per op")
    H.eq(names[1], "stream compute", "track names")
  end
  -- The validator catches overlap on a track and a missing field.
  local bad = { traceEvents = {
    { ph = "X", ts = 0, dur = 5, pid = 1, tid = 1, name = "a" },
    { ph = "X", ts = 3, dur = 1, pid = 1, tid = 1, name = "b" } } }
  assert(trace.validate(bad):find("before the previous", 1, true), "overlap caught")
  assert(trace.validate({ traceEvents = { { ph = "X", ts = 0, pid = 1, tid = 1, name = "a" } } }), "dur required")
end

function T.whole_rank_memory_and_checkpointing()
  local src = read("plans/llama70b.lua")
  local p = plan.from_source(src, "plans/llama70b.lua")
  local bytes = 0
  for _, u in ipairs(p.layout.units) do bytes = bytes + u.total * 4 end
  local last
  for _, ac in ipairs({ "none", "selective", "full" }) do
    p.training = { activation_checkpointing = ac, optimizer = "adamw" }
    p._audit = nil
    local a = audit.analysis(p)
    local m = a.memory
    H.eq(m.params_bytes, bytes, "sharded params (fp32)")
    H.eq(m.grads_bytes, bytes, "sharded grads")
    H.eq(m.optimizer_bytes, 2 * bytes, "AdamW moments")
    H.eq(m.comm_bytes, p.memory.arena_bytes, "arena")
    H.eq(m.total_bytes, 4 * bytes + m.comm_bytes + m.activation_bytes, "total")
    if last then assert(m.activation_bytes < last, ac .. " keeps fewer activations") end
    last = m.activation_bytes
  end
  p.training = { fp32_master = true }
  p._audit = nil
  H.eq(audit.analysis(p).memory.optimizer_bytes, 3 * bytes, "moments + fp32 master")
  p.topology.gpu_memory_GB = 1
  p._audit = nil
  local a = audit.analysis(p)
  H.eq(a.memory.fits, false, "verdict against 1 GB")
  local warned = false
  for _, w in ipairs(a.warnings) do if w:find("memory:", 1, true) then warned = true end end
  assert(warned, "a rank that does not fit is a warning")
end

function T.flops_follow_torchtitan()
  local src = read("plans/llama8b.lua"):gsub("training = {[^}]*},", "")
  local p = plan.from_source(src, "plans/llama8b.lua")
  local s = compute.settings(p)
  local cfg = p.model_config
  local n = 0
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.params) do
      if not q.name:find("tok_embeddings", 1, true) and #q.shape == 2 then n = n + q.numel end
    end
  end
  local per_token = 6 * n + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * s.seq_len
  local got = compute.step_flops(p, compute.units(p, s))
  H.eq(s.activation_checkpointing, "none", "default checkpointing")
  assert(math.abs(got - per_token * s.tokens) <= 1e-9 * got, string.format("%g vs %g", got, per_token * s.tokens))
end

function T.advisor_ranks_llama70b_on_1024()
  local text = require("gen.advisor").report(read("plans/llama70b.lua"), "plans/llama70b.lua", { world_size = 1024 })
  assert(text:find("Top choice:", 1, true), text)
  local rows = 0
  for line in text:gmatch("[^\n]+") do
    if line:match("^| %d+ |") then rows = rows + 1 end
  end
  assert(rows >= 5, "at least 5 ranked meshes")
  assert(text:find("8 meshes accepted", 1, true), text)
end

-- The advisor ranks pipeline meshes too (issue 22): pp 2-16 with the best
-- mesh's tp, each with its fastest schedule that fits, in the order it
-- prints; a pipeline torch cannot split is refused with its reason.
function T.advisor_ranks_pipeline_meshes()
  local advisor = require("gen.advisor")
  local src = read("plans/llama8b.lua")
  local res = advisor.rank(require("gen.load").source(src, "plans/llama8b.lua"), {})
  local pl = res.pipeline
  assert(pl and #pl.results >= 3, "pipeline candidates")
  for i, x in ipairs(pl.results) do
    assert(not x.row.refused and x.row.sim.step_us > 0, x.mesh)
    H.eq(x.pp * x.dp * x.t, 64, "the world")
    H.eq(x.n, 64 // x.dp, "one sequence per microbatch")
    local nxt = pl.results[i + 1]
    if nxt and x.row.fits and nxt.row.fits then
      assert(x.row.sim.step_us <= nxt.row.sim.step_us, "ordered by step")
    end
  end
  local text = advisor.report(src, "plans/llama8b.lua", {})
  assert(text:find("## With pipeline parallel", 1, true), "the section")
  assert(text:find("| 1 | " .. pl.results[1].pp .. " | " .. pl.results[1].dp .. " |", 1, true), "its first row")
  -- the tiny Llama's 2 layers split into at most 2 stages per schedule torchtitan runs
  local tiny = advisor.rank(require("gen.load").source(read("plans/llama_tiny.lua"), "plans/llama_tiny.lua"), {})
  assert(#tiny.pipeline.refused > 0, "pp 4 on two layers is refused")
  for _, x in ipairs(tiny.pipeline.refused) do assert(not x.why:find("attempt to", 1, true), x.why) end
end

-- Advice on a pipeline plan: its global batch counts world / (tp x pp)
-- data-parallel ranks, the meshes without a pipeline are ranked (not
-- refused for the plan's pipeline section), and its own mesh is marked in
-- the pipeline table.
function T.advisor_on_a_pipeline_plan()
  local advisor = require("gen.advisor")
  local src = read("tests/pp/plans/pp_tiny.lua")
  local res = advisor.rank(require("gen.load").source(src, "tests/pp/plans/pp_tiny.lua"), {})
  H.eq(res.global_batch, 8, "local batch 4 x 2 data-parallel ranks")
  assert(#res.results > 0, "meshes without a pipeline ranked")
  for _, x in ipairs(res.rejected) do assert(not x.why:find("pipeline", 1, true), x.why) end
  local own
  for _, x in ipairs(res.pipeline.results) do if x.plan_mesh then own = x end end
  assert(own and own.pp == 2 and own.dp == 2, "the plan's pipeline mesh")
  local text = advisor.report(src, "tests/pp/plans/pp_tiny.lua", {})
  assert(text:find("(the plan's mesh) |", 1, true), text)
  -- the headline's top choice (no pipeline) says where the plan's own mesh ranks
  assert(text:find("- The plan's own mesh pipelines (pp=2 x dp_shard=2 x tp=1): #", 1, true), text)
end

-- The advisor keeps the plan's global batch (local batch x data-parallel
-- size): the plan's own mesh ranks at SCHEDULE.md's step, and a mesh whose
-- data-parallel size does not divide the batch is refused, never re-batched.
function T.advisor_keeps_the_plans_global_batch()
  local advisor = require("gen.advisor")
  local src = read("plans/llama70b.lua")
  local res = advisor.rank(require("gen.load").source(src, "plans/llama70b.lua"), {})
  H.eq(res.global_batch, 128, "the plan's 1 x 128 data-parallel ranks")
  local p = plan.from_source(src, "plans/llama70b.lua")
  local want = require("gen.figures").of(p).step_us
  local own
  for _, x in ipairs(res.results) do
    if x.plan_mesh then own = x end
    H.eq(x.r * x.s * x.local_batch, 128, x.mesh .. " keeps the batch")
  end
  assert(own, "the plan's own mesh is ranked")
  H.eq(own.mesh, "dp_replicate=16 x dp_shard=8 x tp=8", "own mesh")
  H.eq(own.written.step_us, want, "the plan as written: SCHEDULE.md's step")
  H.eq(own.written.ac, "full", "as the plan sets it")
  -- Ranked with its fastest policy that fits, like every mesh: never
  -- below a slower one.
  assert(own.fits and own.step_us <= own.written.step_us, "the plan's mesh ranks with its fastest policy")
  local refused = 0
  for _, x in ipairs(res.rejected) do
    if x.mesh:match("x tp=1$") then
      refused = refused + 1
      assert(x.why:find("1024 data-parallel ranks do not divide the global batch of 128", 1, true), x.why)
    end
  end
  assert(refused > 0, "tp=1 meshes refused")
  local text = advisor.report(src, "plans/llama70b.lua", { world_size = 7 })
  assert(text:find("No mesh on 7 GPUs takes the global batch of 128", 1, true), text)
  assert(text:find("its 7 data-parallel ranks do not divide the global batch of 128 sequences", 1, true), text)
  assert(not text:find("1024 sequences", 1, true), text)
end

function T.fold_runs_and_names()
  H.eq(fold.unit_range({ "layers.0", "layers.1", "layers.2" }), "layers.0-2", "ascending")
  H.eq(fold.unit_range({ "layers.9", "layers.8" }), "layers.9-8", "descending")
  H.eq(fold.unit_range({ "a", "b" }), "a .. b (2 units)", "unnumbered")
  local items = {}
  for i = 1, 4 do
    items[#items + 1] = { sig = "x", unit = i }
    items[#items + 1] = { sig = "y", unit = i }
  end
  local runs = fold.runs(items, 4)
  H.eq(#runs, 1, "one run"); H.eq(runs[1].period, 2, "period"); H.eq(runs[1].reps, 4, "reps")
  H.eq(json.encode(219.993), "219.993", "shortest round-trip number")
  -- fold.rows: one row per place in a folded block, standing for its reps.
  local rows = fold.rows(items, 4)
  H.eq(#rows, 2, "a block of two folds to two rows")
  H.eq(table.concat(rows[1].members, ","), "1,3,5,7", "x's rows"); H.eq(table.concat(rows[2].members, ","), "2,4,6,8", "y's")
  -- fold.numbered: an MoE layer's two units number alike, unnumbered names keep their index.
  H.eq(select(2, fold.numbered("layers.7.experts", 15)), 7, "experts keyed by their layer")
  H.eq(fold.numbered("layers.7.experts", 15), "layers.#.experts", "and templated")
  H.eq(select(2, fold.numbered("norm_lm_head", 66)), 66, "an unnumbered unit keeps its index")
end

-- Issue 34, item 3: an MoE plan's report folds its interleaved units
-- (layers.N, layers.N.experts) as a dense plan folds its layers, so it
-- reads in one sitting; breaking the numbered keys (folding by unit index
-- again) brings mixtral back to ~1,500 lines.
function T.moe_schedule_md_folds_interleaved_units()
  for _, name in ipairs({ "mixtral8x7b", "deepseek_v3" }) do
    local path = "plans/" .. name .. ".lua"
    local p, fp = gen(read(path), path)
    local md = audit.schedule_md(p, fp)
    local _, n = md:gsub("\n", "")
    assert(n <= 400, string.format("%s: SCHEDULE.md has %d lines (at most 400)", name, n))
    local last = p.layout.units[#p.layout.units - 1].name:match("^layers%.(%d+)") -- the last block's number
    assert(last, name .. ": a numbered last block")
    for _, want in ipairs({ "| layers.%s-" .. last .. " |", "| layers.%s-" .. last .. ".experts |" }) do
      local found = md:find(want:format("0"), 1, true) or md:find(want:format("1"), 1, true)
        or md:find(want:format("3"), 1, true)
      assert(found, name .. ": the units table folds " .. want:format("N"))
    end
    assert(md:find("layers.31-0.experts", 1, true) or name ~= "mixtral8x7b",
      name .. ": warnings name the experts' run, not three of them and 'and 29 more'")
  end
end

-- The advisor explores cp for a long-context plan and ep for an MoE plan
-- (issue 35, item 4): llama8b_cp (seq_len 131,072, cp 8) ranks meshes of
-- every cp it can run, with and without cp; mixtral8x7b (8 experts, ep 8)
-- ranks ep 1, 2, 4 and 8, and no mesh is refused for an ep its dp_shard x
-- cp x tp does not hold (such an ep is no mesh of that world); llama8b
-- (seq_len 8,192) keeps cp 1 and has no ep.
function T.advisor_explores_cp_and_ep()
  local advisor = require("gen.advisor")
  local function rank(path) return advisor.rank(require("gen.load").source(read(path), path), { no_pipeline = true }) end
  local res = rank("plans/llama8b_cp.lua")
  H.eq(table.concat(res.cps, ","), "1,2,4,8,16", "cp degrees of a long-context plan")
  local cps = {}
  for _, x in ipairs(res.results) do cps[x.cp] = true end
  assert(cps[1] and cps[8] and cps[16], "meshes with and without cp ranked")
  local text = advisor.report(read("plans/llama8b_cp.lua"), "plans/llama8b_cp.lua", { top = 1000 })
  assert(text:find("Explored: cp over 1, 2, 4, 8, 16", 1, true), "the report says cp was explored")
  -- ep explored: gpt-oss 20B's 32 experts (8 meshes, ~1 s); mixtral's 8 experts (78 meshes, ~11 s)
  -- under make test-full too (COMMPLAN_TEST_TIER=full; tests/run.sh's quick-tier line says so)
  local moe = { { "plans/gptoss_20b.lua", "gpt-oss 20B's 32 experts" } }
  if os.getenv("COMMPLAN_TEST_TIER") == "full" then moe[#moe + 1] = { "plans/mixtral8x7b.lua", "mixtral's 8 experts" } end
  for _, m in ipairs(moe) do
    res = rank(m[1])
    H.eq(table.concat(res.eps, ","), "1,2,4,8", "ep degrees of " .. m[2])
    local eps = {}
    for _, x in ipairs(res.results) do eps[x.e] = true end
    assert(eps[1] and eps[2] and eps[4] and eps[8], m[1] .. ": every ep ranked")
    for _, x in ipairs(res.rejected) do assert(not x.why:find("must divide dp_shard", 1, true), x.mesh .. ": " .. x.why) end
  end
  res = rank("plans/llama8b.lua")
  H.eq(table.concat(res.cps, ","), "1", "a short-context plan keeps cp 1")
  H.eq(table.concat(res.eps, ","), "1", "a dense model has no ep")
end

return T
