#!/usr/bin/env python3
"""The bridge (commplan.runtime.CommplanFSDP) and a plan whose forward calls a unit more than once
per micro-batch (issue 41: DeepSeek-V3's multi-token prediction, model.num_mtp_layers > 0;
torchtitan models/deepseek_v3/mtp.py runs tok_embeddings, and [norm, lm_head] under "always",
once per depth more; gen/models/deepseek_v3.lua calls, gen/parallel/fsdp_schedule.lua calls_micro).

The bridge's hooks run per call for such a unit (a call counter per unit and micro-step, FSDP2's
pre_forward / post_forward / pre_backward / RegisterPostBackwardFunction per call: runtime.py's
module docstring). Checks:

* plan.json: a tiny DeepSeek-V3 plan with num_mtp_layers 1 (FSDP 4; tests/titan/test_mtp.py's tiny
  model) carries forward_calls 2 on tok_embeddings and norm_lm_head, and so does the same model under
  torchtitan's "never" reshard policy with 2 micro-batches (whose ops gather no unit twice in a
  forward); the same plan generated with the model's call order dropped (one forward per unit,
  gen.models.deepseek_v3.calls = nil, as test_mtp.lua's one_forward) carries none; no committed
  plans/*/plan.json carries it (the ChunkedLossWrapper plans' loss head, gathered once per chunk, is
  reduced in parts by commplan.chunked_loss, not a repeated call);
* live, on gloo (torchrun, 4 ranks): the tiny num_mtp_layers 1 model at fp32 with torchtitan's MTPLoss,
  2 steps of AdamW, once parallelized by torchtitan's parallelize_deepseekv3 (fully_shard, its
  apply_fsdp_to_mtp_decoder) and once driven by CommplanFSDP over the plan's host library, blocking
  and with overlap (commplan.overlap): every rank's collectives (kind, elements, dtype, reduce op,
  group) equal torchtitan's and plan.json's (with overlap in order; blocking, whose unshard is one
  call in the pre-backward and so cannot be issued ahead of a reduce-scatter as FSDP2 prefetches it,
  as a multiset, its calls held to the plan's order by the bridge's order check), and every
  gradient shard bit-identical; the mutant: the one-forward plan's library on the same model is
  refused by the bridge (PlanOrderError: a second forward of tok_embeddings), so the run that passed
  drove the per-call hooks.

About 2 s without torch (SKIP), the live run about a minute. Prints "bridge_mtp:" lines;
exit 0 when every check holds, 1 otherwise, 77 (SKIP) without torch / torchtitan.
"""
import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)
OUT = os.path.join(REPO, "build", "bridge_mtp")
# tests/titan/test_moe_plan.py's DSV3_TINY (kept here so no torchtitan is needed)
TINY = dict(family="deepseek_v3", dim=64, n_layers=4, n_dense_layers=2, n_heads=4, vocab_size=96, q_lora_rank=16,
            kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, dense_hidden_dim=96,
            moe_hidden_dim=32, num_experts=4, num_shared_experts=2, top_k=2, seq_len=16, num_mtp_layers=1)


