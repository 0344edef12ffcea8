"""Training driven by the plan, on CPU (issue 17, item 5): torchtitan 0.3's own llama3 (a tiny one,
--model titan, the default) or a Llama-shaped stand-in with torchtitan's names (--model tiny,
tests/python/tiny_llama.py), trained with AdamW for 20 steps of 2 micro-batches each, 4 ranks on
gloo under torch's own torchrun, FSDP (dp_shard 4) and HSDP (2 x 2), fp32, gradient accumulation as
torchtitan does it (every backward reduces, the sharded grads accumulate): once parallelized as
torchtitan does it (titan: its own parallelize_llama, its SPMD context, its cross_entropy_loss;
tiny: fully_shard with torchtitan's wrapping), once with every collective and copy driven by the
generated plan through the plan's host library (runtime/cp_hostlib.h: the same executor, op list,
buffers and copy code the NCCL backend runs; each collective a torch.distributed call on the op's
group instance). Every rank compares, bit for bit, every micro-batch's loss and, after every step,
every parameter's local shard and its gradient. Rank 0 prints host time per step of both.

    tests/python/train_cpu.py TORCHRUN     (from the repository root; make test runs it)

torchtitan's model runs with its FlexAttention swapped for causal SDPA on both sides (FlexAttention
has no backward on CPU; the attention's maths moves no data), and its FSDP reductions as a SUM with
the divides around it (torchtitan's gradient divide factor reduces with PREMUL_SUM, which gloo lacks;
the plan reduces summed, as plan_from_titan writes it). Needs torch 2.x with FSDP2 (and torchtitan
for --model titan; make torch-env); anywhere else one SKIP line and exit 0.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

WORLD = 4
CFG = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=250, multiple_of=16, ffn_dim_multiplier=1.3)
SEQ, BATCH = 16, 2
CONFIGS = {"fsdp": {"dp_shard": 4}, "hsdp": {"dp_replicate": 2, "dp_shard": 2}}
TITAN = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=250, multiple_of=16, ffn_dim_multiplier=1.3)


def sys_path_titan():
    sys.path.insert(0, os.path.join(REPO, "tests", "titan"))


def titan_model():
    """torchtitan's llama3 config (tiny numbers, fused qkv as its registry builds it), set up for
    training on CPU (titan_env.cpu_training: causal SDPA for FlexAttention)."""
    sys_path_titan()
    import titan_env as E
    import test_llama_plan as TL
    E.cpu_training()
    return TL.titan_config(None, TITAN, True)


def skip(why):
    print("SKIP train_cpu (20 AdamW steps on CPU, the plan driving every collective, vs fully_shard): %s" % why)
    sys.exit(0)


def plan_name(cfg, model="titan"):
    return "train_cpu_%s_%s" % (model, cfg)


def build_plan(cfg, micro, model_kind):
    """The plan written from the model (the plan writer), then make builds its library."""
    import commplan
    name = plan_name(cfg, model_kind)
    d = os.path.join(REPO, "build", "train_cpu")
    os.makedirs(d, exist_ok=True)
    out = os.path.join(d, name + ".lua")
    if model_kind == "titan":
        sys_path_titan()
        import titan_env as E
        E.need_titan("train_cpu")
        from commplan.titan import plan_from_titan
        plan_from_titan(titan_model(), name, WORLD, parallel=dict(CONFIGS[cfg]),
                        fsdp={"micro_steps": micro, "reduce_op": "sum"}, seq_len=SEQ, out=out)
    else:
        from tiny_llama import Transformer
        model = Transformer(**CFG)
        commplan.plan_from_module(model, commplan.torchtitan_units(model), name, world_size=WORLD,
                                  parallel=dict(CONFIGS[cfg]), fsdp={"micro_steps": micro},
                                  model_numbers={"n_heads": CFG["n_heads"], "seq_len": SEQ}, out=out)
    r = subprocess.run(["make", "--no-print-directory", "-s", "PLAN=build/train_cpu/%s.lua" % name], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit("train_cpu: make PLAN=build/train_cpu/%s.lua failed" % name)
    return name


def batches(rank, step, micro):
    import torch
    g = torch.Generator().manual_seed(10_000 + 1000 * rank + 10 * step + micro)
    t = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ + 1), generator=g)
    return t[:, :-1], t[:, 1:]


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def train(opt, rank, steps, micro, snapshot, fwd_loss):
    """steps x micro forward/backward (fwd_loss(tokens, labels) -> the micro-batch's loss), AdamW
    after each step; snapshot(step, what) after each step's backward and after its update.
    Returns (losses, host seconds per step of forward + backward)."""
    import torch
    losses, host = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        for m in range(micro):
            tok, lab = batches(rank, s, m)
            loss = fwd_loss(tok, lab) / micro
            loss.backward()
            losses.append(loss.detach())
        host.append(time.perf_counter() - t0)  # the step's forward and backward: what the plan drives
        snapshot(s, "grads")
        opt.step()
        opt.zero_grad(set_to_none=True)
        snapshot(s, "params")
    return torch.stack(losses), host


def tiny_sides(cfg, mesh):
    """(model, fwd_loss) under fully_shard with torchtitan's wrapping, then the same model unwrapped."""
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    from tiny_llama import Transformer, init_weights

    def loss_of(model):
        return lambda tok, lab: F.cross_entropy(model(tok).flatten(0, 1).float(), lab.flatten())
    a = Transformer(**CFG)
    init_weights(a, 1234)
    fully_shard(a.tok_embeddings, mesh=mesh, reshard_after_forward=True)
    for layer in a.layers.values():
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard([a.norm, a.output], mesh=mesh, reshard_after_forward=False)
    fully_shard(a, mesh=mesh)
    b = Transformer(**CFG)
    init_weights(b, 1234)
    return (a, loss_of(a)), (b, loss_of(b))


def titan_sides(cfg):
    """torchtitan's llama3: parallelized by its own parallelize_llama at the config's mesh (the
    trainer's SPMD context and input annotation around the step), then the same model unparallelized
    with the same initial values; both with torchtitan's cross_entropy_loss (a sum, divided here by
    the micro-batch's tokens)."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, distribute_tensor
    sys_path_titan()
    import titan_env as E
    E.cpu_training()  # before the mesh: torchtitan builds degree-1 dims over the "fake" backend
    import test_llama_plan as TL
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context
    par = CONFIGS[cfg]
    parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                    data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=1)
    training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                              mixed_precision_param="float32", mixed_precision_reduce="float32")
    pd = ParallelDims.from_config(parallelism, WORLD)
    pd.build_mesh()
    torch.manual_seed(1234)
    b = titan_model().build()
    full = {n: p.detach().clone() for n, p in b.named_parameters()}
    a = TL.parallelize(titan_model(), parallelism, training, pd, "cpu")
    with torch.no_grad():
        for n, p in a.named_parameters():
            if isinstance(p, DTensor):
                p.to_local().copy_(distribute_tensor(full[n], p.device_mesh, p.placements).to_local())
            else:
                p.copy_(full[n])
    for m in a.modules():
        if isinstance(m, FSDPModule):  # PREMUL_SUM(1 / 1) is a SUM; gloo has only the latter
            m.set_force_sum_reduction_for_comms(True)
    positions = torch.arange(SEQ).repeat(BATCH, 1)
    ctx = get_spmd_context(parallel_dims=pd)

    def loss_a(tok, lab):
        extra = {"positions": positions, "attention_masks": a.get_attention_masks(positions=positions)}
        with ctx():
            if pd.spmd_backend == "spmd_types":
                tok, lab, extra = annotate_input_spmd_types(pd, tok, lab, extra)
            return cross_entropy_loss(a(tok, **extra), lab) / (BATCH * SEQ)

    def loss_b(tok, lab):
        return cross_entropy_loss(b(tok, positions, b.get_attention_masks(positions=positions)), lab) / (BATCH * SEQ)
    return (a, loss_a), (b, loss_b)


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from commplan.runtime import CommplanFSDP, HostLibrary
    from commplan.match import find_plan_json, load_plan_json

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    report = []
    for cfg in args.configs.split(","):
        opt_kw = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
        snaps = {"a": {}, "b": {}}

        def snapper(side, model):
            def snap(step, what):
                for n, p in model.named_parameters():
                    t = p.grad if what == "grads" else p
                    snaps[side][(step, what, n)] = None if t is None else local(t).detach().clone()
            return snap

        if args.model == "titan":
            (a, loss_a), (b, loss_b) = titan_sides(cfg)
            from commplan.titan import titan_fsdp_units
            units = titan_fsdp_units(b)
        else:
            import commplan
            par = CONFIGS[cfg]
            mesh = init_device_mesh("cpu", (par["dp_replicate"], par["dp_shard"]),
                                    mesh_dim_names=("dp_replicate", "dp_shard")) if "dp_replicate" in par \
                else init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_shard",))
            (a, loss_a), (b, loss_b) = tiny_sides(cfg, mesh)
            units = commplan.torchtitan_units(b)
        # PyTorch's side
        opt_a = torch.optim.AdamW(a.parameters(), **opt_kw)
        la, host_a = train(opt_a, rank, args.steps, args.micro, snapper("a", a), loss_a)
        # the same model, every collective and copy from the generated plan's host library
        name = plan_name(cfg, args.model)
        pj = load_plan_json(find_plan_json(name, REPO))
        lib = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, plan_json=pj)
        fsdp = CommplanFSDP(name, b, units, root=REPO, library=lib)
        opt_b = torch.optim.AdamW(b.parameters(), **opt_kw)
        lb, host_b = train(opt_b, rank, args.steps, args.micro, snapper("b", b), loss_b)

        bad = []
        if not torch.equal(la, lb):
            i = int((la != lb).nonzero()[0])
            bad.append("loss %d (step %d, micro-batch %d): reference %r, commplan %r" % (
                i, i // args.micro, i % args.micro, la[i].item(), lb[i].item()))
        for key, x in snaps["a"].items():
            y = snaps["b"].get(key)
            if (x is None) != (y is None) or (x is not None and (x.shape != y.shape or not torch.equal(x, y))):
                bad.append("step %d %s of %s differ" % key)
        checked = len(snaps["a"])
        fsdp.close()
        report.append(dict(cfg=cfg, rank=rank, bad=bad, checked=checked, losses=la.tolist(), host_a=host_a,
                           host_b=host_b, plan_ops=len(pj["ops"])))
        del a, b, opt_a, opt_b
    out = [None] * WORLD
    dist.all_gather_object(out, report)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    who = "torchtitan's parallelize_llama" if args.model == "titan" else "fully_shard"
    passed = failed = 0
    for ci, cfg in enumerate(args.configs.split(",")):
        rows = [out[r][ci] for r in range(WORLD)]
        warm = slice(min(3, args.steps - 1), None)
        med = {k: statistics.median([t for r in rows for t in r[k][warm]]) * 1e3 for k in ("host_a", "host_b")}
        n_bad = sum(len(r["bad"]) for r in rows)
        passed, failed = passed + (n_bad == 0), failed + (n_bad != 0)
        print("%s %s %s: %d steps x %d micro-batches, %d ranks, plan %d ops: %s (%d tensors x ranks compared)" % (
            "ok  " if n_bad == 0 else "FAIL", args.model, cfg, args.steps, args.micro, WORLD, rows[0]["plan_ops"],
            "every loss, and after every step every sharded parameter and gradient, bit-identical to " + who
            if n_bad == 0 else "%d differences" % n_bad, sum(r["checked"] for r in rows)))
        for r in rows:
            for x in r["bad"][:5]:
                print("  rank %d: %s" % (r["rank"], x))
        print("  rank 0 losses (first, last): %r, %r" % (rows[0]["losses"][0], rows[0]["losses"][-1]))
        print("  host time per step, forward + backward (median over ranks and steps %d..%d, 4 ranks on 2 cores): "
              "%s %.2f ms, commplan %.2f ms" % (warm.start, args.steps - 1, who, med["host_a"], med["host_b"]))
    print("train_cpu: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torchrun", nargs="?", help="torch's torchrun (default: beside this python)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--configs", default="fsdp,hsdp")
    ap.add_argument("--model", choices=("titan", "tiny"), default="titan")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args))
    try:
        import torch
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:  # noqa: BLE001
        skip("torch with FSDP2 is not importable by %s (%s); make torch-env builds it" % (sys.executable, e))
    del torch
    if args.model == "titan":
        try:
            import torchtitan  # noqa: F401
        except Exception as e:  # noqa: BLE001
            skip("torchtitan is not importable by %s (%s); make torch-env builds it" % (sys.executable, e))
    torchrun = args.torchrun or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.access(torchrun, os.X_OK):
        skip("no torchrun at %s" % torchrun)
    for cfg in args.configs.split(","):
        if cfg not in CONFIGS:
            sys.exit("train_cpu: unknown config %r; known: %s" % (cfg, ", ".join(CONFIGS)))
        build_plan(cfg, args.micro, args.model)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), HERE, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(WORLD),
                        os.path.abspath(__file__), "--worker", "--steps", str(args.steps), "--micro",
                        str(args.micro), "--configs", args.configs, "--model", args.model], cwd=REPO, env=env,
                       timeout=900)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
