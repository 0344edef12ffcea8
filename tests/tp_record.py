#!/usr/bin/env python3
"""torchtitan's tensor parallelism recorded live (issue 17, item 3; issue 35: dense Qwen3):
its own llama3 and qwen3 (tiny ones; qwen3 tied and untied), parallelized by its own parallelize_llama /
parallelize_qwen3 (TP plan, sequence parallelism on or off, fully_shard over dp_shard, no activation
checkpointing) on gloo, one process per rank, one training step with
torchtitan's own cross_entropy_loss (loss_parallel: three TP all-reduces,
a MAX and two SUMs); every collective over the TP group, in order, with its
kind, phase, element count and reduce op, against the TP collectives of the
commplan plan generated for the same model and mesh; and every FSDP parameter
as the rank holds it (name, DTensor placements over dp_shard and tp, TP-local
shape) against plan.json's TP class of the rank's TP coordinate.

    tests/tp_record.py            # 2 ranks (tp 2) and 4 ranks (dp_shard 2 x tp 2), SP on and off
                                  # (COMMPLAN_TEST_TIER=quick, make test: tp2_sp, dp2_tp2_nosp and
                                  # qwen3_tied_tp2_sp, about 14 s more than llama's two alone)
    tests/tp_record.py --configs tp2_sp

What it records: every functional collective (torch.distributed.
_functional_collectives: what DTensor's redistribution, the TP styles,
FSDP2's TP norm-gradient redistribution and the loss call), and every
_c10d_functional op issued outside them (autograd's backward of a
collective), with the group's ranks. FSDP2's own dp collectives run over other groups: not counted here
(tests/live/ checks them); torchtitan's gradient divide factor makes them
PREMUL_SUM, which gloo lacks, so they are forced to SUM with the divides
around them (set_force_sum_reduction_for_comms; TP's are untouched).

Needs torch 2.x and torchtitan (make torch-env); anywhere else one
"SKIP tp_record: ..." line and exit 0.
"""
import argparse
import json
import os
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "titan"))
sys.path.insert(0, os.path.join(ROOT, "python"))

# A tiny Llama: dims divisible by tp; vocab not, so loss_parallel's uneven shards are covered.
MODEL = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 250, "multiple_of": 16,
         "ffn_dim_multiplier": 1.3}
# A tiny dense Qwen3 (tests/titan/test_qwen3_plan.py's TINY: head_dim 16 given, fused wqkv, q/k norms).
QWEN3 = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "vocab_size": 250,
         "hidden_dim": 96}
SEQ, BATCH = 32, 2
CONFIGS = {  # name: (world, dp_shard, sequence_parallel, family, tied embeddings)
    "tp2_sp": (2, 1, True, "llama", False), "tp2_nosp": (2, 1, False, "llama", False),
    "dp2_tp2_sp": (4, 2, True, "llama", False), "dp2_tp2_nosp": (4, 2, False, "llama", False),
    "qwen3_tp2_sp": (2, 1, True, "qwen3", False), "qwen3_tp2_nosp": (2, 1, False, "qwen3", False),
    "qwen3_dp2_tp2_sp": (4, 2, True, "qwen3", False), "qwen3_tied_tp2_sp": (2, 1, True, "qwen3", True),
    "qwen3_tied_dp2_tp2_nosp": (4, 2, False, "qwen3", True),
}
# make test (COMMPLAN_TEST_TIER=quick): SP on at 2 ranks and off at 4 (each setting and each world once),
# one "quick tier:" line; make test-full and a run by hand: all four.
QUICK = os.environ.get("COMMPLAN_TEST_TIER", "full") == "quick"
QUICK_CONFIGS = ("tp2_sp", "dp2_tp2_nosp", "qwen3_tied_tp2_sp")
KINDS = ("all_gather", "reduce_scatter", "all_reduce")
COMMPLAN_KIND = {"all_gather": "tp_all_gather", "reduce_scatter": "tp_reduce_scatter", "all_reduce": "tp_all_reduce"}


def skip(why):
    print("SKIP tp_record: %s" % why)
    sys.exit(0)


