"""Activation checkpointing and ChunkedLossWrapper through the bridge (issue 36, item 2;
commplan.recompute, commplan.chunked_loss) against torchtitan 0.3's own parallelize + fully_shard,
on gloo, 4 ranks under torchrun, bit for bit.

torchtitan's llama3 (tiny numbers, tests/python/train_cpu.py's titan_model) is built twice with
the same values: once parallelized by torchtitan's parallelize_llama at the case's mesh with the
case's activation checkpointing (its ac_config: FullAC, per-op SelectiveAC, or every k-th block
wrapped in FullAC's checkpoint_wrapper -- torchtitan <= 0.2's layer-level SAC, which 0.3 no longer
has: distributed/activation_checkpoint.py has only FullAC / SelectiveAC / MemoryBudgetAC), once
unparallelized with the same AC applied (torchtitan's policy.apply: block FQNs gain
"_checkpoint_wrapped_module") and driven by CommplanFSDP over the plan's host library, the plan
written from the model without AC (plan_from_titan: the names are the model's FQNs). The loss is
torchtitan's CrossEntropyLoss on whole logits, or its ChunkedLossWrapper (num_chunks dividing
seq_len) set up as Trainer.__init__ does (set_lm_head(model.lm_head), model._skip_lm_head = True)
on both sides: on the bridge's side lm_head answers isinstance(lm_head, FSDPModule) and the
wrapper's FSDPModule calls from the plan (training.loss_chunks = N). Each case runs STEPS AdamW
steps x 2 micro-batches (every backward reduces, as torchtitan accumulates) and compares every
loss and, after every step's backward and its update, every sharded parameter and gradient; after
step 0's update both sides run torchtitan's validation forward (no_grad; under ChunkedLossWrapper its
chunked forward only) and compare its output and loss, and the next step's training stays compared.

Also, per case: the bridge's model and optimizer state dicts (commplan.checkpoint) equal to
fully_shard's after training, keyed by the model's FQNs (no checkpoint-wrapper segment);
torchtitan's every FSDP collective on every rank (kind, elements, dtype, reduce
op, group ranks; tests/titan/test_chunked_loss.py's recorder) equal to the plan's collectives in
plan.json's order (a model's very first step under ChunkedLossWrapper issues one all-gather
fewer: test_chunked_loss.first_step), and the plan's FSDP op list equal with
training.activation_checkpointing "none", "full" and "selective" (AC changes no collective).
Mutants that must be refused: a plan with loss_chunks = 1 driven by ChunkedLossWrapper, and the
chunked plan driven by a whole-logits loss (the order check, one line each).

    tests/python/test_bridge_ac.py [TORCHRUN] [--steps N] [--cases a,b]

For the matrix: build_plan(case, micro) writes and builds a case's plan; titan_sides(case) gives
((model_a, loss_a), (model_b, loss_b)) for a CASES entry (mesh, ac, chunks), model_b ready for
CommplanFSDP(plan, model_b, titan_fsdp_units(model_b), ...); apply_ac(model, ac) and ac_config(ac)
are the AC policies alone. COMMPLAN_TEST_TIER=quick (make test) runs hsdp_sel_chunk4 alone (HSDP,
selective AC, ChunkedLossWrapper) and the refusals, 2 steps, and says so in a "quick tier:" line;
full, or run by hand, every case, 3 steps. Needs torch 2.x with FSDP2, torchtitan and torchrun;
anywhere else one SKIP line and exit 77.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "titan"))

import bridge_harness as H  # noqa: E402
import train_cpu as TC  # noqa: E402

TAG = "bridge_ac"

WORLD = TC.WORLD
MICRO = 2
# name -> (mesh, activation checkpointing, loss chunks); ac: none, full, selective (per-op SAC),
# layer2 (every 2nd block wrapped, torchtitan <= 0.2's layer SAC)
CASES = {
    "fsdp_full": ("fsdp", "full", 1),
    "fsdp_sel": ("fsdp", "selective", 1),
    "hsdp_layer2": ("hsdp", "layer2", 1),
    "fsdp_chunk4": ("fsdp", "none", 4),
    "hsdp_sel_chunk4": ("hsdp", "selective", 4),
    "fsdp_full_chunk8": ("fsdp", "full", 8),
    "hsdp_full": ("hsdp", "full", 1),
    "fsdp_sel_inner": ("fsdp", "selective", 1),
}
# cases whose bridge hooks sit on the blocks inside the checkpoint wrappers (fully_shard stays on
# the wrappers): the recompute runs the hooks again during backward (commplan.recompute: no call)
INNER = {"fsdp_sel_inner"}
QUICK_CASES = ("hsdp_sel_chunk4",)
QUICK = H.QUICK
BUILD = os.path.join("build", "bridge_ac")
EVAL_AFTER = 0  # an eval forward (no_grad) after this step's update, on both sides, compared
PLAN_AC = {"none": "none", "full": "full", "selective": "selective", "layer2": "full"}


def plan_name(case, micro=MICRO):
    mesh, ac, chunks = CASES[case]
    return "bridge_ac_%s_%s_c%d_m%d" % (mesh, PLAN_AC[ac], chunks, micro)


def write_plan(case, micro=MICRO, ac=None, chunks=None, name=None):
    """The case's plan (plan_from_titan on the model without AC: its FQNs), written under BUILD."""
    from commplan.titan import plan_from_titan
    mesh, cac, cchunks = CASES[case]
    ac = PLAN_AC[cac] if ac is None else ac
    chunks = cchunks if chunks is None else chunks
    name = name or plan_name(case, micro)
    d = os.path.join(REPO, BUILD)
    os.makedirs(d, exist_ok=True)
    out = os.path.join(d, name + ".lua")
    plan_from_titan(TC.titan_model(), name, WORLD, parallel=dict(TC.CONFIGS[mesh]),
                    fsdp={"micro_steps": micro, "reduce_op": "sum"}, seq_len=TC.SEQ,
                    training={"loss_chunks": chunks, "activation_checkpointing": ac, "local_batch_size": TC.BATCH},
                    out=out)
    return name, out


