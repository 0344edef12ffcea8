-- commplan's dims stage over a batch of meshes, for the ParallelDims
-- agreement test (tests/titan/test_parallel_dims.py): one process for all.
--
--   lua5.4 tests/titan/dims_dump.lua <meshes.txt
--
-- stdin: one mesh a line, "id world dp_replicate dp_shard cp tp pp ep etp",
-- each degree an integer or "-" (not given). stdout: one JSON object a line,
-- in input order:
--   { id, ok, stage ("dims": gen/dims.lua's infer refused; "supported": the
--     generator's check_supported refused; absent when accepted), msg,
--     degrees (resolved; efsdp 0 when ep = 1), mesh { names, sizes, strides } (the
--     dense mesh), sparse (with ep > 1 only: the expert mesh { names, sizes,
--     strides }), aliases [[name, [axes]]],
--     groups [ { name, axes, size, count, and either ranks (every group's rank
--     list in color order, world <= FULL) or s1, s2, s3 (checksums over every
--     group) and samples [[rank, first 32 ranks of its group, the rest's last 32]] } ] }
-- The generator's own code decides everything: dims.infer, plan.check_supported
-- (with the modules' check_dims: cp beside tp, pp or ep), dims.mesh and groups.build, as gen/plan.lua runs
-- them (pp and ep are taken there; their modules refuse to generate later,
-- in their rules, which this does not run).
local script_dir = arg and arg[0] and arg[0]:match("^(.*)/tests/titan/[^/]*$") or "."
package.path = script_dir .. "/?.lua;" .. package.path

local dims = require("gen.dims")
local groups = require("gen.groups")
local plan = require("gen.plan")
local json = require("gen.json")
local util = require("gen.util")

local FULL = 4096 -- worlds up to this print every group's ranks

-- The sample ranks for big worlds; test_parallel_dims.py computes the same.
local function sample_ranks(w)
  local out, seen = {}, {}
  local function add(r) if not seen[r] then seen[r] = true; out[#out + 1] = r end end
  add(0); add(w - 1); add(w // 2)
  for i = 1, 29 do add((i * 2654435761 + 12345) % w) end
  return out
end

-- The color (group index) of rank r in family f: row-major over its color
-- axes (those of the mesh it is built on: the dense one, or the expert mesh
-- for ep and efsdp).
local function color_of(f, r)
  local c = 0
  for i, n in ipairs(f.color_sizes) do c = c * n + (r // f.color_strides[i]) % n end
  return c
end

local function family_json(mesh, f)
  local axes, on = {}, f.sparse and mesh.sparse or mesh
  for _, i in ipairs(f.axes) do axes[#axes + 1] = on.names[i] end
  local kv = { "name", f.name, "axes", axes, "size", f.size, "count", f.count }
  if mesh.world_size <= FULL then
    kv[#kv + 1] = "ranks"; kv[#kv + 1] = f.instances
  else
    -- s1, s2 see every rank at its key in every group (order of groups
    -- aside); s3 also the order of the groups. Integer arithmetic wraps
    -- mod 2^64, as numpy's int64 does.
    local s1, s2, s3 = 0, 0, 0
    local offs = groups.members(f, 0) -- group 0's ranks: key offsets from its base 0
    for c = 0, f.count - 1 do
      local base = groups.rank(f, c, 0)
      for k = 1, #offs do
        local r = base + offs[k]
        local rk = r * k
        s1 = s1 + rk
        s2 = s2 + rk * rk
        s3 = s3 + rk * (c + 1)
      end
    end
    local samples = {}
    for _, r in ipairs(sample_ranks(mesh.world_size)) do
      local c, head, tail = color_of(f, r), {}, {}
      for k = 0, math.min(f.size, 32) - 1 do head[#head + 1] = groups.rank(f, c, k) end
      for k = math.max(32, f.size - 32), f.size - 1 do tail[#tail + 1] = groups.rank(f, c, k) end
      samples[#samples + 1] = { r, head, tail }
    end
    for _, x in ipairs({ "s1", s1, "s2", s2, "s3", s3, "samples", samples }) do kv[#kv + 1] = x end
  end
  return json.object(kv)
end

local function one(id, world, parallel)
  local ok, d = pcall(dims.infer, nil, parallel, world)
  local stage = "dims"
  if ok then
    stage = "supported"
    local ok2, err = pcall(plan.check_supported, nil, d)
    if not ok2 then ok, d = false, err end
  end
  if not ok then
    if not util.is_plan_error(d) then error(d, 0) end
    return json.object({ "id", id, "ok", false, "stage", stage, "msg", d.msg })
  end
  local mesh = dims.mesh(d)
  local fams = groups.build(mesh)
  local degrees = json.object({ "dp_replicate", d.dp_replicate, "dp_shard", d.dp_shard, "cp", d.cp, "tp", d.tp,
                                "pp", d.pp, "ep", d.ep, "etp", d.etp, "efsdp", d.efsdp or 0 })
  local aliases = {}
  for _, a in ipairs(mesh.alias_order) do aliases[#aliases + 1] = { a, mesh.aliases[a] } end
  local gs = {}
  for _, f in ipairs(fams.list) do gs[#gs + 1] = family_json(mesh, f) end
  local kv = { "id", id, "ok", true, "degrees", degrees,
    "mesh", json.object({ "names", mesh.names, "sizes", mesh.sizes, "strides", mesh.strides }),
    "aliases", aliases, "groups", gs }
  local sp = mesh.sparse
  if sp then
    kv[#kv + 1] = "sparse"
    kv[#kv + 1] = json.object({ "names", sp.names, "sizes", sp.sizes, "strides", sp.strides })
  end
  return json.object(kv)
end

local NAMES = { "dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp" }
local out = io.stdout
for line in io.stdin:lines() do
  local f = {}
  for w in line:gmatch("%S+") do f[#f + 1] = w end
  if #f > 0 then
    assert(#f == 9, "dims_dump: want 9 fields, got: " .. line)
    local parallel = {}
    for i, n in ipairs(NAMES) do
      if f[i + 2] ~= "-" then parallel[n] = assert(math.tointeger(tonumber(f[i + 2])), line) end
    end
    out:write(json.encode(one(f[1], assert(math.tointeger(tonumber(f[2])), line), parallel)), "\n")
  end
end