# ------------------------------------------------------------------ recording

class Recorder:
    def __init__(self):
        self.log = []
        self.phase = "forward"
        self.tls = threading.local()

    def add(self, kind, group_ranks, numel_in, numel_out, dtype, op, via):
        self.log.append({"phase": self.phase, "kind": kind, "ranks": group_ranks, "in_numel": numel_in,
                         "out_numel": numel_out, "dtype": str(dtype), "reduce_op": op, "via": via})


def _kind_of(name):
    for k in KINDS:
        if name.startswith(k) or ("_" + k) in name:
            return k
    return None


def _ranks_of_group(group):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d
    try:
        if isinstance(group, dist.ProcessGroup):
            return [int(r) for r in dist.get_process_group_ranks(group)]
        name = group if isinstance(group, str) else funcol._resolve_group_name(group)
        return [int(r) for r in dist.get_process_group_ranks(c10d._resolve_process_group(name))]
    except Exception:  # noqa: BLE001 - unknown group form: counted, never matched to TP
        return []


def install(rec):
    """Wraps the functional collectives' Python entry points, and returns a
    TorchDispatchMode for the _c10d_functional ops issued outside them."""
    import inspect
    import torch
    import torch.distributed._functional_collectives as funcol
    from torch.utils._python_dispatch import TorchDispatchMode

    def guarded(fn, record):
        """fn, with record(bound arguments, result) after each outermost call: a collective
        that calls another (spmd_types' into torch.distributed, funcol into its ops) counts once."""
        sig = inspect.signature(fn)

        def wrapped(*args, **kwargs):
            if getattr(rec.tls, "inside", False):
                return fn(*args, **kwargs)
            rec.tls.inside = True
            try:
                out = fn(*args, **kwargs)
            finally:
                rec.tls.inside = False
            record(sig.bind_partial(*args, **kwargs).arguments, out)
            return out
        wrapped._commplan_wrapped = fn
        return wrapped

    def funcol_record(name):
        def record(b, out):
            x = b.get("self", b.get("input"))
            op = b.get("reduceOp", b.get("reduce_op"))
            rec.add(_kind_of(name), _ranks_of_group(b.get("group")), x.numel(), out.numel(), x.dtype,
                    str(op).lower().split(".")[-1] if op is not None else None, "funcol." + name)
        return record

    for name in dir(funcol):
        fn = getattr(funcol, name)
        if (callable(fn) and not name.startswith("_") and _kind_of(name) and "coalesced" not in name
                and not name.endswith(("_backward", "_setup_context")) and not hasattr(fn, "_commplan_wrapped")):
            setattr(funcol, name, guarded(fn, funcol_record(name)))

    # torch.distributed's eager collectives (spmd_types' redistributions of
    # activations call them; FSDP2's own too, over the dp groups)
    import torch.distributed as dist

    def dist_record(name):
        kind = _kind_of(name)

        def record(b, out):
            if kind == "all_reduce":
                x = b["tensor"]
                n_in = n_out = x.numel()
            elif kind == "all_gather":
                x = b.get("input_tensor", b.get("tensor"))
                y = b.get("output_tensor")
                n_in, n_out = x.numel(), y.numel() if y is not None else sum(t.numel() for t in b["tensor_list"])
            else:
                x = b.get("input")
                n_in = x.numel() if x is not None else sum(t.numel() for t in b["input_list"])
                x = x if x is not None else b["input_list"][0]
                n_out = b["output"].numel()
            op = b.get("op", dist.ReduceOp.SUM) if kind != "all_gather" else None
            rec.add(kind, _ranks_of_group(b.get("group") or dist.group.WORLD), n_in, n_out, x.dtype,
                    str(op).split(".")[-1].split(":")[0].lower() if op is not None else None, "dist." + name)
        return record

    for name in ("all_gather_into_tensor", "all_gather", "all_gather_single", "reduce_scatter_tensor",
                 "reduce_scatter", "reduce_scatter_single", "all_reduce"):
        fn = getattr(dist, name, None)
        if fn is not None and not hasattr(fn, "_commplan_wrapped"):
            setattr(dist, name, guarded(fn, dist_record(name)))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ns = func.namespace
            name = func.overloadpacket.__name__
            if ns.startswith("_c10d_functional") and not getattr(rec.tls, "inside", False):
                kind = _kind_of(name)
                if kind and "coalesced" not in name:
                    group = args[-1]  # group_name is the last positional argument of each
                    op = args[1] if kind != "all_gather" else None
                    rec.add(kind, _ranks_of_group(group), args[0].numel(), out.numel(), args[0].dtype,
                            str(op).lower() if op is not None else None, "%s.%s" % (ns, name))
            return out
    del torch
    return Ops()


