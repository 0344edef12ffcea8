"""FSDP x TP through the bridge (issue 36, item 2), on gloo under torchrun: torchtitan 0.3's llama3
(tiny, fused wqkv: tests/python/train_cpu.py's titan_model) at dp_shard 2 x tp 2 (4 ranks; HSDP 2 x 2 x tp 2 on 8
ranks under COMMPLAN_TEST_TIER=full), with sequence parallelism and loss_parallel, under its
spmd_types backend and SPMD context, torchtitan's cross_entropy_loss and clip_grad_norm_ (max_norm
small enough that every step clips), AdamW, N steps x 2 micro-batches, two sides from the same
initial values:

    torchtitan   parallelize_llama: its TP, then its apply_fsdp_to_decoder (fully_shard)
    commplan     its TP alone (commplan.tensor_parallel.titan_tp_model), then CommplanFSDP over the
                 plan's host library, the plan written by commplan.titan.plan_from_titan with tp = 2
                 and built with make PLAN=...

Every rank compares, bit for bit: every micro-batch's loss, every step's total gradient norm, and
after every step every sharded gradient (after clipping) and parameter (the local tensor of
fully_shard's DTensor against the bridge's shard); after steps 0 and 1 an eval forward (no_grad,
then inference_mode, as torchtitan's validator runs it) whose logits (vocab-sharded) and loss are
compared, every gathered temporary checked to carry the training path's SPMD type and PartitionSpec
(eval_type_check), the next steps' training compared as before. Then checkpoints (commplan.checkpoint, DCP;
torchtitan's side as its checkpointer takes them: the module's state_dict with its hooks, the
fused wqkv saved as wq / wk / wv):
the bridge's state_dict() and optim_state_dict() in fully_shard + TP's form (keys, placements,
global shapes, local tensors); fully_shard + TP's save loaded into the bridge and the bridge's save
loaded into fully_shard + TP, each side training on bit-identically to the other. A mutant (the
bridge without the TP all-reduce of the norms' partial gradients) must differ.

    tests/python/test_bridge_tp.py [TORCHRUN] [--configs fsdp_tp,hsdp_tp] [--steps N]

COMMPLAN_TEST_TIER=quick (make test) runs fsdp_tp alone (FSDP 2 x TP 2, its DCP round trips) for 3
steps and says so in a "quick tier:" line; full, or run by hand, fsdp_tp_uneven (vocab 251) and
hsdp_tp (8 ranks) too, 20 steps. Needs torch 2.x with FSDP2, torchtitan and torchrun (make torch-env); anywhere else one SKIP line and
exit 77.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import bridge_harness as H  # noqa: E402

TAG = "bridge_tp"
QUICK = H.QUICK
# name: (world, mesh, vocab, checkpoints). fsdp_tp_uneven's vocab 251 splits 126 / 125 over tp
# (plan.json tp_classes: TP rank 1 holds other shapes) and then over dp_shard (63 / 63 and 63 / 62
# rows); its state dicts and checkpoints are not compared: under uneven TP, fully_shard + TP's
# DTensors give the global shape as the TP-local one times tp (252 rows on TP rank 0, 250 on rank
# 1, where the bridge's say 251), and torch's own DCP save of them refuses the chunks ("overlapping
# chunks", torch/distributed/checkpoint/default_planner.py:160; torch 2.15).
CONFIGS = {"fsdp_tp": (4, {"dp_shard": 2, "tp": 2}, 250, True),
           "fsdp_tp_uneven": (4, {"dp_shard": 2, "tp": 2}, 251, False),
           "hsdp_tp": (8, {"dp_replicate": 2, "dp_shard": 2, "tp": 2}, 250, True)}
QUICK_CONFIGS, FULL_CONFIGS = "fsdp_tp", "fsdp_tp,fsdp_tp_uneven,hsdp_tp"
STEPS = 3 if QUICK else 20
MICRO = 2
SEQ, BATCH = 16, 2
MAX_NORM = 0.5
EVALS = (0, 1)  # eval forwards after these steps' updates: no_grad after step 0, inference_mode after 1
BUILD = os.path.join("build", "bridge_tp")


def titan_model(vocab):
    """train_cpu.py's tiny llama3 config (fused wqkv, as torchtitan's registry builds it) at vocab."""
    import train_cpu as T
    T.sys_path_titan()
    import titan_env as E
    import test_llama_plan as TL
    E.cpu_training()
    return TL.titan_config(None, dict(T.TITAN, vocab_size=vocab), True)


def plan_name(cfg):
    return "bridge_tp_" + cfg


def build_plan(cfg):
    """The plan written by plan_from_titan from torchtitan's model at the config (tp = 2), built."""
    from commplan.titan import plan_from_titan
    world, par, vocab, _ = CONFIGS[cfg]
    name = plan_name(cfg)
    os.makedirs(os.path.join(REPO, BUILD), exist_ok=True)
    out = os.path.join(REPO, BUILD, name + ".lua")
    plan_from_titan(titan_model(vocab), name, world, parallel=dict(par),
                    fsdp={"micro_steps": MICRO, "reduce_op": "sum"},
                    seq_len=SEQ, out=out)
    H.build_all("test_bridge_tp", BUILD, [name])


