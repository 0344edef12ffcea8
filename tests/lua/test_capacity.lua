-- Issue 42, item 3: expert parallel's capacity and the other rounding
-- rules of its all-to-alls (gen/parallel/ep.lua, docs/expert-parallel.md
-- "The capacity policy"), at fractional, exactly whole, one-token and huge
-- values, each expected value computed here by an exact integer ceiling.
--
-- The rules: dropless = tokens x min(top_k, experts per member) rows per
-- member, torchtitan's own receive size per source rank
-- (torchtitan/models/common/token_dispatcher.py:
-- num_receive_rows_per_source_rank = num_tokens * min(top_k,
-- num_local_experts)); factor f = ceil(f x tokens x top_k / ep), at least
-- one row, never above dropless. torchtitan's capacity factor (HybridEP,
-- torchtitan/distributed/deepep/hybridep.py
-- _num_permuted_tokens_for_non_blocking) truncates with int(): it drops
-- what overflows, silently; commplan refuses a routing past the capacity,
-- so it must round up, or a routing at the uniform share times f (a whole
-- number of rows only after rounding) is refused one row short.
local H = require("helpers")
local plan = require("gen.plan")
local ep = require("gen.parallel.ep")
local audit = require("gen.audit")
local json = require("gen.json")

local T = {}

-- ceil(num / den x rows / n) in integers: the factor as the fraction the
-- plan's decimal means.
local function ceil_exact(num, den, rows, n) return (num * rows + den * n - 1) // (den * n) end

local function factor(f) return { name = "factor", factor = f } end

-- { tokens, top_k, experts, ep, factor as num/den, why }
local CASES = {
  -- fractional: the uniform share times f is not whole
  { 8, 2, 4, 4, 13, 10, "1.3 x 16 / 4 = 5.2" },
  { 8, 2, 4, 2, 101, 100, "1.01 x 16 / 2 = 8.08" },
  { 7, 2, 8, 4, 5, 4, "1.25 x 14 / 4 = 4.375" },
  { 3, 1, 8, 2, 1, 3, "1/3 x 3 / 2 = 0.5" },
  { 8, 2, 4, 2, 1, 3, "1/3 x 16 / 2 = 2.67 (no short decimal: the double's own ceiling)" },
  { 10, 3, 12, 4, 11, 10, "1.1 x 30 / 4 = 8.25" },
  -- exactly whole (including factors whose double is a hair above the decimal)
  { 8, 2, 4, 2, 5, 4, "1.25 x 16 / 2 = 10" },
  { 8, 2, 4, 4, 3, 2, "1.5 x 16 / 4 = 6" },
  { 25, 2, 10, 5, 11, 10, "1.1 x 50 / 5 = 11 (1.1's double: 11.000000000000002)" },
  { 25, 2, 8, 4, 112, 100, "1.12 x 50 / 4 = 14" },
  { 25, 3, 6, 3, 22, 10, "2.2 x 75 / 3 = 55" },
  { 8, 2, 4, 2, 1, 1, "1 x 16 / 2 = 8" },
  -- one token
  { 1, 1, 4, 4, 1, 1, "1 token, 4 members: a quarter row, one" },
  { 1, 2, 4, 2, 1, 1, "1 token, top 2 over 2 members: one row each" },
  { 1, 1, 4, 4, 1, 100, "1 token, f 0.01: at least one row" },
  -- huge
  { 1 << 20, 8, 256, 64, 5, 4, "2^20 tokens x top 8, ep 64, 1.25" },
  { 1 << 20, 8, 256, 64, 1000001, 1000000, "f 1.000001: a fraction of a row over the share" },
  { 131072, 8, 256, 16, 333333, 100000, "3.33333 x 1048576 / 16" },
}