def build(family, tied, parallelism, training, pd):
    """torchtitan's model for the config, parallelized by its own parallelize_llama / parallelize_qwen3.
    Qwen3 in the trainer's order (meta device, parallelize, to_empty, init_weights: which re-ties a
    tied model's tok_embeddings and lm_head, models/common/decoder.py:215-221). Returns the model and
    every FSDP unit's parameters (placements, TP-local shapes) as parallelize left them, before the
    re-tie makes lm_head's FSDP parameter nameless."""
    import torch
    import test_llama_plan as TL
    if family == "llama":
        model = TL.parallelize(TL.titan_config(None, MODEL, False), parallelism, training, pd, "cpu")
        return model, TL.titan_units(model)
    import test_qwen3_plan as TQ
    model = TQ.parallelize(TQ.titan_config(None, QWEN3, tied), parallelism, training, pd)
    units = TL.titan_units(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model, units


def rank_main(rank, world, init_file, configs, out_dir):
    import torch
    import torch.distributed as dist
    import titan_env as E
    E.cpu_training()
    import test_llama_plan as TL
    import spmd_types as spmd
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.distributed.utils import get_spmd_context
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.parallel_dims import ParallelDims

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    rec = Recorder()
    mode = install(rec)
    for name in configs:
        _, dp, sp, family, tied = CONFIGS[name]
        parallelism = ParallelismConfig(data_parallel_shard_degree=dp, tensor_parallel_degree=2,
                                        enable_sequence_parallel=sp)
        training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, dtype="float32",
                                  mixed_precision_param="float32", mixed_precision_reduce="float32")
        pd = ParallelDims.from_config(parallelism, world)
        pd.build_mesh()
        torch.manual_seed(0)
        model, units = build(family, tied, parallelism, training, pd)
        # torchtitan sets FSDP2's gradient divide factor, which reduces with PREMUL_SUM: NCCL has it,
        # gloo does not. A SUM with the divides around it changes only the dp collectives.
        from torch.distributed.fsdp import FSDPModule
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
        tp_ranks = [int(r) for r in dist.get_process_group_ranks(pd.get_mesh("tp").get_group())]
        vocab = (MODEL if family == "llama" else QWEN3)["vocab_size"]
        tokens = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(dp))
        rec.log = []
        # The trainer's step (Trainer._forward_backward_body): its SPMD context, inputs annotated
        # as post_dataloading_process does, the model, torchtitan's loss, backward.
        positions = torch.arange(SEQ).repeat(BATCH, 1)  # one document per sequence
        extra = {"positions": positions, "attention_masks": model.get_attention_masks(positions=positions)}
        inputs, labels = tokens, tokens.clone()
        if pd.spmd_backend == "spmd_types":
            inputs, labels, extra = annotate_input_spmd_types(pd, inputs, labels, extra)
        with get_spmd_context(parallel_dims=pd)(), mode:
            rec.phase = "forward"
            pred = model(inputs, **extra)
            rec.phase = "loss"
            loss = cross_entropy_loss(pred, labels, global_vocab_size=vocab)
            rec.phase = "backward"
            with spmd.no_typecheck():
                loss.backward()
        tp_log = [e for e in rec.log if e["ranks"] == tp_ranks]
        other = [e for e in rec.log if e["ranks"] != tp_ranks]
        with open(os.path.join(out_dir, "%s.rank%d.json" % (name, rank)), "w") as f:
            json.dump({"config": name, "rank": rank, "tp_ranks": tp_ranks, "tp": tp_log, "other": other,
                       "tp_coord": pd.get_mesh("tp").get_local_rank(), "units": units,
                       "torch": torch.__version__}, f, indent=1)
        del model
    dist.destroy_process_group()