def build_plan(case, micro=MICRO):
    """The case's plan written and its library built (make PLAN=...)."""
    name, _ = write_plan(case, micro)
    H.build_all(TAG, BUILD, [name])
    return name


def fsdp_ops(path):
    """A generated plan's op list without what AC may change outside FSDP (none)."""
    with open(path) as fh:
        p = json.load(fh)
    return [{k: v for k, v in o.items() if k not in ("seq",)} for o in p["ops"]]


def check_ac_plans(case):
    """plan.json's FSDP ops with activation_checkpointing none / full / selective: equal."""
    ops = {}
    for ac in ("none", "full", "selective"):
        name, path = write_plan(case, ac=ac, name="bridge_ac_opcheck_%s" % ac)
        out = os.path.join(REPO, BUILD, "gen", name)
        subprocess.run(["lua5.4", "gen/commplan.lua", path, out], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        ops[ac] = fsdp_ops(os.path.join(out, "plan.json"))
    bad = [ac for ac in ("full", "selective") if ops[ac] != ops["none"]]
    return len(ops["none"]), bad


class LayerAC:
    """Every k-th block in FullAC's checkpoint_wrapper (torchtitan <= 0.2's layer-level selective
    AC, selective_ac_option = k); duck-typed as parallelize_llama's ac_config (.build().apply())."""

    def __init__(self, every):
        self.every = every

    def build(self, dump_folder=""):
        return self

    def apply(self, model):
        from torchtitan.distributed.activation_checkpoint import FullAC
        full = FullAC(FullAC.Config())
        layers = model.get_submodule("layers")
        for i, (layer_id, block) in enumerate(list(layers.named_children())):
            if i % self.every == 0:
                layers.register_module(layer_id, full._wrap_block(block, base_fqn="layers.%s" % layer_id))


def ac_config(ac):
    """torchtitan's ac_config for parallelize_llama: None, FullAC.Config, SelectiveAC.Config or LayerAC."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    if ac == "none":
        return None
    if ac == "full":
        return FullAC.Config()
    if ac == "selective":
        return SelectiveAC.Config()
    if ac.startswith("layer"):
        return LayerAC(int(ac[len("layer"):]))
    raise ValueError("ac: none, full, selective or layerK, not %r" % ac)


def apply_ac(model, ac):
    """The AC policy applied to an unparallelized model, as parallelize_llama applies it."""
    cfg = ac_config(ac)
    if cfg is not None:
        cfg.build(dump_folder="").apply(model)
    return model


def parallelize(ac):
    """torchtitan's parallelize_llama with ac_config (tests/titan/test_llama_plan.parallelize's)."""
    from torchtitan.config import CompileConfig
    from torchtitan.models.llama3 import model_registry, parallelize_llama
    from torchtitan.trainer import Trainer

    def run(cfg, parallelism, training, pd):
        spec = model_registry("debugmodel")
        spec.model = cfg
        cfg.update_from_config(config=Trainer.Config(model_spec=spec, parallelism=parallelism, training=training))
        model = cfg.build()
        return parallelize_llama(model, parallel_dims=pd, training=training, parallelism=parallelism,
                                 compile_config=CompileConfig(), ac_config=ac_config(ac),
                                 dump_folder=os.path.join(REPO, BUILD, "dump"))
    return run


def titan_sides(case, reference=True):
    """((a, loss_a), (b, loss_b)): torchtitan's parallelize + fully_shard with the case's AC and
    loss, and the same model unparallelized with the same AC and loss (for CommplanFSDP);
    reference=False: (None, None) for the former."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, distribute_tensor
    import titan_env as E
    E.cpu_training()
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context
    from commplan.recompute import clean_fqn
    mesh, ac, chunks = CASES[case]
    par = TC.CONFIGS[mesh]
    parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                    data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=1)
    training = TrainingConfig(local_batch_size=TC.BATCH, seq_len=TC.SEQ, dtype="float32",
                              mixed_precision_param="float32", mixed_precision_reduce="float32")
    pd = H.parallel_dims(parallelism, WORLD)  # one mesh per process and layout: torchtitan keeps the first
    torch.manual_seed(1234)
    b = TC.titan_model().build()
    full = {n: p.detach().clone() for n, p in b.named_parameters()}
    apply_ac(b, ac)
    positions = torch.arange(TC.SEQ).repeat(TC.BATCH, 1)
    gvt = torch.tensor(TC.BATCH * TC.SEQ)

    def make_loss(model):
        if chunks == 1:
            return CrossEntropyLoss(CrossEntropyLoss.Config())
        fn = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=chunks))  # as Trainer.__init__
        fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
        return fn
    fn_b = make_loss(b)

    def loss_b(tok, lab, keep=None):
        pred = b(tok, positions, b.get_attention_masks(positions=positions))
        if keep is not None:
            keep.append(pred)
        return fn_b(pred, lab, gvt)[0]
    if not reference:
        return (None, None), (b, loss_b)
    a = parallelize(ac)(TC.titan_model(), parallelism, training, pd)
    with torch.no_grad():
        for n, p in a.named_parameters():
            src = full[clean_fqn(n)]
            if isinstance(p, DTensor):
                p.to_local().copy_(distribute_tensor(src, p.device_mesh, p.placements).to_local())
            else:
                p.copy_(src)
    for m in a.modules():
        if isinstance(m, FSDPModule):  # PREMUL_SUM(1 / 1) is a SUM; gloo has only the latter
            m.set_force_sum_reduction_for_comms(True)
    ctx = get_spmd_context(parallel_dims=pd)
    fn_a = make_loss(a)

    def loss_a(tok, lab, keep=None):
        extra = {"positions": positions, "attention_masks": a.get_attention_masks(positions=positions)}
        with ctx():
            if pd.spmd_backend == "spmd_types":
                tok, lab, extra = annotate_input_spmd_types(pd, tok, lab, extra)
            pred = a(tok, **extra)
            if keep is not None:
                keep.append(pred)
            return fn_a(pred, lab, gvt)[0]
    return (a, loss_a), (b, loss_b)


