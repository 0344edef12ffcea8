"""Hugging Face config.json (Llama, Mistral, Qwen2) -> a plan's model table.

The Llama family of the generator (gen/models/llama.lua) takes dim, n_layers, n_heads,
n_kv_heads, vocab_size, ffn_dim_multiplier and multiple_of, with torchtitan's names and
wrapping. A config it can express exactly (no biases, untied embeddings, head_dim = dim /
n_heads, an intermediate_size that some multiple_of / ffn_dim_multiplier yields) becomes such a
table; any other becomes a generic model with torchtitan's parameter names and wrapping and the
shapes the Hugging Face model has (q/k/v biases for Qwen2, attention_bias and mlp_bias for
Llama, tied embeddings as one unit that holds the embedding, the final norm and the output).
"""

import os

from . import safeio
from .errors import PlanError
from .planfile import _ffn_settings, dtype_name, llama_table
from .validate import MODEL_INT, check_family, check_hf_config, check_optional_int, describe

__all__ = ["hf_config", "hf_units"]

SUPPORTED = ("llama", "mistral", "qwen2")


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


def hf_config(path_or_dict, dtype="fp32", seq_len=None, family="auto"):
    """A plan's model table from a Hugging Face config.json (a path, a directory holding one, or
    the parsed dict): {"family": "llama", ...} where the Llama family expresses it exactly, else
    {"family": "generic", "units": [...], "n_heads": ..., "n_kv_heads": ...}. dtype: the
    parameters' (training) dtype, not the checkpoint's torch_dtype; seq_len: for the audit."""
    family = check_family(family, ("auto", "llama", "generic"))
    seq_len = check_optional_int(seq_len, "seq_len", hi=MODEL_INT)
    dtype = dtype_name(dtype, "dtype")
    cfg, src = _load(path_or_dict)
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
        table = {"family": "generic", "units": hf_units(s, dtype), "n_heads": s["n_heads"],
                 "n_kv_heads": s["n_kv_heads"]}
    if seq_len is not None:
        table["seq_len"] = seq_len
    return table
