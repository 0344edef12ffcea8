-- Renders plan.h and plan.c from templates/ with the plan's tables.
local util = require("gen.util")
local memplan = require("gen.memplan")
local opkinds = require("gen.opkinds")
local rep_mod = require("gen.repeat")

local emit = {}

local DT = { fp32 = "CP_FP32", bf16 = "CP_BF16", fp16 = "CP_FP16", u8 = "CP_U8" }
local RED = { sum = "CP_SUM", avg = "CP_AVG", max = "CP_MAX", premul_sum = "CP_PREMUL_SUM" }
local BUF = { "CP_BUF_AG", "CP_BUF_UNSHARDED", "CP_BUF_GRADS", "CP_BUF_RS_IN", "CP_BUF_RS_OUT", "CP_BUF_ACT",
              "CP_BUF_PARTIAL", "CP_BUF_PP", "CP_BUF_A2A_COUNTS", "CP_BUF_A2A_SEND", "CP_BUF_A2A_RECV",
              "CP_BUF_H2D", "CP_BUF_D2H", "CP_BUF_POST_FORWARD" } -- memplan.KINDS order

-- The runtime table layout these tables are written for (runtime/commplan.h
-- CP_TABLES_VERSION); plan.c refuses to compile against any other.
emit.TABLES_VERSION = 10

-- Replace every {{key}}; a key the template names but vars lacks is a bug.
function emit.fill(template, vars, template_name)
  return (template:gsub("{{([%w_]+)}}", function(k)
    local v = vars[k]
    if v == nil then error("template " .. template_name .. " uses unknown {{" .. k .. "}}", 0) end
    return tostring(v)
  end))
end

-- C string literals and comment text correct for any bytes (gen/util.lua).
local cstr = util.c_string

local function num(v)
  if math.type(v) == "integer" then return tostring(v) end
  return string.format("%.17g", v)
end

-- An optional integer field of the plan (pipeline parallelism's: the pp
-- modules set them, every other plan leaves them out): its value, or
-- default when absent; anything but an integer from min up is a bug.
local function opt_int(v, default, min, what)
  if v == nil then return default end
  if math.type(v) ~= "integer" or v < min then
    error(string.format("internal: %s is %s, not an integer >= %d", what, tostring(v), min), 0)
  end
  return v
end

