#!/usr/bin/env python3
"""The plan writer's model.attn_backend from torchtitan, and context parallel's one check on it.

torchtitan 0.3 refuses context parallel unless the model's attention is FlexAttention
(distributed/full_dtensor.py:44-52 under spmd_types; context_parallel/api.py:103-104). commplan's
writer (python/commplan/titan.py attn_backend) reads the backend from the built model and writes
model.attn_backend; gen/parallel/cp.lua cp.rules refuses cp > 1 on the family's resolved backend.
Checked on torchtitan's own configs (built on the meta device, no process group):
llama3_debugmodel_varlen_attn refused at cp 2 (naming model.attn_backend), planned at cp 1;
llama3_debugmodel (flex) planned at cp 2. Run: ~/.cache/commplan/torch-env/bin/python this file.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from commplan.titan import plan_from_titan  # noqa: E402
from torchtitan.models.llama3 import config_registry as reg  # noqa: E402


def generate(spec, cp, tmp, name):
    text = plan_from_titan(spec, name, 4, parallel={"dp_shard": 4 // cp, "cp": cp}, seq_len=2048)
    path = os.path.join(tmp, name + ".lua")
    with open(path, "w") as f:
        f.write(text)
    r = subprocess.run(["lua5.4", "gen/commplan.lua", path, os.path.join(tmp, name)], cwd=ROOT,
                       capture_output=True, text=True)
    return text, r.returncode, r.stdout + r.stderr


def main():
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        varlen = reg.llama3_debugmodel_varlen_attn().model_spec
        text, rc, out = generate(varlen, 2, tmp, "varlen_cp2")
        if 'attn_backend = "varlen"' not in text:
            problems.append("varlen model: the plan does not write attn_backend = \"varlen\"")
        if rc == 0 or "model.attn_backend" not in out or "full_dtensor.py:44-52" not in out:
            problems.append("varlen at cp 2: not refused on model.attn_backend (rc %d): %s" % (rc, out[-300:]))
        _, rc, out = generate(varlen, 1, tmp, "varlen_cp1")
        if rc != 0:
            problems.append("varlen at cp 1: refused: %s" % out[-300:])
        text, rc, out = generate(reg.llama3_debugmodel().model_spec, 2, tmp, "flex_cp2")
        if 'attn_backend = "flex"' not in text or rc != 0:
            problems.append("flex at cp 2: %s (rc %d): %s" % ("written" if "flex" in text else "not written", rc,
                                                               out[-300:]))
    for p in problems:
        print("FAIL:", p)
    print("attn_backend plan checks: %d problems (varlen cp2 refused, varlen cp1 and flex cp2 planned)" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
