"""Plans from torchtitan's own Llama 3 (torchtitan 0.3): its model, or the config it builds it from.

    plan_from_titan(model, name, world_size, parallel=None, fsdp=None, topology=None,
                    training=None, seq_len=None, family="auto", out=None)

``model`` is a torchtitan decoder (``torchtitan.models.llama3.Llama3Model``, on any device, the
meta device included), its config (``Llama3Model.Config``, e.g. ``model_registry("8B").model``:
built on the meta device here) or its ``ModelSpec``. The units are the ones torchtitan 0.3's
``parallelize_llama`` gives it (``torchtitan.distributed.fsdp.apply_fsdp_to_decoder``):
``tok_embeddings``, every block of ``model.layers``, ``[norm, lm_head]`` without reshard after
forward, and the root without parameters; with weight tying, ``[tok_embeddings, norm, lm_head]``
as one unit kept unsharded through forward. Parameters are in registration order, FSDP shards
dim 0, and each carries the tensor-parallel placement its module declares to torchtitan
(``_sharding_config.state_shardings``: ``S(0)`` colwise, ``S(1)`` rowwise, ``R`` / ``I``
replicated). A config whose sharding is not declared yet gets torchtitan's own
(``set_llama3_sharding_config``, sequence parallel on, as its Trainer does).

``family``:

- ``"auto"`` (default) and ``"generic"``: a generic plan holding exactly torchtitan's names,
  shapes, order and placements (``layers.N.attention.qkv_linear.wqkv.weight``, fused as
  torchtitan 0.3's registry flavors build it, and ``lm_head.weight``), so the runtime's module
  matching finds every parameter by its name. With ``training={"loss_chunks": N}``, N >= 2,
  its ``norm_lm_head`` unit says ``loss_head``: the plan follows torchtitan's ChunkedLossWrapper
  (gen/parallel/fsdp.lua), which CommplanFSDP drives (commplan.chunked_loss). Parameter and
  module names drop activation checkpointing's ``_checkpoint_wrapped_module`` segment
  (commplan.recompute), so a model with AC applied gives the same plan.
- ``"llama"``: commplan's llama family (``gen/models/llama.lua``, which also models the TP
  activation collectives) when the model is one: q/k/v unfused (``fuse_qkv=False``), no biases,
  no weight tying, torchtitan's FFN sizing. The family keeps torchtitan <= 0.2's names:
  ``attention.wq/wk/wv`` for 0.3's ``attention.qkv_linear.wq/wk/wv`` and ``output`` for
  ``lm_head`` -- the same tensors in the same places, under other names. A fused ``wqkv`` is
  refused (the family has three parameters where torchtitan 0.3 has one, so the all-gather
  slots would differ).

torch and torchtitan are imported only when a config is given; a model is read duck-typed.
"""

from . import validate
from .errors import PlanError
from .recompute import clean_fqn
from .planfile import dtype_name, plan_from_named_parameters

__all__ = ["TITAN_FSDP", "plan_from_titan", "titan_fsdp_units", "titan_units", "titan_model_numbers"]

# What torchtitan 0.3's parallelize_llama gives fully_shard with its TrainingConfig defaults:
# MixedPrecisionPolicy(bf16, fp32), and a gradient divide factor of 1 (disable_fsdp_gradient_division:
# the loss divides by the global token count), a sum.
TITAN_FSDP = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"}

# torchtitan 0.3 name -> commplan's llama family name (torchtitan <= 0.2's).
_LLAMA_RENAME = (("attention.qkv_linear.wq.", "attention.wq."), ("attention.qkv_linear.wk.", "attention.wk."),
                 ("attention.qkv_linear.wv.", "attention.wv."))


