-- A pipeline plan's own parts of the one audit (gen/audit.lua renders
-- every plan; these are what a pipeline adds): its fingerprint's facts,
-- plan.json's `pipeline` section (every pipeline rank's op list, for
-- tools), SCHEDULE.md's pipeline sections (the stages and figures per
-- rank, rank 0's ops folded), its warnings. The figures come from
-- gen/figures.lua (figures.pipeline), the facts from p.pipeline (gen/parallel/pp.lua's describe).
local json = require("gen.json")
local fold = require("gen.fold")
local compute = require("gen.compute")

local pipeline_audit = {}

local fmt = string.format
local O = json.object

local function count_kinds(ops)
  local n = {}
  for _, o in ipairs(ops) do n[o.kind] = (n[o.kind] or 0) + 1 end
  return n
end

-- The facts the fingerprint hashes (what every rank's tables hold), as
-- JSON text: unchanged from when pipeline plans had their own renderer,
-- so their C tables keep their fingerprint.
function pipeline_audit.fingerprint_text(p)
  local pf = p.pipeline
  local out = { plan = p.name, world_size = p.world_size, schedule = pf.sched.schedule, pp = pf.sched.pp,
                microbatches = pf.sched.microbatches, act = pf.act, mesh = { names = p.mesh.names, sizes = p.mesh.sizes },
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
  return json.encode(out)
end

-- plan.json's `pipeline` section: the schedule, the proof's counts, the
-- timed run's figures (gen/figures.lua) and every pipeline rank's (x TP
-- class's) units and ops, unfolded.
function pipeline_audit.json_section(p, a)
  local pf, pl = a.pipeline.facts, a.pipeline
  local ranks = {}
  for i, c in ipairs(p.tp_classes) do
    local units = {}
    for j, u in ipairs(c.layout.units) do
      units[j] = O({ "name", u.name, "total", u.total, "pp_numel", u.pp_numel or 0 })
    end
    local ops = {}
    for j, o in ipairs(c.ops) do
      ops[j] = O({ "seq", o.seq, "kind", o.kind, "unit", c.layout.units[o.unit + 1].name, "micro_step", o.micro_step,
                   "stream", o.stream, "group", o.group, "dtype", o.dtype, "count", o.count,
                   -- (loss parallelism's max; a sum or avg is the tables' default, left out as before)
                   "reduce_op", o.reduce_op == "max" and "max" or nil, "peer", o.peer,
                   "batch", o.batch, "tag", o.tag, "waits_for", c.arena.waits[o.seq] })
    end
    ranks[i] = O({ "pp_rank", c.pp_rank, "tp_class", p.dims.tp > 1 and c.tp_class or nil, "stages", c.stages,
                   "units", units, "arena_bytes", c.arena.arena_bytes,
                   -- fsdp.symm_mem: the rank's symmetric window at the arena's start (gen/symm.lua)
                   "symm_window_bytes", c.arena.symm and c.arena.symm.window_bytes or nil, "ops", ops })
  end
  local per_rank
  if pl.per_rank then
    per_rank = {}
    for r, t in ipairs(pl.per_rank) do
      per_rank[r] = O({ "pp_rank", r - 1, "busy_us", t.busy_us, "end_us", t.end_us,
                        "p2p_exposed_us", t.p2p_exposed_us, "reduce_wait_us", t.reduce_wait_us })
    end
  end
  local c = pf.counts
  return O({ "schedule", pf.sched.schedule, "pp", pf.sched.pp, "microbatches", pf.sched.microbatches,
    "stages", pf.sched.num_stages, "activation_numel", pf.act.numel, "activation_dtype", pf.act.dtype,
    "proof", O({ "events", c.events, "collectives", c.collectives, "messages", c.p2p, "batches", c.batches }),
    "refused", pl.refused,
    "throughput", a.step_us and O({ "step_us", a.step_us, "bubble", pl.bubble,
      "tokens_per_s_per_gpu", a.throughput.tokens_per_s_per_gpu, "mfu", a.throughput.mfu }),
    "critical_rank", pl.critical_rank, "p2p_us", a.step_us and pf.row.p2p_us and pipeline_audit.r3(pf.row.p2p_us),
    "per_rank", per_rank, "ranks", ranks })
end

function pipeline_audit.r3(x) return tonumber(string.format("%.3f", x)) end

-- SCHEDULE.md's summary rows that say a pipeline's own way what a dense
-- plan's say (gen/audit.lua's schedule_md calls these in the same rows).
function pipeline_audit.tokens_text(a, A)
  local s, sched = a.settings, a.pipeline.facts.sched
  local ac = { none = "no activation checkpointing", full = "full activation checkpointing",
               selective = "selective (op) activation checkpointing" }
  local opt = s.optimizer == "adamw" and ("AdamW" .. (compute.bf16_moments(s) and ", moments in bf16" or "")
      .. (s.fp32_master and " with an fp32 master copy" or ""))
    or (s.optimizer == "sgd" and "SGD (no momentum)" or "no optimizer state")
  return fmt("%s tokens per data-parallel rank (TP group) and microbatch (local batch %d = %d microbatches of %d "
    .. "x seq_len %d); every unit's gradients reduced once, after the last microbatch (torch.distributed."
    .. "pipelining's finalize_backward); %s; %s", A.commas(s.tokens), s.local_batch_size * sched.microbatches,
    sched.microbatches, s.local_batch_size, s.seq_len, ac[s.activation_checkpointing], opt)
end

function pipeline_audit.memory_plan_text(a, A)
  local lo, hi, hi_rank = math.huge, 0, 0
  for r, b in ipairs(a.pipeline.arena_bytes) do
    lo = math.min(lo, b)
    if b > hi then hi, hi_rank = b, r - 1 end
  end
  return fmt("each pipeline rank's arena holds its stages' unsharded parameters and gradients all step (no reshard "
    .. "after forward under PP) and its messages: %s to %s (pipeline rank %d); bytes reused at once (policy %s), "
    .. "the timed run does not model the arena's waits", A.human(lo), A.human(hi), hi_rank, a.memory_plan.policy)
end

-- p: the plan (CP's K/V exchange and EP's all-to-alls run inside the stages' compute too)
function pipeline_audit.step_text(a, A, p)
  local pl = a.pipeline
  if not a.step_us then return "not predicted: " .. pl.refused end
  return fmt("%s predicted = compute %s + exposed communication %s (%.0f%% of the step) + pipeline waits %s, on "
    .. "pipeline rank %d (its clock ends last); bubble %.1f%% over every rank. Exposed communication is what the "
    .. "timed run leaves on that rank's path: its waits for activations and gradients on the wire (%s: of each "
    .. "wait for a received input, at most the transfer's %s) and for its last gradient reduction (%s); FSDP's "
    .. "all-gathers are taken as prefetched, %s%s run inside each stage's compute (counted in it)",
    A.us_text(a.step_us), A.us_text(a.compute_us), A.us_text(a.exposed_us),
    a.step_us > 0 and 100 * a.exposed_us / a.step_us or 0, A.us_text(a.waits_us), pl.critical_rank,
    100 * pl.bubble, A.us_text(pl.p2p_exposed_us), A.us_text(pl.facts.row.p2p_us), A.us_text(pl.reduce_wait_us),
    p and p.dims.cp > 1 and "TP's collectives and CP's K/V all-gathers and reduce-scatters" or "TP's collectives",
    p and p.dims.ep > 1 and " and EP's token all-to-alls (each microbatch's, priced at the uniform routing)" or "")
end

-- Warnings: a pipeline rank that does not fit, a refused timed run.
function pipeline_audit.warnings(_, a, A)
  local w = {}
  if a.pipeline.refused then w[#w + 1] = "the timed run refuses the plan's schedule: " .. a.pipeline.refused end
  local m = a.memory
  if m and not m.fits then
    w[#w + 1] = fmt("pipeline rank %d needs %s of the GPU's %s at its peak: it does not fit (`make pipeline` "
      .. "compares the schedules' memory)", m.rank, A.human(m.total_bytes), A.human(m.gpu_bytes))
  end
  return w
end

-- A rank's units, consecutive layers as one range (layers.0-6); an MoE
-- block's experts group (ep > 1: "layers.<i>.experts") counted with its
-- block, once at the end.
local function units_text(c)
  local items, names, units, experts = {}, {}, {}, 0
  for _, u in ipairs(c.layout.units) do
    if u.expert then experts = experts + 1 else units[#units + 1] = u end
  end
  for i, u in ipairs(units) do
    local tpl, num = fold.template(u.name)
    items[i] = { sig = tpl, unit = num }
  end
  for _, run in ipairs(fold.runs(items, 1)) do
    local run_names = {}
    for r = 0, run.reps - 1 do run_names[#run_names + 1] = units[run.first + r].name end
    names[#names + 1] = fold.unit_range(run_names)
  end
  return table.concat(names, ", ") .. (experts > 0 and string.format(" (%d MoE blocks with their experts groups)",
    experts) or "")
end

-- SCHEDULE.md after the summary for a pipeline plan: the pipeline's
-- sections (w: the line writer; A: gen/audit.lua, its text helpers).
function pipeline_audit.md_body(p, a, w, A)
  local pf, pl = a.pipeline.facts, a.pipeline
  local sched, c = pf.sched, pf.counts
  w("### Pipeline")
  w("")
  w("%s: %d microbatches through %d stages, %d per pipeline rank; each pipeline rank runs its own tables (a "
    .. "class per rank in plan.c). One microbatch's activation between stages: %s %s elements per rank, sent "
    .. "point to point in %s. Proved: every rank's sends, receives and FSDP collectives%s equal what "
    .. "torch.distributed.pipelining + fully_shard%s issue (gen/parallel/pp_sequence.lua, held to torch live); the "
    .. "whole step (%s events, %s collectives, %s messages, %d coalesced batches on the %s ranks of pp x "
    .. "dp_replicate x dp_shard%s%s) cannot deadlock (gen/parallel/pp_step_proof.lua).",
    sched.schedule, sched.microbatches, sched.num_stages, sched.num_stages // sched.pp, A.commas(pf.act.numel),
    pf.act.dtype, pf.row.p2p_us and A.us_text(pf.row.p2p_us) or "(not timed)",
    p.dims.ep > 1 and " and EP's token all-to-alls (inside each microbatch's F and B)" or "",
    p.dims.ep > 1 and " + torchtitan's ExpertParallel" or "", A.commas(c.events),
    A.commas(c.collectives), A.commas(c.p2p), c.batches or 0, A.commas(c.ranks or p.world_size),
    -- (FSDP's shard group inside a stage is dp_shard x cp: the proof's mesh takes it whole)
    p.dims.cp > 1 and " x cp" or "",
    -- (gen/parallel/pp_sequence.lua's mesh: TP's ranks in it where EP's all-to-alls cross them)
    p.dims.ep > 1 and p.dims.tp > 1 and " x tp, every TP rank with TP class 0's events" or "; each TP rank runs a copy")
  w("")
  w("| pipeline rank%s | stages | units | ops | sends | receives | all-gathers | reduce-scatters | arena | busy | "
    .. "exposed p2p | reduction wait | clock ends |", p.dims.tp > 1 and " (TP class)" or "")
  w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for _, cls in ipairs(p.tp_classes) do
    local n = count_kinds(cls.ops)
    local t = pl.per_rank and pl.per_rank[cls.pp_rank + 1]
    local function us(x) return t and A.us_text(x) or "" end
    w("| %s | %s | %s | %d | %d | %d | %d | %d | %s | %s | %s | %s | %s |", p.dims.tp > 1
      and fmt("%d (%d)", cls.pp_rank, cls.tp_class) or tostring(cls.pp_rank), table.concat(cls.stages, ", "),
      units_text(cls), #cls.ops, n.send or 0, n.recv or 0, n.all_gather or 0, n.reduce_scatter or 0,
      A.human(cls.arena.arena_bytes) .. (cls.arena.symm and fmt(" (symmetric window %s)",
        A.human(cls.arena.symm.window_bytes)) or ""), us(t and t.busy_us), us(t and t.p2p_exposed_us), us(t and t.reduce_wait_us),
      us(t and t.end_us))
  end
  w("")
  w("Busy: the rank's F, B, I and W in the timed run; exposed p2p: its waits for a received activation or gradient "
    .. "while it is on the wire; reduction wait: from its last compute to its last gradient reduction's end. "
    .. "`make pipeline PLAN=...` compares torch's schedules for this plan over the same figures.")
  w("")
  local m = a.memory
  if m then
    w("### Memory of the worst pipeline rank (rank %d)", m.rank)
    w("")
    w("| | |")
    w("|---|---|")
    w("| sharded state of its stages: parameters %s + gradients %s + optimizer %s | %s |", A.human(m.params_bytes),
      A.human(m.grads_bytes), A.human(m.optimizer_bytes), A.human(m.params_bytes + m.grads_bytes + m.optimizer_bytes))
    w("| unsharded parameters and gradients, held all step (the arena's) | %s |", A.human(m.comm_bytes))
    w("| activations: the most saved at once over its stages (%s) + one layer's transient (%s) | %s |",
      A.human(m.activation_saved_bytes), A.human(m.activation_transient_bytes), A.human(m.activation_bytes))
    w("")
  end
  A.md_warnings_and_step(a, w)
  w("timeline.svg: the timed run, a lane per pipeline rank (its stages) of one data-parallel replica; each box a")
  w("stage's F, B, I or W of one microbatch, labelled stage and microbatch (`s8 m12`) where it is wide enough")
  w("(the second panel zooms into the step's start); the gaps are the bubble; each stage's gradient reduction")
  w("under its rank. trace.json holds the same as Chrome trace events (open it in Perfetto).")
  w("")
  w("## Details")
  w("")
  A.md_groups(p, w)
  local first = p.tp_classes[1]
  w("### Pipeline rank 0's ops in issue order%s", p.dims.tp > 1 and " (TP class 0)" or "")
  w("")
  w("Folded: a unit's compute and the TP collectives inside it are one row (`with tp: ...`); a block of rows")
  w("repeated for the next layer is one row (`layers.0-6`, `#` first-last/step, or first-last where rows hold")
  w("several ops); a block of those repeated for the next microbatch is one row again (micro-batch `8-13`, `#`")
  w("the first .. last op it stands for), and a block of those repeated for the next round of pp microbatches")
  w("once more (`3-6 .. 11-14 (every 8)`: microbatches 3-6 and 11-14). Every op of every pipeline rank,")
  w("unfolded, is in plan.json (`pipeline.ranks[].ops`); the table above counts them per rank.")
  w("")
  w("| # | kind | unit | micro-batch | stream | detail |")
  w("|---|---|---|---|---|---|")
  for _, r in ipairs(pipeline_audit.folded_ops(first, p.dims.pp)) do
    w("| %s | %s | %s | %s | %s | %s |", r.seq, r.kind, r.units, r.micro, r.stream, r.detail)
  end
  w("")
  w("## Assumptions")
  w("")
  w("- Stages are torchtitan's split; every rank's actions are torch's lowering of the schedule")
  w("  (gen/parallel/pp_schedule.lua); FSDP under PP as torchtitan applies it: no reshard after forward,")
  w("  gradients reduced once after the last microbatch.")
  w("- The step is the timed run of each rank's actions (gen/parallel/pp_audit.lua): compute per stage from")
  w("  gen/compute.lua for one microbatch, TP's collectives inside it; each activation or gradient")
  w("  transfer at the link between stage meshes (gen/cost.lua's p2p_us); each stage's gradient reduction")
  w("  as gen/cost.lua prices its collectives. Not modelled: FSDP's all-gathers (taken as prefetched),")
  w("  link contention, the memory plan's waits.")
  A.md_collective_model(p.topology, w)
end

-- A pipeline rank's op table, folded twice: first a block of ops repeated
-- for the next unit (`layers.0-6`, ops `first-last/period`, as the dense
-- plans' op table), then a block of those rows repeated for the next
-- microbatch (micro-batch `0-31`, `#` the first and last op it covers).
-- Rows { seq, kind, units, micro, stream, detail } of text, n: how many
-- ops a row stands for, and ops: those ops.
function pipeline_audit.folded_ops(c, pp)
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
    -- (numbered by name: an MoE block's two units, layers.N and
    -- layers.N.experts, fold as layers.0-6 and layers.0-6.experts)
    local tpl, num = fold.numbered(name, o.unit)
    items[i] = { sig = table.concat({ o.kind, o.micro_step, o.stream, detail, o.batch or 0, tpl }, "|"), unit = num }
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

return pipeline_audit
