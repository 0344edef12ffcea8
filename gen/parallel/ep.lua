-- Expert parallel, the module (gen/parallel/init.lua's contract), as far as
-- it goes: ParallelDims takes ep (and etp) with torchtitan 0.3's meshes
-- (gen/dims.lua: ep borrows its ranks from dp_shard*cp*tp; the expert mesh
-- is (pp, dp_replicate, efsdp, ep) over the same ranks) and gen/groups.lua
-- builds its ep and efsdp process groups, checked live against torchtitan's
-- (tests/titan/test_parallel_dims.py; docs/expert-parallel.md).
-- Generating tables is not done yet: no model family has experts, and the
-- expert sharding and the token all-to-alls are not planned (issue 23), so
-- a plan with ep > 1 is refused here in one line.
local util = require("gen.util")

local ep = {
  name = "ep", label = "EP", dims = { "ep" }, groups = { "ep", "efsdp" },
  plans_only = true, -- (not named among what commplan generates)
}

function ep.used(d) return d.ep > 1 end

function ep.rules(ctx, d)
  if d.ep > 1 then
    util.field_error(ctx, "parallel.ep", string.format("ep=%d: the expert mesh (ep %d x efsdp %d) is planned, but the "
      .. "generator does not build tables with experts yet: no model family has experts, and their sharding over "
      .. "ep and efsdp and the token all-to-alls are not planned (issue 23); set ep=1", d.ep, d.ep, d.efsdp))
  end
end

return ep