def _as_model(model, fused=None):
    """A module from a module, a config or a ModelSpec (configs are built on the meta device); fused:
    torchtitan's fused layouts to apply to a config first (its override.imports: swiglu,
    grouped_experts, mla), after the sharding declarations as its Trainer orders them
    (trainer.py:352-358: update_from_config, then apply_overrides)."""
    if hasattr(model, "named_parameters") and hasattr(model, "named_modules"):
        if fused:
            raise PlanError("fused=%s: a built model already holds its layout (torchtitan applies overrides to the "
                            "config, config/override.py:446); give its config or ModelSpec, or drop fused"
                            % list(fused))
        return model
    cfg = getattr(model, "model", model) if not hasattr(model, "build") else model
    if not hasattr(cfg, "build") or not hasattr(cfg, "layers"):
        raise PlanError("plan_from_titan takes a torchtitan decoder module, its config (Llama3Model.Config) or "
                        "its ModelSpec; got %s" % validate.describe(model, False))
    import copy

    import torch
    cfg = copy.deepcopy(cfg)
    layer0 = cfg.layers[0] if cfg.layers else None
    if layer0 is not None and getattr(getattr(layer0, "attention_norm", None), "sharding_config", None) is None:
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config
        set_llama3_sharding_config(cfg, enable_sp=True)
    if fused:
        from torchtitan.config import apply_overrides
        from torchtitan.config.override import OverrideConfig
        from .jobconfig import FUSED_TARGETS
        target = {v: k for k, v in FUSED_TARGETS.items()}
        bad = [f for f in fused if f not in target]
        if bad:
            raise PlanError("fused: %s is not a torchtitan fused layout; give %s" % (bad[0], ", ".join(sorted(target))))
        if not apply_overrides(OverrideConfig(imports=[target[f] for f in fused]), cfg):
            raise PlanError("fused=%s: torchtitan replaces nothing in this model (config/override.py:503-512); drop "
                            "it" % list(fused))
    with torch.device("meta"):
        return cfg.build()


def _tp_of(module, pname):
    """The TP placement torchtitan declares for module's parameter pname, as a plan's tp."""
    sc = getattr(module, "_sharding_config", None)
    layout = sc.state_shardings.get(pname) if sc is not None and sc.state_shardings else None
    if layout is None:
        return None
    tp = None
    for axis, t in layout.axis_types.items():
        if str(getattr(axis, "value", axis)) == "tp":
            tp = t
    if tp is None or getattr(tp, "dim", None) is None:  # R, I, P: not split over TP
        return "replicate"
    dim = tp.dim
    is_linear = hasattr(module, "in_features") and hasattr(module, "out_features")
    if is_linear and dim in (0, 1):
        return ("colwise", "rowwise")[dim]
    return "shard(%d)" % dim


def _wrapping(model, reshard_after_forward_policy="default"):
    """torchtitan 0.3's apply_fsdp_to_decoder units in forward order, the root last:
    [(name, [modules], reshard_after_forward)]; the [norm, lm_head] (or tied) unit keeps its
    parameters after forward unless the policy is "always" (distributed/fsdp.py:183-204)."""
    head = reshard_after_forward_policy == "always"
    for attr in ("tok_embeddings", "layers", "norm", "lm_head"):
        if not hasattr(model, attr):
            raise PlanError("plan_from_titan: the model has no %s; it takes a torchtitan decoder (Llama3Model)" % attr)
    layers = model.layers
    blocks = list(layers.items()) if hasattr(layers, "items") else list(enumerate(layers))
    units = []
    if getattr(model, "enable_weight_tying", False):
        units.append(("tok_embeddings_norm_lm_head", [model.tok_embeddings, model.norm, model.lm_head], head))
        units += [("layers.%s" % k, [b], None) for k, b in blocks]
    else:
        units.append(("tok_embeddings", [model.tok_embeddings], None))
        units += [("layers.%s" % k, [b], None) for k, b in blocks]
        units.append(("norm_lm_head", [model.norm, model.lm_head], head))
    units.append(("root", [model], None))
    return units


def titan_fsdp_units(model, reshard_after_forward_policy="default"):
    """torchtitan 0.3's fully_shard calls for a built decoder, as commplan Units (modules, the
    plan writer's names, reshard_after_forward), root last: what CommplanFSDP takes to drive a
    plan_from_titan plan on the very model."""
    from .modules import Unit
    return [Unit(mods, name=name, reshard_after_forward=raf)
            for name, mods, raf in _wrapping(model, reshard_after_forward_policy)]


