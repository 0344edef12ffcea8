#!/usr/bin/env python3
"""The live expert-parallel check's cases (tests/ep/torch_ep_record.py runs
them; tests/ep/check_ep_live.sh drives both sides), without torch: with
--specs DIR each case's model and mesh is written as DIR/<case>.json (the
fields of the recording's header that tests/ep/compare_ep_live.lua makes
commplan's plan of: case, world, dp_shard, tp, ep, model, batch, seq), so that
commplan's plan and its numbering of the parameters exist before torch
runs.

    ep_cases.py --specs DIR [--cases a,b,...]   (other arguments ignored)

Without --cases, every case but those marked extra (tests/ep/check_ep_live.sh
--cases dp2_tp2,dp2_tp2_ep4 runs those); under make test's quick tier
(COMMPLAN_TEST_TIER=quick) the QUICK cases, with one "quick tier:" line; under
make test-full (COMMPLAN_TEST_TIER=full) every case, the extra ones too.
"""
import argparse
import json
import os
import sys

# The model: torchtitan's DeepSeek-V3 decoder, tiny (see torch_ep_record.py); a case with family
# "qwen3_moe" or "mixtral" torchtitan's Qwen3 MoE decoder (mixtral: without its q/k norms), tiny: GQA_BASE.
BASE = dict(dim=16, n_layers=3, n_dense_layers=1, n_heads=2, vocab_size=64, q_lora_rank=0, kv_lora_rank=8,
            qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, dense_hidden_dim=32, moe_hidden_dim=8,
            num_experts=8, num_shared_experts=1, top_k=2)
# 4 heads of 4 (2 kv heads: tp 2 splits them), 8 experts of hidden 16 (16-byte strides for torch._grouped_mm
# at 8 bf16 per TP shard), top 2
GQA_BASE = dict(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, vocab_size=64, moe_hidden_dim=16,
                num_experts=8, top_k=2)
# torchtitan's gpt-oss decoder (family "gpt_oss"), tiny: its attention with sinks and biases (4 heads of 4, 2 kv
# heads; block 0 with the registry's 128-token sliding window, block 1 full), 8 experts of hidden 16 with biases
# (mlp1's 2 x 16 gate/up rows), top 2
GPT_BASE = dict(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, vocab_size=64, moe_hidden_dim=16,
                num_experts=8, top_k=2)
