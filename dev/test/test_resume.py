#!/usr/bin/env python3
"""Resume, end to end: a run interrupted (its checkpoint copied into a new directory, with its metrics.jsonl
or alone and resumed with --new-log 1, SIGTERM or SIGINT after a random step, kill -9 at random times, launched
ranks stopped by SIGTERM, a checkpoint of 2 ranks taken to 1 or 4) and then resumed must end as the same run
left alone: its final weights (or last checkpoint) bit for bit, its train losses, its metrics.jsonl lines without
duplicates, each case as the table CASES says (on other rank counts, which change the sums: every step logged, the
last loss near). train_gpt's and chat_sft's runs, on the CPU backend.

One table of cases, one uninterrupted reference run per configuration (made once, shared by the cases of
that configuration), one comparison (assert_same); one check per case. The random signal and kill
times are in every failure message, so that a failure can be replayed. Resume inside one process
(the step against the saved state, the loaders' positions, the optimizer's shards dealt to other rank
counts) is dev/test/test_infra.cu's; resumes that must be refused or fail cleanly are checked where
their runs are made (test_e2e.py, test_sft_train.py, test_bad_inputs.py), and the sharded optimizer's
checkpoint resumed by replicated ranks in test_launch.py.

    python3 dev/test/test_resume.py        (or all suites: make test)

Standard library only.
"""
import collections
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from craft import st_parse  # noqa: E402
from test_launch import launcher_env  # noqa: E402
from test_sft_train import BASE as SFT_BASE, MINI, SFT_EVAL  # noqa: E402
from xsatest import REPO, binary, read  # noqa: E402

# a model small enough for a few steps in about a second (2 rows x 32 tokens per micro-batch)
TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-tokens 256 --sample-every -1"
TIMING = ("dt_ms", "optimizer_ms", "tok_per_s", "mfu")  # the metrics fields that differ between two runs of the same steps
TIMEOUT = 120  # seconds for any one process (a hang is a failure, not a stuck suite)


# ----------------------------------------------------------------------------------------------------
# Configurations: what runs, with which flags. Each has one uninterrupted reference run (TestResume.reference):
# the flags plus `fresh` (the flags of a run that starts rather than resumes) plus `reference` (flags of the
# reference alone), in its own directory, exporting final.safetensors where `export`. `setup`: runs made
# once before it ({home} in any of the flags: the configuration's directory, which holds them).

class Config(collections.namedtuple("Config", "program flags fresh reference export setup")):
    def argv(self, home, run_dir, start, *extra, reference=False):
        """The command of a run of this configuration in run_dir; start: "-o" (a fresh run) or "--resume"."""
        words = lambda text: [w.replace("{home}", home) for w in shlex.split(text)]  # noqa: E731
        return ([binary(self.program)] + words(self.flags) + (words(self.fresh) if start == "-o" else []) +
                (words(self.reference) if reference else []) + list(extra) + [start, run_dir] +
                (["--export-safetensors", os.path.join(run_dir, "final.safetensors")] if self.export else []))


CONFIGS = {
    # the reference checkpoints at step 15 for the copy; the runs that are stopped do not (checkpoints change nothing logged)
    "train_gpt": Config("train_gpt_cpu", TINY + " --eval-every 5 --core-every -1 -x 1 -n 30", "", "--save-every 15", True, ()),
    # test_e2e.py's learnable-alpha run (CORE at the end, by default)
    "train_gpt -x learn": Config("train_gpt_cpu", TINY.replace("-d 1", "-d 2") + " --eval-every 3 -n 6 --save-every 3 -x learn --xsa-layers 1",
                                 "", "", True, ()),
    # SFT of a 4-step base model (test_sft_train.py's), one epoch of the mini mixture
    "chat_sft": Config("chat_sft", "--sft %s %s --save-every 5" % (MINI, SFT_EVAL), "--init-from {home}/base/ckpt_000004.safetensors", "", True,
                       (("train_gpt_cpu", SFT_BASE + " -n 4 -o {home}/base"),)),
    # 200 steps, so that a stop after step 10 lands well inside the run (190 steps later, about 1.7 s on the 2-core build
    # machine); the reference is --ranks 2 (forked ranks), which launched ranks equal bit for bit (test_launch.py)
    "train_gpt, 2 ranks, 200 steps": Config("train_gpt_cpu", TINY + " --eval-every 100 --core-every -1 -n 200", "", "--ranks 2", False, ()),
    # -B 256: a micro-batch per rank on 4 ranks; a shuffled data order, which resumes on any number of ranks too
    "train_gpt, 2 ranks, 8 steps": Config("train_gpt_cpu", TINY.replace("-B 128", "-B 256") + " --eval-every 3 --core-every -1 -n 8 --save-every 4 --data-seed 5",
                                          "", "--ranks 2", False, ()),
}


