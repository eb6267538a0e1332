"""Faults a long run meets on a shared cluster, beyond the stop and its resume: a second SIGTERM (or Ctrl-C)
while the run finishes its step after the first ends it at once, and a second run started into a
directory a run is using is refused. The stop itself (pre-emption by SIGTERM, Ctrl-C, kill -9 at any
moment, also while a checkpoint is written) and `--resume` reaching bit-identically the weights and the
metrics lines of an uninterrupted run are dev/test/test_resume.py's cases. Standard library only; run with
`make test` or `python3 dev/test/test_faults.py`.
"""
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
RUN_ALONE = "a second signal must end the run within 1 s"  # dev/test/run_tests.py runs it when nothing else runs

TINY = ("-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-every 5 --eval-tokens 256 "
        "--sample-every -1 --core-every -1").split()


class Faults(xsatest.TempDirTest):
    PREFIX = "xsa_faults_"

    def start(self, out, steps, extra=()):
        argv = [xsatest.binary("train_gpt_cpu")] + TINY + ["-n", str(steps), "--export-safetensors",
                                                           os.path.join(out, "final.safetensors")] + list(extra)
        return subprocess.Popen(argv, cwd=xsatest.REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def start_writing(self, out, steps):
        """A run into `out` (-o), once it has started its metrics.jsonl"""
        p = self.start(out, steps, ["-o", out])
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(out, "metrics.jsonl")) and time.time() < deadline:
            time.sleep(0.05)
        return p

    def test_signals_answer_at_once(self):
        # a long optimizer step (128 micro-batches, about 16 s on 2 cores, so that even a machine several times
        # faster is still inside it 1.5 s later). The first SIGTERM, once the step has begun, is answered within a
        # second by a line saying what will happen (the step finished, then a checkpoint); a second one 1.5 s later
        # ends the run at once, killed by the signal, with a line saying so (the step is never finished, so its
        # length costs nothing)
        out = os.path.join(self.dir, "twice")
        p = subprocess.Popen([xsatest.binary("train_gpt_cpu"), "-d", "2", "--dim", "128", "--heads", "2", "-t", "128", "-b", "4",
                              "-B", "65536", "-n", "2", "--eval-tokens", "512", "--sample-every", "-1", "--core-every", "-1", "-o", out],
                             cwd=xsatest.REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(p.kill)
        text = b""

        def read_until(marker, seconds):
            nonlocal text
            deadline = time.time() + seconds
            while marker not in text and time.time() < deadline:
                if select.select([p.stdout], [], [], 0.1)[0]:
                    chunk = os.read(p.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    text += chunk
            return marker in text

        self.assertTrue(read_until(b"step 0/2 | val bpb", 60), text.decode("utf-8", "replace"))
        time.sleep(0.5)  # inside step 1
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        self.assertTrue(read_until(b"stop requested: finishing step 1 of 2", 1.0), text.decode("utf-8", "replace"))
        self.assertLess(time.time() - t0, 1.0)
        self.assertIn(b"then a checkpoint into " + out.encode(), text)
        time.sleep(1.5)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        text += p.communicate()[0]
        self.assertEqual(p.returncode, -signal.SIGTERM, "a second SIGTERM: exit %d (want killed by SIGTERM)" % p.returncode)
        self.assertLess(time.time() - t0, 1.0, "a second SIGTERM took %.1f s to end the run" % (time.time() - t0))
        self.assertIn(b"stopped at once during step 1; no checkpoint was written yet", text)

    def test_without_output_stops_at_once(self):
        # no -o: nothing to save, so the first SIGINT ends the run at once (exit 130), saying so
        p = self.start(self.dir, 100000)
        time.sleep(1.0)
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        text = p.communicate(timeout=30)[0]
        self.assertEqual(p.returncode, 130, text.decode("utf-8", "replace"))
        self.assertLess(time.time() - t0, 1.0)
        self.assertIn(b"stopped at once: nothing to save", text)

    def test_sighup_stops_like_sigterm(self):
        # the terminal of an ssh session closes: SIGHUP stops the run after its step with a checkpoint (exit 129)
        out = os.path.join(self.dir, "hup")
        p = self.start_writing(out, 100000)
        time.sleep(1.0)
        p.send_signal(signal.SIGHUP)
        text = p.communicate(timeout=60)[0].decode("utf-8", "replace")
        self.assertEqual(p.returncode, 129, text[-2000:])
        self.assertIn("stopped by SIGHUP after step ", text)
        self.assertTrue(any(f.startswith("ckpt_") for f in os.listdir(out)), os.listdir(out))

    def test_file_size_limit_is_an_error(self):
        # past `ulimit -f` (SIGXFSZ ignored) a write fails with one error line, not a kill by the signal
        out = os.path.join(self.dir, "fsize")
        p = subprocess.run(["bash", "-c", "ulimit -f 64; exec \"$@\"", "bash", xsatest.binary("train_gpt_cpu")] + TINY +
                           ["-n", "4", "--save-every", "2", "-o", out], cwd=xsatest.REPO, stdin=subprocess.DEVNULL, capture_output=True)
        err = p.stderr.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 1, "exit %d (want 1, not killed by SIGXFSZ): %s" % (p.returncode, err))
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertTrue(err.startswith("error: ") and "ckpt_000002" in err, err)

    def test_new_log_then_stop(self):
        # a run whose metrics.jsonl was lost, resumed with --new-log=1 and stopped by SIGTERM: the resume command it prints
        # leaves --new-log out (the new log is there now, and --new-log 1 again would be refused) and runs as printed
        out = os.path.join(self.dir, "lost")

        def stop(p):  # SIGTERM once the run has trained a step (printed its first training line)
            self.addCleanup(p.kill)
            text = b""
            for line in p.stdout:
                text += line
                if line.startswith(b"step ") and b"| loss " in line:
                    break
            p.send_signal(signal.SIGTERM)
            text = (text + p.communicate(timeout=60)[0]).decode("utf-8", "replace")
            self.assertEqual(p.returncode, 143, text[-2000:])
            return text

        stop(self.start(out, 100000, ["-o", out]))
        os.remove(os.path.join(out, "metrics.jsonl"))
        text = stop(self.start(out, 100000, ["--resume", out, "--new-log=1"]))
        self.assertIn("(--new-log 1)", text)
        command = shlex.split(text.rstrip("\n").split("\n")[-1].split("resume with: ", 1)[1])
        self.assertFalse([w for w in command if w.startswith("--new-log")], "the printed resume command %s keeps --new-log" % command)
        text = stop(subprocess.Popen([xsatest.binary("train_gpt_cpu")] + command[1:], cwd=xsatest.REPO, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        self.assertIn("resumed from", text)

    def test_one_run_per_directory(self):
        out = os.path.join(self.dir, "busy")
        first = self.start_writing(out, 400)
        try:
            xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu")] + TINY + ["-n", "5", "-o", out], "holds another run's files")
            # --overwrite 1 deletes an earlier run's files only under the directory's lock: never a running run's
            xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu")] + TINY + ["-n", "5", "-o", out, "--overwrite", "1"],
                                    "another run is using")
            self.assertTrue(os.path.exists(os.path.join(out, "metrics.jsonl")), "--overwrite 1 deleted a running run's metrics.jsonl")
        finally:
            first.kill()
            first.communicate()


if __name__ == "__main__":
    unittest.main()
