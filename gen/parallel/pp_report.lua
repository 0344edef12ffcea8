-- `make pipeline PLAN=...` (lua5.4 gen/verbs.lua pipeline PLAN.lua): a
-- pipeline-parallel plan's schedules side by side before the job runs
-- (issue 22, item 4). For each of torch.distributed.pipelining's schedules
-- that accepts the plan's pp and microbatches: torchtitan's stage split
-- (gen/parallel/pp_stages.lua), every rank's actions as torch lowers them
-- and the proof that their sends and receives match and cannot deadlock
-- (gen/parallel/pp_schedule.lua), the whole step's proof over every rank
-- of the pp x dp_replicate x dp_shard mesh, FSDP collectives included
-- (gen/parallel/pp_step_proof.lua), and the predicted step from a timed run
-- of those actions (gen/parallel/pp_audit.lua): bubble fraction,
-- activations in flight per stage, point-to-point bytes per rank.
--
-- The numbers per stage come from the plan of one stage's mesh (the plan
-- with pp = 1 on world / pp ranks: its FSDP, HSDP and TP as the generator
-- plans them): compute per unit from gen/compute.lua split over the
-- microbatches, the gradient reduction's collectives from gen/cost.lua,
-- each activation transfer at the inter-node bandwidth (torchtitan puts
-- pp outermost in the mesh). The tables themselves come from
-- gen/parallel/pp.lua.
local util = require("gen.util")
local compute = require("gen.compute")
local memory = require("gen.memory")
local stages_mod = require("gen.parallel.pp_stages")
local sched_mod = require("gen.parallel.pp_schedule")
local csv_mod = require("gen.parallel.pp_csv")
local pp_audit = require("gen.parallel.pp_audit")
local cost = require("gen.cost")
local hardware = require("gen.hardware")
local pp_sequence = require("gen.parallel.pp_sequence")
local step_proof = require("gen.parallel.pp_step_proof")

local report = {}

report.SCHEDULES = { "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
                     "DualPipeV" }
-- torch's multi-stage base class (schedules.py get_schedule_class): no actions of its own, a plan's
-- pipeline.csv gives them (torchtitan: pipeline_parallel_schedule = "PipelineScheduleMulti" with
-- pipeline_parallel_schedule_csv); not among SCHEDULES, which torch derives
report.MULTI = "PipelineScheduleMulti"

