#!/usr/bin/env python3
"""Ranks started by a launcher (dev/docs/multinode.md) on the CPU backend: two processes
given torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK) that meet in a rendezvous file, and two started
by mpirun (the binary built with MPI): each run equal bit for bit to --ranks 2 (two forked processes; the
update of --ranks 2 against the same step in one process is test_infra.cu's check): the weights, every loss
and val bpb; chat_eval's items split over launched ranks give --ranks 2's table. A rank that fails or is
killed ends the other with an error; bad launcher variables and rendezvous files end in one error line.
The sharded optimizer (the default with several ranks) equals the replicated one bit for bit, and their
checkpoints resume each other. Launched ranks stopped by SIGTERM and resumed, and a checkpoint of 2 ranks
resumed on 1 and on 4: dev/test/test_resume.py.

    python3 dev/test/test_launch.py     (or all suites: make test)

mpirun comes with Open MPI (Debian: libopenmpi-dev openmpi-bin; .ci/run installs them, and the Makefile
then builds train_gpt_cpu with MPI). Without it the mpirun tests are skipped, except in CI, where they fail.
Standard library only.
"""
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from craft import st_parse  # noqa: E402
from xsatest import REPO, TempDirTest, binary, in_ci, jsonl, read  # noqa: E402

# a model small enough for a few steps in about a second (1 micro-batch of 2 rows x 32 tokens per rank per step)
TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-every 2 --eval-tokens 256 --sample-every -1 --core-every -1"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
TIMEOUT = 120  # seconds for any run here (a hang is a failure, not a stuck suite)


def launcher_env(rank, world=2, local_world=None, **extra):
    """The environment of a process a torchrun-style launcher started as `rank` of `world`."""
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    env.update({"LOCAL_WORLD_SIZE": str(local_world)} if local_world else {})
    env.update(extra)
    return env


def start(argv, env=None):
    return subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(p):
    """(exit code, stdout, stderr) of a started process, killed after TIMEOUT."""
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += b"\n(killed after %d s)" % TIMEOUT
    return p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def launch_two(program, args, rendezvous, env_extra=None):
    """`program args` as ranks 1 and 0 of 2 with torchrun's variables and --rendezvous: [(code, out, err)] by rank."""
    argv = [binary(program)] + shlex.split(args) + ["--rendezvous", rendezvous]
    procs = [start(argv, launcher_env(r, **(env_extra or {}))) for r in (1, 0)]  # rank 1 first: it waits for rank 0's file
    return [finish(p) for p in reversed(procs)]