# name: world, dp_shard, ep, tp (1 unless given; torchtitan's TP with sequence and loss parallelism, its
# defaults, or "sp": False without sequence parallelism; ep borrows from dp_shard*tp), model overrides, (batch, seq), ac (torchtitan's activation checkpointing:
# "none" unless given, "full" = FullAC, "selective" = SelectiveAC, each with its defaults)
CASES = {
    # efsdp 2: expert weights on the efsdp mesh, Shard(0) (efsdp*ep 4 <= 8 experts)
    "dp4_ep2": dict(world=4, dp_shard=4, ep=2, model={}, batch=1, seq=6),
    # efsdp 1: ep takes the whole dp_shard; expert weights on a one-rank FSDP mesh
    "dp4_ep4": dict(world=4, dp_shard=4, ep=4, model={}, batch=1, seq=6),
    # efsdp*ep 4 > 2 experts: Shard(1) on the expert weights
    "dp4_ep2_e2": dict(world=4, dp_shard=4, ep=2, model=dict(num_experts=2, top_k=1), batch=1, seq=5),
    # torchtitan's activation checkpointing (parallelize_deepseekv3 applies it: every block wrapped): the
    # backward re-runs each MoE block's counts exchange, dispatch and combine (the recorder marks them)
    "dp4_ep2_full": dict(world=4, dp_shard=4, ep=2, model={}, batch=1, seq=6, ac="full"),
    "dp4_ep2_sel": dict(world=4, dp_shard=4, ep=2, model={}, batch=1, seq=6, ac="selective"),
    # TP (torchtitan's MoE TP plan, sequence parallel, loss parallel): ep 1, the experts split on their
    # hidden dim over tp (moe_hidden_dim 16: torch._grouped_mm wants 16-byte strides, 8 bf16 per TP shard)
    # (extra=True: run with --cases only; make test's lane runs the others, each new mesh costing ~25 s there)
    "dp2_tp2": dict(world=4, dp_shard=2, tp=2, ep=1, model=dict(moe_hidden_dim=16), batch=1, seq=6, extra=True),
    # ep 2 borrows the tp ranks (ep group = tp group), efsdp 2 = the dp_shard group
    "dp2_tp2_ep2": dict(world=4, dp_shard=2, tp=2, ep=2, model={}, batch=1, seq=6),
    # ep 4 over the whole world, efsdp 1; MLA with a query LoRA (wq_a and q_norm replicated over TP, wq_b colwise)
    "dp2_tp2_ep4": dict(world=4, dp_shard=2, tp=2, ep=4, model=dict(q_lora_rank=8), batch=1, seq=6, extra=True),
    # without sequence parallelism ("sp": False)
    "dp2_tp2_nosp": dict(world=4, dp_shard=2, tp=2, ep=1, sp=False, model=dict(moe_hidden_dim=16), batch=1, seq=6,
                         extra=True),
    "dp2_tp2_ep2_nosp": dict(world=4, dp_shard=2, tp=2, ep=2, sp=False, model=dict(q_lora_rank=8), batch=1, seq=6,
                             extra=True),
    # torchtitan's Qwen3 MoE TP plan (models/qwen3/sharding.py, models/common/moe_sharding.py) on its
    # qwen3_moe decoder (q3m_*) and without q/k norms (mix_*, commplan's mixtral): tp alone, dp_shard x tp at
    # ep 1 (the experts split over TP on their hidden dim), and ep 2 borrowing the TP ranks
    "q3m_tp2": dict(family="qwen3_moe", world=2, dp_shard=1, tp=2, ep=1, model={}, batch=1, seq=6),
    "q3m_dp2_tp2": dict(family="qwen3_moe", world=4, dp_shard=2, tp=2, ep=1, model={}, batch=1, seq=6),
    "q3m_dp2_tp2_ep2": dict(family="qwen3_moe", world=4, dp_shard=2, tp=2, ep=2, model={}, batch=1, seq=6),
    "mix_tp2": dict(family="mixtral", world=2, dp_shard=1, tp=2, ep=1, model={}, batch=1, seq=6),
    "mix_dp2_tp2": dict(family="mixtral", world=4, dp_shard=2, tp=2, ep=1, model={}, batch=1, seq=6),
    "mix_dp2_tp2_ep2": dict(family="mixtral", world=4, dp_shard=2, tp=2, ep=2, model={}, batch=1, seq=6),
    # ep 2 inside TP's groups of 4 (torchtitan 0.3 accepts ep < tp): efsdp 4 = dp_shard x half a TP group
    "mix_dp2_tp4_ep2": dict(family="mixtral", world=8, dp_shard=2, tp=4, ep=2, model=dict(n_kv_heads=4), batch=1, seq=8,
                            extra=True),
    # without sequence parallelism (torchtitan's enable_sequence_parallel = False; "sp": False): at ep 1 the MoE's
    # output all-reduced, its input's gradient all-reduced, as the dense feed-forward's; at ep 2 its output
    # all-reduced after the combine, its input's two slices' gradients (experts', router's) gathered
    "q3m_dp2_tp2_nosp": dict(family="qwen3_moe", world=4, dp_shard=2, tp=2, ep=1, sp=False, model={}, batch=1, seq=6,
                             extra=True),
    "q3m_dp2_tp2_ep2_nosp": dict(family="qwen3_moe", world=4, dp_shard=2, tp=2, ep=2, sp=False, model={}, batch=1,
                                 seq=6, extra=True),
    # torchtitan's gpt-oss (parallelize_gptoss, models/gpt_oss/parallelize.py): FSDP alone (every expert weight
    # and bias Shard(0), 4 ranks <= 8 experts), ep 2 (weights and biases split over ep, efsdp 2), and ep 2 with 2
    # experts (efsdp*ep 4 > 2: Shard(1) on the weights and the biases). Under torchtitan's default bf16
    # all-gathers ("param_dtype": its mixed_precision_param; fp32 reductions): gpt-oss's experts return bf16
    # whatever the parameters' dtype (models/gpt_oss/moe.py:161-188, the grouped mms on bf16 copies), which an
    # fp32 step's combine refuses (scatter_add of bf16 rows into fp32)
    "gpt_dp4": dict(family="gpt_oss", world=4, dp_shard=4, ep=1, model={}, batch=1, seq=6, param_dtype="bf16"),
    "gpt_dp4_ep2": dict(family="gpt_oss", world=4, dp_shard=4, ep=2, model={}, batch=1, seq=6, param_dtype="bf16"),
    "gpt_dp4_ep2_e2": dict(family="gpt_oss", world=4, dp_shard=4, ep=2, model=dict(num_experts=2, top_k=1), batch=1,
                           seq=5, param_dtype="bf16"),
    # gpt-oss under its TP plan (models/gpt_oss/sharding.py; sequence and loss parallel): dp_shard 2 x tp 2 at
    # ep 1 (mlp1's weight and bias S(1), mlp2's weight S(2), its bias R; the sinks S(0) over heads; wo's bias R),
    # ep 2 borrowing the TP ranks (the experts on ep, not TP), and without sequence parallelism: every TP
    # collective in order and the Partial biases' gradient all-reduces (wo's bias, the router's gate, at ep 1
    # mlp2's bias) held to the plan's
    "gpt_dp2_tp2": dict(family="gpt_oss", world=4, dp_shard=2, tp=2, ep=1, model={}, batch=1, seq=6,
                        param_dtype="bf16"),
    "gpt_dp2_tp2_ep2": dict(family="gpt_oss", world=4, dp_shard=2, tp=2, ep=2, model={}, batch=1, seq=6,
                            param_dtype="bf16"),
    "gpt_dp2_tp2_nosp": dict(family="gpt_oss", world=4, dp_shard=2, tp=2, ep=1, sp=False, model={}, batch=1, seq=6,
                             param_dtype="bf16", extra=True),
    "gpt_dp2_tp2_ep2_nosp": dict(family="gpt_oss", world=4, dp_shard=2, tp=2, ep=2, sp=False, model={}, batch=1,
                                 seq=6, param_dtype="bf16", extra=True),
    # DeepSeek-V3's multi-token prediction (num_mtp_layers; tests/titan/test_mtp.py holds it at FSDP/HSDP) under
    # torchtitan's TP plan (models/deepseek_v3/sharding.py:153-192: each MTP block as a decoder block, enorm and
    # hnorm as norms, eh_proj's weight replicated, mtp_norm gathering its output as the final norm does) and
    # loss parallel per depth (MTPLoss); and at ep 2 (the MTP block's MoE on ep)
    "dp2_tp2_mtp": dict(world=4, dp_shard=2, tp=2, ep=1, model=dict(moe_hidden_dim=16, num_mtp_layers=1), batch=1,
                        seq=6),
    "dp2_tp2_nosp_mtp": dict(world=4, dp_shard=2, tp=2, ep=1, sp=False, model=dict(moe_hidden_dim=16, num_mtp_layers=2),
                             batch=1, seq=6, extra=True),
    "dp2_tp2_ep2_mtp": dict(world=4, dp_shard=2, tp=2, ep=2, model=dict(num_mtp_layers=1), batch=1, seq=6,
                            extra=True),
    "dp4_ep2_mtp": dict(world=4, dp_shard=4, ep=2, model=dict(num_mtp_layers=1), batch=1, seq=6, extra=True),
}
# The cases run when none are named: by hand, all but the extra ones; make test's quick tier one case
# per mesh and activation checkpointing once (full AC), the Qwen3 MoE TP plan once (EP x TP, on the
# dp2_tp2_ep2 mesh), gpt-oss at ep 2 and under its TP plan at ep 1 (wo's, mlp2's and the router's Partial bias
# gradients); make test-full every case.
TIER = os.environ.get("COMMPLAN_TEST_TIER", "")
QUICK = ("dp4_ep2", "dp4_ep2_full", "dp4_ep4", "dp2_tp2_ep2", "q3m_dp2_tp2_ep2", "gpt_dp4_ep2", "gpt_dp2_tp2")
if TIER == "quick":
    DEFAULT = ",".join(QUICK)
