#!/usr/bin/env python3
"""The cases of tests/pp/torch_pp_titan_record.py (torchtitan's own
pipeline_llm, live on gloo), torch-free: tests/pp/compare_titan_pp.lua reads
the same numbers from the recording's "spec" and writes commplan's plan of
each. QUICK: make test's quick tier; the rest under make test-full."""
# tests/ep/ep_cases.py's tiny DeepSeek-V3 (3 layers, the first dense): over 2
# stages (5 effective layers) [tok_embeddings, layers.0, layers.1] and
# [layers.2, norm, lm_head], an MoE block on each
DSV3 = dict(dim=16, n_layers=3, n_dense_layers=1, n_heads=2, vocab_size=64, q_lora_rank=0, kv_lora_rank=8,
            qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, dense_hidden_dim=32, moe_hidden_dim=8,
            num_experts=8, num_shared_experts=1, top_k=2)
GQA_MOE = dict(dim=16, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=4, vocab_size=64, moe_hidden_dim=8, num_experts=4,
               top_k=2)
# tests/ep/ep_cases.py's tiny gpt-oss (GPT_BASE): sinks and biases, block 0 sliding, 8 experts with biases
GPT_OSS = dict(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, vocab_size=64, moe_hidden_dim=16,
               num_experts=8, top_k=2)
