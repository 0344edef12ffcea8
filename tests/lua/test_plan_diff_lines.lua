-- Issue 34, item 3: a one-knob diff of a pipeline or MoE plan reads as a
-- dense one's does, in under 60 lines (`make diff-plan`, gen/verbs.lua
-- diff), naming the knob that changed, and losing no op it added or
-- removed to the folding (gen/plandiff.lua).
local H = require("helpers")
local plandiff = require("gen.plandiff")

local T = {}

local MAX_LINES = 60

-- One knob each: the shipped plan, the text replaced, its replacement,
-- and a pattern the diff must hold (the knob, before and after).
local CASES = {
  { "llama8b", 'activation_checkpointing = "selective"', 'activation_checkpointing = "full"',
    "activation_checkpointing selective %-> full" },
  { "mixtral8x7b", "ep = 8 }", "ep = 4 }", "parallel%.ep 8 %-> 4" },
  { "mixtral8x7b", "ep = 8 }", 'ep = 8 },\n  expert_parallel = { capacity = "factor", capacity_factor = 1.25 }',
    "expert_parallel%.capacity_policy dropless %-> factor; expert_parallel%.capacity_factor nil %-> 1%.25" },
  { "deepseek_v3", "ep = 2 }", "ep = 4 }", "parallel%.ep 2 %-> 4" },
  { "deepseek_v3", "ep = 2 }", "ep = 1 }", "parallel%.ep 2 %-> 1" },
  { "llama405b", "microbatches = 32", "microbatches = 16", "microbatches[^\n]*32[^\n]*%->[^\n]*16" },
  { "llama405b", '"Interleaved1F1B"', '"1F1B"', "Interleaved1F1B %-> 1F1B" },
}

-- `lua5.4 gen/verbs.lua diff A B` (what make diff-plan runs): its output.
local function diff_cli(a, b)
  local ph = assert(io.popen(string.format("lua5.4 gen/verbs.lua diff '%s' '%s' 2>&1", a, b)))
  local out = ph:read("a")
  local ok = ph:close()
  assert(ok, "diff " .. a .. " " .. b .. " failed:\n" .. out)
  return out
end

-- The ops the added and removed lines stand for, against the op count
-- they explain (ops: A -> B): every folded kind counted x N times.
local function ops_accounted(text)
  local a, b = text:match("\nops: (%d+) %-> (%d+);")
  if not a then return true end
  local net = 0
  for verb, kinds, n in text:gmatch("\n  (%a+) ([^\n]-) x(%d+)[^\n]*") do
    if verb == "added" or verb == "removed" then
      local k = select(2, kinds:gsub("[,;]", "")) + 1
      net = net + (verb == "added" and 1 or -1) * k * tonumber(n)
    end
  end
  return net == tonumber(b) - tonumber(a), string.format("added - removed = %d, ops %s -> %s", net, a, b)
end

function T.one_knob_diffs_read_in_under_60_lines()
  local dir = H.tmpdir()
  for _, c in ipairs(CASES) do
    local name, from, to, want = c[1], c[2], c[3], c[4]
    local src = H.read("plans/" .. name .. ".lua")
    local s, e = src:find(from, 1, true)
    assert(s, name .. ": the edit " .. from .. " applies")
    local path = dir .. "/" .. name .. ".lua"
    H.write(path, src:sub(1, s - 1) .. to .. src:sub(e + 1))
    local text = diff_cli("plans/" .. name .. ".lua", path)
    local _, lines = text:gsub("\n", "")
    assert(lines < MAX_LINES, string.format("%s (%s -> %s): the diff is %d lines, want < %d\n%s", name, from, to,
      lines, MAX_LINES, text))
    assert(text:find(want), string.format("%s: the diff does not name the knob (%s)\n%s", name, want, text))
    local ok, why = ops_accounted(text)
    assert(ok, name .. ": the folded op lines lose ops: " .. tostring(why) .. "\n" .. text)
  end
  os.execute("rm -rf '" .. dir .. "'")
end

-- The folds on their own: kinds of one phase together, groups whose change
-- reads the same as one line, a warning that stayed with other figures as
-- one ~ line (a figure and its unit one token: `511.18 ms -> 1.92 s`).
function T.folds()
  H.eq(plandiff.kinds_text({ "copy_in (forward)", "a2a (forward)", "copy_in (backward)" }),
    "copy_in, a2a (forward); copy_in (backward)", "kinds by phase")
  local f = plandiff.fold_same({ { name = "dp", t = "x" }, { name = "ep", t = "y" }, { name = "fsdp", t = "x" } },
    function(e) return e.t end)
  H.eq(#f, 2, "two texts")
  H.eq(table.concat(f[1].names, ", "), "dp, fsdp", "same text, one entry")
  local a = "exposed a2a (forward) of layers.3-60.experts: 511.18 ms over 58 ops (up to 14.12 ms each); it waits"
  local b = "exposed a2a (forward) of layers.3-60.experts: 1.92 s over 58 ops (up to 14.12 ms each); it waits"
  H.eq(plandiff.figure_shape(a), plandiff.figure_shape(b), "one shape")
  H.eq(plandiff.figures_text(a, b),
    "exposed a2a (forward) of layers.3-60.experts: 511.18 ms -> 1.92 s over 58 ops (up to 14.12 ms each); it waits",
    "the changed figure")
  assert(plandiff.figure_shape(a) ~= plandiff.figure_shape(a:gsub("3%-60", "4-60")), "units are not figures")
  local L = plandiff.warnings_lines({ a, "gone", "kept" }, { "kept", "new", b })
  H.list_eq(L, { "  ~ " .. plandiff.figures_text(a, b), "  - gone", "  + new" }, "warnings")
end

return T
