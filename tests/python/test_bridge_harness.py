"""tests/python/bridge_harness.py's suite (one torchrun for several scripts' workers) on toy
scripts, 4 ranks on gloo: a passing script gets its worker's output and exit status back as if
it had launched torchrun itself; a worker failing on one rank fails its script alone, and the
script after it in the same launch still runs (in a fresh torchrun) and passes; a script that
SKIPs before launching keeps its 77; the suite's log names each launch.

    tests/python/test_bridge_harness.py [TORCHRUN]

Exit 0 when all hold, 1 otherwise, 77 without torch or torchrun (one SKIP line).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bridge_harness as H  # noqa: E402

TOY = '''"""toy %(name)s"""
import os
import sys
sys.path.insert(0, %(here)r)
import bridge_harness as H


def worker(args):
    rank = H.init_rank()
    out = H.gather(rank * 10, 4)
    if rank == 0:
        print("toy_%(name)s: gathered %%s" %% out)
    return %(fail)d if rank == 1 else 0


def main():
    args = H.parse(H.parser(__doc__), worker)
    if %(skip)r:
        H.skip("toy_%(name)s", "asked to")
    torchrun = H.torchrun_for("toy_%(name)s", args.torchrun, ("torch", "torch.distributed"), "torch")
    rc = H.launch(torchrun, __file__, 4, ["--worker"], 300)
    print("toy_%(name)s: launch exit %%d" %% rc)
    sys.exit(rc)


if __name__ == "__main__":
    main()
'''


def main():
    torchrun = H.torchrun_for("bridge_harness", sys.argv[1] if len(sys.argv) > 1 else None,
                              ("torch", "torch.distributed"), "torch")
    bad = []
    with tempfile.TemporaryDirectory(prefix="bridge-harness-") as tmp:
        toys = {"a": (0, False), "b": (3, False), "c": (0, False), "d": (0, True)}
        for name, (fail, skip) in toys.items():
            with open(os.path.join(tmp, "toy_%s.py" % name), "w") as f:
                f.write(TOY % dict(name=name, here=HERE, fail=fail, skip=skip))
        d = os.path.join(tmp, "suite")
        r = subprocess.run([sys.executable, os.path.join(HERE, "bridge_harness.py"), "suite", torchrun, d]
                           + [os.path.join(tmp, "toy_%s.py" % n) for n in toys], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)

        def got(name, ext):
            p = os.path.join(d, "toy_%s.%s" % (name, ext))
            return open(p).read() if os.path.exists(p) else ""
        want = {"a": ("0", ["toy_a: gathered [0, 10, 20, 30]", "toy_a: launch exit 0"]),
                "b": ("3", ["toy_b: gathered [0, 10, 20, 30]", "toy_b: launch exit 3"]),
                "c": ("0", ["toy_c: gathered [0, 10, 20, 30]", "toy_c: launch exit 0"]),
                "d": ("77", ["SKIP toy_d: asked to"])}
        for name, (rc, lines) in want.items():
            if got(name, "exit").strip() != rc:
                bad.append("toy_%s: exit %r, expected %s" % (name, got(name, "exit").strip(), rc))
            for line in lines:
                if line not in got(name, "log"):
                    bad.append("toy_%s: no line %r in its log: %r" % (name, line, got(name, "log")[-300:]))
        launches = [x for x in r.stdout.splitlines() if x.startswith("bridge suite: torchrun")]
        if r.returncode != 0 or len(launches) != 2 or "toy_c" not in launches[1] or "toy_a" in launches[1]:
            bad.append("the suite's launches: %r (exit %d); expected a, b, c in one, then c alone after b failed"
                       % (launches, r.returncode))
    for x in bad:
        print("FAIL " + x)
    print("bridge_harness: toy scripts through one torchrun: passed, failed on one rank, run again after it, "
          "skipped: %s" % ("all as expected" if not bad else "%d problems" % len(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