# ---- the ranks ----------------------------------------------------------------------------

def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class Side:
    """One side's model, its loss step and AdamW (torchtitan's SPMD context around forward and loss,
    backward outside the type check, as Trainer._forward_backward_body: trainer.py:806)."""

    def __init__(self, model, pd, vocab, fsdp=None):
        import torch
        from torchtitan.distributed.utils import get_spmd_context
        self.model, self.pd, self.fsdp, self.vocab = model, pd, fsdp, vocab
        self.ctx = get_spmd_context(parallel_dims=pd)
        self.opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)

    def loss(self, tok, lab, keep=None):
        import torch
        import spmd_types as spmd
        from torchtitan.components.loss import cross_entropy_loss
        from torchtitan.distributed.spmd_types import annotate_input_spmd_types
        positions = torch.arange(SEQ).repeat(BATCH, 1)
        extra = {"positions": positions, "attention_masks": self.model.get_attention_masks(positions=positions)}
        with self.ctx():
            tok, lab, extra = annotate_input_spmd_types(self.pd, tok, lab, extra)
            pred = self.model(tok, **extra)
            loss = cross_entropy_loss(pred, lab, global_vocab_size=self.vocab) / (BATCH * SEQ * MICRO)
            if keep is not None:  # an eval forward: no backward
                keep.append(local(pred).detach().clone())
                return loss.detach()
            with spmd.no_typecheck():
                loss.backward()
        return loss.detach()

    def evaluate(self, s, dp_rank, snaps):
        """An eval forward between training steps, as torchtitan's validator runs it
        (components/validate.py:215: under no_grad; inference_mode after odd steps): this TP rank's
        logits (vocab-sharded under loss_parallel) and the loss."""
        import torch
        g = torch.Generator().manual_seed(50_000 + 1000 * dp_rank + s)
        t = torch.randint(0, self.vocab, (BATCH, SEQ + 1), generator=g)
        keep = []
        with (torch.inference_mode() if s % 2 else torch.no_grad()):
            loss = self.loss(t[:, :-1], t[:, 1:], keep)
        snaps[(s, "eval", "loss")] = loss.clone()
        snaps[(s, "eval", "logits")] = keep[0]

    def train(self, steps, dp_rank, snaps=None, evals=()):
        """steps x MICRO micro-batches, torchtitan's clip_grad_norm_, AdamW. Returns (losses, norms);
        snaps[(step, what, name)]: every local gradient (after clipping) and parameter; after each
        step in evals, an eval forward (evaluate)."""
        import torch
        from torchtitan.distributed.utils import clip_grad_norm_
        losses, norms = [], []
        for s in steps:
            for m in range(MICRO):
                g = torch.Generator().manual_seed(10_000 + 1000 * dp_rank + 10 * s + m)
                t = torch.randint(0, self.vocab, (BATCH, SEQ + 1), generator=g)
                losses.append(self.loss(t[:, :-1], t[:, 1:]))
            norms.append(clip_grad_norm_(list(self.model.parameters()), MAX_NORM, foreach=True).detach().clone())
            if snaps is not None:
                for n, p in self.model.named_parameters():
                    snaps[(s, "grad", n)] = None if p.grad is None else local(p.grad).detach().clone()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if snaps is not None:
                for n, p in self.model.named_parameters():
                    snaps[(s, "param", n)] = local(p).detach().clone()
            if s in evals:
                self.evaluate(s, dp_rank, snaps)
        return torch.stack(losses), torch.stack(norms)


