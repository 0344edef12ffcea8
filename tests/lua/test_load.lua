local H = require("helpers")
local util = require("gen.util")
local T = {}

local OK = [[
return {
  world_size = 4,
  parallel = { dp_shard = -1 },
  model = { family = "generic", units = { { name = "root", params = { { name = "w", shape = { 5, 3 } } } } } },
}]]

function T.valid_plan_loads()
  local p = require("gen.plan").from_source(OK, "plans/t.lua")
  H.eq(p.dims.dp_shard, 4, "inferred dp_shard")
  H.eq(p.name, "t", "name defaults to the file stem")
end

function T.syntax_error_names_file_and_line()
  H.plan_fails("return {\n world_size = 4,\n model = {\n", "plans/t.lua:", "syntax error")
end

function T.runtime_error_in_plan()
  H.plan_fails("local x = nil\nreturn x.y", "plans/t.lua:2", "error while running")
end

function T.plan_must_return_table()
  H.plan_fails("return 42", "must return a table")
end

function T.unknown_key_did_you_mean_with_line()
  local src = OK:gsub("parallel = { dp_shard = %-1 }", "parallel = { dp_shrad = -1 }")
  H.plan_fails(src, "plans/t.lua:3:", "parallel.dp_shrad", "did you mean 'dp_shard'")
end

function T.unknown_top_level_key()
  H.plan_fails(OK:gsub("world_size", "wrld_size"), "wrld_size", "did you mean 'world_size'")
end

function T.wrong_type()
  H.plan_fails(OK:gsub("world_size = 4", 'world_size = "4"'), "world_size", "expected an integer", "string")
end

function T.fractional_size()
  H.plan_fails(OK:gsub("shape = { 5, 3 }", "shape = { 5.5, 3 }"), "shape[1]", "expected an integer")
end

function T.zero_and_negative_sizes()
  H.plan_fails(OK:gsub("shape = { 5, 3 }", "shape = { 5, 0 }"), "shape[2]", "must be positive")
  H.plan_fails(OK:gsub("shape = { 5, 3 }", "shape = { -5, 3 }"), "shape[1]", "must be positive")
  H.plan_fails(OK:gsub("world_size = 4", "world_size = 0"), "world_size", ">= 1")
end

function T.scalar_param_rejected()
  H.plan_fails(OK:gsub("shape = { 5, 3 }", "shape = { }"), "scalar", "shape = { 1 }")
end

function T.enum_did_you_mean()
  local src = OK:gsub("parallel = { dp_shard = %-1 },", "parallel = { dp_shard = -1 }, fsdp = { reduce_op = 'avgg' },")
  H.plan_fails(src, "fsdp.reduce_op", "did you mean \"avg\"")
end

function T.sandbox_has_no_io_os_require()
  H.plan_fails("os.execute('true') return {}", "os")
  H.plan_fails("io.open('/etc/passwd') return {}", "io")
  H.plan_fails("require('gen.util') return {}", "require")
end

function T.missing_model()
  H.plan_fails("return { world_size = 1 }", "model", "missing")
end

function T.duplicate_parameter()
  H.plan_fails(H.generic(2, "{ dp_shard = 2 }", { { "a", { { "w", { 4 } } } }, { "root", { { "w", { 4 } } } } }),
    "already in unit", "\"a\"")
end

function T.did_you_mean_distance()
  H.eq(util.did_you_mean("dp_shrad", { "dp_shard", "dp_replicate" }), "dp_shard")
  H.eq(util.did_you_mean("zzzzzz", { "dp_shard" }), nil)
end

return T