def generate(one_forward, never=False):
    from commplan import plan_text
    name = "mtp1_never" if never else "mtp1"
    key = name + ("_one_forward" if one_forward else "")
    os.makedirs(os.path.join(OUT, "plans"), exist_ok=True)
    path = os.path.join(OUT, "plans", name + ".lua")
    f = {"param_dtype": "bf16", "reduce_dtype": "fp32", "reduce_op": "sum"}
    if never:
        f.update(reshard_after_forward_policy="never", micro_steps=2)
    with open(path, "w") as fh:
        fh.write(plan_text(name, 4, TINY, parallel={"dp_shard": 4}, fsdp=f, training={"local_batch_size": 1}))
    pre = ['-e', 'package.path="./?.lua;"..package.path; require("gen.models.deepseek_v3").calls = '
           'function() return nil end'] if one_forward else []
    outdir = os.path.join(OUT, "gen", key)
    subprocess.run(["lua5.4"] + pre + ["gen/commplan.lua", os.path.relpath(path, REPO), os.path.relpath(outdir, REPO)],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(outdir, "plan.json")


def static_checks():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP bridge_mtp: no torch (%s)" % e)
        return 77
    from commplan.runtime import repeated_calls
    from commplan.match import load_plan_json
    problems = []
    mtp, one = generate(False), generate(True)
    got = repeated_calls(load_plan_json(mtp))
    if got != [("tok_embeddings", 2), ("norm_lm_head", 2)]:
        problems.append("plan.json's forward_calls: %s, want tok_embeddings and norm_lm_head 2 each" % got)
    # torchtitan's "never" (2 micro-batches): no unit gathered twice in a forward, the calls still repeated
    never = repeated_calls(load_plan_json(generate(False, never=True)))
    if never != got:
        problems.append("the \"never\" plan's forward_calls: %s, want %s" % (never, got))
    rep = repeated_calls(load_plan_json(one))
    if rep:
        problems.append("the one-forward mutant carries forward_calls too (%s)" % rep)
    shipped = sorted(glob.glob(os.path.join(REPO, "plans", "*", "plan.json")))
    chunked = 0
    for f in shipped:
        plan = load_plan_json(f)
        if repeated_calls(plan):
            problems.append("%s refused: %s" % (os.path.relpath(f, REPO), repeated_calls(plan)))
        if any(u.get("forward_calls") for u in plan["units"]):
            problems.append("%s carries forward_calls" % os.path.relpath(f, REPO))
        chunked += any(op["kind"] == "pack" and op.get("params") for op in plan["ops"])
    for p in problems:
        print("FAIL bridge_mtp: " + p)
    print("bridge_mtp: plan.json's forward_calls: %s (and under \"never\"); none on its one-forward mutant nor on "
          "the %d committed plans (%d with ChunkedLossWrapper's loss head)"
          % (", ".join("%s %d" % c for c in got), len(shipped), chunked))
    return 1 if problems else 0


def main():
    import bridge_harness as H
    ap = H.parser(__doc__)
    args = H.parse(ap, live_worker)
    rc = static_checks()
    if rc == 77:
        return rc
    torchrun = H.torchrun_for(TAG, args.torchrun, ("torch", "torch.distributed.fsdp", "torchtitan", "spmd_types"),
                              "torch with FSDP2, torchtitan and spmd_types")
    live_plan(LIVE)
    live_plan(LIVE + "_one", one_forward=True)
    live = H.launch(torchrun, __file__, WORLD, ["--worker"], 900)
    return 1 if rc or live else 0


# ---- the live run: CommplanFSDP vs torchtitan's fully_shard on gloo (4 ranks) ----

TAG = "bridge_mtp"
WORLD, SEQ, BATCH, STEPS = 4, 16, 1, 2
FSDP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "reduce_op": "sum"}
LIVE = "bridge_mtp_live"  # its plan under build/bridge_mtp_live.lua's directory: build/bridge_mtp/plans