function T.factor_capacity_is_the_exact_ceiling()
  for _, c in ipairs(CASES) do
    local tokens, top_k, experts, n, num, den, why = table.unpack(c)
    local rows = tokens * top_k
    local dropless = tokens * math.min(top_k, experts // n)
    local want = math.max(1, math.min(dropless, ceil_exact(num, den, rows, n)))
    local cap, got_rows, worst = ep.capacity(tokens, top_k, experts, n, factor(num / den))
    H.eq(cap, want, why)
    H.eq(math.type(cap), "integer", why .. ": a whole number of rows")
    H.eq(got_rows, rows, why .. ": routed rows")
    H.eq(worst, dropless, why .. ": dropless")
    -- the capacity holds the uniform share times f: one row fewer does not
    if want < dropless and want > 1 then
      assert((want - 1) * n * den < num * rows, why .. ": one row fewer would not hold f x the share")
    end
  end
end

function T.dropless_at_its_boundaries()
  -- top_k below, at and above the experts per member
  H.eq(ep.capacity(8, 2, 16, 2, { name = "dropless" }), 8 * 2, "top 2 of 8 per member: both may land on one")
  H.eq(ep.capacity(8, 2, 4, 2, { name = "dropless" }), 8 * 2, "top 2 of 2 per member")
  H.eq(ep.capacity(8, 4, 4, 2, { name = "dropless" }), 8 * 2, "top 4 of 2 per member: at most 2 on one")
  H.eq(ep.capacity(8, 2, 8, 8, { name = "dropless" }), 8, "one expert per member")
  H.eq(ep.capacity(1, 1, 2, 2, { name = "dropless" }), 1, "one token")
  H.eq(ep.capacity(1 << 20, 8, 256, 64, { name = "dropless" }), (1 << 20) * 4, "huge: 4 experts per member")
  -- a factor past dropless is capped at it
  H.eq(ep.capacity(8, 2, 4, 2, factor(4)), 16, "f 4: capped at dropless")
  H.eq(ep.capacity(8, 2, 4, 2, factor(2)), 16, "f 2 = ep: exactly dropless")
  H.eq(ep.capacity(8, 2, 4, 2, factor(1024)), 16, "the largest factor a plan may give")
end

-- A tiny Mixtral: tokens = seq_len (one sequence), 10 experts.
local function mix(world, parallel, seq, f, tp_model)
  return string.format([[return { world_size = %d, parallel = %s, model = { family = "mixtral", dtype = "fp32",
    seq_len = %d, dim = 12, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 29, moe_hidden_dim = 8,
    num_experts = 10, top_k = 2%s }, fsdp = { reduce_op = "sum", micro_steps = 2 },
    expert_parallel = { capacity_factor = %s }, topology = { gpus_per_node = 2 } }]], world, parallel, seq, tp_model or "", f)
end

-- The plan's tables and buffers take the capacity: every all-to-all's
-- capacity and count, the token buffers (ep x capacity x dim, fp32), and
-- plan.json's expert_parallel section.
local function check_plan(src, n, want_cap, dim, rows, why)
  local p = plan.from_source(src, "plans/t.lua")
  local doc = json.decode(audit.json(p, audit.fingerprint(p)))
  local seen = 0
  for _, o in ipairs(p.ops) do
    if o.kind == "a2a" then
      H.eq(o.a2a_capacity, want_cap, why .. ": op capacity")
      H.eq(o.count, want_cap * dim, why .. ": a member's slot in the token buffer")
      seen = seen + 1
    end
  end
  assert(seen > 0, why .. ": no all-to-alls")
  for _, u in ipairs(doc.units) do
    if u.name:find("%.experts$") then
      H.eq(u.arena.a2a_send.bytes, n * want_cap * dim * 4, why .. ": " .. u.name .. " send buffer")
      H.eq(u.arena.a2a_recv.bytes, n * want_cap * dim * 4, why .. ": " .. u.name .. " receive buffer")
    end
  end
  local e = doc.expert_parallel
  H.eq(e.capacity_rows, want_cap, why .. ": plan.json capacity_rows")
  H.eq(e.routed_rows, rows, why .. ": plan.json routed_rows")
  -- the bytes at the bound: the other members' capacity rows per exchange, 4 exchanges and a counts one
  H.eq(e.layer_bytes_capacity, 4 * (n - 1) * want_cap * dim * 4 + (n - 1) * (10 // n) * 8,
    why .. ": a layer's bytes at the capacity bound")
  -- at uniform routing: rows x (n - 1) / n, to the nearest row
  local others = (rows * (n - 1) * 2 + n) // (2 * n)
  H.eq(e.layer_bytes_uniform, 4 * others * dim * 4 + (n - 1) * (10 // n) * 8, why .. ": at uniform routing")
  return p
end

function T.plans_size_their_buffers_by_the_capacity()
  -- 25 tokens x top 2 = 50 rows over ep 5: 1.1 -> exactly 11 rows
  check_plan(mix(10, "{ dp_shard = -1, ep = 5 }", 25, "1.1"), 5, 11, 12, 50, "1.1 x 50 / 5")
  -- fractional: 1.35 x 50 / 5 = 13.5 -> 14
  check_plan(mix(10, "{ dp_shard = -1, ep = 5 }", 25, "1.35"), 5, 14, 12, 50, "1.35 x 50 / 5")
  -- one token: 2 rows over ep 2, f 0.5 -> 1 row
  check_plan(mix(4, "{ dp_shard = -1, ep = 2 }", 1, "0.5"), 2, 1, 12, 2, "0.5 x 2 / 2")
  -- past dropless: capped at 1 token x min(2, 5) = 1 x 2
  check_plan(mix(4, "{ dp_shard = -1, ep = 2 }", 1, "8"), 2, 2, 12, 2, "8 x 2 / 2 capped at dropless")
end

-- The all-to-all's uniform share (what each member is sent when the
-- counts are even, the size priced and sized): rounded up. 7 tokens x
-- top_k 2 = 14 rows over ep 4: 4 rows a member (3.5 up), 4 x dim 8
-- elements each op, 4 members x 32 bf16 = 256 bytes.
function T.uniform_share_rounded_up()
  local src = H.read("tests/ep/plans/ep4_mixtral_efsdp1.lua"):gsub("seq_len = 6", "seq_len = 7")
  local p = plan.from_source(src, "tests/ep/plans/ep4_mixtral_efsdp1.lua")
  local units, a2as = 0, 0
  for _, u in ipairs(p.layout.units) do
    if u.a2a then
      units = units + 1
      H.eq(u.a2a.rows, 14, u.name .. ": rows")
      H.eq(u.a2a.uniform, 4, u.name .. ": ceil(14 / 4) rows a member")
    end
  end
  for _, o in ipairs(p.ops) do
    if o.kind == "a2a" then
      a2as = a2as + 1
      H.eq(o.a2a_uniform, 4 * 8, "op " .. o.seq .. ": 4 rows x dim 8")
      H.eq(o.size_bytes, 4 * 4 * 8 * 2, "op " .. o.seq .. ": 4 members x 4 rows x 8 x bf16")
    end
  end
  assert(units > 0 and a2as > 0, "expert units and all-to-alls")
end

return T