def titan_units(model):
    """The plan writer's units for a torchtitan decoder (or its config): torchtitan's names,
    wrapping and TP placements; [{name, params: [{name, shape, dtype, tp}], reshard_after_forward}].
    A unit's parameters are collected as FSDP2 does (_get_managed_modules / _get_managed_states):
    a post-order walk of its modules that stops at other units' modules, each module's own
    parameters in registration order, a shared parameter once."""
    model = _as_model(model)
    mod_name = {id(m): clean_fqn(n) for n, m in model.named_modules()}  # checkpoint_wrapper's segment dropped
    wrapping = _wrapping(model)
    unit_roots = {id(m) for _, ms, _ in wrapping for m in ms}
    seen, out = set(), []
    for name, mods, raf in wrapping:
        roots = {id(m) for m in mods}
        order = []

        def walk(mod):
            if id(mod) in unit_roots and id(mod) not in roots:
                return  # another unit's subtree
            for child in mod.children():
                walk(child)
            order.append(mod)

        for m in mods:
            walk(m)
        params = []
        for mod in order:
            for pn, p in mod.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                prefix = mod_name[id(mod)]
                fqn = (prefix + "." if prefix else "") + pn
                q = {"name": fqn, "shape": [int(d) for d in p.shape], "dtype": dtype_name(p.dtype, fqn),
                     "tp": _tp_of(mod, pn)}
                if not p.requires_grad:
                    # torchtitan's LoRA converter freezes every base weight and every other module's
                    # own parameters (components/lora.py:80-81, 125-129): gathered, never reduced
                    q["frozen"] = True
                params.append(q)
        out.append({"name": name, "params": params, "reshard_after_forward": raf})
    return out


def titan_model_numbers(model):
    """n_heads, n_kv_heads, head_dim (and fuse_qkv) of a torchtitan decoder's first block, its
    n_layers and enable_weight_tying (models/common/decoder.py:206; attention.py's head_dim)."""
    model = _as_model(model)
    blocks = list(model.layers.values()) if hasattr(model.layers, "values") else list(model.layers)
    att = blocks[0].attention
    n_heads = getattr(att, "n_heads", None)
    n_kv = getattr(att, "n_kv_heads", None) or n_heads
    fused = hasattr(getattr(att, "qkv_linear", None), "wqkv")
    hd = getattr(att, "head_dim", None)
    if not isinstance(hd, int) and n_heads:
        wo = getattr(att, "wo", None)
        hd = int(wo.weight.shape[1]) // n_heads if wo is not None and hasattr(wo, "weight") else None
    return {"n_heads": n_heads, "n_kv_heads": n_kv, "fuse_qkv": fused, "head_dim": hd, "n_layers": len(blocks),
            "enable_weight_tying": bool(getattr(model, "enable_weight_tying", False))}


def _llama_units(units):
    """torchtitan 0.3's names as commplan's llama family's, or a PlanError saying why they cannot be."""
    out = []
    for u in units:
        ps = []
        for p in u["params"]:
            n = p["name"]
            if ".qkv_linear.wqkv." in n:
                raise PlanError("%s: q, k and v are one fused parameter (torchtitan 0.3's registry flavors build "
                                "them so, fuse_qkv=True); commplan's llama family has three (wq, wk, wv), so its "
                                "all-gather slots would differ: use family=\"auto\" (a generic plan with torchtitan's "
                                "parameters as they are)" % n)
            for old, new in _LLAMA_RENAME:
                n = n.replace(old, new)
            if n == "lm_head.weight":
                n = "output.weight"
            ps.append({"name": n, "shape": p["shape"], "dtype": p["dtype"]})
        name = {"norm_lm_head": "norm_output"}.get(u["name"], u["name"])
        out.append({"name": name, "params": ps, "reshard_after_forward": u["reshard_after_forward"]})
    return out


def attn_backend(model):
    """The attention backend a built torchtitan model (or one block's attention config) runs ("flex" for FlexAttention, flex_flash too; "varlen"
    for VarlenAttention), as distributed/full_dtensor.py:44-52 walks model.modules() to refuse CP; None where
    it has neither (a model not built from torchtitan's attention)."""
    mods = model.modules() if hasattr(model, "modules") else [getattr(model, "inner_attention", None)]
    for mod in mods:
        name = type(mod).__qualname__  # (a config's: "FlexAttention.Config")
        if name.startswith("FlexAttention"):
            return "flex"
        if name.startswith("VarlenAttention"):
            return "varlen"
    return None


