"""The `commplan` command's verbs (python/commplan/command.py, jobconfig.py; issue 38 items 1-4).

Every write flag with a bad value: exit 2, one line naming the flag and the fix, nothing written.
The torchtitan TOML job config: read, flags over it, a bad value, an unknown or a refused key.
Reproducible plans: the header's source and sha256, the recorded command writing the same bytes
from anywhere. The pipeline section. --family overriding model_type. check: the config edited,
the output stale, the plan edited by hand. generate beside the plan, never silently into a
git-ignored directory. Run as python3 -m commplan from this checkout (tests/python/test_new_user.py
runs the pip-installed command).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(REPO, "tests", "python", "fixtures")
sys.path.insert(0, os.path.join(REPO, "python"))

from commplan import jobconfig  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
ENV.pop("COMMPLAN_ROOT", None)
TIMEOUT = 300

JOB_TOML = """# torchtitan's train_configs/llama3_8b.toml, as torchtitan <= 0.2 reads it
[job]
dump_folder = "./outputs"

[model]
name = "llama3"
flavor = "8B"

[optimizer]
name = "AdamW"
lr = 3e-4

[training]
local_batch_size = 2
seq_len = 4096
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 2
pipeline_parallel_degree = 1
context_parallel_degree = 1
pipeline_parallel_schedule = "1F1B"

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"