elif TIER == "full":
    DEFAULT = ",".join(CASES)
else:
    DEFAULT = ",".join(n for n, c in CASES.items() if not c.get("extra"))


def family(case):
    return case.get("family", "deepseek_v3")


def model_of(case):
    """The case's model numbers: its family's base with the case's overrides."""
    base = {"deepseek_v3": BASE, "gpt_oss": GPT_BASE}.get(family(case), GQA_BASE)
    return dict(base, **case["model"])


def spec(name):
    case = CASES[name]
    return {"case": name, "family": family(case), "world": case["world"], "dp_shard": case["dp_shard"],
            "ep": case["ep"], "tp": case.get("tp", 1),
            "model": model_of(case), "batch": case["batch"], "seq": case["seq"],
            "ac": case.get("ac", "none"), "sp": case.get("sp", True), "param_dtype": case.get("param_dtype", "fp32")}


def names_of(cases):
    names = [n for n in cases.split(",") if n]
    for n in names:
        if n not in CASES:
            sys.exit("ep-run: no case %r (cases: %s)" % (n, ", ".join(CASES)))
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", required=True)
    ap.add_argument("--cases", default=DEFAULT)
    a, _ = ap.parse_known_args()
    if TIER == "quick" and a.cases == DEFAULT:
        print("quick tier: %d of %d cases (%s); make test-full runs all %d (%s too)"
              % (len(QUICK), len(CASES), ", ".join(QUICK), len(CASES), ", ".join(n for n in CASES if n not in QUICK)))
    os.makedirs(a.specs, exist_ok=True)
    for n in names_of(a.cases):
        with open(os.path.join(a.specs, n + ".json"), "w") as f:
            json.dump(spec(n), f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