def is_gpt_oss(model):
    """Whether model (a module, its config or its ModelSpec) is torchtitan 0.3's gpt-oss."""
    if getattr(model, "name", None) == "gpt_oss" and hasattr(model, "model"):
        return True
    cls = type(getattr(model, "model", model) if not hasattr(model, "named_parameters") else model)
    return cls.__qualname__.startswith("GptOssModel") and "gpt_oss" in cls.__module__


def gpt_oss_numbers(model):
    """commplan's gpt_oss family numbers (gen/models/gpt_oss.lua FIELDS) of a torchtitan 0.3 gpt-oss
    model, read from the built module (shapes) and its config (the sliding windows): a PlanError
    where its blocks do not follow torchtitan's pattern (a window on the even blocks only, one size,
    models/gpt_oss/__init__.py:209), which the family plans."""
    if not hasattr(model, "named_parameters"):
        # (built on the meta device as it is: its shapes are all that is read, no sharding config needed)
        import torch
        with torch.device("meta"):
            model = getattr(model, "model", model).build()
    blocks = list(model.layers.values()) if hasattr(model.layers, "values") else list(model.layers)
    nums = titan_model_numbers(model)
    ex = blocks[0].moe.routed_experts.inner_experts
    E, D, F = (int(x) for x in ex.mlp2_weight_EDF.shape)
    windows = [getattr(lc.attention, "sliding_window_size", None) for lc in model.config.layers]
    w = windows[0] if windows else None
    for i, wi in enumerate(windows):
        if wi != (w if i % 2 == 0 else None):
            raise PlanError("plan_from_titan: gpt-oss block %d has sliding_window_size %r; commplan's gpt_oss family "
                            "plans torchtitan's pattern (a window on the even blocks, one size: models/gpt_oss/"
                            "__init__.py:209), give a model built so" % (i, wi))
    out = {"family": "gpt_oss", "dim": D, "n_layers": len(blocks), "n_heads": nums["n_heads"],
           "n_kv_heads": nums["n_kv_heads"], "head_dim": nums["head_dim"],
           "vocab_size": int(model.tok_embeddings.weight.shape[0]), "moe_hidden_dim": F, "num_experts": E,
           "top_k": int(blocks[0].moe.router.top_k), "fuse_qkv": nums["fuse_qkv"]}
    if w is not None:
        out["sliding_window"] = int(w)
    # its attention backend (model_registry's attn_backend, models/gpt_oss/__init__.py:388-396), which decides
    # whether torchtitan runs context parallel (gen/parallel/cp.lua cp.rules)
    backend = attn_backend(model)
    if backend:
        out["attn_backend"] = backend
    return out


def is_deepseek_v3(model):
    """Whether model (its ModelSpec or config) is torchtitan 0.3's deepseek_v3 (DeepSeekV3Model)."""
    if getattr(model, "name", None) == "deepseek_v3" and hasattr(model, "model"):
        return True
    cfg = getattr(model, "model", model)
    cls = type(cfg)
    return "deepseek_v3" in cls.__module__ and cls.__qualname__.startswith("DeepSeekV3Model")


