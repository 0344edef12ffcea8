"""The new user's path (issue 38): pip install ./python into a scratch virtual environment, then in
a scratch git repository outside this tree, through the installed `commplan` command only:

    commplan write models/config.json --name llama8b --world-size 8 --seq-len 4096 -o plans/llama8b.lua
    commplan generate plans/llama8b.lua        -> plans/llama8b/ (SCHEDULE.md, timeline.svg, ...)
    commplan audit plans/llama8b.lua           -> the summary
    git commit; commplan check plans/llama8b.lua   -> up to date (exit 0)
    edit models/config.json; commplan check    -> exit 1, one line naming the config
    commplan write ... again; commplan generate; commplan check -> exit 0

The install is offline (pip --no-index: the package's build backend is the standard library's,
python/commplan_build.py) and the command runs the generator packaged with it (commplan/_root),
not this checkout. Prints "new user: ok (N s)".
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(REPO, "tests", "python", "fixtures", "llama3_8b_config.json")
WRITE = ["write", "models/config.json", "--name", "llama8b", "--world-size", "8", "--seq-len", "4096",
         "-o", "plans/llama8b.lua"]


def fail(msg):
    sys.stderr.write("new user: FAIL: %s\n" % msg)
    sys.exit(1)


def run(cmd, cwd, env, want=0):
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=300)
    if want is not None and r.returncode != want:
        fail("%s: exit %d, wanted %d\nstdout: %s\nstderr: %s" % (" ".join(cmd), r.returncode, want,
                                                                  r.stdout[-2000:], r.stderr[-2000:]))
    return r


def main():
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="commplan-new-user-")
    try:
        venv = os.path.join(tmp, "venv")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COMMPLAN_ROOT", "VIRTUAL_ENV")}
        run([sys.executable, "-m", "venv", "--system-site-packages", venv], tmp, env)
        vbin = os.path.join(venv, "bin")
        env["PATH"] = vbin + os.pathsep + env.get("PATH", "")
        r = run([os.path.join(vbin, "python"), "-m", "pip", "install", "--no-index", "--disable-pip-version-check",
                 "-q", os.path.join(REPO, "python")], tmp, env, want=None)
        if r.returncode != 0:
            fail("pip install ./python: %s" % (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1])
        commplan = shutil.which("commplan", path=vbin)
        if not commplan:
            fail("pip install ./python installed no commplan command in %s" % vbin)
        root = run([os.path.join(vbin, "python"), "-c",
                    "import commplan.generator as g; print(g.find_root())"], tmp, env).stdout.strip()
        if not root.startswith(venv):
            fail("the installed command runs the generator at %s, not the one packaged with it" % root)

        repo = os.path.join(tmp, "repo")
        os.makedirs(os.path.join(repo, "models"))
        shutil.copy(FIXTURE, os.path.join(repo, "models", "config.json"))
        run(["git", "init", "-q"], repo, env)
        for k, v in (("user.email", "new@user"), ("user.name", "new user")):
            run(["git", "config", k, v], repo, env)

        run([commplan] + WRITE, repo, env)
        run([commplan, "generate", "plans/llama8b.lua"], repo, env)
        for f in ("SCHEDULE.md", "timeline.svg", "plan.json", "plan.h", "plan.c"):
            if not os.path.isfile(os.path.join(repo, "plans", "llama8b", f)):
                fail("commplan generate wrote no plans/llama8b/%s beside the plan" % f)
        audit = run([commplan, "audit", "plans/llama8b.lua"], repo, env).stdout
        if "# Communication schedule: llama8b" not in audit or "| memory |" not in audit:
            fail("commplan audit printed no summary: %r" % audit[:300])
        run(["git", "add", "-A"], repo, env)
        run(["git", "commit", "-qm", "plan"], repo, env)
        ok = run([commplan, "check", "plans/llama8b.lua"], repo, env)
        if "up to date" not in ok.stdout:
            fail("commplan check: %r" % ok.stdout)

        path = os.path.join(repo, "models", "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["num_hidden_layers"] = 28
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
        bad = run([commplan, "check", "plans/llama8b.lua"], repo, env, want=1)
        lines = bad.stderr.strip().splitlines()
        if len(lines) != 1 or "models/config.json changed" not in lines[0] or "commplan write" not in lines[0]:
            fail("commplan check after the config's edit: %r" % bad.stderr)

        run([commplan] + WRITE, repo, env)
        stale = run([commplan, "check", "plans/llama8b.lua"], repo, env, want=1)
        if "commplan generate plans/llama8b.lua" not in stale.stderr:
            fail("commplan check with the output stale: %r" % stale.stderr)
        run([commplan, "generate", "plans/llama8b.lua"], repo, env)
        run([commplan, "check", "plans/llama8b.lua"], repo, env)
        with open(os.path.join(repo, "plans", "llama8b.lua")) as f:
            if "n_layers = 28" not in f.read():
                fail("the rewritten plan does not have the edited config's 28 layers")
        exp = run([commplan, "expect", "plans/llama8b.lua"], repo, env).stdout
        if not exp.startswith("plan llama8b (fingerprint ") or "collectives" not in exp:
            fail("commplan expect (the installed command, gen/ from commplan/_root/) printed %r" % exp[:300])
        run([os.path.join(vbin, "python"), "-m", "commplan", "--help"], repo, env)
        print("new user: ok (%.0f s): pip install ./python, write -> generate -> audit -> check -> expect; check fails "
              "after the config's edit, passes after rewrite + generate" % (time.time() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
