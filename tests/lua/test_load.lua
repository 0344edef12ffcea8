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

-- ---- hostile and careless input (issue 8) ----------------------------------

-- Fails with a plan error of the contract's form "plans/t.lua:<line>:
-- <field>: <message>" (one printable line) holding every given text.
local function fails(src, ...)
  local msg = H.plan_fails(src, ...)
  if not msg:match("^plans/t%.lua:%d+: .-: .") then error("not in the file:line: field: form: " .. msg, 2) end
  if msg:find("[%c\127-\255]") then error("control or non-ASCII bytes in: " .. msg, 2) end
  return msg
end

function T.unknown_key_text_is_literal_not_a_pattern()
  for _, key in ipairs({ "%b()", "[", "%", "(", ".-.-.-.-.-.-.-.-x", "%f[%w]", "]]", "a\nb" }) do
    local src = OK:gsub("dp_shard = %-1", function() return string.format("dp_shard = -1, [%q] = 1", key) end)
    local msg = fails(src, "unknown key")
    H.eq(msg:match("^plans/t%.lua:(%d+):"), "3", "line of " .. key)
  end
  -- A key whose text is a pattern that would match elsewhere is still found literally.
  local src = "return {\n  world_size = 4,\n  parallel = { dp_shard = -1 },\n  ['w.rld'] = 1,\n" ..
    "  model = { units = { { name = 'root', params = { { name = 'w', shape = { 4 } } } } } },\n}"
  H.eq(fails(src, "unknown key"):match("^plans/t%.lua:(%d+):"), "4", "literal key line")
end

function T.line_finder_cost_is_bounded()
  -- Long comment lines full of the key, many lines, a huge key: each
  -- refusal comes back fast.
  for _, src in ipairs({
    "-- " .. string.rep("w = ", 2000000) .. "\nreturn { w = 1 }",
    "-- " .. string.rep("'w'", 2000000) .. "\nreturn { w = 1 }",
    string.rep("-- w = 1 w = 1\n", 400000) .. "return { w = 1 }",
    string.rep("\n", 4000000) .. "return { w = 1 }",
    "local s = '" .. string.rep("w", 1000000) .. "'\nreturn { [s] = 1 }",
  }) do
    local t0 = os.clock()
    fails(src, "unknown key")
    local dt = os.clock() - t0
    H.eq(dt < 3, true, string.format("refused in %.2f s", dt))
  end
end