def live_plan(name, one_forward=False):
    """The tiny num_mtp_layers 1 plan at fp32 (FSDP 4), written under build/bridge_mtp/plans and its
    library built (make PLAN=...); one_forward: the model's call order dropped (the mutant)."""
    import bridge_harness as H
    from commplan import plan_text
    build = os.path.join("build", "bridge_mtp", "plans")
    os.makedirs(os.path.join(REPO, build), exist_ok=True)
    with open(os.path.join(REPO, build, name + ".lua"), "w") as fh:
        fh.write(plan_text(name, WORLD, dict(TINY, seq_len=SEQ), parallel={"dp_shard": WORLD}, fsdp=dict(FSDP32),
                           training={"local_batch_size": BATCH}))
    env = dict(os.environ)
    if one_forward:  # gen/commplan.lua run with the model's calls dropped (test_mtp.lua's one_forward)
        env["LUA_INIT"] = ('package.path="./?.lua;"..package.path; require("gen.models.deepseek_v3").calls = '
                           'function() return nil end')
    r = subprocess.run(["make", "--no-print-directory", "-s", "PLAN=%s/%s.lua" % (build, name)], cwd=REPO, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit("%s: make PLAN=%s/%s.lua failed" % (TAG, build, name))
    return name


def units_of(model):
    """torchtitan's fully_shard units of the MTP model (apply_fsdp_to_decoder, then
    apply_fsdp_to_mtp_decoder's one unit per MTP block, mtp.py:281-320), root last."""
    from commplan.modules import Unit
    from commplan.titan import titan_fsdp_units
    units = titan_fsdp_units(model)
    mtp = [Unit([blk], name="mtp_layers.%s" % k) for k, blk in enumerate(model.mtp_layers)]
    return units[:-1] + mtp + units[-1:]


def live_worker(args):
    import contextlib
    import dataclasses
    import torch
    import bridge_harness as H
    sys.path.insert(0, os.path.join(REPO, "tests", "titan"))
    import titan_env as E
    E.cpu_training()
    import test_chunked_loss as CL
    import test_fused_plan as F
    import test_moe_plan as M
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torchtitan.distributed.utils import get_spmd_context
    from torchtitan.models.deepseek_v3.mtp import MTPLoss
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary, PlanOrderError
    rank = H.init_rank()
    torch.autograd.set_detect_anomaly(bool(os.environ.get("HMTP4_ANOMALY")))
    log, on = [], [False]
    CL.install_recorder(log, on)
    parallelism, training = F.job({"dp_shard": WORLD}, FSDP32, SEQ)
    pd = H.parallel_dims(parallelism, WORLD)
    positions = torch.arange(SEQ).repeat(BATCH, 1)
    mtp = MTPLoss(MTPLoss.Config())

    def loss_fn(pred, labels, gvt):
        return mtp(pred, labels, gvt, positions=positions)

    def plain_model():
        cfg = M.titan_config("deepseek_v3", None, TINY)
        from torchtitan.models.deepseek_v3 import model_registry
        from torchtitan.trainer import Trainer
        spec = model_registry("debugmodel")
        spec.model = cfg
        cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
        torch.manual_seed(0)
        m = cfg.build()
        with torch.no_grad():
            m.init_weights(buffer_device=None)
        return m.train()

    def run(model, ctx, snaps):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
        steps = []
        for step in range(STEPS):
            del log[:]
            on[0] = True
            try:
                CL.forward_backward(model, loss_fn, ctx, TINY["vocab_size"], BATCH, SEQ, WORLD, rank, step, 1)
            finally:
                on[0] = False
            steps.append(list(log))
            for n, p in model.named_parameters():
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                snaps[(step, n)] = g.detach().clone()
            opt.step()
            opt.zero_grad()
        return steps

    b = plain_model()
    full = {n: p.detach().clone() for n, p in b.named_parameters()}
    a = F.parallelize("deepseek_v3", M.titan_config("deepseek_v3", None, TINY), None,
                      dataclasses.replace(parallelism), training, pd)
    a.to_empty(device="cpu")
    with torch.no_grad():
        a.init_weights(buffer_device=None)
        for n, p in a.named_parameters():
            if isinstance(p, DTensor):
                p.to_local().copy_(distribute_tensor(full[n], p.device_mesh, p.placements).to_local())
            else:
                p.copy_(full[n])
    a.train()
    for m in a.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)  # gloo has SUM, not PREMUL_SUM(1)
    snaps_a, snaps_b, bad = {}, {}, []
    steps_a = run(a, get_spmd_context(parallel_dims=pd), snaps_a)
    pj = load_plan_json(find_plan_json(LIVE, REPO))
    want = [t[:5] for t in CL.table_step(pj, rank)]
    coll = grads = calls = 0
    for overlap in (False, True):  # blocking calls, then the split ones (commplan.overlap)
        b = plain_model() if overlap else b
        snaps_b = {}
        lib = HostLibrary(os.path.join(REPO, "build", LIVE, "lib%s.so" % LIVE), LIVE, plan_json=pj)
        fsdp = CommplanFSDP(LIVE, b, units_of(b), root=REPO, library=lib, overlap=overlap)
        calls = max(calls, len(fsdp._calls))
        try:
            steps_b = run(b, contextlib.nullcontext, snaps_b)
        except PlanOrderError as e:
            steps_b = []
            bad.append("the bridge (overlap %s): %s" % (overlap, H.failure(e)))
        finally:
            fsdp.close()
        for step, (ga, gb) in enumerate(zip(steps_a, steps_b)):
            ga, gb = CL.recorded(ga), CL.recorded(gb)
            coll += len(ga)
            if not overlap:
                # blocking calls: an unshard is one call in its unit's pre-backward, so the all-gathers
                # FSDP2 prefetches (and the plan issues) ahead of a reduce-scatter come after it; the
                # calls' order is held to the plan's (library_calls) by the order check, the
                # collectives compared as a multiset
                ga, gb, w = sorted(ga), sorted(gb), sorted(want)
            else:
                w = want
            if ga != gb:
                n, at = CL.diff(ga, gb)
                bad.append("overlap %s step %d: %d collectives differ from torchtitan's, first at %s: %r vs %r"
                           % (overlap, step, n, at, ga[at] if at is not None and at < len(ga) else None,
                              gb[at] if at is not None and at < len(gb) else None))
            if gb != w:
                bad.append("overlap %s step %d: the bridge's collectives differ from plan.json's" % (overlap, step))
        for key, x in snaps_a.items():
            y = snaps_b.get(key)
            grads += x.numel()
            if y is None or x.shape != y.shape or not torch.equal(x, y):
                bad.append("overlap %s: step %d gradient of %s differs" % ((overlap,) + key))
    # the mutant: the one-forward plan's order refused by the bridge's order check on the same model
    mutant = None
    c = plain_model()
    pm = load_plan_json(find_plan_json(LIVE + "_one", REPO))
    libm = HostLibrary(os.path.join(REPO, "build", LIVE + "_one", "lib%s_one.so" % LIVE), LIVE + "_one", plan_json=pm)
    fm = CommplanFSDP(LIVE + "_one", c, units_of(c), root=REPO, library=libm)
    try:
        CL.forward_backward(c, loss_fn, contextlib.nullcontext, TINY["vocab_size"], BATCH, SEQ, WORLD, rank, 0, 1)
    except PlanOrderError as e:
        mutant = str(e).splitlines()[0]
    finally:
        fm.close()
    torch.distributed.barrier()
    out = H.gather(dict(bad=bad, coll=coll, grads=grads, mutant=mutant, calls=calls), WORLD)
    if rank != 0:
        return 0
    nbad = sum(len(o["bad"]) for o in out)
    for r, o in enumerate(out):
        for x in o["bad"][:5]:
            print("FAIL bridge_mtp rank %d: %s" % (r, x))
        if o["mutant"] is None:
            print("FAIL bridge_mtp rank %d: the one-forward plan's order was not refused" % r)
            nbad += 1
    print("bridge_mtp: %s live, blocking and overlapped calls: CommplanFSDP vs torchtitan's fully_shard, tiny "
          "DeepSeek-V3 num_mtp_layers 1, "
          "FSDP %d on gloo, %d steps: %d collectives x ranks equal to torchtitan's and plan.json's (overlapped: in "
          "order; blocking: as a multiset), %d gradient elements x ranks bit-identical, %d library calls a step; the "
          "one-forward plan refused on the MTP model (%s)"
          % ("ok" if nbad == 0 else "FAIL", WORLD, STEPS, sum(o["coll"] for o in out),
             sum(o["grads"] for o in out), out[0]["calls"], (out[0]["mutant"] or "")[:90]))
    return 1 if nbad else 0


if __name__ == "__main__":
    sys.exit(main())
