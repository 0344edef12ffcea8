"""Writes tests/python/fixtures/{fsdp4,llama_tiny}_named_params.json from real torch modules:
each unit's name, reshard_after_forward and [name, shape, str(dtype)] of every parameter it
manages -- what [(n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()] gives,
split by fully_shard's assignment. Needs torch (any version); the unit tests read the JSON.

    PYTHONPATH=python python3 tests/python/make_fixtures.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from commplan import Unit, torchtitan_units, units_from_module  # noqa: E402
from tiny_llama import LLAMA_TINY, FSDP4Model, Transformer  # noqa: E402


def dump(model, units, path, source):
    out = {"source": source, "units": []}
    for u, params in units_from_module(model, units):
        out["units"].append({"name": u.name, "reshard_after_forward": u.reshard_after_forward,
                             "params": [[n, list(p.shape), str(p.dtype)] for n, p in params]})
    lines = ["{", ' "source": %s,' % json.dumps(out["source"]), ' "units": [']
    for i, u in enumerate(out["units"]):
        lines.append('  {"name": %s, "reshard_after_forward": %s, "params": [' % (
            json.dumps(u["name"]), json.dumps(u["reshard_after_forward"])))
        lines += ["   %s%s" % (json.dumps(p), "," if j + 1 < len(u["params"]) else "") for j, p in enumerate(u["params"])]
        lines.append("  ]}%s" % ("," if i + 1 < len(out["units"]) else ""))
    lines += [" ]", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", os.path.relpath(path))


def main():
    torch.manual_seed(0)
    fx = os.path.join(HERE, "fixtures")
    m = FSDP4Model()
    dump(m, [m.layers[0], m.layers[1], m.layers[2], m],
         os.path.join(fx, "fsdp4_named_params.json"),
         "tests/python/tiny_llama.py FSDP4Model; fully_shard(layers[0..2]), fully_shard(model)")
    t = Transformer(**LLAMA_TINY)
    dump(t, torchtitan_units(t), os.path.join(fx, "llama_tiny_named_params.json"),
         "tests/python/tiny_llama.py Transformer(**LLAMA_TINY); torchtitan's wrapping (torchtitan_units)")
    assert Unit  # re-exported for users of this script


if __name__ == "__main__":
    main()