-- A stage's modules (torchtitan's names, pp_stages.split) -> the family's
-- FSDP units that hold them (gen/models/*.lua), one rule for every decoder
-- family: the unit holding the module's parameters (names "<module>."...),
-- and lm_head the loss head unit (loss_head: [norm, lm_head], which the
-- llama family's names output.weight as torchtitan's older llama did).
-- torchtitan's pipeline_llm (distributed/pipeline_parallel.py:88-92) splits
-- every decoder it ships -- llama3, qwen3, deepseek_v3 -- by these names
-- (_generate_llm_fqn_per_model_part, :366-476); a MoE block is one module,
-- its routed experts (under ep > 1 the unit "layers.<i>.experts") go with it.
function report.unit_names(units, module)
  local out = {}
  for _, u in ipairs(units) do
    local holds = module == "lm_head" and u.loss_head
    for _, q in ipairs(u.params) do
      if holds then break end
      holds = q.name:sub(1, #module + 1) == module .. "."
    end
    if holds or u.state == module then out[#out + 1] = u.name end
  end
  return out
end

-- How an activation travels between stages, in words (gen/cost.lua's p2p_us).
local function p2p_text(topo, world)
  if world <= topo.gpus_per_node then return "over NVLink, inside one node" end
  if topo.collectives == "alpha_beta" then
    return string.format("at %g GB/s + %g us", topo.inter_node_GBps, topo.latency_us)
  end
  local net = hardware.network(topo)
  return string.format("over one %g Gb/s NIC (NCCL ring/Simple latency + bytes at min(NIC, PCIe %g GB/s))",
    net.nic_Gbps, net.pci_GBps)
end

local function human_us(us)
  if us >= 1e6 then return string.format("%.2f s", us / 1e6) end
  if us >= 1e3 then return string.format("%.2f ms", us / 1e3) end
  return string.format("%.1f us", us)
end

local function human_bytes(b)
  local units, i = { "B", "KiB", "MiB", "GiB", "TiB" }, 1
  while b >= 1024 and i < #units do b = b / 1024; i = i + 1 end
  return i == 1 and string.format("%d B", b) or string.format("%.2f %s", b, units[i])
end

-- The plan file of one stage's mesh: the loaded plan with pp = 1 on world
-- / pp, for one microbatch of the n (local_batch_size / n sequences): each
-- microbatch's forward and backward run TP's activation collectives on
-- its own activations (torch's stage runs the module once per microbatch).
-- gen/plan.lua plans it as it plans any (PP's inner_plan hook,
-- gen/parallel/pp.lua), as does the verb (gen/pipeline.lua).
local function stage_loaded(loaded, pp, n)
  local ctx = loaded.ctx
  if loaded.world_size % pp ~= 0 then
    util.field_error(ctx, "parallel.pp", string.format("pp=%d does not divide world_size=%d; give a divisor", pp,
      loaded.world_size))
  end
  local sub = {}
  for k, v in pairs(loaded) do sub[k] = v end
  local par = {}
  for k, v in pairs(loaded.parallel) do par[k] = v end
  par.pp = nil
  sub.pipeline = nil -- the stage mesh has no pipeline (gen/parallel/pp.lua refuses one without pp)
  sub.parallel, sub.world_size = par, loaded.world_size // pp
  local training = {}
  for k, v in pairs(loaded.training or {}) do training[k] = v end
  training.local_batch_size = training.local_batch_size // n
  sub.training = training
  -- a pipeline's stages keep CrossEntropyLoss's FSDP order (gen/parallel/fsdp.lua's
  -- chunked_loss: ChunkedLossWrapper on the last stage is not modelled)
  sub.stage_of_pipeline = true
  return sub
end

-- Per stage (0-based) of one split: its units, and the costs the timed run
-- takes for one microbatch (p is one microbatch's plan): compute, and the
-- collectives on the compute stream, TP's activation collectives and CP's
-- K/V exchange (forward's in F, backward's
-- and full checkpointing's rerun of the forward's in B and in zero
-- bubble's I; under async TP what of each its matmul does not hide,
-- gen/timeline.lua's exposed_tp_us).
local function stage_costs(p, split)
  local s = compute.settings(p)
  local per_unit = compute.units(p, s)
  -- (the collectives inside a unit's compute: TP's, CP's and EP's token
  -- all-to-alls, each microbatch's own, on the compute stream)
  local tp_fwd, tp_bwd = {}, {}
  local timeline = require("gen.timeline")
  for _, o in ipairs(p.ops) do
    if o.group and o.stream == "compute" and o.micro_step == 0 then
      local us = timeline.exposed_tp_us(o, s, p.dims.tp)
      local into = o.phase == "forward" and tp_fwd or tp_bwd
      into[o.unit] = (into[o.unit] or 0) + us
    end
  end
  for _, o in ipairs(timeline.recomputed(p, s)) do
    if o.micro_step == 0 then tp_bwd[o.unit] = (tp_bwd[o.unit] or 0) + timeline.exposed_tp_us(o, s, p.dims.tp) end
  end
  local by_name = {}
  for _, u in ipairs(p.layout.units) do by_name[u.name] = u end
  -- the reduction of each unit (step_end: reduce-scatter and all-reduce once), micro-step 0's ops
  local reduce_of, gather_of = {}, {}
  for _, o in ipairs(p.ops) do
    if (o.kind == "reduce_scatter" or o.kind == "all_reduce") and o.micro_step == 0 then
      reduce_of[o.unit] = (reduce_of[o.unit] or 0) + (o.predicted_us or 0)
    end
    -- (each unit's first all-gather: what torchtitan's "always" policy repeats per microbatch)
    if o.kind == "all_gather" and o.micro_step == 0 and not gather_of[o.unit] then gather_of[o.unit] = o end
  end
  local always = pp_sequence.reshards_after_forward(p)
  local out = {}
  for i, mods in ipairs(split) do
    local seen, units = {}, {}
    for _, m in ipairs(mods) do
      local names = report.unit_names(p.layout.units, m)
      assert(#names > 0, "no unit holds " .. m)
      for _, name in ipairs(names) do
        if not seen[name] then
          seen[name] = true
          units[#units + 1] = assert(by_name[name], "no unit " .. name)
        end
      end
    end
    local c = { units = units, fwd = 0, bwd = 0, rec = 0, saved = 0, reduce_us = 0, transient = 0, tp_F = 0,
                tp_B = 0, fwd_us = 0, bwd_us = 0, rec_us = 0 }
    -- torchtitan's "always" policy: each unit's saved activations, unsharded parameters and all-gather time
    -- (gen/parallel/pp_audit.lua's regather)
    c.regather = always and { units = {} } or nil
    for _, u in ipairs(units) do
      local r = per_unit[u.index]
      if always then
        local ag = gather_of[u.index]
        c.regather.units[#c.regather.units + 1] = { act = r.saved, ag_us = ag and ag.predicted_us or 0,
          param = #u.params > 0 and p.layout.W * u.total * util.DTYPE_BYTES[u.ag_dtype] or 0 }
      end
      c.fwd, c.bwd, c.rec, c.saved = c.fwd + r.fwd, c.bwd + r.bwd, c.rec + r.recompute, c.saved + r.saved
      c.fwd_us, c.bwd_us, c.rec_us = c.fwd_us + r.fwd_us, c.bwd_us + r.bwd_us, c.rec_us + r.recompute_us
      c.transient = math.max(c.transient, r.transient)
      c.reduce_us = c.reduce_us + (reduce_of[u.index] or 0)
      c.tp_F, c.tp_B = c.tp_F + (tp_fwd[u.index] or 0), c.tp_B + (tp_bwd[u.index] or 0)
    end
    -- (each unit's times priced by gen/compute.lua)
    c.F = c.fwd_us + c.tp_F
    c.B = c.bwd_us + c.rec_us + c.tp_B
    -- zero bubble's split backward: the input gradient (its part of each
    -- unit's backward with the recompute, and TP's collectives: they carry
    -- activation gradients) and the weight gradient (the dW part), as
    -- gen/compute.lua backward_us splits it; on the first stage I computes
    -- nothing and W the whole backward (sched_mod.split_backward)
    local ip, wp = sched_mod.split_backward(i - 1)
    c.I, c.W = ip and c.tp_B or 0, wp == "full" and c.tp_B or 0
    for _, u in ipairs(units) do
      local r = per_unit[u.index]
      c.I = c.I + (ip and compute.backward_us(r, ip) or 0)
      c.W = c.W + compute.backward_us(r, wp)
    end
    out[i - 1] = c
  end
  return out, s
end

-- The whole step's proof (gen/parallel/pp_step_proof.lua) over the ranks
-- of pp x dp_replicate x dp_shard: each rank's sends and receives (one
-- microbatch's activation, act_numel of act_dtype) and its stages' FSDP
-- collectives where torch issues them (gen/parallel/pp_sequence.lua), each
-- unit's all-gather, reduce-scatter and HSDP all-reduce as the stage
-- mesh's plan p sizes them (its first all-gather; the reduce-scatters,
-- each followed by its all-reduce, in reverse unit order). Each TP rank
-- runs a copy of these lists, its peers and FSDP group in its own copy;
-- TP's collectives inside compute are not among the events (their members
-- are the same rank of every copy, at the same place in its list).
-- -> counts | nil, reason.
-- A stage's FSDP collectives as the stage mesh's plan p sizes them, for
-- gen/parallel/pp_sequence.lua: each unit's first all-gather, forward
-- order, and its reduce-scatter, layers last to first. Indexes p's ops
-- once; the result takes a stage's units.
local function stage_fsdp_of(p)
  local first_ag, rs, ar = {}, {}, {}
  for _, o in ipairs(p.ops) do
    -- (a collective without a group is a one-rank group's: FSDP2 issues none)
    if o.micro_step == 0 and o.kind == "all_gather" and o.group and not first_ag[o.unit] then first_ag[o.unit] = o end
    if o.micro_step == 0 and o.kind == "reduce_scatter" and o.group then rs[o.unit] = o end
    -- HSDP: the all-reduce of the reduce-scatter's output across replicas
    if o.micro_step == 0 and o.kind == "all_reduce" and o.group ~= "tp" then ar[o.unit] = o end
  end
  return function(units)
    local f = { gathers = {}, reduces = {} }
    -- (an experts unit's on the expert FSDP group: pp_sequence's group "efsdp")
    local function group(o) return o.group == "efsdp" and "efsdp" or nil end
    -- (each unit's FSDP state, a block and its experts group one: the
    -- states in forward order, for explicit prefetching's gathers)
    f.states = {}
    for _, u in ipairs(units) do
      local st = u.state or u.name
      if #u.params > 0 and f.states[#f.states] ~= st then f.states[#f.states + 1] = st end
      local o = first_ag[u.index]
      if o then
        f.gathers[#f.gathers + 1] = { unit = u.name, count = o.count, dtype = o.dtype, group = group(o), state = st }
      end
    end
    for k = #units, 1, -1 do
      local o = rs[units[k].index]
      if o then
        f.reduces[#f.reduces + 1] = { unit = units[k].name, count = o.count, dtype = o.dtype, group = group(o) }
      end
      local a = ar[units[k].index]
      if a then
        f.reduces[#f.reduces + 1] = { unit = units[k].name, count = a.count, dtype = a.dtype, kind = "all_reduce" }
      end
    end
    return f
  end
end

-- The collectives inside a stage's compute of one microbatch, as the
-- stage mesh's plan p issues them (its first micro-step): EP's token
-- all-to-alls on the ep group, forward and backward, per unit in issue
-- order (gen/parallel/pp_sequence.lua's stage_compute). Indexes p's ops
-- once; the result takes a stage's units.
local A2A = { a2a = true, a2a_counts = true }
local function stage_compute_of(p)
  local fwd, bwd = {}, {}
  for _, o in ipairs(p.ops) do
    if o.micro_step == 0 and A2A[o.kind] then
      local into = o.phase == "forward" and fwd or bwd
      into[o.unit] = into[o.unit] or {}
      table.insert(into[o.unit], { op = o.kind, count = o.count, dtype = o.dtype })
    end
  end
  return function(units)
    local c = { forward = {}, backward = {} }
    local function add(list, u)
      for _, x in ipairs(list[u.index] or {}) do
        c[list == fwd and "forward" or "backward"][#c[list == fwd and "forward" or "backward"] + 1] =
          { op = x.op, count = x.count, dtype = x.dtype, unit = u.name, state = u.state or u.name }
      end
    end
    for _, u in ipairs(units) do add(fwd, u) end
    for k = #units, 1, -1 do add(bwd, units[k]) end
    return c
  end
end

local function prove_step(p, sched, costs, act_numel, act_dtype)
  local of_units, compute_of = stage_fsdp_of(p), stage_compute_of(p)
  local function stage_fsdp(stage) return of_units(costs[stage].units) end
  local events = pp_sequence.expected(sched, pp_sequence.options(p, { numel = act_numel, dtype = act_dtype },
    stage_fsdp, function(st) return compute_of(costs[st].units) end))
  return step_proof.prove(events)
end

-- pipeline.csv: torch's CSV schedule, read beside the plan file (below
-- its directory, no symlinks: gen/fsio.lua's read_below; a regular file,
-- bounded) and imported as torch's _load_csv takes it
-- (gen/parallel/pp_csv.lua): its rows, cells and numbers bounded by the
-- plan's pp, microbatches and stages before anything is lowered, then
-- validated, lowered, and held to the stage count its schedule class
-- splits the model into. No refusal quotes the file's text.
local MAX_CSV = 4 << 20
local function csv_schedule(ctx, pl, pp, n, num_stages)
  local fsio = require("gen.fsio")
  local dir = ctx.file:match("^(.*)/[^/]*$") or "."
  if pl.csv == "" or pl.csv:find("%c") then
    util.field_error(ctx, "pipeline.csv", string.format("%s is not a path (%s); give the CSV file's path relative to "
      .. "the plan file", util.show(pl.csv), pl.csv == "" and "empty" or "it holds a control character"))
  end
  local text, why
  if ctx.read_beside then text, why = ctx.read_beside(pl.csv, MAX_CSV)
  else text, why = fsio.read_below(dir, pl.csv, MAX_CSV) end
  -- (read_below refuses any name but letters, digits and . _ - /: pl.csv is safe to show once read)
  local path = fsio.shown(pl.csv)
  if not text then
    util.field_error(ctx, "pipeline.csv", string.format("%s %s; give torch's CSV schedule (one row per pipeline "
      .. "rank, _dump_csv's format) beside the plan file", pl.csv:match("^[%w._%-/]+$") and path or "the path", why))
  end
  if not text:find("%S") then
    util.field_error(ctx, "pipeline.csv", string.format("%s is empty; give torch's CSV schedule (one row per "
      .. "pipeline rank; make pipeline CSV=... writes one to start from)", path))
  end
  local ok, sched = pcall(csv_mod.import_csv, text, { microbatches = n, pp = pp, num_stages = num_stages, file = path })
  if not ok then
    if not util.is_plan_error(sched) then error(sched, 0) end
    util.field_error(ctx, "pipeline.csv", string.format("%s; fix the file (make pipeline CSV=... writes a schedule's CSV to start "
      .. "from)", (tostring(sched.msg or sched):gsub("^pp_schedule: ", ""))))
  end
  local function differ(what, got, want)
    util.field_error(ctx, "pipeline.csv", string.format("%s has %s %d where the plan has %d; write the CSV for "
      .. "this plan's pipeline", fsio.shown(path), what, got, want))
  end
  if sched.pp ~= pp then differ("rows (pipeline ranks)", sched.pp, pp) end
  if sched.num_stages ~= num_stages then differ("stages", sched.num_stages, num_stages) end
  -- torchtitan places the stages by the named class (pipeline_parallel.py: "v" for ZBVZeroBubble and
  -- DualPipeV, else "loop"); _load_csv's _validate_and_set_stage_mapping takes the CSV's: they must agree
  for r = 0, pp - 1 do
    for _, st in ipairs(stages_mod.of_rank(r, pp, num_stages, pl.schedule)) do
      if sched.stage_to_rank[st] ~= r then
        util.field_error(ctx, "pipeline.csv", string.format("%s runs stage %d on pipeline rank %s, where %s places "
          .. "it on rank %d (torchtitan's stage placement, distributed/pipeline_parallel.py); write the CSV for "
          .. "that placement", fsio.shown(path), st, tostring(sched.stage_to_rank[st]), pl.schedule, r))
      end
    end
  end
  sched.schedule = pl.schedule .. " (CSV)"
  sched.runtime, sched.stages_per_rank, sched.torch_order = "multi", num_stages // pp, sched.compute
  sched.csv = path
  return sched
end

-- The schedule `name` for this plan: the plan's CSV for its own schedule
-- class where it gives one (csv_schedule), else torch's derivation.
local CSV_SCHEDULE = setmetatable({}, { __mode = "k" }) -- pipeline section -> its imported CSV schedule
local function schedule_of(ctx, pl, name, pp, n, per)
  if pl.csv and name == pl.schedule then return CSV_SCHEDULE[pl] or csv_schedule(ctx, pl, pp, n, pp * per) end
  return sched_mod.derive({ schedule = name, pp = pp, microbatches = n, stages_per_rank = per })
end

-- torchtitan's "always" policy (pp_sequence.reshards_after_forward) with a
-- schedule whose last stage ends on a split backward (zero bubble's I, then
-- W): torch 2.15 then reduces none of that stage's gradients, measured on
-- gloo (tests/pp/torch_pipeline_record.py --reshard-after-forward:
-- InterleavedZeroBubble and ZBVZeroBubble leave norm, lm_head and the last
-- block with p.grad None after the step; DualPipeV, whose last stage ends
-- on a full B, and the default policy reduce them), so the job would not
-- train them: refused.
local function refuse_always_split(ctx, p, sched)
  if pp_sequence.reshards_after_forward(p) and pp_sequence.last_stage_ends_split(sched) then
    util.field_error(ctx, "fsdp.reshard_after_forward_policy", string.format("\"always\" with %s: its last stage "
      .. "ends on a split backward (I, then W), and torch 2.15 then reduces no gradient of that stage under "
      .. "reshard_after_forward (measured on gloo: norm, lm_head and the last block keep p.grad None), so they "
      .. "would not train; use \"default\", or a schedule whose last stage ends on a full backward (1F1B, "
      .. "Interleaved1F1B, DualPipeV)", sched.schedule))
  end
end

-- One schedule's row, or nil and why torch (or torchtitan) refuses it.
-- opts.skip_step_proof: rank schedules without the whole-step proof (the
-- advisor's candidates: a proof per rank of a big mesh costs seconds; the
-- plan's own schedule is proved by make pipeline and the generator).
local function evaluate(p, loaded, pp, n, name, opts)
  local pl = loaded.pipeline or {}
  local ok, res = pcall(function()
    local model_layers = p.model_config.n_layers
    local num, per = stages_mod.count(nil, { pp = pp, schedule = name, n_layers = model_layers,
      layers_per_stage = pl.layers_per_stage, first_stage_less_layers = pl.first_stage_less_layers,
      last_stage_less_layers = pl.last_stage_less_layers })
    local split = stages_mod.split(nil, num, model_layers, pl.first_stage_less_layers, pl.last_stage_less_layers)
    local sched = schedule_of(loaded.ctx, pl, name, pp, n, per)
    refuse_always_split(loaded.ctx, p, sched)
    local proved, why = sched_mod.prove_p2p(sched.lowered, sched.stage_to_rank, sched.num_stages)
    if not proved then return { refused = "the point-to-point proof fails: " .. tostring(why) } end
    local costs, s = stage_costs(p, split)
    local topo = p.topology
    local mb_tokens = s.tokens
    -- a stage's output per microbatch and TP rank: sequence parallel (torchtitan's
    -- default with TP) leaves each TP rank its shard of the sequence
    local sp = p.dims.tp > 1 and loaded.parallel.sequence_parallel ~= false
    local act = mb_tokens * p.model_config.dim * util.DTYPE_BYTES[p.layout.units[1].ag_dtype] / (sp and p.dims.tp or 1)
    local act_numel = mb_tokens * p.model_config.dim / (sp and p.dims.tp or 1)
    local step, why_step = true, nil
    if not (opts and opts.skip_step_proof) then
      step, why_step = prove_step(p, sched, costs, math.tointeger(act_numel) or act_numel, p.layout.units[1].ag_dtype)
    end
    if not step then return { refused = "the whole-step proof fails: " .. tostring(why_step) } end
    -- pp is the mesh's outermost dim: a stage's peer is a whole stage mesh
    -- away, on the same node only when the whole job fits in one
    local p2p = cost.p2p_us(act, p.world_size * pp <= topo.gpus_per_node, topo)
    local regather
    if costs[0].regather then
      regather = {}
      for st = 0, num - 1 do regather[st] = costs[st].regather end
    end
    local sim = pp_audit.simulate(sched, function(stage, ty) return costs[stage][ty] end,
      function() return p2p end, function(stage) return costs[stage].reduce_us end,
      function(stage) return costs[stage].saved end, opts and opts.record, regather)
    -- Each rank's memory at its peak: its stages' units' sharded state
    -- (parameters, gradients, optimizer as gen/memory.lua counts them),
    -- their unsharded parameters and gradients held the whole step (under
    -- PP torchtitan does not reshard after forward, and the gradients
    -- accumulate unsharded until the end: FSDP2 with step_end), the saved
    -- activations the schedule keeps in flight, one layer's transient.
    -- The gradients accumulate in reduce_dtype: every backward of a stage
    -- runs without gradient sync, and FSDP2's post_backward then casts them
    -- to it (FSDPParamGroup._set_unsharded_grad_dtypes, torch 2.15), where
    -- the stage mesh's one-microbatch layout reduces them in ag_dtype.
    -- Under torchtitan's "always" policy the unsharded parameters are not
    -- held all step: the timed run's rank_peak_mem has them beside the
    -- activations, as each action holds them (pp_audit.lua's regather).
    local ES, W = util.DTYPE_BYTES, p.layout.W
    local worst_mem, worst_mem_rank = -1, 0
    for r = 0, pp - 1 do
      local bytes, transient = (sim.rank_peak_mem or sim.rank_peak_bytes)[r + 1], 0
      for _, st in ipairs(stages_mod.of_rank(r, pp, num, name)) do
        transient = math.max(transient, costs[st].transient)
        for _, u in ipairs(costs[st].units) do
          -- (the sharded parameters and optimizer state as gen/memory.lua counts them: the optimizer
          -- and the gradients the trainable shards only, u.rs_total; CPU offload: an offloading
          -- unit's sharded state is in host memory)
          local params, opt = memory.unit_state(u, s, u.total, u.rs_total)
          local state = u.offload and 0 or params + u.rs_total * ES[u.orig_dtype] + opt
          bytes = bytes + state + (regather and 0 or W * u.total * ES[u.ag_dtype]) + u.grads_numel * ES[u.reduce_dtype]
        end
      end
      bytes = bytes + transient
      if bytes > worst_mem then worst_mem, worst_mem_rank = bytes, r end
    end
    local sends = 0
    for _, a in ipairs(sched.lowered[1]) do
      if a.type == "SEND_F" or a.type == "SEND_B" then sends = sends + 1 end
    end
    -- the rank that holds the most saved activations at once, its stages together
    local worst, worst_bytes = 0, -1
    for r = 1, pp do
      if sim.rank_peak_bytes[r] > worst_bytes then worst, worst_bytes = r - 1, sim.rank_peak_bytes[r] end
    end
    local peak = 0
    for _, st in ipairs(stages_mod.of_rank(worst, pp, num, name)) do peak = peak + sim.inflight_peak[st] end
    return { name = name, stages = num, per = per, sim = sim, split = split, worst = worst, worst_bytes = worst_bytes,
             peak = peak, sends = sends, act = act, p2p_us = p2p, mem = worst_mem, mem_rank = worst_mem_rank,
             fits = worst_mem <= s.gpu_memory_bytes, step = step }
  end)
  if not ok then
    if util.is_plan_error(res) then
      local msg = tostring(res.msg or res):gsub("^plan:%d+: ", ""):gsub("^pp_schedule: ", "")
      return { name = name, refused = msg }
    end
    error(res, 0)
  end
  res.name = name
  return res
end

-- The plan's refusals (one line each, file and field), before the stage
-- mesh is planned: -> ctx, pp, pipeline section, microbatches.
function report.refuse(loaded)
  local ctx = loaded.ctx
  local pp = loaded.parallel.pp or 1
  if pp <= 1 then
    util.field_error(ctx, "parallel.pp", "pp=1: no pipeline to plan; set pp > 1 (and pipeline.microbatches)")
  end
  local family = require("gen.models.families")[loaded.model.family]
  if not family.config then
    util.field_error(ctx, "model.family", string.format("%s: pipeline stages are split by a decoder's module names "
      .. "(tok_embeddings, layers.<i>, norm, lm_head: torchtitan's pipeline_llm, distributed/pipeline_parallel.py:88); "
      .. "a generic model has none: use a decoder family (llama, qwen3, mixtral, qwen3_moe, deepseek_v3)",
      loaded.model.family))
  end
  local cfg = family.config(ctx, loaded.model)
  if cfg.enable_weight_tying then
    util.field_error(ctx, "model.enable_weight_tying", "true with pp > 1: torchtitan refuses it (\"Weight tying is "
      .. "not supported with Pipeline Parallel.\", models/common/decoder.py:139-142; the tied 0.6b, 1.7b and 4b "
      .. "flavours tie it); set enable_weight_tying = false or pp = 1")
  end
  local pl = loaded.pipeline or {}
  local n = pl.microbatches
  if not n then
    -- (gen/load.lua derives them from the batch where it is given)
    util.field_error(ctx, "training.local_batch_size", "missing; with pp > 1 the step runs local_batch_size / "
      .. "pipeline.microbatch_size microbatches (torchtitan's; microbatch_size defaults to 1): set it, or give "
      .. "pipeline.microbatches")
  end
  if pl.schedule == report.MULTI and not pl.csv then
    util.field_error(ctx, "pipeline.csv", "missing: PipelineScheduleMulti has no actions of its own; torchtitan "
      .. "builds it with a CSV alone (parallelism.pipeline_parallel_schedule_csv, distributed/pipeline_parallel.py:"
      .. "290-298, 351-361: _PipelineScheduleRuntime._load_csv): give pipeline.csv, or name a schedule class")
  end
  if pl.csv and (not pl.schedule or stages_mod.SINGLE[pl.schedule]) then
    util.field_error(ctx, "pipeline.csv", pl.schedule and string.format("%s runs one stage per rank and torch "
      .. "loads no CSV for it (_load_csv is _PipelineScheduleRuntime's): name a multi-stage schedule class",
      pl.schedule) or "needs pipeline.schedule: the multi-stage schedule class whose actions the CSV gives "
      .. "(torch's schedule._load_csv)")
  end
  -- FSDP as torchtitan applies it under PP (gen/parallel/pp.lua's settings): a
  -- plan's own setting that would be overridden is refused
  local given = ctx and ctx.fsdp_given or {}
  if given.reshard_after_forward == true and not given.reshard_after_forward_policy then
    util.field_error(ctx, "fsdp.reshard_after_forward", "true: under PP torchtitan decides it by its policy "
      .. "(distributed/fsdp.py:54-77; \"default\" keeps each stage's parameters unsharded from forward to "
      .. "backward): set fsdp.reshard_after_forward_policy = \"always\" instead, or remove the setting")
  end
  if given.grad_accumulation and given.grad_accumulation ~= "step_end" then
    util.field_error(ctx, "fsdp.grad_accumulation", string.format("%q: under PP each stage reduces its gradients "
      .. "once, after the last microbatch (torch's pipelining: no sync in backward, REDUCE_GRAD), which is "
      .. "\"step_end\"; remove the setting", given.grad_accumulation))
  end
  if loaded.fsdp and (loaded.fsdp.micro_steps or 1) > 1 then
    util.field_error(ctx, "fsdp.micro_steps", string.format("micro_steps=%d: under PP the step's microbatches are "
      .. "the pipeline's (pipeline.microbatches, torch's schedule runs them); remove fsdp.micro_steps",
      loaded.fsdp.micro_steps))
  end
  -- torchtitan splits the local batch into microbatches of
  -- pipeline_parallel_microbatch_size sequences (_build_pipeline_schedule:
  -- n_microbatches = local_batch_size // microbatch_size)
  local lbs = loaded.training and loaded.training.local_batch_size
  if not lbs or lbs % n ~= 0 then
    util.field_error(ctx, lbs and "pipeline.microbatches" or "training.local_batch_size", string.format(
      "%d microbatch%s need%s a local batch of a multiple of %d sequence%s (torchtitan: local_batch_size / "
      .. "pipeline_parallel_microbatch_size); %s", n, n == 1 and "" or "es", n == 1 and "s" or "", n,
      n == 1 and "" or "s", lbs and string.format("local_batch_size is %d: give a "
      .. "divisor of it", lbs) or "set training.local_batch_size"))
  end
  -- the pipeline's size, bounded before anything is built (pp_stages.check_size)
  local d = require("gen.dims").infer(ctx, loaded.parallel, loaded.world_size)
  local n_layers = cfg.n_layers
  -- (the units: the blocks, the embedding, the output and the root; with ep > 1 an experts group per block at most)
  stages_mod.check_size(ctx, { microbatches = n, dp = d.dp_shard * d.cp * d.dp_replicate,
    units = n_layers * (d.ep > 1 and 2 or 1) + 3,
    -- (the most stages any schedule class splits the model into: the audit in SCHEDULE.md runs them all)
    num_stages = stages_mod.stage_count({ pp = pp, n_layers = n_layers,
      layers_per_stage = pl.layers_per_stage, first_stage_less_layers = pl.first_stage_less_layers,
      last_stage_less_layers = pl.last_stage_less_layers }) })
  return ctx, pp, pl, n
end

-- The plan file of the loaded pipeline plan's stage mesh (refused first).
function report.stage_loaded(loaded)
  local _, pp, _, n = report.refuse(loaded)
  return stage_loaded(loaded, pp, n)
end

-- The stage mesh's plan p (gen/plan.lua's, of report.stage_loaded) taken
-- for the loaded plan, once: text, csv, plan_row and tables read it, and
-- the plan's CSV schedule is read and checked here (its refusals are the
-- plan's own).
local CHECKED = setmetatable({}, { __mode = "k" })
function report.adopt(loaded, p)
  if CHECKED[loaded] and CHECKED[loaded][5] == p then return end
  local ctx, pp, pl, n = report.refuse(loaded)
  if pl.csv then
    -- read and checked here, once: its refusals are the plan's own
    local num = stages_mod.count(ctx, { pp = pp, schedule = pl.schedule, n_layers = p.model_config.n_layers,
      layers_per_stage = pl.layers_per_stage, first_stage_less_layers = pl.first_stage_less_layers,
      last_stage_less_layers = pl.last_stage_less_layers })
    CSV_SCHEDULE[pl] = csv_schedule(ctx, pl, pp, n, num)
  end
  CHECKED[loaded] = { ctx, pp, pl, n, p }
end

-- Whether the loaded plan's stage mesh is planned and adopted already.
function report.adopted(loaded) return CHECKED[loaded] ~= nil end

local function checked(loaded)
  local hit = CHECKED[loaded]
  if not hit then
    error("internal: the stage mesh's plan is not adopted (gen/pipeline.lua or gen/parallel/pp.lua adopts it)", 0)
  end
  return table.unpack(hit)
end

-- The plan's schedule (pipeline.schedule) as torch's CSV: each rank's
-- compute actions, one row per rank (_dump_csv's compute_only format;
-- torch's _PipelineScheduleRuntime._load_csv reads it and lowers it itself,
-- to the lists the proof above covered). Multi-stage schedules only: torch
-- loads no CSV for GPipe or 1F1B.
function report.csv(loaded)
  local ctx, pp, pl, _, p = checked(loaded)
  if not pl.schedule then
    util.field_error(ctx, "pipeline.schedule", "missing: --csv writes the plan's schedule; name one of "
      .. table.concat(report.SCHEDULES, ", "))
  end
  if stages_mod.SINGLE[pl.schedule] then
    util.field_error(ctx, "pipeline.schedule", string.format("%s runs one stage per rank and torch loads no CSV "
      .. "for it (_load_csv is _PipelineScheduleRuntime's): pick a multi-stage schedule for --csv", pl.schedule))
  end
  if pl.schedule == report.MULTI then
    util.field_error(ctx, "pipeline.schedule", "PipelineScheduleMulti's actions are the plan's pipeline.csv "
      .. "already: copy that file, or name a schedule class for --csv to write")
  end
  local _, per = stages_mod.count(ctx, { pp = pp, schedule = pl.schedule, n_layers = p.model_config.n_layers,
    layers_per_stage = pl.layers_per_stage, first_stage_less_layers = pl.first_stage_less_layers,
    last_stage_less_layers = pl.last_stage_less_layers })
  local fine, sched = pcall(sched_mod.derive, { schedule = pl.schedule, pp = pp, microbatches = pl.microbatches,
                                                stages_per_rank = per })
  if not fine then
    if not util.is_plan_error(sched) then error(sched, 0) end
    util.field_error(ctx, "pipeline.schedule", (tostring(sched.msg or sched):gsub("^pp_schedule: ", "")))
  end
  local ok, why = sched_mod.prove_p2p(sched.lowered, sched.stage_to_rank, sched.num_stages)
  if not ok then util.field_error(ctx, "pipeline.schedule", "the send/receive proof fails: " .. tostring(why)) end
  return sched_mod.to_csv(sched.torch_order)
end

-- The plan's own schedule's row (pipeline.schedule), for `make diff-plan`
-- of two pipeline plans: { name, stages, per, sim, mem, fits, ... } or
-- { refused = why }, with pp and microbatches. opts.record: a list the
-- timed run appends its actions to (gen/parallel/pp_audit.lua).
function report.plan_row(loaded, opts)
  local ctx, pp, pl, _, p = checked(loaded)
  if not pl.schedule then
    util.field_error(ctx, "pipeline", "diff-plan of a pipeline plan compares its own schedule: give "
      .. "pipeline = { schedule, microbatches }")
  end
  local row = evaluate(p, loaded, pp, pl.microbatches, pl.schedule, opts)
  row.pp, row.microbatches = pp, pl.microbatches
  return row
end

report.human_us, report.human_bytes = human_us, human_bytes

-- The tables of the plan's own schedule (gen/parallel/pp_tables.lua): per
-- pipeline rank its stages' units and ops (opts.skip_classes: not built,
-- for a caller that builds its own), with what built them:
-- { p (the stage mesh's plan), sched, classes, act = { numel, dtype },
--   stage_units, stage_fsdp (for gen/parallel/pp_sequence.lua) }.
function report.tables(loaded, schedule, opts)
  local ctx, pp, pl, n, p = checked(loaded)
  local name = schedule or pl.schedule
  if not name then
    util.field_error(ctx, "pipeline.schedule", "missing: the tables run one schedule; name one of "
      .. table.concat(report.SCHEDULES, ", "))
  end
  local num, per = stages_mod.count(ctx, { pp = pp, schedule = name, n_layers = p.model_config.n_layers,
    layers_per_stage = pl.layers_per_stage, first_stage_less_layers = pl.first_stage_less_layers,
    last_stage_less_layers = pl.last_stage_less_layers })
  local split = stages_mod.split(ctx, num, p.model_config.n_layers, pl.first_stage_less_layers,
    pl.last_stage_less_layers)
  local fine, sched = pcall(schedule_of, ctx, pl, name, pp, n, per)
  if not fine then
    if not util.is_plan_error(sched) then error(sched, 0) end
    util.field_error(ctx, "pipeline.schedule", (tostring(sched.msg or sched):gsub("^pp_schedule: ", "")))
  end
  refuse_always_split(ctx, p, sched)
  local costs, s = stage_costs(p, split)
  local sp = p.dims.tp > 1 and loaded.parallel.sequence_parallel ~= false
  local numel = s.tokens * p.model_config.dim / (sp and p.dims.tp or 1)
  local act = { numel = math.tointeger(numel) or numel, dtype = p.layout.units[1].ag_dtype }
  local stage_units = {}
  for st = 0, sched.num_stages - 1 do stage_units[st] = costs[st].units end
  local tables = require("gen.parallel.pp_tables")
  local of_units, compute_of = stage_fsdp_of(p), stage_compute_of(p)
  local bad = tables.unsupported_action(sched)
  if bad then
    util.field_error(ctx, "pipeline.schedule", string.format("%s has a %s action, which the tables do not run; "
      .. "`make pipeline` audits it; generate with one of torch's schedules", sched.schedule, bad))
  end
  return { p = p, sched = sched, act = act, stage_units = stage_units,
           classes = not (opts and opts.skip_classes) and tables.rank_tables(p, sched, stage_units, act) or nil,
           stage_fsdp = function(st) return of_units(costs[st].units) end,
           stage_compute = function(st) return compute_of(costs[st].units) end }
end


-- Every schedule's row for the plan's pp and microbatches (the advisor's
-- pipeline candidates): { rows, p (the stage mesh's plan), n }.
function report.rows(loaded, opts)
  local _, pp, _, n, p = checked(loaded)
  local rows = {}
  for _, name in ipairs(report.SCHEDULES) do rows[#rows + 1] = evaluate(p, loaded, pp, n, name, opts) end
  return { rows = rows, p = p, n = n, pp = pp }
end

function report.text(loaded)
  local ctx, pp, pl, n, p = checked(loaded)
  local L = {}
  local function w(fmt, ...) L[#L + 1] = select("#", ...) > 0 and string.format(fmt, ...) or fmt end
  local s = compute.settings(p)
  local per_mb = s.tokens
  w("pipeline: %s on %d ranks: PP %d x a stage mesh of %d (%s), %d microbatches of %s tokens per rank and step",
    loaded.name, loaded.world_size, pp, p.world_size, table.concat(p.mesh.names, " x "), n,
    per_mb == math.floor(per_mb) and string.format("%d", per_mb) or string.format("%.1f", per_mb))
  local always = pp_sequence.reshards_after_forward(p)
  w("each stage's FSDP as torchtitan applies it under PP (%s; gradients reduced once, after "
    .. "the last microbatch); activations sent point to point %s", always and "fsdp_reshard_after_forward "
    .. "\"always\": every unit resharded after each microbatch's forward, gathered again by its backward"
    or "no reshard after forward", p2p_text(p.topology, p.world_size * pp))
  w("")
  w("%-22s %6s %5s %8s %12s %12s %26s %9s %22s", "schedule", "stages", "/rank", "bubble", "step", "busy/rank",
    "activations in flight", "p2p/rank", "memory (worst rank)")
  local rows = {}
  local want = pl.schedule
  local accepted = 0
  local names = { table.unpack(report.SCHEDULES) }
  if want == report.MULTI then names[#names + 1] = want end -- (the plan's CSV: its own row)
  for _, name in ipairs(names) do
    local row = evaluate(p, loaded, pp, n, name)
    rows[#rows + 1] = row
    if not row.refused then accepted = accepted + 1 end
    if row.refused and name == want then
      util.field_error(ctx, "pipeline.schedule", string.format("%s refuses this plan: %s; pick another schedule "
        .. "(make pipeline without pipeline.schedule lists the ones that run)", name, row.refused))
    end
  end
  if accepted == 0 then
    util.field_error(ctx, "pipeline", "torch refuses this pipeline with every schedule (" .. rows[1].refused
      .. "); change pp, microbatches or layers_per_stage")
  end
  for _, r in ipairs(rows) do
    if not r.refused then
      local busy = 0
      for _, b in ipairs(r.sim.busy_us) do busy = busy + b end
      w("%-22s %6d %5d %7.1f%% %12s %12s %26s %9s %22s%s", r.name, r.stages, r.per, 100 * r.sim.bubble,
        human_us(r.sim.step_us), human_us(busy / pp),
        string.format("%s (rank %d, %d mb)", human_bytes(r.worst_bytes), r.worst, r.peak),
        human_bytes(r.sends * r.act), string.format("%s%s", human_bytes(r.mem), r.fits and "" or " DOES NOT FIT"),
        r.name == want and (pl.csv and string.format("  <- the plan's, actions from %s", pl.csv) or "  <- the plan's")
          or "")
    end
  end
  for _, r in ipairs(rows) do
    if r.refused then w("%-22s refused: %s", r.name, r.refused) end
  end
  -- the whole-step proof's counts: the plan's schedule, else the first with a row
  local shown
  for _, r in ipairs(rows) do
    if not r.refused and (r.name == want or not shown) then shown = r end
    if shown and shown.name == want then break end
  end
  local c = shown.step
  local R = p.dims.dp_replicate or 1
  w("whole-step proof (gen/parallel/pp_step_proof.lua), one queue per rank on pp %d x %sdp_shard %d%s = %d ranks (TP "
    .. "ranks alike): %s's %d events, %d FSDP collectives on %d groups and %d sends matched to their receives"
    .. "%s cannot deadlock; every schedule with a row passed it", pp,
    R > 1 and string.format("dp_replicate %d x ", R) or "", p.dims.dp_shard,
    p.dims.cp > 1 and string.format(" x cp %d (FSDP's shard group)", p.dims.cp) or "", c.ranks, shown.name,
    c.events, c.collectives, c.groups, c.p2p, c.batches > 0 and string.format(" (%d coalesced batches)", c.batches)
    or "")
  w("")
  w("Step: the slowest rank's timed run of its actions as torch lowers them (gen/parallel/pp_audit.lua); bubble: "
    .. "1 - busy / (pp x step), the last gradient reduction's wait included; activations in flight: the most saved "
    .. "activation bytes (gen/compute.lua) a rank holds at once over its stages, forwards whose backward (B, or W "
    .. "after zero bubble's I) has not run, and the microbatches its stages hold at their peaks; p2p: the "
    .. "activations and gradients rank 0 sends (a TP rank's sequence shard under sequence parallel, a cp rank's "
    .. "seq_len / cp); memory: the "
    .. "rank's stages' sharded parameters, gradients and optimizer state, "
    .. (always and "their unsharded gradients held all step (reduced at the end), their unsharded parameters as "
      .. "each action holds them beside the activations at its peak (\"always\": gathered per microbatch, kept "
      .. "from a backward to the next forward)" or "their unsharded parameters and "
      .. "gradients held all step (no reshard after forward under PP; gradients reduced at the end), the "
      .. "activations in flight") .. " and one layer's transient, against the GPU's memory. Every schedule with a row "
    .. "passed the send/receive proof (docs/pipeline.md); the refused ones say why.")
  w("%s `make PLAN=...` builds the plan's schedule into tables (every schedule here).", always and "Under \"always\" "
    .. "each forward or backward that finds its stage sharded waits for its first unit's all-gather and for the rest "
    .. "beyond its compute (gen/parallel/pp_audit.lua's regather). Not modelled here: link contention." or
    "Not modelled here: FSDP's all-gathers (taken as prefetched) and link contention.")
  return table.concat(L, "\n") .. "\n", rows
end

return report