-- The unit's transient buffers' offsets in the rank's arena.
local function arena_offsets(arena, u)
  local t = {}
  for i, kind in ipairs(memplan.KINDS) do
    local b = arena.by_unit[u.index][kind]
    -- expert parallelism's buffers only where the unit has them (C's zero default)
    if i <= 8 or b.bytes > 0 then t[#t + 1] = string.format("[%s] = %d", BUF[i], b.offset) end
  end
  return table.concat(t, ", ")
end

-- "field = value" pairs of a designated initializer.
local function fields(list)
  local t = {}
  for i = 1, #list, 2 do t[#t + 1] = "." .. list[i] .. " = " .. tostring(list[i + 1]) end
  return table.concat(t, ", ")
end

-- C identifiers of names, each made once per render: plan.h's enums and
-- plan.c's rows both name every unit and parameter.
local function idents()
  return setmetatable({}, { __index = function(t, name) local id = util.c_ident(name); t[name] = id; return id end })
end

-- One TP class's tables (layout, ops, waits) as C rows. Parameter and
-- unit rows are indexed by the plan's enumerators, so a row cannot drift
-- from the name the header gives it. ident: idents().
local function class_tables(p, cls, NAME, cls_suffix, ident)
  local lay, arena = cls.layout, cls.arena
  local ul, pl = {}, {}
  local pidx = 0
  for _, u in ipairs(lay.units) do
    local numel = 0
    for _, q in ipairs(u.params) do
      local shape = {}
      for i, d in ipairs(q.shape) do shape[i] = tostring(d) end
      -- (what fields() would write, in one format: a row per parameter)
      local row = string.format(".name = %s, .ndim = %s, .shape = { %s }, .shard_dim = %s, .numel = %s, .chunk = %s, "
        .. ".outer = %s, .run = %s, .padded = %s, .offset = %s, .grad_offset = %s", cstr(q.name), #q.shape,
        table.concat(shape, ", "), q.shard_dim, q.numel, q.chunk, q.outer, q.run, q.padded, q.offset, q.grad_offset)
      if u.ag_bytes then
        -- mixed all-gather dtypes (runtime/commplan.h): this parameter's dtype and byte offset in the slot
        row = row .. string.format(", .ag_dtype = %s, .ag_offset = %s, .unsharded_offset = %s", DT[q.ag_dtype],
          q.ag_offset, q.unsharded_offset)
      end
      if u.nfrozen then
        -- frozen parameters (requires_grad=False, runtime/commplan.h): the reduce-scatter row's layout
        row = row .. string.format(", .frozen = %d, .rs_offset = %s", q.frozen and 1 or 0, q.rs_offset)
      end
      if q.ep_chunk then
        -- expert parallelism: the experts' dim 0 split over ep (runtime/commplan.h:
        -- the unit's split_family key picks the rows, as the TP coordinate does)
        row = row .. string.format(", .tp_sharded = 1, .tp_dim = 0, .tp_full = %s, .tp_chunk = %s, .full_numel = %s",
          q.ep_full, q.ep_chunk, q.numel // q.shape[1] * q.ep_full)
      elseif q.tp_dim then
        row = row .. string.format(", .tp_sharded = 1, .tp_dim = %s, .tp_full = %s, .tp_chunk = %s, .full_numel = %s",
          q.tp_dim, q.full_shape[q.tp_dim + 1], q.tp_chunk, q.full_numel)
      end
      -- a pipeline rank's class holds its own stages' units: rows by index
      -- (plan.h's enums name pipeline rank 0's, class 0's)
      pl[#pl + 1] = p.pp and string.format("    [%d] = { %s },", pidx, row)
        or string.format("    [%s_PARAM_%s] = { %s },", NAME, ident[q.name], row)
      numel = numel + q.numel
      pidx = pidx + 1
    end
    ul[#ul + 1] = string.format("    [%s] = {\n        %s,\n        %s,\n        %s,\n        %s,\n        %s },",
      p.pp and tostring(u.index) or (NAME .. "_UNIT_" .. ident[u.name]),
      fields({ "name", cstr(u.name), "first_param", pidx - #u.params, "nparams", #u.params }),
      fields({ "total", u.total, "numel", numel, "grads_numel", u.grads_numel }),
      fields({ "orig_dtype", DT[u.orig_dtype], "ag_dtype", DT[u.ag_dtype], "reduce_dtype", DT[u.reduce_dtype],
               "grad_dtype", DT[u.grad_dtype], "is_root", u.is_root and 1 or 0, "reshard_after_forward", u.reshard_after_forward and 1 or 0 }),
      fields({ "rs_op", RED[u.rs_op], "ar_op", RED[u.ar_op], "pre_divide", num(u.pre_divide * 1.0),
               "post_divide", num(u.post_divide * 1.0), "vec_ok", u.vec_ok and 1 or 0,
               "act_numel", u.act_numel or 0, "partial_numel", u.partial and u.rs_total or 0,
               "pp_numel", opt_int(u.pp_numel, 0, 0, "unit " .. u.name .. "'s pp_numel") })
        -- expert parallelism (runtime/commplan.h): only on units with all-to-alls
        .. (u.a2a_numel and ", " .. fields({ "a2a_numel", opt_int(u.a2a_numel, 0, 0, "unit " .. u.name .. "'s a2a_numel"),
               "a2a_slots", opt_int(u.a2a_slots, 0, 0, "unit " .. u.name .. "'s a2a_slots"),
               "a2a_experts", opt_int(u.a2a_experts, 0, 0, "unit " .. u.name .. "'s a2a_experts") }) or "")
        -- mixed all-gather dtypes: the slot's bytes (FSDP2's uint8 all-gather input)
        .. (u.ag_bytes and ", " .. fields({ "ag_bytes", u.ag_bytes, "unsharded_bytes", u.unsharded_bytes }) or "")
        -- expert parallelism's experts: their own FSDP group (efsdp), rows split over ep
        .. (u.expert and ", " .. fields({ "expert", 1,
               "shard_family", u.W > 1 and p.groups.by_name[u.shard_group].id or -1, "shard_size", u.W,
               "split_family", p.groups.by_name.ep.id }) or "")
        -- set_gradient_divide_factor's PREMUL_SUM: its factor (C's zero default: none)
        .. (u.premul and ", " .. fields({ "premul_factor", num(u.premul * 1.0) }) or "")
        -- CPUOffloadPolicy: only on offloading units (C's zero default elsewhere)
        .. (u.offload and ", " .. fields({ "offload", 1, "pin_memory", u.pin_memory and 1 or 0 }) or "")
        -- fully_shard(reshard_after_forward=k): k and its post-forward family (C's zero default elsewhere)
        .. (u.post_forward and ", " .. fields({ "post_forward", u.post_forward.k,
               "post_forward_family", p.groups.by_name[u.post_forward.group].id }) or "")
        -- frozen parameters: how many and the reduce-scatter row (C's zero default: none, total)
        .. (u.nfrozen and ", " .. fields({ "nfrozen", u.nfrozen, "rs_total", u.rs_total }) or "")
        -- set_unshard_in_backward(False) on a resharded unit (C's zero default: backward on unsharded)
        .. (u.sharded_backward and ", " .. fields({ "sharded_backward", 1 }) or ""),
      fields({ "arena_offset", "{ " .. arena_offsets(arena, u) .. " }" }))
  end
  -- Ops whose completion a later op waits on get an event slot; an op's
  -- waits are a run of slots in the waits table.
  local ol, wl = {}, {}
  local slot, nslots = rep_mod.slots(arena.events, cls.rep)
  -- One format per row (what fields() would write): a step holds units x
  -- micro-steps of them.
  local kind_c, stream_c, NONE = {}, {}, {}
  for _, d in ipairs(opkinds.LIST) do kind_c[d.name] = "CP_OP_" .. d.name:upper() end
  for _, name in ipairs(opkinds.STREAMS) do stream_c[name] = "CP_STREAM_" .. name:upper() end
  local fmt = string.format
  -- A repeated micro-step (gen/repeat.lua): its rows once, in a macro
  -- that the table invokes once per repetition (index and micro-step
  -- moved along); rows after it move by the repetitions.
  local rep = cls.rep
  local macro = rep and fmt("%s_OPS%s_REPEAT", NAME, cls_suffix)
  local shift = rep and (rep.times - 1) * rep.n or 0
  for _, o in ipairs(cls.ops) do
    local fam = o.group and p.groups.by_name[o.group].id or -1
    local waits = arena.waits[o.seq] or NONE
    local nw = #waits
    local in_run = rep and o.seq >= rep.first and o.seq < rep.first + rep.n
    if in_run and o.seq == rep.first then
      ol[#ol + 1] = fmt("    /* micro-steps %d .. %d: the same %d ops each, these rows run %d times */",
        rep.micro_first, rep.micro_last, rep.n, rep.times)
      ol[#ol + 1] = fmt("#define %s(k) \\", macro)
    end
    local index = in_run and fmt("%d + (k) * %d", o.seq, rep.n) or tostring(rep and o.seq >= rep.first + rep.n
      and o.seq + shift or o.seq)
    local kind, stream = kind_c[o.kind] or ("CP_OP_" .. o.kind:upper()),
      stream_c[o.stream] or ("CP_STREAM_" .. o.stream:upper())
    local micro = in_run and fmt("%d + (k)", o.micro_step) or o.micro_step
    local tail = in_run and o.seq < rep.first + rep.n - 1 and " \\" or ""
    local event, first = slot[o.seq] or -1, nw > 0 and #wl or 0
    local direct = o.from_sharded and ", .from_sharded = 1" or ""
    if o.premul then direct = direct .. ", .premul_factor = " .. num(o.premul * 1.0) end
    -- the all-gather over a post-forward group and its copy-out (runtime/commplan.h)
    if o.post_forward then direct = direct .. ", .post_forward = 1" end
    -- a partial reduction (and its compute): the unit's parameters part_first ..
    -- part_first + part_count - 1; C's zero default (part_count 0) is the whole unit
    if o.part_first then
      direct = direct .. fmt(", .part_first = %d, .part_count = %d", opt_int(o.part_first, 0, 0, "op part_first"),
        opt_int(o.part_count, 1, 1, "op part_count"))
    end
    -- point-to-point (gen/parallel/pp_*.lua): peer -1 on every other op;
    -- batch and tag are 0 unless set (C's zero default keeps rows short)
    local p2p = o.peer and fmt(", .peer = %d, .batch = %d, .tag = %d", opt_int(o.peer, -1, -1, "op " .. o.seq .. "'s peer"),
      opt_int(o.batch, 0, 0, "op " .. o.seq .. "'s batch"), opt_int(o.tag, 0, 0, "op " .. o.seq .. "'s tag"))
      or ", .peer = -1"
    -- expert parallelism (a2a_counts / a2a ops): the counts op by its row's
    -- index, and the counts slot, shifted like the micro-step in a repeated run
    if o.a2a_experts then
      local c = o.a2a_counts_op or -1
      local c_in_run = rep and c >= rep.first and c < rep.first + rep.n
      local c_index = c < 0 and "-1" or c_in_run and fmt("%d + (k) * %d", c, rep.n)
        or tostring(rep and c >= rep.first + rep.n and c + shift or c)
      local a2a_slot = in_run and fmt("%d + (k)", o.a2a_slot or 0) or tostring(o.a2a_slot or 0)
      p2p = p2p .. fmt(", .a2a_experts = %d, .a2a_slot = %s, .a2a_counts_op = %s, .a2a_combine = %d, .a2a_dim = %d, "
        .. ".a2a_capacity = %d, .a2a_rows = %d", opt_int(o.a2a_experts, 1, 1, "op " .. o.seq .. "'s a2a_experts"), a2a_slot,
        c_index, (o.a2a_combine == true or o.a2a_combine == 1) and 1 or 0, opt_int(o.a2a_dim, 1, 1, "op " .. o.seq .. "'s a2a_dim"),
        opt_int(o.a2a_capacity, 0, 0, "op " .. o.seq .. "'s a2a_capacity"), opt_int(o.a2a_rows, 0, 0, "op " .. o.seq .. "'s a2a_rows"))
    end
    if o.group or o.count then
      ol[#ol + 1] = fmt("    [%s] = { .kind = %s, .unit = %s, .family = %s, .stream = %s, .dtype = %s, .count = %s, "
        .. ".reduce_op = %s, .micro_step = %s, .event = %s, .wait_first = %s, .wait_count = %s%s%s },%s", index, kind,
        o.unit, fam, stream, DT[o.dtype], o.count, RED[o.reduce_op or "sum"], micro, event, first, nw, direct, p2p,
        tail)
    else
      ol[#ol + 1] = fmt("    [%s] = { .kind = %s, .unit = %s, .family = %s, .stream = %s, .micro_step = %s, "
        .. ".event = %s, .wait_first = %s, .wait_count = %s%s%s },%s", index, kind, o.unit, fam, stream, micro, event,
        first, nw, direct, p2p, tail)
    end
    for _, w in ipairs(waits) do wl[#wl + 1] = tostring(slot[w]) end
    if in_run and o.seq == rep.first + rep.n - 1 then
      for k = 0, rep.times - 1 do ol[#ol + 1] = fmt("    %s(%d)", macro, k) end
      ol[#ol + 1] = "#undef " .. macro
    end
  end
  return { params = table.concat(pl, "\n"), units = table.concat(ul, "\n"), ops = table.concat(ol, "\n"),
           nunits = #lay.units,
           waits = #wl > 0 and table.concat(wl, ", ") or "-1 /* none */", nwaits = #wl,
           nevents = nslots, arena_bytes = arena.arena_bytes, nparams = pidx,
           symm_bytes = arena.symm and arena.symm.window_bytes or 0,
           nops = rep_mod.executed_count(cls.ops, cls.rep) }
end

-- The C declarations of TP classes 1.. (class 0's tables are plan.c's
-- params, units, ops and waits above them).
local CLASS_TEMPLATE = [[

/* TP class {{c}} (TP ranks {{coords}}): the same tables for its TP-local shapes. */
static const cp_param params_{{c}}[{{nparams}}] = {
{{params}}
};
static const cp_unit units_{{c}}[{{nunits}}] = {
{{units}}
};
static const cp_op ops_{{c}}[{{nops}}] = {
{{ops}}
};
static const int waits_{{c}}[{{nwaits_storage}}] = { {{waits}} };
]]

-- With ep > 1 and tp > 1 or cp > 1 the C mesh is the common refinement of the dense
-- mesh and the expert mesh over the same ranks (row-major both, the
-- outer pp and dp_replicate alike): the ranks of one dp_shard*cp*tp block
-- cut at every stride either mesh has there (tp's, cp's, ep's and
-- efsdp's), so that every family of either mesh -- the dense dp_shard and
-- tp, the expert ep and efsdp -- is a set of whole axes (its axis_mask).
-- The strides must divide one another (gen/parallel/ep.lua asks ep to be
-- a multiple or a divisor of tp; gen/parallel/cp.lua that ep and cp x tp
-- nest): tp stays one axis, or with ep groups inside TP's a span of
-- consecutive axes (the runtime's TP coordinate, plan.c's tp_mesh_dim: see
-- emit.vars).
-- Returns { names, sizes, covers = { [dense or expert dim name] = {axis
-- indices, 1-based} } }.
function emit.refined_mesh(mesh)
  local sp = mesh.sparse
  local block = mesh.world_size
  local names, sizes, covers = {}, {}, {}
  -- the outer axes, each the same in both meshes
  for _, n in ipairs({ "pp", "dp_replicate" }) do
    local i = mesh.index[n]
    if i then
      names[#names + 1], sizes[#sizes + 1] = n, mesh.sizes[i]
      covers[n] = { #names }
      block = block // mesh.sizes[i]
    end
  end
  local cuts, seen = {}, {}
  local function cut(x) if not seen[x] then seen[x] = true; cuts[#cuts + 1] = x end end
  cut(1); cut(block)
  local spans = {} -- dim name -> { lo stride, hi stride }
  for _, m in ipairs({ mesh, sp }) do
    for i, n in ipairs(m.names) do
      if n ~= "pp" and n ~= "dp_replicate" then
        cut(m.strides[i]); cut(m.strides[i] * m.sizes[i])
        spans[n] = { m.strides[i], m.strides[i] * m.sizes[i] }
      end
    end
  end
  table.sort(cuts, function(a, b) return a > b end)
  local first = #names
  for j = 1, #cuts - 1 do
    local hi, lo = cuts[j], cuts[j + 1]
    if hi % lo ~= 0 then
      error(string.format("internal: the expert mesh's strides %d and %d do not nest", hi, lo), 0)
    end
    local label = {}
    for _, n in ipairs({ "dp_shard", "cp", "tp", "efsdp", "ep" }) do
      local s = spans[n]
      if s and lo >= s[1] and hi <= s[2] then label[#label + 1] = n end
    end
    names[#names + 1], sizes[#sizes + 1] = table.concat(label, "."), hi // lo
  end
  for n, s in pairs(spans) do
    covers[n] = {}
    for i = first + 1, #names do
      local lo = 1
      for k = i + 1, #names do lo = lo * sizes[k] end
      if lo >= s[1] and lo * sizes[i] <= s[2] then table.insert(covers[n], i) end
    end
  end
  return { names = names, sizes = sizes, covers = covers }
end

function emit.vars(p, fp)
  local NAME = p.name:upper()
  local lay = p.layout
  local v = { header = util.c_comment("generated by commplan from " .. p.source_file .. "; do not edit."),
              fingerprint = fp,
              name = p.name, NAME = NAME, world_size = p.world_size, shard_size = lay.W, replicate_size = lay.R,
              micro_steps = p.fsdp.micro_steps, tables_version = emit.TABLES_VERSION,
              -- the C enums' sizes, checked against runtime/commplan.h when plan.c compiles
              op_kinds = #opkinds.LIST, streams = #opkinds.STREAMS, arena_buffers = #memplan.KINDS }
  local ue, pe, ident = {}, {}, idents()
  local pidx = 0
  for _, u in ipairs(lay.units) do
    ue[#ue + 1] = string.format("    %s_UNIT_%s = %d,", NAME, ident[u.name], u.index)
    for _, q in ipairs(u.params) do
      pe[#pe + 1] = string.format("    %s_PARAM_%s = %d,", NAME, ident[q.name], pidx)
      pidx = pidx + 1
    end
  end
  local ge, fl = {}, {}
  -- With ep > 1 the C mesh is the expert mesh (gen/dims.lua's sparse mesh:
  -- dp_shard split into efsdp x ep, ep innermost, row-major over the same
  -- ranks; with tp or cp the mesh both refine, emit.refined_mesh): a dense family's dp_shard axis is
  -- efsdp and ep there, and ep and efsdp (f.sparse) index it already.
  local cmesh = p.mesh.sparse or p.mesh
  local refined = p.mesh.sparse and (p.dims.tp > 1 or p.dims.cp > 1) and emit.refined_mesh(p.mesh) or nil
  if refined then cmesh = refined end
  local function axis_bits(f)
    local mask = 0
    if refined then
      local from = f.sparse and p.mesh.sparse or p.mesh
      for _, a in ipairs(f.axes) do
        for _, i in ipairs(refined.covers[from.names[a]]) do mask = mask | (1 << (i - 1)) end
      end
      return mask
    end
    if not p.mesh.sparse or f.sparse then
      for _, a in ipairs(f.axes) do mask = mask | (1 << (a - 1)) end
      return mask
    end
    for _, a in ipairs(f.axes) do
      local name = p.mesh.names[a]
      local into = name == "dp_shard" and { "efsdp", "ep" } or { name }
      for _, n in ipairs(into) do
        local i = cmesh.index[n]
        if not i then error("internal: mesh axis " .. name .. " has no place in the expert mesh", 0) end
        mask = mask | (1 << (i - 1))
      end
    end
    return mask
  end
  for _, f in ipairs(p.groups.list) do
    ge[#ge + 1] = string.format("    %s_GROUP_%s = %d,", NAME, util.c_ident(f.name), f.id)
    local mask = axis_bits(f)
    fl[#fl + 1] = string.format("    [%s_GROUP_%s] = { %s },", NAME, util.c_ident(f.name),
      fields({ "name", cstr(f.name), "axis_mask", string.format("0x%xu", mask), "size", f.size,
               -- a part family (gen/groups.lua add_part): inner consecutive keys of the masked axes
               f.inner and "inner" or nil, f.inner }))
  end
  local classes = p.tp_classes
  local c0 = class_tables(p, classes[1], NAME, "", ident)
  v.params, v.units, v.ops, v.waits = c0.params, c0.units, c0.ops, c0.waits
  v.nevents, v.arena_bytes, v.nwaits, v.nwaits_storage = c0.nevents, c0.arena_bytes, c0.nwaits, math.max(c0.nwaits, 1)
  -- fsdp.symm_mem: class 0's window, a field only where there is one (plans without keep their bytes)
  v.symm_bytes_field = c0.symm_bytes > 0 and string.format("\n    .symm_bytes = %d,", c0.symm_bytes) or ""
  local extra, rows = {}, {}
  for c, cls in ipairs(classes) do
    local t = c == 1 and c0 or class_tables(p, cls, NAME, "_" .. (c - 1), ident)
    local suffix = c == 1 and "" or ("_" .. (c - 1))
    if c > 1 then
      extra[#extra + 1] = emit.fill(CLASS_TEMPLATE, { c = c - 1, coords = table.concat(cls.coords, ", "),
        nparams = t.nparams, nunits = t.nunits, nops = t.nops, params = t.params, units = t.units, ops = t.ops,
        nwaits_storage = math.max(t.nwaits, 1), waits = t.waits }, "class tables")
    end
    local row = { "units", "units" .. suffix, "params", "params" .. suffix,
      "ops", "ops" .. suffix, "waits", "waits" .. suffix, "nwaits", t.nwaits, "nevents", t.nevents,
      "arena_bytes", t.arena_bytes, "nunits", t.nunits, "nparams", t.nparams, "nops", t.nops }
    -- fsdp.symm_mem: the class's symmetric window (C's zero default without one)
    if t.symm_bytes > 0 then row[#row + 1], row[#row + 2] = "symm_bytes", t.symm_bytes end
    rows[#rows + 1] = string.format("    { %s },", fields(row))
  end
  v.class_tables = table.concat(extra)
  v.classes = table.concat(rows, "\n")
  v.nclasses = #classes
  -- Pipeline parallelism (p.pp = { size, mesh_dim, family }, set by the pp
  -- modules): 1, -1, -1 without it.
  local pp = p.pp or {}
  local pp_size = opt_int(pp.size, 1, 1, "pp.size")
  v.pp_size = pp_size
  v.pp_mesh_dim = opt_int(pp.mesh_dim, -1, -1, "pp.mesh_dim")
  v.pp_family = opt_int(pp.family, -1, -1, "pp.family")
  -- A rank's class by its (pp, TP) coordinates, [pp * tp_size + tp]: the
  -- plan's class_of (1-based classes, gen/plan.lua).
  local of, tp = {}, p.dims.tp
  for i = 0, pp_size * tp - 1 do
    local c = p.class_of[i]
    c = opt_int(c, nil, 1, "class_of[" .. i .. "]")
    if c > #classes then error(string.format("internal: class_of[%d] is %d of %d classes", i, c, #classes), 0) end
    of[#of + 1] = tostring(c - 1)
  end
  v.class_of, v.nclass_of, v.tp_size = table.concat(of, ", "), #of, tp
  v.tp_mesh_dim = p.mesh.index.tp and (p.mesh.index.tp - 1) or -1
  if refined and refined.covers.tp then
    -- tp is one axis of the refined mesh, or (ep groups inside TP's) consecutive axes from t[1]:
    -- the runtime's cp_tp_rank reads -2 - t[1] as that span
    local t = refined.covers.tp
    for i = 2, #t do
      if t[i] ~= t[i - 1] + 1 then error("internal: tp spans non-consecutive axes of the refined expert mesh", 0) end
    end
    v.tp_mesh_dim = #t == 1 and t[1] - 1 or -2 - (t[1] - 1)
  end
  local mn, ms = {}, {}
  for i, n in ipairs(cmesh.names) do mn[i] = cstr(n); ms[i] = tostring(cmesh.sizes[i]) end
  local shard = p.groups.by_name.fsdp
  v.unit_enum, v.param_enum, v.group_enum = table.concat(ue, "\n"), table.concat(pe, "\n"), table.concat(ge, "\n")
  v.families = table.concat(fl, "\n")
  v.nunits, v.nparams, v.nfamilies, v.nops = #lay.units, pidx, #p.groups.list, c0.nops
  v.mesh_ndim, v.mesh_names, v.mesh_sizes = #cmesh.names, table.concat(mn, ", "), table.concat(ms, ", ")
  v.shard_family = (shard and shard.size > 1) and shard.id or -1
  v.replicate_family = p.groups.by_name.dp_replicate and p.groups.by_name.dp_replicate.id or -1
  return v
end

function emit.render(p, fp, templates)
  local v = emit.vars(p, fp)
  return {
    ["plan.h"] = emit.fill(templates["plan.h.in"], v, "plan.h.in"),
    ["plan.c"] = emit.fill(templates["plan.c.in"], v, "plan.c.in"),
    ["plan_kernels.cu"] = emit.fill(templates["plan_kernels.cu.in"], v, "plan_kernels.cu.in"),
  }
end

return emit
