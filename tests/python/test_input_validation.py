"""The Python plan writer (python/commplan) under hostile and careless input, standard library only.

* config.json and every writer option are checked for type and shape in one place
  (commplan/validate.py): a top-level array, the string "false" or 0/1 where a boolean belongs,
  "32" where an integer belongs, a wrong option -> one PlanError line naming the file (or the
  options) and the field path, never AttributeError / ValueError / TypeError / KeyError.
* Every file read is a regular file, bounded: a FIFO, a directory, a character device or a huge
  file is refused with one line naming the path and what it is; nothing hangs (the cases that
  could hang run in a child with a timeout).
* Every file written goes through one helper (commplan/safeio.py): a temporary file created
  exclusively beside the target, every write / fsync / close checked, then renamed over it: a
  symlink planted at the output name (or at the old predictable temporary name) is replaced, its
  target untouched; a failed write is one line and leaves the old file and no temporary behind.
* The CLI (python3 -m commplan): one line and exit 2 on bad input; a failed write of stdout
  (/dev/full, a closed pipe) is a non-zero exit with one line.
"""
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PYDIR = os.path.join(REPO, "python")
sys.path.insert(0, PYDIR)

import commplan  # noqa: E402
from commplan import PlanError  # noqa: E402

FIX = os.path.join(HERE, "fixtures")
TIMEOUT = 20  # seconds for a child that could hang if a regression came back
RAW = (AttributeError, KeyError, TypeError, IndexError, RecursionError, UnicodeError, OverflowError)


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return json.load(f)


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_py(code, argv=(), timeout=TIMEOUT, **kw):
    """Runs code in a child python3 (commplan importable); a hang is a failure, not a stuck suite."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + list(argv), env=child_env(),
                          timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, **kw)


def cli(*args, timeout=TIMEOUT, **kw):
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "commplan"] + list(args), env=child_env(), timeout=timeout,
                          stderr=subprocess.PIPE, universal_newlines=True, **kw)


class Case(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="commplan-val-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def write_json(self, name, doc):
        p = self.path(name)
        with open(p, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        return p

    def refused(self, fn, *words):
        """fn() raises PlanError (not a raw Python exception), one line, holding every word."""
        try:
            fn()
        except PlanError as e:
            msg = str(e)
        except RAW as e:  # noqa: B014
            self.fail("raw %s escaped: %s" % (type(e).__name__, e))
        except ValueError as e:
            self.fail("raw ValueError (not PlanError) escaped: %s" % e)
        else:
            self.fail("accepted; expected a PlanError with %r" % (words,))
        self.assertNotIn("\n", msg)
        for w in words:
            self.assertIn(w, msg)
        return msg


# ---- config.json -------------------------------------------------------------------------

class ConfigJson(Case):
    def cfg(self, **over):
        c = fixture("llama3_8b_config.json")
        c.update(over)
        return c

    def test_top_level_array(self):
        p = self.write_json("config.json", [self.cfg()])
        msg = self.refused(lambda: commplan.hf_config(p), p, "JSON object", "array")
        self.assertIn("{", msg)  # the fix: the top level is an object { ... }

    def test_top_level_scalars_and_null(self):
        for doc in ("null", "3", '"llama"', "true"):
            p = self.write_json("config.json", doc)
            self.refused(lambda: commplan.hf_config(p), p, "JSON object")
        self.refused(lambda: commplan.hf_config([self.cfg()]), "JSON object")

    def test_false_string_is_not_true(self):
        p = self.write_json("config.json", self.cfg(tie_word_embeddings="false"))
        self.refused(lambda: commplan.hf_config(p), p, "tie_word_embeddings", "true or false", 'string "false"',
                     "no quotes")
        for key in ("attention_bias", "mlp_bias"):
            for bad in ("false", "true", 0, 1, None, [], {}):
                self.refused(lambda: commplan.hf_config(self.cfg(**{key: bad})), key, "true or false")
        # the real booleans still work, both ways
        self.assertEqual(commplan.hf_config(self.cfg(tie_word_embeddings=False))["family"], "llama")
        self.assertEqual(commplan.hf_config(self.cfg(tie_word_embeddings=True, num_hidden_layers=1))["family"],
                         "generic")

    def test_integer_fields(self):
        p = self.write_json("config.json", self.cfg(num_hidden_layers="32"))
        msg = self.refused(lambda: commplan.hf_config(p), "%s: num_hidden_layers: expected an integer, got string "
                           '"32"' % p)
        self.assertIn("32 (no quotes)", msg)
        for bad, word in ((32.0, "number 32.0"), (True, "true"), (0, "0"), (-4, "-4"), (None, "null"),
                          ([32], "array"), (2 ** 31, "2147483648")):
            self.refused(lambda: commplan.hf_config(self.cfg(hidden_size=bad)), "hidden_size", word)
        self.refused(lambda: commplan.hf_config(self.cfg(num_hidden_layers=10 ** 9)), "num_hidden_layers", "4093")
        self.refused(lambda: commplan.hf_config(self.cfg(num_key_value_heads="8")), "num_key_value_heads")
        self.refused(lambda: commplan.hf_config(self.cfg(head_dim=1.5)), "head_dim")
        self.assertEqual(commplan.hf_config(self.cfg(num_key_value_heads=None))["family"], "llama")

    def test_model_type_and_missing_keys(self):
        self.refused(lambda: commplan.hf_config(self.cfg(model_type=["llama"])), "model_type", "array")
        self.refused(lambda: commplan.hf_config(self.cfg(model_type=None)), "model_type")
        c = self.cfg()
        del c["vocab_size"]
        self.refused(lambda: commplan.hf_config(c), "vocab_size", "missing")

    def test_malformed_json(self):
        cases = {
            "truncated": '{"model_type": "llama", "hidden_size": 40',
            "NaN": '{"model_type": "llama", "hidden_size": NaN}',
            "Infinity": '{"model_type": "llama", "hidden_size": Infinity}',
            "duplicate": '{"model_type": "llama", "hidden_size": 4096, "hidden_size": 8}',
            "digits": '{"model_type": "llama", "hidden_size": %s}' % ("9" * 5000),
            "deep": "[" * 100000 + "]" * 100000,
            "empty": "",
        }
        for why, doc in cases.items():
            p = self.write_json("config.json", doc)
            self.refused(lambda: commplan.hf_config(p), p)
        p = self.path("bad-utf8.json")
        with open(p, "wb") as f:
            f.write(b'{"model_type": "ll\xffama"}')
        self.refused(lambda: commplan.hf_config(p), p, "UTF-8")
        p = self.path("bom.json")  # a BOM is taken (editors on some systems write one)
        with open(p, "wb") as f:
            f.write(b"\xef\xbb\xbf" + json.dumps(self.cfg()).encode())
        self.assertEqual(commplan.hf_config(p)["family"], "llama")

    def test_hf_config_options(self):
        c = self.cfg()
        self.refused(lambda: commplan.hf_config(c, seq_len="8192"), "seq_len", "integer")
        self.refused(lambda: commplan.hf_config(c, seq_len=True), "seq_len", "integer")
        self.refused(lambda: commplan.hf_config(c, family=3), "family")
        self.refused(lambda: commplan.hf_config(c, family="gpt"), "family")
        self.refused(lambda: commplan.hf_config(c, dtype="int8"), "int8")
        self.refused(lambda: commplan.hf_config(3), "config")


# ---- writer options ----------------------------------------------------------------------

class WriterOptions(Case):
    def setUp(self):
        super().setUp()
        self.units = fixture("fsdp4_named_params.json")["units"]
        self.model = commplan.hf_config(fixture("llama3_8b_config.json"))

    def test_wrong_option_types_are_plan_errors(self):
        pt = commplan.plan_text
        self.refused(lambda: pt("p", 4, self.model, fsdp="bf16"), "fsdp", "dict", "str")
        self.refused(lambda: pt("p", 4, self.model, parallel=[("dp_shard", 4)]), "parallel", "dict")
        self.refused(lambda: pt("p", 4, self.model, topology=8), "topology", "dict")
        self.refused(lambda: pt("p", 4, self.model, training="full"), "training", "dict")
        self.refused(lambda: pt("p", 4, [("family", "llama")]), "model", "dict")
        self.refused(lambda: pt("p", 4, self.model, comment=["x"]), "comment")
        self.refused(lambda: pt("p", 4.0, self.model), "world_size")
        self.refused(lambda: pt("p", True, self.model), "world_size")

    def test_booleans_are_booleans(self):
        pt = commplan.plan_text
        msg = self.refused(lambda: pt("p", 4, self.model, fsdp={"reshard_after_forward": "false"}),
                           "fsdp.reshard_after_forward", "True or False", "'false'")
        self.assertIn("False", msg)
        # (an int k >= 1 is fully_shard(reshard_after_forward=k): valid; 0, negatives and floats are not)
        for bad in (0, -2, 1.5, None, "true"):
            self.refused(lambda: pt("p", 4, self.model, fsdp={"reshard_after_forward": bad}),
                         "fsdp.reshard_after_forward")
        self.refused(lambda: pt("p", 4, self.model, training={"fp32_master": 1}), "training.fp32_master")
        self.refused(lambda: pt("p", 4, self.model, parallel={"tp": 2, "sequence_parallel": "no"}),
                     "parallel.sequence_parallel")
        self.refused(lambda: commplan.plan_from_named_parameters("p", self.units, 4,
                                                                 fsdp={"reshard_after_forward": "false"}),
                     "fsdp.reshard_after_forward")
        self.refused(lambda: commplan.plan_from_named_parameters(
            "p", [{"name": "a", "params": [["w", [4], "fp32"]], "reshard_after_forward": "false"},
                  {"name": "root", "params": []}], 4), "reshard_after_forward", "unit 1")

    def test_section_fields(self):
        pt = commplan.plan_text
        self.refused(lambda: pt("p", 4, self.model, parallel={"dp_shard": "4"}), "parallel.dp_shard", "integer")
        self.refused(lambda: pt("p", 4, self.model, parallel={"dp_shard": 4.0}), "parallel.dp_shard", "integer")
        self.refused(lambda: pt("p", 4, self.model, topology={"gpus_per_node": True}), "topology.gpus_per_node")
        self.refused(lambda: pt("p", 4, self.model, topology={"mfu": float("nan")}), "topology.mfu")
        self.refused(lambda: pt("p", 4, self.model, topology={"mfu": "0.5"}), "topology.mfu", "number")
        self.refused(lambda: pt("p", 4, self.model, fsdp={"param_dtype": "int8"}), "fsdp.param_dtype", "bf16")
        self.refused(lambda: pt("p", 4, self.model, training={"optimizer": "adam"}), "training.optimizer",
                     "adamw")
        msg = self.refused(lambda: pt("p", 4, self.model, fsdp={"reshard_after_fwd": True}),
                           "fsdp.reshard_after_fwd", "unknown")
        self.assertIn("reshard_after_forward", msg)  # did you mean
        self.refused(lambda: pt("p", 4, self.model, fsdp={1: True}), "fsdp", "key")
        self.refused(lambda: pt("p", 4, self.model, parallel={"dp_shard": {"x": 1}}), "parallel.dp_shard")
        # the right types still pass
        self.assertIn("reshard_after_forward = false", pt("p", 4, self.model, fsdp={"reshard_after_forward": False}))

    def test_units_shapes(self):
        pn = commplan.plan_from_named_parameters
        self.refused(lambda: pn("p", [{"name": "a", "params": 5}], 4), "params", "list")
        self.refused(lambda: pn("p", [{"name": "a", "params": None}], 4), "params", "list")
        self.refused(lambda: pn("p", [{"name": "a", "params": {"w": [4]}}], 4), "params", "list")
        self.refused(lambda: pn("p", "units", 4), "units")
        self.refused(lambda: pn("p", [["a", [["w", "32", "fp32"]]]], 4), "shape")
        self.refused(lambda: pn("p", [["a", [["w", [4], "fp32"]]]], 4, model=["n_heads", 4]), "model", "dict")
        self.refused(lambda: pn("p", [["a", [["w", [4], "fp32"]]]], 4, model={"n_heads": "4"}), "n_heads")
        self.refused(lambda: pn("p", [["a", [["w", [4], "fp32"]]]], 4, family=None), "family")
        self.refused(lambda: pn("p", [["a", [["w", [4], "fp32"]]]], 4, out=3), "out")
        self.refused(lambda: pn("p", [["a", [["w", [4], ["fp32"]]]]], 4), "dtype")
        self.refused(lambda: pn("p", [["a", [["w", [4], {}]]]], 4), "dtype")

    def test_model_tables(self):
        pt = commplan.plan_text
        self.refused(lambda: pt("p", 4, {"family": "llama", "size": 8}), "model.size")
        self.refused(lambda: pt("p", 4, {"family": "llama", "size": "7b"}), "model.size", "8b")
        self.refused(lambda: pt("p", 4, {"family": "llama", "dim": "4096"}), "model.dim")
        self.refused(lambda: pt("p", 4, {"family": ["llama"]}), "model.family")
        self.refused(lambda: pt("p", 4, {"family": "generic", "units": "x"}), "units")

    def test_module_options(self):
        self.refused(lambda: commplan.Unit(object(), reshard_after_forward="false"), "reshard_after_forward")
        self.refused(lambda: commplan.Unit(object(), name=3), "name")


# ---- reads: regular files only, bounded, no hang ------------------------------------------

class Reads(Case):
    def child_refuses(self, call, path, *words):
        """call (a Python expression over `p`) refuses path in a child within TIMEOUT: one line, exit 3."""
        r = run_py("""
            import sys, commplan
            from commplan import match
            p = sys.argv[1]
            try:
                %s
            except commplan.PlanError as e:
                print(e); sys.exit(3)
            print("accepted")
            """ % call, argv=[path])
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("\n"), 1, r.stdout)
        for w in (path,) + words:
            self.assertIn(w, r.stdout)
        return r.stdout

    def test_fifo_config_does_not_hang(self):
        fifo = self.path("config.json")
        os.mkfifo(fifo)
        self.child_refuses("commplan.hf_config(p)", fifo, "FIFO")
        self.child_refuses("commplan.hf_config(p)", self.tmp, "FIFO")  # the directory's config.json
        self.child_refuses("match.load_plan_json(p)", fifo, "FIFO")

    def test_fifo_swapped_in_after_stat_is_caught_by_fstat(self):
        # The name is a regular file when stat() looks and a FIFO when open() runs (a race, or a
        # stat that lies): the O_NONBLOCK open returns at once and fstat() on the descriptor refuses.
        fifo = self.path("config.json")
        os.mkfifo(fifo)
        reg = self.write_json("regular.json", {})
        r = run_py("""
            import os, sys, commplan
            real_stat, fifo, reg = os.stat, sys.argv[1], sys.argv[2]
            os.stat = lambda p, *a, **k: real_stat(reg if p == fifo else p, *a, **k)
            try:
                commplan.hf_config(fifo)
            except commplan.PlanError as e:
                print(e); sys.exit(3)
            """, argv=[fifo, reg])
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("%s is a FIFO" % fifo, r.stdout)

    def test_directory(self):
        d = self.path("config.json")
        os.mkdir(d)  # hf_config(dir) reads dir/config.json: here itself a directory
        self.refused(lambda: commplan.hf_config(self.tmp), d, "directory")
        self.refused(lambda: commplan.load_plan_json(self.tmp), self.tmp, "directory")

    def test_devices(self):
        for dev in ("/dev/zero", "/dev/null"):
            if os.path.exists(dev):
                self.child_refuses("commplan.hf_config(p)", dev, "character device")
                self.child_refuses("match.load_plan_json(p)", dev, "character device")

    def test_size_bound(self):
        big = self.path("config.json")
        with open(big, "wb") as f:
            f.truncate(1 << 30)  # sparse: no disk used
        self.child_refuses("commplan.hf_config(p)", big, "bytes", "limit")

    def test_missing_and_bad_paths(self):
        self.refused(lambda: commplan.hf_config(self.path("nope.json")), "nope.json", "No such file")
        self.refused(lambda: commplan.hf_config("a\0b"), "NUL")
        self.refused(lambda: commplan.load_plan_json(self.path("nope.json")), "nope.json")
        self.refused(lambda: commplan.load_plan_json(3.5), "plan.json")
        loop = self.path("loop.json")
        os.symlink(loop, loop)
        self.refused(lambda: commplan.hf_config(loop), loop)

    def test_symlinked_config_is_read(self):
        # Hugging Face caches keep config.json as a symlink into blobs/: reads follow symlinks
        real = self.write_json("blob", fixture("llama3_8b_config.json"))
        os.symlink(real, self.path("config.json"))
        self.assertEqual(commplan.hf_config(self.tmp)["family"], "llama")

    def test_plan_json_shape(self):
        for doc, word in (([], "JSON object"), ({"units": 3}, "units"), ({"units": [3]}, "units[0]"),
                          ({"units": [{"index": "0", "name": "root", "params": []}]}, "index"),
                          ({"units": [{"index": 0, "name": "root",
                                       "params": [{"name": 3, "shape": [4], "dtype": "fp32"}]}]},
                           "units[0].params[0].name"),
                          ({"units": [{"index": 0, "name": "root", "params": [{"name": "w", "shape": [4, True],
                                                                               "dtype": "fp32"}]}]},
                           "units[0].params[0].shape[1]")):
            p = self.write_json("plan.json", doc)
            self.refused(lambda: commplan.check_units_match_plan([("root", [["w", [4], "fp32"]])], p), p, word)


    def test_repeated_micro_step_is_expanded(self):
        # plans/hsdp2x3_bf16: 8 micro-steps, 3-6 one repeated row set (docs/plan-json.md `repeat`)
        with open(os.path.join(REPO, "plans", "hsdp2x3_bf16", "plan.json")) as f:
            raw = json.load(f)
        rep = raw["repeat"]
        plan = commplan.load_plan_json(raw)
        ops = plan["ops"]
        self.assertNotIn("repeat", plan)
        self.assertEqual(len(ops), raw["executed_ops"])
        self.assertEqual(len(ops), len(raw["ops"]) + (rep["times"] - 1) * rep["ops"])
        self.assertEqual([o["seq"] for o in ops], list(range(len(ops))))
        by_micro = {}
        for o in ops:
            self.assertNotIn("times", o)
            by_micro.setdefault(o["micro_step"], []).append((o["kind"], o["unit"], o["stream"], o.get("group")))
            for w in o.get("waits_for", []):
                self.assertLess(w, o["seq"])
        self.assertEqual(sorted(by_micro), list(range(raw["fsdp"]["micro_steps"])))
        for m in range(2, raw["fsdp"]["micro_steps"] - 1):  # micro-steps 1 .. M-2 issue the same ops
            self.assertEqual(by_micro[m], by_micro[1], "micro-step %d" % m)
        # each repetition waits for its own predecessors: a row's wait, moved one repetition per repetition
        first, n = rep["first_seq"], rep["ops"]
        for k in range(1, rep["times"]):
            for j in range(n):
                row, again = raw["ops"][first + j], ops[first + k * n + j]
                want = [w + k * n if w >= first - n else w for w in row.get("waits_for", [])]
                self.assertEqual(again.get("waits_for", []), want)
        for bad, word in (({"first_seq": 1, "ops": 38, "times": 4}, "repeat"),
                          ({"first_seq": first, "ops": n}, "repeat.times"),
                          ({"first_seq": first, "ops": n, "times": "4"}, "repeat.times")):
            doc = dict(raw)
            doc["repeat"] = bad
            self.refused(lambda: commplan.load_plan_json(doc), "plan.json", word)


# ---- writes: one helper, never through a symlink, every error reported ----------------------

class Writes(Case):
    TEXT = "return {}\n"

    def victim(self):
        v = self.path("victim.txt")
        with open(v, "w") as f:
            f.write("precious\n")
        return v

    def assert_victim(self, v):
        with open(v) as f:
            self.assertEqual(f.read(), "precious\n")

    def test_symlink_at_output_is_replaced(self):
        v = self.victim()
        out = self.path("p.lua")
        os.symlink(v, out)
        commplan.write_plan(out, self.TEXT)
        self.assertFalse(os.path.islink(out))
        with open(out) as f:
            self.assertEqual(f.read(), self.TEXT)
        self.assert_victim(v)

    def test_dangling_symlink_at_output_is_replaced(self):
        elsewhere = self.path("elsewhere")
        os.mkdir(elsewhere)
        out = self.path("p.lua")
        os.symlink(os.path.join(elsewhere, "created.lua"), out)
        commplan.write_plan(out, self.TEXT)
        self.assertFalse(os.path.islink(out))
        self.assertEqual(os.listdir(elsewhere), [])

    def test_symlink_at_old_temporary_name_is_not_followed(self):
        v = self.victim()
        out = self.path("p.lua")
        os.symlink(v, "%s.tmp.%d" % (out, os.getpid()))  # the name the writer used to open with O_TRUNC
        commplan.write_plan(out, self.TEXT)
        self.assert_victim(v)
        with open(out) as f:
            self.assertEqual(f.read(), self.TEXT)

    def test_out_directory_with_symlink(self):
        units = fixture("fsdp4_named_params.json")["units"]
        v = self.victim()
        os.symlink(v, self.path("fsdp4.lua"))
        text = commplan.plan_from_named_parameters("fsdp4", units, 4, out=self.tmp)
        self.assert_victim(v)
        self.assertFalse(os.path.islink(self.path("fsdp4.lua")))
        with open(self.path("fsdp4.lua")) as f:
            self.assertEqual(f.read(), text)

    def test_mode_follows_umask(self):
        out = self.path("p.lua")
        old = os.umask(0o077)
        try:
            commplan.write_plan(out, self.TEXT)
        finally:
            os.umask(old)
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o600)
        old = os.umask(0o022)
        try:
            commplan.write_plan(out, self.TEXT)
        finally:
            os.umask(old)
        self.assertEqual(stat.S_IMODE(os.stat(out).st_mode), 0o644)

    def test_special_targets_are_refused(self):
        self.refused(lambda: commplan.write_plan(self.tmp, self.TEXT), self.tmp, "directory")
        fifo = self.path("p.lua")
        os.mkfifo(fifo)
        self.refused(lambda: commplan.write_plan(fifo, self.TEXT), fifo, "FIFO")
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.refused(lambda: commplan.write_plan(self.path("no/such/dir/p.lua"), self.TEXT), "no/such/dir")
        self.refused(lambda: commplan.write_plan(self.path("q.lua"), 3), "text")
        self.refused(lambda: commplan.write_plan(None, self.TEXT), "path")
        self.refused(lambda: commplan.write_plan(self.path("q\0.lua"), self.TEXT), "NUL")
        self.refused(lambda: commplan.write_plan(self.path("q.lua"), "caf\u00e9"), "ASCII")

    def no_temporaries(self):
        left = [n for n in os.listdir(self.tmp) if n not in ("p.lua", "victim.txt")]
        self.assertEqual(left, [])

    def test_write_error_is_reported_and_old_file_kept(self):
        out = self.path("p.lua")
        with open(out, "w") as f:
            f.write("old\n")
        # a real write error: the file-size limit (EFBIG) in a child
        r = run_py("""
            import resource, signal, sys, commplan
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
            try:
                commplan.write_plan(sys.argv[1], "-- x\\n" * 1000)
            except commplan.PlanError as e:
                print(e); sys.exit(3)
            """, argv=[out])
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("\n"), 1, r.stdout)
        self.assertIn(out, r.stdout)
        with open(out) as f:
            self.assertEqual(f.read(), "old\n")
        self.no_temporaries()

    def test_fsync_and_close_errors_are_reported(self):
        out = self.path("p.lua")
        with open(out, "w") as f:
            f.write("old\n")
        for fn in ("write", "fsync", "close"):
            real = getattr(os, fn)
            calls = []

            def failing(*a, _real=real, _fn=fn):
                calls.append(1)
                if _fn == "close":
                    _real(*a)  # the descriptor is closed, the error still reported (NFS reports here)
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            setattr(os, fn, failing)
            try:
                self.refused(lambda: commplan.write_plan(out, self.TEXT), out, os.strerror(errno.EIO))
            finally:
                setattr(os, fn, real)
            self.assertTrue(calls, fn)
            with open(out) as f:
                self.assertEqual(f.read(), "old\n", fn)
            self.no_temporaries()

    def test_short_writes_are_completed(self):
        out = self.path("p.lua")
        real = os.write
        os.write = lambda fd, b: real(fd, bytes(b)[:7])
        try:
            commplan.write_plan(out, "-- " + "x" * 100 + "\n")
        finally:
            os.write = real
        with open(out) as f:
            self.assertEqual(f.read(), "-- " + "x" * 100 + "\n")


# ---- the CLI -----------------------------------------------------------------------------

class Cli(Case):
    def setUp(self):
        super().setUp()
        self.cfg = self.write_json("config.json", fixture("llama3_8b_config.json"))

    def one_line(self, r, rc=2):
        self.assertEqual(r.returncode, rc, r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertTrue(r.stderr.startswith("commplan: "), r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        return r.stderr

    def test_writes_plan_to_stdout_and_file(self):
        r = cli("hf", self.cfg, "--name", "llama8b", "--world-size", "64", "--seq-len", "8192")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('family = "llama", size = "8b"', r.stdout)
        out = self.path("llama8b.lua")
        v = self.path("victim.txt")
        with open(v, "w") as f:
            f.write("precious\n")
        os.symlink(v, out)
        r2 = cli("hf", self.cfg, "--name", "llama8b", "--world-size", "64", "--seq-len", "8192", "-o", out)
        self.assertEqual((r2.returncode, r2.stdout), (0, ""), r2.stderr)
        with open(out) as f:
            self.assertEqual(f.read(), r.stdout)
        with open(v) as f:
            self.assertEqual(f.read(), "precious\n")

    def test_units_and_options_files(self):
        units = self.write_json("units.json", fixture("fsdp4_named_params.json"))
        opts = self.write_json("opts.json", {"parallel": {"dp_shard": -1}, "fsdp": {"reshard_after_forward": True}})
        r = cli("units", units, "--name", "fsdp4", "--world-size", "4", "--options", opts)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, commplan.plan_from_named_parameters(
            "fsdp4", fixture("fsdp4_named_params.json")["units"], 4, parallel={"dp_shard": -1},
            fsdp={"reshard_after_forward": True}))
        bad = self.write_json("bad.json", {"fsdp": {"reshard_after_forward": "false"}})
        msg = self.one_line(cli("units", units, "--name", "fsdp4", "--world-size", "4", "--options", bad))
        self.assertIn("%s: fsdp.reshard_after_forward: expected true or false" % bad, msg)
        bad = self.write_json("bad2.json", {"fsdp": "bf16"})
        self.one_line(cli("units", units, "--name", "fsdp4", "--world-size", "4", "--options", bad))
        bad = self.write_json("bad3.json", {"fsdb": {}})
        self.assertIn("fsdp", self.one_line(cli("units", units, "--name", "fsdp4", "--world-size", "4", "--options",
                                                bad)))
        bad = self.write_json("bad4.json", [{"name": "a"}])
        self.one_line(cli("units", bad, "--name", "fsdp4", "--world-size", "4"))

    def test_bad_input_is_one_line_exit_2(self):
        arr = self.write_json("arr.json", [1])
        for args in (("hf", arr, "--name", "x", "--world-size", "4"),
                     ("hf", self.cfg, "--name", "x", "--world-size", "four"),
                     ("hf", self.cfg, "--name", "x"),
                     ("hf", self.cfg, "--name", "cp_x", "--world-size", "4"),
                     ("hf", self.cfg, "--name", "x", "--world-size", "4", "--frobnicate"),
                     ("nosuchverb",),
                     (),
                     ("hf", self.path("missing.json"), "--name", "x", "--world-size", "4"),
                     ("hf", self.cfg, "--name", "x", "--world-size", "4", "--family", "gpt")):
            r = cli(*args)
            self.one_line(r)
            self.assertEqual(r.stdout, "", args)

    def test_fifo_operand_exits_2(self):
        fifo = self.path("fifo.json")
        os.mkfifo(fifo)
        self.assertIn("FIFO", self.one_line(cli("hf", fifo, "--name", "x", "--world-size", "4")))
        self.assertIn("FIFO", self.one_line(cli("hf", self.cfg, "--name", "x", "--world-size", "4", "--options",
                                                fifo)))

    def test_stdout_write_errors(self):
        if os.path.exists("/dev/full"):
            with open("/dev/full", "w") as full:
                r = cli("hf", self.cfg, "--name", "llama8b", "--world-size", "64", stdout=full)
            msg = self.one_line(r, rc=1)
            self.assertIn("stdout", msg)
        rfd, wfd = os.pipe()
        os.close(rfd)  # nobody reads: EPIPE (Python ignores SIGPIPE)
        try:
            r = cli("hf", self.cfg, "--name", "llama8b", "--world-size", "64", stdout=wfd)
        finally:
            os.close(wfd)
        self.assertIn("stdout", self.one_line(r, rc=1))

    def test_output_write_error(self):
        out = self.path("llama8b.lua")
        r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import resource, runpy, signal, sys
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
            sys.argv = ["commplan"] + sys.argv[1:]
            runpy.run_module("commplan", run_name="__main__")
            """), "hf", self.cfg, "--name", "llama8b", "--world-size", "64", "-o", out], env=child_env(),
            timeout=TIMEOUT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.assertIn(out, self.one_line(r, rc=1))
        self.assertEqual(os.listdir(self.tmp), ["config.json"])

    def test_help(self):
        r = cli("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("hf", r.stdout)


# ---- the validator's schema is the generator's -------------------------------------------

# ---- expert counts (the libraries' set_expert_counts, before ctypes) ----------------------

class ExpertCounts(Case):
    """commplan.validate.check_expert_counts: what HostLibrary / GpuLibrary.set_expert_counts
    pass to the library's int64 counts. Exact integers in int64 or one PlanError line naming the
    expert and the value; int() would have truncated 2.5 to 2 and True to 1, and ctypes would
    have kept the low 64 bits of 2^64 + 1 (1 token). tests/python/ep_library.py holds the same
    cases through the library under torchrun: refused on every member of the exchange."""

    def check(self, counts):
        from commplan.validate import check_expert_counts
        return check_expert_counts(counts, "rank 1: set_expert_counts(unit 3)")

    def test_exact_integers_pass_unchanged(self):
        self.assertEqual(self.check([0, 7, 3, 0]), [0, 7, 3, 0])
        self.assertEqual(self.check((1, 2)), [1, 2])
        got = self.check([(1 << 63) - 1, -(1 << 63)])  # the int64 ends pass: the library says range and capacity
        self.assertEqual(got, [(1 << 63) - 1, -(1 << 63)])
        self.assertTrue(all(type(v) is int for v in got))
        self.assertEqual(self.check([-1]), [-1])  # the library refuses it, naming the member and capacity

    def test_huge_and_long_inputs_refused_in_one_line(self):
        # an int past 4,300 digits: named by its bits (str() of it raises ValueError in Python 3.11+,
        # which set_expert_counts did not catch: the rank left the exchange)
        self.refused(lambda: self.check([0, 2 ** 20000]), "count for expert 1 is an integer of 20001 bits")

        class Huge:  # an array far past any plan's experts: refused before tolist() copies it
            ndim = 1

            def __len__(self):
                return 10 ** 8

            def __iter__(self):
                return iter(())

            def tolist(self):
                raise AssertionError("tolist() called before the length was bounded")
        self.refused(lambda: self.check(Huge()), "100000000 entries, more than any plan's experts")

    def test_integer_like_scalars_pass(self):
        class Index:  # any exact integer type (numpy's and torch's integer scalars have __index__)
            def __index__(self):
                return 5
        self.assertEqual(self.check([Index(), 2]), [5, 2])

    def test_fractions_bools_and_strings_are_refused(self):
        for bad, word in ((2.5, "float 2.5"), (2.0, "float 2.0"), (float("nan"), "float nan"),
                          (float("inf"), "float inf"), (True, "bool True"), (False, "bool False"),
                          ("3", "str '3'"), (None, "NoneType"), ([1], "list")):
            msg = self.refused(lambda: self.check([1, bad, 0]), "rank 1: set_expert_counts(unit 3): count for "
                               "expert 1 is ", word, "not a whole number of tokens", "pass integers")
            self.assertTrue(msg.startswith("rank 1: set_expert_counts(unit 3): "), msg)

    def test_past_int64_is_refused_not_wrapped(self):
        for v in (1 << 64 | 1, 1 << 63, -(1 << 63) - 1, -(1 << 64) + 1, 10 ** 40):
            self.refused(lambda: self.check([0, v]), "count for expert 1 is ", "outside the libraries' int64 counts",
                         "capacity")
        self.refused(lambda: self.check([10 ** 40]), "an integer of 133 bits")

    def test_shapes_are_refused(self):
        self.refused(lambda: self.check(5), "expected a list of token counts", "int 5")
        self.refused(lambda: self.check("12"), "expected a list of token counts")
        self.refused(lambda: self.check({0: 1}), "expected a list of token counts")
        self.refused(lambda: self.check(range(1 << 21)), "entries, more than any plan's experts")

        class Array2D:  # a numpy array or torch tensor of two dimensions
            ndim = 2

            def tolist(self):
                return [[1, 2]]
        self.refused(lambda: self.check(Array2D()), "expected a 1-D sequence", "2 dimensions")

    def test_fuzzed_counts_exact_or_one_line(self):
        """Seeded mixed inputs (ints at and past the int64 ends, floats, bools, strings, nesting):
        each list comes back exactly (same ints, same length) or is refused with one PlanError
        line naming the first bad expert; nothing is truncated, wrapped or raised raw."""
        import random
        rnd = random.Random(33)
        edges = [0, 1, 7, (1 << 63) - 1, 1 << 63, -(1 << 63), -(1 << 63) - 1, 1 << 64, (1 << 64) + 1, -1]
        others = [0.5, 2.0, -0.0, float("nan"), True, False, "1", b"1", None, [1], (2,), {}]
        n = 0
        for _ in range(2000):
            vals = [rnd.choice(edges) if rnd.random() < 0.8 else rnd.choice(others) for _ in range(rnd.randint(0, 6))]
            bad = next((e for e, v in enumerate(vals) if type(v) is not int or not -(1 << 63) <= v < (1 << 63)), None)
            if bad is None:
                self.assertEqual(self.check(vals), vals)
            else:
                self.refused(lambda: self.check(vals), "count for expert %d is " % bad)
            n += 1
        self.assertEqual(n, 2000)

    def test_numpy_values(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed for %s (ep_library.py checks it under torch)" % sys.executable)
        self.assertEqual(self.check(np.array([3, 0, 4], dtype=np.int64)), [3, 0, 4])
        self.assertEqual(self.check([np.int32(2), np.uint8(1)]), [2, 1])
        self.refused(lambda: self.check([np.float64(2.0)]), "expert 0", "not a whole number")
        self.refused(lambda: self.check([np.bool_(True)]), "expert 0", "bool")
        self.refused(lambda: self.check([np.uint64((1 << 64) - 1)]), "outside the libraries' int64 counts")
        self.refused(lambda: self.check(np.array([[1, 2]])), "2 dimensions")
        self.refused(lambda: self.check(np.array([1.5, 2.0])), "float 1.5")


class SchemaAgreesWithGenerator(unittest.TestCase):
    def test_option_sections_match_gen_load(self):
        from commplan import validate
        lua = os.environ.get("LUA", "lua5.4")
        code = ("package.path = %r .. '/?.lua;' .. package.path\n"
                "local S = require('gen.load').SCHEMA\n"
                "for _, sec in ipairs({'parallel', 'fsdp', 'topology', 'training', 'pipeline'}) do\n"
                "  for k, spec in pairs(S[sec]) do\n"
                "    print(sec .. ' ' .. k .. ' ' .. spec[1] .. ' ' .. table.concat(spec.enum or {}, ','))\n"
                "  end\nend\n" % REPO)
        try:
            r = subprocess.run([lua, "-e", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=TIMEOUT)
        except FileNotFoundError:
            self.skipTest("%s is not installed" % lua)
        self.assertEqual(r.returncode, 0, r.stderr)
        gen = set()
        for line in r.stdout.splitlines():
            parts = line.split(" ")
            gen.add((parts[0], parts[1], parts[2], tuple(sorted(parts[3].split(","))) if parts[3] else ()))
        mine = set()
        for sec, fields in validate.SECTIONS.items():
            for k, spec in fields.items():
                mine.add((sec, k, spec.kind, tuple(sorted(spec.enum or ()))))
        self.assertEqual(mine, gen)


if __name__ == "__main__":
    unittest.main()