def run_case(case, rank, steps, log, on):
    """One case on this rank: both sides trained, compared; the reference's collectives recorded."""
    import torch
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary
    from commplan.recompute import clean_fqn
    import test_chunked_loss as CL
    opt_kw = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    snaps = {"a": {}, "b": {}}

    def snapper(side, model, loss_fn):
        def snap(step, what):
            for n, p in model.named_parameters():
                t = p.grad if what == "grads" else p
                snaps[side][(step, what, clean_fqn(n))] = None if t is None else TC.local(t).detach().clone()
            if what == "params" and step == EVAL_AFTER:  # an eval forward between training steps
                evaluate(side, loss_fn)
        return snap

    def evaluate(side, loss_fn):
        """torchtitan's validation forward (components/validate.py:215, under no_grad): the model's
        output (hidden states under ChunkedLossWrapper's _skip_lm_head, logits otherwise) and the loss
        (ChunkedLossWrapper's chunked forward only: pred does not require grad, loss.py:656)."""
        was, on[0] = on[0], False  # fully_shard's eval all-gathers are not the plan's training ops
        tok, lab = TC.batches(rank, 100, 0)
        keep = []
        with torch.no_grad():
            loss = loss_fn(tok, lab, keep)
        on[0] = was
        snaps[side][(EVAL_AFTER, "eval", "loss")] = loss.detach().clone()
        snaps[side][(EVAL_AFTER, "eval", "output")] = TC.local(keep[0]).detach().clone()
    (a, loss_a), (b, loss_b) = titan_sides(case)
    opt_a = torch.optim.AdamW(a.parameters(), **opt_kw)
    steps_log = []

    def snap_a(step, what):
        if what == "grads":
            steps_log.append(list(log))
            del log[:]
        snapper("a", a, loss_a)(step, what)
    on[0] = True
    la, _ = TC.train(opt_a, rank, steps, MICRO, snap_a, loss_a)
    on[0] = False
    name = plan_name(case)
    pj = load_plan_json(find_plan_json(name, REPO))
    lib = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, plan_json=pj)
    fsdp = CommplanFSDP(name, b, bridge_units(b, case in INNER), root=REPO, library=lib)
    opt_b = torch.optim.AdamW(b.parameters(), **opt_kw)
    import commplan.recompute as RC
    orig, recomputes = RC.recompute_pre_forward, [0]

    def counted(f, u):  # the recompute forwards the bridge's hooks saw (INNER cases)
        recomputes[0] += 1
        return orig(f, u)
    RC.recompute_pre_forward = counted
    bad = []
    try:
        lb, _ = TC.train(opt_b, rank, steps, MICRO, snapper("b", b, loss_b), loss_b)
        bad += state_dicts_agree(fsdp, a, opt_a, opt_b)
    finally:
        RC.recompute_pre_forward = orig
        fsdp.close()
    if not torch.equal(la, lb):
        i = int((la != lb).nonzero()[0])
        bad.append("loss %d: torchtitan %r, commplan %r" % (i, la[i].item(), lb[i].item()))
    for key, x in snaps["a"].items():
        y = snaps["b"].get(key)
        if (x is None) != (y is None) or (x is not None and (x.shape != y.shape or not torch.equal(x, y))):
            bad.append("step %d %s of %s differ" % key)
    # torchtitan's collectives against the plan's, step by step
    table = CL.table_step(pj, rank)
    want = [s[:5] for s in table]
    chunks = CASES[case][2]
    coll, multiset = 0, [0]
    for step, got in enumerate(steps_log):
        got = [tuple(x[:4]) + (tuple(x[4]),) for x in got]
        w = CL.first_step(_llama_head(pj), table) if chunks > 1 and step == 0 else want
        if step == EVAL_AFTER + 1 and sorted(got) == sorted(w):
            # after a no_grad forward FSDP2's next step issues the same collectives in another order
            # (its group states left by the eval forward; torch 2.15: under ChunkedLossWrapper the
            # norm's reduce-scatter moves to the end of the first backward, under CrossEntropyLoss
            # the forward's all-gathers are prefetched otherwise); the bridge keeps the plan's order,
            # so fully_shard's collectives of this one step are compared with the plan's as a multiset
            multiset[0] += 1
            got = w
        n, at = CL.diff(got, w)
        coll += len(got)
        if n:
            bad.append("step %d collectives: %d differences from plan.json's, first at %s: torchtitan %r, plan %r"
                       % (step, n, at, got[at] if at is not None and at < len(got) else None,
                          w[at] if at is not None and at < len(w) else None))
    if case in INNER and recomputes[0] != steps * MICRO * (len(fsdp.units) - 3):
        bad.append("%d recompute forwards seen by the bridge's hooks, want one per block and backward" % recomputes[0])
    return dict(case=case, rank=rank, bad=bad, checked=len(snaps["a"]), collectives=coll, losses=la.tolist(),
                multiset=multiset[0],
                plan_ops=len(pj["ops"]), recomputes=recomputes[0])