def start(argv, env=None):
    return subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(p):
    """(exit code, output) of a started process, killed after TIMEOUT."""
    try:
        out = p.communicate(timeout=TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        out = p.communicate()[0] + b"\n(killed after %d s)" % TIMEOUT
    return p.returncode, out.decode("utf-8", "replace")


def tail(text):
    return text[-2000:]


# ----------------------------------------------------------------------------------------------------
# How a run is interrupted. Each is called as interrupt(test, config, reference, run) and leaves in run.dir
# what the resume goes on from; it sets run.what (the interruption in words, random times included, the
# start of every failure message) and may set run.command (a resume command the run printed).

class Run:
    def __init__(self, home, case_dir):
        self.home, self.case_dir = home, case_dir
        self.dir = os.path.join(case_dir, "run")
        self.what, self.command = "", None


def copied(*names):
    """The reference's files `names` copied into a new directory (a checkpoint moved to another machine or
    directory; metrics.jsonl there still holds the lines the reference wrote after that checkpoint)."""
    def interrupt(test, config, ref, run):
        run.what = "%s copied into a new directory" % " and ".join(names)
        os.makedirs(run.dir)
        for name in names:
            test.assertTrue(os.path.exists(os.path.join(ref.dir, name)), "the uninterrupted run wrote no %s" % name)
            shutil.copy(os.path.join(ref.dir, name), run.dir)
    interrupt.text = "%s copied into a new directory" % " and ".join(names)
    return interrupt


def signalled(sig):
    """`sig` once the run has printed a random step within the first 20..60% of the reference's steps (a step, not
    a time: where start-up takes most of a short run, or the machine is busy, a signal at a random time may come
    before the first step, which stops the run at once with nothing to resume, or after the last): the run must
    stop after a step with exit code 128 + sig, its last line saying so and printing the command that resumes it."""
    def interrupt(test, config, ref, run):
        steps = sum(1 for m in metrics_lines(os.path.join(ref.dir, "metrics.jsonl")) if m["kind"] == "train")
        after = max(1, round(test.rng.uniform(0.2, 0.6) * steps))
        run.what = "%s after step %d of %d" % (sig.name, after, steps)
        p, printed = start(config.argv(run.home, run.dir, "-o")), b""
        for line in p.stdout:
            printed += line
            if line.startswith(b"step %d/" % after):
                break
        p.send_signal(sig)
        code, out = finish(p)
        out = printed.decode("utf-8", "replace") + out
        last = out.rstrip("\n").split("\n")[-1]
        test.assertEqual(code, 128 + sig, "%s: exit %d (want %d)\n%s" % (run.what, code, 128 + sig, tail(out)))
        test.assertTrue(last.startswith("stopped by %s after step " % sig.name) and "resume with: " in last,
                        "%s: last line %r" % (run.what, last))
        run.command = last.split("resume with: ", 1)[1].split()  # as a user would run it
    interrupt.text = "%s after a random step" % sig.name
    return interrupt


def killed(times):
    """kill -9 `times` times, each at a random time within 10..50% of the reference's duration after the start's first
    step line (so that the kills land in training whatever the machine's load makes of the start-up), with a
    checkpoint every step so that some kills land inside a checkpoint write; each start goes on from the last good
    checkpoint (or from scratch while there is none)."""
    def interrupt(test, config, ref, run):
        delays = []
        for _ in range(times):
            has_checkpoint = os.path.isdir(run.dir) and any(n.startswith("ckpt_") and n.endswith(".safetensors") for n in os.listdir(run.dir))
            p = start(config.argv(run.home, run.dir, "--resume" if has_checkpoint else "-o", "--save-every", "1"))
            xsatest.read_until(p, {"training": lambda line: line.startswith("step ")}, TIMEOUT)
            delays.append(round(test.rng.uniform(0.1, 0.5) * ref.seconds, 2))
            time.sleep(delays[-1])
            p.kill()
            p.communicate()
        run.what = "kill -9 at %s s" % delays
    interrupt.text = "kill -9 %d times at random times (--save-every 1)" % times
    return interrupt


def launched_stop(after_step):
    """Two ranks started with a launcher's variables and a rendezvous file, both sent SIGTERM once the run has
    logged `after_step`: both exit 143, rank 0 printing how to resume."""
    def interrupt(test, config, ref, run):
        run.what = "2 launched ranks, SIGTERM after step %d" % after_step
        argv = config.argv(run.home, run.dir, "-o", "--rendezvous", os.path.join(run.case_dir, "rdv"))
        procs = [start(argv, launcher_env(r)) for r in (0, 1)]
        deadline = time.time() + TIMEOUT
        while b'"step": %d,' % after_step not in read(os.path.join(run.dir, "metrics.jsonl")) and time.time() < deadline:
            time.sleep(0.02)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        results = [finish(p) for p in procs]
        test.assertEqual([r[0] for r in results], [128 + signal.SIGTERM] * 2, "%s: exit codes, outputs %s" % (run.what, results))
        test.assertIn("resume with:", results[0][1], "%s: rank 0 did not say how to resume" % run.what)
    interrupt.text = "SIGTERM to 2 launched ranks after step %d" % after_step
    return interrupt


# ----------------------------------------------------------------------------------------------------
# How it is resumed: resume(test, config, run), which fails the test if the resumed run does not end well.

def resumed(*extra, says=None):
    """--resume DIR, with the configuration's flags and `extra`; its output must contain `says`."""
    def resume(test, config, run):
        code, out = finish(start(config.argv(run.home, run.dir, "--resume", *extra)))
        test.assertEqual(code, 0, "%s, then --resume: exit %d\n%s" % (run.what, code, tail(out)))
        if says:
            test.assertIn(says, out, "%s, then --resume: the output does not say '%s'" % (run.what, says))
    resume.text = "--resume" + (" with " + " ".join(extra) if extra else "")
    return resume


def resumed_alone(test, config, run):
    """--resume DIR and nothing else: the run's own flags come from its metrics.jsonl (its run line's "argv")."""
    code, out = finish(start([binary(config.program), "--resume", run.dir]))
    test.assertEqual(code, 0, "%s, then --resume DIR alone: exit %d\n%s" % (run.what, code, tail(out)))


resumed_alone.text = "--resume DIR alone (no other flag)"


def printed_command(test, config, run):
    """The resume command the stopped run printed, run as printed."""
    argv = [binary(config.program)] + run.command[1:]
    code, out = finish(start(argv))
    test.assertEqual(code, 0, "%s, then the printed resume command: exit %d\n%s" % (run.what, code, tail(out)))


printed_command.text = "the resume command it printed"


def launched_resume(test, config, run):
    """Two launched ranks with --resume and a new rendezvous file."""
    argv = config.argv(run.home, run.dir, "--resume", "--rendezvous", os.path.join(run.case_dir, "rdv2"))
    procs = [start(argv, launcher_env(r)) for r in (1, 0)]
    results = [finish(p) for p in procs]
    test.assertEqual([r[0] for r in results], [0, 0], "%s, then resumed by 2 launched ranks: exit codes, outputs %s" % (run.what, results))


launched_resume.text = "--resume on 2 launched ranks with a new rendezvous file"


# ----------------------------------------------------------------------------------------------------
# What must equal the reference run (assert_same):
#   weights     final.safetensors (the exported weights) bit for bit
#   checkpoint  the last checkpoint's tensors (the weights and the whole optimizer state) bit for bit
#   losses      metrics.jsonl's train lines, (step, loss) in order: every step, once
#   lines       metrics.jsonl's lines, counted by kind and step: no duplicates, none missing
#   metrics     every metrics.jsonl line, timing fields aside (strict JSON: no NaN)
#   near        on other rank counts, not bit for bit: a train line for every step, the last loss within 5%
#   new log     (--new-log 1) metrics.jsonl: a run line, then every line the reference wrote after the checkpoint, timing aside
SAME = {"weights": "final weights", "checkpoint": "last checkpoint", "losses": "train losses", "lines": "metrics lines without duplicates",
        "metrics": "every metrics line", "near": "every step logged, last loss within 5%",
        "new log": "a new metrics.jsonl: a run line, then the lines after the checkpoint"}

# The cases: a name; the configuration (CONFIGS), whose reference run the cases naming it share; how the run is
# interrupted and how it is resumed (the functions above); what must equal the reference (SAME).
Case = collections.namedtuple("Case", "name config interrupt resume same")
CASES = [
    Case("copied checkpoint", "train_gpt", copied("ckpt_000015.safetensors", "metrics.jsonl"), resumed(),
         ("weights", "losses", "lines", "metrics")),
    Case("SIGTERM", "train_gpt", signalled(signal.SIGTERM), printed_command, ("weights", "metrics")),
    Case("SIGINT", "train_gpt", signalled(signal.SIGINT), printed_command, ("weights", "metrics")),
    Case("SIGTERM, resumed without flags", "train_gpt", signalled(signal.SIGTERM), resumed_alone, ("weights", "metrics")),
    Case("kill -9", "train_gpt", killed(5), resumed("--save-every", "1"), ("weights", "metrics")),
    # (without its metrics.jsonl a resume is refused, test_bad_inputs.py; --new-log 1 starts a new one from the checkpoint)
    Case("copied checkpoint alone, learnable alpha", "train_gpt -x learn", copied("ckpt_000003.safetensors"),
         resumed("--new-log", "1", says="from step 3 on (--new-log 1)"), ("weights", "new log")),
    Case("copied checkpoint, SFT", "chat_sft", copied("ckpt_000005.safetensors", "metrics.jsonl"), resumed(), ("weights", "losses", "lines")),
    Case("SFT: SIGTERM, resumed without flags", "chat_sft", signalled(signal.SIGTERM), resumed_alone, ("weights", "metrics")),
    Case("launched ranks stopped", "train_gpt, 2 ranks, 200 steps", launched_stop(10), launched_resume, ("checkpoint", "losses", "lines")),
    Case("2 ranks -> 1", "train_gpt, 2 ranks, 8 steps", copied("ckpt_000004.safetensors", "metrics.jsonl"),
         resumed("--ranks", "1", says="was written by 2 ranks, this run has 1"), ("near", "lines")),
    Case("2 ranks -> 4", "train_gpt, 2 ranks, 8 steps", copied("ckpt_000004.safetensors", "metrics.jsonl"),
         resumed("--ranks", "4", says="was written by 2 ranks, this run has 4"), ("near", "lines")),
]


def metrics_lines(path):
    """metrics.jsonl as parsed lines (strict JSON: no NaN), timing fields removed; [] if it is missing."""
    if not os.path.exists(path):
        return []
    lines = []
    with open(path) as f:
        for text in f:
            line = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError("not JSON: " + c)))
            for key in TIMING + ("argv",):  # (argv: how the run was started, e.g. the reference's --save-every, not what it computed)
                line.pop(key, None)
            lines.append(line)
    return lines


