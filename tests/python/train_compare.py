"""The proof: a Llama-shaped model trained with AdamW for 20 steps on 4 ranks, once under
PyTorch's own FSDP2 (fully_shard with torchtitan's wrapping) and once with its communication
driven by the generated plan (commplan.runtime.CommplanFSDP), same seed, same data, same mesh.
Every rank compares, bit for bit: each micro-batch's loss, and at the end every parameter's local
shard and its gradient. Rank 0 prints the comparison and the host time per step of both.

    make test-train            # or: PYTHONPATH=python python3 tests/python/train_compare.py

All 4 ranks run on one GPU (each rank its own NCCL_HOSTID, so NCCL talks over sockets; see
shared/gpu/README.md): host times are real, GPU and communication times are not NVLink's.
The plan's library bootstraps through COMMPLAN_ID_FILE (a file in this run's temporary
directory), torch.distributed through MASTER_ADDR/MASTER_PORT: two bootstraps that never
collide. Gradient accumulation is torchtitan's (--micro 2: every backward reduce-scatters, the
sharded grads accumulate). --configs fp32,bf16 runs plain fp32 and torchtitan's mixed precision
(bf16 all-gather and compute, fp32 reduce).

Needs torch 2.x with FSDP2, a CUDA GPU, nvcc and NCCL (to build the plan's library); anywhere
else it prints one SKIP line and exits 0.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

WORLD = 4
CFG = dict(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=1000, multiple_of=64, ffn_dim_multiplier=1.3)
SEQ, BATCH = 64, 2


def skip(why):
    print("SKIP train_compare (20 AdamW steps, commplan vs FSDP2, bit for bit): torch 2.x with FSDP2 and a CUDA "
          "GPU are needed: %s" % why)
    sys.exit(0)


def fsdp2():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def preflight():
    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if int(torch.__version__.split(".")[0]) < 2:
        skip("torch %s has no FSDP2" % torch.__version__)
    try:
        fsdp2()
    except ImportError:
        skip("torch %s has no fully_shard" % torch.__version__)
    if not torch.cuda.is_available():
        skip("torch %s sees no CUDA GPU" % torch.__version__)
    if not torch.distributed.is_nccl_available():
        skip("torch %s was built without NCCL" % torch.__version__)
    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    if not os.access(nvcc, os.X_OK):
        skip("%s not found: the plan's library needs the GPU backend (make builds it where nvcc is)" % nvcc)


def plan_name(cfg):
    return "train_llama_%s" % cfg


def build_plan(cfg, micro_steps):
    """Writes the plan from the model (the README's plan-writing half) and builds its library."""
    import commplan
    from tiny_llama import Transformer
    model = Transformer(**CFG)
    name = plan_name(cfg)
    d = os.path.join(REPO, "build", "train_compare")
    os.makedirs(d, exist_ok=True)
    fsdp = {"micro_steps": micro_steps} if micro_steps > 1 else {}
    if cfg == "bf16":
        fsdp.update(param_dtype="bf16", reduce_dtype="fp32")
    commplan.plan_from_module(model, commplan.torchtitan_units(model), name, world_size=WORLD,
                              parallel={"dp_shard": -1}, fsdp=fsdp,
                              model_numbers={"n_heads": CFG["n_heads"], "seq_len": SEQ},
                              out=os.path.join(d, name + ".lua"))
    r = subprocess.run(["make", "--no-print-directory", "-s", "PLAN=build/train_compare/%s.lua" % name], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit("train_compare: make PLAN=build/train_compare/%s.lua failed" % name)
    return name


def batches(rank, step, micro):
    import torch
    g = torch.Generator().manual_seed(10_000 + 1000 * rank + 10 * step + micro)
    t = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ + 1), generator=g)
    return t[:, :-1], t[:, 1:]


