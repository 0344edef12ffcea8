"""Host time of the bridge beside torchtitan + FSDP2, in one run (issue 36, item 5), on CPU.

torchtitan 0.3's llama3 (the tiny config tests/python/train_cpu.py builds: dim 64, 2 layers) under
torchrun, 4 ranks on gloo, FSDP (dp_shard 4) and HSDP (2 x 2), fp32, 2 micro-batches per step;
the same model three times in one process: parallelized by torchtitan's own parallelize_llama
(fully_shard), then driven by the plan through CommplanFSDP over the host library with overlap
(the split calls, commplan.overlap) and without (every call blocking).

What is measured, with the same instrument on every side (a wrapper around each hook, the
outermost only where hooks nest):

  hooks wall  per step, the wall time spent inside the FSDP machinery's hooks: FSDP2's
              FSDPState._pre_forward / _post_forward / _pre_backward /
              _root_post_backward_final_callback and FSDPParamGroup.post_backward
              (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, _fsdp_param_group.py); the
              bridge's forward pre/post hooks, pre-backward hooks, gradient hooks and final
              callback (python/commplan/runtime.py). On CPU this includes the time the hook
              blocks on a gloo collective it waits for;
  hooks CPU   the same intervals in the training thread's CPU time (time.thread_time): the host
              work of the machinery itself, not its waits (gloo runs collectives on its own
              threads); the CPU analogue of the GPU's "host time per step";
  step wall   per step, forward + backward of both micro-batches + AdamW.

Medians over ranks and the steps after the warm-up. The machine is shared (2 cores, other jobs):
absolute numbers are noisy, the ratios in one run less so.

    bench/bridge_host_time.py [TORCHRUN] [--steps N] [--configs fsdp,hsdp]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

import train_cpu as T  # noqa: E402 - the same model, plan and sides as the training test

WORLD = T.WORLD
MICRO = 2


class Clock:
    """Wall and thread-CPU time inside wrapped hooks (outermost calls only)."""

    def __init__(self):
        self.depth = 0
        self.wall = self.cpu = 0.0

    def wrap(self, fn):
        def timed(*a, **k):
            if self.depth:
                return fn(*a, **k)
            self.depth = 1
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.wall += time.perf_counter() - w
                self.cpu += time.thread_time() - c
                self.depth = 0
        return timed

    def take(self):
        r = (self.wall, self.cpu)
        self.wall = self.cpu = 0.0
        return r


CLOCK = Clock()


def instrument():
    """Before any model is built: the class attributes hooks are bound from."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from commplan.runtime import CommplanFSDP
    for cls, names in ((FSDPState, ("_pre_forward", "_post_forward", "_pre_backward",
                                    "_root_post_backward_final_callback")),
                       (FSDPParamGroup, ("post_backward",)), (CommplanFSDP, ("_finish_backward",))):
        for n in names:
            setattr(cls, n, CLOCK.wrap(getattr(cls, n)))
    # the bridge's hooks are closures made per unit / parameter: wrap what the makers return
    for n in ("_pre_forward_hook", "_post_forward_hook", "_pre_backward_hook", "_grad_hook"):
        maker = getattr(CommplanFSDP, n)

        def make(self, *a, _maker=maker, **k):
            return CLOCK.wrap(_maker(self, *a, **k))
        setattr(CommplanFSDP, n, make)


def run(opt, rank, steps, fwd_loss):
    rows = []
    for s in range(steps):
        CLOCK.take()
        t0 = time.perf_counter()
        for m in range(MICRO):
            tok, lab = T.batches(rank, s, m)
            (fwd_loss(tok, lab) / MICRO).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        hw, hc = CLOCK.take()
        rows.append((wall, hw, hc))
    return rows


def worker(args):
    import torch
    import torch.distributed as dist
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary
    from commplan.titan import titan_fsdp_units
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    instrument()
    report = []
    for cfg in args.configs.split(","):
        opt_kw = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
        (a, loss_a), (b, loss_b) = T.titan_sides(cfg)
        res = {"FSDP2 (torchtitan)": run(torch.optim.AdamW(a.parameters(), **opt_kw), rank, args.steps, loss_a)}
        name = T.plan_name(cfg, "titan")
        pj = load_plan_json(find_plan_json(name, REPO))
        for label, overlap in (("bridge, overlap", True), ("bridge, blocking", False)):
            torch.manual_seed(1234)
            m = T.titan_model().build()
            positions = torch.arange(T.SEQ).repeat(T.BATCH, 1)
            from torchtitan.components.loss import cross_entropy_loss

            def loss_m(tok, lab, m=m):
                return cross_entropy_loss(m(tok, positions, m.get_attention_masks(positions=positions)), lab) \
                    / (T.BATCH * T.SEQ)
            lib = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, plan_json=pj)
            fsdp = CommplanFSDP(name, m, titan_fsdp_units(m), root=REPO, library=lib, overlap=overlap)
            res[label] = run(torch.optim.AdamW(m.parameters(), **opt_kw), rank, args.steps, loss_m)
            fsdp.close()
        report.append(dict(cfg=cfg, res=res))
        del a, b
    out = [None] * WORLD
    dist.all_gather_object(out, report)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    warm = slice(args.warmup, args.steps)
    print("bridge_host_time: torchtitan llama3 (dim %d, %d layers, seq %d, batch %d), %d ranks on gloo, %d "
          "micro-batches, steps %d..%d (median over ranks and steps), %s" % (
              T.TITAN["dim"], T.TITAN["n_layers"], T.SEQ, T.BATCH, WORLD, MICRO, args.warmup, args.steps - 1,
              os.uname().nodename and "%d CPUs" % os.cpu_count()))
    print("| config | side | hooks wall ms/step | hooks CPU ms/step | step wall ms | hooks CPU vs FSDP2 | step wall vs "
          "FSDP2 |")
    print("|---|---|---|---|---|---|---|")
    for i, cfg in enumerate(args.configs.split(",")):
        med = {}
        for side in out[0][i]["res"]:
            rows = [x for r in range(WORLD) for x in out[r][i]["res"][side][warm]]
            med[side] = [statistics.median(x[k] for x in rows) * 1e3 for k in (1, 2, 0)]
        ref = med["FSDP2 (torchtitan)"]
        for side, (hw, hc, sw) in med.items():
            print("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f |" % (cfg, side, hw, hc, sw, hc / ref[1], sw / ref[2]))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torchrun", nargs="?", help="torch's torchrun (default: beside this python)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--configs", default="fsdp,hsdp")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args))
    torchrun = args.torchrun or os.path.join(os.path.dirname(sys.executable), "torchrun")
    for cfg in args.configs.split(","):
        T.build_plan(cfg, MICRO, "titan")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "python"), os.path.join(REPO, "tests", "python"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(WORLD), os.path.abspath(__file__), "--worker",
                        "--steps", str(args.steps), "--warmup", str(args.warmup), "--configs", args.configs],
                       cwd=REPO, env=env, timeout=1800)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