[compile]
enable = false
"""


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def cp(args, cwd):
    r = subprocess.run([sys.executable, "-m", "commplan"] + args, cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=TIMEOUT)
    return r.returncode, r.stdout, r.stderr


class Scratch(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="commplan-cli-")
        os.makedirs(os.path.join(self.d, "models"))
        shutil.copy(os.path.join(FIX, "llama3_8b_config.json"), os.path.join(self.d, "models", "config.json"))

    def tearDown(self):
        shutil.rmtree(self.d, ignore_errors=True)

    def path(self, *p):
        return os.path.join(self.d, *p)

    def refused(self, args, *words, rc=2):
        got, out, err = cp(args, self.d)
        self.assertEqual(got, rc, "%s: rc %d, stderr %r" % (args, got, err))
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, "%s: not one line: %r" % (args, err))
        for w in words:
            self.assertIn(w, lines[0], args)
        return lines[0]


BASE = ["models/config.json", "--name", "p", "--world-size", "8"]

# flag -> bad values (each refused naming the flag); "FLAG" stands for the flag itself.
BAD = {
    "world_size": ["x", "0", "-2", "1.5", "99999999999999"],
    "dp_replicate": ["x", "0", "-1"], "dp_shard": ["0", "-2", "y"], "tp": ["two", "0"], "cp": ["0", "z"],
    "pp": ["0", "p"], "ep": ["0", "e"], "etp": ["0", "q"], "schedule": ["1f1b", "Bogus"],
    "microbatches": ["0", "m", "2000"], "microbatch_size": ["0", "s"], "layers_per_stage": ["0", "l"],
    "first_stage_less_layers": ["-1", "f"], "last_stage_less_layers": ["-1", "g"],
    "seq_len": ["0", "4k"], "local_batch_size": ["0", "b"], "global_batch_size": ["0", "-3", "g"],
    "ac": ["some", "on"], "dtype": ["int8", "float64"], "param_dtype": ["int8"], "reduce_dtype": ["fp8"],
    "reshard_after_forward": ["sometimes"], "async_tp": ["yes", "1"], "sequence_parallel": ["no"],
    "loss_parallel": ["maybe"], "compile": ["on"], "symm_mem": ["on", "2"], "cpu_offload": ["yes", "1"], "preset": ["v100", "H100x"], "gpus_per_node": ["0", "n"],
    "family": ["gpt2", "llama4"], "optimizer_implementation": ["fused_bf16", "Fused"],
    "schedule_csv": ["", "a b.csv"],
    "fused": ["fused_gelu", "swiglu,swiglu", "torchtitan.overrides.helion_rope.helion_cos_sin_rope"],
    # issue 41 (hlora): torchtitan's SPMD backend and LoRA converter
    "spmd_backend": ["dtensor", "SPMD_types"], "lora_rank": ["0", "r", "-4"], "lora_target_modules": ["w q", "wq,,wo"],
}


class Flags(Scratch):
    def test_every_flag_has_a_bad_value_test(self):
        self.assertEqual(set(BAD), {s.key for s in jobconfig.SETTINGS})

    def test_every_flag_bad_value_one_line_nothing_written(self):
        for s in jobconfig.SETTINGS:
            for v in BAD[s.key]:
                args = [a for a in BASE] + ["-o", "plans/p.lua"]
                if s.key == "world_size":
                    args[args.index("--world-size") + 1] = v
                else:
                    args += [s.flag, v]
                line = self.refused(["write"] + args, s.flag)
                self.assertRegex(line, r"give|set|drop", args)
                self.assertFalse(os.path.exists(self.path("plans")), "%s wrote something" % args)

    def test_cross_checks_name_the_flag(self):
        cases = [
            (["--tp", "3"], "--world-size", "parallel_dims.py"),          # 8 ranks not a multiple of 3
            (["--dp-shard", "2", "--tp", "2"], "--world-size", "give --world-size 4"),
            (["--schedule", "1F1B"], "--schedule", "--pp"),
            (["--lora-rank", "4"], "--lora-rank", "--titan"),                # LoRA converts torchtitan's own model
            (["--lora-target-modules", "wq"], "--lora-target-modules", "--lora-rank"),
            (["--microbatches", "4"], "--microbatches", "--pp"),
            (["--async-tp", "true"], "--async-tp", "--tp"),
            (["--local-batch-size", "2", "--global-batch-size", "6"], "--global-batch-size", "trainer.py"),
            # the generator's own refusal, the flag named after it
            (["--pp", "2", "--local-batch-size", "8", "--microbatches", "3"], "--microbatches", "pipeline."),
            (["--ep", "3"], "parallel.ep", "--ep"),
        ]
        for extra, *words in cases:
            self.refused(["write"] + BASE + extra + ["-o", "plans/p.lua"], *words)
            self.assertFalse(os.path.exists(self.path("plans")), extra)

    def test_other_arguments(self):
        self.refused(["write", "models/config.json", "--world-size", "8"], "--name")
        self.refused(["write", "--name", "p", "--world-size", "8"], "CONFIG", "give a config.json")
        self.refused(["write", "models/nope.json", "--name", "p", "--world-size", "8"], "nope.json")
        self.refused(["write"] + BASE + ["-o", "plans/q.lua"], "-o", "p.lua")
        self.refused(["write"] + BASE[:2] + ["bad name"] + BASE[3:], "plan name")
        self.refused(["write"] + BASE + ["--job-config", "nope.toml"], "nope.toml")
        self.refused(["write"] + BASE + ["--titan", "gpt2:small"], "--titan")
        self.refused(["write"] + BASE + ["--tpp", "2"], "--tpp")
        for verb in ("generate", "audit", "check", "advise"):
            self.refused([verb, "plans/nope.lua"], "nope.lua", "give the path")
        self.refused(["generate", "models/config.json"], "<name>.lua")
        self.refused(["advise", "models/config.json", "--top", "x"], "--top", "give")
        self.refused(["frobnicate"], "frobnicate")


class JobConfig(Scratch):
    def job(self, text):
        with open(self.path("job.toml"), "w") as f:
            f.write(text)

    def test_read_and_flags_override(self):
        self.job(JOB_TOML)
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        text = read(self.path("plans", "p.lua"))
        self.assertIn("parallel = { dp_shard = -1, tp = 2 }", text)
        self.assertIn('training = { local_batch_size = 2, activation_checkpointing = "selective", compile = false }',
                      text)
        self.assertIn("seq_len = 4096", text)
        self.assertIn("-- job config: ../job.toml sha256 ", text)
        self.assertNotIn("pipeline =", text)  # the job config's 1F1B without pp: torchtitan's default, unused
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "--tp", "1", "--ac", "full", "-o",
                                              "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        text = read(self.path("plans", "p.lua"))
        self.assertIn("parallel = { dp_shard = -1 }", text)
        self.assertIn('activation_checkpointing = "full"', text)

    def test_symm_mem_read(self):
        # parallelism.enable_fsdp_symm_mem (torchtitan distributed/fsdp.py:44-51) -> fsdp.symm_mem; the flag too
        self.job(JOB_TOML.replace("tensor_parallel_degree = 2", "tensor_parallel_degree = 2\nenable_fsdp_symm_mem = true"))
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertIn("symm_mem = true", read(self.path("plans", "p.lua")))
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "--symm-mem", "false", "-o",
                                              "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("symm_mem = true", read(self.path("plans", "p.lua")))
        # torchtitan refuses it below compute capability 9.0 (config/configs.py:267-278): so does the plan
        self.refused(["write"] + BASE + ["--job-config", "job.toml", "--preset", "a100", "-o", "plans/p.lua"],
                     "fsdp.symm_mem", "configs.py:267-278")

    def test_cpu_offload_read(self):
        # training.enable_cpu_offload (torchtitan distributed/fsdp.py:173-174: CPUOffloadPolicy() on every
        # fully_shard) -> fsdp.cpu_offload; the flag overrides it; the plan generates (its H2D/D2H copies)
        self.job(JOB_TOML.replace("seq_len = 4096", "seq_len = 4096\nenable_cpu_offload = true"))
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertIn("cpu_offload = true", read(self.path("plans", "p.lua")))
        rc, out, err = cp(["generate", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertIn('"cpu_offload": true', read(self.path("plans", "p", "plan.json")))
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "--cpu-offload", "false", "-o",
                                              "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("cpu_offload = true", read(self.path("plans", "p.lua")))

    def test_reshard_policy(self):
        # issue 41 (h41a): parallelism.fsdp_reshard_after_forward is the plan's policy, not a bool: "always"
        # reshards torchtitan's [norm, output] unit too (distributed/fsdp.py:196-204)
        for pol in ("always", "never", "default"):
            self.job(JOB_TOML.replace("[parallelism]\n", '[parallelism]\nfsdp_reshard_after_forward = "%s"\n' % pol))
            rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
            self.assertEqual(rc, 0, err)
            text = read(self.path("plans", "p.lua"))
            if pol == "default":
                self.assertNotIn("reshard_after_forward", text.split("-- settings")[0] + text.split("return {")[1])
            else:
                self.assertIn('reshard_after_forward_policy = "%s"' % pol, text)
                self.assertNotIn("reshard_after_forward =", text.split("return {")[1])
            self.assertIn('family = "llama"', text)  # still the llama family, its [norm, output] by the policy

    def test_bf16_optimizer_states(self):
        # issue 41 (h41a): optimizer.implementation = "fused_opt_states_bf16" -> training.optimizer_implementation
        # (AdamW's moments in bf16); "foreach" changes nothing planned and is not written
        for impl, written in (("fused_opt_states_bf16", True), ("foreach", False)):
            self.job(JOB_TOML.replace("[optimizer]\n", '[optimizer]\nimplementation = "%s"\n' % impl))
            rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
            self.assertEqual(rc, 0, err)
            body = read(self.path("plans", "p.lua")).split("return {")[1]
            self.assertEqual('optimizer_implementation = "fused_opt_states_bf16"' in body, written, body)
        self.job(JOB_TOML.replace("[optimizer]\n", '[optimizer]\nimplementation = "fusedd"\n'))
        self.refused(["write"] + BASE + ["--job-config", "job.toml"], "optimizer.implementation", "fused")

    def test_schedule_csv(self):
        # issue 41 (h41a): parallelism.pipeline_parallel_schedule_csv with "PipelineScheduleMulti" -> pipeline.csv,
        # relative to the plan's directory (where the generator reads it)
        toml = JOB_TOML.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2").replace(
            'pipeline_parallel_schedule = "1F1B"', 'pipeline_parallel_schedule = "PipelineScheduleMulti"\n'
            'pipeline_parallel_schedule_csv = "plans/sched.csv"').replace("tensor_parallel_degree = 2",
                                                                          "tensor_parallel_degree = 1")
        self.job(toml)
        os.makedirs(self.path("plans"), exist_ok=True)
        with open(self.path("plans", "sched.csv"), "w") as f:  # 2 stages per rank, 2 microbatches (local batch 2)
            f.write("0F0,0F1,2F0,2B0,2F1,2B1,0B0,0B1\r\n,1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1\r\n")
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        text = read(self.path("plans", "p.lua"))
        self.assertIn('schedule = "PipelineScheduleMulti"', text)
        self.assertIn('csv = "sched.csv"', text)
        # a CSV outside the plan's directory: refused, naming the flag
        self.job(toml.replace('"plans/sched.csv"', '"sched.csv"'))
        self.refused(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], "--schedule-csv",
                     "not below the plan's directory")
        # torchtitan's default "" is no CSV
        self.job(toml.replace('"plans/sched.csv"', '""').replace('"PipelineScheduleMulti"', '"Interleaved1F1B"'))
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("csv =", read(self.path("plans", "p.lua")))

    def test_model_from_the_job_config_needs_torchtitan_or_a_config(self):
        self.job(JOB_TOML)
        rc, out, err = cp(["write", "--name", "p", "--world-size", "8", "--job-config", "job.toml"], self.d)
        try:
            import torchtitan  # noqa: F401
            self.assertEqual(rc, 0, err)
            self.assertIn("-- source: torchtitan llama3:8B", out)
        except ImportError:
            self.assertEqual(rc, 2)
            self.assertIn("--titan: torchtitan is not importable", err)

    def test_bad_keys(self):
        cases = [
            ("tensor_parallel_degree = 2", "tensor_parallel_degree = \"2\"", "parallelism.tensor_parallel_degree"),
            ("tensor_parallel_degree = 2", "tensor_paralel_degree = 2", "did you mean tensor_parallel_degree"),
            ("tensor_parallel_degree = 2", "tensor_parallel_degree = 2\nenable_compiled_autograd = true",
             "enable_compiled_autograd"),
            ("tensor_parallel_degree = 2", "tensor_parallel_degree = 2\nenable_fsdp_symm_mem = 1",
             "parallelism.enable_fsdp_symm_mem"),
            ("seq_len = 4096", "seq_len = 0", "training.seq_len"),
            ("mode = \"selective\"", "mode = \"sometimes\"", "activation_checkpoint.mode"),
            ("enable = false", "enable = 1", "compile.enable"),
            ("seq_len = 4096", "seq_len = 4096\nenable_cpu_offload = 1", "training.enable_cpu_offload"),
            ("[job]", "[job", "not TOML"),
        ]
        for old, new, word in cases:
            self.assertIn(old, JOB_TOML)
            self.job(JOB_TOML.replace(old, new, 1))
            self.refused(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], "job.toml", word)
            self.assertFalse(os.path.exists(self.path("plans")), new)
        # ignored: keys with no communication in them, sections commplan does not read
        self.job(JOB_TOML.replace("steps = 1000", "steps = 1000\nmax_norm = 1.0\ngc_freq = 50")
                 + "\n[metrics]\nlog_freq = 10\n[checkpoint]\nenable = true\n")
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml"], self.d)
        self.assertEqual(rc, 0, err)
        # a 10,000-character key or [model] name: the line shows a bounded part of it
        self.job(JOB_TOML.replace("tensor_parallel_degree = 2", "%s = 2" % ("k" * 10000), 1))
        line = self.refused(["write"] + BASE + ["--job-config", "job.toml"], "job.toml: parallelism.kkk",
                            "unknown key")
        self.assertLess(len(line), 400, line)
        self.job(JOB_TOML.replace('name = "llama3"', 'name = "%s"' % ("m" * 10000), 1))
        line = self.refused(["write", "--name", "p", "--world-size", "8", "--job-config", "job.toml"], "mmm",
                            "give llama3:FLAVOR")
        self.assertLess(len(line), 400, line)
        with open(self.path("big.toml"), "wb") as f:
            f.write(b"# " + b"x" * (jobconfig.JOB_CONFIG_MAX + 10) + b"\n")
        self.refused(["write"] + BASE + ["--job-config", "big.toml"], "big.toml")


class Reproducible(Scratch):
    def test_header_and_command_reproduce_the_bytes(self):
        args = BASE + ["--tp", "2", "--seq-len", "4096", "--local-batch-size", "2", "--ac", "selective",
                       "--dtype", "bf16", "-o", "plans/p.lua"]
        rc, out, err = cp(["write"] + args, self.d)
        self.assertEqual(rc, 0, err)
        first = read(self.path("plans", "p.lua"), "rb")
        text = first.decode()
        import hashlib
        sha = hashlib.sha256(read(self.path("models", "config.json"), "rb")).hexdigest()
        self.assertIn("-- source: config ../models/config.json sha256 %s\n" % sha, text)
        self.assertIn("-- settings: world_size=8 tp=2 seq_len=4096 local_batch_size=2 ac=selective dtype=bf16\n", text)
        cmd = ("-- command (run in this file's directory): commplan write ../models/config.json --name p "
               "--world-size 8 --tp 2 --seq-len 4096 --local-batch-size 2 --ac selective --dtype bf16 -o p.lua\n")
        self.assertIn(cmd, text)
        self.assertNotIn(self.d, text)  # no path of this machine
        # the same plan from another directory, and the recorded command run where it says
        os.remove(self.path("plans", "p.lua"))
        rc, out, err = cp(["write", "../models/config.json"] + args[1:-1] + ["p.lua"], self.path("plans"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(read(self.path("plans", "p.lua"), "rb"), first)
        recorded = cmd.split(": ", 1)[1].split()[1:]
        os.remove(self.path("plans", "p.lua"))
        rc, out, err = cp(recorded, self.path("plans"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(read(self.path("plans", "p.lua"), "rb"), first)
        # a changed setting changes the bytes (the test can fail)
        rc, out, err = cp(["write"] + args[:-2] + ["--seq-len", "2048", "-o", "plans/p.lua"], self.d)
        self.assertNotEqual(read(self.path("plans", "p.lua"), "rb"), first)


class Pipeline(Scratch):
    def test_pipeline_section_written_and_generated(self):
        rc, out, err = cp(["write"] + BASE + ["--pp", "2", "--schedule", "Interleaved1F1B", "--microbatches", "4",
                                              "--local-batch-size", "8", "--ac", "full", "-o", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        text = read(self.path("plans", "p.lua"))
        self.assertIn('pipeline = { schedule = "Interleaved1F1B", microbatches = 4 },', text)
        self.assertIn("parallel = { dp_shard = -1, pp = 2 }", text)
        rc, out, err = cp(["generate", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        sched = read(self.path("plans", "p", "SCHEDULE.md"))
        self.assertIn("Interleaved1F1B", sched)

    def test_options_json_takes_pipeline(self):
        with open(self.path("opts.json"), "w") as f:
            json.dump({"parallel": {"pp": 2}, "training": {"local_batch_size": 4},
                       "pipeline": {"schedule": "GPipe", "microbatches": 2}}, f)
        rc, out, err = cp(["hf", "models/config.json", "--name", "p", "--world-size", "8", "--options", "opts.json"],
                          self.d)
        self.assertEqual(rc, 0, err)
        self.assertIn('pipeline = { schedule = "GPipe", microbatches = 2 },', out)


class Families(Scratch):
    def test_family_override_and_refusal(self):
        for fx, fam, want in (("deepseek_v2_lite_config.json", None, 'family = "deepseek_v3"'),
                              ("deepseek_v2_config.json", "deepseek_v3", 'family = "deepseek_v3"'),
                              ("llama3_8b_config.json", "generic", 'family = "generic"'),
                              ("llama3_2_1b_config.json", None, "enable_weight_tying = true"),
                              ("qwen2_5_32b_config.json", None, 'family = "generic"')):
            args = ["write", os.path.join(FIX, fx), "--name", "p", "--world-size", "8"]
            rc, out, err = cp(args + (["--family", fam] if fam else []), self.d)
            self.assertEqual(rc, 0, "%s: %s" % (fx, err))
            self.assertIn(want, out, fx)
        self.refused(["write", os.path.join(FIX, "llama3_8b_config.json"), "--name", "p", "--world-size", "8",
                      "--family", "mixtral"], "mixtral")


class Check(Scratch):
    def test_check_config_output_and_hand_edits(self):
        subprocess.run(["git", "init", "-q", self.d], check=True)
        args = ["write"] + BASE + ["--seq-len", "2048", "-o", "plans/p.lua"]
        self.assertEqual(cp(args, self.d)[0], 0)
        line = self.refused(["check", "plans/p.lua"], "never generated", "run commplan generate plans/p.lua",
                            rc=1)
        self.assertNotIn("make", line)
        rc, out, err = cp(["generate", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.isfile(self.path("plans", "p", "SCHEDULE.md")))
        rc, out, err = cp(["check", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertIn("up to date", out)
        rc, out, err = cp(["audit", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertIn("## Summary", out)
        self.assertNotIn("## Details", out)
        # the config edited: check names it and the command that rewrites the plan
        cfg = json.loads(read(self.path("models", "config.json")))
        cfg["num_hidden_layers"] = 30
        with open(self.path("models", "config.json"), "w") as f:
            json.dump(cfg, f)
        self.refused(["check", "plans/p.lua"], "config ../models/config.json changed", "commplan write", rc=1)
        self.assertEqual(cp(args, self.d)[0], 0)
        self.refused(["check", "plans/p.lua"], "stale generated files", rc=1)
        self.assertEqual(cp(["generate", "plans/p.lua"], self.d)[0], 0)
        self.assertEqual(cp(["check", "plans/p.lua"], self.d)[0], 0)
        # edited by hand
        with open(self.path("plans", "p.lua"), "a") as f:
            f.write("-- a reviewer's note\n")
        self.refused(["check", "plans/p.lua"], "differs from what its command writes", rc=1)

    def test_check_keeps_going_past_a_bad_plan(self):
        subprocess.run(["git", "init", "-q", self.d], check=True)
        self.assertEqual(cp(["write"] + BASE + ["-o", "plans/p.lua"], self.d)[0], 0)
        self.assertEqual(cp(["write", "models/config.json", "--name", "q", "--world-size", "8", "-o",
                             "plans/q.lua"], self.d)[0], 0)
        self.assertEqual(cp(["generate", "plans/q.lua"], self.d)[0], 0)
        os.makedirs(self.path("plans", "d.lua"))
        rc, out, err = cp(["check", "plans/nope.lua", "plans/d.lua", "plans/p.lua", "plans/q.lua"], self.d)
        lines = err.strip().splitlines()
        self.assertEqual(rc, 2, err)  # bad input outranks stale
        self.assertEqual(len(lines), 3, err)
        self.assertTrue(lines[0].startswith("commplan: plans/nope.lua: cannot read the plan file"), lines)
        self.assertTrue(lines[1].startswith("commplan: plans/d.lua"), lines)
        self.assertIn("plans/p.lua", lines[2])
        self.assertIn("never generated", lines[2])
        self.assertIn("up to date", out)  # q, after the bad ones
        rc, out, err = cp(["check", "plans/p.lua", "plans/q.lua"], self.d)
        self.assertEqual(rc, 1, err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_generate_never_silently_into_ignored(self):
        subprocess.run(["git", "init", "-q", self.d], check=True)
        with open(self.path(".gitignore"), "w") as f:
            f.write("build/\n")
        self.assertEqual(cp(["write"] + BASE + ["-o", "build/p.lua"], self.d)[0], 0)
        self.refused(["generate", "build/p.lua"], "git ignores", "--ignored-ok")
        self.assertFalse(os.path.exists(self.path("build", "p")))
        rc, out, err = cp(["generate", "--ignored-ok", "build/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.isfile(self.path("build", "p", "plan.json")))

    def test_help_lists_the_verbs(self):
        rc, out, err = cp(["--help"], self.d)
        self.assertEqual(rc, 0)
        for v in ("write", "generate", "audit", "diff", "advise", "check", "hf", "units"):
            self.assertIn(v, out)
        rc, out, err = cp(["write", "--help"], self.d)
        for s in jobconfig.SETTINGS:
            self.assertIn(s.flag, out)


class FusedLayouts(Scratch):
    """torchtitan's override.imports (fused_swiglu, fused_grouped_experts, fused_mla) as model.fused
    (gen/models/fused.lua); tests/titan/test_fused_plan.py holds the layouts to torchtitan's own."""

    def job(self, imports):
        with open(self.path("job.toml"), "w") as f:
            f.write(JOB_TOML.replace("tensor_parallel_degree = 2", "tensor_parallel_degree = 1")
                    + "\n[override]\nimports = %s\n" % imports)

    def test_override_imports_read_into_model_fused(self):
        self.job('["torchtitan.overrides.fused_swiglu.fused_swiglu", '
                 '"torchtitan.overrides.helion_rope.helion_complex_rope"]')
        rc, out, err = cp(["write"] + BASE + ["--job-config", "job.toml", "-o", "plans/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        text = read(self.path("plans", "p.lua"))
        self.assertIn('fused = { "swiglu" }', text)  # helion's RoPE kernel changes nothing planned
        self.assertIn("fused=swiglu", text)
        self.assertEqual(cp(["generate", "plans/p.lua"], self.d)[0], 0)
        plan = json.loads(read(self.path("plans", "p", "plan.json")))
        names = [q["name"] for u in plan["units"] for q in u["params"]]
        self.assertIn("layers.0.feed_forward.w13", names)
        self.assertNotIn("layers.0.feed_forward.w1.weight", names)
        # the flag gives the same plan body
        rc, out, err = cp(["write"] + BASE + ["--fused", "swiglu", "-o", "q/p.lua"], self.d)
        self.assertEqual(rc, 0, err)
        self.assertIn('fused = { "swiglu" }', read(self.path("q", "p.lua")))

    def test_refusals_one_line(self):
        self.job('["torchtitan.overrides.moe_token_dispatcher.deepep_override"]')
        self.refused(["write"] + BASE + ["--job-config", "job.toml"], "override.imports", "deepep_override", "give")
        self.job('"torchtitan.overrides.fused_swiglu.fused_swiglu"')
        self.refused(["write"] + BASE + ["--job-config", "job.toml"], "override.imports", "not a list")
        # the generator's refusal: the llama family has no MLA to fuse (torchtitan warns and replaces nothing)
        self.refused(["write"] + BASE + ["--fused", "mla"], "fused", "nothing", "override.py:503-512")


if __name__ == "__main__":
    unittest.main()