# ------------------------------------------------------------------ commplan side

def plan_text(name, loss_parallel=True):
    """The commplan plan file for the config: torchtitan's tiny model on its mesh."""
    world, dp, sp, family, tied = CONFIGS[name]
    lp = "" if loss_parallel else ", loss_parallel = false"
    if family == "llama":
        model = ("family = \"llama\", dim = %(dim)d, n_layers = %(n_layers)d, n_heads = %(n_heads)d, "
                 "n_kv_heads = %(n_kv_heads)d, vocab_size = %(vocab_size)d, multiple_of = %(multiple_of)d, "
                 "ffn_dim_multiplier = %(ffn_dim_multiplier)s, seq_len = %(seq)d" % dict(MODEL, seq=SEQ))
    else:
        model = ("family = \"qwen3\", dim = %(dim)d, n_layers = %(n_layers)d, n_heads = %(n_heads)d, "
                 "n_kv_heads = %(n_kv_heads)d, head_dim = %(head_dim)d, vocab_size = %(vocab_size)d, "
                 "hidden_dim = %(hidden_dim)d, enable_weight_tying = %(tied)s, seq_len = %(seq)d"
                 % dict(QWEN3, seq=SEQ, tied="true" if tied else "false"))
    return "\n".join([
        "-- tests/tp_record.py: torchtitan's tiny %s at %s" % (family, name),
        "return {",
        "  world_size = %d," % world,
        "  parallel = { dp_shard = %d, tp = 2, sequence_parallel = %s%s }," % (dp, "true" if sp else "false", lp),
        "  model = { %s }," % model,
        "  training = { local_batch_size = %d }," % BATCH,
        "}", ""])


def plan_json(name, out_dir, loss_parallel=True):
    """The plan.json commplan generates for the config."""
    import titan_env as E
    text = plan_text(name, loss_parallel)
    name = name + ("" if loss_parallel else "_nolp")
    lua_path = os.path.join(out_dir, "tp_record_%s.lua" % name)
    with open(lua_path, "w") as f:
        f.write(text)
    gen = os.path.join(out_dir, "gen", name)
    E.lua(["gen/commplan.lua", os.path.relpath(lua_path, ROOT), os.path.relpath(gen, ROOT)])
    with open(os.path.join(gen, "plan.json")) as f:
        return json.load(f)


def plan_ops(plan):
    """The plan's TP collectives (micro-step 0, in order)."""
    return [o for o in plan["ops"] if o.get("group") == "tp" and o.get("micro_step", 0) == 0]


def compare_units(plan, rec):
    """Every FSDP unit's parameters as the rank holds them live (name, placements over dp_shard and
    tp, TP-local shape) against plan.json's TP class of the rank's TP coordinate
    (test_llama_plan.commplan_units). Returns (parameters compared, differences)."""
    import test_llama_plan as TL
    # llama's declared renames (tests/titan/test_llama_plan.py: qkv_linear., lm_head); qwen3's names agree
    ours = TL.expected(TL.commplan_units(plan, rec["tp_coord"]), False, plan["parallel"]["tp"],
                       {"names": 0, "fused": 0})
    return units_differ(ours, rec, "torchtitan")