def checkpoints(d):
    return sorted(n for n in os.listdir(d) if n.startswith("ckpt_") and n.endswith(".safetensors")) if os.path.isdir(d) else []


class Reference(collections.namedtuple("Reference", "dir seconds error")):
    """An uninterrupted run: its directory and duration in seconds (error: why it failed, '' if it did not)."""


class TestResume(xsatest.TempDirTest):
    PREFIX = "xsa_resume_"

    @classmethod
    def setUpClass(cls):
        cls.home = tempfile.mkdtemp(prefix="xsa_resume_ref_")  # the reference runs, kept for the whole class
        cls.addClassCleanup(shutil.rmtree, cls.home, ignore_errors=True)
        cls.references = {}

    def setUp(self):
        super().setUp()
        self.rng = random.Random()  # random times, printed in the messages so that a failure can be replayed

    def config_home(self, name):
        return os.path.join(self.home, name.replace(" ", "_").replace(",", ""))

    def reference(self, name):
        """The uninterrupted run of configuration `name`, made the first time a case asks for it."""
        if name not in self.references:
            config, home = CONFIGS[name], self.config_home(name)
            os.makedirs(home)
            error, seconds, d = "", 0.0, os.path.join(home, "reference")
            for program, args in config.setup:
                code, out = finish(start([binary(program)] + [w.replace("{home}", home) for w in shlex.split(args)]))
                error = error or (code != 0 and "its set-up run %s %s failed (exit %d):\n%s" % (program, args, code, tail(out)))
            if not error:
                t0 = time.time()
                code, out = finish(start(config.argv(home, d, "-o", reference=True)))
                seconds = time.time() - t0
                error = code != 0 and "exit %d:\n%s" % (code, tail(out))
            self.references[name] = Reference(d, seconds, error or "")
        ref = self.references[name]
        if ref.error:
            self.fail("the uninterrupted run of %s failed: %s" % (name, ref.error))
        return ref

    def assert_same(self, same, ref, run):
        """The resumed run in run.dir against the uninterrupted one in ref.dir, as `same` lists."""
        what = run.what + ", then resumed"
        ref_lines, lines = metrics_lines(os.path.join(ref.dir, "metrics.jsonl")), metrics_lines(os.path.join(run.dir, "metrics.jsonl"))
        losses = lambda ls: [(m["step"], m["loss"]) for m in ls if m["kind"] == "train"]  # noqa: E731  (step, loss) in the file's order
        if "weights" in same:
            want, got = read(os.path.join(ref.dir, "final.safetensors")), read(os.path.join(run.dir, "final.safetensors"))
            self.assertTrue(want != b"" and got == want, "%s: final weights %s" % (what, "missing" if not want or not got else "differ from the uninterrupted run's"))
        if "checkpoint" in same:
            last = (checkpoints(ref.dir) or ["(none)"])[-1]  # the uninterrupted run's last checkpoint, and the same step's here
            want, got = (read(os.path.join(d, last)) for d in (ref.dir, run.dir))
            self.assertTrue(want != b"" and got != b"" and st_parse(got)[1] == st_parse(want)[1],
                            "%s: checkpoint %s %s" % (what, last, "missing" if not want or not got else "differs from the uninterrupted run's"))
        if "losses" in same:
            want, got = losses(ref_lines), losses(lines)
            self.assertTrue(want and [s for s, _ in want] == list(range(len(want))), "the uninterrupted run logged train losses of steps %s" % [s for s, _ in want])
            first = next((i for i in range(max(len(got), len(want))) if got[i:i + 1] != want[i:i + 1]), None)
            self.assertIsNone(first, "%s: train losses (step, loss) differ from the uninterrupted run's, first at train line %s: %s, want %s" %
                              (what, first, got[first:first + 1], want[first:first + 1]) if first is not None else "")
        if "lines" in same:
            count = lambda ls: collections.Counter((m["kind"], m["step"]) for m in ls)  # noqa: E731
            want, got = count(ref_lines), count(lines)
            self.assertEqual(got, want, "%s: metrics.jsonl lines (kind, step) too many %s, missing %s" % (what, dict(got - want), dict(want - got)))
        if "metrics" in same:
            differ = [i for i in range(max(len(lines), len(ref_lines))) if lines[i:i + 1] != ref_lines[i:i + 1]]
            self.assertFalse(differ, "%s: metrics lines differ from the uninterrupted run's, first at line %d:\n  got  %s\n  want %s" %
                             (what, differ[0] + 1, lines[differ[0]:differ[0] + 1], ref_lines[differ[0]:differ[0] + 1]) if differ else "")
        if "new log" in same:  # from the copied checkpoint's step S: train lines from S on, the others after S (evaluated before it)
            start = int(checkpoints(run.dir)[0][len("ckpt_"):-len(".safetensors")])
            want = ref_lines[:1] + [m for m in ref_lines[1:] if m["step"] > start or (m["step"] == start and m["kind"] == "train")]
            self.assertTrue(lines and lines[0]["kind"] == "run", "%s: the new metrics.jsonl does not start with a run line: %s" % (what, lines[:1]))
            self.assertEqual(lines, want, "%s: the new metrics.jsonl is not the run line and the uninterrupted run's lines from step %d" % (what, start))
        if "near" in same:
            want, got = [m["loss"] for m in ref_lines if m["kind"] == "train"], [m["loss"] for m in lines if m["kind"] == "train"]
            self.assertTrue(want and len(got) == len(want) and abs(got[-1] - want[-1]) < 0.05 * want[-1],
                            "%s: %d train lines (want %d), last loss %s (uninterrupted: %s)" % (what, len(got), len(want), got[-1:], want[-1:]))

    def test_resume(self):
        for i, case in enumerate(CASES):
            config = CONFIGS[case.config]
            with self.subTest("resume, %s (%s): %s, then %s -> %s as the uninterrupted run's" %
                              (case.name, case.config, case.interrupt.text, case.resume.text, ", ".join(SAME[s] for s in case.same))):
                ref = self.reference(case.config)
                run = Run(self.config_home(case.config), self.path("case_%d" % i))
                os.makedirs(run.case_dir)
                case.interrupt(self, config, ref, run)
                case.resume(self, config, run)
                self.assert_same(case.same, ref, run)


if __name__ == "__main__":
    unittest.main()
