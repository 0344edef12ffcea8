"""Hugging Face config.json (Llama, Mistral, Qwen2, Qwen3; Mixtral, Qwen3-MoE, DeepSeek-V2/V3) -> a plan's model table.

The Llama family of the generator (gen/models/llama.lua) takes dim, n_layers, n_heads,
n_kv_heads, vocab_size, ffn_dim_multiplier and multiple_of, with torchtitan's names and
wrapping. A config it can express exactly (no biases, untied embeddings, head_dim = dim /
n_heads, an intermediate_size that some multiple_of / ffn_dim_multiplier yields) becomes such a
table; any other becomes a generic model with torchtitan's parameter names and wrapping and the
shapes the Hugging Face model has (q/k/v biases for Qwen2, attention_bias and mlp_bias for
Llama, tied embeddings as one unit that holds the embedding, the final norm and the output), and
its attention shape (n_heads, n_kv_heads, head_dim, n_layers): the generator finds its decoder
blocks by shape and, under these torchtitan Llama names, places it over TP by torchtitan's Llama
plan with its activation collectives (gen/models/generic.lua's decoder, gen/parallel/tp.lua), so
its audit is the llama family's at any tp (recorded live: tests/tp_generic_record.py).

The MoE model types (MOE_TYPES) become a table of the generator's MoE family of the same
architecture (gen/models/moe.lua: "mixtral", "qwen3_moe", "deepseek_v3"; DeepSeek-V2 and V2-Lite,
model_type "deepseek_v2", are torchtitan's deepseek_v3 model), with torchtitan's
names and wrapping. Their config.json is read strictly: every key is one the writer knows --
read into the table, required to have the one value the family expresses (tied embeddings,
attention biases, MoE layers skipped), or known not to change the parameters (routing, RoPE,
dropout, tokens, ...) -- and any other key is refused in one line, since it may describe a
parameter the family would not have.

Qwen3 (model_type "qwen3", the dense models) becomes a table of the generator's qwen3 family
(gen/models/qwen3.lua), read as strictly: head_dim, intermediate_size as hidden_dim and
tie_word_embeddings as torchtitan's enable_weight_tying (the 0.6B, 1.7B and 4B checkpoints tie).

family= overrides model_type only where the family's model has the config's parameters (a
deepseek_v2 config as "deepseek_v3", a llama / mistral / qwen2 config as "generic"); any other is
refused naming both models' shapes (_family_mismatch).
"""

import os

from . import safeio
from .errors import PlanError
from .planfile import _ffn_settings, dtype_name, llama_table
from .validate import MODEL_INT, Spec, check_family, check_hf_config, check_optional_int, check_value, describe, \
    did_you_mean

__all__ = ["hf_config", "hf_units"]

MOE_TYPES = ("mixtral", "qwen3_moe", "deepseek_v3", "deepseek_v2")
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3") + MOE_TYPES

_POS = dict(lo=1, hi=MODEL_INT)
# Keys of any config.json that do not change an MoE model's parameters: PretrainedConfig's own,
# tokens, initialization, norms' epsilon, RoPE, dropout, caching, the router's training losses.
_MOE_IGNORED = frozenset((
    "architectures", "auto_map", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "rms_norm_eps",
    "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters", "attention_dropout",
    "output_router_logits", "router_aux_loss_coef", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "use_return_dict", "is_encoder_decoder", "quantization_config"))