def units_differ(ours, rec, peer):
    """commplan's FSDP units (each parameter's name, placements, TP-local shape) against the ones
    the rank recorded live (rec["units"]), the units without parameters left out on both sides.
    Returns (parameters compared, differences); PEER names the live side."""
    ours = [u for u in ours if u["params"]]
    theirs = [u for u in rec["units"] if u["params"]]
    diffs, n = [], 0
    if len(ours) != len(theirs):
        diffs.append("%d FSDP units with parameters in commplan, %d live" % (len(ours), len(theirs)))
    for a, b in zip(ours, theirs):
        for q, r in zip(a["params"], b["params"]):
            n += 1
            got = (q["name"], [list(x) for x in q["placements"]], q["local"])
            want = (r["name"], [list(x) for x in r["placements"]], r["local"])
            if got != want:
                diffs.append("parameter: commplan %s, %s %s" % (got, peer, want))
        if len(a["params"]) != len(b["params"]):
            diffs.append("unit %s: %d parameters in commplan, %d live" % (a["name"], len(a["params"]),
                                                                         len(b["params"])))
    return n, diffs


def picked(tag, given, configs):
    """The comma-separated config names GIVEN, each one of CONFIGS (else TAG exits naming it), and
    build/<TAG>/ made for the recordings."""
    names = [c for c in given.split(",") if c]
    for c in names:
        if c not in configs:
            sys.exit("%s: unknown config %r; known: %s" % (tag, c, ", ".join(configs)))
    out_dir = os.path.join(ROOT, "build", tag)
    os.makedirs(out_dir, exist_ok=True)
    return names, out_dir


def finish(names, configs, bad):
    """The quick tier's line (when it left configs out), then exit 1 if any rank differed."""
    if QUICK and len(names) < len(configs):
        print("quick tier: %d of %d configs (%s); make test-full records all %d"
              % (len(names), len(configs), ", ".join(names), len(configs)))
    sys.exit(1 if bad else 0)


def kinds_text(rec):
    """The recording's TP collectives counted by kind (all-reduces by op): "N kind, ..."."""
    kinds = {}
    for e in rec["tp"]:
        k = e["kind"] + ("(%s)" % e["reduce_op"] if e["kind"] == "all_reduce" else "")
        kinds[k] = kinds.get(k, 0) + 1
    return ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items()))


def check_recordings(names, worlds, out_dir, plan_of, units_check, ok_line):
    """Every config's recording (OUT_DIR/<config>.rank<r>.json) on every rank against its plan
    (PLAN_OF(config)): the TP collectives in order (compare) and the parameters (UNITS_CHECK(plan,
    rec): (compared, differences)). A rank that differs prints its FAIL lines at once; rank 0 of a
    config that agrees gives OK_LINE(config, rec, ours, parameters). Returns (ranks that differ, TP
    collectives recorded, parameters compared, the ok lines)."""
    bad, total, params, lines = 0, 0, 0, []
    for c in names:
        plan = plan_of(c)
        ours = plan_ops(plan)
        for r in range(worlds[c]):
            with open(os.path.join(out_dir, "%s.rank%d.json" % (c, r))) as f:
                rec = json.load(f)
            _, diffs = compare(c, rec, ours)
            n, pdiffs = units_check(plan, rec)
            diffs += pdiffs
            params += n
            total += len(rec["tp"])
            if diffs:
                bad += 1
                print("  FAIL  %s rank %d: %d differences (%d TP collectives live, %d planned)"
                      % (c, r, len(diffs), len(rec["tp"]), len(ours)))
                for d in diffs[:12]:
                    print("        " + d)
            elif r == 0:
                lines.append(ok_line(c, rec, ours, n))
    return bad, total, params, lines


def mutant_check(name, out_dir, ours, what):
    """The comparison can fail: config NAME's rank-0 recording against OURS, the ops of its plan
    with WHAT changed, must differ. Returns (1 if it did not, the line to print)."""
    with open(os.path.join(out_dir, "%s.rank0.json" % name)) as f:
        _, diffs = compare(name, json.load(f), ours)
    if not diffs:
        return 1, "  FAIL  %s: the plan with %s matched the recording too" % (name, what)
    return 0, "  ok    %s against its plan with %s: %d differences found, as it must" % (name, what, len(diffs))