def deepseek_v3_numbers(model):
    """commplan's deepseek_v3 family numbers (gen/models/deepseek_v3.lua FIELDS) of a torchtitan 0.3
    deepseek_v3 ModelSpec or config, read from its config: the blocks' MLA and MoE, the dense first
    blocks, the router, and num_mtp_layers (len(config.mtp_layers): model_registry(..., num_mtp_layers=n),
    models/deepseek_v3/__init__.py:617-628, as deepseek_v3_debugmodel_mtp sets it, config_registry.py:73-79)."""
    cfg = getattr(model, "model", model)
    if hasattr(cfg, "named_parameters"):
        cfg = cfg.config
    layers = list(cfg.layers)
    moe = next((lc.moe for lc in layers if lc.moe is not None), None)
    if moe is None:
        raise PlanError("plan_from_titan: this deepseek_v3 config has no MoE block; commplan's deepseek_v3 family "
                        "plans torchtitan's (dense first blocks, then MoE)")
    n_dense = 0
    while n_dense < len(layers) and layers[n_dense].moe is None:
        n_dense += 1
    if any(lc.moe is None for lc in layers[n_dense:]):
        raise PlanError("plan_from_titan: a dense block after an MoE block; commplan's deepseek_v3 family plans "
                        "torchtitan's n_dense_layers first")
    a = layers[0].attention
    ie, r = moe.routed_experts.inner_experts, moe.router
    shared = moe.shared_experts
    out = {"family": "deepseek_v3", "dim": int(cfg.dim), "n_layers": len(layers), "n_dense_layers": n_dense,
           "n_heads": int(a.n_heads), "vocab_size": int(cfg.vocab_size), "q_lora_rank": int(a.q_lora_rank),
           "kv_lora_rank": int(a.kv_lora_rank), "qk_nope_head_dim": int(a.qk_nope_head_dim),
           "qk_rope_head_dim": int(a.qk_rope_head_dim), "v_head_dim": int(a.v_head_dim),
           "moe_hidden_dim": int(ie.hidden_dim), "num_experts": int(ie.num_experts),
           "num_shared_experts": int(shared.w1.out_features // ie.hidden_dim) if shared is not None else 0,
           "top_k": int(r.top_k), "route_norm": bool(r.route_norm),
           "n_expert_groups": int(r.num_expert_groups or 0), "n_limited_groups": int(r.num_limited_groups or 0)}
    if n_dense > 0:
        out["dense_hidden_dim"] = int(layers[0].feed_forward.w1.out_features)
    backend = attn_backend(a)  # (its registry's attn_backend, models/deepseek_v3/__init__.py:616-618)
    if backend:
        out["attn_backend"] = backend
    n_mtp = len(getattr(cfg, "mtp_layers", None) or [])
    if n_mtp:
        out["num_mtp_layers"] = n_mtp
    return out


def plan_from_titan(model, name, world_size, parallel=None, fsdp=None, topology=None, training=None,
                    seq_len=None, family="auto", out=None, pipeline=None, spmd_backend="spmd_types",
                    fused=None):
    """The plan file (Lua text) for a torchtitan Llama model, its config or ModelSpec (module
    docstring). parallel, fsdp, topology, training: as in docs/plan-files.md, fsdp defaulting to
    what torchtitan's parallelize gives fully_shard (TITAN_FSDP: bf16 all-gathers, fp32
    reductions, summed); seq_len: the model's (for the TP and CP divisibility checks and the
    audit). TP placements are written only where parallel.tp > 1. out: a path to write it to.
    spmd_backend: torchtitan's parallelism.spmd_backend. A parameter its LoRA converter froze is
    written frozen (gathered, never reduced) under "partial_dtensor" / "full_dtensor"; under
    "spmd_types", torchtitan 0.3's default, parallelize re-registers every parameter as a new
    nn.Parameter, trainable (protocols/module.py:315, where the DTensor path at :373-378 keeps
    requires_grad), so FSDP2 and the optimizer train them all and nothing is written frozen.
    fused: torchtitan's fused layouts (["swiglu"]: its override.imports fused_swiglu) applied to a
    config before it is built, so the plan holds torchtitan's fused parameters (w13) as they are."""
    if is_gpt_oss(model):
        if fused:
            raise PlanError("fused=%s: the gpt_oss family has no fused layout in commplan (gen/models/fused.lua "
                            "covers llama, qwen3 and the MoE families); drop fused" % list(fused))
        # torchtitan's gpt-oss: commplan's gpt_oss family (gen/models/gpt_oss.lua), its numbers read
        # from the model; parameters stored as torchtitan builds them (fp32)
        validate.check_family(family, ("auto", "gpt_oss"))
        if fsdp is None:
            fsdp = dict(TITAN_FSDP)
        m = dict(gpt_oss_numbers(model), dtype="fp32")
        if seq_len is not None:
            m["seq_len"] = seq_len
        from .planfile import plan_text
        text = plan_text(name, world_size, m, parallel=parallel, fsdp=fsdp, topology=topology, training=training,
                         pipeline=pipeline)
        if out is not None:
            from .planfile import write_plan
            write_plan(out, text)
        return text
    if is_deepseek_v3(model):
        # torchtitan's deepseek_v3 (MTP included): commplan's deepseek_v3 family, its numbers read from the config
        validate.check_family(family, ("auto", "deepseek_v3"))
        if fused:
            raise PlanError("fused=%s: write the deepseek_v3 plan's model.fused with plan_text" % list(fused))
        m = dict(deepseek_v3_numbers(model), dtype="fp32")
        if seq_len is not None:
            m["seq_len"] = seq_len
        from .planfile import plan_text
        text = plan_text(name, world_size, m, parallel=parallel, fsdp=dict(TITAN_FSDP) if fsdp is None else fsdp,
                         topology=topology, training=training, pipeline=pipeline)
        if out is not None:
            from .planfile import write_plan
            write_plan(out, text)
        return text
    family = validate.check_family(family, ("auto", "generic", "llama"))
    spmd_backend = validate.check_value(spmd_backend, validate.Spec(
        "enum", enum=("spmd_types", "partial_dtensor", "full_dtensor")), "plan_from_titan", "spmd_backend")
    if fused and family == "llama":
        raise PlanError("fused=%s: the llama family's plan from torchtitan renames its parameters to torchtitan "
                        "<= 0.2's; write family=\"auto\" (torchtitan's w13 as it is) or a llama-family model table "
                        "with fused = { ... } (plan_text)" % list(fused))
    model = _as_model(model, fused)
    units = titan_units(model)
    if spmd_backend == "spmd_types":
        for u in units:
            for p in u["params"]:
                p.pop("frozen", None)
    tp = (parallel or {}).get("tp", 1) if isinstance(parallel, dict) else 1
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 1:  # no TP group: placements change nothing
        for u in units:
            for p in u["params"]:
                p.pop("tp", None)
    if fsdp is None:
        fsdp = dict(TITAN_FSDP)
    numbers = titan_model_numbers(model)
    extra = {"n_heads": numbers["n_heads"], "n_kv_heads": numbers["n_kv_heads"]}
    # its attention backend: context parallel needs flex (gen/parallel/cp.lua cp.rules)
    backend = attn_backend(model)
    if backend:
        extra["attn_backend"] = backend
    if family != "llama":
        # the attention shape the audit needs for a generic plan (gen/models/generic.lua's decoder:
        # activations, FLOPs per token, tokens/s, MFU; torchtitan 0.3's decoder TP plan at tp > 1)
        for k in ("head_dim", "n_layers"):
            if numbers[k]:
                extra[k] = numbers[k]
        if numbers["enable_weight_tying"]:
            extra["enable_weight_tying"] = True
        if any(p.get("frozen") for u in units for p in u["params"]):
            # torchtitan feeds token ids, which need no gradient: with frozen parameters, the
            # leading all-frozen units (a LoRA job's tok_embeddings) run no pre-backward
            # (gen/parallel/fsdp_layout.lua frozen_prefix)
            extra["input_requires_grad"] = False
    if seq_len is not None:
        extra["seq_len"] = seq_len
    if family == "llama":
        units = _llama_units(units)
    else:
        family = "generic"
        chunks = (training or {}).get("loss_chunks") if isinstance(training, dict) else None
        if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks >= 2:
            # torchtitan's ChunkedLossWrapper runs the [norm, lm_head] unit (components/loss.py:730-775):
            # the generic plan follows its order there (gen/parallel/fsdp.lua chunked_loss), which
            # CommplanFSDP drives (commplan.chunked_loss)
            for u in units:
                if u["name"] == "norm_lm_head":
                    u["loss_head"] = True
    # (torchtitan's trainer: ChunkedLossWrapper, the llama family's default loss_chunks)
    return plan_from_named_parameters(name, units, world_size, parallel=parallel, fsdp=fsdp, model=extra,
                                      topology=topology, training=training, family=family, out=out,
                                      loss_chunks_default=None, pipeline=pipeline)
