-- Stage 3: process-group families. A family is a set of mesh axes; rank r's
-- group holds the ranks that agree with r on every other axis. The group's
-- color (index among the family's groups) is the row-major index over the
-- other axes and the key (rank inside the group) the row-major index over
-- the family's axes — the same numbers ncclCommSplit takes.
--
-- Everything here is closed form: a family is described by its member axes
-- (sizes and rank strides, key = row-major over them) and its color axes
-- (sizes and strides, color = row-major over them), so
--   rank(color, key) = sum(color digit * color stride) + sum(key digit * member stride)
-- and nothing is O(world). f.instances (every group's rank list) is still
-- there for small worlds and tests, built on first use.
local groups = {}

-- Row-major digits of `index` over `sizes`, dotted with `strides`.
local function place(index, sizes, strides)
  local r = 0
  for i = #sizes, 1, -1 do
    r = r + (index % sizes[i]) * strides[i]
    index = index // sizes[i]
  end
  return r
end

-- Global rank of the member with key `key` of the group with color `color`.
-- A part family (groups.add_part: f.inner consecutive members of each of
-- its parent's groups): color c is block c % blocks of the parent's group
-- c // blocks, and its key k the parent's key block * inner + k.
function groups.rank(f, color, key)
  if f.inner then
    local blocks = f.parent.size // f.inner
    return groups.rank(f.parent, color // blocks, (color % blocks) * f.inner + key)
  end
  return place(color, f.color_sizes, f.color_strides) + place(key, f.member_sizes, f.member_strides)
end

-- One group's ranks (O(group size)).
function groups.members(f, color)
  if f.inner then
    local out = {}
    for k = 0, f.size - 1 do out[k + 1] = groups.rank(f, color, k) end
    return out
  end
  local base, out = place(color, f.color_sizes, f.color_strides), {}
  for k = 0, f.size - 1 do out[k + 1] = base + place(k, f.member_sizes, f.member_strides) end
  return out
end

-- Every group's rank list: O(world). Only for small worlds (tests, tools).
local function all_instances(f)
  local t = {}
  for c = 0, f.count - 1 do t[c + 1] = groups.members(f, c) end
  return t
end

local Family = {}
Family.__index = function(f, k)
  if k == "instances" then
    local t = all_instances(f)
    rawset(f, "instances", t)
    return t
  end
  return nil
end

local function family(mesh, name, axis_names)
  local axes, in_family, size = {}, {}, 1
  for _, n in ipairs(axis_names) do
    local i = assert(mesh.index[n], n)
    axes[#axes + 1] = i
    in_family[i] = true
    size = size * mesh.sizes[i]
  end
  table.sort(axes)
  local member_sizes, member_strides, color_sizes, color_strides = {}, {}, {}, {}
  for i = 1, #mesh.sizes do
    if in_family[i] then
      member_sizes[#member_sizes + 1] = mesh.sizes[i]; member_strides[#member_strides + 1] = mesh.strides[i]
    else
      color_sizes[#color_sizes + 1] = mesh.sizes[i]; color_strides[#color_strides + 1] = mesh.strides[i]
    end
  end
  return setmetatable({ name = name, axes = axes, axis_names = axis_names, size = size,
    count = mesh.world_size // size, member_sizes = member_sizes, member_strides = member_strides,
    color_sizes = color_sizes, color_strides = color_strides }, Family)
end

-- mesh -> { list = {families in a fixed order}, by_name = {...} }: the
-- world, every dim of the dense mesh, its flattened aliases, and with
-- ep > 1 the expert mesh's ep and efsdp (gen/dims.lua's sparse mesh, as
-- torchtitan 0.3's "ep" and "efsdp" meshes; their axes index mesh.sparse,
-- and f.sparse says so).
function groups.build(mesh)
  local list = { family(mesh, "world", mesh.names) }
  for _, n in ipairs(mesh.names) do list[#list + 1] = family(mesh, n, { n }) end
  for _, alias in ipairs(mesh.alias_order) do list[#list + 1] = family(mesh, alias, mesh.aliases[alias]) end
  if mesh.sparse then
    for _, n in ipairs({ "ep", "efsdp" }) do
      local f = family(mesh.sparse, n, { n })
      f.sparse = true
      list[#list + 1] = f
    end
  end
  local by_name = {}
  for i, f in ipairs(list) do f.id = i - 1; by_name[f.name] = f end
  return { list = list, by_name = by_name }
end

-- A family of `inner` consecutive members of each group of the family
-- `parent_name` (FSDP2's post-forward groups: the rows of the shard mesh
-- viewed as (-1, inner), torch 2.15 _fsdp_init.py:186-194), added once
-- under `name` after the mesh's families. Its axes are its parent's (the
-- C tables' axis mask, with inner: runtime/topology.c).
function groups.add_part(fams, parent_name, inner, name)
  if fams.by_name[name] then return fams.by_name[name] end
  local parent = assert(fams.by_name[parent_name], parent_name)
  assert(inner > 1 and parent.size % inner == 0 and inner < parent.size, "internal: a part family's size")
  local f = setmetatable({ name = name, parent = parent, inner = inner, axes = parent.axes,
    axis_names = parent.axis_names, size = inner, count = parent.count * (parent.size // inner),
    member_sizes = parent.member_sizes, member_strides = parent.member_strides,
    color_sizes = parent.color_sizes, color_strides = parent.color_strides, sparse = parent.sparse }, Family)
  fams.list[#fams.list + 1] = f
  f.id = #fams.list - 1
  fams.by_name[name] = f
  return f
end

-- A part family's blocks inside its parent's group of color 0: each
-- { off = its first rank's offset from the group's first, span }.
local function part_blocks(f)
  local out = {}
  for b = 0, f.parent.size // f.inner - 1 do
    local lo = groups.rank(f.parent, 0, b * f.inner)
    out[#out + 1] = { off = lo - groups.rank(f.parent, 0, 0),
                      span = groups.rank(f.parent, 0, b * f.inner + f.inner - 1) - lo }
  end
  return out
end

-- Span of one group: its last rank minus its first (every stride is
-- positive, so key 0 is the lowest rank and the last key the highest).
function groups.span(f)
  if f.inner then
    local s = 0
    for _, b in ipairs(part_blocks(f)) do s = math.max(s, b.span) end
    return s
  end
  local s = 0
  for i, n in ipairs(f.member_sizes) do s = s + (n - 1) * f.member_strides[i] end
  return s
end

-- The residues mod m of every group's first rank (its base), as a set;
-- at most m entries, built axis by axis in O(axes * m * min(size, m)).
local function base_residues(f, m)
  local set = { [0] = true }
  for i, n in ipairs(f.color_sizes) do
    local step, next_set = f.color_strides[i] % m, {}
    -- c * step mod m repeats with period m / gcd(step, m) <= m.
    local distinct = math.min(n, m)
    for r in pairs(set) do
      for c = 0, distinct - 1 do next_set[(r + c * step) % m] = true end
    end
    set = next_set
  end
  return set
end

-- Does every group of the family sit inside one node of gpus_per_node
-- consecutive ranks? Closed form: group c spans [base(c), base(c) + span],
-- inside one node iff base(c) mod g + span < g for every color.
function groups.intra_node(f, gpus_per_node)
  if f.inner then
    for r in pairs(base_residues(f.parent, gpus_per_node)) do
      for _, b in ipairs(part_blocks(f)) do
        if (r + b.off) % gpus_per_node + b.span >= gpus_per_node then return false end
      end
    end
    return true
  end
  local g, span = gpus_per_node, groups.span(f)
  if span >= g then return false end
  for r in pairs(base_residues(f, g)) do
    if r + span >= g then return false end
  end
  return true
end

-- Nodes one group touches (the most over all groups): its ranks lie in
-- [base, base + span], so at most (base mod g + span) // g + 1 nodes, and
-- at most one node per member (exact for the mesh's groups: contiguous or
-- node-strided ranks).
function groups.nodes_spanned(f, gpus_per_node)
  if f.inner then
    local worst = 0
    for r in pairs(base_residues(f.parent, gpus_per_node)) do
      for _, b in ipairs(part_blocks(f)) do
        worst = math.max(worst, ((r + b.off) % gpus_per_node + b.span) // gpus_per_node + 1)
      end
    end
    return math.min(f.size, worst)
  end
  local g, span = gpus_per_node, groups.span(f)
  local worst = 0
  for r in pairs(base_residues(f, g)) do worst = math.max(worst, (r + span) // g + 1) end
  return math.min(f.size, worst)
end

return groups
