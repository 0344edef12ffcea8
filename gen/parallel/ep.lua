-- Expert parallel, the module (gen/parallel/init.lua's contract), as far as
-- it goes: ParallelDims takes ep (and etp) with torchtitan 0.3's meshes
-- (gen/dims.lua: ep borrows its ranks from dp_shard*cp*tp; the expert mesh
-- is (pp, dp_replicate, efsdp, ep) over the same ranks) and gen/groups.lua
-- builds its ep and efsdp process groups, checked live against torchtitan's
-- (tests/titan/test_parallel_dims.py; docs/expert-parallel.md).
-- Generating tables with ep > 1 is not done yet: the MoE families
-- (gen/models/moe.lua) plan their experts at ep = 1 only, as ordinary
-- parameters of their block; the experts' split over ep, their FSDP over
-- efsdp and the token all-to-alls are not planned (issue 23), so a plan
-- with ep > 1 is refused here in one line.
local util = require("gen.util")

local ep = {
  name = "ep", label = "EP", dims = { "ep" }, groups = { "ep", "efsdp" },
  plans_only = true, -- (not named among what commplan generates)
}

function ep.used(d) return d.ep > 1 end

function ep.rules(ctx, d)
  if d.ep > 1 then
    util.field_error(ctx, "parallel.ep", string.format("ep=%d: the expert mesh (ep %d x efsdp %d) is planned, but the "
      .. "generator does not build tables with expert parallelism yet: the MoE families plan their experts at ep=1 "
      .. "only, and the experts' split over ep, their FSDP over efsdp and the token all-to-alls are not planned "
      .. "(issue 23); set ep=1", d.ep, d.ep, d.efsdp))
  end
end

return ep