def state_dicts_agree(fsdp, a, opt_a, opt_b):
    """The bridge's model and optimizer state dicts (commplan.checkpoint) against fully_shard's under
    AC: the same FQNs (the wrapper's segment dropped, as torch's own state-dict hooks drop it) and the
    same local shards. Returns the differences."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    from commplan.checkpoint import optim_state_dict
    bad = []
    sa, sb = a.state_dict(), fsdp.state_dict()
    pa = {k for k in sa if not k.endswith("cache")}  # rope's buffer is not persistent in both
    pb = {k for k in sb if not k.endswith("cache")}
    if pa != pb:
        bad.append("state_dict keys: fully_shard's only %s, the bridge's only %s" % (sorted(pa - pb)[:3],
                                                                                   sorted(pb - pa)[:3]))
    for k in sorted(pa & pb):
        if not torch.equal(TC.local(sa[k]), TC.local(sb[k])):
            bad.append("state_dict %s differs" % k)
    oa, ob = get_optimizer_state_dict(a, opt_a), optim_state_dict(fsdp, opt_b)
    if set(oa["state"]) != set(ob["state"]):
        bad.append("optimizer state keys differ: %s vs %s" % (sorted(oa["state"])[:3], sorted(ob["state"])[:3]))
    for k in sorted(set(oa["state"]) & set(ob["state"])):
        for n, x in oa["state"][k].items():
            y = ob["state"][k].get(n)
            if y is None or not torch.equal(TC.local(x), TC.local(y)):
                bad.append("optimizer state %s.%s differs" % (k, n))
    return bad


def bridge_units(model, inner=False):
    """torchtitan's fully_shard units of the model (titan_fsdp_units); inner: each checkpoint-wrapped
    block's unit its inner block, so the bridge's hooks run in the recompute too."""
    from commplan.modules import Unit
    from commplan.titan import titan_fsdp_units
    units = titan_fsdp_units(model)
    if inner:
        units = [Unit([getattr(m, "_checkpoint_wrapped_module", m) for m in u.modules], name=u.name,
                      reshard_after_forward=u.reshard_after_forward) for u in units]
    return units


def _llama_head(pj):
    """plan.json with the head's parameter names as test_chunked_loss.head_unit reads them."""
    q = json.loads(json.dumps(pj))
    for u in q["units"]:
        for p in u["params"]:
            if p["name"] == "lm_head.weight":
                p["name"] = "output.weight"
    return q


