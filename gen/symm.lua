-- The symmetric window's proof (fsdp.symm_mem, torchtitan's
-- enable_fsdp_symm_mem): every rank of a communicator places each
-- symmetric buffer at the same offset in its window, with the same size,
-- and registers a window of the same size.
--
-- FSDP2 under set_symm_mem_for_comm allocates the all-gather output and
-- the reduce-scatter input and output from symmetric memory and
-- rendezvouses them on the collective's group (torch 2.15
-- _fsdp_collectives.py:89-104, 141-231; gen/memplan.lua SYMM_KINDS); the
-- tables put those buffers in one window at the start of each rank's arena,
-- which runtime/gpu.c allocates with ncclMemAlloc and registers with
-- ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) on every communicator that
-- runs them. NCCL requires both: registration is collective, with an equal
-- size on every rank, and a symmetric collective's buffer at the same offset
-- in every rank's window (NCCL user guide, "Window Registration" and
-- "Symmetric Memory"; tests/emu/emu_nccl.c checks both at run time).
--
-- A rank runs its class's tables (gen/plan.lua: class_of by its pp and TP
-- coordinates). Per class and communicator family, the window's signature
-- is its size and, in op order, every symmetric collective's buffers
-- (unit, kind, offset, bytes); every group of the family must see one
-- signature on all its members. Also per class: the window holds exactly
-- the symmetric buffers, and each is as large as its collective moves.
local groups = require("gen.groups")
local util = require("gen.util")

local symm = {}

local ES = util.DTYPE_BYTES

local function fail(fmt, ...)
  error("internal error (plan verification failed): symmetric window: " .. string.format(fmt, ...), 0)
end

-- The buffers a collective reads or writes in the window, by op kind.
symm.OP_BUFFERS = { all_gather = { "ag" }, reduce_scatter = { "rs_in", "rs_out" } }

-- One class's facts: window bytes, and family name -> { text = its
-- signature }. Checks the class alone.
function symm.class_signatures(cls, fams)
  local ar = cls.arena
  local window = ar.symm and ar.symm.window_bytes or 0
  for _, b in ipairs(ar.buffers) do
    if #b.lives > 0 and b.size > 0 then
      local inside = b.offset + b.size <= window
      if b.symm and not inside then
        fail("%s's %s at [%d, %d) is outside the %d-byte window", b.unit_name, b.kind, b.offset, b.offset + b.size,
          window)
      elseif not b.symm and b.offset < window then
        fail("%s's %s at %d is inside the %d-byte window but not symmetric", b.unit_name, b.kind, b.offset, window)
      end
    end
  end
  local sig = {}
  for _, o in ipairs(cls.ops) do
    local kinds = symm.OP_BUFFERS[o.kind]
    local u = kinds and cls.layout.units[o.unit + 1]
    if u and u.symm then
      local f = fams.by_name[o.group]
      for _, kind in ipairs(kinds) do
        local b = ar.by_unit[u.index][kind]
        if b.symm then
          -- the collective's bytes: the output gathered over the group, the input scattered from it
          local elems = (kind == "rs_out") and o.count or o.count * f.size
          local es = o.dtype == "u8" and 1 or ES[o.dtype]
          if elems * es > b.bytes then
            fail("op %d (%s of %s) moves %d bytes through %s's %d-byte %s", o.seq, o.kind, u.name, elems * es,
              u.name, b.bytes, kind)
          end
          local s = sig[o.group]
          if not s then s = { "window " .. window }; sig[o.group] = s end
          s[#s + 1] = string.format("%s %s %d+%d", u.name, kind, b.offset, b.size)
        end
      end
    end
  end
  local out = {}
  for name, s in pairs(sig) do out[name] = { text = table.concat(s, "; ") } end
  return window, out
end

-- The rank's coordinate along a dense mesh axis (0 where the mesh lacks it).
local function coord(mesh, name, rank)
  local i = mesh.index[name]
  if not i then return 0 end
  return (rank // mesh.strides[i]) % mesh.sizes[i]
end

-- The first difference of two signatures, for the message.
local function first_difference(a, b)
  local pa, pb = {}, {}
  for x in a:gmatch("[^;]+") do pa[#pa + 1] = x end
  for x in b:gmatch("[^;]+") do pb[#pb + 1] = x end
  for i = 1, math.max(#pa, #pb) do
    if pa[i] ~= pb[i] then return (pa[i] or "(nothing)"):gsub("^ ", ""), (pb[i] or "(nothing)"):gsub("^ ", "") end
  end
end

-- p: the plan (gen/plan.lua's: groups, mesh, dims, tp_classes, class_of).
-- Returns the windows' facts for the audit: { classes = { window bytes by
-- class }, families = sorted names }, or nil where no class has a window.
-- class_of_rank (tests): rank -> 1-based class, instead of p.class_of's.
function symm.prove(p, class_of_rank)
  local any = false
  for _, cls in ipairs(p.tp_classes) do any = any or cls.arena.symm ~= nil end
  if not any then return nil end
  local windows, sigs = {}, {}
  for c, cls in ipairs(p.tp_classes) do windows[c], sigs[c] = symm.class_signatures(cls, p.groups) end
  local tp = p.dims.tp or 1
  local function class_of(rank)
    if class_of_rank then return class_of_rank(rank) end
    return p.class_of[coord(p.mesh, "pp", rank) * tp + coord(p.mesh, "tp", rank)]
  end
  local names, seen = {}, {}
  for c = 1, #sigs do
    for name in pairs(sigs[c]) do
      if not seen[name] then seen[name] = true; names[#names + 1] = name end
    end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local f = p.groups.by_name[name]
    for color = 0, f.count - 1 do
      local members = groups.members(f, color)
      local r0 = members[1]
      local c0 = class_of(r0)
      local s0 = sigs[c0][name]
      for k = 2, #members do
        local r = members[k]
        local c = class_of(r)
        local s = sigs[c][name]
        if c ~= c0 and (s and s.text) ~= (s0 and s0.text) then
          local a, b = first_difference(s0 and s0.text or "", s and s.text or "")
          fail("group %s %d: rank %d (class %d) has %s where rank %d (class %d) has %s; NCCL's symmetric "
            .. "collectives need one offset and size on every rank", name, color, r, c - 1, b, r0, c0 - 1, a)
        end
      end
    end
  end
  return { classes = windows, families = names }
end

return symm
