-- Tensor parallelism: placements, TP-local shapes and TP classes.
local H = require("helpers")
local plan = require("gen.plan")
local tp = require("gen.parallel.tp")
local T = {}

-- DTensor's torch.chunk split: ceil(n / tp) rows, trailing ranks fewer or none.
function T.local_rows_follow_torch_chunk()
  local want = { { 19, 18 }, { 2, 2, 1, 0 } }
  for t = 0, 1 do H.eq((tp.local_rows(37, 2, t)), want[1][t + 1], "37 over 2, rank " .. t) end
  for t = 0, 3 do H.eq((tp.local_rows(5, 4, t)), want[2][t + 1], "5 over 4, rank " .. t) end
end

-- The recording fsdp2_tp2: two TP classes; the root's slot is 246 elements
-- on TP rank 0 and 222 on TP rank 1; layers are even (294 on both).
function T.fsdp2_tp2_classes_and_slots()
  local p = plan.from_file("tests/plans/fsdp2_tp2.lua")
  H.eq(#p.tp_classes, 2, "TP classes")
  H.eq(p.class_of[0], 1, "TP rank 0's class")
  H.eq(p.class_of[1], 2, "TP rank 1's class")
  local root = { 246, 222 }
  for c, cls in ipairs(p.tp_classes) do
    for _, u in ipairs(cls.layout.units) do
      H.eq(u.total, u.is_root and root[c] or 294, string.format("class %d unit %s slot", c, u.name))
    end
  end
  -- wo is row-wise: its TP-local shape is (12, 6), FSDP shards that on dim 0.
  local wo = p.tp_classes[1].layout.units[2].params[4]
  H.eq(wo.name, "layers.0.p.wo", "param order")
  H.list_eq(wo.shape, { 12, 6 }, "wo TP-local shape")
  H.eq(wo.tp_dim, 1, "wo TP dim")
  H.list_eq(tp.placements(wo, 2), { "Shard(dim=0)", "Shard(dim=1)" }, "wo placements")
  local wq = p.tp_classes[1].layout.units[2].params[1]
  H.list_eq(tp.placements(wq, 2), { "_StridedShard(dim=0, sf=2)", "Shard(dim=0)" }, "wq placements")
  local norm = p.tp_classes[1].layout.units[1].params[2]
  H.list_eq(tp.placements(norm, 2), { "Shard(dim=0)", "Replicate()" }, "norm placements")
end

-- Even TP splits give one class: tables stay O(params), not O(tp).
function T.even_split_is_one_class()
  local p = plan.from_source("return { world_size = 8, parallel = { dp_shard = -1, tp = 4 }, model = { units = { "
    .. "{ name = 'l0', params = { { name = 'a', shape = { 64, 16 }, tp = 'colwise' } } }, "
    .. "{ name = 'root', params = { { name = 'b', shape = { 32 } } } } } } }", "plans/t.lua")
  H.eq(#p.tp_classes, 1, "classes")
  for t = 0, 3 do H.eq(p.class_of[t], 1, "class of TP rank " .. t) end
end

-- Llama under TP: torchtitan's placements; heads must divide by tp.
function T.llama_placements()
  local p = plan.from_source("return { world_size = 16, parallel = { dp_shard = -1, tp = 8 }, "
    .. "model = { family = 'llama', size = '8b', seq_len = 64 } }", "plans/t.lua")
  local want = { ["layers.0.attention.wq.weight"] = 0, ["layers.0.attention.wo.weight"] = 1,
                 ["layers.0.feed_forward.w2.weight"] = 1, ["layers.0.attention_norm.weight"] = false,
                 ["tok_embeddings.weight"] = 0, ["output.weight"] = 0, ["norm.weight"] = false }
  local seen = 0
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.params) do
      if want[q.name] ~= nil then
        H.eq(q.tp_dim or false, want[q.name], q.name .. " TP dim")
        seen = seen + 1
      end
    end
  end
  H.eq(seen, 7, "params checked")
  H.plan_fails("return { world_size = 12, topology = { gpus_per_node = 4 }, parallel = { dp_shard = -1, tp = 3 }, "
    .. "model = { family = 'llama', size = '8b' } }", "num_attention_heads=32 not divisible by tp=3")
end

-- Every dp_replicate x dp_shard x tp mesh ParallelDims accepts for a tiny
-- Llama on 8 and 12 ranks generates and proves (layout coverage, order,
-- memory plan, the TP classes' identical TP sequences); the ones it refuses
-- say why in the seeds' words.
function T.every_accepted_mesh_generates()
  local generated, refused = 0, 0
  for _, world in ipairs({ 8, 12 }) do
    for r = 1, world do
      for t = 1, world // r do
        if world % (r * t) == 0 then
          local src = string.format("return { world_size = %d, topology = { gpus_per_node = 4 }, "
            .. "parallel = { dp_replicate = %d, dp_shard = -1, tp = %d }, "
            .. "model = { family = 'llama', dim = 48, n_layers = 2, n_heads = 6, n_kv_heads = 2, vocab_size = 97, "
            .. "multiple_of = 16, seq_len = 24 } }", world, r, t)
          if 6 % t == 0 and 2 % t == 0 and 24 % t == 0 then
            local p = plan.from_source(src, "plans/t.lua")
            H.eq(p.world_size, world, "world")
            generated = generated + 1
          else
            H.plan_fails(src, "not divisible by tp=" .. t)
            refused = refused + 1
          end
        end
      end
    end
  end
  H.eq(generated > 10 and refused > 5, true, string.format("meshes: %d generated, %d refused", generated, refused))
end

-- TP over a model none of whose parameters TP splits would do nothing.
function T.tp_without_placements_refused()
  H.plan_fails("return { world_size = 4, parallel = { tp = 2 }, model = { units = { { name = 'root', params = { "
    .. "{ name = 'w', shape = { 4, 4 } } } } } } }", "parallel.tp", "no parameter has a TP placement")
end

-- Async TP (parallel.async_tp, torchtitan's enable_async_tensor_parallel):
-- the same collectives, in the same order (the tables do not change), each
-- sequence-parallel one carrying the FLOPs of the matmul it is fused with;
-- the timeline hides the collective behind that matmul but for one chunk.
function T.async_tp_overlaps_the_matmuls_it_feeds()
  local src = io.open("plans/llama_tiny_tp.lua"):read("a")
  local big = src:gsub("dim = 64, n_layers = 2", "dim = 4096, n_layers = 2"):gsub("seq_len = 32", "seq_len = 4096")
    :gsub("world_size = 8", "world_size = 16"):gsub("tp = 2,", "tp = 8,"):gsub("n_heads = 4, n_kv_heads = 2", "n_heads = 32, n_kv_heads = 8")
  local sync = plan.from_source(big, "plans/t.lua")
  local async = plan.from_source(big:gsub("sequence_parallel = true", "sequence_parallel = true, async_tp = true"),
    "plans/t.lua")
  H.eq(#async.ops, #sync.ops, "the same ops")
  local cfg, tokens, T8 = async.model_config, 2 * 4096, 8
  local want = {
    ["attention input sequence"] = 2 * tokens * cfg.dim * (cfg.dim + 2 * cfg.n_kv_heads * cfg.head_dim) // T8,
    ["wo output to sequence shards"] = 2 * tokens * cfg.dim * cfg.dim // T8,
    ["feed-forward input sequence"] = 2 * tokens * cfg.dim * 2 * cfg.hidden // T8,
    ["w2 output gradient"] = 2 * tokens * cfg.hidden * cfg.dim // T8,
    ["output input sequence"] = 2 * tokens * cfg.dim * cfg.vocab_size // T8,
  }
  local fused, unfused = 0, 0
  for i, o in ipairs(async.ops) do
    local q = sync.ops[i]
    H.eq(o.kind .. " " .. tostring(o.count), q.kind .. " " .. tostring(q.count), "op " .. i)
    if o.group == "tp" then
      if o.mm_flops then
        fused = fused + 1
        if want[o.what] then H.eq(o.mm_flops, want[o.what], o.what) end
      else
        unfused = unfused + 1
        assert(o.kind == "tp_all_reduce" or o.what:find("embedding"), "only all-reduces and the embedding's stay: " .. o.what)
      end
    end
  end
  assert(fused > 0 and unfused > 0, string.format("fused %d, unfused %d", fused, unfused))
  local figures = require("gen.figures")
  local fs, fa = figures.of(sync), figures.of(async)
  if not (fa.step_us < fs.step_us and fa.exposed_us < fs.exposed_us) then
    error(string.format("async TP: step %.0f us (sync %.0f), exposed %.0f (sync %.0f)", fa.step_us, fs.step_us,
      fa.exposed_us, fs.exposed_us))
  end
  -- said where a reader looks: the summary's mesh, the assumptions, plan.json
  local audit = require("gen.audit")
  local md = audit.schedule_md(async, audit.fingerprint(async))
  assert(md:find("(replicate + async TP)", 1, true) and md:find("- Async TP (parallel.async_tp", 1, true), "SCHEDULE.md")
  H.eq(require("gen.json").decode(audit.json(async, audit.fingerprint(async))).parallel.async_tp, true, "plan.json")
  -- the hiding itself: max(c, m) + min(c, m) / tp - m
  local tl = require("gen.timeline")
  local s = { flops_per_us = 100 }
  H.eq(tl.exposed_tp_us({ predicted_us = 50, mm_flops = 100 * 80 }, s, 8), 50 / 8, "comm shorter than its matmul")
  H.eq(tl.exposed_tp_us({ predicted_us = 80, mm_flops = 100 * 40 }, s, 4), 40 + 40 / 4, "comm longer")
  H.eq(tl.exposed_tp_us({ predicted_us = 80 }, s, 4), 80, "not fused")
  -- refused where it would change nothing
  H.plan_fails(src:gsub("sequence_parallel = true", "sequence_parallel = false, async_tp = true"),
    "parallel.async_tp", "sequence_parallel = false leaves only all-reduces")
  H.plan_fails(src:gsub("tp = 2, sequence_parallel = true", "async_tp = true"), "parallel.async_tp", "tp=1")
end

return T