def compare(name, rec, ours):
    """commplan's TP ops against PyTorch's recorded TP collectives, in order:
    kind, phase (the loss's are in the plan's forward), per-rank count (the
    all-gather's input, the reduce-scatter's output, the all-reduce's
    buffer), reduce op. Returns (matched, differences)."""
    theirs = rec["tp"]
    diffs = []
    for i in range(max(len(ours), len(theirs))):
        a = ours[i] if i < len(ours) else None
        b = theirs[i] if i < len(theirs) else None
        want = None
        if b:
            count = b["out_numel"] if b["kind"] == "reduce_scatter" else b["in_numel"]
            op = None if b["kind"] == "all_gather" else (b["reduce_op"] or "sum")
            want = (COMMPLAN_KIND[b["kind"]], "forward" if b["phase"] == "loss" else b["phase"], count, op)
        got = (a["kind"], a["phase"], a["count"], a.get("reduce_op") if a["kind"] != "tp_all_gather" else None) \
            if a else None
        if got != want:
            diffs.append("TP collective %d: commplan %s, torchtitan %s%s" % (
                i, got, want, " (%s)" % b["via"] if b else ""))
    return len(theirs) - len(diffs), diffs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(QUICK_CONFIGS if QUICK else CONFIGS))
    a = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
        import titan_env as E
    except Exception as e:  # noqa: BLE001
        skip("torch is not importable by %s (%s); make torch-env builds it" % (sys.executable, e))
    try:
        import torchtitan  # noqa: F401
        E.need_titan("tp_record")
    except SystemExit:
        skip("torchtitan is not importable by %s; make torch-env builds it" % sys.executable)
    except Exception as e:  # noqa: BLE001
        skip("torchtitan is not importable (%s)" % e)
    names, out_dir = picked("tp_record", a.configs, CONFIGS)
    # One set of rank processes per config: torch caches DeviceMeshes process-wide, and a second
    # ParallelDims of the same shape in one process hands fully_shard the first one's mesh.
    # torch and torchtitan are imported once, here, and the ranks forked from this process, which
    # builds no mesh and starts no thread (spawning imported them again in every rank: seconds of
    # CPU each, 12 times). TP_RECORD_START=spawn imports them in each rank instead.
    start = os.environ.get("TP_RECORD_START", "fork")
    if start == "fork":
        E.cpu_training()
        import test_llama_plan  # noqa: F401
        import test_qwen3_plan  # noqa: F401
        import spmd_types  # noqa: F401
        import torchtitan.components.loss  # noqa: F401
        import torchtitan.distributed.spmd_types  # noqa: F401
        import torchtitan.distributed.utils  # noqa: F401
        import torchtitan.config  # noqa: F401
        import torchtitan.distributed.parallel_dims  # noqa: F401
    for c in names:
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(rank_main, args=(CONFIGS[c][0], os.path.join(tmp, "init"), [c], out_dir),
                               nprocs=CONFIGS[c][0], join=True, start_method=start)
    bad, total, params, lines = check_recordings(
        names, {c: CONFIGS[c][0] for c in names}, out_dir, lambda c: plan_json(c, out_dir), compare_units,
        lambda c, rec, ours, n: "  ok    %s (%d ranks): %d TP collectives in order on every rank (%s; %d in the loss), "
        "commplan %d" % (c, CONFIGS[c][0], len(rec["tp"]), kinds_text(rec),
                         len([e for e in rec["tp"] if e["phase"] == "loss"]), len(ours)))
    # The comparison can fail: the first config against its plan without loss_parallel must differ.
    m_bad, line = mutant_check(names[0], out_dir, plan_ops(plan_json(names[0], out_dir, loss_parallel=False)),
                               "loss_parallel off")
    bad += m_bad
    (print if m_bad else lines.append)(line)  # a FAIL at once, an ok among the ok lines
    print("\n".join(lines))
    from importlib.metadata import version
    print("tp_record: %d configs x ranks, %d TP collectives recorded from torchtitan %s (torch %s), "
          "%d parameters' placements and TP-local shapes, %d differ"
          % (sum(CONFIGS[c][0] for c in names), total, version("torchtitan"), torch.__version__, params, bad))
    finish(names, CONFIGS, bad)


if __name__ == "__main__":
    main()
