-- Renders the plan for tools (plan.json, trace.json) and reviewers
-- (SCHEDULE.md: a one-screen summary with every warning first, then the
-- details with runs of identical units and ops folded).
local util = require("gen.util")
local json = require("gen.json")
local plan_mod = require("gen.plan")
local memplan = require("gen.memplan")
local groups_mod = require("gen.groups")
local figures = require("gen.figures")
local trace = require("gen.trace")
local fold = require("gen.fold")
local opkinds = require("gen.opkinds")
local rep_mod = require("gen.repeat")
local hardware_mod = require("gen.hardware")
local nccl_model_mod = require("gen.nccl_model")
local pipeline_audit = require("gen.pipeline_audit")
local timeline_mod = require("gen.timeline")
local compute = require("gen.compute")

local audit = {}

local O = json.object

-- k1, v1, k2, v2, ... -> a list of the pairs whose value is not nil, without holes (the
-- pairs a unit leaves at FSDP2's default drop out; later pairs are appended at #t + 1)
local function kv_list(...)
  local t, a = {}, table.pack(...)
  for i = 1, a.n, 2 do
    if a[i + 1] ~= nil then t[#t + 1], t[#t + 2] = a[i], a[i + 1] end
  end
  return t
end
local ES = util.DTYPE_BYTES

audit.SCHEMA_VERSION = 2

local r3 = figures.round

-- The audit's derived numbers: gen/figures.lua's (compute, whole-rank
-- memory, timeline, the step's figures) and the warnings, computed once
-- per plan.
function audit.analysis(p)
  if not p._audit then
    local a = figures.of(p)
    a.warnings = a.pipeline and pipeline_audit.warnings(p, a, audit) or audit.warnings(p, a)
    p._audit = a
  end
  return p._audit
end

-- Families that carry collectives, or would (tp), with their link facts.
local function family_facts(p, f)
  local g = p.topology.gpus_per_node
  return groups_mod.intra_node(f, g), groups_mod.nodes_spanned(f, g)
end

local function example_ranks(f)
  local n = math.min(f.size, 4)
  local first, last = {}, {}
  for k = 0, n - 1 do
    first[#first + 1] = groups_mod.rank(f, 0, k)
    last[#last + 1] = groups_mod.rank(f, f.count - 1, k)
  end
  return O({ "first_group", first, "last_group", last })
end

-- TP classes beyond class 0 (TP ranks whose TP-local shapes, and so FSDP
-- slots, differ from TP rank 0's): their layouts; with TP always (empty
-- when every TP rank holds class 0's), nil without. Outside the
-- fingerprint's facts (class_facts below hashes every number of them).
local function tp_classes_facts(p)
  local tp_classes
  if p.dims.tp > 1 then
    tp_classes = {}
    for c = 2, #p.tp_classes do
      local cls = p.tp_classes[c]
      local cu = {}
      for _, u in ipairs(cls.layout.units) do
        local params = {}
        for _, q in ipairs(u.params) do
          params[#params + 1] = O({ "name", q.name, "shape", q.shape, "numel", q.numel, "chunk", q.chunk,
            "padded_numel", q.padded, "offset", q.offset, "outer", q.outer, "run", q.run,
            "grad_offset", q.grad_offset })
          if u.ag_bytes then
            local o = params[#params]
            for _, v in ipairs({ "ag_dtype", q.ag_dtype, "ag_offset", q.ag_offset }) do o[#o + 1] = v end
          end
          if u.nfrozen then -- (frozen parameters: the reduce-scatter row's layout in this class)
            local o = params[#params]
            for _, v in ipairs({ "rs_offset", q.rs_offset }) do o[#o + 1] = v end
            if q.frozen then o[#o + 1], o[#o + 2] = "frozen", true end
          end
        end
        cu[#cu + 1] = O({ "name", u.name, "slot_numel", u.total, "grads_numel", u.grads_numel, "vec_ok", u.vec_ok,
          "params", params })
      end
      tp_classes[#tp_classes + 1] = O({ "class", c - 1, "tp_ranks", cls.coords,
        "arena_bytes", cls.memory.arena_bytes, "units", cu })
    end
  end
  return tp_classes
end

-- false where a setting is false, else nil (plan.json leaves out a
-- default-true setting: set_reshard_after_backward(False)'s)
function audit.false_or_nil(v)
  if v == false then return false end
  return nil
end

-- Layout indices as unit names (nil: none).
function audit.unit_names(p, list)
  if not list then return nil end
  local out = {}
  for i, k in ipairs(list) do out[i] = p.layout.units[k + 1].name end
  return out
end

-- An op's keys in plan.json after the first ones (ops_json), each with
-- the text before its value.
local OP_KEYS = {}
for _, k in ipairs({ "times", "stream", "group", "dtype", "count", "input", "reduce_op", "params", "size_bytes",
                     "wire_bytes", "predicted_us", "algorithm", "waits_for", "a2a", "recompute" }) do
  OP_KEYS[k] = ",\n   " .. json.quote(k) .. ": "
end

-- plan.json's ops: an object per op (seq, kind, unit, phase, micro_step,
-- times, stream, group, dtype, count, input, reduce_op, params (a partial
-- reduction's or compute's parameters: ChunkedLossWrapper's [norm,
-- lm_head] unit), size_bytes, wire_bytes, predicted_us, algorithm,
-- recompute, waits_for; absent keys left out), written as
-- json.encode(facts, " ") would write them at the top level of facts, a
-- format per op rather than an object each (a step holds units x
-- micro-steps of them, and plan.json is most of the generation's work).
local function ops_json(p)
  if #p.ops == 0 then return json.raw("[]") end
  local units, waits, K, num = p.layout.units, p.arena.waits, OP_KEYS, json.number
  local q = setmetatable({}, { __index = function(t, s) local v = json.quote(s); t[s] = v; return v end })
  -- every op of a size predicts the same time: each written once
  local us = setmetatable({}, { __index = function(t, x) local v = num(r3(x)); t[x] = v; return v end })
  local out, n = {}, 0
  for i, o in ipairs(p.ops) do
    n = n + 1
    out[n] = string.format('%s{\n   "seq": %d,\n   "kind": %s,\n   "unit": %s,\n   "phase": %s,\n   "micro_step": %d',
      i == 1 and "\n  " or ",\n  ", o.seq, q[o.kind], q[units[o.unit + 1].name], q[o.phase], o.micro_step)
    if o.times then out[n + 1], out[n + 2], n = K.times, num(o.times), n + 2 end
    out[n + 1], out[n + 2], n = K.stream, q[o.stream], n + 2
    if o.group then out[n + 1], out[n + 2], n = K.group, q[o.group], n + 2 end
    if o.dtype then out[n + 1], out[n + 2], n = K.dtype, q[o.dtype], n + 2 end
    if o.count then out[n + 1], out[n + 2], n = K.count, num(o.count), n + 2 end
    if o.from_sharded then out[n + 1], out[n + 2], n = K.input, '"sharded"', n + 2 end
    -- reshard_after_forward = k: the all-gather over the post-forward group (reading the kept slice) and its copy-out
    if o.post_forward then out[n + 1], out[n + 2], n = K.input, '"post_forward"', n + 2 end
    if o.reduce_op then out[n + 1], out[n + 2], n = K.reduce_op, q[o.reduce_op], n + 2 end
    if o.part_first then
      local names, ps = {}, units[o.unit + 1].params
      for j = o.part_first + 1, o.part_first + o.part_count do names[#names + 1] = q[ps[j].name] end
      out[n + 1], out[n + 2], n = K.params, "[" .. table.concat(names, ", ") .. "]", n + 2
    end
    if o.size_bytes then out[n + 1], out[n + 2], n = K.size_bytes, num(o.size_bytes), n + 2 end
    if o.wire_bytes then out[n + 1], out[n + 2], n = K.wire_bytes, num(o.wire_bytes), n + 2 end
    if o.predicted_us then out[n + 1], out[n + 2], n = K.predicted_us, us[o.predicted_us], n + 2 end
    if o.algorithm then out[n + 1], out[n + 2], n = K.algorithm, q[o.algorithm], n + 2 end
    if o.a2a_experts then
      -- expert parallel's all-to-alls: which exchange, its counts op, the rows
      local combine = o.a2a_combine == 1 or o.a2a_combine == true
      -- (activation checkpointing's recompute in backward: the forward's
      -- exchanges again, "recompute": true; its counts op names the forward's)
      out[n + 1], out[n + 2], n = K.a2a, string.format('{"exchange": %s, "counts_op": %s, "experts_per_member": %d, '
        .. '"capacity_rows": %d, "row_numel": %d%s}', o.kind == "a2a_counts" and '"counts"'
        or ((o.phase == "forward" or o.recompute) and (combine and '"combine"' or '"dispatch"')
          or (combine and '"dispatch_grad"' or '"combine_grad"')),
        (o.kind == "a2a" or o.recompute) and tostring(o.a2a_counts_op) or "null", o.a2a_experts, o.a2a_capacity or 0,
        o.a2a_dim or 0, o.recompute and ', "recompute": true' or ""), n + 2
    end
    -- (context parallel's K/V all-gathers re-run in backward under checkpointing)
    if o.recompute and not o.a2a_experts then out[n + 1], out[n + 2], n = K.recompute, "true", n + 2 end
    local w = waits[o.seq]
    if w then out[n + 1], out[n + 2], n = K.waits_for, "[" .. table.concat(w, ",") .. "]", n + 2 end -- (op seqs)
    n = n + 1
    out[n] = "\n  }"
  end
  return json.raw("[" .. table.concat(out, "", 1, n) .. "\n ]")
end

-- The plan's facts as the fingerprint covers them: not where the plan file
-- lies (moving a plan must not change what ranks compare), not the TP
-- classes' layouts (tp_classes_facts; class_facts hashes them).
local function facts(p, face)
  face = face or p
  local d = p.dims
  local fam_list = {}
  for _, f in ipairs(p.groups.list) do
    local intra, nodes = family_facts(p, f)
    local row = { "name", f.name, "id", f.id, "axes", f.axis_names, "size", f.size,
      "count", f.count, "members", O({ "sizes", f.member_sizes, "strides", f.member_strides }),
      "colors", O({ "sizes", f.color_sizes, "strides", f.color_strides }),
      "intra_node", intra, "nodes_per_group", nodes, "example_ranks", example_ranks(f) }
    -- a part family (FSDP2's post-forward groups, gen/groups.lua add_part): inner consecutive members of
    -- each of its parent's groups (members and colors above are the parent's)
    if f.inner then table.move({ "part_of", f.parent.name, "inner", f.inner }, 1, 4, #row + 1, row) end
    fam_list[#fam_list + 1] = O(row)
  end
  local units = {}
  for _, u in ipairs(p.layout.units) do
    local params = {}
    for _, q in ipairs(u.params) do
      -- (a unit of mixed all-gather dtypes: this parameter's, its byte offset in the slot and in the
      -- unsharded buffer; "tp_dim" and the rest last, as nil drops them)
      local mixed = u.ag_bytes and { "ag_dtype", q.ag_dtype, "ag_offset", q.ag_offset,
        "unsharded_offset", q.unsharded_offset } or {}
      local kv = { "name", q.name, "shape", q.shape, "dtype", q.dtype, "numel", q.numel,
        "shard_dim", q.shard_dim, "chunk", q.chunk, "padded_numel", q.padded, "offset", q.offset,
        "outer", q.outer, "run", q.run, "grad_offset", q.grad_offset, table.unpack(mixed) }
      -- (a frozen parameter, requires_grad=False: gathered, never reduced; rs_offset in the
      -- reduce-scatter row of a unit with frozen parameters)
      for _, f in ipairs({ { "tp_dim", q.tp_dim }, { "tp_chunk", q.tp_chunk }, { "full_shape", q.tp_dim and q.full_shape },
                           { "frozen", q.frozen }, { "rs_offset", u.nfrozen and q.rs_offset } }) do
        if f[2] ~= nil then kv[#kv + 1], kv[#kv + 2] = f[1], f[2] end
      end
      params[#params + 1] = O(kv)
    end
    local arena = {}
    for _, kind in ipairs(memplan.KINDS) do
      local b = p.arena.by_unit[u.index][kind]
      local lives = {}
      -- all_reduce_last under HSDP only; pipeline messages under PP only; CPU offload's device copies
      -- (and reshard_after_forward = k's kept slice)
      if (kind == "partial" or kind == "pp" or kind == "h2d" or kind == "d2h" or kind == "post_forward")
        and b.bytes == 0 then goto next_kind end
      for _, iv in ipairs(b.lives) do lives[#lives + 1] = { iv.first, iv.last } end
      arena[#arena + 1] = kind
      -- (fsdp.symm_mem: a buffer in the symmetric window, gen/memplan.lua SYMM_KINDS)
      arena[#arena + 1] = O(kv_list("offset", b.offset, "bytes", b.bytes, "live_ops", lives, "symmetric", b.symm))
      ::next_kind::
    end
    local uj = kv_list("name", u.name, "index", u.index, "root", u.is_root,
      "reshard_after_forward", u.reshard_after_forward and true or false, "reshard_after_backward", audit.false_or_nil(u.reshard_after_backward),
      "unshard_in_backward", audit.false_or_nil(u.unshard_in_backward),
      -- fully_shard(reshard_after_forward=k): k and its post-forward group family, where 1 < k < S
      "post_forward", u.post_forward and u.post_forward.k, "post_forward_group", u.post_forward and u.post_forward.group,
      "forward_prefetch", audit.unit_names(p, u.fwd_prefetch), "backward_prefetch", audit.unit_names(p, u.bwd_prefetch),
      "orig_dtype", u.orig_dtype, "ag_dtype", u.ag_dtype,
      "reduce_dtype", u.reduce_dtype, "grad_dtype", u.grad_dtype, "slot_numel", u.total, "grads_numel", u.grads_numel,
      "vec_ok", u.vec_ok, "rs_op", u.rs_op, "ar_op", u.ar_op,
      "pre_divide", u.pre_divide, "post_divide", u.post_divide)
    -- FSDPModule's reduction setters where the plan sets them (FSDP2's defaults leave them out)
    if u.premul then uj[#uj + 1], uj[#uj + 2] = "premul_factor", u.premul end
    if u.gradient_divide_factor then uj[#uj + 1], uj[#uj + 2] = "gradient_divide_factor", u.gradient_divide_factor end
    if u.force_sum_reduction_for_comms then uj[#uj + 1], uj[#uj + 2] = "force_sum_reduction_for_comms", true end
    if u.grad_accumulation then uj[#uj + 1], uj[#uj + 2] = "grad_accumulation", u.grad_accumulation end
    -- frozen parameters: the reduce-scatter row's elements (the trainable ones' shards)
    if u.nfrozen then uj[#uj + 1], uj[#uj + 2] = "rs_numel", u.rs_total end
    -- the frozen prefix (gen/parallel/fsdp_layout.lua frozen_prefix): no pre-backward; post-backward
    -- from the root's final callback
    if u.no_pre_backward then uj[#uj + 1], uj[#uj + 2] = "no_pre_backward", true end
    if u.final_callback then uj[#uj + 1], uj[#uj + 2] = "final_callback", true end
    -- a model whose forward calls the unit more than once per micro-step (DeepSeek-V3's multi-token
    -- prediction, gen/models/deepseek_v3.lua calls): its forward calls (the layout's call order's pre-forwards)
    if p.layout.calls then
      local n = 0
      for _, e in ipairs(p.layout.calls.forward) do
        if e.ev == "pre" and e.unit == u.index then n = n + 1 end
      end
      if n > 1 then uj[#uj + 1], uj[#uj + 2] = "forward_calls", n end
    end
    if u.ignored then -- fully_shard's ignored_params: whole on every rank, never communicated
      local ig = {}
      for _, q in ipairs(u.ignored) do
        ig[#ig + 1] = O({ "name", q.name, "shape", q.shape, "dtype", q.dtype, "numel", q.numel })
      end
      uj[#uj + 1], uj[#uj + 2] = "ignored_params", ig
    end
    -- FSDP2's uint8 all-gather of a unit of mixed all-gather dtypes: its slot's bytes
    if u.ag_bytes then uj[#uj + 1], uj[#uj + 2] = "ag_bytes", u.ag_bytes end
    uj[#uj + 1], uj[#uj + 2], uj[#uj + 3], uj[#uj + 4] = "arena", O(arena), "params", params
    -- CPU offload (CPUOffloadPolicy): only on offloading units
    if u.offload then
      uj[#uj + 1], uj[#uj + 2] = "cpu_offload", true
      if u.pin_memory then uj[#uj + 1], uj[#uj + 2] = "pin_memory", true end
    end
    units[#units + 1] = O(uj)
  end
  local per_family = {}
  for _, f in ipairs(p.groups.list) do
    local a = face.predicted.per_family[f.name]
    if a then
      local sh = face.predicted.shape[f.name]
      per_family[#per_family + 1] = O({ "group", f.name, "ops", a.ops, "size_bytes", a.size_bytes,
        "wire_bytes", a.wire_bytes, "intra_node", face.predicted.intra[f.name], "nodes", sh.nodes,
        "gpus_per_node", sh.gpus_per_node, "predicted_us", r3(a.us) })
    end
  end
  return O({
    "schema", audit.SCHEMA_VERSION, "plan", p.name,
    "world_size", p.world_size,
    -- a generic model's input carrying no gradient (model.input_requires_grad = false: the frozen
    -- prefix, gen/parallel/fsdp_layout.lua); left out where it does (the default)
    "input_requires_grad", audit.false_or_nil(p.model.input_requires_grad),
    "parallel", O({ "dp_replicate", d.dp_replicate, "dp_shard", d.dp_shard, "cp", d.cp, "tp", d.tp,
                    "pp", d.pp, "ep", d.ep, "async_tp", p.async_tp }),
    "mesh", O({ "names", p.mesh.names, "sizes", p.mesh.sizes, "strides", p.mesh.strides }),
    "fsdp", O({ "reshard_after_forward", require("gen.parallel.fsdp_layout").raf_bool(p.fsdp.reshard_after_forward),
                "reshard_after_backward", audit.false_or_nil(p.fsdp.reshard_after_backward),
                "micro_steps", p.fsdp.micro_steps,
                "reduce_op", p.fsdp.reduce_op, "param_dtype", p.fsdp.param_dtype, "reduce_dtype", p.fsdp.reduce_dtype,
                "grad_accumulation", p.fsdp.grad_accumulation,
                "gradient_divide_factor", p.fsdp.gradient_divide_factor,
                "force_sum_reduction_for_comms", p.fsdp.force_sum_reduction_for_comms or nil,
                "symm_mem", p.fsdp.symm_mem or nil,
                -- torchtitan's fsdp_reshard_after_forward where given other than "default"
                "reshard_after_forward_policy", p.fsdp.reshard_after_forward_policy ~= "default"
                  and p.fsdp.reshard_after_forward_policy or nil }),
    "topology", audit.topology_json(p.topology),
    "groups", fam_list, "units", units,
    -- a repeated micro-step (gen/repeat.lua): ops[first_seq .. first_seq + ops - 1] run times times, for
    -- micro-steps micro_first .. micro_last; executed_ops counts every op the executor issues
    "repeat", p.rep and O({ "first_seq", p.rep.first, "ops", p.rep.n, "times", p.rep.times,
                            "micro_first", p.rep.micro_first, "micro_last", p.rep.micro_last }),
    "executed_ops", p.rep and rep_mod.executed_count(p.ops, p.rep), "ops", ops_json(p),
    "expert_parallel", audit.ep_json(p),
    "per_rank_per_step", O({ "by_group", per_family,
      "predicted_comm_us", r3(face.predicted.total_us) }),
    "memory", O({ "persistent_bytes", face.memory.persistent_bytes,
                  "peak_transient_bytes", face.memory.peak_transient_bytes,
                  "peak_bytes", face.memory.peak_bytes, "peak_at_op", face.memory.peak_at_op,
                  "arena_bytes", face.memory.arena_bytes, "unplanned_bytes", face.memory.unplanned_bytes,
                  "allocated_bytes", face.memory.allocated_bytes,
                  -- fsdp.symm_mem: the window at the arena's start, per rank (gen/symm.lua)
                  "symm_window_bytes", face.arena and face.arena.symm and face.arena.symm.window_bytes or nil }),
  })
end

-- The memory plan's trade (gen/figures.lua's memory_plan).
local function memory_plan_facts(mp)
  local waits = {}
  for _, x in ipairs(mp.waits) do
    waits[#waits + 1] = O({ "op", x.op, "waits_for", x.waits_for, "stream", x.stream, "cost_us", x.cost_us,
                            "times", x.times > 1 and x.times or nil })
  end
  return O({ "policy", mp.policy, "arena_bytes", mp.arena_bytes, "reuse_arena_bytes", mp.reuse_bytes,
             "held_lives", mp.held_lives, "fell_back", mp.fell_back, "compute_wait_us", mp.wait_us,
             "costly_waits", waits, "budget_bytes", mp.budget_bytes and math.floor(mp.budget_bytes + 0.5),
             "hold_arena_bytes", mp.hold_bytes, "free_step_us", mp.free_step_us,
             "reuse_step_us", mp.reuse_step_us, "reuse_waits", mp.reuse_waits,
             "reuse_compute_wait_us", mp.reuse_wait_us })
end

-- The audit section of plan.json (outside the fingerprint: it depends on
-- audit-only inputs such as training settings and the GPU's rate).
local function audit_facts(p)
  local a = audit.analysis(p)
  local s, m, tl = a.settings, a.memory, a.timeline
  local recompute = {}
  for _, f in ipairs(p.groups.list) do
    local r = a.recompute[f.name]
    if r then
      recompute[#recompute + 1] = O({ "group", f.name, "ops", r.ops, "size_bytes", r.size_bytes,
        "wire_bytes", r.wire_bytes, "predicted_us", r3(r.us) })
    end
  end
  local path = {}
  -- (a pipeline's step is its ranks' timed run: no stream-level critical path)
  for _, seg in ipairs(tl and audit.critical_segments(p, tl) or {}) do
    path[#path + 1] = O({ "stream", seg.stream, "first_op", seg.first, "last_op", seg.last, "ops", seg.n,
                          "us", r3(seg.us) })
  end
  local by_group = {}
  for _, row in ipairs(a.families) do
    by_group[#by_group + 1] = O({ "group", row.name, "intra_node", row.intra, "ops", row.ops,
      "recomputed_ops", row.recomputed_ops, "size_bytes", row.size_bytes, "wire_bytes", row.wire_bytes,
      "alone_us", row.alone_us, "predicted_us", row.us, "exposed_us", row.exposed_us })
  end
  local function link(c)
    return O({ "ops", c.ops, "size_bytes", c.size_bytes, "wire_bytes", c.wire_bytes, "alone_us", c.alone_us,
               "predicted_us", c.us })
  end
  return O({
    "settings", O({ "local_batch_size", a.pipeline and s.local_batch_size * a.pipeline.facts.sched.microbatches
                      or s.local_batch_size, "seq_len", s.seq_len,
      "activation_checkpointing", s.activation_checkpointing, "optimizer", s.optimizer,
      "fp32_master", s.fp32_master, "gpu_memory_GB", s.gpu_memory_GB, "gpu_memory_MiB", s.gpu_memory_MiB,
      "gpu_TFLOPS", s.gpu_TFLOPS, "hbm_GBps", s.hbm_GBps, "loss_chunks", s.loss_chunks, "compile", s.compile,
      "float8", s.float8, "mfu", s.mfu }),
    "compute", O({ "tokens_per_micro_step", s.tokens, "flops_per_step", a.step_flops,
      "compute_us", a.compute_us }),
    "throughput", O({ "tokens_per_s_per_gpu", a.throughput.tokens_per_s_per_gpu,
      "model_flops_per_token", a.throughput.model_flops_per_token, "mfu", a.throughput.mfu }),
    "memory", O({ "params_bytes", m.params_bytes, "grads_bytes", m.grads_bytes, "optimizer_bytes", m.optimizer_bytes,
      "comm_bytes", m.comm_bytes, "activation_bytes", math.floor(m.activation_bytes + 0.5),
      "activations_modeled", m.activations_modeled, "total_bytes", math.floor(m.total_bytes + 0.5),
      "gpu_bytes", math.floor(m.gpu_bytes + 0.5), "fits", m.fits,
      -- CPU offload: the host's share (gen/memory.lua), only where a unit offloads
      "host_bytes", (m.host_bytes or 0) > 0 and m.host_bytes or nil,
      "host_pinned_bytes", (m.host_bytes or 0) > 0 and m.host_pinned_bytes or nil }),
    "memory_plan", memory_plan_facts(a.memory_plan),
    "by_group", by_group,
    "by_link", O({ "intra_node", link(a.links.intra), "inter_node", link(a.links.inter) }),
    "recompute_by_group", recompute,
    "timeline", O({ "step_us", a.step_us, "compute_us", a.compute_us, "exposed_comm_us", a.exposed_us,
      "waits_other_us", a.waits_us, "comm_us", a.comm_us, "comm_alone_us", a.alone_us, "critical_path", path }),
    "warnings", a.warnings,
  })
end

-- The fingerprint hashes every fact the tables hold; it is what ranks
-- compare before their first collective.
-- The tables of TP classes beyond the first (plan.c holds every class;
-- plan.json describes class 0): every number a rank of another class runs.
local function class_facts(p)
  local out = {}
  for c = 2, #(p.tp_classes or {}) do
    local cls = p.tp_classes[c]
    local t = { "class", c - 1, "tp_ranks", cls.coords }
    for _, u in ipairs(cls.layout.units) do
      local q = {}
      for _, x in ipairs(u.params) do
        q[#q + 1] = { x.shape, x.chunk, x.run, x.padded, x.offset, x.grad_offset, x.numel }
      end
      t[#t + 1] = u.name
      t[#t + 1] = { u.total, u.grads_numel, u.act_numel or 0, q }
    end
    local ops = {}
    for _, o in ipairs(cls.ops) do
      -- (a part's ops: its parameters, as plan.json's class-0 ops name them)
      ops[#ops + 1] = o.part_first and { o.kind, o.count or 0, o.stream, cls.arena.waits[o.seq] or {}, o.part_first,
                                         o.part_count }
        or { o.kind, o.count or 0, o.stream, cls.arena.waits[o.seq] or {} }
    end
    t[#t + 1] = "ops"
    t[#t + 1] = ops
    t[#t + 1] = "arena"
    local offs = {}
    for _, b in ipairs(cls.arena.buffers) do
      -- a plan without pipeline messages (or CPU offload's device copies) hashes as it did before they existed
      -- (or reshard_after_forward = k's kept slice)
      if (b.kind ~= "pp" and b.kind ~= "h2d" and b.kind ~= "d2h" and b.kind ~= "post_forward") or b.bytes > 0 then
        offs[#offs + 1] = b.offset
      end
    end
    t[#t + 1] = { cls.arena.arena_bytes, offs }
    out[#out + 1] = O(t)
  end
  return out
end

-- The fingerprint hashes the facts as plan.json writes them, without
-- where the plan file lies (source) or the TP classes' layouts
-- (class_facts hashes every number of them). plan.json is that text with
-- those, its header and the audit spliced in (the facts encoded once:
-- p._facts_text, kept from the fingerprint for audit.json).
local function facts_text(p)
  return json.encode(facts(p), " ")
end

function audit.fingerprint(p)
  -- a pipeline's tables: every pipeline rank's, hashed as they always were
  if p.pipeline then return plan_mod.hash64(pipeline_audit.fingerprint_text(p)) end
  local text = facts_text(p)
  p._facts_text = text
  local extra = class_facts(p)
  return plan_mod.hash64(#extra > 0 and text .. json.encode(extra) or text)
end

-- One top-level pair as plan.json writes it: "\n \"key\": value".
local function pair_text(k, v)
  local s = json.encode(O({ k, v }), " ")
  return s:sub(2, -3)
end

-- Where text holds the first of keys that it holds as a top-level key.
local function key_at(text, keys)
  for _, k in ipairs(keys) do
    local at = text:find("\n " .. json.quote(k) .. ": ", 1, true)
    if at then return at end
  end
  error("internal: plan.json lacks every one of " .. table.concat(keys, ", "), 0)
end

function audit.json(p, fp)
  -- A pipeline plan: its top-level sections describe pipeline rank 0's
  -- tables (as a dense plan's describe class 0's), its `pipeline` section
  -- every rank's.
  local a = audit.analysis(p)
  local text = a.pipeline and json.encode(facts(p, { predicted = a.predicted, memory = a.face_memory }), " ")
    or p._facts_text or facts_text(p)
  p._facts_text = nil
  -- The header, the source and the TP classes spliced in and the audit
  -- appended in one concatenation: the facts are megabytes, and every
  -- splice of its own would copy them.
  local cuts = {
    { at = 2, text = pair_text("_comment", "generated by commplan from " .. p.source_file .. "; do not edit") .. "," },
    { at = key_at(text, { "plan" }), text = pair_text("fingerprint", fp) .. "," },
    { at = key_at(text, { "world_size" }), text = pair_text("source", p.source_file) .. "," },
  }
  local tp_classes = not a.pipeline and tp_classes_facts(p)
  if tp_classes then
    cuts[#cuts + 1] = { at = key_at(text, { "repeat", "ops" }), text = pair_text("tp_classes", tp_classes) .. "," }
  end
  for i, c in ipairs(cuts) do c.i = i end
  table.sort(cuts, function(x, y) return x.at < y.at or (x.at == y.at and x.i < y.i) end)
  local pieces, from = {}, 1
  for _, c in ipairs(cuts) do
    pieces[#pieces + 1] = text:sub(from, c.at - 1)
    pieces[#pieces + 1] = c.text
    from = c.at
  end
  pieces[#pieces + 1] = text:sub(from, -3) -- (without the closing "\n}")
  if a.pipeline then pieces[#pieces + 1] = "," .. pair_text("pipeline", pipeline_audit.json_section(p, a)) end
  pieces[#pieces + 1] = "," .. pair_text("audit", audit_facts(p)) .. "\n}\n"
  return table.concat(pieces)
end

-- (a pipeline plan's: its ranks' timed run, gen/pipeline_timeline.lua)
function audit.trace_json(p, fp)
  local a = audit.analysis(p)
  if a.pipeline then return require("gen.pipeline_timeline").trace_json(p, a, fp) end
  return trace.render(p, a, fp)
end

-- timeline.svg: the predicted step drawn (gen/svg.lua).
function audit.timeline_svg(p, fp)
  local a = audit.analysis(p)
  if a.pipeline then return require("gen.pipeline_timeline").svg(p, a, fp) end
  return require("gen.svg").render(p, a, fp)
end

-- Every file audit renders, by name (gen/commplan.lua writes them beside
-- the C tables).
function audit.files(p, fp)
  return { ["plan.json"] = audit.json(p, fp), ["SCHEDULE.md"] = audit.schedule_md(p, fp),
           ["trace.json"] = audit.trace_json(p, fp), ["timeline.svg"] = audit.timeline_svg(p, fp) }
end

-- ---- text helpers ----

local function human(bytes)
  local units = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" }
  local v, i = bytes, 1
  while v >= 1024 and i < #units do v = v / 1024; i = i + 1 end
  return i == 1 and string.format("%d B", math.floor(bytes + 0.5)) or string.format("%.2f %s", v, units[i])
end
audit.human = human

-- CPU offload (CPUOffloadPolicy): the host memory the offloading units'
-- sharded state takes (not on the GPU: the rows above leave it out) and
-- the step's copies over the host link at topology.host_GBps.
function audit.md_host(p, s, m, w)
  if not m.host_bytes or m.host_bytes == 0 then return end
  local n = 0
  for _, u in ipairs(p.layout.units) do if u.offload then n = n + 1 end end
  local bytes = { h2d = 0, d2h = 0 }
  for _, o in ipairs(p.ops) do
    local d = opkinds.BY_NAME[o.kind]
    if d.host then
      local u = p.layout.units[o.unit + 1]
      local k = o.kind == "h2d" and "h2d" or "d2h"
      -- (a D2H copies the sharded gradients: the trainable shards, u.rs_total, or its part's, as
      -- gen/compute.lua and gen/memplan.lua size it; an H2D the whole shard)
      local elems = u.total
      if k == "d2h" then
        elems = u.rs_total
        if o.part_first then
          elems = 0
          for j = o.part_first + 1, o.part_first + o.part_count do
            local q = u.params[j]
            if not q.frozen then elems = elems + q.padded end
          end
        end
      end
      bytes[k] = bytes[k] + (o.times or 1) * elems * ES[u.orig_dtype]
    end
  end
  local us = (bytes.h2d + bytes.d2h) / (s.host_GBps * 1e3)
  w("| host memory (CPU offload, %d unit%s: their sharded parameters, gradients and optimizer state, not on the "
    .. "GPU; %s of it pinned) | %s |", n, n == 1 and "" or "s", human(m.host_pinned_bytes),
    human(m.host_bytes))
  w("| host link per step: H2D %s before all-gathers, D2H %s after reductions, %.1f us at %s GB/s (topology.host_GBps) "
    .. "| - |", human(bytes.h2d), human(bytes.d2h), us, tostring(s.host_GBps))
end

-- Zero copy-in (gen/opkinds.lua): the all-gathers that read the sharded
-- storage itself, of all the step's all-gathers, and the copy bytes (read
-- and written) their copy-ins would have moved.
function audit.zero_copy_in(p)
  local out = { ops = 0, all_gathers = 0, bytes = 0 }
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" then
      local times = o.times or 1
      out.all_gathers = out.all_gathers + times
      if o.from_sharded then
        local u = p.layout.units[o.unit + 1]
        out.ops = out.ops + times
        out.bytes = out.bytes + 2 * u.total * util.DTYPE_BYTES[u.orig_dtype] * times
      end
    end
  end
  return out
end

local function us_text(us)
  if us < 1000 then return string.format("%.1f us", us) end
  if us < 1e6 then return string.format("%.2f ms", us / 1e3) end
  return string.format("%.2f s", us / 1e6)
end
audit.us_text = us_text

local function commas(n)
  local s = tostring(math.floor(n))
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

-- Expert parallelism's all-to-alls (gen/parallel/ep.lua), per rank: the
-- capacity policy, each MoE layer's bytes sent per micro-step at uniform
-- routing (every routed row spread evenly over the ep members) and at the
-- capacity bound (every member's share full), and the dispatch buffers'
-- memory. nil without ep.
function audit.ep_summary(p)
  local e = p.layout.ep
  if not e then return nil end
  local layers, buffer_bytes, per_layer_buffers = 0, 0, nil
  local es, recompute = 0, false
  for _, u in ipairs(p.layout.units) do
    if u.a2a then
      layers = layers + 1
      recompute = recompute or u.a2a.recompute == true
      es = ES[u.ag_dtype]
      local b = 2 * u.a2a_numel * es + 2 * u.a2a_slots * u.a2a_experts * 8
      per_layer_buffers = per_layer_buffers or b
      buffer_bytes = buffer_bytes + b
    end
  end
  local others = e.size - 1
  -- one token exchange: the rows this rank sends the other members
  local uniform = math.floor(e.rows * others / e.size + 0.5) * e.dim * es
  local bound = others * e.capacity * e.dim * es
  local counts = others * (e.experts // e.size) * 8
  local M = p.fsdp.micro_steps
  -- per MoE layer and micro-step: 4 token exchanges (dispatch, combine, and their gradients) and a counts one;
  -- under activation checkpointing the backward's recompute adds the forward's three (gen/parallel/ep.lua)
  local x, c = recompute and 6 or 4, recompute and 2 or 1
  return {
    ep = e.size, efsdp = e.efsdp, policy = e.policy.name, factor = e.policy.factor, tokens = e.tokens,
    top_k = e.top_k, dim = e.dim, experts = e.experts, rows = e.rows, capacity = e.capacity, dropless = e.worst,
    moe_layers = layers, recompute = recompute, ac = e.ac, exchanges = x, counts_exchanges = c,
    layer_bytes_uniform = x * uniform + c * counts, layer_bytes_bound = x * bound + c * counts,
    step_bytes_uniform = layers * M * (x * uniform + c * counts),
    step_bytes_bound = layers * M * (x * bound + c * counts),
    buffer_bytes_per_layer = per_layer_buffers, buffer_bytes = buffer_bytes,
  }
end

function audit.ep_json(p)
  local e = audit.ep_summary(p)
  if not e then return nil end
  return O({ "ep", e.ep, "efsdp", e.efsdp, "capacity_policy", e.policy, "capacity_factor", e.factor,
    "tokens_per_micro_step", e.tokens, "top_k", e.top_k, "dim", e.dim, "num_experts", e.experts,
    "routed_rows", e.rows, "capacity_rows", e.capacity, "dropless_rows", e.dropless, "moe_layers", e.moe_layers,
    "recompute", e.recompute, "token_exchanges_per_layer", e.exchanges, "counts_exchanges_per_layer",
    e.counts_exchanges,
    "layer_bytes_uniform", e.layer_bytes_uniform, "layer_bytes_capacity", e.layer_bytes_bound,
    "step_bytes_uniform", e.step_bytes_uniform, "step_bytes_capacity", e.step_bytes_bound,
    "buffer_bytes_per_layer", e.buffer_bytes_per_layer, "buffer_bytes", e.buffer_bytes })
end

audit.commas = commas

local function count_text(n)
  local v = n
  for _, u in ipairs({ { 1e12, "T" }, { 1e9, "B" }, { 1e6, "M" } }) do
    if v >= u[1] then return string.format("%.2f %s", v / u[1], u[2]) end
  end
  return commas(n)
end

local function unit_name(p, index) return p.layout.units[index + 1].name end

-- A unit's folding item: its signature with its name's template, keyed by
-- the number in its name (gen/fold.lua: an MoE layer's two units fold
-- beside each other).
local function unit_item(p, index, sig)
  local tpl, key = fold.numbered(unit_name(p, index), index)
  return { sig = tpl .. "|" .. sig, unit = key, index = index }
end

-- A unit's layout signature: units with equal signatures are folded.
local function layout_sig(u)
  local t = { #u.params, u.total, u.grads_numel, u.orig_dtype, u.ag_dtype, u.reduce_dtype, u.grad_dtype, u.rs_op, u.ar_op,
              tostring(u.vec_ok), tostring(u.reshard_after_forward), u.pre_divide, u.post_divide, tostring(u.premul),
              u.reshard_after_backward == false and "keep" or "", u.sharded_backward and "sharded_bwd" or "" }
  for _, q in ipairs(u.params) do
    t[#t + 1] = table.concat(q.shape, "x") .. "/" .. q.shard_dim .. (u.ag_bytes and "/" .. q.ag_dtype or "")
  end
  return table.concat(t, "|")
end

-- The same, computed once per unit of a layout: SCHEDULE.md's tables and
-- warnings fold the units several times over.
local sig_memo = setmetatable({}, { __mode = "k" }) -- unit -> its signature
local function unit_sig(u)
  local s = sig_memo[u]
  if not s then
    s = layout_sig(u)
    sig_memo[u] = s
  end
  return s
end

local function padding_of(u, W)
  local numel = 0
  for _, q in ipairs(u.params) do numel = numel + q.numel end
  return W * u.total - numel, numel
end

-- Ranks of the shard group that hold no data of a Shard(0) parameter.
local function empty_ranks(q, W)
  if q.shard_dim > 0 or q.run == 0 then return 0 end
  local with_data = (q.numel + q.run - 1) // q.run
  return math.max(0, W - with_data)
end

-- ---- warnings ----

-- Runs of units, each given as a list of unit indices in the order met.
local function unit_runs(p, indices)
  local items = {}
  for i, ix in ipairs(indices) do items[i] = unit_item(p, ix, unit_sig(p.layout.units[ix + 1])) end
  local out = {}
  for _, row in ipairs(fold.rows(items, 4)) do
    local names = {}
    for _, j in ipairs(row.members) do names[#names + 1] = unit_name(p, items[j].index) end
    out[#out + 1] = { first = row.first, n = #row.members, text = fold.unit_range(names) }
  end
  return out
end

local function family_label(f)
  if f.name == "fsdp" then return #f.axis_names > 1 and "fsdp (dp_shard x cp)" or "fsdp (" .. f.axis_names[1] .. ")" end
  return f.name
end

-- Why a compute op waited for a collective: a data dependency when it
-- reads a buffer of the same unit that the collective (or the op it
-- waited on directly) writes, else a reuse of that op's arena bytes.
local function wait_reason(p, waiting, via)
  local wo, vo = p.ops[waiting + 1], p.ops[via + 1]
  if wo.unit == vo.unit then
    local writes = {}
    for _, b in ipairs(opkinds.access(vo).writes or {}) do writes[b] = true end
    for _, b in ipairs(opkinds.access(wo).reads or {}) do
      if writes[b] then return "data" end
    end
  end
  return "reuse"
end

local HELD_TEXT = { ag = "all-gather buffers", unsharded = "unsharded parameters", grads = "unsharded gradients",
                    rs_in = "reduce-scatter inputs", rs_out = "reduce-scatter outputs", act = "activation buffers",
                    partial = "partial sums", pp = "pipeline messages" }

-- The kinds of buffer whose bytes the plan holds for overlap, as words.
local function held_kinds(p)
  local seen, names = {}, {}
  for _, kind in ipairs(memplan.KINDS) do
    for _, u in ipairs(p.layout.units) do
      local b = p.arena.by_unit[u.index][kind]
      if b.held and not seen[kind] then
        seen[kind] = true
        names[#names + 1] = HELD_TEXT[kind]
      end
    end
  end
  local text = #names <= 1 and (names[1] or "buffers")
    or (table.concat(names, ", ", 1, #names - 1) .. " and " .. names[#names])
  return (text:gsub("reduce%-scatter inputs and reduce%-scatter outputs", "reduce-scatter inputs and outputs"))
end

-- fsdp.symm_mem's row: the arena's symmetric window (gen/memplan.lua,
-- gen/symm.lua), what it holds, and its bytes per rank by class.
function audit.md_symm(p, w)
  local sy = p.arena.symm
  if not sy then return end
  local has = {}
  for _, b in ipairs(sy.buffers) do has[b.kind] = (has[b.kind] or 0) + 1 end
  local what = {}
  for _, k in ipairs({ "ag", "rs_in", "rs_out" }) do
    if has[k] then what[#what + 1] = string.format("%d %s", has[k], HELD_TEXT[k]) end
  end
  local per = {}
  if #p.tp_classes > 1 then
    for c, cls in ipairs(p.tp_classes) do
      per[#per + 1] = string.format("class %d %s", c - 1, human(cls.arena.symm and cls.arena.symm.window_bytes or 0))
    end
  end
  w("| of which the symmetric window (fsdp.symm_mem: %s; ncclMemAlloc'd, registered on the %s communicator%s, "
    .. "every buffer at the same offset on each of its ranks%s) | %s |", table.concat(what, ", "),
    table.concat(p.symm.families, " and "), #p.symm.families > 1 and "s" or "",
    #per > 0 and ("; per rank: " .. table.concat(per, ", ")) or "", human(sy.window_bytes))
end

local function room_text(bytes)
  return bytes > 0 and human(bytes) or "none"
end

-- ---- the hardware and the collective model, in words -----------------------
-- The algorithms NCCL's model picks for a family's collectives, most used
-- first (ties by name): "; ring/Simple 163, nvls/Simple 2".
local function algorithms_text(acc)
  local list = {}
  for name, n in pairs(acc and acc.algorithms or {}) do list[#list + 1] = { name, n } end
  if #list == 0 then return "" end
  table.sort(list, function(x, y) return x[2] > y[2] or (x[2] == y[2] and x[1] < y[1]) end)
  local parts = {}
  for i, e in ipairs(list) do parts[i] = e[1] .. " " .. e[2] end
  return "; " .. table.concat(parts, ", ")
end

function audit.preset_name(topo)
  return hardware_mod.network(topo).name
end

-- The GPU's memory as the settings give it: the preset's as the device
-- reports it (nvidia-smi's MiB, gen/hardware.lua), or the plan's decimal GB.
function audit.gpu_memory_text(s)
  if s.gpu_memory_MiB then
    return string.format("%s MiB as the device reports it (%s)", commas(s.gpu_memory_MiB), human(s.gpu_memory_bytes))
  end
  return string.format("%g GB (topology.gpu_memory_GB: %s)", s.gpu_memory_GB, human(s.gpu_memory_bytes))
end

-- One link class of the topology in a few words: "intra" (NVLink inside a
-- node) or "inter" (the network between nodes).
function audit.link_text(topo, class)
  if topo.collectives == "alpha_beta" then
    return string.format("%g GB/s", class == "intra" and topo.intra_node_GBps or topo.inter_node_GBps)
  end
  local net = hardware_mod.network(topo)
  if class == "intra" then
    return string.format("%d x %g GB/s per GPU as NCCL counts it%s", net.nvlinks, net.nvlink_GBps,
      net.nvls and ", NVLS" or "")
  end
  local g = topo.gpus_per_node
  return string.format("%d x %g Gb/s NICs per node%s, PCIe %g GB/s%s", net.nics_per_node, net.nic_Gbps,
    net.nics_per_node >= g and ", one per GPU (rail-optimised)" or string.format(", each shared by %g GPUs",
      g / net.nics_per_node), net.pci_GBps, net.collnet and ", SHARP" or "")
end

-- plan.json's topology: the plan's own fields, the cost model and every
-- constant it used (defaults and preset values included).
function audit.topology_json(topo)
  local kv = { "gpus_per_node", topo.gpus_per_node, "preset", topo.preset, "collectives", topo.collectives }
  if topo.collectives == "alpha_beta" then
    for _, k in ipairs({ "intra_node_GBps", "inter_node_GBps", "latency_us" }) do
      kv[#kv + 1], kv[#kv + 2] = k, topo[k]
    end
  else
    local fields = hardware_mod.network_fields(topo)
    for _, k in ipairs(hardware_mod.NETWORK_ORDER) do kv[#kv + 1], kv[#kv + 2] = k, fields[k] end
    kv[#kv + 1], kv[#kv + 2] = "nccl_model", nccl_model_mod.NCCL_VERSION
  end
  return O(kv)
end

-- SCHEDULE.md's assumption about collective time.
function audit.md_collective_model(topo, w)
  if topo.collectives == "alpha_beta" then
    w("- Collective time (topology.collectives = \"alpha_beta\"): latency %g us x ceil(log2 n) + size x nccl-tests", topo.latency_us)
    w("  busbw factor / link bandwidth; intra-node %g GB/s when a group fits in one node of %d GPUs, else",
      topo.intra_node_GBps, topo.gpus_per_node)
    w("  inter-node %g GB/s.", topo.inter_node_GBps)
  else
    w("- Collective time: NCCL %s's own tuning model (gen/nccl_model.lua, docs/cost-model.md) on each group's",
      nccl_model_mod.NCCL_VERSION)
    w("  shape (nodes x GPUs of the group per node): ring, tree, NVLS, NVLSTree, PAT x LL, LL128, Simple, the")
    w("  cheapest as NCCL picks it (plan.json ops[].algorithm).")
    w("- Hardware (topology.preset = %s, each figure overridable): %s, %d GPUs per node;", util.show(topo.preset),
      audit.preset_name(topo), topo.gpus_per_node)
    w("  NVLink %s;", audit.link_text(topo, "intra"))
    w("  network %s;", audit.link_text(topo, "inter"))
    w("  every NIC at its line rate with all rails busy: a fabric whose nccl-tests all_gather at k GPUs per node")
    w("  reaches less than k x one GPU per node's is priced too fast; set nic_Gbps to what each rail reaches")
    w("  there (docs/cost-model.md, \"the full-width rule\").")
  end
  w("- Links: collectives running at once share a rank's link, its NIC where their groups cross nodes, else its")
  w("  NVLink, equally (each at 1/n of its rate while n run).")
end

function audit.warnings(p, a)
  local w = {}
  local topo = p.topology
  local g = topo.gpus_per_node
  local tl = a.timeline
  -- A world inside one node that leaves part of it idle (the loader
  -- refuses a multi-node world that is not whole nodes).
  if p.world_size < g then
    w[#w + 1] = string.format("the world of %d ranks uses %d of one node's %d GPUs (topology.gpus_per_node): "
      .. "every group is priced on NVLink (%s); set gpus_per_node if the job spans nodes",
      p.world_size, p.world_size, g, audit.link_text(topo, "intra"))
  end
  -- Groups that carry collectives (or TP) crossing nodes, in one line.
  local crossing = {}
  for _, f in ipairs(p.groups.list) do
    local a_f = p.predicted.per_family[f.name]
    if (a_f or f.name == "tp") and not groups_mod.intra_node(f, g) then
      crossing[#crossing + 1] = family_label(f)
      if f.name == "tp" then
        w[#w + 1] = string.format("tp groups cross nodes: tensor parallelism's per-layer activation collectives "
          .. "run over the network (%s); keep tp within a node of %d GPUs", audit.link_text(topo, "inter"), g)
      end
    end
  end
  if #crossing > 0 then
    w[#w + 1] = string.format("groups crossing nodes run over the network (%s), not NVLink alone (%s): %s "
      .. "(ranks and nodes in the table above)", audit.link_text(topo, "inter"), audit.link_text(topo, "intra"),
      table.concat(crossing, ", "))
  end
  -- Padding-heavy sharding and empty shards.
  local W = p.layout.W
  local heavy, worst = {}, {}
  for _, u in ipairs(p.layout.units) do
    local Wu = u.W or W -- (expert parallelism's experts: their efsdp group)
    local pad = padding_of(u, Wu)
    if Wu > 1 and pad * 20 >= Wu * u.total and pad > 0 then
      heavy[#heavy + 1] = u.index
      worst[u.index] = pad / (Wu * u.total)
    end
  end
  for _, run in ipairs(unit_runs(p, heavy)) do
    local ix = heavy[run.first]
    local u = p.layout.units[ix + 1]
    local empties = 0
    for _, q in ipairs(u.params) do if empty_ranks(q, W) > 0 then empties = empties + 1 end end
    w[#w + 1] = string.format("padding-heavy sharding: %s: %.0f%% of each all-gather and reduce-scatter is "
      .. "padding (%d-way dim chunks%s)", run.text, 100 * worst[ix], W,
      empties > 0 and string.format("; %d of %d parameters leave ranks with no data", empties, #u.params) or "")
  end
  -- Exposed collectives (each kind and phase at least 1% of the step),
  -- by what waited for them.
  -- Full checkpointing's recompute of a forward TP collective is its own
  -- row: the backward runs it again (phase "backward recompute").
  local seen, order = {}, {}
  local function add(o, us, phase, reason)
    local key = o.kind .. "|" .. phase .. "|" .. reason
    if not seen[key] then
      seen[key] = { kind = o.kind, phase = phase, reason = reason, units = {}, total = 0, max = 0 }
      order[#order + 1] = key
    end
    local gr = seen[key]
    if o.group then gr.families = gr.families or {}; gr.families[o.group] = true end
    if gr.units[#gr.units] ~= o.unit then gr.units[#gr.units + 1] = o.unit end
    gr.ops = (gr.ops or 0) + (o.times or 1)
    gr.total = gr.total + us
    -- (per run of the op: a repeated micro-step's row counts every repetition's)
    gr.max = math.max(gr.max, us / (o.times or 1))
  end
  for _, o in ipairs(p.ops) do
    local us = tl.exposed_by[o.seq]
    if o.group and us and us > 0 then
      local wt = tl.waiter[o.seq]
      local first = o.kind == "all_gather" and o.seq <= 1
      local reason = first and "first" or (o.stream == "compute" and "inline")
        or (wt and (p.ops[wt.op + 1].kind .. "|" .. wait_reason(p, wt.op, wt.via))) or "tail"
      add(o, us, o.phase, reason)
    end
  end
  -- Recomputed in backward: units in backward order, as they run.
  for i = #p.ops, 1, -1 do
    local o = p.ops[i]
    local us = tl.recompute_by[o.seq]
    if us and us > 0 then add(o, us, "backward recompute", "recompute") end
  end
  -- The largest exposure first.
  table.sort(order, function(x, y)
    if seen[x].total ~= seen[y].total then return seen[x].total > seen[y].total end
    return x < y
  end)
  for _, key in ipairs(order) do
    local gr = seen[key]
    if gr.total >= 0.01 * tl.step_us then
      local runs = unit_runs(p, gr.units)
      local names = {}
      for i, r in ipairs(runs) do
        if i <= 3 then names[#names + 1] = r.text end
      end
      if #runs > 3 then names[#names + 1] = string.format("and %d more", #runs - 3) end
      local why
      if gr.reason == "first" then why = "the step's first all-gather: no compute to hide behind"
      elseif gr.reason == "inline" then why = "it runs on the compute stream"
      elseif gr.reason == "recompute" then
        why = string.format("full checkpointing reruns the forward, its %s included, in the unit's "
          .. "backward on the compute stream", timeline_mod.inline_labels(gr.families or {}))
      elseif gr.reason == "tail" then why = "the step ends with it"
      else
        local wk, kind = gr.reason:match("^(.-)|(.*)$")
        why = string.format("the compute stream's %s waits for it (%s)", wk,
          kind == "data" and "its data" or "it reuses the arena bytes the collective's buffer held")
        if gr.kind == "all_gather" then why = why .. ": it cannot hide behind its neighbour's compute" end
      end
      w[#w + 1] = string.format("exposed %s (%s) of %s: %s over %d op%s (up to %s each); %s", gr.kind, gr.phase,
        table.concat(names, ", "), us_text(gr.total), gr.ops, gr.ops == 1 and "" or "s", us_text(gr.max), why)
    end
  end
  local mp = a.memory_plan
  if #mp.waits > 0 then
    local all, n = 0, 0
    for _, x in ipairs(mp.waits) do all, n = all + x.cost_us * x.times, n + x.times end
    w[#w + 1] = string.format("%s: %d wait%s for reused arena bytes delay%s ops by %s, %s of it on the compute "
      .. "stream (step %s, %s with no such waits): %s",
      mp.policy == "hold" and "the memory plan was built for other settings"
        or string.format("memory short (%s free for the arena%s)", room_text(mp.budget_bytes),
          mp.hold_bytes and (", keeping bytes for overlap needs " .. human(mp.hold_bytes)) or ""),
      n, n == 1 and "" or "s", n == 1 and "s" or "", us_text(all), us_text(mp.wait_us),
      us_text(a.step_us), us_text(mp.free_step_us), table.concat(audit.costly_wait_groups(p, mp), "; "))
  end
  local m = a.memory
  if not m.fits then
    table.insert(w, 1, string.format("memory: a rank needs %s, more than the GPU's %s: reduce activations "
      .. "(activation checkpointing, smaller batch), or shard wider", human(m.total_bytes),
      audit.gpu_memory_text(a.settings)))
  end
  return w
end

-- ---- the fit verdict, said at once ----

-- The memory terms of a rank, largest first: { name, bytes, fix }. Each
-- fix names the plan field that shrinks that term.
local function memory_terms(p, s, m)
  local ac = s.activation_checkpointing
  local act_fix
  if ac ~= "full" then
    act_fix = string.format('set training.activation_checkpointing = "full" (it is "%s"), or a smaller '
      .. "training.local_batch_size", ac)
  else
    act_fix = "lower training.local_batch_size or model.seq_len, or split the sequence (parallel.cp) or the "
      .. "layers (parallel.tp, parallel.pp)"
  end
  -- (a pipeline rank's arena holds its stages' unsharded parameters and
  -- gradients all step; a flat plan's, the units in flight)
  local comm_fix = p.pipeline and "more pipeline stages (parallel.pp), each holding fewer layers unsharded"
    or (p.fsdp and p.fsdp.reshard_after_forward_policy == "never"
        and 'set fsdp.reshard_after_forward_policy = "default" (or "always")')
    or (p.fsdp and require("gen.parallel.fsdp_layout").raf_bool(p.fsdp.reshard_after_forward) == false and "set fsdp.reshard_after_forward = true")
    or (p.fsdp and p.fsdp.reshard_after_backward == false and "set fsdp.reshard_after_backward = true")
    or "smaller FSDP units (split the model into more units)"
  local shard_fix = "shard wider: more ranks in parallel.dp_shard (a larger world_size), or parallel.tp / parallel.pp"
  local t = {
    { "activations", m.activation_bytes, act_fix },
    { "optimizer state", m.optimizer_bytes, shard_fix .. (s.fp32_master and ", or drop training.fp32_master" or "") },
    { "parameters", m.params_bytes, shard_fix },
    { "gradients", m.grads_bytes, shard_fix },
    { "communication buffers", m.comm_bytes, comm_fix },
  }
  if not m.activations_modeled then table.remove(t, 1) end
  table.sort(t, function(x, y) return x[2] > y[2] or (x[2] == y[2] and x[1] < y[1]) end)
  return t
end

-- One line when a plan does not fit its GPU (nil when it does): the worst
-- rank, the bytes it needs against the GPU's, the largest term and its
-- fix. gen/commplan.lua prints it (an error under --strict); make PLAN=
-- prints it after the build.
function audit.fit_line(p, shown)
  local a = audit.analysis(p)
  local m, s = a.memory, a.settings
  if not m or m.fits then return nil end
  local terms = memory_terms(p, s, m)
  local top = terms[1]
  return string.format("%s: does not fit: %s needs %s%s, the GPU has %s: %s over; largest term %s %s; fix: %s "
    .. "(make advise PLAN=%s ranks the meshes that fit)",
    shown, a.pipeline and string.format("pipeline rank %d", m.rank) or "each rank", human(m.total_bytes),
    m.activations_modeled and "" or " without its activations (a generic model's are not known)",
    audit.gpu_memory_text(s), human(m.total_bytes - m.gpu_bytes), top[1], human(top[2]), top[3], shown)
end

-- ---- critical path ----

-- The critical path as segments of consecutive ops on one stream.
function audit.critical_segments(p, tl)
  local segs = {}
  for _, seq in ipairs(tl.critical) do
    local o = p.ops[seq + 1]
    local r = tl.ops[seq]
    local last = segs[#segs]
    if last and last.stream == o.stream then
      last.last, last.n = seq, last.n + 1
      last.us = r.finish - last.start
      last.last_kind, last.last_unit = o.kind, o.unit
    else
      segs[#segs + 1] = { stream = o.stream, first = seq, last = seq, n = 1, start = r.start, us = r.finish - r.start,
                          first_kind = o.kind, first_unit = o.unit, last_kind = o.kind, last_unit = o.unit }
    end
  end
  return segs
end

-- One line: the step's critical path time by stream. The compute
-- stream's share names its collectives (TP's, CP's K/V exchange, the
-- expert all-to-alls: gen/timeline.lua's labels, each family's time) and
-- full checkpointing's rerun of them inside backward ops apart from its
-- compute.
function audit.critical_text(p, tl)
  local by, order = {}, {}
  for _, sg in ipairs(audit.critical_segments(p, tl)) do
    if not by[sg.stream] then by[sg.stream] = 0; order[#order + 1] = sg.stream end
    by[sg.stream] = by[sg.stream] + sg.us
  end
  local inline, fam_us, fams = 0, {}, {}
  local function add(f, us)
    if not fam_us[f] then fam_us[f] = 0; fams[#fams + 1] = f end
    fam_us[f] = fam_us[f] + us
    inline = inline + us
  end
  for _, seq in ipairs(tl.critical) do
    local o, r = p.ops[seq + 1], tl.ops[seq]
    if o.stream == "compute" then
      if o.group then add(o.group, r.dur)
      else
        for _, x in ipairs(timeline_mod.rerun_by_family(r)) do add(x[1], x[2]) end
      end
    end
  end
  local rank = {}
  for i, f in ipairs(timeline_mod.INLINE_ORDER) do rank[f] = i end
  table.sort(fams, function(x, y)
    local rx, ry = rank[x] or math.huge, rank[y] or math.huge
    if rx ~= ry then return rx < ry end
    return x < y
  end)
  table.sort(order, function(x, y) return by[x] > by[y] or (by[x] == by[y] and x < y) end)
  local t = {}
  for _, st in ipairs(order) do
    if st == "compute" and inline > 0 then
      local parts = {}
      for _, f in ipairs(fams) do
        parts[#parts + 1] = string.format(" + %s %s", us_text(fam_us[f]), timeline_mod.inline_label(f))
      end
      t[#t + 1] = string.format("compute stream %s: %s compute%s", us_text(by[st]),
        us_text(math.max(0, by[st] - inline)), table.concat(parts))
    else
      t[#t + 1] = string.format("%s %s", st, us_text(by[st]))
    end
  end
  return table.concat(t, ", ")
end

-- ---- the memory plan's trade ----

-- The waits for reused arena bytes that delay their ops, grouped by the
-- waiting op's kind and the kind it waits for (in op order of the first
-- of each group): "copy_out of layers.78-0 waits for reduce_scatter of
-- layers.79-1: 81 ops, 678.24 ms (up to 8.37 ms each)".
function audit.costly_wait_groups(p, mp)
  local groups, order = {}, {}
  for _, x in ipairs(mp.waits) do
    local o, q = p.ops[x.op + 1], p.ops[x.waits_for + 1]
    local key = o.kind .. "|" .. q.kind
    local gr = groups[key]
    if not gr then
      gr = { kind = o.kind, on = q.kind, units = {}, on_units = {}, n = 0, us = 0, max = 0, stream = o.stream }
      groups[key] = gr
      order[#order + 1] = gr
    end
    if gr.units[#gr.units] ~= o.unit then gr.units[#gr.units + 1] = o.unit end
    if gr.on_units[#gr.on_units] ~= q.unit then gr.on_units[#gr.on_units + 1] = q.unit end
    gr.n, gr.us, gr.max = gr.n + x.times, gr.us + x.cost_us * x.times, math.max(gr.max, x.cost_us)
  end
  local function names(list)
    local t = {}
    for i, r in ipairs(unit_runs(p, list)) do
      if i <= 3 then t[#t + 1] = r.text end
    end
    local runs = #unit_runs(p, list)
    if runs > 3 then t[#t + 1] = string.format("and %d more", runs - 3) end
    return table.concat(t, ", ")
  end
  local out = {}
  for _, gr in ipairs(order) do
    out[#out + 1] = string.format("%s of %s (%s stream) waits for %s of %s: %d op%s, %s (up to %s each)", gr.kind,
      names(gr.units), gr.stream, gr.on, names(gr.on_units), gr.n, gr.n == 1 and "" or "s", us_text(gr.us),
      us_text(gr.max))
  end
  return out
end

-- SCHEDULE.md's summary row: the arena's bytes against the time its
-- reuse costs (gen/figures.lua's memory_plan).
function audit.memory_plan_text(p, a)
  local mp = a.memory_plan
  local n = 0
  for _, x in ipairs(mp.waits) do n = n + x.times end
  local cost = n == 0 and "no reuse of arena bytes delays an op"
    or string.format("%d wait%s for reused arena bytes delay%s ops, the compute stream by %s (warnings)", n,
      n == 1 and "" or "s", n == 1 and "s" or "", us_text(mp.wait_us))
  local extra = mp.arena_bytes - mp.reuse_bytes
  if (mp.policy == "hold" or mp.policy == "short") and (extra > 0 or (mp.reuse_waits or 0) > 0) then
    local alt = (mp.reuse_waits or 0) == 0 and "which would delay nothing"
      or mp.reuse_wait_us > 0 and (us_text(mp.reuse_step_us) == us_text(a.step_us)
        and string.format("which would make the compute stream wait %s for the reused bytes (the step the same, "
          .. "%s: the wait falls where it would idle anyway)", us_text(mp.reuse_wait_us), us_text(a.step_us))
        or string.format("which would make the compute stream wait %s (step %s instead of %s)",
          us_text(mp.reuse_wait_us), us_text(mp.reuse_step_us), us_text(a.step_us)))
      or string.format("which would delay %d op%s on other streams (step %s instead of %s)", mp.reuse_waits,
        mp.reuse_waits == 1 and "" or "s", us_text(mp.reuse_step_us), us_text(a.step_us))
    local text = string.format("arena %s: %s keep their bytes until the other stream is done with them, "
      .. "%s more than reusing them at once (%s), %s; %s", human(mp.arena_bytes), held_kinds(p),
      extra > 0 and human(extra) or "no", human(mp.reuse_bytes), alt, cost)
    if mp.policy == "short" then
      text = text .. string.format("; memory short (%s free for the arena): %d buffer%s reuse%s bytes at once",
        room_text(mp.budget_bytes), mp.fell_back, mp.fell_back == 1 and "" or "s", mp.fell_back == 1 and "s" or "")
    end
    return text
  end
  if mp.policy == "reuse" and mp.held_lives > 0 then
    return string.format("arena %s reuses bytes at once: keeping %s until the other stream is done with them "
      .. "needs %s, and the rank leaves %s for the arena (memory short); %s (step %s, %s with room to keep them)",
      human(mp.arena_bytes), held_kinds(p), mp.hold_bytes and human(mp.hold_bytes) or "more",
      room_text(mp.budget_bytes), cost, us_text(a.step_us), us_text(mp.free_step_us))
  end
  return string.format("arena %s; %s", human(mp.arena_bytes), cost)
end

-- ---- SCHEDULE.md ----

-- The step line: the step as compute + exposed communication + other
-- waits, and the communication's time (gen/figures.lua's figures).
function audit.step_text(a)
  local other = us_text(a.waits_us) ~= us_text(0) and (" + other waits " .. us_text(a.waits_us)) or ""
  return string.format("%s predicted = compute %s + exposed communication %s (%.0f%% of the step)%s; communication "
    .. "%s in the step, links shared (%s alone)", us_text(a.step_us), us_text(a.compute_us), us_text(a.exposed_us),
    a.step_us > 0 and 100 * a.exposed_us / a.step_us or 0, other, us_text(a.comm_us), us_text(a.alone_us))
end

local function mesh_text(p)
  local parts = {}
  for i, n in ipairs(p.mesh.names) do parts[#parts + 1] = n .. "=" .. p.mesh.sizes[i] end
  local d = p.dims
  -- every parallelism the plan runs, named by its module (gen/parallel/init.lua)
  local kind = require("gen.parallel.init").mesh_kind(p)
  -- expert parallel: the routed experts' own mesh over the same ranks
  local experts = (d.ep or 1) > 1 and string.format("; experts on ep=%d x efsdp=%d (expert parallel)", d.ep, d.efsdp)
    or ""
  return table.concat(parts, " x ") .. " (" .. kind .. ")" .. experts
end

local function model_text(p)
  local params = require("gen.compute").model_params(p)
  local what = p.model.family == "generic" and "generic" or (p.model.family .. " " .. (p.model.size or "custom"))
  local u1 = p.layout.units[1]
  local layers = p.model_config and p.model_config.n_layers
  return string.format("%s: %s%d units, %s params; %s params, %s all-gather, %s reduce", what,
    layers and (layers .. " layers in ") or "", #p.layout.units, count_text(params), u1.orig_dtype, u1.ag_dtype,
    u1.reduce_dtype)
end

local COLL_NAME = { all_gather = "all-gather", reduce_scatter = "reduce-scatter", all_reduce = "all-reduce",
                    tp_all_gather = "TP all-gather", tp_reduce_scatter = "TP reduce-scatter",
                    tp_all_reduce = "TP all-reduce" }

-- The cp group's activation collectives are context parallel's K/V exchange (gen/parallel/cp.lua).
local CP_COLL_NAME = { tp_all_gather = "K/V all-gather", tp_reduce_scatter = "K/V-gradient reduce-scatter" }

local function collectives_text(p, fname, rec)
  local function name_of(k) return fname == "cp" and CP_COLL_NAME[k] or COLL_NAME[k] or k end
  local counts, order = {}, {}
  for _, o in ipairs(p.ops) do
    if o.group == fname then
      -- (cp's K/V all-gathers that checkpointing re-runs in backward: their own entry)
      local k = (fname == "cp" and o.recompute) and o.kind .. "*" or o.kind
      if not counts[k] then counts[k] = 0; order[#order + 1] = k end
      counts[k] = counts[k] + (o.times or 1)
    end
  end
  local t = {}
  for _, k in ipairs(order) do
    local base = k:match("^(.-)%*$")
    t[#t + 1] = counts[k] .. " " .. (base and (name_of(base) .. " recomputed in backward (activation checkpointing)")
      or name_of(k))
  end
  local text = table.concat(t, ", ")
  if rec then
    local r = {}
    for _, k in ipairs(rec.kind_order) do r[#r + 1] = rec.kinds[k] .. " " .. name_of(k) end
    text = text .. " + " .. table.concat(r, ", ") .. " recomputed in backward (full checkpointing)"
  end
  return text
end

-- set_reshard_after_backward(False) (fsdp.reshard_after_backward, a unit's
-- own): the units kept unsharded from a backward into the next forward.
function audit.kept_text(p)
  local n, all = 0, 0
  for _, u in ipairs(p.layout and p.layout.units or {}) do
    if #u.params > 0 then
      all = all + 1
      -- (a unit backwarding on sharded parameters has nothing unsharded to keep)
      if u.reshard_after_backward == false and not u.sharded_backward then n = n + 1 end
    end
  end
  if n == 0 or p.fsdp.grad_accumulation == "step_end" then return "" end
  return string.format("; %d of %d units kept unsharded from each backward into the next forward but the last "
    .. "(set_reshard_after_backward(False)): no all-gather in those forwards", n, all)
end

-- set_unshard_in_backward(False) on units resharded after forward: their
-- backward on the sharded parameters (gen/parallel/fsdp_layout.lua).
function audit.sharded_backward_text(p)
  local n = 0
  for _, u in ipairs(p.layout and p.layout.units or {}) do
    if u.sharded_backward then n = n + 1 end
  end
  if n == 0 then return "" end
  return string.format("; %d unit%s backward on %s sharded parameters (set_unshard_in_backward(False)): no "
    .. "all-gather in %s backward", n, n == 1 and "" or "s", n == 1 and "its" or "their", n == 1 and "its" or "their")
end

local function settings_lines(p, s)
  local ac = { none = "no activation checkpointing", full = "full activation checkpointing",
               selective = "selective (op) activation checkpointing" }
  local opt = s.optimizer == "adamw" and ("AdamW" .. (compute.bf16_moments(s) and ", moments in bf16" or "")
      .. (s.fp32_master and " with an fp32 master copy" or ""))
    or (s.optimizer == "sgd" and "SGD (no momentum)" or "no optimizer state")
  local acc = ""
  if p.fsdp.micro_steps > 1 then
    local ga = p.fsdp.grad_accumulation
    acc = ga == "sync_last" and " reducing on the last only (set_requires_gradient_sync(False) before the others)"
      or ga == "step_end" and (" none resharding or reducing, every unit reduced once after the last backward "
        .. "(torch.distributed.pipelining's finalize_backward)")
      or ga == "all_reduce_last" and " each reduce-scattering, the all-reduce on the last only (HSDP's "
        .. "set_requires_all_reduce(False) before the others)"
      or " each reducing and adding into the sharded grads (FSDP2's default)"
    acc = acc .. audit.kept_text(p)
  end
  acc = acc .. audit.sharded_backward_text(p)
  local loss = ""
  if require("gen.compute").activations_modeled(p) then
    -- (the collectives follow the wrapper only where the tables reduce a part: audit.chunked_ops)
    loss = s.loss_chunks > 1 and string.format("; loss: ChunkedLossWrapper, %d chunks of the sequence%s%s",
      s.loss_chunks, s.defaulted.loss_chunks and " (torchtitan's configs)" or "",
      audit.chunked_ops(p) and "" or ", its memory only (the collectives keep CrossEntropyLoss's order)")
      or (p.model_config and (p.model_config.num_mtp_layers or 0) > 0)
        and string.format("; loss: MTPLoss on the whole logits of the main output and %d MTP depths",
          p.model_config.num_mtp_layers)
      or "; loss: CrossEntropyLoss on the whole logits"
  end
  if (s.cp or 1) > 1 then
    return string.format("%s tokens per rank and micro-step (local batch %d x seq_len %d / cp %d: each rank of a cp "
      .. "group holds 1/%d of every sequence), %d micro-step(s)%s; %s%s; %s",
      commas(s.tokens), s.local_batch_size, s.seq_len, s.cp, s.cp, p.fsdp.micro_steps, acc,
      ac[s.activation_checkpointing], loss, opt)
  end
  return string.format("%s tokens per data-parallel rank%s and micro-step (local batch %d x seq_len %d%s), "
    .. "%d micro-step(s)%s; %s%s; %s",
    commas(s.tokens), (p.dims and (p.dims.tp or 1) > 1) and " (TP group)" or "", s.local_batch_size, s.seq_len,
    s.defaulted.seq_len and ", assumed" or "", p.fsdp.micro_steps,
    acc, ac[s.activation_checkpointing], loss, opt)
end

-- The figures a plan's audit cannot give, each with why and what would
-- give it (SCHEDULE.md's summary says them first): a generic model's
-- activations (so no memory verdict while it fits without them), its model
-- FLOPs per token, tokens/s and MFU without its attention shape, and TP's
-- activation collectives that a generic unit's shapes cannot place.
function audit.missing_figures(p, a)
  local out = {}
  local m, th = a.memory, a.throughput
  if m and not m.activations_modeled then
    out[#out + 1] = string.format("activations per rank not computed (%s), so %s", compute.generic_unmodeled(p),
      m.fits and "no memory verdict" or "the memory verdict counts none")
  end
  if not a.pipeline and not th.mfu then
    out[#out + 1] = "model FLOPs per token and MFU not computed: give model.n_heads, head_dim and n_layers (the "
      .. "attention shape torchtitan's formula needs)"
  end
  if p.model and p.model.family == "generic" and p.dims and (p.dims.tp or 1) > 1 then
    local tp_ops = false
    for _, o in ipairs(p.ops) do
      if o.group == "tp" then tp_ops = true; break end
    end
    if not tp_ops then
      out[#out + 1] = string.format("TP's activation collectives not planned: tp = %d, and a generic model gives "
        .. "each parameter's placement but not its modules' input and output layouts, which decide TP's "
        .. "redistributions (torchtitan's come from its models' plans, models/common/decoder_sharding.py:301); the "
        .. "step's TP time is missing: use the llama or qwen3 family where the model is one, or give model.n_heads, "
        .. "head_dim and n_layers and torchtitan's Llama names (commplan.hf_config writes them)", p.dims.tp)
    end
  end
  return out
end

-- The parameters torchtitan's model FLOPs count (gen/compute.lua's
-- model_flops_per_token): an MoE model's active ones.
function audit.flops_params_text(p)
  local cfg = p.model_config or {}
  if cfg.num_experts then
    return string.format("active non-embedding parameters (top_k %d of %d routed experts)", cfg.top_k, cfg.num_experts)
  end
  return "non-embedding parameters"
end

function audit.schedule_md(p, fp)
  local L = {}
  local function w(fmt, ...) L[#L + 1] = select("#", ...) > 0 and string.format(fmt, ...) or fmt end
  local a = audit.analysis(p)
  local s, m, tl = a.settings, a.memory, a.timeline
  local topo = p.topology
  w("<!-- generated by commplan from %s; do not edit. fingerprint %s -->", p.source_file, fp)
  w("# Communication schedule: %s", p.name)
  w("")
  w("## Summary")
  w("")
  w("| | |")
  w("|---|---|")
  local pl = a.pipeline
  local missing = audit.missing_figures(p, a)
  if #missing > 0 then
    w("| **incomplete** | %s |", table.concat(missing, "; "))
  end
  -- (a pipeline plan's model: the stage plan holds every unit; rank 0 its stages')
  w("| model | %s |", model_text(pl and pl.facts.stage_plan or p))
  w("| tokens | %s |", pl and pipeline_audit.tokens_text(a, audit) or settings_lines(p, s))
  w("| GPU | %s: %s, %g TFLOPS dense, %s; HBM %g GB/s; "
    .. "%d GPUs per node, NVLink %s; network %s |", audit.preset_name(topo),
    audit.gpu_memory_text(s), s.gpu_TFLOPS, compute.pricing_text(s), s.hbm_GBps, topo.gpus_per_node, audit.link_text(topo, "intra"),
    audit.link_text(topo, "inter"))
  local nodes = (p.world_size + topo.gpus_per_node - 1) // topo.gpus_per_node
  w("| world | %s ranks on %s node(s); mesh %s; reduce %s |", commas(p.world_size), commas(nodes), mesh_text(p),
    p.fsdp.reduce_op)
  if m and not m.activations_modeled and m.fits then
    -- (no verdict computed without the activations)
    w("| memory | at least %s of %s per rank without the activations: no verdict (a generic model's activations "
      .. "are not known) |", human(m.total_bytes), human(m.gpu_bytes))
  elseif m then
    w("| memory | %s of %s per rank%s: %s |", human(m.total_bytes), human(m.gpu_bytes),
      pl and string.format(" on pipeline rank %d, the most at its peak of any rank", m.rank) or "",
      m.fits and string.format("fits, %s free", human(m.gpu_bytes - m.total_bytes))
        or string.format("**does not fit**, %s over", human(m.total_bytes - m.gpu_bytes)))
  end
  w("| memory plan | %s |", pl and pipeline_audit.memory_plan_text(a, audit) or audit.memory_plan_text(p, a))
  local th = a.throughput
  if th.tokens_per_s_per_gpu and th.mfu then -- (the llama family: a generic model's compute is not modelled)
    w("| throughput | %s tokens/s per GPU%s (torchtitan's tps and MFU for the predicted step%s) |",
      commas(math.floor(th.tokens_per_s_per_gpu + 0.5)),
      th.mfu and string.format(", MFU %.1f%% (%s model FLOPs per token: 6 x %s + attention)",
        100 * th.mfu, string.format("%.3g", th.model_flops_per_token), audit.flops_params_text(p)) or "",
      s.mfu and string.format(", so they follow from the assumed %g%% of %g TFLOPS on every FLOP executed, recompute "
        .. "included", 100 * s.mfu, s.gpu_TFLOPS) or ", computed: MFU is an output of the shapes' prices")
  end
  if pl then
    w("| step | %s |", pipeline_audit.step_text(a, audit, p))
  else
    w("| step | %s |", audit.step_text(a) .. "; critical path " .. (p.rep and string.format("of the step as drawn "
      .. "(micro-steps %d-%d once, timeline.svg): ", p.rep.micro_first, p.rep.micro_last) or "")
      .. audit.critical_text(p, tl))
  end
  local zc = audit.zero_copy_in(p)
  if zc.ops > 0 then
    w("| copy-in | zero copy-in: %d of %d all-gathers read the sharded storage itself (stored dtype = all-gather dtype), "
      .. "%d copy kernels and %s of copies per step saved; the collectives' bytes are unchanged |", zc.ops,
      zc.all_gathers, zc.ops, human(zc.bytes))
  end
  w("")
  if pl then
    pipeline_audit.md_body(p, a, w, audit)
    return table.concat(L, "\n") .. "\n"
  end
  w("### Communication per rank per step")
  w("")
  w("| group | ranks | link | collectives | buffer bytes | wire bytes | alone | in the step | exposed |")
  w("|---|---|---|---|---|---|---|---|---|")
  -- Inter-node families and their total, then intra-node ones and theirs.
  for _, k in ipairs({ "inter", "intra" }) do
    for _, row in ipairs(a.families) do
      if (k == "intra") == row.intra then
        local f = p.groups.by_name[row.name]
        local _, nspan = family_facts(p, f)
        local sh = p.predicted.shape[f.name]
        w("| %s | %d | %s%s | %s | %s | %s | %s | %s | %s |", family_label(f), f.size,
          row.intra and "intra-node" or string.format("inter-node, %d nodes x %d GPU%s", nspan, sh.gpus_per_node,
            sh.gpus_per_node == 1 and "" or "s"), algorithms_text(p.predicted.per_family[f.name]),
          collectives_text(p, f.name, a.recompute[f.name]), human(row.size_bytes), human(row.wire_bytes),
          us_text(row.alone_us), us_text(row.us), us_text(row.exposed_us))
      end
    end
    local c = a.links[k]
    w("| **%s-node** | | | %d | %s | %s | %s | %s | |", k, c.ops, human(c.size_bytes), human(c.wire_bytes),
      us_text(c.alone_us), us_text(c.us))
  end
  w("")
  w("Alone: each collective at its link's full bandwidth (gen/cost.lua). In the step: its time in the predicted")
  w("step, links shared (trace.json). Exposed: the part of that the compute stream waits through (never more).")
  w("")
  w("### Memory per rank")
  w("")
  w("| | |")
  w("|---|---|")
  local u1 = p.layout.units[1]
  local opt = s.optimizer == "adamw" and ("AdamW: 2 moments in " .. (compute.bf16_moments(s) and "bf16" or u1.orig_dtype)
    .. (s.fp32_master and " + fp32 master" or "")) or (s.optimizer == "sgd" and "SGD: none" or "no optimizer")
  w("| sharded state: parameters %s + gradients %s + optimizer %s (%s) | %s |", human(m.params_bytes),
    human(m.grads_bytes), human(m.optimizer_bytes), opt, human(m.params_bytes + m.grads_bytes + m.optimizer_bytes))
  -- (every wait the executor issues: a repeated micro-step's rows once per repetition)
  local nwaits = 0
  for seq, list in pairs(p.arena.waits) do nwaits = nwaits + #list * (p.ops[seq + 1].times or 1) end
  w("| communication buffers: the memory plan's arena (%s without reuse; at most %s live at once, op %s; %d event "
    .. "waits order its reuse) | %s |", human(p.memory.unplanned_bytes), human(p.memory.peak_transient_bytes),
    tostring(p.memory.peak_at_op), nwaits, human(m.comm_bytes))
  audit.md_symm(p, w)
  if m.activations_modeled then
    w("| activations (%s; saved %s + the largest transient %s: a layer's recompute or the loss's peak) | %s |",
      s.activation_checkpointing == "none"
      and "no checkpointing" or (s.activation_checkpointing .. " checkpointing"),
      human(m.activation_saved_bytes), human(m.activation_transient_bytes), human(m.activation_bytes))
  else
    w("| activations | not modeled: %s |", compute.generic_unmodeled(p))
  end
  audit.md_host(p, s, m, w)
  w("")
  audit.md_warnings_and_step(a, w)
  w("timeline.svg: a lane per stream, ops coloured by kind; hatched where the compute stream waits (red: for a")
  w("collective, named above the lane), the critical path as a black line.")
  w("")
  w("## Details")
  w("")
  audit.md_groups(p, w)
  audit.md_units(p, w)
  audit.md_ep(p, w)
  audit.md_ops(p, w)
  audit.md_timeline(p, a, w)
  audit.md_memory_plan(p, w)
  w("## Assumptions")
  w("")
  w("- Layouts and op order are PyTorch FSDP2's (fully_shard, torch 2.11): dim-k torch.chunk sharding with")
  w("  zero padding, one fused all-gather per unit, chunk_cat reduce-scatter, HSDP all-reduce after it.")
  if p.layout.explicit_prefetch and not p.layout.ep then
    w("- Explicit prefetching (set_modules_to_forward_prefetch / _backward_prefetch, the units' lists): each")
    w("  unit's pre-forward and pre-backward issue its lists' all-gathers after its own; units without a backward")
    w("  list prefetch the unit before them in post-forward order; the root is never resharded after forward.")
  else
    w("- Backward prefetches one unit in reverse post-forward order; the root is never resharded after forward.")
  end
  local mtp = p.model_config and (p.model_config.num_mtp_layers or 0) or 0
  if mtp > 0 then
    w("- DeepSeek-V3's multi-token prediction (model.num_mtp_layers = %d; torchtitan's models/deepseek_v3/mtp.py):", mtp)
    w("  each depth runs the embedding again and its MTP block, then lm_head on every depth's hidden state")
    w("  (MTPLoss). FSDP2's hooks run per call (gen/parallel/fsdp_schedule.lua calls_micro, the model's call")
    w("  order): the embedding is all-gathered in forward once per call; [norm, lm_head]'s first post-backward")
    w("  fires before its gradient exists and reshards it, so the backward gathers it again; each unit reduces")
    w("  once (tests/titan/test_mtp.py measures it on gloo). The logits of every depth are kept for backward.")
    local d = p.dims or {}
    if (d.tp or 1) > 1 then
      w("  Under TP each MTP block's collectives are a block's, with mtp_norm's output gathered for its lm_head")
      w("  call; the embedding's run per call, the output's gather with the norm's call, the loss-parallel")
      w("  all-reduces once per lm_head call (models/deepseek_v3/sharding.py:153-192).")
    end
    if (d.ep or 1) > 1 then
      w("  Under EP torchtitan's explicit prefetch lists hold the MTP blocks between the last block and")
      w("  [norm, lm_head] (distributed/fsdp.py:326-365); the embedding's second call prefetches layers.0 again,")
      w("  which stays gathered into the backward (tests/ep/check_ep_live.sh's *_mtp cases measure both).")
    end
  end
  if audit.chunked_ops(p) then
    w("- The loss is torchtitan's ChunkedLossWrapper (training.loss_chunks; tests/titan/test_chunked_loss.py")
    w("  measures it): per micro-step the [norm, lm_head] unit is all-gathered three times (the decoder's norm,")
    w("  resharded after; the loss's lm_head.unshard(); the backward's pre-backward at the norm) and reduced in")
    w("  two parts, FSDP2 packing only the parameters with a gradient: lm_head's in the loss (its last chunk's")
    w("  backward), the norm's in the decoder's backward, on every micro-step (the wrapper syncs its last chunk).")
    w("  A model's very first forward skips the loss's all-gather (the unit is still unsharded then). TP's")
    w("  collectives of the head keep CrossEntropyLoss's (the chunks' own TP collectives are not modelled).")
  end
  audit.md_collective_model(topo, w)
  if p.async_tp then
    w("- Async TP (parallel.async_tp, torchtitan's enable_async_tensor_parallel): each sequence-parallel TP")
    w("  collective is fused with the matmul it feeds or follows and split in tp chunks (torch's micro-pipeline")
    w("  TP), so it costs max(comm, matmul) + min(comm, matmul) / tp less the matmul in the step; the embedding's,")
    w("  the loss's and the norm gradients' collectives stay exposed. The tables still issue every TP collective.")
  end
  w("- Compute model: %s; checkpointing adds its recompute to backward", compute.pricing_text(s))
  w("  (docs/compute-model.md). MFU and tokens/s divide torchtitan's model FLOPs (6 x params x tokens, attention")
  w("  12 x layers x heads x head_dim x seq_len per token) by the predicted step: outputs, not inputs.")
  w("  Copies move bytes read plus written at the HBM rate.")
  w("  The host issues ahead of the GPU (a CUDA graph); streams wait only as plan.json ops[].waits_for says.")
  w("- Memory: the GPU's %s; the CUDA context, NCCL's own buffers and fragmentation",
    audit.gpu_memory_text(s))
  w("  are not counted. Optimizer moments take the parameters' dtype (torch.optim.AdamW). Activations: see")
  w("  gen/models/llama_acts.lua (Llama: norms, q/k/v, attention output and logsumexp, the SwiGLU intermediates;")
  w("  the head: the final norm, and the logits whole or one chunk at a time as training.loss_chunks says).")
  local defaults = {}
  for _, k in ipairs(util.sorted_keys(s.defaulted)) do
    defaults[#defaults + 1] = k .. "=" .. tostring(s[k])
  end
  if #defaults > 0 then
    w("- Defaults used (the plan does not set them): %s.", table.concat(defaults, ", "))
  end
  return table.concat(L, "\n") .. "\n"
end

-- SCHEDULE.md's warnings, then the predicted step's heading and figure
-- (every plan's; the caption under it is the plan's own).
function audit.md_warnings_and_step(a, w)
  w("### Warnings")
  w("")
  if #a.warnings == 0 then w("None.") end
  for _, text in ipairs(a.warnings) do w("- %s", text) end
  w("")
  w("### Predicted step")
  w("")
  w("![predicted step](timeline.svg)")
  w("")
end

function audit.md_ep(p, w)
  local e = audit.ep_summary(p)
  if not e then return end
  w("### Expert parallelism: the token all-to-alls (per rank)")
  w("")
  w("ep %d x efsdp %d: each rank holds %d of %d experts (their FSDP group is efsdp); per micro-step %s tokens x",
    e.ep, e.efsdp, e.experts // e.ep, e.experts, commas(e.tokens))
  w("top_k %d = %s routed rows of %d elements. Capacity: %s rows per ep member (%s; dropless is %s).",
    e.top_k, commas(e.rows), e.dim, commas(e.capacity),
    e.policy == "factor" and string.format("capacity_factor %g x the uniform share", e.factor)
      or "dropless, the default: every routing fits, as torchtitan's default dispatcher drops nothing",
    commas(e.dropless))
  w("")
  w("| | per MoE layer and micro-step | per step (%d MoE layers x %d micro-steps) |", e.moe_layers, p.fsdp.micro_steps)
  w("|---|---|---|")
  w("| bytes sent at uniform routing | %s | %s |", human(e.layer_bytes_uniform), human(e.step_bytes_uniform))
  w("| bytes sent at the capacity bound | %s | %s |", human(e.layer_bytes_bound), human(e.step_bytes_bound))
  w("| dispatch buffers (send + receive + counts) | %s | %s summed over the layers; in the arena a layer's token "
    .. "buffers live across one exchange pair, so the layers share their bytes |", human(e.buffer_bytes_per_layer),
    human(e.buffer_bytes))
  w("")
  if e.recompute then
    w("Each layer and micro-step: the counts exchange, dispatch and combine forward; in backward activation")
    w("checkpointing (%s) re-runs the three (the same counts again, checked at run time against the forward's),",
      e.ac)
    w("then their gradients: %d token exchanges and %d counts exchanges (the predicted times price the tokens at",
      e.exchanges, e.counts_exchanges)
    w("uniform routing). A count past capacity is refused at run time.")
  else
    w("Each layer and micro-step: the counts exchange, dispatch and combine forward, their gradients backward (the")
    w("predicted times price the tokens at uniform routing). A count past capacity is refused at run time.")
  end
  w("")
end

function audit.md_groups(p, w)
  w("### Mesh and groups")
  w("")
  w("Ranks are row-major over the mesh (outer to inner, as in the summary). A family's groups vary its axes")
  w("and fix the others: rank = sum(color digit x color stride) + sum(key digit x member stride), the sizes")
  w("and strides in plan.json `groups[]`; color and key are ncclCommSplit's.")
  w("")
  w("| group | axes | size | groups | nodes per group | rank 0's group |")
  w("|---|---|---|---|---|---|")
  -- Families over the same axes (an alias and its dims) share one row.
  local rows, by_axes = {}, {}
  for _, f in ipairs(p.groups.list) do
    local key = table.concat(f.axes, ",") .. (f.inner and ("/" .. f.inner) or "") -- (a part family: its own row)
    if by_axes[key] then
      table.insert(by_axes[key].names, f.name)
    else
      by_axes[key] = { f = f, names = { f.name } }
      rows[#rows + 1] = by_axes[key]
    end
  end
  for _, row in ipairs(rows) do
    local f = row.f
    local _, nspan = family_facts(p, f)
    local preview = {}
    local n = math.min(f.size, 4)
    for k = 0, n - 1 do preview[#preview + 1] = tostring(groups_mod.rank(f, 0, k)) end
    local tail = f.size > n and string.format(", ..., %d", groups_mod.rank(f, 0, f.size - 1)) or ""
    w("| %s | %s | %d | %d | %d | %s%s |", table.concat(row.names, " = "), table.concat(f.axis_names, " x "), f.size,
      f.count, nspan, table.concat(preview, ", "), tail)
  end
  w("")
end

-- A unit of mixed all-gather dtypes (per-parameter param_dtype): its
-- parameters' dtypes, gathered as raw bytes as FSDP2 does.
local function mixed_gather_text(u)
  local n = {}
  for _, q in ipairs(u.params) do n[q.ag_dtype] = (n[q.ag_dtype] or 0) + 1 end
  local t = {}
  for _, d in ipairs(util.sorted_keys(n)) do t[#t + 1] = string.format("%d %s", n[d], d) end
  return table.concat(t, " + ") .. " as uint8"
end

function audit.md_units(p, w)
  local W = p.layout.W
  w("### Units and buffer layout (per rank)")
  w("")
  w("Shard(0) is torch.chunk sharding over the shard group: every rank stores and sends the padded")
  w("chunk; a parameter's slot offset (plan.json) is its place in the fused all-gather input.")
  w("")
  w("| unit | params | numel | sharded slot | all-gather buffer | dtypes (gather, reduce) | reduce | padding | copy kernels |")
  w("|---|---|---|---|---|---|---|---|---|")
  local items = {}
  for i, u in ipairs(p.layout.units) do items[i] = unit_item(p, u.index, unit_sig(u)) end
  local shown = {}
  for _, row in ipairs(fold.rows(items, 4)) do
    local u = p.layout.units[items[row.first].index + 1]
    local names = {}
    for _, j in ipairs(row.members) do names[#names + 1] = unit_name(p, items[j].index) end
    local Wu = u.W or W -- (expert parallelism's experts: their efsdp group)
    local pad, numel = padding_of(u, Wu)
    w("| %s%s | %d | %s | %s | %s | %s, %s | %s%s | %s | %s |", fold.unit_range(names),
      (u.is_root and u.name ~= "root") and " (root)" or "",
      #u.params, commas(numel), human(u.total * ES[u.orig_dtype]), human(Wu * (u.ag_bytes or u.total * ES[u.ag_dtype])),
      u.ag_bytes and mixed_gather_text(u) or u.ag_dtype, u.reduce_dtype .. (u.grad_dtype ~= u.ag_dtype and string.format(
        u.ag_bytes and " (grads held in %s)" or " (micro-steps accumulate grads in %s)",
        u.grad_dtype) or ""), u.rs_op .. (u.premul and string.format(" (x 1/%g)", u.premul) or "")
        .. (u.ar_op ~= u.rs_op and ", all-reduce " .. u.ar_op or ""),
      (u.pre_divide ~= 1 or u.post_divide ~= 1) and string.format(" (/%g, /%g)", u.pre_divide, u.post_divide) or "",
      pad > 0 and string.format("%.1f%%", 100 * pad / (Wu * u.total)) or "0",
      u.vec_ok and "16-byte" or "scalar")
    shown[#shown + 1] = { u = u, names = names }
  end
  w("")
  -- fully_shard's ignored_params (docs/plan-files.md): listed, never in a slot or a collective
  local ignored = {}
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.ignored or {}) do
      ignored[#ignored + 1] = string.format("`%s` (%s, %s, unit %s)", q.name, table.concat(q.shape, "x"), q.dtype,
        u.name)
    end
  end
  -- frozen parameters (requires_grad=False, docs/plan-files.md): gathered, never reduced
  local frozen = {}
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.params) do
      if q.frozen then frozen[#frozen + 1] = string.format("`%s` (unit %s)", q.name, u.name) end
    end
  end
  if #frozen > 0 then
    w("Frozen (`requires_grad=False`): all-gathered with their units, never reduced (no gradient, no optimizer "
      .. "state; each unit's reduce-scatter carries its trainable parameters only): %s.", table.concat(frozen, ", "))
    w("")
  end
  if #ignored > 0 then
    w("Ignored by FSDP (`fully_shard(ignored_params=...)`), whole on every rank and never communicated "
      .. "(the whole-rank memory counts them, their gradients and optimizer state): %s.", table.concat(ignored, ", "))
    w("")
  end
  audit.md_tp_classes(p, w)
  w("Copy kernels move 16 bytes per thread where every slot offset and run is a multiple of 8 elements;")
  w("otherwise they copy element by element. Offsets are never padded for alignment: the layout stays FSDP2's.")
  local seen = {}
  for _, sh in ipairs(shown) do
    local u = sh.u
    if #u.params == 0 then goto next_unit end
    local sig = {}
    for _, q in ipairs(u.params) do sig[#sig + 1] = table.concat(q.shape, "x") .. "/" .. q.shard_dim end
    sig = table.concat(sig, ",")
    w("")
    if seen[sig] then
      w("%s: parameters as in %s.", fold.unit_range(sh.names), seen[sig])
    else
      seen[sig] = fold.unit_range(sh.names)
      w("#### Parameters of %s", seen[sig])
      w("")
      w("| param | %s | dtype | placement | padding | ranks with no data |",
        p.dims.tp > 1 and "shape on TP rank 0" or "shape")
      w("|---|---|---|---|---|---|")
      for _, q in ipairs(u.params) do
        local pad = W * q.padded - q.numel
        -- Numbered units (layers.N) show names relative to the unit.
        local name = u.name:find("%d") and q.name:gsub("^" .. u.name:gsub("%p", "%%%0") .. "%.", "") or q.name
        w("| %s | (%s) | %s | Shard(%d)%s | %s | %s |", name, table.concat(q.shape, ", "), q.dtype, q.shard_dim,
          q.tp_dim and string.format(", TP Shard(%d)", q.tp_dim) or "",
          pad > 0 and string.format("%s (%.1f%%)", commas(pad), 100 * pad / (W * q.padded)) or "0",
          empty_ranks(q, W) > 0 and tostring(empty_ranks(q, W)) or "-")
      end
    end
    ::next_unit::
  end
  w("")
end

-- A parameter's name relative to its numbered unit (layers.N).
local function short_name(u, q)
  return u.name:find("%d") and (q.name:gsub("^" .. u.name:gsub("%p", "%%%0") .. "%.", "")) or q.name
end

-- One line per TP class beyond class 0: the units whose slot or
-- parameter shapes differ from TP rank 0's (runs of units folded).
function audit.md_tp_classes(p, w)
  if #(p.tp_classes or {}) < 2 then return end
  local W = p.layout.W
  local function ranks_text(coords)
    local t = {}
    for i, c in ipairs(coords) do t[i] = tostring(c) end
    return (#t == 1 and "TP rank " or "TP ranks ") .. table.concat(t, ", ")
  end
  w("TP classes: %s (class 0) %s the layout above; TP ranks whose TP-local shapes differ (torch.chunk's uneven",
    ranks_text(p.tp_classes[1].coords), #p.tp_classes[1].coords == 1 and "holds" or "hold")
  w("splits) hold their own (plan.json `tp_classes`), per unit where it differs:")
  w("")
  for c = 2, #p.tp_classes do
    local cls = p.tp_classes[c]
    local items = {}
    for i, u in ipairs(cls.layout.units) do
      local u0 = p.layout.units[i]
      local shapes, same = {}, u.total == u0.total
      for j, q in ipairs(u.params) do
        local sh = table.concat(q.shape, ", ")
        if sh ~= table.concat(u0.params[j].shape, ", ") then
          same = false
          shapes[#shapes + 1] = string.format("%s (%s)", short_name(u, q), sh)
        end
      end
      if not same then
        local slot = u.total == u0.total and string.format("slot %s as TP rank 0's", human(u.total * ES[u.orig_dtype]))
          or string.format("slot %s, all-gather buffer %s (TP rank 0: %s, %s)", human(u.total * ES[u.orig_dtype]),
            human(W * u.total * ES[u.ag_dtype]), human(u0.total * ES[u0.orig_dtype]), human(W * u0.total * ES[u0.ag_dtype]))
        local it = unit_item(p, u.index, slot .. (#shapes > 0 and ("; " .. table.concat(shapes, ", ")) or ""))
        it.text = slot .. (#shapes > 0 and ("; " .. table.concat(shapes, ", ")) or "")
        items[#items + 1] = it
      end
    end
    local parts = {}
    for _, row in ipairs(fold.rows(items, 4)) do
      local names = {}
      for _, j in ipairs(row.members) do names[#names + 1] = unit_name(p, items[j].index) end
      parts[#parts + 1] = fold.unit_range(names) .. ": " .. items[row.first].text
    end
    w("- %s (class %d; arena %s): %s", ranks_text(cls.coords), c - 1, human(cls.memory.arena_bytes),
      #parts > 0 and table.concat(parts, "; ") or "slots as TP rank 0's")
  end
  w("")
end

-- Whether the step follows ChunkedLossWrapper's order: an op of a part of
-- a unit (gen/parallel/fsdp_schedule.lua) past its forward (a forward call
-- of a part alone is DeepSeek-V3's MTP head: fsdp_schedule.calls_micro).
function audit.chunked_ops(p)
  for _, o in ipairs(p.ops) do
    if o.part_first and o.kind ~= "forward" then return true end
  end
  return false
end

-- An op's kind, and a part's parameters (a partial reduction and its compute).
local function op_text(p, o)
  if not o.part_first then return o.kind end
  local names, ps = {}, p.layout.units[o.unit + 1].params
  for j = o.part_first + 1, o.part_first + o.part_count do names[#names + 1] = ps[j].name end
  return o.kind .. " (" .. table.concat(names, ", ") .. ")"
end

-- An op's micro-step, or the micro-steps its row stands for.
local function micro_text(o)
  if o.times then return string.format("%d-%d", o.micro_step, o.micro_step + o.times - 1) end
  return tostring(o.micro_step)
end

function audit.md_ops(p, w)
  w("### Ops in issue order")
  w("")
  w("Collectives with group `-` have one rank and run as local copies. Each op runs on its stream and,")
  w("before it, waits for the ops under \"waits for\" (a data dependency or a reuse of arena bytes")
  w("across streams); nothing else orders it. Folded rows stand for a run of ops, one per unit:")
  w("`#` reads first-last/step, and their waits are given relative to the op (-3: three ops earlier).")
  w("Sizes and counts per op are in plan.json. An op naming parameters in parentheses covers those of its unit")
  w("only: a partial reduction (packing, collectives, view-out) and the compute that makes their gradients.")
  if p.rep then
    w("Micro-steps %d-%d issue the same %s ops each: their rows (micro `%d-%d`) are listed once and run %d times,",
      p.rep.micro_first, p.rep.micro_last, commas(p.rep.n), p.rep.micro_first, p.rep.micro_last, p.rep.times)
    w("each repetition waiting for the latest run of the ops it names (the executor's ops %d-%d).", p.rep.first,
      p.rep.first + p.rep.times * p.rep.n - 1)
  end
  w("")
  w("| # | micro | phase | op | unit | stream | waits for | group |")
  w("|---|---|---|---|---|---|---|---|")
  local items, per_unit = {}, {} -- unit -> its template and signature, computed once (not per op)
  for i, o in ipairs(p.ops) do
    local rel = {}
    for j, s in ipairs(p.arena.waits[o.seq] or {}) do rel[j] = tostring(s - o.seq) end
    local us = per_unit[o.unit]
    if not us then
      us = unit_item(p, o.unit, unit_sig(p.layout.units[o.unit + 1]))
      per_unit[o.unit] = us
    end
    items[i] = { sig = table.concat({ op_text(p, o), o.phase, o.micro_step, o.stream, o.group or "-",
      table.concat(rel, " "), us.sig }, "|"), unit = us.unit, rel = rel }
  end
  for _, run in ipairs(fold.runs(items, 32)) do
    for j = 0, run.period - 1 do
      local first = run.first + j
      local o = p.ops[first]
      if run.reps == 1 then
        local waits = {}
        for k, s in ipairs(p.arena.waits[o.seq] or {}) do waits[k] = tostring(s) end
        w("| %d | %s | %s | %s | %s | %s | %s | %s |", o.seq, micro_text(o), o.phase, op_text(p, o),
          unit_name(p, o.unit), o.stream, table.concat(waits, " "), o.group or "-")
      else
        local last = first + (run.reps - 1) * run.period
        local names = {}
        for r = 0, run.reps - 1 do names[#names + 1] = unit_name(p, p.ops[first + r * run.period].unit) end
        w("| %d-%d/%d | %s | %s | %s | %s | %s | %s | %s |", o.seq, p.ops[last].seq, run.period, micro_text(o),
          o.phase, op_text(p, o), fold.unit_range(names), o.stream, table.concat(items[first].rel, " "),
          o.group or "-")
      end
    end
  end
  w("")
end

function audit.md_timeline(p, a, w)
  local tl = a.timeline
  w("### Predicted timeline")
  w("")
  w("trace.json holds every op's predicted start and duration (Chrome trace events, a track per stream: open")
  w("it in Perfetto; timeline.svg draws them). Compute per unit and micro-step, and the critical path")
  w("(consecutive ops on one stream folded; runs of identical segments folded again):")
  w("")
  w("| unit | forward | backward (with recompute) | activations saved |")
  w("|---|---|---|---|")
  local items = {}
  for i, u in ipairs(p.layout.units) do items[i] = unit_item(p, u.index, unit_sig(u)) end
  for _, row in ipairs(fold.rows(items, 4)) do
    local u = p.layout.units[items[row.first].index + 1]
    local names = {}
    for _, j in ipairs(row.members) do names[#names + 1] = unit_name(p, items[j].index) end
    local r = a.per_unit[u.index]
    w("| %s | %s | %s | %s |", fold.unit_range(names), us_text(r.fwd_us),
      us_text(r.bwd_us + r.recompute_us),
      a.memory.activations_modeled and human(r.saved) or "not modeled")
  end
  w("")
  w("Critical path: runs of ops on one stream, in order; a run of identical cycles (one per unit) is one row.")
  w("Times are in trace.json.")
  w("")
  w("| cycles | units (phase) | critical path |")
  w("|---|---|---|")
  local segs = audit.critical_segments(p, tl)
  local sitems = {}
  for i, sg in ipairs(segs) do
    local fo, lo = p.ops[sg.first + 1], p.ops[sg.last + 1]
    sitems[i] = { sig = table.concat({ sg.stream, fo.kind, fo.phase, lo.kind, sg.n, lo.unit - fo.unit }, "|"),
                  unit = fo.unit }
  end
  -- Consecutive unfolded segments make one row; a folded run its own.
  local pending
  local function flush()
    if not pending then return end
    local phases = pending.phase_a == pending.phase_b and pending.phase_a or (pending.phase_a .. " to " .. pending.phase_b)
    w("| | %s (%s) | %s |", pending.unit_a == pending.unit_b and pending.unit_a or (pending.unit_a .. " .. " .. pending.unit_b),
      phases, table.concat(pending.parts, " -> "))
    pending = nil
  end
  local function seg_text(sg)
    local fo, lo = p.ops[sg.first + 1], p.ops[sg.last + 1]
    return sg.n == 1 and string.format("%s: %s", sg.stream, fo.kind)
      or string.format("%s: %s .. %s (%d ops)", sg.stream, fo.kind, lo.kind, sg.n)
  end
  for _, run in ipairs(fold.runs(sitems, 8)) do
    if run.reps == 1 then
      for j = 0, run.period - 1 do
        local sg = segs[run.first + j]
        local fo, lo = p.ops[sg.first + 1], p.ops[sg.last + 1]
        if not pending then
          pending = { parts = {}, unit_a = unit_name(p, fo.unit), phase_a = fo.phase }
        end
        pending.parts[#pending.parts + 1] = seg_text(sg)
        pending.unit_b, pending.phase_b = unit_name(p, lo.unit), lo.phase
      end
    else
      flush()
      local parts, names = {}, {}
      for j = 0, run.period - 1 do parts[#parts + 1] = seg_text(segs[run.first + j]) end
      for r = 0, run.reps - 1 do
        names[#names + 1] = unit_name(p, p.ops[segs[run.first + r * run.period].first + 1].unit)
      end
      w("| %d x | %s (%s) | %s |", run.reps, fold.unit_range(names), p.ops[segs[run.first].first + 1].phase,
        table.concat(parts, " -> "))
    end
  end
  flush()
  w("")
end

function audit.md_memory_plan(_, w)
  w("### Memory plan")
  w("")
  w("The arena holds every transient buffer at a generated offset (sizes in the memory table above). Event")
  w("waits order every data dependency and every reuse of arena bytes across streams (plan.json:")
  w("units[].arena, ops[].stream, ops[].waits_for). Lifetimes: all-gather buffer copy-in..copy-out,")
  w("unsharded params copy-out..reshard, unsharded grads from the backward's own unshard (else the backward)")
  w("to packing, reduce-scatter input packing..reduce-scatter, output reduce-scatter..view-out. A buffer last used on")
  w("another stream than the ops that would reuse its bytes (the reduce-scatter reading its input) keeps")
  w("them, as FSDP2's caching allocator does, until the predicted step has that stream done with them, so")
  w("no reuse makes an op wait; where the GPU's memory (less the sharded state and activations) is too short")
  w("for that, bytes are reused at once and the summary and warnings name the waits this adds and their")
  w("predicted cost (plan.json: audit.memory_plan).")
  w("")
end

audit.STREAMS = opkinds.STREAMS

return audit