def mutant_cases(cases):
    """(a CrossEntropyLoss case, a ChunkedLossWrapper case): the run's own where it has them."""
    c1 = next((c for c in cases if CASES[c][2] == 1), "fsdp_full")
    ch = next((c for c in cases if CASES[c][2] > 1), "fsdp_chunk4")
    return c1, ch


def mutants(rank, cases):
    """The order check refuses a loss the plan does not hold: ChunkedLossWrapper on a loss_chunks = 1
    plan, and whole logits on a chunked plan. Returns the refusals' first lines."""
    import torch
    from commplan.match import find_plan_json, load_plan_json
    from commplan.runtime import CommplanFSDP, HostLibrary, PlanOrderError
    from commplan.titan import titan_fsdp_units
    out = []
    c1, ch = mutant_cases(cases)
    for case, plan_case in ((ch, c1), (c1, ch)):
        _, (b, loss_b) = titan_sides(case, reference=False)
        name = plan_name(plan_case)
        pj = load_plan_json(find_plan_json(name, REPO))
        lib = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, plan_json=pj)
        fsdp = CommplanFSDP(name, b, titan_fsdp_units(b), root=REPO, library=lib)
        try:
            tok, lab = TC.batches(rank, 0, 0)
            loss_b(tok, lab).backward()
            out.append(None)
        except PlanOrderError as e:
            out.append(str(e).splitlines()[0])
        finally:
            fsdp.close()
        del b
    torch.distributed.barrier()
    return out