QWEN3 = dict(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=8, vocab_size=64, hidden_dim=48)
CASES = {
    # PP x EP: pp 2 x dp_shard 2 with ep 2 (efsdp 1) in each stage, 1F1B over 2 microbatches
    "dsv3_pp2_ep2": dict(family="deepseek_v3", world=4, pp=2, dp_shard=2, ep=2, schedule="1F1B", batch=2, seq=6,
                         model=DSV3),
    # the same under torchtitan's full activation checkpointing (the all-to-alls re-run in backward)
    "dsv3_pp2_ep2_full": dict(family="deepseek_v3", world=4, pp=2, dp_shard=2, ep=2, schedule="1F1B", batch=2,
                              seq=6, model=DSV3, ac="full"),
    # Interleaved1F1B: 2 stages per rank (4 over 3 layers + 2)
    "dsv3_pp2_ep2_i1f1b": dict(family="deepseek_v3", world=4, pp=2, dp_shard=2, ep=2, schedule="Interleaved1F1B",
                               batch=2, seq=6, model=DSV3),
    # efsdp 2: pp 2 x dp_shard 4 with ep 2 (world 8): the experts' FSDP on the efsdp groups
    "dsv3_pp2_dp4_ep2": dict(family="deepseek_v3", world=8, pp=2, dp_shard=4, ep=2, schedule="1F1B", batch=2,
                             seq=6, model=DSV3),
    # PP x EP on torchtitan's Qwen3 MoE (qwen3_moe) and without its q/k norms (commplan's mixtral): 4 layers, an
    # MoE in every block
    "qwen3_moe_pp2_ep2": dict(family="qwen3_moe", world=4, pp=2, dp_shard=2, ep=2, schedule="1F1B", batch=2, seq=6,
                              model=GQA_MOE),
    "mixtral_pp2_ep2": dict(family="mixtral", world=4, pp=2, dp_shard=2, ep=2, schedule="1F1B", batch=2, seq=6,
                            model=GQA_MOE),
    # PP on qwen3: pp 2 x dp_shard 2
    "qwen3_pp2": dict(family="qwen3", world=4, pp=2, dp_shard=2, ep=1, schedule="1F1B", batch=2, seq=8,
                      model=QWEN3),
    "qwen3_pp2_gpipe": dict(family="qwen3", world=2, pp=2, dp_shard=1, ep=1, schedule="GPipe", batch=4, seq=8,
                            model=QWEN3),
    # issue 41 (h41a): torchtitan's PipelineScheduleMulti with pipeline_parallel_schedule_csv (2 stages per rank),
    # an order no named class has: rank 0 runs stage 2's backward of each microbatch right after its forward
    "qwen3_pp2_csv": dict(family="qwen3", world=4, pp=2, dp_shard=2, ep=1, schedule="PipelineScheduleMulti", batch=2,
                          seq=8, model=QWEN3,
                          csv="0F0,0F1,2F0,2B0,2F1,2B1,0B0,0B1\r\n,1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1\r\n"),
    # issue 41 (hpp): torchtitan's fsdp_reshard_after_forward = "always" under PP (distributed/fsdp.py:54-77):
    # every unit resharded after each microbatch's forward, gathered again by its backward; 1F1B and Interleaved1F1B
    "qwen3_pp2_always": dict(family="qwen3", world=4, pp=2, dp_shard=2, ep=1, schedule="1F1B", batch=4, seq=8,
                             model=QWEN3, raf="always"),
    "qwen3_pp2_always_i1f1b": dict(family="qwen3", world=4, pp=2, dp_shard=2, ep=1, schedule="Interleaved1F1B",
                                   batch=4, seq=8, model=QWEN3, raf="always"),
    # PP x EP under "always": torchtitan's explicit prefetch lists (distributed/fsdp.py:331-360) per microbatch;
    # efsdp 1 and, world 8, efsdp 2 (the experts' FSDP on its own groups)
    "dsv3_pp2_ep2_always": dict(family="deepseek_v3", world=4, pp=2, dp_shard=2, ep=2, schedule="1F1B", batch=2,
                                seq=6, model=DSV3, raf="always"),
    "dsv3_pp2_dp4_ep2_always": dict(family="deepseek_v3", world=8, pp=2, dp_shard=4, ep=2, schedule="1F1B",
                                    batch=2, seq=6, model=DSV3, raf="always"),
    # gpt-oss (parallelize_gptoss inside each stage, models/gpt_oss/parallelize.py): PP x EP, pp 2 x dp_shard 2
    # with ep 2, 1F1B over 2 microbatches, [tok_embeddings, layers.0] and [layers.1, norm, lm_head]; bf16
    # all-gathers (its experts return bf16 whatever the parameters' dtype: tests/ep/ep_cases.py's gpt_dp4)
    "gpt_pp2_ep2": dict(family="gpt_oss", world=4, pp=2, dp_shard=2, ep=2, schedule="1F1B", batch=2, seq=6,
                        model=GPT_OSS, param_dtype="bf16"),
    # gpt-oss PP x TP: pp 2 x tp 2 (its TP plan, models/gpt_oss/sharding.py, sequence and loss parallel, inside
    # each stage; dp_shard 1: no FSDP collective), 1F1B: the Partial bias gradients' all-reduces in each stage
    "gpt_pp2_tp2": dict(family="gpt_oss", world=4, pp=2, dp_shard=1, tp=2, ep=1, schedule="1F1B", batch=2, seq=6,
                        model=GPT_OSS, param_dtype="bf16"),
    # issue 41 (hpp2): PP x EP under zero bubble's split backward (2 stages per rank): the first stage's I runs no
    # backward and its W the whole one (torch's stage.py:1318-1321, 1393-1415), its backward all-to-alls with it
    # (qwen3_moe: an MoE in every block, so the first stage, [tok_embeddings, layers.0], has all-to-alls)
    "qwen3_moe_pp2_ep2_izb": dict(family="qwen3_moe", world=4, pp=2, dp_shard=2, ep=2,
                                  schedule="InterleavedZeroBubble", batch=4, seq=6, model=GQA_MOE),
    "qwen3_moe_pp2_ep2_zbv": dict(family="qwen3_moe", world=4, pp=2, dp_shard=2, ep=2, schedule="ZBVZeroBubble",
                                  batch=4, seq=6, model=GQA_MOE),
}
QUICK = "dsv3_pp2_ep2"
# (make test's quick tier for the "always" policy: tests/pp/check_titan_pp.sh's ALWAYS block)
QUICK_ALWAYS = "qwen3_pp2_always"
DEFAULT = ",".join(CASES)


def main():
    """pp_titan_cases.py --specs DIR [--cases a,b]: each case as DIR/<case>.json ({"case", "spec"}), for
    tests/pp/compare_titan_pp.lua --write-plans (commplan's plan and parameter ids before torch runs)."""
    import argparse
    import json
    import os
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", required=True)
    ap.add_argument("--cases", default=DEFAULT)
    a = ap.parse_args()
    os.makedirs(a.specs, exist_ok=True)
    for n in [n for n in a.cases.split(",") if n]:
        with open(os.path.join(a.specs, n + ".json"), "w") as f:
            json.dump({"case": n, "spec": CASES[n]}, f)


if __name__ == "__main__":
    main()
