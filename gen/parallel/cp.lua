-- Context parallel, the module (gen/parallel/init.lua's contract), as
-- torchtitan 0.3 runs it on its llama3 and qwen3 (docs/context-parallel.md;
-- recorded live on gloo by tests/titan/test_cp_record.py):
--  * the mesh: cp is a dim of the dense mesh between dp_shard and tp
--    (gen/dims.lua), and FSDP shards over dp_shard x cp (gen/dims.lua's
--    fsdp alias, gen/parallel/fsdp_layout.lua's W): torchtitan's fsdp mesh,
--    fully_shard's ("dp_shard", "cp") under its default spmd_types backend;
--    HSDP replicates over dp_replicate as without cp;
--  * each rank runs seq_len / cp tokens of every sequence (the head-tail
--    load balancer shards inputs, labels, positions and the block mask: no
--    collective), so the activation model's tokens divide by cp
--    (gen/compute.lua);
--  * unit_ops: every transformer block's attention all-gathers K and V over
--    the cp group before flex attention (spmd_types' S(1) -> R on cp, one
--    all_gather_into_tensor each), and its backward reduce-scatters their
--    gradients (SUM), inside the block's compute: per rank
--    local_batch_size x seq_len / cp x n_kv_heads x head_dim elements each,
--    in the block's compute dtype (its all-gather dtype). They are the
--    activation collectives' op kinds (gen/opkinds.lua's tp_all_gather,
--    tp_reduce_scatter: in place on the unit's activation buffer, over the
--    op's group, the rank's slot its key in that group) on group "cp".
--    Under activation checkpointing (full or selective: torchtitan wraps
--    every block) the backward re-runs the block's forward first, and with
--    it the two all-gathers (spmd_types issues them as c10d all-gathers,
--    which SelectiveAC's save list does not hold): recorded live, they
--    come before the gradients' reduce-scatters (recompute = true).
--  * beside TP (with or without sequence parallelism; recorded live:
--    test_cp_record.py's cp2_tp2, cp2_tp2_nosp): the mesh is (.., cp, tp),
--    TP the inner dim of FSDP's dp_shard x cp storage mesh
--    (distributed/full_dtensor.py:56, :92-95); the inputs are S(1) on cp
--    and R on tp (full_dtensor.py:145-152), so TP's activation
--    collectives carry the rank's seq_len / cp tokens (gen/parallel/tp.lua),
--    and the K/V the attention exchanges are its TP-local kv heads,
--    n_kv_heads / tp (S(2) on tp, S(1) -> R on cp at the inner attention's
--    local_map: models/common/decoder_sharding.py:225-260). The exchange
--    sits between TP's attention-input gather and wo's output collective
--    (backward: between wo's output-gradient one and the attention input
--    gradient's): each op names its region in the block and
--    gen/parallel/init.lua's unit_ops merges the two modules' ops by it.
--  * on the MoE families (mixtral, qwen3_moe: torchtitan's Qwen3 MoE
--    decoder, flex attention; recorded live: mixtral_dp2_cp2) the same
--    exchange in each block's attention; beside EP (ep borrows the
--    innermost ranks of dp_shard x cp x tp, gen/dims.lua) each rank routes
--    its own seq_len / cp tokens (gen/parallel/ep.lua), the dispatch after
--    the block's K/V all-gathers (recorded: mixtral_dp2_cp2_ep2).
-- Refused, one line each: Ulysses (torch 2.15 and torchtitan 0.3 have
-- none), cp with pp (not planned), ep and cp x tp that do not nest (the
-- runtime's refined mesh), a family not in cp.FAMILIES, a seq_len torchtitan refuses (its Trainer's
-- tp (under SP) x 2 x cp, trainer.py:306-315; flex's CP block mask needs
-- cp x 128).
local util = require("gen.util")

local cp = { name = "cp", label = "CP", dims = { "cp" }, groups = { "cp" } }

-- flex attention's query block (torch's _DEFAULT_SPARSE_BLOCK_SIZE): the CP
-- block mask needs seq_len divisible by cp x it (_create_cp_block_mask).
cp.FLEX_BLOCK = 128

function cp.used(d) return d.cp > 1 end

local function refuse(ctx, field, fmt, ...) util.field_error(ctx, field, string.format(fmt, ...)) end

-- The degrees alone (gen/parallel/init.lua's check_supported runs it, as
-- tests/titan/dims_dump.lua does): Ulysses, ep across cp groups without
-- nesting, and cp beside pp.
function cp.check_dims(ctx, d)
  if d.cp == 1 then return end -- (ulysses_degree without cp: gen/dims.lua refuses it)
  if d.ulysses_degree ~= nil then
    refuse(ctx, "parallel.ulysses_degree", "ulysses_degree=%d: torch 2.15 and torchtitan 0.3 have no Ulysses "
      .. "(all-to-all over heads) context parallel; their cp all-gathers K and V over the sequence "
      .. "(docs/context-parallel.md): remove ulysses_degree", d.ulysses_degree)
  end
  -- ep borrows the innermost ranks of dp_shard x cp x tp (gen/dims.lua);
  -- the runtime's mesh refines the dense and expert meshes
  -- (gen/emit.lua's refined_mesh), whose strides must nest: ep a multiple
  -- or a divisor of cp x tp (every power-of-two choice is)
  local inner = d.cp * d.tp
  if d.ep > 1 and d.ep % inner ~= 0 and inner % d.ep ~= 0 then
    refuse(ctx, "parallel.cp", "cp=%d x tp=%d with ep=%d: the expert mesh's ep groups would cut across cp groups "
      .. "without nesting (commplan's runtime mesh refines the two meshes; torchtitan runs it); pick ep a multiple "
      .. "or a divisor of %d, or set cp=1", d.cp, d.tp, d.ep, inner)
  end
  for _, name in ipairs({ "pp" }) do
    if d[name] > 1 then
      refuse(ctx, "parallel.cp", "cp=%d with %s=%d: context parallel is planned with FSDP, HSDP, TP and EP only "
        .. "(torchtitan's cp with %s is not modelled yet); set cp=1 or %s=1", d.cp, name, d[name], name, name)
    end
  end
end

-- The families whose attention exchanges K/V over cp, by the suffix of the
-- parameter that marks a block: torchtitan 0.3's llama3 and qwen3 registries
-- build FlexAttention (attn_backend="flex" by default: models/llama3/
-- __init__.py, models/qwen3/__init__.py:613-622 -> models/common/
-- config_utils.py:83-84), which distributed/full_dtensor.py:43-53
-- (validate_config) accepts under CP; qwen3's q_norm / k_norm run before
-- the exchange (it is at the inner attention's boundary) and add none.
cp.FAMILIES = { llama = "attention.wo.weight", qwen3 = "attention.wo.weight", mixtral = "attention.wo.weight",
                qwen3_moe = "attention.wo.weight" }

function cp.rules(ctx, d, p)
  if d.cp == 1 then return end
  if not cp.FAMILIES[p.model.family] then
    refuse(ctx, "parallel.cp", "cp=%d: context parallel is planned for the llama and qwen3 families (their "
      .. "attention's K/V exchange); the %s family is not; set cp=1", d.cp, p.model.family)
  end
  local seq = p.model.seq_len
  if not seq then
    refuse(ctx, "model.seq_len", "cp=%d: seq_len is needed to size the K/V all-gathers; set model.seq_len (and "
      .. "training.local_batch_size, sequences per rank, default 1)", d.cp)
  end
  -- torchtitan's Trainer (trainer.py:306-315): seq_len % (tp under sequence
  -- parallelism x 2 x cp): the head-tail balancer's 2 x cp chunks, each
  -- rank's seq_len / cp tokens then cut in tp sequence shards
  local sp = d.tp > 1 and p.parallel.sequence_parallel ~= false
  local div = (sp and d.tp or 1) * 2 * d.cp
  if seq % div ~= 0 then
    refuse(ctx, "model.seq_len", "seq_len=%d is not divisible by %s2 x cp=%d (torchtitan's Trainer, trainer.py:306: "
      .. "the head-tail load balancer cuts each sequence into 2 x cp chunks%s); pick seq_len a multiple of %d", seq,
      sp and string.format("tp=%d x ", d.tp) or "", div, sp and ", sequence parallelism each rank's in tp" or "", div)
  end
  -- torch's _create_cp_block_mask: Q_LEN % (cp * flex's query block)
  local block = d.cp * cp.FLEX_BLOCK
  if seq % block ~= 0 then
    refuse(ctx, "model.seq_len", "seq_len=%d is not divisible by cp x %d = %d (torch's CP block mask for flex "
      .. "attention, torchtitan's llama3 attention); pick seq_len a multiple of %d", seq, cp.FLEX_BLOCK, block, block)
  end
end

local function holds(u, suffix)
  for _, q in ipairs(u.params) do
    if q.name:sub(-#suffix) == suffix then return true end
  end
  return false
end

-- Each block's K/V exchange: u.cp_acts, and the unit's activation buffer
-- (act_numel, ag_dtype elements) at least the gathered K (or V).
function cp.on_layout(_, lay, _, d, p, cfg)
  local b = p.training and p.training.local_batch_size or 1
  local ac = p.training and p.training.activation_checkpointing or "none"
  local recompute = ac == "full" or ac == "selective"
  -- K and V as the attention sees them: the rank's seq_len / cp tokens, its
  -- TP-local kv heads (n_kv_heads / tp: TP's colwise wk, wv, the heads
  -- S(2) on tp, models/common/decoder_sharding.py:241-245)
  local count = b * (p.model.seq_len // d.cp) * (cfg.n_kv_heads // d.tp) * cfg.head_dim
  local block = cp.FAMILIES[p.model.family]
  for _, u in ipairs(lay.units) do
    if holds(u, block) then
      u.cp_acts = {
        { kind = "tp_all_gather", phase = "forward", what = "K over the sequence (cp)", region = "attention" },
        { kind = "tp_all_gather", phase = "forward", what = "V over the sequence (cp)", region = "attention" },
      }
      if recompute then
        u.cp_acts[3] = { kind = "tp_all_gather", phase = "backward", recompute = true, region = "recompute",
                         what = "K over the sequence (cp), recomputed (activation checkpointing)" }
        u.cp_acts[4] = { kind = "tp_all_gather", phase = "backward", recompute = true, region = "recompute",
                         what = "V over the sequence (cp), recomputed (activation checkpointing)" }
      end
      for _ = 1, 2 do
        u.cp_acts[#u.cp_acts + 1] = { kind = "tp_reduce_scatter", phase = "backward", what = "K/V gradient (cp)",
                                      region = "attention" }
      end
      u.cp_count = count
      u.act_numel = math.max(u.act_numel or 0, count * d.cp)
    end
  end
  lay.cp = { size = d.cp, count = count, blocks = 0, recompute = recompute }
  for _, u in ipairs(lay.units) do
    if u.cp_acts then lay.cp.blocks = lay.cp.blocks + 1 end
  end
  return lay
end

-- Inside the block's compute, on the compute stream, over the cp group.
function cp.unit_ops(out, u, m, at)
  local acts = u.cp_acts
  if not acts or (at ~= "forward" and at ~= "backward") then return end
  for _, a in ipairs(acts) do
    if a.phase == at then
      out[#out + 1] = { kind = a.kind, unit = u.index, micro_step = m, phase = a.phase, group = "cp",
                        dtype = u.ag_dtype, count = u.cp_count,
                        reduce_op = a.kind == "tp_reduce_scatter" and "sum" or nil, what = a.what,
                        recompute = a.recompute, region = a.region }
    end
  end
end

-- Every block issues its two all-gathers in each micro-step's forward and
-- its two reduce-scatters in its backward (after its two recomputed
-- all-gathers under checkpointing), nothing else runs on cp.
function cp.prove_class(lay, ops, p)
  local want, got = {}, {}
  local per = lay.cp and lay.cp.recompute and 4 or 2
  for _, u in ipairs(lay.units) do
    if u.cp_acts then want[u.index] = { forward = 2 * p.fsdp.micro_steps, backward = per * p.fsdp.micro_steps } end
  end
  for _, o in ipairs(ops) do
    if o.group == "cp" then
      local w = want[o.unit]
      local kind = (o.phase == "forward" or o.recompute) and "tp_all_gather" or "tp_reduce_scatter"
      if not w or o.kind ~= kind or o.count ~= lay.units[o.unit + 1].cp_count then
        error(string.format("internal: cp op %d (%s of unit %d in %s) is no block's K/V exchange", o.seq, o.kind,
          o.unit, o.phase), 0)
      end
      got[o.unit] = got[o.unit] or { forward = 0, backward = 0 }
      got[o.unit][o.phase] = got[o.unit][o.phase] + (o.times or 1)
    end
  end
  for i, w in pairs(want) do
    local g = got[i] or { forward = 0, backward = 0 }
    if g.forward ~= w.forward or g.backward ~= w.backward then
      error(string.format("internal: unit %d issues %d/%d cp collectives in forward/backward, not %d/%d", i,
        g.forward, g.backward, w.forward, w.backward), 0)
    end
  end
end

return cp