function T.unknown_key_huge_or_binary()
  local src = OK:gsub("dp_shard = %-1", function() return "dp_shard = -1, [string.rep('x', 100000)] = 1" end)
  local msg = fails(src, "unknown key", "100000 bytes")
  H.eq(#msg < 400, true, "message stays short")
  fails(OK:gsub("dp_shard = %-1", function() return "dp_shard = -1, ['a\\nb\\0c'] = 1" end), "unknown key")
  fails(OK:gsub("dp_shard = %-1", function() return "dp_shard = -1, [true] = 1" end), "parallel", "list entry")
  fails(OK:gsub("dp_shard = %-1", function() return "dp_shard = -1, [{}] = 1" end), "parallel", "list entry")
end

function T.ignored_keys_are_refused()
  fails("return { world_size = 8, model = { family = 'llama', size = '8b', num_experts = 8 } }",
    "model.num_experts", "dense")
  fails(OK:gsub("dp_shard = %-1", "dp_shard = -1, ulysses_degree = 2"), "parallel.ulysses_degree", "cp=1",
    "changes nothing")
  fails(OK:gsub("dp_shard = %-1", "dp_shard = -1, ulysses_degree = 1"), "parallel.ulysses_degree")
  fails(OK:gsub("dp_shard = %-1", "dp_shard = -1, etp = 1"), "parallel.etp", "ep > 1")
  fails(OK:gsub("dp_shard = %-1", "dp_shard = 4, dp = 4"), "parallel.dp", "legacy")
  for _, k in ipairs({ "size = '8b'", "dim = 64", "vocab_size = 10", "ffn_dim_multiplier = 1.3",
                       "multiple_of = 16" }) do
    fails(OK:gsub('family = "generic",', 'family = "generic", ' .. k .. ','), "llama setting")
  end
  -- (n_layers: part of a generic model's attention shape, given whole or not at all; issue 37)
  fails(OK:gsub('family = "generic",', 'family = "generic", n_layers = 2,'), "model.n_layers", "n_heads, head_dim and n_layers together")
  fails(OK:gsub('family = "generic",', 'family = "generic", n_heads = 2, head_dim = 4,'), "model.head_dim", "give all three")
  fails(OK:gsub('units = {', 'dtype = "bf16", units = {'):gsub("shape = { 5, 3 }", 'shape = { 5, 3 }, dtype = "fp32"'),
    "model.dtype", "unused")
  fails(OK:gsub("dp_shard = %-1 }", "dp_shard = -1 }, fsdp = { reshard_after_forward = false }"),
    "fsdp.reshard_after_forward", "only the root")
end

function T.tp_placements_are_checked_against_the_shape()
  local function tp_plan(tpdeg, shape, placement)
    return string.format("return { world_size = %d, parallel = { dp_shard = -1, tp = %d }, model = { units = { "
      .. "{ name = 'root', params = { { name = 'w', shape = { %s }, tp = %q } } } } } }", 2 * tpdeg, tpdeg, shape, placement)
  end
  fails(tp_plan(2, "8", "rowwise"), "model.units[1].params[1].tp", "shards dim 1", "1 dim")
  fails(tp_plan(2, "8, 4", "shard(5)"), "model.units[1].params[1].tp", "shards dim 5")
  fails(tp_plan(2, "8, 4", "shard(9)"), "model.units[1].params[1].tp", "not one of")
  fails(tp_plan(1, "8, 4", "colwise"), "model.units[1].params[1].tp", "parallel.tp is 1")
end

function T.undefined_globals_are_errors_naming_them()
  local msg = fails("local x = 1\nreturn { world_size = 4, model = { units = { { name = 'root', params = {\n"
    .. "  { name = 'w', shape = { 8, dimm } } } } } } }", "plans/t.lua:3: dimm:", "undefined variable")
  H.eq(msg:find("dimm", 1, true) ~= nil, true, "names the variable")
  fails("local u1 = { name = 'u1', params = { { name = 'a', shape = { 4 } } } }\n"
    .. "local root = { name = 'root', params = { { name = 'w', shape = { 4 } } } }\n"
    .. "return { world_size = 4, parallel = { dp_shard = -1 }, model = { units = { u1, layer1, root } } }",
    "plans/t.lua:3: layer1:")
  -- Defining a global first is fine.
  require("gen.plan").from_source("n = 4\nreturn { world_size = n, parallel = { dp_shard = -1 }, model = { units = "
    .. "{ { name = 'root', params = { { name = 'w', shape = { n } } } } } } }", "plans/t.lua")
end

function T.holes_in_every_list()
  local pre = "local nothing\nreturn { world_size = 4, parallel = { dp_shard = -1 }, model = { units = "
  fails(pre .. "{ { name = 'a', params = { { name = 'x', shape = { 4 } } } }, nothing, "
    .. "{ name = 'root', params = { { name = 'w', shape = { 4 } } } } } } }", "model.units[2]", "hole")
  fails(pre .. "{ { name = 'root', params = { { name = 'x', shape = { 4 } }, nothing, { name = 'w', shape = { 4 } } } } } } }",
    "model.units[1].params[2]", "hole")
  fails(pre .. "{ { name = 'root', params = { { name = 'x', shape = { 4, nothing, 3 } } } } } } }",
    "model.units[1].params[1].shape[2]", "hole")
  fails(pre .. "{ { name = 'root', params = { { name = 'x', shape = { [1] = 4, [3] = 3 } } } } } } }", "shape[2]", "hole")
  fails(pre .. "{ { name = 'root', params = { { name = 'x', shape = { [1] = 4, [2^40] = 3 } } } } } } }", "shape", "list")
  fails(pre .. "{ { name = 'root', params = { { name = 'x', shape = { [0] = 4 } } } } } } }", "shape", "found key 0")
  fails(pre .. "{ { name = 'root', params = { { name = 'x', shape = { 4, n = 2 } } } } } } }", "shape", "named keys")
end

function T.numbers_are_bounded()
  local function top(extra) return OK:gsub("world_size = 4,", extra) end
  fails(top("world_size = 0/0,"), "world_size", "NaN")
  fails(top("world_size = math.huge,"), "world_size", "inf")
  fails(top("world_size = -math.huge,"), "world_size", "inf")
  fails(top("world_size = 1e300,"), "world_size", "integer")
  fails(top("world_size = 4.5,"), "world_size", "integer")
  fails(top("world_size = 1048577,"), "world_size", "1048576 (2^20)", "tested")
  fails(top("world_size = math.maxinteger,"), "world_size", "limit")
  fails(top("world_size = math.mininteger,"), "world_size", ">= 1")
  -- 2^2 is the float 4.0: exactly an integer, accepted.
  H.eq(require("gen.plan").from_source(top("world_size = 2^2,"), "plans/t.lua").world_size, 4, "2^2")
  for _, v in ipairs({ "0/0", "math.huge", "-1", "0", "1e6+1" }) do
    fails(OK:gsub("dp_shard = %-1 }", "dp_shard = -1 }, topology = { collectives = \"alpha_beta\", intra_node_GBps = "
      .. v .. " }"), "topology.intra_node_GBps")
  end
  fails(OK:gsub("dp_shard = %-1 }", "dp_shard = -1 }, fsdp = { micro_steps = (1 << 14) + 1 }"), "fsdp.micro_steps",
    "16384 (2^14)", "units x micro-steps")
  fails(OK:gsub("dp_shard = %-1 }", "dp_shard = -1 }, fsdp = { micro_steps = 0 }"), "fsdp.micro_steps", ">= 1")
  fails(OK:gsub("shape = { 5, 3 }", "shape = { 5, 3 }, shard_dim = 0/0"), "shard_dim", "NaN")
  fails("return { world_size = 8, model = { family = 'llama', size = '8b', ffn_dim_multiplier = 0/0 } }",
    "model.ffn_dim_multiplier", "NaN")
  fails("return { world_size = 8, model = { family = 'llama', size = '8b', n_layers = 1 << 12 } }", "model.n_layers",
    "units")
end

function T.parallel_products_never_wrap()
  -- A 4.6e18-way replicate dim on 4 ranks.
  fails(OK:gsub("dp_shard = %-1", "dp_replicate = 4611686018427387904, dp_shard = -1"), "parallel.dp_replicate",
    "1048576")
  fails(OK:gsub("dp_shard = %-1", "dp_replicate = 1 << 62, dp_shard = 4"), "parallel.dp_replicate", "limit")
  -- Each degree within bounds, the product far beyond 64 bits: no wrap to 4.
  local big = "dp_replicate = 262144, dp_shard = 262144, tp = 262144, cp = 262144, pp = 262144, ep = 262144"
  fails(OK:gsub("dp_shard = %-1", big), "parallel.dp_shard", "= more than 4 != world_size(4)")
  fails(OK:gsub("dp_shard = %-1", "dp_replicate = 262144, tp = 262144, cp = 262144, dp_shard = -1"),
    "parallel.dp_shard", "Cannot auto-infer", "more than 4")
  fails(OK:gsub("dp_shard = %-1", "dp_replicate = 65536, dp_shard = 65536"), "= more than 4 != world_size(4)")
end

function T.numel_and_bytes_are_bounded()
  fails(OK:gsub("shape = { 5, 3 }", "shape = { 1 << 30, 1 << 30 }"), "shape", "2^53")
  fails(OK:gsub("shape = { 5, 3 }", "shape = { 1 << 31, 1 << 31, 1 << 31, 1 << 31 }"), "shape", "2^53")
  fails(OK:gsub("shape = { 5, 3 }", "shape = { 5, 3, 0 }"), "shape[3]", "positive")
  fails(OK:gsub("shape = { 5, 3 }", "shape = { 1, 1, 1, 1, 1, 1, 1, 1, 1 }"), "shape", "CP_MAX_DIMS")
  -- Two parameters of 2^52 + 2^52 elements: each fits, the model does not.
  fails(OK:gsub("{ name = \"w\", shape = { 5, 3 } }", "{ name = 'a', shape = { 1 << 52 } }, { name = 'b', shape = { 1 << 52 } }, "
    .. "{ name = 'c', shape = { 1 } }"), "shape", "the model has more than")
  -- One rank's slot above 2^40 (world 1), and buffers above 2^53 bytes.
  local one = OK:gsub("world_size = 4", "world_size = 1"):gsub("dp_shard = %-1", "dp_shard = 1")
  fails(one:gsub("shape = { 5, 3 }", "shape = { 1 << 41 }"), "model.units[1].params[1]", "2^40")
  -- (seq_len 1: at torchtitan's default 2048 a step of 2^50 parameters is refused first, past 2^62 FLOPs)
  fails(OK:gsub("world_size = 4", "world_size = 131072"):gsub("shape = { 5, 3 }", "shape = { 1 << 50 }")
    :gsub("family = \"generic\",", "family = \"generic\", seq_len = 1,"), "model.units[1]", "(2^53) bytes")
  -- A llama whose config multiplies past 2^53.
  fails("return { world_size = 8, parallel = { dp_shard = -1 }, model = { family = 'llama', size = '8b', dim = 1 << 30, vocab_size = 1 << 30, "
    .. "n_heads = 1, n_kv_heads = 1 } }", "model.dim", "2^53")
end

-- Units x micro-steps is bounded where the generator's memory ends (one
-- line naming the field and the fix); the unit list by the same bound.
function T.counts_bound_generator_memory()
  fails(OK:gsub("dp_shard = %-1 }", "dp_shard = -1 }, fsdp = { micro_steps = 10000 }"):gsub("units = {",
    "units = { { name = 'a', params = { { name = 'a.w', shape = { 4 } } } },"), "fsdp.micro_steps",
    "2 units x 10000 micro-steps is more than 16384 (2^14) unit-steps", "use fewer micro-steps")
  -- the planned ones (all below 6 micro-steps, else 5): 1,000 units x 5 planned, stated with the memory
  local thousand = {}
  for i = 1, 1000 do thousand[i] = string.format("{ name = 'u%d', params = { { name = 'p%d', shape = { 4 } } } }", i, i) end
  fails("return { world_size = 4, parallel = { dp_shard = -1 }, fsdp = { micro_steps = 8 }, model = { units = { "
    .. table.concat(thousand, ", ") .. " } } }", "fsdp.micro_steps",
    "1000 units x 5 micro-steps planned is more than 4096 (2^12) unit-steps", "GiB", "use fewer micro-steps")
  local spec = require("gen.load").SCHEMA.model.units
  local saved_max = spec.max
  spec.max = 3
  local many = {}
  for i = 1, 4 do many[i] = string.format("{ name = 'u%d', params = { { name = 'p%d', shape = { 4 } } } }", i, i) end
  local okm, errm = pcall(fails, "return { world_size = 4, parallel = { dp_shard = -1 }, model = { units = { "
    .. table.concat(many, ", ") .. " } } }", "model.units", "more than 3 entries", "units x micro-steps")
  spec.max = saved_max
  assert(okm, errm)
  local saved = util.LIMITS.params
  util.LIMITS.params = 5
  local ok, err = pcall(fails, "return { world_size = 4, parallel = { dp_shard = -1 }, model = { units = { "
    .. "{ name = 'root', params = { { name = 'a', shape = { 1 } }, { name = 'b', shape = { 1 } }, { name = 'c', shape = { 1 } }, "
    .. "{ name = 'd', shape = { 1 } }, { name = 'e', shape = { 1 } }, { name = 'f', shape = { 1 } } } } } } }",
    "model.units[1].params[6]", "more than 5 parameters")
  util.LIMITS.params = saved
  assert(ok, err)
end

local function names_plan(unit_a, unit_b, pa, pb)
  return string.format("return { world_size = 2, parallel = { dp_shard = -1 }, model = { units = { "
    .. "{ name = %s, params = { { name = %s, shape = { 4 } } } }, { name = %s, params = { { name = %s, shape = { 4 } } } } } } }",
    unit_a, pa, unit_b, pb)
end

function T.names_are_validated()
  fails(names_plan("'a\\nb'", "'root'", "'x'", "'y'"), "model.units[1].name", "printable ASCII")
  fails(names_plan("'a'", "'root'", "'x\\0'", "'y'"), "model.units[1].params[1].name", "printable ASCII")
  fails(names_plan("'a'", "'root'", "'caf\\195\\169'", "'y'"), "params[1].name", "UTF-8")
  fails(names_plan("''", "'root'", "'x'", "'y'"), "model.units[1].name", "empty")
  fails(names_plan("'a'", "'root'", "string.rep('x', 201)", "'y'"), "params[1].name", "at most 200")
  fails(names_plan("'a'", "'root'", "42", "'y'"), "params[1].name", "expected a string")
end

-- Names reach SCHEDULE.md's Markdown tables: a cell separator, HTML or
-- code span would break the review surface.
function T.names_with_markdown_markup_refused()
  for _, bad in ipairs({ "a|b", "<!--x", "w`1`", "a>b" }) do
    H.plan_fails(string.format("return { world_size = 2, parallel = { dp_shard = 2 }, model = { units = { "
      .. "{ name = %q, params = { { name = 'w', shape = { 4 } } } } } } }", bad), "Markdown", "rename it")
  end
end

-- An error names the line of the field it is about, following the path:
-- parallel's tp, not a parameter's tp placement above or below it.
function T.error_line_follows_the_field_path()
  local src = table.concat({
    "return {",
    "  world_size = 4,",
    "  model = { family = 'generic', dtype = 'fp32', n_heads = 7, units = {",
    "    { name = 'a', params = { { name = 'a.w', shape = { 4, 4 }, tp = 'colwise' } } },",
    "    { name = 'root', params = { { name = 'x', shape = { 4 } }, { name = 'y', shape = { 4 } } } } } },",
    "  parallel = { dp_shard = -1, tp = 2 },",
    "}" }, "\n")
  H.plan_fails(src, "plans/t.lua:6: parallel.tp")
  local names = table.concat({
    "return { world_size = 2, parallel = { dp_shard = 2 }, model = { units = {",
    "  { name = 'root', params = {",
    "    { name = 'x', shape = { 4 } },",
    "    { name = 'y|', shape = { 4 } } } } } } }" }, "\n")
  H.plan_fails(names, "plans/t.lua:4: model.units[1].params[2].name")
end

function T.names_unique_as_c_identifiers()
  fails(names_plan("'a'", "'root'", "'a.b'", "'a_b'"), "model.units[2].params[1].name", "\"a_b\"", "\"a.b\"",
    "<NAME>_PARAM_A_B")
  fails(names_plan("'a'", "'root'", "'W'", "'w'"), "\"w\"", "\"W\"", "case")
  fails(names_plan("'layers.0'", "'layers_0'", "'x'", "'y'"), "model.units[2].name", "<NAME>_UNIT_LAYERS_0")
  fails(names_plan("'a'", "'root'", "'count'", "'y'"), "params[1].name", "<NAME>_PARAM_COUNT")
  fails(names_plan("'Count'", "'root'", "'x'", "'y'"), "model.units[1].name", "<NAME>_UNIT_COUNT")
  -- Hostile but printable names are accepted (emit escapes them).
  require("gen.plan").from_source(names_plan("'a*/b'", "'root'", "'x\"??/y'", "'y\\\\'"), "plans/t.lua")
end

function T.plan_name_is_the_file_stem()
  fails(OK:gsub("world_size = 4,", "name = 'other', world_size = 4,"), "name", "differs from the file stem")
  require("gen.plan").from_source(OK:gsub("world_size = 4,", "name = 't', world_size = 4,"), "plans/t.lua")
  local function stem_fails(path, ...)
    local ok, err = pcall(require("gen.plan").from_source, OK, path)
    H.eq(ok, false, path .. " refused")
    local msg = tostring(err)
    for _, s in ipairs({ ... }) do
      if not msg:find(s, 1, true) then error(string.format("%q lacks %q", msg, s)) end
    end
  end
  stem_fails("plans/my-plan.lua", "name:", "not a C identifier")
  stem_fails("plans/cp.lua", "name:", "cp_*")
  stem_fails("plans/cp_gpu.lua", "name:", "collide")
  stem_fails("plans/CP_x.lua", "name:", "collide")
  stem_fails("plans/commplan.lua", "name:", "collide")
  stem_fails("plans/a__b.lua", "name:", "__")
  stem_fails("plans/_a.lua", "name:", "C identifier")
  stem_fails("plans/9a.lua", "name:", "C identifier")
  stem_fails("plans/" .. string.rep("a", 65) .. ".lua", "name:", "at most 64")
end

function T.errors_always_have_a_line()
  -- Missing keys have no line of their own: the return statement's.
  H.eq(fails("local x = 1\n\nreturn { model = { units = { { name = 'r', params = { { name = 'w', shape = { 1 } } } } } } }",
    "world_size", "missing"):match("^plans/t%.lua:(%d+):"), "3", "line of return")
  fails("error('boom')\nreturn {}", "plans/t.lua:1: plan: boom")
  fails("local function f() error('deep') end\nlocal function g() f() end\ng()\nreturn {}", "plans/t.lua:1: plan: deep")
  fails("error('multi\\nline\\r\\027[31m')\nreturn {}", "plans/t.lua:1: plan: multi\\010line")
  fails("error({})", "plans/t.lua:1: plan:", "error object")
  fails("error(nil)", "plans/t.lua:1: plan:")
  fails("error('x', 0)\nreturn {}", "plans/t.lua:1: plan: x")
  fails("\n\nreturn nil", "plans/t.lua:3: plan:", "must return a table")
end

-- Each collective cost model reads its own topology fields; the other's are
-- refused, naming the field, its line and both fixes.
function T.cost_model_fields_belong_to_their_model()
  local function with(topo) return OK:gsub("dp_shard = %-1 }", "dp_shard = -1 },\n  topology = " .. topo) end
  fails(with("{ latency_us = 5 }"), "plans/t.lua:4: topology.latency_us:",
    "applies to topology.collectives = \"alpha_beta\" only", "(the default)", "set collectives = \"alpha_beta\"")
  fails(with("{ collectives = \"alpha_beta\", nics_per_node = 4 }"), "plans/t.lua:4: topology.nics_per_node:",
    "applies to topology.collectives = \"nccl\" only", "remove nics_per_node or set collectives = \"nccl\"")
  fails(with("{ preset = \"h300\" }"), "topology.preset")
  local p = require("gen.plan").from_source(with("{ preset = \"b200\", nics_per_node = 4, sharp = true }"), "plans/t.lua")
  H.eq(p.topology.collectives, "nccl", "default model")
  local net = require("gen.hardware").network(p.topology)
  H.eq(net.nics_per_node, 4, "override")
  H.eq(net.collnet, true, "sharp is NCCL's collnet")
  H.eq(net.nic_Gbps, 800, "the preset's own NICs")
  local ab = require("gen.plan").from_source(with("{ collectives = \"alpha_beta\" }"), "plans/t.lua")
  H.eq(ab.topology.inter_node_GBps, 45, "alpha-beta defaults")
  -- a case slip is suggested as itself; what the hardware cannot do, and links slower than NCCL's
  -- graph search goes, are refused rather than ignored or crashed on
  fails(with("{ preset = \"H100\" }"), "topology.preset:", "did you mean \"h100\"")
  fails(with("{ preset = \"a100\", nvls = true }"), "topology.nvls:", "the A100 (sm80) has no NVLink SHARP")
  fails(with("{ preset = \"a100\", sharp = true }"), "topology.sharp:", "would change nothing")
  fails(with("{ nic_Gbps = 0.1 }"), "topology.nic_Gbps:", "must be >= 10")
  fails(with("{ pci_GBps = 1e-300 }"), "topology.pci_GBps:", "must be >= 1")
  fails(with("{ hbm_GBps = 1e-300 }"), "topology.hbm_GBps:", "must be >= 0.1")
  fails(with("{ mfu = 1e-300 }"), "topology.mfu:", "must be >= 0.001")
end

-- A list with several named keys names the same one every run (pairs'
-- order varies between Lua states: the CLI and the in-process fuzz
-- disagreed), the first by its text.
function T.named_keys_in_a_list_reported_deterministically()
  local src = [[return { world_size = 1, model = { family = "generic", units = { { name = "root", params = {
    { name = "w", shape = { zeta = 1, dim = 64, etp = 1, alpha = 2, 12, 12 } } } } } } }]]
  for _ = 1, 5 do H.plan_fails(src, "shape", "found key \"alpha\"") end
end

return T
