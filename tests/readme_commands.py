#!/usr/bin/env python3
"""Every command README.md shows, run (issue 38, item 5).

The README's fenced blocks are read in order:
  * a shell block (```sh) runs as one bash script (`set -e`, so a `cd` carries to the next
    line), each command line matched against COMMANDS below: run as written, run in a cheap
    form (the line replaced, with the reason), or not run (the reason). A command that matches
    no entry fails the test, so a command added to the README without a test here fails, and
    so does an entry of CHEAP or SKIP that no README command matches any more;
  * the quick start, the block between <!-- quickstart --> and <!-- /quickstart -->, runs in
    a scratch home directory outside this tree, with a Hugging Face config.json from
    tests/python/fixtures/ as the user's, and must write nothing into this checkout;
  * a ```lua block is a plan file: it is generated (gen/commplan.lua) and must succeed;
  * a ```text block is output, not run; any other block fails the test.
After the quick start its `commplan check` runs again with config.json edited (exit 1, one
line, as the README says) and restored (exit 0). It also checks that the README is under
MAX_LINES lines and that every relative link in README.md, docs/testing.md and the pages that
took the README's sections (LINKED) names an existing file (and, into a .md file, heading).

`pip install ./python` runs for real, offline, into a scratch virtual environment (the
package's build backend is the standard library's, so --no-index needs nothing from an index),
and the quick start runs through the `commplan` command it installed.

Usage: python3 tests/readme_commands.py [--list]   (--list: print each command and its entry)
Exit status 0 when everything ran; 1 otherwise, naming what failed.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
# README.md, docs/testing.md and the pages that took the README's other sections
LINKED = ["README.md", "docs/testing.md", "docs/building.md", "docs/plans.md", "docs/generated-output.md",
          "docs/binary.md", "docs/gpus.md", "docs/python.md"]
MAX_LINES = 150
BLOCK_TIMEOUT = 300
CONFIG = os.path.join(REPO, "tests", "python", "fixtures", "llama3_8b_config.json")

# `pip install ./python` as the README runs it, into a scratch virtual environment so the
# user's Python is untouched (offline: --no-index; the build backend is python/commplan_build.py).
SHIM = ('python3 -m venv --system-site-packages "$RC_VENV" && "$RC_VENV/bin/python" -m pip install -q '
        '--no-index --disable-pip-version-check ./python && export PATH="$RC_VENV/bin:$PATH"')

# (pattern over the command's words joined by one space, kind, reason or replacement).
# kind "run": run as written. "cheap": the line replaced by the third field's text.
# "skip": not run, for the reason given.
COMMANDS = [
    (r"make PLAN=[A-Za-z0-9_]+\.lua", "run", "builds the plan (seconds; nothing to do when built)"),
    (r"make test", "skip", "the suite this test runs inside (tests/run.sh; CI runs it as .ci/run)"),
    (r"pip install \./python", "cheap",
     "run into a scratch virtual environment (offline, --no-index), not the user's Python", SHIM),
    (r"cd ~/[A-Za-z0-9_.-]+", "run", "the scratch home's directory, holding config.json"),
    (r"commplan (write|generate|audit|advise|check|diff) .*", "run", "the commplan command"),
    (r"python3 -m commplan (write|generate|audit|advise|check|diff|hf|units) .*", "run", "the commplan command"),
]

failures = []
skips = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def skip(msg):
    skips.append(msg)
    print("SKIP: " + msg)


def blocks(text):
    """(language, body, first line number, in the quick start) for each fenced block."""
    out, lines = [], text.split("\n")
    i, quick = 0, False
    while i < len(lines):
        line = lines[i]
        if line.strip() == "<!-- quickstart -->":
            quick = True
        elif line.strip() == "<!-- /quickstart -->":
            quick = False
        m = re.match(r"^(\s*)(```+|~~~+)\s*([A-Za-z0-9_+-]*)", line)
        if m:
            fence, lang, start, body = m.group(2), m.group(3), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            out.append((lang, "\n".join(body) + "\n", start, quick))
        i += 1
    return out


def commands(body):
    """(source line, words) of each command in a shell block: continuations joined, comments dropped."""
    out, cur = [], ""
    for line in body.split("\n"):
        cur += line
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        if cur.strip():
            words = shlex.split(cur, comments=True)
            if words:
                out.append((cur, words))
        cur = ""
    return out


def entry(words):
    joined = " ".join(words)
    for e in COMMANDS:
        if re.fullmatch(e[0], joined):
            return e
    return None


def git_status():
    r = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def run_shell(script, cwd, env, what):
    try:
        r = subprocess.run(["bash", "-c", "set -eo pipefail\n" + script], cwd=cwd, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        fail("%s: over %d s" % (what, BLOCK_TIMEOUT))
        return False
    if r.returncode != 0:
        tail = "\n".join(r.stdout.rstrip("\n").split("\n")[-15:])
        fail("%s: exit status %d\n%s" % (what, r.returncode, tail))
        return False
    return True


def shell_block(body, start, quick, used, scratch, listing):
    script, n_run = [], 0
    for line, words in commands(body):
        e = entry(words)
        if e is None:
            fail("README.md:%d: `%s`: no entry in tests/readme_commands.py COMMANDS: add one "
                 "(run, cheap form or skip, with the reason)" % (start, " ".join(words)))
            continue
        used.add(e[0])
        if listing:
            print("  %-5s %s  (%s)" % (e[1], line.split("  #")[0].strip(), e[2]))
        if e[1] == "run":
            script.append('printf "+ %%s\\n" %s\n%s' % (shlex.quote(line), line))
            n_run += 1
        elif e[1] == "cheap":
            script.append('printf "+ %%s\\n" %s\n%s' % (shlex.quote("(cheap form) " + line), e[3]))
            n_run += 1
        else:
            print("README.md:%d: not run: %s: %s" % (start, " ".join(words), e[2]))
    if listing or not script:
        return
    what = "README.md:%d: the %s block" % (start, "quick start" if quick else "shell")
    # the installed command, not this checkout's sources
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COMMPLAN_ROOT", "VIRTUAL_ENV")}
    env["RC_VENV"] = os.path.join(scratch, "venv")
    cwd = REPO
    if quick:
        home = os.path.join(scratch, "home")
        os.makedirs(home, exist_ok=True)
        env["HOME"] = home
        # every directory the block cd's into under ~ holds the user's config.json
        for _, words in commands(body):
            if words[0] == "cd" and len(words) == 2 and words[1].startswith("~/"):
                d = os.path.join(home, words[1][2:])
                os.makedirs(d, exist_ok=True)
                shutil.copyfile(CONFIG, os.path.join(d, "config.json"))
    before = git_status() if quick else None
    if run_shell("\n".join(script), cwd, env, what):
        print("ok: %s, %d commands" % (what, n_run))
        if quick:
            after = git_status()
            if before is None or after != before:
                fail("%s wrote into this checkout:\n%s" % (what, after))
            files = [os.path.join(dp, f) for dp, _, fs in os.walk(env["HOME"]) for f in fs]
            for want in ("SCHEDULE.md", "timeline.svg"):
                if not any(p.endswith(os.sep + want) for p in files):
                    fail("%s: no %s written under the scratch home" % (what, want))
            check_after_edit(body, env, what)


def check_after_edit(body, env, what):
    """The README's CI step as it says: its check command exits 1 with one line once config.json
    changes, and 0 again once it is back (the block's commands up to its cd run first)."""
    cmds = commands(body)
    checks = [i for i, (_, w) in enumerate(cmds) if w[:2] == ["commplan", "check"]]
    cds = [w[1] for _, w in cmds if w[0] == "cd" and len(w) == 2 and w[1].startswith("~/")]
    if not checks or not cds:
        return
    config = os.path.join(env["HOME"], cds[-1][2:], "config.json")
    if not os.path.exists(config):
        return
    prefix = []   # the block's setup: its cheap forms (the install) and its cd's
    for line, words in cmds:
        e = entry(words)
        if e and e[1] == "cheap":
            prefix.append(e[3])
        elif words[0] == "cd":
            prefix.append(line)
    check = cmds[checks[-1]][0].split("#")[0].strip()
    with open(config, "rb") as f:
        orig = f.read()
    try:
        edited = orig.replace(b'"num_hidden_layers": 32', b'"num_hidden_layers": 30')
        if edited == orig:
            fail("%s: %s has no \"num_hidden_layers\": 32 to edit" % (what, CONFIG))
            return
        with open(config, "wb") as f:
            f.write(edited)
        r = subprocess.run(["bash", "-c", "\n".join(prefix) + "\n" + check], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT)
        out = [l for l in r.stdout.split("\n") if l and not l.startswith("+ ")]
        if r.returncode != 1 or len(out) != 1:
            fail("%s: `%s` after config.json changed: exit %d, %d lines (the README says exit 1, one line)"
                 "\n%s" % (what, check, r.returncode, len(out), "\n".join(out[-5:])))
        else:
            print("ok: %s: `%s` after config.json changed: exit 1, one line: %s" % (what, check, out[0]))
    finally:
        with open(config, "wb") as f:
            f.write(orig)
    r = subprocess.run(["bash", "-c", "\n".join(prefix) + "\n" + check], cwd=REPO, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT)
    if r.returncode != 0:
        fail("%s: `%s` with config.json restored: exit %d\n%s" % (what, check, r.returncode, r.stdout[-600:]))


def lua_block(body, start, scratch):
    plan = os.path.join(scratch, "readme_plan%d.lua" % start)
    with open(plan, "w") as f:
        f.write(body)
    out = os.path.join(scratch, "readme_plan%d" % start)
    r = subprocess.run([os.environ.get("LUA", "lua5.4"), os.path.join(REPO, "gen", "commplan.lua"), plan, out], cwd=scratch,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT)
    if r.returncode != 0 or not os.path.exists(os.path.join(out, "SCHEDULE.md")):
        fail("README.md:%d: the plan file block does not generate: %s" % (start, r.stdout.strip()[-600:]))
    else:
        print("ok: README.md:%d: the plan file block generates" % start)


def slug(heading):
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def anchors(path):
    with open(path) as f:
        text = f.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def check_links():
    for rel in LINKED:
        path = os.path.join(REPO, rel)
        with open(path) as f:
            text = f.read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        n = 0
        for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            n += 1
            if not os.path.exists(dest):
                fail("%s: the link %s names no file" % (rel, target))
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                fail("%s: the link %s names no heading of %s" % (rel, target, os.path.relpath(dest, REPO)))
        print("ok: %s: %d links checked" % (rel, n))


def main():
    listing = "--list" in sys.argv[1:]
    with open(README) as f:
        text = f.read()
    nlines = text.count("\n")
    if nlines >= MAX_LINES:
        fail("README.md has %d lines: keep it under %d (the rest belongs in docs/)" % (nlines, MAX_LINES))
    used = set()
    scratch = tempfile.mkdtemp(prefix="readme_commands.")
    try:
        if not any(q for _, _, _, q in blocks(text)):
            fail("README.md has no quick start block (<!-- quickstart --> ... <!-- /quickstart -->)")
        for lang, body, start, quick in blocks(text):
            if lang in ("sh", "bash", "shell"):
                shell_block(body, start, quick, used, scratch, listing)
            elif lang == "lua":
                if not listing:
                    lua_block(body, start, scratch)
            elif lang == "text":
                pass
            else:
                fail("README.md:%d: a ```%s block: tests/readme_commands.py runs sh and lua blocks "
                     "and reads text blocks as output; label it or move it to docs/" % (start, lang or "(unlabelled)"))
        for e in COMMANDS:
            if e[1] in ("cheap", "skip") and e[0] not in used:
                fail("COMMANDS entry %r (%s) matches no README command: remove it" % (e[0], e[1]))
        if not listing:
            check_links()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if failures:
        print("readme_commands: %d failed" % len(failures))
        return 1
    print("readme_commands: every README command run or accounted for (%d SKIP)" % len(skips))
    return 0


if __name__ == "__main__":
    sys.exit(main())
