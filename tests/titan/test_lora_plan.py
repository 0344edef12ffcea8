#!/usr/bin/env python3
"""commplan's frozen parameters against torchtitan 0.3's LoRA converter (issue 41, h39u).

torchtitan's llama3 debugmodel with its own LoRAConverter (components/lora.py: every Linear
becomes a LoRALinear whose base weight is frozen, with trainable lora_a / lora_b adapters of the
converter's rank; every other module's own parameters frozen), as its registry builds it
(model_registry(..., converters=[LoRAConverter.Config(...)]), models/llama3/__init__.py:378-381),
parallelized by torchtitan's own parallelize_llama over a fake process group. The plan is the
Python writer's (plan_from_titan on the same converted config): per unit, every FSDP parameter in
FSDP2's order with its padded shard, and frozen exactly where FSDP2's sharded parameter does not
require a gradient (what FSDP2's post_backward filters on: _fsdp_param_group.py:972-1001); the
unit's reduce-scatter row (plan.json rs_numel) is its trainable parameters' padded shards, the
all-gather slot all of them. Runs on CPU in one process (tests/titan/titan_env.py).
"""

import copy
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402

sys.path.insert(0, os.path.join(E.ROOT, "python"))
NAME = "LoRA's frozen parameters vs torchtitan 0.3 (tests/titan/test_lora_plan.py)"
OUT = os.path.join(E.ROOT, "build", "titan")
# (world, parallel, LoRA settings): all Linear layers, and a target_modules subset
# (world, parallel, LoRA settings, spmd_backend): all Linear layers, and a target_modules subset.
# torchtitan 0.3's default spmd_types backend re-registers every parameter trainable
# (protocols/module.py:315): its LoRA freeze is undone there, which the writer follows (nothing
# frozen); partial_dtensor keeps requires_grad (:373-378): frozen where the converter froze.
CASES = [(4, {"dp_shard": 4}, {"rank": 4, "alpha": 8.0}, "partial_dtensor"),
         (4, {"dp_replicate": 2, "dp_shard": 2}, {"rank": 2, "alpha": 4.0, "target_modules": ["wo", "w2"]},
          "partial_dtensor"),
         (4, {"dp_shard": 4}, {"rank": 4, "alpha": 8.0}, "spmd_types")]


def fsdp_units(model):
    """Each fully_shard state's parameters in FSDP2's order, the root first: (name,
    padded_numel, requires_grad) of every FSDPParam's sharded parameter."""
    from torch.distributed.fsdp import FSDPModule
    pnames = {id(p): n for n, p in model.named_parameters()}
    out, seen = [], set()
    for _, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        st = m._get_fsdp_state()
        if id(st) in seen:
            continue
        seen.add(id(st))
        ps = []
        for g in st._fsdp_param_groups:
            for fp in g.fsdp_params:
                ps.append((pnames[id(fp.sharded_param)], int(fp.padded_sharded_param_size.numel()),
                           bool(fp.sharded_param.requires_grad)))
        out.append(ps)
    return out


def main():
    E.need_titan(NAME)
    from torchtitan.components.lora import LoRAConverter
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models.llama3 import model_registry
    from commplan.titan import plan_from_titan
    import test_llama_plan as L
    problems, units, params, frozen = [], 0, 0, 0
    for i, (world, par, lora, backend) in enumerate(CASES):
        name = "titan_lora%d" % i
        spec = model_registry("debugmodel", converters=[LoRAConverter.Config(**lora)])
        text = plan_from_titan(copy.deepcopy(spec.model), name, world, parallel=dict(par), seq_len=256,
                               spmd_backend=backend)
        path = os.path.join(OUT, "plans", name + ".lua")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
        plan, _ = L.generate(os.path.relpath(path, E.ROOT), name)
        parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                        data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=1,
                                        spmd_backend=backend)
        training = TrainingConfig(local_batch_size=1, seq_len=256, dtype="float32",
                                  mixed_precision_param="bfloat16", mixed_precision_reduce="float32")
        with E.fake_world(world, rank=0):
            pd = ParallelDims.from_config(parallelism, world)
            pd.build_mesh()
            model = L.parallelize(copy.deepcopy(spec.model), parallelism, training, pd, "cpu")
            theirs = fsdp_units(model)
        mine = sorted(plan["units"], key=lambda u: u["index"])
        theirs = [ps for ps in theirs if ps] + [[] for ps in theirs if not ps]  # (a param-less root last)
        mine = [u for u in mine if u["params"]] + [u for u in mine if not u["params"]]
        if len(mine) != len(theirs):
            problems.append("%s: %d units in the plan, %d fully_shard states" % (name, len(mine), len(theirs)))
            continue
        for u, ps in zip(mine, theirs):
            want = [(q["name"], q["padded_numel"], not q.get("frozen", False)) for q in u["params"]]
            if want != ps:
                diff = next(((a, b) for a, b in zip(want, ps) if a != b), (len(want), len(ps)))
                problems.append("%s unit %s: plan %s, FSDP2 %s" % (name, u["name"], diff[0], diff[1]))
            rs = sum(n for _, n, g in ps if g)
            if u["params"] and u.get("rs_numel", u["slot_numel"]) != rs:
                problems.append("%s unit %s: reduce-scatter row %s, FSDP2's trainable shards %d"
                                % (name, u["name"], u.get("rs_numel"), rs))
            units += 1
            params += len(ps)
            frozen += sum(1 for _, _, g in ps if not g)
        if any(q.get("frozen") for u in mine for q in u["params"]) != (backend != "spmd_types"):
            problems.append("%s: the writer planned %s frozen parameter under %s" % (
                name, "a" if backend == "spmd_types" else "no", backend))
        del model
    for p in problems:
        print("  FAIL  " + p)
    print("%s: %d cases, %d units, %d parameters (%d frozen) %s" % (
        "test_lora_plan", len(CASES), units, params, frozen,
        "equal to torchtitan's fully_shard states" if not problems else "compared, %d differ" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