def train(model, opt, rank, steps, micro, dev):
    """steps of `micro` forward/backward each, then AdamW. Returns (losses, host seconds per step, wall
    seconds per step); the last step's gradients are left in place for the comparison."""
    import torch
    import torch.nn.functional as F
    losses, host, wall = [], [], []
    data = [[tuple(x.to(dev) for x in batches(rank, s, m)) for m in range(micro)] for s in range(steps)]
    torch.cuda.synchronize()
    for s in range(steps):
        t0 = time.perf_counter()
        for tok, lab in data[s]:
            loss = F.cross_entropy(model(tok).flatten(0, 1).float(), lab.flatten()) / micro
            loss.backward()
            losses.append(loss.detach())
        opt.step()
        if s + 1 < steps:
            opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    return torch.stack(losses).cpu(), host, wall


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def worker(args):
    import torch
    import torch.distributed as dist
    import commplan
    from commplan.runtime import CommplanFSDP
    from tiny_llama import Transformer, init_weights
    fully_shard, MixedPrecisionPolicy = fsdp2()

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cuda", (WORLD,))
    report = []
    for cfg in args.configs.split(","):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cfg == "bf16" \
            else MixedPrecisionPolicy()
        opt_kw = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=args.foreach)

        # FSDP2 as torchtitan applies it
        a = Transformer(**CFG)
        init_weights(a, 1234)
        a.to(dev)
        fully_shard(a.tok_embeddings, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
        for layer in a.layers.values():
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
        fully_shard([a.norm, a.output], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        fully_shard(a, mesh=mesh, mp_policy=mp)
        opt_a = torch.optim.AdamW(a.parameters(), **opt_kw)
        la, host_a, wall_a = train(a, opt_a, rank, args.steps, args.micro, dev)

        # the same model, its communication from the generated plan
        b = Transformer(**CFG)
        init_weights(b, 1234)
        b.to(dev)
        fsdp = CommplanFSDP(plan_name(cfg), b, commplan.torchtitan_units(b), root=REPO)
        opt_b = torch.optim.AdamW(b.parameters(), **opt_kw)
        lb, host_b, wall_b = train(b, opt_b, rank, args.steps, args.micro, dev)
        fsdp.synchronize(120)

        bad = []
        if not torch.equal(la, lb):
            i = int((la != lb).nonzero()[0])
            bad.append("loss %d (step %d, micro-batch %d): FSDP2 %r, commplan %r" % (
                i, i // args.micro, i % args.micro, la[i].item(), lb[i].item()))
        pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
        if list(pa) != list(pb):
            bad.append("parameter names differ: %s vs %s" % (list(pa)[:3], list(pb)[:3]))
        for n in pa:
            x, y = local(pa[n]).detach(), pb[n].detach()
            if x.shape != y.shape or not torch.equal(x, y):
                bad.append("parameter %s: local shards differ (%s vs %s)" % (n, tuple(x.shape), tuple(y.shape)))
            gx, gy = pa[n].grad, pb[n].grad
            if gx is None or gy is None or not torch.equal(local(gx), gy):
                bad.append("gradient of %s differs" % n)
        fsdp.close()
        report.append(dict(cfg=cfg, rank=rank, bad=bad, losses=la.tolist(), host_a=host_a, host_b=host_b,
                           wall_a=wall_a, wall_b=wall_b))
        del a, b, opt_a, opt_b
        torch.cuda.empty_cache()
    out = [None] * WORLD
    dist.all_gather_object(out, report)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    ok = True
    passed = failed = 0
    for ci, cfg in enumerate(args.configs.split(",")):
        rows = [out[r][ci] for r in range(WORLD)]
        warm = slice(min(3, args.steps - 1), None)
        med = {k: statistics.median([t for r in rows for t in r[k][warm]]) * 1e3
               for k in ("host_a", "host_b", "wall_a", "wall_b")}
        n_bad = sum(len(r["bad"]) for r in rows)
        ok = ok and n_bad == 0
        passed, failed = passed + (n_bad == 0), failed + (n_bad != 0)
        print("%s: %d steps x %d micro-batches, %d ranks: %s" % (
            cfg, args.steps, args.micro, WORLD,
            "losses, final parameters and gradients bit-identical to FSDP2 on every rank" if n_bad == 0
            else "%d differences" % n_bad))
        for r in rows:
            for b in r["bad"][:5]:
                print("  rank %d: %s" % (r["rank"], b))
        print("  rank 0 losses (first, last): %r, %r" % (rows[0]["losses"][0], rows[0]["losses"][-1]))
        print("  host time per step (median over ranks and steps %d..%d): FSDP2 %.2f ms, commplan %.2f ms; "
              "wall with sync: FSDP2 %.2f ms, commplan %.2f ms (4 ranks on one GPU over sockets)"
              % (warm.start, args.steps - 1, med["host_a"], med["host_b"], med["wall_a"], med["wall_b"]))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro", type=int, default=2, help="micro-batches per step (each reduce-scatters)")
    ap.add_argument("--configs", default="fp32,bf16")
    ap.add_argument("--foreach", type=int, default=1, help="AdamW foreach (1) or per-tensor (0)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=540)
    ap.add_argument("--preflight", action="store_true", help="only say whether this machine can run it")
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args))
    preflight()
    if args.preflight:
        print("READY train_compare: torch 2.x with FSDP2, a CUDA GPU and nvcc are here")
        sys.exit(0)
    for cfg in args.configs.split(","):
        build_plan(cfg, 1)
    tmp = tempfile.mkdtemp(prefix="commplan-train-")
    port = 20000 + os.getpid() % 20000
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), NCCL_HOSTID="commplan-rank%d" % r, NCCL_SOCKET_IFNAME="lo",
                   NCCL_IB_DISABLE="1", COMMPLAN_ID_FILE=os.path.join(tmp, "nccl.id"),
                   COMMPLAN_ID_GENERATION="train-compare-%d-%d" % (os.getpid(), int(time.time())),
                   CUBLAS_WORKSPACE_CONFIG=":4096:8",
                   PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]))
        log = open(os.path.join(tmp, "rank%d.log" % r), "w")
        procs.append((subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--steps",
                                        str(args.steps), "--micro", str(args.micro), "--configs", args.configs,
                                        "--foreach", str(args.foreach)], env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    deadline = time.time() + args.timeout
    rc = 0
    for p, log in procs:
        try:
            rc |= p.wait(timeout=max(1, deadline - time.time())) != 0
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            rc = 1
        log.close()
    with open(os.path.join(tmp, "rank0.log")) as f:
        sys.stdout.write(f.read())
    if rc:
        for r in range(1, WORLD):
            with open(os.path.join(tmp, "rank%d.log" % r)) as f:
                tail = f.read().splitlines()[-15:]
            print("rank %d (last lines):\n  %s" % (r, "\n  ".join(tail)))
        print("train_compare: FAILED (logs in %s)" % tmp)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
