#!/usr/bin/env python3
"""The bridge (commplan.runtime.CommplanFSDP) and a plan whose forward calls a unit more than once
per micro-batch (issue 41: DeepSeek-V3's multi-token prediction, model.num_mtp_layers > 0;
torchtitan models/deepseek_v3/mtp.py runs tok_embeddings, and [norm, lm_head] under "always",
once per depth more; gen/models/deepseek_v3.lua calls, gen/parallel/fsdp_schedule.lua calls_micro).

The bridge's hooks drive one pre-forward / post-forward / pre-backward / post-backward per unit and
micro-step; such a plan's per-call ops are not driven, so CommplanFSDP refuses it at load with one
line naming model.num_mtp_layers and the fix (the plan's binary / C tables, or 0 depths). Checks:

* a tiny DeepSeek-V3 plan with num_mtp_layers 1 (FSDP 4; tests/titan/test_mtp.py's tiny model) is
  refused at CommplanFSDP's load, in one line, naming the unit called twice (tok_embeddings),
  model.num_mtp_layers and the fix; its plan.json carries forward_calls 2 on tok_embeddings and
  norm_lm_head, and so does the same model under torchtitan's "never" reshard policy with 2
  micro-batches (whose ops gather no unit twice in a forward);
* the mutant: the same plan generated with the model's call order dropped (one forward per unit,
  gen.models.deepseek_v3.calls = nil, as test_mtp.py's one_forward) is not refused, so the refusal
  comes from the per-call ops, not from the model;
* every committed plans/*/plan.json is accepted, the ChunkedLossWrapper plans among them (their loss
  head gathered once per chunk: reduced in parts, commplan.chunked_loss, not a repeated call).

No torch processes (torch imported, nothing launched); about 2 s. Prints one "bridge_mtp:" line;
exit 0 when every check holds, 1 otherwise, 77 (SKIP) without torch.
"""
import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
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


def main():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP bridge_mtp: no torch (%s)" % e)
        return 77
    from commplan.planfile import PlanError
    from commplan.runtime import CommplanFSDP, repeated_calls
    from commplan.match import load_plan_json
    problems = []
    mtp, one = generate(False), generate(True)
    try:
        CommplanFSDP("mtp1", None, None, plan_json=mtp)
        problems.append("the num_mtp_layers 1 plan was not refused")
    except PlanError as e:
        msg = str(e)
        for want in ("tok_embeddings", "model.num_mtp_layers = 0", "model.num_mtp_layers > 0", "make PLAN=mtp1.lua"):
            if want not in msg:
                problems.append("the refusal does not say %r: %s" % (want, msg))
        if "\n" in msg:
            problems.append("the refusal is more than one line: %r" % msg)
    got = repeated_calls(load_plan_json(mtp))
    if got != [("tok_embeddings", 2), ("norm_lm_head", 2)]:
        problems.append("plan.json's forward_calls: %s, want tok_embeddings and norm_lm_head 2 each" % got)
    # torchtitan's "never" (2 micro-batches): no unit gathered twice in a forward, the calls still repeated
    never = repeated_calls(load_plan_json(generate(False, never=True)))
    if never != got:
        problems.append("the \"never\" plan's forward_calls: %s, want %s" % (never, got))
    rep = repeated_calls(load_plan_json(one))
    if rep:
        problems.append("the one-forward mutant is refused too (%s): the refusal is not the per-call ops'" % rep)
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
    print("bridge_mtp: the num_mtp_layers 1 plan refused at load in one line (plan.json's forward_calls: %s); its "
          "one-forward mutant accepted; %d committed plans accepted (%d with ChunkedLossWrapper's loss head)"
          % (", ".join("%s %d" % c for c in got), len(shipped), chunked))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
