#!/usr/bin/env python3
"""A rank's memory terms (gen/memory.lua, plan.json audit.memory and units[].arena) against torch's own
tensors (issue 42, item 1): torchtitan 0.3's llama3 built on CPU with the plan's numbers, parallelized by
its own parallelize_llama at the plan's mesh over a fake process group (this process: rank 0), one
training step run (forward, backward, torch.optim.AdamW's step). Measured on torch's tensors, no CUDA
allocator involved:
  params     every FSDPParam's padded sharded storage (_sharded_param_data), its bytes
  grads      every sharded parameter's reduced gradient (its local tensor's bytes; rank 0's shards are
             the full first chunks, so equal to the padded ones)
  optimizer  AdamW's exp_avg and exp_avg_sq per parameter (their local tensors' bytes); its 0-dim step
             counters (4 bytes each) are not in commplan's figure and are printed as declared
  grads buffer  with sync_last, after a micro-step's backward without gradient sync: each unit's
             unsharded gradients (dtype and bytes: FSDP2 casts them to reduce_dtype to accumulate) against
             the unit's plan.json grad_dtype and arena "grads" bytes.
Plans: plans/llama_tiny.lua (FSDP over 4, bf16 compute, fp32 reduce), tests/plans/
llama_chunked_synclast.lua (HSDP 2 x 2, sync_last over 3 micro-steps). Prints one "memory_terms:" line;
SKIP (77) without torch and torchtitan.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import titan_env as E  # noqa: E402
import test_llama_plan as LP  # noqa: E402

NAME = "a rank's parameter, gradient, optimizer and unsharded-gradient bytes vs plan.json (tests/titan/test_memory_terms.py)"
CASES = ("plans/llama_tiny.lua", "tests/plans/llama_chunked_synclast.lua",
         # issue 41 (h41a): torchtitan's OptimizersContainer with implementation "fused_opt_states_bf16"
         # (components/optimizer/optimizer.py:332-371) against training.optimizer_implementation's figure
         ("plans/llama_tiny.lua", "fused_opt_states_bf16"))
DT = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def nbytes(t):
    return t.numel() * t.element_size()


def plan_of(path):
    if isinstance(path, tuple):  # (a plan, torchtitan's optimizer.implementation): the plan with it set
        base, impl = path
        with open(os.path.join(E.ROOT, base)) as fh:
            text = fh.read()
        assert "training = { loss_chunks = 1 }" in text, base
        text = text.replace("training = { loss_chunks = 1 }",
                            'training = { loss_chunks = 1, optimizer_implementation = "%s" }' % impl)
        # (on 2 ranks: a mesh of its own, as fully_shard wants in one process, tests/titan/test_moe_plan.py)
        assert "world_size = 4," in text, base
        text = text.replace("world_size = 4,", "world_size = 2,")
        os.makedirs(os.path.join(E.ROOT, "build", "titan", "plans"), exist_ok=True)
        path = os.path.join("build", "titan", "plans", "%s_%s.lua" % (os.path.basename(base)[:-4], impl))
        with open(os.path.join(E.ROOT, path), "w") as fh:
            fh.write(text)
    name = os.path.basename(path)[:-4]
    plan, _ = LP.generate(path, "memory_terms_" + name)
    table = LP.plan_file(path)
    plan["seq_len"] = table["model"].get("seq_len") or 2048
    return plan, table


def measure(path):
    impl = path[1] if isinstance(path, tuple) else None
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.parallel_dims import ParallelDims
    plan, table = plan_of(path)
    mc = table["model"]
    numbers = {k: mc[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of",
                                  "ffn_dim_multiplier") if k in mc}
    parallelism, training = LP.job(plan, table)
    world = plan["world_size"]
    problems, declared, checked = [], 0, 0
    with E.fake_world(world, rank=0):
        pd = ParallelDims.from_config(parallelism, world)
        pd.build_mesh()
        model = LP.parallelize(LP.titan_config(None, numbers, False), parallelism, training, pd, "cpu")
        mnames = {id(m): n for n, m in model.named_modules()}
        states = []
        for _, m in model.named_modules():
            if isinstance(m, FSDPModule):
                st = m._get_fsdp_state()
                if st._fsdp_param_groups and all(st is not s for s in states):
                    states.append(st)
        f = plan["fsdp"]
        micro = f.get("micro_steps") or 1
        sync_last = f.get("grad_accumulation") == "sync_last"
        if impl:  # torchtitan's own container (Trainer builds it so), its implementation set
            from torchtitan.components.optimizer.optimizer import OptimizersContainer, default_adamw
            cfg = default_adamw(lr=1e-3)
            cfg.implementation = impl
            opt = OptimizersContainer(cfg, model_parts=[model])
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, numbers["vocab_size"], (1, plan["seq_len"]))
        units = {u["name"]: u for u in plan["units"]}
        for m in range(micro):
            last = m == micro - 1
            if sync_last:
                model.set_requires_gradient_sync(last)
            model(tokens).float().mean().backward()
            if sync_last and not last:
                # the unsharded gradients accumulating: dtype and bytes per unit
                for st in states:
                    g = st._fsdp_param_groups[0]
                    grads = [fp.unsharded_param.grad for fp in g.fsdp_params]
                    mod = mnames[id(st._modules[0])]
                    uname = "norm_output" if mod in ("norm", "lm_head") else mod or "root"
                    u = units.get(uname)
                    if u is None:
                        problems.append("no plan unit for torchtitan's %r" % mod)
                        continue
                    dts = {DT[str(x.dtype)] for x in grads if x is not None}
                    if dts != {u["grad_dtype"]}:
                        problems.append("%s: unsharded grads in %s, plan grad_dtype %s" % (uname, dts, u["grad_dtype"]))
                    got = sum(nbytes(x) for x in grads if x is not None)
                    checked += 1
                    want = u["arena"]["grads"]["bytes"] if "grads" in u["arena"] else 0
                    if got != want:
                        problems.append("%s: unsharded grads %d bytes, plan's grads buffer %d" % (uname, got, want))
        if impl:
            # torchtitan's step pre-hook allocates the moments in bf16 (optimizer.py:332-371); torch's fused
            # AdamW takes fp32 parameters with bf16 moments on CUDA alone (FusedAdamMathFunctorMP), so on CPU
            # the kernel after the hook refuses: the moments are measured as the hook allocated them (the
            # CUDA kernel updates them in place)
            try:
                opt.step()
            except RuntimeError as e:
                if "BFloat16" not in str(e):
                    raise
        else:
            opt.step()
        params = grads = optimizer = 0
        for st in states:
            for fp in st._fsdp_param_groups[0].fsdp_params:
                params += nbytes(fp._sharded_param_data)
                sp = fp.sharded_param
                grads += nbytes(sp.grad.to_local())
                s = opt.state[sp] if not impl else next(o.state[sp] for o in opt.optimizers if sp in o.state)
                optimizer += nbytes(s["exp_avg"].to_local()) + nbytes(s["exp_avg_sq"].to_local())
                if impl and s["exp_avg"].dtype != torch.bfloat16:
                    problems.append("%s: exp_avg in %s under %s" % (fp._param_fqn, s["exp_avg"].dtype, impl))
                declared += 1
        del model, opt
    mem = plan["audit"]["memory"]
    for what, got, want in (("params", params, mem["params_bytes"]), ("grads", grads, mem["grads_bytes"]),
                            ("optimizer", optimizer, mem["optimizer_bytes"])):
        if got != want:
            problems.append("%s: torch holds %d bytes, plan.json %s_bytes %d" % (what, got, what, want))
    if sync_last and checked == 0:
        problems.append("no unsharded gradients measured")
    return problems, declared, checked, (params, grads, optimizer)


def main():
    E.need_titan(NAME)
    E.cpu_training()
    problems, lines = [], []
    for path in CASES:
        try:
            ps, steps, checked, (p, g, o) = measure(path)
        except Exception as e:  # one line naming the case
            print("FAIL %s: %s: %s: %s" % (NAME, path, type(e).__name__, e))
            return 1
        problems += ["%s: %s" % (path, x) for x in ps]
        lines.append("%s params %d, grads %d, AdamW %d bytes (+%d step counters, declared)%s" % (
            os.path.basename(path[0] if isinstance(path, tuple) else path)[:-4]
            + (" (optimizer.implementation %s)" % path[1] if isinstance(path, tuple) else ""), p, g, o, steps,
            ", unsharded grads checked %d times (units x micro-steps without sync)" % checked if checked else ""))
    for x in problems:
        print("  " + x)
    print("memory_terms: %s; %d problem(s)" % ("; ".join(lines), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
