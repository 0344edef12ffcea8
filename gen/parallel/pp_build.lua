-- A pipeline plan (parallel.pp > 1 with pipeline.schedule) built into C
-- tables (issue 22, item 5): one class per pipeline rank
-- (gen/parallel/pp_tables.lua: its stages' units and one step's ops),
-- each with its own memory plan and proofs, over the whole world's mesh
-- (pp outermost, gen/dims.lua) and its group families; the whole step's
-- communication proved deadlock-free over every rank
-- (gen/parallel/pp_step_proof.lua) and equal to what torch issues
-- (gen/parallel/pp_sequence.lua); SCHEDULE.md and plan.json say what the
-- tables hold. TP inside the stages: a class per (pipeline rank, TP class).
local util = require("gen.util")
local dims = require("gen.dims")
local groups = require("gen.groups")
local json = require("gen.json")
local fold = require("gen.fold")
local memplan = require("gen.memplan")
local verify = require("gen.verify")
local report = require("gen.parallel.pp_report")
local tables = require("gen.parallel.pp_tables")
local seq = require("gen.parallel.pp_sequence")
local step_proof = require("gen.parallel.pp_step_proof")

local M = {}

local fmt = string.format

-- What the tables cannot run yet, as the plan's own one-line refusal.

-- The communication of every global rank from the tables, against the
-- events torch issues (pp_sequence, held to torch live) and through the
-- whole-step proof. Raises a one-line error naming the first difference.
local function prove(loaded, t, classes, W, R)
  local mesh = seq.mesh(t.sched.pp, W, R)
  local got = tables.events(classes, mesh, W)
  local want = seq.expected(t.sched, { dp_shard = W, dp_replicate = R, act_numel = t.act.numel,
                                       act_dtype = t.act.dtype, stage_fsdp = t.stage_fsdp })
  for g = 1, #want do
    for i = 1, math.max(#got[g], #want[g]) do
      local x, y = got[g][i], want[g][i]
      local same = x and y
      for _, k in ipairs({ "op", "peer", "numel", "dtype", "batch", "unit", "in_numel", "out_numel" }) do
        same = same and x[k] == y[k]
      end
      if not same then
        error(fmt("internal: pipeline rank tables differ from torch's sequence at global rank %d event %d (%s vs %s)",
          g - 1, i - 1, x and x.op or "none", y and y.op or "none"), 0)
      end
    end
  end
  local counts, why = step_proof.prove(got)
  if not counts then
    util.field_error(loaded.ctx, "pipeline.schedule", "the whole-step proof fails on the tables: " .. tostring(why))
  end
  return counts
end

-- loaded: gen/load.lua's plan with pp > 1 -> the plan object gen/emit.lua
-- renders (p.tp_classes: one class per pipeline rank) and pp_build's
-- own report fields (p.pipeline_build).
function M.plan(loaded)
  local t = report.tables(loaded, nil, { skip_classes = true })
  local sp = t.p -- the stage mesh's plan: layouts (a TP class each), dtypes, FSDP settings
  local d = dims.infer(loaded.ctx, loaded.parallel, loaded.world_size)
  local mesh = dims.mesh(d)
  local fams = groups.build(mesh)
  local fsdp = { micro_steps = t.sched.microbatches }
  -- A class per (pipeline rank, TP class of the stage mesh): the TP
  -- class's TP-local layouts, TP's activation collectives in each unit's
  -- forward and backward (gen/parallel/tp.lua), as FSDP2 + TP run them.
  local ntp = #sp.tp_classes
  local unit_ops = sp.dims.tp > 1 and require("gen.parallel.tp").unit_ops or nil
  local classes, first_tp = {}, nil
  for c, tcls in ipairs(sp.tp_classes) do
    local by_name = {}
    for _, u in ipairs(tcls.layout.units) do by_name[u.name] = u end
    local su = {}
    for st, list in pairs(t.stage_units) do
      su[st] = {}
      for i, u in ipairs(list) do su[st][i] = by_name[u.name] end
    end
    local ranks = tables.rank_tables(sp, t.sched, su, t.act, { unit_ops = unit_ops })
    if c == 1 then first_tp = ranks end
    for r, cls in ipairs(ranks) do
      local lay = {}
      for k, v in pairs(tcls.layout) do lay[k] = v end
      lay.units = cls.units
      verify.bounds(lay, fams, cls.ops, fsdp, nil)
      verify.order(lay, fams, cls.ops)
      local arena = memplan.build(lay, cls.ops, { micro_steps = fsdp.micro_steps })
      classes[(r - 1) * ntp + c] = { layout = lay, ops = cls.ops, arena = arena, stages = cls.stages,
                                     pp_rank = r - 1, tp_class = c - 1,
                                     coords = ntp > 1 and { r - 1, table.concat(tcls.coords, "/") } or { r - 1 } }
    end
  end
  -- (TP's collectives run inside each TP rank's compute, the same on every
  -- TP rank: the proof covers the FSDP and pipeline traffic of TP class 0)
  local counts = prove(loaded, t, first_tp, sp.dims.dp_shard, sp.dims.dp_replicate)
  local p = {}
  for k, v in pairs(sp) do p[k] = v end
  p.name, p.world_size, p.source_file = loaded.name, loaded.world_size, loaded.source_file
  p.dims, p.mesh, p.groups = d, mesh, fams
  p.fsdp = { micro_steps = fsdp.micro_steps, reshard_after_forward = false, grad_accumulation = "step_end",
             reduce_op = sp.fsdp.reduce_op, param_dtype = sp.fsdp.param_dtype, reduce_dtype = sp.fsdp.reduce_dtype }
  p.tp_classes = classes
  p.class_of_tp = nil
  p.layout, p.ops, p.arena, p.rep = classes[1].layout, classes[1].ops, classes[1].arena, nil
  p.pp = { size = t.sched.pp, mesh_dim = mesh.index.pp - 1, family = fams.by_name.pp.id }
  -- [pp coordinate x tp + tp coordinate] -> class (1-based)
  p.class_of = {}
  local tp = d.tp
  for r = 0, t.sched.pp - 1 do
    for k = 0, tp - 1 do p.class_of[r * tp + k] = r * ntp + (sp.class_of_tp and sp.class_of_tp[k] or 1) end
  end
  p.pipeline_build = { sched = t.sched, act = t.act, counts = counts, loaded = loaded, stage_plan = sp }
  return p
end

-- ---- what the tables hold, in words and JSON ----

-- Throughput as torchtitan reports it, for the plan's schedule: a
-- data-parallel rank's tokens per step over (the predicted step x the tp x
-- pp ranks that share them), MFU = model FLOPs per token x that / the
-- GPU's peak. The step is make pipeline's (gen/parallel/pp_audit.lua's
-- timed run of each rank's actions: FSDP's all-gathers taken as
-- prefetched, links uncontended). nil where the audit has no row.
function M.throughput(p)
  local b = p.pipeline_build
  if b.throughput ~= nil then return b.throughput or nil end
  local record = {}
  -- (the whole-step proof ran on the tables themselves: not again here)
  local ok, row = pcall(report.plan_row, b.loaded, { record = record, skip_step_proof = true })
  -- (the stage mesh's plan holds the whole model: class 0 only rank 0's stages)
  local sp_settings = require("gen.compute").settings(b.stage_plan)
  if not ok or row.refused or not (row.sim and row.sim.step_us > 0) then b.throughput = false; return nil end
  local shared = p.dims.tp * b.sched.pp
  -- (the stage plan is one microbatch's)
  local tps = sp_settings.tokens * b.sched.microbatches / (row.sim.step_us / 1e6 * shared)
  local fpt = require("gen.compute").model_flops_per_token(b.stage_plan, sp_settings)
  b.timed_actions = record
  b.throughput = { step_us = row.sim.step_us, bubble = row.sim.bubble, tokens_per_s_per_gpu = tps,
                   model_flops_per_token = fpt, mfu = fpt and fpt * tps / (sp_settings.gpu_TFLOPS * 1e12) or nil }
  return b.throughput
end

local function count_kinds(ops)
  local n = {}
  for _, o in ipairs(ops) do n[o.kind] = (n[o.kind] or 0) + 1 end
  return n
end

local function fingerprint_facts(p)
  local b = p.pipeline_build
  local out = { plan = p.name, world_size = p.world_size, schedule = b.sched.schedule, pp = b.sched.pp,
                microbatches = b.sched.microbatches, act = b.act, mesh = { names = p.mesh.names, sizes = p.mesh.sizes },
                classes = {} }
  for i, c in ipairs(p.tp_classes) do
    local ops = {}
    for j, o in ipairs(c.ops) do
      ops[j] = table.concat({ o.kind, o.unit, o.micro_step, o.stream, tostring(o.group), tostring(o.count),
                              tostring(o.peer), tostring(o.batch), tostring(o.tag) }, ",")
    end
    local units = {}
    for j, u in ipairs(c.layout.units) do units[j] = u.name .. ":" .. u.total .. ":" .. (u.pp_numel or 0) end
    out.classes[i] = { units = units, ops = ops, arena_bytes = c.arena.arena_bytes }
  end
  return out
end

function M.fingerprint(p)
  return require("gen.plan").hash64(json.encode(fingerprint_facts(p)))
end

function M.json(p, fp)
  local O = json.object
  local b = p.pipeline_build
  local cls = {}
  for i, c in ipairs(p.tp_classes) do
    local units = {}
    for j, u in ipairs(c.layout.units) do
      units[j] = O({ "name", u.name, "total", u.total, "pp_numel", u.pp_numel or 0 })
    end
    local ops = {}
    for j, o in ipairs(c.ops) do
      ops[j] = O({ "seq", o.seq, "kind", o.kind, "unit", c.layout.units[o.unit + 1].name, "micro_step", o.micro_step,
                   "stream", o.stream, "group", o.group, "dtype", o.dtype, "count", o.count, "peer", o.peer,
                   "batch", o.batch, "tag", o.tag, "waits_for", c.arena.waits[o.seq] })
    end
    cls[i] = O({ "pp_rank", c.pp_rank, "stages", c.stages, "units", units, "arena_bytes", c.arena.arena_bytes,
                 "ops", ops })
  end
  return json.encode(O({
    "_comment", "generated by commplan from " .. p.source_file .. "; do not edit",
    "fingerprint", fp, "plan", p.name, "world_size", p.world_size,
    "mesh", O({ "names", p.mesh.names, "sizes", p.mesh.sizes, "strides", p.mesh.strides }),
    "pipeline", O({ "schedule", b.sched.schedule, "pp", b.sched.pp, "microbatches", b.sched.microbatches,
                    "stages", b.sched.num_stages, "activation_numel", b.act.numel, "activation_dtype", b.act.dtype,
                    "proof", O({ "events", b.counts.events, "collectives", b.counts.collectives,
                                 "messages", b.counts.p2p, "batches", b.counts.batches }),
                    "throughput", M.throughput(p) and O({ "step_us", M.throughput(p).step_us,
                      "tokens_per_s_per_gpu", M.throughput(p).tokens_per_s_per_gpu,
                      "mfu", M.throughput(p).mfu }),
                    "ranks", cls }),
  }), " ") .. "\n"
end

function M.schedule_md(p, fp)
  local b = p.pipeline_build
  local L = {}
  local function w(f, ...) L[#L + 1] = select("#", ...) > 0 and fmt(f, ...) or f end
  w("<!-- generated by commplan from %s; do not edit. fingerprint %s -->", p.source_file, fp)
  w("# Communication schedule: %s (pipeline)", p.name)
  w("")
  local mesh = {}
  for i, n in ipairs(p.mesh.names) do mesh[i] = n .. "=" .. p.mesh.sizes[i] end
  w("%s on %d ranks (mesh %s): %d microbatches, %d stages; each pipeline rank runs its own tables (a class per "
    .. "rank in plan.c). One microbatch's activation between stages: %d %s elements per rank.", b.sched.schedule,
    p.world_size, table.concat(mesh, " x "), b.sched.microbatches, b.sched.num_stages, b.act.numel, b.act.dtype)
  w("")
  w("Proved: every rank's sends, receives and FSDP collectives equal what torch.distributed.pipelining + "
    .. "fully_shard issue (gen/parallel/pp_sequence.lua, held to torch live); the whole step (%d events, %d "
    .. "collectives, %d messages, %d coalesced batches on the %d ranks of pp x dp_replicate x dp_shard, HSDP's "
    .. "all-reduces included; each TP rank runs a copy) cannot deadlock (gen/parallel/pp_step_proof.lua, one queue per rank).", b.counts.events,
    b.counts.collectives, b.counts.p2p, b.counts.batches or 0, b.counts.ranks or p.world_size)
  w("")
  local th = M.throughput(p)
  if th then
    w("Throughput: %s tokens/s per GPU%s, for the predicted step of %s (bubble %.1f%%: make pipeline's timed run "
      .. "of each rank's actions, FSDP's all-gathers taken as prefetched; torchtitan's tps and MFU formulas).",
      require("gen.audit").commas(math.floor(th.tokens_per_s_per_gpu + 0.5)),
      th.mfu and fmt(", MFU %.1f%%", 100 * th.mfu) or "", report.human_us(th.step_us), 100 * th.bubble)
    w("")
    w("![predicted step per pipeline rank](timeline.svg)")
    w("")
    w("timeline.svg draws that run, a lane per pipeline rank (each microbatch's F, B, I and W at its predicted "
      .. "start; the gaps are the bubble; each stage's gradient reduction under its rank); trace.json holds the "
      .. "same as Chrome trace events (open it in Perfetto).")
    w("")
  end
  w("| pipeline rank (TP class) | stages | units | ops | sends | receives | all-gathers | reduce-scatters | arena |")
  w("|---|---|---|---|---|---|---|---|---|")
  for _, c in ipairs(p.tp_classes) do
    local n = count_kinds(c.ops)
    -- the stage's units, consecutive layers as one range (layers.0-6)
    local items, names = {}, {}
    for i, u in ipairs(c.layout.units) do
      local tpl, num = fold.template(u.name)
      items[i] = { sig = tpl, unit = num }
    end
    for _, run in ipairs(fold.runs(items, 1)) do
      local run_names = {}
      for r = 0, run.reps - 1 do run_names[#run_names + 1] = c.layout.units[run.first + r].name end
      names[#names + 1] = fold.unit_range(run_names)
    end
    w("| %s | %s | %s | %d | %d | %d | %d | %d | %s |", p.dims.tp > 1 and fmt("%d (%d)", c.pp_rank, c.tp_class)
      or tostring(c.pp_rank), table.concat(c.stages, ", "),
      table.concat(names, ", "), #c.ops, n.send or 0, n.recv or 0, n.all_gather or 0, n.reduce_scatter or 0,
      report.human_bytes(c.arena.arena_bytes))
  end
  w("")
  w("## Audit (make pipeline)")
  w("")
  w("```")
  local ok, text = pcall(report.text, b.loaded)
  w("%s", ok and text:gsub("\n$", "") or ("(not available: " .. tostring(text) .. ")"))
  w("```")
  w("")
  w("## Ops per pipeline rank")
  w("")
  w("Each rank's ops in issue order, folded: a unit's compute and the TP collectives inside it are one")
  w("row (`with tp: ...`); a block of rows repeated for the next layer is one row (`layers.0-6`, `#`")
  w("first-last/step, or first-last where rows hold several ops); a block of those repeated for the next")
  w("microbatch is one row again (micro-batch `8-13`, `#` the first .. last op it stands for), and a")
  w("block of those repeated for the next round of pp microbatches once more (`3-6 .. 11-14 (every 8)`:")
  w("microbatches 3-6 and 11-14). Every op of every rank, unfolded, is in plan.json (`pipeline.ranks[].ops`).")
  for _, c in ipairs(p.tp_classes) do
    w("")
    w("### Pipeline rank %d%s", c.pp_rank, p.dims.tp > 1 and fmt(", TP class %d", c.tp_class) or "")
    w("")
    w("| # | kind | unit | micro-batch | stream | detail |")
    w("|---|---|---|---|---|---|")
    for _, r in ipairs(M.folded_ops(c, p.dims.pp)) do
      w("| %s | %s | %s | %s | %s | %s |", r.seq, r.kind, r.units, r.micro, r.stream, r.detail)
    end
  end
  return table.concat(L, "\n") .. "\n"
end

-- A pipeline rank's op table, folded twice: first a block of ops repeated
-- for the next unit (`layers.0-6`, ops `first-last/period`, as the dense
-- plans' op table), then a block of those rows repeated for the next
-- microbatch (micro-batch `0-31`, `#` the first and last op it covers).
-- Rows { seq, kind, units, micro, stream, detail } of text, n: how many
-- ops a row stands for, and ops: those ops.
function M.folded_ops(c, pp)
  -- A unit's compute and the activation collectives inside it (TP's, on
  -- the compute stream, same unit and microbatch) are one entry.
  local entries = {}
  for _, o in ipairs(c.ops) do
    local e = entries[#entries]
    if e and (o.kind:match("^tp_") or o.kind:match("^cp_")) and e.compute and o.unit == e.o.unit
      and o.micro_step == e.o.micro_step and o.stream == e.o.stream then
      e.inner[#e.inner + 1] = o
      e.last = o
    else
      entries[#entries + 1] = { o = o, last = o, inner = {}, compute = o.kind == "forward" or o.kind == "backward" }
    end
  end
  local items, details = {}, {}
  for i, e in ipairs(entries) do
    local o, detail = e.o, ""
    if o.kind == "send" or o.kind == "recv" then
      -- (its batch, which moves with the microbatch, is shown apart: folded as a range)
      detail = fmt("%s pipeline rank %d, %d %s, tag %d", o.kind == "send" and "to" or "from", o.peer, o.count,
        o.dtype, o.tag)
    elseif o.group then
      detail = fmt("%s, %d %s per rank", o.group, o.count, o.dtype)
    end
    if #e.inner > 0 then
      local kinds = {}
      for _, x in ipairs(e.inner) do kinds[#kinds + 1] = x.kind:gsub("^tp_", "") end
      local x = e.inner[1]
      detail = fmt("with %s: %s, %d %s per rank", x.group, table.concat(kinds, ", "), x.count, x.dtype)
    end
    details[i] = detail
    local name = c.layout.units[o.unit + 1].name
    items[i] = { sig = table.concat({ o.kind, o.micro_step, o.stream, detail, o.batch or 0, (fold.template(name)) },
      "|"), unit = o.unit }
  end
  local rows = {}
  for _, run in ipairs(fold.runs(items, 16)) do
    for j = 0, run.period - 1 do
      local first = run.first + j
      local o = entries[first].o
      local last, names = first + (run.reps - 1) * run.period, {}
      for r = 0, run.reps - 1 do names[#names + 1] = c.layout.units[entries[first + r * run.period].o.unit + 1].name end
      -- (a period in ops only where no entry merged several ops)
      local plain = run.reps > 1 and #entries[first].inner == 0 and entries[first].o.seq + run.period == entries[first
        + run.period].o.seq
      local n, ops = 0, {}
      for r = 0, run.reps - 1 do
        local e = entries[first + r * run.period]
        n = n + 1 + #e.inner
        ops[#ops + 1] = e.o
        for _, x in ipairs(e.inner) do ops[#ops + 1] = x end
      end
      rows[#rows + 1] = { n = n, ops = ops, first = o.seq, last = entries[last].last.seq, period = plain and run.period or nil,
                          kind = o.kind, units = fold.unit_range(names), micro = o.micro_step, stream = o.stream,
                          detail = details[first], batch = (o.batch or 0) > 0 and o.batch or nil }
    end
  end
  -- the second fold: the same rows (all but their ops and microbatch) for
  -- the next microbatch; a send's or receive's tag and peer are in detail
  local ritems = {}
  for i, r in ipairs(rows) do
    ritems[i] = { sig = table.concat({ r.kind, r.units, r.stream, r.detail, r.period or "",
      r.batch and (r.batch - r.micro) or "-" }, "|"), unit = r.micro }
  end
  local out = {}
  for _, run in ipairs(fold.runs(ritems, 64)) do
    for j = 0, run.period - 1 do
      local a = rows[run.first + j]
      local z = rows[run.first + j + (run.reps - 1) * run.period]
      local ops_text
      if run.reps > 1 then ops_text = fmt("%d .. %d", a.first, z.last)
      elseif a.period then ops_text = fmt("%d-%d/%d", a.first, a.last, a.period)
      elseif a.last > a.first then ops_text = fmt("%d-%d", a.first, a.last)
      else ops_text = tostring(a.first) end
      local n, ops = 0, {}
      for r = 0, run.reps - 1 do
        local x = rows[run.first + j + r * run.period]
        n = n + x.n
        table.move(x.ops, 1, #x.ops, #ops + 1, ops)
      end
      local detail = a.detail
      if a.batch then
        detail = detail .. (run.reps > 1 and fmt(", batch %d-%d", a.batch, z.batch) or fmt(", batch %d", a.batch))
      end
      out[#out + 1] = { n = n, ops = ops, seq = ops_text, kind = a.kind, units = a.units, stream = a.stream, detail = detail,
                        micro = run.reps > 1 and fmt("%d-%d", a.micro, z.micro) or tostring(a.micro),
                        m0 = a.micro, reps = run.reps, base = a.detail, batch = a.batch, zbatch = z.batch,
                        first = a.first, last = z.last }
    end
  end
  -- the third fold: an interleaved schedule's rounds (the same rows for
  -- the next pp microbatches)
  local D = pp or 1
  if D <= 1 then return out end
  local titems = {}
  for i, r in ipairs(out) do
    titems[i] = { sig = table.concat({ r.kind, r.units, r.stream, r.base, r.reps, r.seq:find(" .. ", 1, true) and "r"
      or r.seq:gsub("%d+", "#"), r.batch and (r.batch - r.m0) or "-" }, "|"), unit = r.m0 }
  end
  local final = {}
  for _, run in ipairs(fold.runs(titems, 64, D)) do
    for j = 0, run.period - 1 do
      local a = out[run.first + j]
      if run.reps == 1 then
        final[#final + 1] = a
      else
        local z = out[run.first + j + (run.reps - 1) * run.period]
        local n, ops = 0, {}
        for r = 0, run.reps - 1 do
          local x = out[run.first + j + r * run.period]
          n = n + x.n
          table.move(x.ops, 1, #x.ops, #ops + 1, ops)
        end
        final[#final + 1] = { n = n, ops = ops, seq = fmt("%d .. %d", a.first, z.last), kind = a.kind, units = a.units,
                              stream = a.stream, micro = fmt("%s .. %s (every %d)", a.micro, z.micro, D),
                              detail = a.base .. (a.batch and fmt(", batch %d .. %d", a.batch, z.zbatch) or "") }
      end
    end
  end
  return final
end

return M