def compare(a, b):
    """Differences between two runs' (losses, norms, snaps): one line each."""
    import torch
    (la, na, sa), (lb, nb, sb) = a, b
    bad = []
    if not torch.equal(la, lb):
        i = int((la != lb).nonzero()[0])
        bad.append("loss %d (step %d, micro-batch %d): torchtitan %r, commplan %r"
                   % (i, i // MICRO, i % MICRO, la[i].item(), lb[i].item()))
    if not torch.equal(na, nb):
        i = int((na != nb).nonzero()[0])
        bad.append("total norm of step %d: torchtitan %r, commplan %r" % (i, na[i].item(), nb[i].item()))
    for key, x in sa.items():
        y = sb.get(key)
        if (x is None) != (y is None) or (x is not None and (x.shape != y.shape or not torch.equal(x, y))):
            bad.append("step %d %s of %s differs" % key)
    return bad, len(la) + len(na) + len(sa)


def eval_type_check(fsdp):
    """Forward pre-hooks, after the bridge's, that check under no_grad every gathered temporary of
    the unit (commplan.training.EvalForward) against the training path's unsharded parameter: the
    same SPMD type and PartitionSpec (spmd_types), the same TP-local shape. Returns (checked,
    differences), filled as the eval forwards run."""
    import torch
    from spmd_types.runtime import get_local_type, get_partition_spec, has_local_type
    out = [0, []]

    def typed(t):
        return (dict(get_local_type(t)) if has_local_type(t) else None, get_partition_spec(t), tuple(t.shape))

    def hook_for(unit):
        def hook(module, args):
            if torch.is_grad_enabled():
                return
            for P in unit["params"]:
                for mod, attr in P.owners:
                    t = mod._parameters[attr]
                    out[0] += 1
                    if t is P.sharded or typed(t) != typed(P.unsharded):
                        out[1].append("eval temporary of %s: %s, the unsharded parameter's %s"
                                      % (P.fqn, "the sharded parameter" if t is P.sharded else typed(t),
                                         typed(P.unsharded)))
        return hook
    for unit in fsdp.units:
        for m in unit["modules"]:
            fsdp._handles.append(m.register_forward_pre_hook(hook_for(unit)))
    return out


def worker(args, tmp):
    import torch
    import torch.distributed as dist
    rank = H.init_rank()
    world = int(os.environ["WORLD_SIZE"])
    sys.path.insert(0, os.path.join(REPO, "tests", "titan"))
    import titan_env as E
    E.cpu_training()
    import test_llama_plan as TL
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from commplan import checkpoint as ck
    from commplan import tensor_parallel
    from commplan.match import PlanMismatch, find_plan_json, load_plan_json
    from commplan.modules import units_from_module
    from commplan.planfile import PlanError
    from commplan.runtime import CommplanFSDP, HostLibrary
    from commplan.titan import titan_fsdp_units

    mine = [c for c in args.configs.split(",") if CONFIGS[c][0] == world]
    if rank == 0:  # the plans, written and built here (torchtitan is imported once, by the ranks)
        for cfg in mine:
            build_plan(cfg)
    dist.barrier()
    results = []
    for cfg in mine:
        cw, par, vocab, ckpt = CONFIGS[cfg]
        parallelism = ParallelismConfig(data_parallel_replicate_degree=par.get("dp_replicate", 1),
                                        data_parallel_shard_degree=par["dp_shard"], tensor_parallel_degree=par["tp"])
        training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                                  mixed_precision_param="float32", mixed_precision_reduce="float32")
        pd = H.parallel_dims(parallelism, world)  # one per layout and process (fully_shard: one mesh object)
        dp_rank = rank // par["tp"]  # the batch a TP column shares: the (dp_replicate, dp_shard) coordinate
        torch.manual_seed(1234)
        full = {n: p.detach().clone() for n, p in titan_model(vocab).build().named_parameters()}
        first, then = range(args.steps), range(args.steps, args.steps + 2)

        def titan_side(values=full):
            """torchtitan's parallelize_llama (TP + fully_shard), values set from the full tensors."""
            a = TL.parallelize(titan_model(vocab), parallelism, training, pd, "cpu")
            with torch.no_grad():
                for n, p in a.named_parameters():
                    p.to_local().copy_(tensor_parallel.local_piece(values[n], p.device_mesh, p.placements))
            for m in a.modules():
                if isinstance(m, FSDPModule):  # PREMUL_SUM(1 / 1) is a SUM; gloo has only the latter
                    m.set_force_sum_reduction_for_comms(True)
            return Side(a, pd, vocab)

        def bridge_side(values=full, mutant=False):
            """torchtitan's TP alone, TP-local values from the full tensors, then CommplanFSDP."""
            b = tensor_parallel.titan_tp_model(titan_model(vocab), parallelism, training, pd)
            tensor_parallel.copy_full_(b, values, pd.get_mesh("tp"))
            name = plan_name(cfg)
            pj = load_plan_json(find_plan_json(name, REPO))
            lib = HostLibrary(os.path.join(REPO, "build", name, "lib%s.so" % name), name, plan_json=pj)
            f = CommplanFSDP(name, b, titan_fsdp_units(b), root=REPO, library=lib)
            if mutant:
                f._tp.partial_grad = set()
            side = Side(b, pd, vocab, f)
            side.eval_types = eval_type_check(f)
            return side

        rows = {}

        def titan_state(side):
            """(model, optimizer) state as torchtitan's checkpointer takes them: the module's own
            state_dict, its hooks applied (ModelWrapper, components/checkpointer/base.py:118: the
            fused wqkv saved as wq / wk / wv), and the optimizer's by FQN."""
            return side.model.state_dict(), get_optimizer_state_dict(side.model, side.opt)

        def case(what, fn):
            try:
                rows[what] = fn()
            except Exception as e:  # noqa: BLE001 -- reported per case
                import traceback
                traceback.print_exc()
                rows[what] = (["%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")], 0)

        # torchtitan + fully_shard: the reference, saved after `first`
        A = titan_side()
        sa = {}
        la, na = A.train(first, dp_rank, sa, EVALS)
        ck_a = os.path.join(tmp, cfg + "_titan")
        msd, osd = titan_state(A)
        if ckpt:
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=ck_a)
        form_a = {k: (tuple(v.placements), v.shape, v.stride(), v.to_local().clone()) for k, v in msd.items()}
        st_a = {}
        ref_la, ref_na = A.train(then, dp_rank, st_a)

        def train_match():
            B = bridge_side()
            try:
                sb = {}
                lb, nb = B.train(first, dp_rank, sb, EVALS)
                bad, n = compare((la, na, sa), (lb, nb, sb))
                seen, wrong = B.eval_types
                bad += wrong[:3]
                if not seen:
                    bad.append("the eval forwards gathered no parameter")
                n += seen
                # the state dict's form: fully_shard + TP's (keys, placements, global shape, local tensors)
                mine = B.fsdp.state_dict()
                for k, (pl, shape, stride, loc) in (form_a if ckpt else {}).items():
                    w = mine.get(k)
                    got = (tuple(w.placements), w.shape, w.stride()) if isinstance(w, DTensor) else type(w).__name__
                    if got != (pl, shape, stride) or not torch.equal(w.to_local(), loc):
                        bad.append("state_dict[%s]: commplan %s, fully_shard + TP %s%s" % (
                            k, got, (pl, shape, stride),
                            "" if got != (pl, shape, stride) else ", local tensors differ"))
                        break
                n += len(form_a) if ckpt else 0
                # the bridge's save, for fully_shard + TP to load
                ck_b = os.path.join(tmp, cfg + "_bridge")
                if ckpt:
                    dcp.save({"model": mine, "optim": ck.optim_state_dict(B.fsdp, B.opt)}, checkpoint_id=ck_b)
                st_b = {}
                lb2, nb2 = B.train(then, dp_rank, st_b)
                rows["_bridge_then"] = (lb2, nb2, st_b)
                return bad, n
            finally:
                B.fsdp.close()

        def titan_to_bridge():
            perturbed = {k: v + 1 for k, v in full.items()}
            B = bridge_side(perturbed)
            try:
                sd = {"model": B.fsdp.state_dict(), "optim": ck.optim_state_dict(B.fsdp, B.opt)}
                dcp.load(sd, checkpoint_id=ck_a)
                B.fsdp.load_state_dict(sd["model"])
                ck.load_optim_state_dict(B.fsdp, B.opt, sd["optim"])
                st = {}
                lb, nb = B.train(then, dp_rank, st)
                return compare((ref_la, ref_na, st_a), (lb, nb, st))
            finally:
                B.fsdp.close()

        def bridge_to_titan():
            ref = rows.get("_bridge_then")
            if ref is None:
                return ["no bridge checkpoint (train_match failed)"], 0
            C = titan_side({k: v + 1 for k, v in full.items()})
            msd, osd = titan_state(C)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=os.path.join(tmp, cfg + "_bridge"))
            C.model.load_state_dict(sd["model"])
            set_optimizer_state_dict(C.model, C.opt, sd["optim"])
            st = {}
            lc, nc = C.train(then, dp_rank, st)
            return compare(ref, (lc, nc, st))

        def mutant():
            B = bridge_side(mutant=True)
            try:
                sb = {}
                lb, nb = B.train(range(1), dp_rank, sb)
                bad, n = compare((la[:MICRO], na[:1], {k: v for k, v in sa.items() if k[0] == 0}), (lb, nb, sb))
                return (["the mutant matched torchtitan: the comparison cannot fail"] if not bad else []), n
            finally:
                B.fsdp.close()

        def refusals():
            """One line each: the model without its TP (a plain torchtitan model), a plan with cp
            beside tp, a mesh of another shape for the DTensors."""
            bad, n = [], 0
            name = plan_name(cfg)
            pj = load_plan_json(find_plan_json(name, REPO))
            plain = titan_model(vocab).build()
            with_cp = dict(pj, parallel=dict(pj["parallel"], cp=2))
            for what, fn, words in (
                    ("no TP on the model", lambda: tensor_parallel.check_model(
                        pj, units_from_module(plain, titan_fsdp_units(plain))), "carries no TP layout"),
                    ("cp", lambda: tensor_parallel.check_plan(with_cp), "parallel.cp"),
                    ("another mesh", lambda: tensor_parallel.storage_mesh(
                        pj, "cpu", pd.get_mesh("tp")), "storage mesh")):
                n += 1
                try:
                    fn()
                    bad.append("%s: not refused" % what)
                except (PlanError, PlanMismatch) as e:
                    if words not in str(e) or "\n" in str(e):
                        bad.append("%s: refused as %r" % (what, str(e)))
            return bad, n

        case("refusals", refusals)
        case("train", train_match)
        if ckpt:
            case("titan_to_bridge", titan_to_bridge)
            case("bridge_to_titan", bridge_to_titan)
        case("mutant", mutant)
        rows.pop("_bridge_then", None)
        results.append({"cfg": cfg, "rank": rank, "rows": rows, "first_norm": float(na[0]), "first_loss": float(la[0])})
        del A
    out = H.gather(results, world)
    if rank != 0:
        return 0
    failed = 0
    for ci, res in enumerate(out[0]):
        cfg = res["cfg"]
        for what in res["rows"]:
            bad = [(r, x) for r in range(world) for x in out[r][ci]["rows"][what][0]]
            n = sum(out[r][ci]["rows"][what][1] for r in range(world))
            failed += bool(bad)
            good = {"mutant": "differs from torchtitan, as it must",
                    "refusals": "each refused in one line"}.get(what, "bit-identical")
            print("%s bridge_tp %s %s: %s (%d values x ranks compared)" % (
                "ok  " if not bad else "FAIL", cfg, what, good if not bad else "%d differences" % len(bad), n))
            for r, x in bad[:5]:
                print("  rank %d: %s" % (r, x))
        print("  %s rank 0: first loss %r, first total norm %r (max_norm %g: every step clips)" % (
            cfg, res["first_loss"], res["first_norm"], MAX_NORM))
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torchrun", nargs="?", help="torch's torchrun (default: beside this python)")
    ap.add_argument("--configs", default=QUICK_CONFIGS if QUICK else FULL_CONFIGS)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.exit(worker(args, args.worker))
    torchrun = H.torchrun_for(TAG, args.torchrun, ("torch", "torch.distributed.fsdp", "torchtitan", "spmd_types"),
                              "torch with FSDP2, torchtitan and spmd_types")
    cfgs = args.configs.split(",")
    for cfg in cfgs:
        if cfg not in CONFIGS:
            sys.exit("test_bridge_tp: unknown config %r; known: %s" % (cfg, ", ".join(CONFIGS)))
    rc = 0
    for world in sorted({CONFIGS[c][0] for c in cfgs}):
        mine = ",".join(c for c in cfgs if CONFIGS[c][0] == world)
        with tempfile.TemporaryDirectory(prefix="bridge-tp-") as tmp:
            rc = H.launch(torchrun, __file__, world, ["--worker", tmp, "--configs", mine, "--steps", args.steps],
                          1200) or rc
    if QUICK:
        print("quick tier: bridge_tp runs fsdp_tp alone (FSDP 2 x TP 2, 4 ranks, vocab 250, its DCP round trips) for %d "
              "steps x %d micro-batches; COMMPLAN_TEST_TIER=full adds fsdp_tp_uneven (vocab 251: uneven TP), HSDP 2 x 2 "
              "x TP 2 (8 ranks) and %d steps" % (STEPS, MICRO, 20))
    print("bridge_tp: torchtitan's llama3 under its TP + CommplanFSDP vs its TP + fully_shard (%s), training, "
          "clipping and DCP round trips both ways %s" % (", ".join(cfgs), "passed" if rc == 0 else "FAILED"))
    sys.exit(0 if rc == 0 else 1)


if __name__ == "__main__":
    main()