# Per model type: key -> (plan key, Spec) read into the table; key -> (the one value the family
# expresses, why) required; keys known not to change the parameters. The keys check_hf_config
# reads itself (hidden_size, intermediate_size, num_attention_heads, num_hidden_layers,
# vocab_size, num_key_value_heads, head_dim, tie_word_embeddings, attention_bias, mlp_bias) are
# mapped in _moe_table.
_MOE = {
    "mixtral": {
        "read": {"num_local_experts": ("num_experts", Spec("int", required=True, **_POS)),
                 "num_experts_per_tok": ("top_k", Spec("int", required=True, **_POS))},
        "fixed": {"hidden_act": ("silu", "torchtitan's experts are SwiGLU")},
        "ignored": ("sliding_window", "router_jitter_noise"),
    },
    "qwen3_moe": {
        "read": {"moe_intermediate_size": ("moe_hidden_dim", Spec("int", required=True, **_POS)),
                 "num_experts": ("num_experts", Spec("int", required=True, **_POS)),
                 "num_experts_per_tok": ("top_k", Spec("int", required=True, **_POS))},
        "fixed": {"hidden_act": ("silu", "torchtitan's experts are SwiGLU"),
                  "decoder_sparse_step": (1, "every block is an MoE block in torchtitan's Qwen3 MoE"),
                  "mlp_only_layers": ([], "every block is an MoE block in torchtitan's Qwen3 MoE")},
        # intermediate_size: the dense MLP of mlp_only_layers, which are none here
        "ignored": ("norm_topk_prob", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types"),
    },
    "deepseek_v3": {
        "read": {"moe_intermediate_size": ("moe_hidden_dim", Spec("int", required=True, **_POS)),
                 "n_routed_experts": ("num_experts", Spec("int", required=True, **_POS)),
                 "n_shared_experts": ("num_shared_experts", Spec("int", null=True, lo=0, hi=MODEL_INT)),
                 "num_experts_per_tok": ("top_k", Spec("int", required=True, **_POS)),
                 "first_k_dense_replace": ("n_dense_layers", Spec("int", required=True, lo=0, hi=MODEL_INT)),
                 "q_lora_rank": ("q_lora_rank", Spec("int", null=True, lo=0, hi=MODEL_INT)),
                 "kv_lora_rank": ("kv_lora_rank", Spec("int", required=True, **_POS)),
                 "qk_nope_head_dim": ("qk_nope_head_dim", Spec("int", required=True, **_POS)),
                 "qk_rope_head_dim": ("qk_rope_head_dim", Spec("int", required=True, **_POS)),
                 "v_head_dim": ("v_head_dim", Spec("int", required=True, **_POS)),
                 # the router (torchtitan's route_norm, num_expert_groups, num_limited_groups)
                 "norm_topk_prob": ("route_norm", Spec("bool", null=True)),
                 "n_group": ("n_expert_groups", Spec("int", null=True, lo=0, hi=MODEL_INT)),
                 "topk_group": ("n_limited_groups", Spec("int", null=True, lo=0, hi=MODEL_INT))},
        "fixed": {"hidden_act": ("silu", "torchtitan's experts are SwiGLU"),
                  "moe_layer_freq": (1, "every block after the first first_k_dense_replace is an MoE block in "
                                        "torchtitan's DeepSeek-V3")},
        # num_key_value_heads: MLA has none of its own; num_nextn_predict_layers: the checkpoint's
        # multi-token-prediction layers, which torchtitan does not build by default (num_mtp_layers=0)
        # and Hugging Face's model does not load
        "ignored": ("topk_method", "routed_scaling_factor", "scoring_func", "aux_loss_alpha", "seq_aux", "ep_size", "rope_interleave", "pretraining_tp",
                    "num_nextn_predict_layers"),
    },
}
# DeepSeek-V2 (and V2-Lite) is torchtitan's deepseek_v3 model: MLA with or without q_lora_rank,
# first_k_dense_replace dense blocks, shared experts, node-limited routing by n_group / topk_group;
# torchtitan's "16B" flavor is V2-Lite's shape with V2's softmax router
# (models/deepseek_v3/__init__.py:389-436). Its keys are V3's but for the router's scoring
# (scoring_func softmax, topk_method greedy / group_limited_greedy), which change no parameter.
_MOE["deepseek_v2"] = _MOE["deepseek_v3"]
_FAMILY_OF = {"mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3",
              "deepseek_v2": "deepseek_v3"}


def _load(path_or_dict):
    """(parsed config, its name in messages): a dict as given, else the regular file at the path
    (a directory: its config.json), read bounded and parsed strictly (safeio)."""
    if isinstance(path_or_dict, (dict, list)):  # parsed JSON: check_hf_config refuses all but an object
        return path_or_dict, "the config"
    if not isinstance(path_or_dict, (str, bytes, os.PathLike)):
        raise PlanError("hf_config takes the path of a config.json, a directory holding one, or the parsed dict; "
                        "got %s" % describe(path_or_dict, False))
    path = safeio.fspath(path_or_dict, "config.json")
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    return safeio.read_json(path, "config.json", safeio.CONFIG_JSON_MAX)


def _shapes(cfg, src):
    c = check_hf_config(cfg, src, SUPPORTED)
    mt = c["model_type"]
    s = {
        "model_type": mt,
        "dim": c["hidden_size"],
        "hidden": c["intermediate_size"],
        "n_heads": c["num_attention_heads"],
        "n_layers": c["num_hidden_layers"],
        "vocab": c["vocab_size"],
    }
    s["n_kv_heads"] = c["num_key_value_heads"] if c["num_key_value_heads"] is not None else s["n_heads"]
    hd = c["head_dim"]
    if hd is None:
        if s["dim"] % s["n_heads"]:
            raise PlanError("%s: hidden_size %d is not divisible by num_attention_heads %d and head_dim is not "
                            "given" % (src, s["dim"], s["n_heads"]))
        hd = s["dim"] // s["n_heads"]
    s["head_dim"] = hd
    if s["n_heads"] % s["n_kv_heads"]:
        raise PlanError("%s: num_attention_heads %d is not divisible by num_key_value_heads %d"
                        % (src, s["n_heads"], s["n_kv_heads"]))
    s["tied"] = c["tie_word_embeddings"]
    if mt == "qwen2":
        s["attn_bias"] = ("q", "k", "v")  # Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False
        s["mlp_bias"] = False
    elif mt == "llama":
        s["attn_bias"] = ("q", "k", "v", "o") if c["attention_bias"] else ()
        s["mlp_bias"] = c["mlp_bias"]
    else:  # mistral: no biases
        s["attn_bias"] = ()
        s["mlp_bias"] = False
    return s


def hf_units(s, dtype="fp32"):
    """Generic units with torchtitan's names and wrapping for the shapes of _shapes()."""
    dim, hd = s["dim"], s["head_dim"]
    q, kv, hidden = s["n_heads"] * hd, s["n_kv_heads"] * hd, s["hidden"]

    def p(name, shape):
        return {"name": name, "shape": list(shape), "dtype": dtype}

    emb = p("tok_embeddings.weight", (s["vocab"], dim))
    units = []
    blocks = []
    for i in range(s["n_layers"]):
        pre = "layers.%d." % i
        ps = []
        for short, rows, cols in (("q", q, dim), ("k", kv, dim), ("v", kv, dim), ("o", dim, q)):
            ps.append(p(pre + "attention.w%s.weight" % short, (rows, cols)))
            if short in s["attn_bias"]:
                ps.append(p(pre + "attention.w%s.bias" % short, (rows,)))
        for w, rows, cols in (("w1", hidden, dim), ("w2", dim, hidden), ("w3", hidden, dim)):
            ps.append(p(pre + "feed_forward.%s.weight" % w, (rows, cols)))
            if s["mlp_bias"]:
                ps.append(p(pre + "feed_forward.%s.bias" % w, (rows,)))
        ps.append(p(pre + "attention_norm.weight", (dim,)))
        ps.append(p(pre + "ffn_norm.weight", (dim,)))
        blocks.append({"name": "layers.%d" % i, "params": ps, "reshard_after_forward": None})
    norm = p("norm.weight", (dim,))
    if s["tied"]:
        # output.weight is tok_embeddings.weight: one unit holds both ends and stays unsharded
        # through forward (torchtitan_units in modules.py wraps a tied model the same way).
        units.append({"name": "tok_embeddings_norm_output", "params": [emb, norm], "reshard_after_forward": False})
        units += blocks
    else:
        units.append({"name": "tok_embeddings", "params": [emb], "reshard_after_forward": None})
        units += blocks
        units.append({"name": "norm_output", "params": [norm, p("output.weight", (s["vocab"], dim))],
                      "reshard_after_forward": False})
    units.append({"name": "root", "params": [], "reshard_after_forward": None})
    return units


def _moe_table(cfg, c, src, dtype):
    """The MoE family's model table of a checked config (c: check_hf_config's fields)."""
    mt = c["model_type"]
    spec = _MOE[mt]
    family = _FAMILY_OF[mt]
    base = {"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
            "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias"}
    known = base | set(spec["read"]) | set(spec["fixed"]) | set(spec["ignored"]) | _MOE_IGNORED
    for k in sorted(cfg):
        if k not in known:
            hint = did_you_mean(k, sorted(known))
            raise PlanError("%s: %s: unknown to the %s writer, and it may give the model parameters the %s family "
                            "does not have; remove it if it does not change the parameters%s"
                            % (src, k, mt, family, "; did you mean %s?" % hint if hint else ""))
    for k, (want, why) in spec["fixed"].items():
        if k in cfg and cfg[k] != want:
            raise PlanError("%s: %s: %s is not expressible by the %s family (%s); it must be %s"
                            % (src, k, describe(cfg[k], True), family, why, describe(want, True)))
    for k, why in (("tie_word_embeddings", "torchtitan's %s has untied tok_embeddings and lm_head" % family),
                   ("attention_bias", "torchtitan's attention has no biases"),
                   ("mlp_bias", "torchtitan's experts have no biases")):
        if c[k]:
            raise PlanError("%s: %s: true is not expressible by the %s family (%s); it must be false"
                            % (src, k, family, why))
    t = {"family": family, "dim": c["hidden_size"], "n_layers": c["num_hidden_layers"],
         "n_heads": c["num_attention_heads"], "vocab_size": c["vocab_size"]}
    for k, (key, sp) in spec["read"].items():
        if k not in cfg:
            if sp.required:
                raise PlanError("%s: %s: missing; a %s config.json gives it" % (src, k, mt))
            continue
        v = check_value(cfg[k], sp, src, k, js=True)
        if v is not None:
            t[key] = v
    if family == "deepseek_v3":
        t.setdefault("q_lora_rank", 0)
        t.setdefault("num_shared_experts", 0)
        # one group (n_group 1) is no node-limited routing: torchtitan's num_expert_groups None
        if t.get("n_expert_groups", 0) > 1 and t.get("n_limited_groups", 0) <= 0:
            raise PlanError("%s: n_group %s with topk_group %s: node-limited routing over groups needs "
                            "topk_group >= 1 (the groups each token may use); set it, or n_group 1"
                            % (src, cfg.get("n_group"), cfg.get("topk_group")))
        if t.get("n_expert_groups", 0) <= 1:
            t.pop("n_expert_groups", None)
            t.pop("n_limited_groups", None)
        t["route_norm"] = bool(t.get("route_norm", False))
        if t["n_dense_layers"] > t["n_layers"]:
            raise PlanError("%s: first_k_dense_replace: %d is more than num_hidden_layers %d"
                            % (src, t["n_dense_layers"], t["n_layers"]))
        if t["n_dense_layers"] > 0:
            t["dense_hidden_dim"] = c["intermediate_size"]
    else:
        if mt == "mixtral":
            t["moe_hidden_dim"] = c["intermediate_size"]
        kv = c["num_key_value_heads"] if c["num_key_value_heads"] is not None else t["n_heads"]
        if t["n_heads"] % kv:
            raise PlanError("%s: num_attention_heads %d is not divisible by num_key_value_heads %d"
                            % (src, t["n_heads"], kv))
        t["n_kv_heads"] = kv
        hd = c["head_dim"]
        if hd is None:
            if t["dim"] % t["n_heads"]:
                raise PlanError("%s: hidden_size %d is not divisible by num_attention_heads %d and head_dim is not "
                                "given" % (src, t["dim"], t["n_heads"]))
        elif hd * t["n_heads"] != t["dim"]:
            t["head_dim"] = hd
    if t["top_k"] > t["num_experts"]:
        raise PlanError("%s: num_experts_per_tok: %d is more than the %d experts" % (src, t["top_k"], t["num_experts"]))
    t["dtype"] = dtype
    return t


# Qwen3 (dense): keys that do not change its parameters besides _MOE_IGNORED's.
_QWEN3_IGNORED = frozenset(("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"))


def _qwen3_table(cfg, c, src, dtype):
    """The qwen3 family's model table of a checked Qwen3 config (c: check_hf_config's fields)."""
    base = {"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
            "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act"}
    known = base | _QWEN3_IGNORED | _MOE_IGNORED
    for k in sorted(cfg):
        if k not in known:
            hint = did_you_mean(k, sorted(known))
            raise PlanError("%s: %s: unknown to the qwen3 writer, and it may give the model parameters the qwen3 family "
                            "does not have; remove it if it does not change the parameters%s"
                            % (src, k, "; did you mean %s?" % hint if hint else ""))
    if cfg.get("hidden_act", "silu") != "silu":
        raise PlanError("%s: hidden_act: %s is not expressible by the qwen3 family (torchtitan's FeedForward is "
                        "SwiGLU); it must be \"silu\"" % (src, describe(cfg["hidden_act"], True)))
    for k, why in (("attention_bias", "torchtitan's Qwen3 attention has no biases"),
                   ("mlp_bias", "torchtitan's FeedForward has no biases")):
        if c[k]:
            raise PlanError("%s: %s: true is not expressible by the qwen3 family (%s); it must be false"
                            % (src, k, why))
    t = {"family": "qwen3", "dim": c["hidden_size"], "n_layers": c["num_hidden_layers"],
         "n_heads": c["num_attention_heads"], "vocab_size": c["vocab_size"], "hidden_dim": c["intermediate_size"]}
    kv = c["num_key_value_heads"] if c["num_key_value_heads"] is not None else t["n_heads"]
    if t["n_heads"] % kv:
        raise PlanError("%s: num_attention_heads %d is not divisible by num_key_value_heads %d"
                        % (src, t["n_heads"], kv))
    t["n_kv_heads"] = kv
    if c["head_dim"] is not None:
        t["head_dim"] = c["head_dim"]
    elif t["dim"] % t["n_heads"]:
        raise PlanError("%s: hidden_size %d is not divisible by num_attention_heads %d and head_dim is not given"
                        % (src, t["dim"], t["n_heads"]))
    t["enable_weight_tying"] = bool(c["tie_word_embeddings"])
    t["dtype"] = dtype
    return t


# What each model type's parameters are, for a family= that does not match them: the shapes a
# family's model has that the config's does not (or the reverse).
_SHAPES_OF = {
    "llama": "GQA attention without q/k norms, a dense SwiGLU FeedForward",
    "mistral": "GQA attention without q/k norms, a dense SwiGLU FeedForward",
    "qwen2": "GQA attention with q/k/v biases and without q/k norms, a dense SwiGLU FeedForward",
    "qwen3": "GQA attention with per-head q/k RMSNorms, a dense SwiGLU FeedForward",
    "mixtral": "GQA attention without q/k norms, routed experts",
    "qwen3_moe": "GQA attention with per-head q/k RMSNorms, routed experts",
    "deepseek_v3": "MLA attention (wkv_a, kv_norm, wkv_b), dense first blocks, routed and shared experts",
    "deepseek_v2": "MLA attention (wkv_a, kv_norm, wkv_b), dense first blocks, routed and shared experts",
}
_FAMILY_SHAPES = {"llama": "llama", "generic": "llama", "qwen3": "qwen3", "mixtral": "mixtral",
                  "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3"}


def _family_mismatch(src, mt, family):
    """Refuses family= overriding model_type where their parameters differ, naming both."""
    auto = "qwen3" if mt == "qwen3" else _FAMILY_OF.get(mt, "llama or generic")
    raise PlanError("%s: family \"%s\" does not match model_type %s (the family's model: %s; the config's: %s); "
                    "use family=\"auto\" (%s)" % (src, family, mt, _SHAPES_OF[_FAMILY_SHAPES[family]],
                                                   _SHAPES_OF[mt], auto))


def hf_config(path_or_dict, dtype="fp32", seq_len=None, family="auto"):
    """A plan's model table from a Hugging Face config.json (a path, a directory holding one, or
    the parsed dict): {"family": "llama", ...} where the Llama family expresses it exactly, else
    {"family": "generic", "units": [...], "n_heads": ..., "n_kv_heads": ...}. dtype: the
    parameters' (training) dtype, not the checkpoint's torch_dtype; seq_len: for the audit."""
    family = check_family(family, ("auto", "llama", "generic", "qwen3") + tuple(_FAMILY_OF.values()))
    seq_len = check_optional_int(seq_len, "seq_len", hi=MODEL_INT)
    dtype = dtype_name(dtype, "dtype")
    cfg, src = _load(path_or_dict)
    c = check_hf_config(cfg, src, SUPPORTED)
    if c["model_type"] == "qwen3" or family == "qwen3":
        if c["model_type"] != "qwen3" or family not in ("auto", "qwen3"):
            _family_mismatch(src, c["model_type"], family)
        table = _qwen3_table(cfg, c, src, dtype)
        if seq_len is not None:
            table["seq_len"] = seq_len
        return table
    if c["model_type"] in MOE_TYPES or family in _FAMILY_OF.values():
        mine = _FAMILY_OF.get(c["model_type"])
        if family not in ("auto", mine):
            _family_mismatch(src, c["model_type"], family)
        table = _moe_table(cfg, c, src, dtype)
        if seq_len is not None:
            table["seq_len"] = seq_len
        return table
    s = _shapes(cfg, src)
    why = None
    ffn = _ffn_settings(s["dim"], s["hidden"], {})
    if s["attn_bias"] or s["mlp_bias"]:
        why = "biases"
    elif s["tied"]:
        why = "tied embeddings"
    elif s["head_dim"] * s["n_heads"] != s["dim"]:
        why = "head_dim x num_attention_heads != hidden_size"
    elif ffn is None:
        why = "intermediate_size %d" % s["hidden"]
    if family == "llama" and why:
        raise PlanError("%s: the llama family cannot express %s; use family=\"generic\"" % (src, why))
    if why is None and family != "generic":
        table = llama_table(s["dim"], s["n_layers"], s["n_heads"], s["n_kv_heads"], s["vocab"], ffn, dtype)
    else:
        # (with the attention shape: the audit's model FLOPs per token, tokens/s and MFU, torchtitan's
        # get_dense_model_nparams_and_flops, models/utils.py; a tied model keeps the shared table)
        table = {"family": "generic", "units": hf_units(s, dtype), "n_heads": s["n_heads"],
                 "n_kv_heads": s["n_kv_heads"], "head_dim": s["head_dim"], "n_layers": s["n_layers"]}
        if s["tied"]:
            table["enable_weight_tying"] = True
    if seq_len is not None:
        table["seq_len"] = seq_len
    return table