def mpi_usable():
    """Why the mpirun tests cannot run here ('' if they can)."""
    if shutil.which("mpirun") is None:
        return "mpirun not found (Debian: apt-get install libopenmpi-dev openmpi-bin, then make train_gpt_cpu)"
    ldd = subprocess.run(["ldd", binary("train_gpt_cpu")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode()
    return "" if "libmpi" in ldd else "train_gpt_cpu is built without MPI (rebuild it: make -B train_gpt_cpu, with mpicxx installed)"


def weights_and_curves(run_dir, step):
    """(the tensors' bytes of the checkpoint at `step`, [(step, loss)], [(step, val bpb)]) of a run directory."""
    data = read(os.path.join(run_dir, "ckpt_%06d.safetensors" % step))
    tensors = st_parse(data)[1] if data else b""
    metrics = jsonl(os.path.join(run_dir, "metrics.jsonl")) if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) else []
    return (tensors, [(m["step"], m["loss"]) for m in metrics if m["kind"] == "train"],
            [(m["step"], m["val_bpb"]) for m in metrics if m["kind"] == "eval"])


class TestLaunched(TempDirTest):
    """Two launched ranks on the CPU backend against --ranks 2, and what happens when one fails."""

    def forked(self, steps=4):
        """The reference: --ranks 2 (forked ranks), its weights and curves."""
        code, out, err = finish(start([binary("train_gpt_cpu")] + shlex.split(TINY) + ["-n", str(steps), "-x", "1", "--ranks", "2",
                                                                                     "-o", self.path("forked")]))
        self.assertEqual(code, 0, "--ranks 2 failed:\n%s%s" % (out, err))
        return weights_and_curves(self.path("forked"), steps)

    def assert_same_run(self, name, got, want):
        weights_same = got[0] != b"" and got[0] == want[0]
        self.assertTrue(weights_same and got[1] == want[1] and got[2] == want[2] and len(want[1]) == 4,
                        "%s against --ranks 2: weights %s; losses %s / %s; val bpb %s / %s" %
                        (name, "identical" if weights_same else "DIFFERENT or missing", got[1], want[1], got[2], want[2]))

    def test_rendezvous_equals_forked(self):
        """RANK/WORLD_SIZE/LOCAL_RANK + --rendezvous: the same weights, losses and val bpb as --ranks 2, one rank prints"""
        want = self.forked()
        results = launch_two("train_gpt_cpu", TINY + " -n 4 -x 1 -o " + shlex.quote(self.path("launched")), self.path("rdv"))
        self.assertTrue(all(r[0] == 0 for r in results), "exit codes %s:\n%s" % ([r[0] for r in results], results))
        self.assertIn("ranks: 2 (started by RANK/WORLD_SIZE), 2 on this machine, gradients summed in shared memory", results[0][1])
        self.assertEqual(results[1][1], "", "rank 1 printed")
        self.assertFalse(os.path.exists(self.path("rdv")), "the rendezvous file is left behind")
        self.assert_same_run("2 launched ranks", weights_and_curves(self.path("launched"), 4), want)

    def test_mpirun_equals_forked(self):
        """mpirun -np 2: the same weights, losses and val bpb as --ranks 2"""
        why = mpi_usable()
        if why:
            if in_ci():
                self.fail(why)
            self.skipTest(why)
        want = self.forked()
        code, out, err = finish(start(MPIRUN + [binary("train_gpt_cpu")] + shlex.split(TINY) + ["-n", "4", "-x", "1", "-o", self.path("mpi")]))
        self.assertEqual(code, 0, "mpirun failed:\n%s%s" % (out, err))
        self.assertIn("ranks: 2 (started by MPI), 2 on this machine, gradients summed with MPI", out)
        self.assert_same_run("mpirun -np 2", weights_and_curves(self.path("mpi"), 4), want)
        # a set-up error only rank 1 meets: its error line, and mpirun stops the job
        code, out, err = finish(start(MPIRUN + [binary("train_gpt_cpu")] + shlex.split(TINY) + ["-n", "1", "-i", "dev/data/devil/val_000000.bin"]))
        self.assertTrue(code != 0 and "error: rank 1: rank 1 of 2 gets no documents" in err, "exit %d, stderr:\n%s" % (code, err))

    def test_killed_rank(self):
        """kill -9 of rank 1 mid-run: rank 0 ends with one error line naming it, exit 1"""
        flags = TINY.replace("--eval-every 2", "--eval-every 1000") + " -n 100000"
        argv = [binary("train_gpt_cpu")] + shlex.split(flags) + ["--rendezvous", self.path("rdv")]
        procs = [start(argv, launcher_env(r)) for r in (0, 1)]
        time.sleep(1.5)
        procs[1].kill()
        code, out, err = finish(procs[0])
        finish(procs[1])
        self.assertTrue(code == 1 and err.count("\n") == 1 and "error: rank 0: rank 1 (process %d) has ended; stopping" % procs[1].pid in err,
                        "rank 0: exit %d, stderr:\n%s" % (code, err))

    def test_chat_eval(self):
        """chat_eval on 2 launched ranks: the table of --ranks 2"""
        model = self.path("model.safetensors")
        code, out, err = finish(start([binary("train_gpt_cpu")] + shlex.split(TINY) + ["-n", "1", "--export-safetensors", model]))
        self.assertEqual(code, 0, out + err)
        args = "-e %s -c dev/data/chat_tasks --max-new 8 --tokenizer dev/data/devil/tokenizer.bin" % shlex.quote(model)
        code, forked, err = finish(start([binary("chat_eval")] + shlex.split(args) + ["--ranks", "2"]))
        self.assertEqual(code, 0, forked + err)
        results = launch_two("chat_eval", args, self.path("rdv"))
        table = lambda text: [line for line in text.splitlines() if not line.startswith("ranks:") and "items in" not in line]  # noqa: E731
        self.assertTrue(all(r[0] == 0 for r in results) and table(results[0][1]) == table(forked) and "ChatCORE" in forked,
                        "launched:\n%s\n--ranks 2:\n%s" % (results, forked))


class TestShardedOptimizer(TempDirTest):
    """The sharded optimizer (--shard-optimizer 1, the default with several ranks: nanochat's ZeRO-2 split of
    the Muon groups and of the large AdamW tensors) against every rank running all of it: on the CPU
    backend the ranks sum in rank order either way, so the runs must agree bit for bit: the weights, the
    whole optimizer state the checkpoints gather and the losses. The logged gradient norm is summed in another
    order (each rank's squares over its share, then the shares), so it agrees to float rounding: to its printed
    6 significant digits, give or take one unit."""

    # 2 layers: Muon groups of 2 and 8 matrices (over 4 ranks: chunks of 1, the last ranks get none, and of
    # 2); the embeddings and lm_head split by rows
    FLAGS = "-d 2 --dim 64 --heads 2 -t 32 -b 1 -B 128 --warmup-steps 2 --eval-every 2 --eval-tokens 256 --sample-every -1 --core-every -1"

    def train(self, name, args):
        code, out, err = finish(start([binary("train_gpt_cpu")] + shlex.split(self.FLAGS + " " + args) + ["-o", self.path(name)]))
        self.assertEqual(code, 0, "%s failed:\n%s%s" % (args, out, err))
        return out

    def curves(self, name):
        return [(m["step"], m["loss"], m["grad_norm"]) for m in jsonl(self.path(name, "metrics.jsonl")) if m["kind"] == "train"]

    def assert_same(self, a, b, steps=(2, 4)):
        for step in steps:
            with self.subTest("%s = %s at step %d" % (a, b, step)):
                ta, tb = (read(self.path(n, "ckpt_%06d.safetensors" % step)) for n in (a, b))
                self.assertTrue(ta != b"" and st_parse(ta)[1] == st_parse(tb)[1], "checkpoints differ (weights or optimizer state)")
        ca, cb = self.curves(a), self.curves(b)
        self.assertEqual([(step, loss) for step, loss, _ in ca], [(step, loss) for step, loss, _ in cb])
        for (step, _, na), (_, _, nb) in zip(ca, cb):  # logged with 6 significant digits: a true 1e-7 apart may print one unit apart
            unit = 10 ** (math.floor(math.log10(max(abs(na), abs(nb), 1e-30))) - 5)
            self.assertLessEqual(abs(na - nb), 1.5 * unit, "grad norm at step %d: %r and %r" % (step, na, nb))

    def test_muon_four_ranks(self):
        """--ranks 4, Muon, learnable XSA: sharded = replicated; the plan shows each rank's share"""
        out = self.train("sharded", "-n 4 -x learn --ranks 4 --save-every 2")
        self.train("replicated", "-n 4 -x learn --ranks 4 --save-every 2 --shard-optimizer 0")
        self.assertIn("(Muon, sharded over 4 ranks: the largest share of", out)
        self.assert_same("sharded", "replicated")
        # a sharded run's checkpoint resumed by replicated ranks: the uninterrupted run's end
        shutil.copytree(self.path("sharded"), self.path("resumed"))
        os.remove(self.path("resumed", "ckpt_000004.safetensors"))
        code, out, err = finish(start([binary("train_gpt_cpu")] + shlex.split(self.FLAGS) +
                                      shlex.split("-n 4 -x learn --ranks 4 --save-every 2 --shard-optimizer 0 --resume") + [self.path("resumed")]))
        self.assertEqual(code, 0, out + err)
        self.assert_same("resumed", "sharded", steps=(4,))

    def test_adamw_two_ranks(self):
        """--ranks 2 --optimizer adamw (the matrices split by rows too): sharded = replicated"""
        self.train("sharded", "-n 4 --optimizer adamw --ranks 2 --save-every 2")
        self.train("replicated", "-n 4 --optimizer adamw --ranks 2 --save-every 2 --shard-optimizer 0")
        self.assert_same("sharded", "replicated")


class TestLaunchErrors(TempDirTest):
    """Bad launcher variables and rendezvous files: one error line, exit 1 (on every rank that meets it)."""

    def one_error(self, env, args, expect):
        argv = [binary("train_gpt_cpu")] + shlex.split(TINY + " -n 1") + shlex.split(args)
        with self.subTest("%s %s" % (" ".join("%s=%s" % kv for kv in sorted(env.items())), args)):
            code, out, err = finish(start(argv, dict(os.environ, **env)))
            self.assertTrue(code == 1 and err.count("\n") == 1 and err.startswith("error: ") and expect in err,
                            "exit %d, stderr: %s\n     expected one line containing '%s'" % (code, err or "(nothing)", expect))

    def test_bad_environment(self):
        rdv = "--rendezvous " + self.q("rdv")
        self.one_error({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, rdv, "RANK=x is not a non-negative integer")
        self.one_error({"RANK": "0", "LOCAL_RANK": "0"}, rdv, "RANK is set but WORLD_SIZE is not")
        self.one_error({"RANK": "0", "WORLD_SIZE": "2"}, rdv, "RANK is set but LOCAL_RANK is not")
        self.one_error({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, rdv, "RANK=2 must be below WORLD_SIZE=2")
        self.one_error({"RANK": "0", "WORLD_SIZE": "65", "LOCAL_RANK": "0"}, rdv, "WORLD_SIZE=65 must be in [1, 64]")
        self.one_error({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"}, rdv, "LOCAL_RANK=1 must be below LOCAL_WORLD_SIZE=1")
        self.one_error({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "", "has no way to meet the others: pass --rendezvous FILE")
        self.one_error({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, rdv + " --ranks 2", "--ranks 2: this process is already rank 0 of 2")
        self.one_error({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, rdv,
                       "without MPI they must all run on one machine")
        self.one_error({}, rdv, "--rendezvous is for ranks started by a launcher")

    def test_join_timeout(self):
        """a rank whose peers never come: rank 1 without rank 0's file, rank 0 without rank 1, each stops after
        XSA_RENDEZVOUS_TIMEOUT seconds (here 1) with one error line"""
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "XSA_RENDEZVOUS_TIMEOUT": "1"}
        self.one_error(env, "--rendezvous " + self.q("never"), "--rendezvous: rank 0 has not made '%s' in 1 s" % self.path("never"))
        self.one_error(dict(env, RANK="0", LOCAL_RANK="0"), "--rendezvous " + self.q("alone"),
                       "1 of 2 ranks joined at the rendezvous file '%s' in 1 s" % self.path("alone"))
        self.one_error(dict(env, XSA_RENDEZVOUS_TIMEOUT="soon"), "--rendezvous " + self.q("x"), "XSA_RENDEZVOUS_TIMEOUT=soon is not a non-negative integer")

    def test_bad_rendezvous_file(self):
        env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
        self.write("left", "a file left behind")
        self.one_error(env, "--rendezvous " + self.q("left"), "exists: another run's, or left by one that failed while starting")
        self.one_error(env, "--rendezvous " + self.q("no_such_dir", "rdv"), "cannot create")
        self.one_error(dict(env, RANK="1", LOCAL_RANK="1"), "--rendezvous " + self.q("left"), "is not this program's rendezvous file")
        # a rendezvous file of a 2-rank run that stopped while starting, met by a rank of a 3-rank run
        procs = [start([binary("train_gpt_cpu")] + shlex.split(TINY + " -n 1") + ["--rendezvous", self.path("stale")], launcher_env(0))]
        deadline = time.time() + TIMEOUT
        while not os.path.exists(self.path("stale")) and time.time() < deadline:
            time.sleep(0.02)
        procs[0].kill()
        finish(procs[0])
        self.one_error(dict(env, RANK="1", WORLD_SIZE="3", LOCAL_RANK="1"), "--rendezvous " + self.q("stale"),
                       "is for 2 ranks, and this is rank 1 of 3 (a file left by another run? remove it)")
        self.one_error(dict(env, RANK="1", LOCAL_RANK="1"), "--rendezvous " + self.q("stale"), "rank 0 (process %d) has ended; stopping" % procs[0].pid)

    def test_rendezvous_file_truncated(self):
        """the rendezvous file cut to 0 bytes by another process while rank 0 waits in it for rank 1: one error line
        naming it and exit 1 (a read of the lost pages raised SIGBUS)"""
        rdv = self.path("rdv")
        p = start([binary("train_gpt_cpu")] + shlex.split(TINY + " -n 1") + ["--rendezvous", rdv], launcher_env(0, XSA_RENDEZVOUS_TIMEOUT="20"))
        deadline = time.time() + TIMEOUT
        while not os.path.exists(rdv) and time.time() < deadline and p.poll() is None:
            time.sleep(0.02)
        os.truncate(rdv, 0)
        code, out, err = finish(p)
        self.assertTrue(code == 1 and err.count("\n") == 1 and err.startswith("error: ") and
                        "rendezvous file '%s' was truncated while this run read it" % rdv in err,
                        "exit %d, stderr: %s" % (code, err or "(nothing)"))


if __name__ == "__main__":
    unittest.main()
