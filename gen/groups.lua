-- Stage 3: process-group families. A family is a set of mesh axes; rank r's
-- group holds the ranks that agree with r on every other axis. The group's
-- color (index among the family's groups) is the row-major index over the
-- other axes and the key (rank inside the group) the row-major index over
-- the family's axes — the same numbers ncclCommSplit takes.
local dims = require("gen.dims")

local groups = {}

local function family(mesh, name, axis_names)
  local axes, in_family, size = {}, {}, 1
  for _, n in ipairs(axis_names) do
    local i = assert(mesh.index[n], n)
    axes[#axes + 1] = i
    in_family[i] = true
    size = size * mesh.sizes[i]
  end
  table.sort(axes)
  local instances = {}
  for rank = 0, mesh.world_size - 1 do
    local c = dims.coords(mesh, rank)
    local color, key = 0, 0
    for i = 1, #mesh.sizes do
      if in_family[i] then key = key * mesh.sizes[i] + c[i] else color = color * mesh.sizes[i] + c[i] end
    end
    local inst = instances[color + 1]
    if not inst then inst = {}; instances[color + 1] = inst end
    inst[key + 1] = rank
  end
  return { name = name, axes = axes, axis_names = axis_names, size = size, instances = instances }
end

-- mesh -> { list = {families in a fixed order}, by_name = {...} }
function groups.build(mesh)
  local list = { family(mesh, "world", mesh.names) }
  for _, n in ipairs(mesh.names) do list[#list + 1] = family(mesh, n, { n }) end
  for _, alias in ipairs(mesh.alias_order) do list[#list + 1] = family(mesh, alias, mesh.aliases[alias]) end
  local by_name = {}
  for i, f in ipairs(list) do f.id = i - 1; by_name[f.name] = f end
  return { list = list, by_name = by_name }
end

-- Does every group of the family sit inside one node of gpus_per_node
-- consecutive ranks?
function groups.intra_node(f, gpus_per_node)
  for _, inst in ipairs(f.instances) do
    if inst[1] // gpus_per_node ~= inst[#inst] // gpus_per_node then return false end
  end
  return true
end

return groups
