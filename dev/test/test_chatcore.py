#!/usr/bin/env python3
"""End-to-end tests of ChatCORE (./chat_eval, dev/docs/evaluation.md#chatcore) on the committed mini bundle
dev/data/chat_tasks and the committed tiny chat model dev/reference/data/chat_model.safetensors (a 2-layer
model of the embedded tokenizer, base-trained 200 steps and fine-tuned 80 SFT steps on dev/data/sft_mini_tokens):
every item's verdict, chosen letter and greedy answer (64 tokens, with the calculator tool) equal to the
independent PyTorch scorer's in float64 (dev/reference/score_chat.py, its output committed as
dev/reference/data/chat_scores.json); the same aggregates over 2 ranks; bad task files and options end in
one error line; chat_eval killed mid-HumanEval leaves no program running; a hostile HumanEval program stays inside its
boundary. The answer checkers and HumanEval's test process are checked by dev/test/test_infra.cu, the calculator
against Python by dev/data/test_calculator.py.

    python3 dev/test/test_chatcore.py        (or all suites: make test)

Standard library only.
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import REPO, binary, check_one_error, read, run  # noqa: E402

MODEL = "dev/reference/data/chat_model.safetensors"
TASKS = "dev/data/chat_tasks"
REFERENCE = "dev/reference/data/chat_scores.json"
STUDY_TASKS = "dev/data/chat_tasks_study"  # the same with SpellingBee (16 items)
STUDY_REFERENCE = "dev/reference/data/chat_scores_study.json"


def chat_eval(*args):
    return run([binary("chat_eval"), "-e", MODEL] + list(args))


class TestChatCore(xsatest.TempDirTest):
    PREFIX = "xsa_chatcore_"

    def against_reference(self, tasks, reference, n_items, n_answers):
        """chat_eval on the tiny chat model: every item's verdict, letter and greedy answer equal to the PyTorch
        reference's (float64); ChatCORE printed and written to the CSV as the reference's. Returns the output."""
        with open(os.path.join(REPO, reference)) as f:
            ref = json.load(f)
        code, out = chat_eval("-c", tasks, "--max-new", str(ref["max_new_tokens"]), "--answers", self.path("answers.jsonl"),
                              "-o", self.path("chatcore.csv"))
        self.assertEqual(code, 0, out)
        with open(self.path("answers.jsonl"), encoding="utf-8", errors="replace") as f:
            ours = [json.loads(line) for line in f]
        differ, compared = [], 0
        for task in ref["tasks"]:
            mine = [o for o in ours if o["task"] == task["label"]]
            for i, item in enumerate(task["items"]):
                compared += 1
                o = mine[i] if i < len(mine) else {}
                same = o.get("correct") == item["correct"] and (o.get("pred") == item["pred"] if "pred" in item else o.get("answer") == item["completion"])
                if not same:
                    differ.append("%s item %d: ours %s, reference %s" % (task["label"], i, o, {k: item.get(k) for k in ("correct", "pred", "completion")}))
        with self.subTest("%s: %d items: verdicts, letters and answers identical to the reference's" % (tasks, compared)):
            self.assertTrue(compared == len(ours) == n_items and not differ, "%d compared, %d ours; differ:\n%s" % (compared, len(ours), "\n".join(differ)))
        answers = [o["answer"] for o in ours if "answer" in o]
        with self.subTest("the answers are real text: 64 tokens or fewer of several words each, one with a calculator call"):
            self.assertTrue(len(answers) == n_answers and sum(len(a) > 20 for a in answers) >= 8 and any("<|python_start|>" in a for a in answers),
                            answers)
        m = re.search(r"ChatCORE ([0-9.-]+)( \(6 tasks with SpellingBee[^)]*\))? \| ChatCORE_cat ([0-9.-]+)", out)
        csv = read(self.path("chatcore.csv")).decode()
        with self.subTest("ChatCORE %.6f and the CSV as the reference's" % ref["chatcore"]):
            self.assertTrue(m and abs(float(m.group(1)) - ref["chatcore"]) < 1e-6 and ("ChatCORE,,,,,%.6f" % ref["chatcore"]) in csv, out + csv)
        return out

    def test_against_reference(self):
        """the mini bundle (ChatCORE's five tasks): every item as the PyTorch reference scores it"""
        out = self.against_reference(TASKS, REFERENCE, 32, 10)
        self.assertNotIn("SpellingBee", out)

    def test_study_bundle(self):
        """the mini bundle with SpellingBee (ChatCORE before July 2026, the study's): every item as the reference scores it,
        ChatCORE over the six tasks"""
        out = self.against_reference(STUDY_TASKS, STUDY_REFERENCE, 48, 26)
        self.assertIn("(6 tasks with SpellingBee: nanochat's ChatCORE before July 2026)", out)

    def test_ranks(self):
        """--ranks 2 splits the items and gives the same table"""
        _, one = chat_eval("-c", TASKS, "--max-new", "16")
        code, two = chat_eval("-c", TASKS, "--max-new", "16", "--ranks", "2")
        table = lambda out: [line for line in out.split("\n") if re.match(r"(ARC|MMLU|GSM8K|HumanEval|ChatCORE )", line)]  # noqa: E731
        self.assertTrue(code == 0 and len(table(one)) == 6 and table(one) == table(two), "1 rank:\n%s\n2 ranks:\n%s" % (one, two))

    def humaneval_task(self, imports):
        """A task directory of one HumanEval item (the first of the mini bundle's prompts) whose program is `imports`:
        the answer and the tests follow as the text of a raw string (never run: a program that reaches them fails)."""
        good = read(os.path.join(REPO, TASKS, "05_HumanEval.bin"))
        (n_prompt,) = struct.unpack_from("<I", good, 1024)
        strings = [(imports + "\nr'''").encode(), b"'''\ndef check(f):\n    pass", b"f"]
        item = good[1024:1028 + 4 * n_prompt] + struct.pack("<III", 0, 0, len(strings)) + b"".join(struct.pack("<I", len(s)) + s for s in strings)
        os.makedirs(self.path("tasks"))
        with open(self.path("tasks", "05_HumanEval.bin"), "wb") as f:
            f.write(good[:12] + struct.pack("<i", 1) + good[16:1024] + item)
        with open(self.path("tasks", "index.txt"), "w") as f:
            f.write("05_HumanEval.bin HumanEval generative 1 0\n")
        return self.path("tasks")

    @staticmethod
    def running(mark):
        """the processes whose command line holds `mark` (a zombie's is empty)"""
        return [int(d) for d in os.listdir("/proc") if d.isdigit() and mark.encode() in read("/proc/%s/cmdline" % d)]

    def test_killed_mid_humaneval(self):
        """chat_eval killed (SIGKILL) while a HumanEval program runs: the program dies with it, none is left running"""
        mark = self.path("humaneval_running")  # in the program's text, so in its command line (python3 -c PROGRAM)
        tasks = self.humaneval_task("import time\ntime.sleep(300)  # %s" % mark)
        p = subprocess.Popen([binary("chat_eval"), "-e", MODEL, "-c", tasks, "--max-new", "1"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not self.running(mark) and p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        pids = self.running(mark)
        workdir = os.readlink("/proc/%d/cwd" % pids[0]) if pids else ""  # the program's temporary directory: a killed chat_eval leaves it
        p.kill()
        p.wait()
        deadline = time.time() + 5
        while self.running(mark) and time.time() < deadline:
            time.sleep(0.02)
        left = self.running(mark)
        for q in left:
            os.kill(q, signal.SIGKILL)
        if workdir.startswith("/tmp/xsa_humaneval_"):
            shutil.rmtree(workdir, ignore_errors=True)
        self.assertTrue(pids, "the HumanEval program did not start (chat_eval exited %s)" % p.returncode)
        self.assertEqual(left, [], "the HumanEval program (pid %s) outlived chat_eval" % pids)

    def test_humaneval_boundary(self):
        """a HumanEval program that crosses every line it can, run by chat_eval: it starts a process in a session of its
        own, writes to every descriptor past the pass marker's (chat_eval was given a file open at 100), kills its parent
        and every process whose command line names this test's task directory, then exits with 0 before its tests.
        chat_eval finishes, the answer counts wrong, the file stays empty and no process is left behind
        (dev/docs/evaluation.md#chatcore). Needs the namespaces, where the kernel allows them (chat_eval's note says
        when it does not)."""
        mark = "xsa_survivor_%d_%s" % (os.getpid(), os.path.basename(self.dir))
        tasks = self.humaneval_task(
            "import os, posix, sys\n"
            "if posix.fork() == 0:\n"
            "    os.setsid()\n"
            "    posix.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', %r])\n"
            "for fd in range(4, 1024):\n"
            "    try:\n"
            "        os.write(fd, b'leaked\\n')\n"
            "    except OSError:\n"
            "        pass\n"
            "evaluators = [int(d) for d in os.listdir('/proc') if d.isdigit() and int(d) != os.getpid() and %r in open('/proc/%%s/cmdline' %% d, 'rb').read()]\n"
            "for pid in [os.getppid()] + evaluators:\n"
            "    try:\n"
            "        posix.kill(pid, 9)\n"
            "    except OSError:\n"
            "        pass\n"
            "sys.exit(0)" % (mark, self.path("tasks").encode()))
        inherited = os.open(self.path("inherited.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(inherited, 100)
        try:
            p = subprocess.run([binary("chat_eval"), "-e", MODEL, "-c", tasks, "--max-new", "1", "--answers", self.path("answers.jsonl")], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(100,), timeout=300)
        finally:
            os.close(100)
            os.close(inherited)
        out = p.stdout.decode(errors="replace")
        if "runs without namespaces" in out:
            self.skipTest(out.strip().split("\n")[0])
        time.sleep(0.1)
        left = self.running(mark)
        for q in left:
            os.kill(q, signal.SIGKILL)
        self.assertEqual(p.returncode, 0, "chat_eval did not finish (killed by the program?)\n" + out)
        with open(self.path("answers.jsonl")) as f:
            verdicts = [json.loads(line)["correct"] for line in f]
        self.assertEqual(verdicts, [False], "the program exited with 0 before its tests: wrong")
        self.assertEqual(read(self.path("inherited.txt")), b"", "the program wrote to chat_eval's descriptor")
        self.assertEqual(left, [], "a process the program started outlived it")

    def test_bad_inputs(self):
        """bad options and task files: exit 1, one error line"""
        ce = binary("chat_eval")
        check_one_error(self, [ce, "-e", MODEL], "needs -e CHECKPOINT and -c TASKDIR")
        check_one_error(self, [ce, "-e", MODEL, "-c", TASKS, "--max-new", "0"], "--max-new must be >= 1")
        check_one_error(self, [ce, "-e", MODEL, "-c", TASKS, "--answers", self.path("a.jsonl"), "--ranks", "2"], "--answers needs --ranks 1")
        check_one_error(self, [ce, "-e", MODEL, "-c", self.path("none")], "cannot read")
        good = read(os.path.join(REPO, TASKS, "01_ARC-Easy.bin"))
        cases = {
            "magic": (struct.pack("<i", 20241202) + good[4:], "is not a ChatCORE task file"),
            "truncated": (good[:-3], "truncated"),
            "vocab": (good[:16] + struct.pack("<i", 50000) + good[20:], "was made with a tokenizer of 50000 tokens"),
            "trailing": (good + b"\0\0\0\0", "bytes after its"),
        }
        for name, (data, expect) in cases.items():
            os.makedirs(self.path(name))
            with open(self.path(name, "01_ARC-Easy.bin"), "wb") as f:
                f.write(data)
            with open(self.path(name, "index.txt"), "w") as f:
                f.write("01_ARC-Easy.bin ARC-Easy categorical 8 0.25\n")
            check_one_error(self, [ce, "-e", MODEL, "-c", self.path(name)], expect)

    def test_outputs_checked_first(self):
        """-o and --answers that cannot be written are refused before the evaluation (one error line, nothing evaluated)"""
        ce = binary("chat_eval")
        os.makedirs(self.path("dir.csv"))
        cases = [("-o", self.path("none", "out.csv"), "-o '%s': the directory '%s' does not exist" % (self.path("none", "out.csv"), self.path("none"))),
                 ("-o", self.path("dir.csv"), "-o '%s' is a directory" % self.path("dir.csv")),
                 ("--answers", self.path("none", "a.jsonl"), "--answers '%s': the directory '%s' does not exist" % (self.path("none", "a.jsonl"),
                                                                                                                  self.path("none")))]
        for flag, path, expect in cases:
            argv = [ce, "-e", MODEL, "-c", TASKS, "--max-cat", "1", "--max-sample", "1", "--max-new", "1", flag, path]
            check_one_error(self, argv, expect)
            code, out = run(argv)
            with self.subTest("%s %s: refused before the evaluation" % (flag, path)):
                self.assertTrue(code == 1 and "ChatCORE" not in out and "items in" not in out, "exit %d:\n%s" % (code, out))
        check_one_error(self, [ce, "-e", MODEL, "-c", TASKS, "-o", self.path("same"), "--answers", self.path("same")],
                        "-o and --answers name the same file")

    def test_index_and_prompts(self):
        """an index.txt line longer than 4095 bytes is read whole (not split into a second task name); a prompt of BOS
        alone is refused as such (not as one that does not start with BOS)"""
        good = read(os.path.join(REPO, TASKS, "01_ARC-Easy.bin"))
        os.makedirs(self.path("long"))
        with open(self.path("long", "01_ARC-Easy.bin"), "wb") as f:
            f.write(good)
        with open(self.path("long", "index.txt"), "w") as f:
            f.write("01_ARC-Easy.bin ARC-Easy categorical 8 0.25 " + "x" * 5000 + "\n")  # (4096 bytes in: a second "name" at old builds)
        code, out = chat_eval("-c", self.path("long"), "--max-cat", "2")
        with self.subTest("a line of 5,000 bytes: ARC-Easy evaluated, nothing else"):
            self.assertTrue(code == 0 and re.search(r"^ARC-Easy\b", out, re.M), "exit %d:\n%s" % (code, out[-3000:]))
        (n_prompt,) = struct.unpack_from("<I", good, 1024)
        (bos,) = struct.unpack_from("<i", good, 20)
        os.makedirs(self.path("bos"))
        with open(self.path("bos", "01_ARC-Easy.bin"), "wb") as f:
            f.write(good[:1024] + struct.pack("<II", 1, bos) + good[1028 + 4 * n_prompt:])
        with open(self.path("bos", "index.txt"), "w") as f:
            f.write("01_ARC-Easy.bin ARC-Easy categorical 8 0.25\n")
        check_one_error(self, [binary("chat_eval"), "-e", MODEL, "-c", self.path("bos")], "item 0's prompt is BOS alone")


if __name__ == "__main__":
    unittest.main()