def worker(args):
    import test_chunked_loss as CL
    rank = H.init_rank()
    log, on = [], [False]
    CL.install_recorder(log, on)
    report = [run_case(c, rank, args.steps, log, on) for c in args.cases.split(",")]
    refusals = mutants(rank, args.cases.split(",")) if args.mutants else []
    out = H.gather((report, refusals), WORLD)
    if rank != 0:
        return 0
    failed = 0
    for ci, case in enumerate(args.cases.split(",")):
        rows = [out[r][0][ci] for r in range(WORLD)]
        n_bad = sum(len(r["bad"]) for r in rows)
        failed += n_bad != 0
        mesh, ac, chunks = CASES[case]
        print("bridge_ac: %s %s (%s, AC %s%s, %s): %d steps x %d micro-batches, %d ranks, plan %d ops: %s (%d tensors "
              "x ranks, %d collectives x ranks compared)" % (
                  "ok  " if n_bad == 0 else "FAIL", case, mesh, ac,
                  ", hooks on the inner blocks: %d recompute forwards x ranks without a call"
                  % sum(r["recomputes"] for r in rows) if case in INNER else "",
                  "ChunkedLossWrapper num_chunks %d" % chunks if chunks > 1 else "CrossEntropyLoss",
                  args.steps, MICRO, WORLD, rows[0]["plan_ops"],
                  "every loss, every sharded parameter and gradient, an eval forward's (no_grad, after step %d) "
                  "output and loss, and every FSDP collective identical to torchtitan's parallelize + fully_shard"
                  % EVAL_AFTER if n_bad == 0 else "%d differences" % n_bad,
                  sum(r["checked"] for r in rows), sum(r["collectives"] for r in rows)))
        if any(r["multiset"] for r in rows):
            print("  (step %d, after the eval forward: fully_shard's collectives equal the plan's as a multiset, "
                  "FSDP2 orders them otherwise after a no_grad forward)" % (EVAL_AFTER + 1))
        for r in rows:
            for x in r["bad"][:5]:
                print("  rank %d: %s" % (r["rank"], x))
    if args.mutants:
        for r in range(WORLD):
            for what, line in zip(("ChunkedLossWrapper on a loss_chunks = 1 plan",
                                   "whole logits on a loss_chunks >= 2 plan"), out[r][1]):
                if line is None:
                    failed += 1
                    print("FAIL rank %d: %s was not refused" % (r, what))
                elif r == 0:
                    print("bridge_ac: refused as it must: %s: %s" % (what, line))
    return 0 if failed == 0 else 1


def main():
    ap = H.parser(__doc__)
    ap.add_argument("--steps", type=int, default=2 if QUICK else 3)
    ap.add_argument("--cases", default=",".join(QUICK_CASES if QUICK else CASES))
    ap.add_argument("--no-mutants", dest="mutants", action="store_false")
    args = H.parse(ap, worker)
    torchrun = H.torchrun_for(TAG, args.torchrun, ("torch", "torch.distributed.fsdp", "torchtitan"),
                              "torch with FSDP2 and torchtitan")
    cases = args.cases.split(",")
    for c in cases:
        if c not in CASES:
            sys.exit("bridge_ac: unknown case %r; known: %s" % (c, ", ".join(CASES)))
    import titan_env as E
    E.cpu_titan()
    n_ops, bad = check_ac_plans(cases[0])
    if bad:
        print("FAIL bridge_ac: plan.json's FSDP ops differ with activation_checkpointing %s from none" % bad)
        sys.exit(1)
    print("bridge_ac: plan.json's %d ops equal with activation_checkpointing none, full and selective (%s's mesh)"
          % (n_ops, CASES[cases[0]][0]))
    need = set(cases) | (set(mutant_cases(cases)) if args.mutants else set())
    for c in sorted({plan_name(c): c for c in need}.values()):
        build_plan(c)
    rc = H.launch(torchrun, __file__, WORLD, ["--worker", "--steps", args.steps, "--cases", args.cases]
                  + ([] if args.mutants else ["--no-mutants"]), 1500, paths=[os.path.join(REPO, "tests", "titan")])
    if QUICK and rc == 0:
        print("quick tier: cases %s, %d steps; make test-full runs all %d cases (FSDP and HSDP x full, per-op "
              "selective and every-2nd-block AC, ChunkedLossWrapper at 4 and 8 chunks, hooks inside the wrappers: "
              "fsdp_sel_inner), 3 steps" % (",".join(cases), args.steps, len(CASES)))
    sys.exit(rc)


if __name__ == "__main__":
    main()
