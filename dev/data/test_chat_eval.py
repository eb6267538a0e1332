#!/usr/bin/env python3
"""Tests of dev/data/chat_eval.py (nanochat's ChatCORE tasks as task files), offline, and of the pure-Python parts
of the reference scorer dev/reference/score_chat.py (its tokenizer, calculator, checkers and generation loop):

  * the first item of each kind of task (ARC with the labels 1-4, MMLU, GSM8K, HumanEval) against prompts written
    out here and tokenized from the special ids and the encode_ordinary of their text;
  * letters as single tokens, gold indexes, GSM8K references ("#### 1,200" -> "1200"), HumanEval imports, for
    every item, restated here from nanochat's tasks;
  * `chat_eval.py --mini` reproduces the committed dev/data/chat_tasks byte for byte (also from the hub's parquet
    layout with --offline), and --max-per-task / --tasks give the committed items' prefixes;
  * a reader written here from dev/data/README.md ("ChatCORE task files") parses the committed files and decodes
    their prompts back to text;
  * errors: one `error:` line and exit code 1;
  * the reference scorer's tokenizer (tokenizer_file.py) against tiktoken, and score_chat.py's calculator,
    answer extraction, program runner and generation loop with the calculator tool.

    python3 dev/data/test_chat_eval.py        (or all suites: make test)

Needs tiktoken and numpy (pyarrow for the parquet test; python3 -m pip install -r dev/data/requirements.txt):
without them the tests are skipped, except where the environment variable CI is set (there they fail).
"""
import json
import os
import shutil
import struct
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
from xsatest import REPO, check_one_error, copy_jsonl, jsonl, needs_packages, read, run, token_pieces  # noqa: E402

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "dev", "reference"))

BUNDLE = os.path.join(REPO, "dev/data/chat_bundle")
COMMITTED = os.path.join(REPO, "dev/data/chat_tasks")
TOKENIZER = "dev/data/devil/tokenizer.bin"
FILES = ["01_ARC-Easy.bin", "02_ARC-Challenge.bin", "03_MMLU.bin", "04_GSM8K.bin", "05_HumanEval.bin", "index.txt"]
SPLIT_FILES = ["arc_easy_test", "arc_challenge_test", "mmlu_test", "gsm8k_test", "humaneval_test"]
HUB_DIRS = {"arc_easy_test": "allenai--ai2_arc/ARC-Easy/test", "arc_challenge_test": "allenai--ai2_arc/ARC-Challenge/test",
            "mmlu_test": "cais--mmlu/all/test", "gsm8k_test": "openai--gsm8k/main/test",
            "humaneval_test": "openai--openai_humaneval/openai_humaneval/test"}

# the devil tokenizer (vocab 4096): nanochat's 9 special tokens are the last 9 ids, in this order
BOS, US, UE, AS, AE, PS, PE, OS, OE = range(4087, 4096)
SPECIAL_NAMES = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                 "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>"]
CHAT_MAGIC = 20261203

INSTRUCTION = "\nRespond only with the letter of the correct answer."
# the first item of each task: row 3 of its file (numpy.random.default_rng(42).permutation(8), (6) and (4) all
# start with 3), written out by hand
ARC_EASY_0 = ("Multiple Choice question: A student drops a ball from a table. Which force pulls the ball toward the "
              "floor?\n- friction=1\n- magnetism=2\n- gravity=3\n- electricity=4\n" + INSTRUCTION)
MMLU_0 = "Multiple Choice question: What is the value of 3x + 2 when x = 4?\n- 10=A\n- 12=B\n- 14=C\n- 16=D\n" + INSTRUCTION
GSM8K_0 = "A school orders 40 boxes of paper. Each box holds 30 packs. How many packs does the school order?"
HUMANEVAL_0 = ("import re\n# counting helpers\nfrom collections import Counter\n\n\n"
               "def most_common_word(text: str) -> str:\n"
               "    \"\"\" Return the most frequent lower-case word of text (words are runs of letters);\n"
               "    on a tie, the one that appears first.\n"
               "    >>> most_common_word('The cat and the hat')\n"
               "    'the'\n"
               "    \"\"\"\n")
HUMANEVAL_0_TEST = ("\n\ndef check(candidate):\n    assert candidate('The cat and the hat') == 'the'\n"
                    "    assert candidate('b a b a') == 'b'\n    assert candidate('One, two; TWO!') == 'two'\n")


def read_chat_file(path):
    """A ChatCORE task file as (header dict, [(prompt, choices, gold, strings)]), parsed from the format in
    dev/data/README.md; raises AssertionError where the file breaks it."""
    data = read(path)
    assert len(data) >= 1024, "%s: shorter than the header" % path
    h = struct.unpack_from("<256i", data, 0)
    assert h[0] == CHAT_MAGIC and h[1] == 1, "%s: magic %d version %d" % (path, h[0], h[1])
    assert all(x == 0 for x in h[41:]), "%s: header ints 41..255 are not 0" % path
    label = data[36:164]
    assert label.rstrip(b"\0").find(b"\0") < 0, "%s: label not NUL-padded" % path
    head = dict(kind=h[2], n=h[3], vocab=h[4], bos=h[5], max_per_task=h[6],
                baseline=struct.unpack_from("<f", data, 28)[0], checker=h[8], label=label.rstrip(b"\0").decode("utf-8"))
    pos, items = 1024, []

    def u32():
        nonlocal pos
        v = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        return v

    for _ in range(h[3]):
        n = u32()
        prompt = list(struct.unpack_from("<%dI" % n, data, pos))
        pos += 4 * n
        n = u32()
        choices = list(struct.unpack_from("<%dI" % n, data, pos))
        pos += 4 * n
        gold = u32()
        strings = []
        for _ in range(u32()):
            n = u32()
            strings.append(data[pos:pos + n].decode("utf-8"))
            pos += n
        items.append((prompt, choices, gold, strings))
    assert pos == len(data), "%s: %d bytes after the last item" % (path, len(data) - pos)
    return head, items


def chat_prompt(enc, text):
    """render_for_completion of [user text, assistant ...], built by hand"""
    return [BOS, US] + enc.encode_ordinary(text) + [UE, AS]


@needs_packages("tiktoken", "numpy")
class TestItems(unittest.TestCase):
    """The committed task files' items against prompts worked out here."""

    @classmethod
    def setUpClass(cls):
        import climbmix
        cls.enc, _ = climbmix.read_tokenizer(os.path.join(REPO, TOKENIZER))
        cls.files = {name: read_chat_file(os.path.join(COMMITTED, name)) for name in FILES[:-1]}

    def E(self, text):
        return self.enc.encode_ordinary(text)

    def test_special_ids(self):
        """the devil tokenizer's 9 special tokens are ids 4087..4095 in nanochat's order; A-E and 1-5 are one token each"""
        self.assertEqual([self.enc.encode_single_token(n) for n in SPECIAL_NAMES], list(range(4087, 4096)))
        self.assertEqual([self.E(c) for c in "ABCDE12345"], [[65], [66], [67], [68], [69], [49], [50], [51], [52], [53]])

    def test_arc_first_item(self):
        """ARC-Easy item 0 (labels 1-4): render_mc text with the numeric labels, letters '1'..'4', gold 2 ('3')"""
        prompt, choices, gold, strings = self.files["01_ARC-Easy.bin"][1][0]
        self.assertEqual(prompt, chat_prompt(self.enc, ARC_EASY_0))
        self.assertEqual(prompt[-1], AS)
        self.assertEqual((choices, gold, strings), ([49, 50, 51, 52], 2, []))

    def test_arc_choice_counts(self):
        """ARC-Easy items 1 and 5: the 5-choice row (letters A-E, gold 'C') and the 3-choice row (A-C, gold 'A')"""
        items = self.files["01_ARC-Easy.bin"][1]
        self.assertEqual(items[1][0], chat_prompt(self.enc, "Multiple Choice question: Which of these animals is a mammal?\n"
                                                  "- a frog=A\n- a salmon=B\n- a whale=C\n- a lizard=D\n- a sparrow=E\n" + INSTRUCTION))
        self.assertEqual(items[1][1:], ([65, 66, 67, 68, 69], 2, []))
        self.assertEqual(items[5][0], chat_prompt(self.enc, "Multiple Choice question: What does a green plant take from "
                                                  "sunlight to make its food?\n- energy=A\n- water=B\n- soil=C\n" + INSTRUCTION))
        self.assertEqual(items[5][1:], ([65, 66, 67], 0, []))

    def test_mmlu_first_item(self):
        """MMLU item 0: render_mc with A-D, gold 2 ('C')"""
        prompt, choices, gold, strings = self.files["03_MMLU.bin"][1][0]
        self.assertEqual(prompt, chat_prompt(self.enc, MMLU_0))
        self.assertEqual((choices, gold, strings), ([65, 66, 67, 68], 2, []))

    def test_gsm8k_first_item(self):
        """GSM8K item 0: the question as the user message, ends with <|assistant_start|>; reference '1200' from '#### 1,200'"""
        prompt, choices, gold, strings = self.files["04_GSM8K.bin"][1][0]
        self.assertEqual(len(self.E(GSM8K_0)), 34)
        self.assertEqual(prompt, [BOS, US] + self.E(GSM8K_0) + [UE, AS])
        self.assertEqual((choices, gold, strings), ([], 0, ["1200"]))

    def test_humaneval_first_item(self):
        """HumanEval item 0: the prompt as the user message; imports (comment skipped), test, entry point"""
        prompt, choices, gold, strings = self.files["05_HumanEval.bin"][1][0]
        self.assertEqual(prompt, chat_prompt(self.enc, HUMANEVAL_0))
        self.assertEqual((choices, gold), ([], 0))
        self.assertEqual(strings, ["import re\nfrom collections import Counter", HUMANEVAL_0_TEST, "most_common_word"])

    def test_every_item_restated(self):
        """every item of every file against its row, restated from nanochat's tasks (row order, letters, gold, references)"""
        import re
        import numpy as np
        for name, split in zip(FILES[:-1], SPLIT_FILES):
            rows = jsonl(os.path.join(BUNDLE, split + ".jsonl"))
            perm = np.random.default_rng(42).permutation(len(rows)).tolist()
            head, items = self.files[name]
            self.assertEqual(len(items), len(rows), name)
            for k, (prompt, choices, gold, strings) in enumerate(items):
                row = rows[perm[k]]
                with self.subTest(file=name, item=k):
                    if split.startswith("arc") or split == "mmlu_test":
                        if split.startswith("arc"):
                            letters, texts = row["choices"]["label"], row["choices"]["text"]
                            answer = letters.index(row["answerKey"])
                        else:
                            letters, texts, answer = list("ABCD"), row["choices"], row["answer"]
                        text = "Multiple Choice question: %s\n%s" % (row["question"], "".join(
                            "- %s=%s\n" % (t, l) for l, t in zip(letters, texts))) + INSTRUCTION
                        self.assertTrue(all(len(self.E(l)) == 1 for l in letters))
                        self.assertEqual((prompt, choices, gold, strings),
                                         (chat_prompt(self.enc, text), [self.E(l)[0] for l in letters], answer, []))
                    elif split == "gsm8k_test":
                        last = re.split(r"<<[^>]+>>", row["answer"])[-1]
                        ref = re.search(r"#### (\-?[0-9\.\,]+)", last).group(1).strip().replace(",", "")
                        self.assertEqual((prompt, choices, gold, strings), (chat_prompt(self.enc, row["question"]), [], 0, [ref]))
                    else:
                        imports = [ln.strip() for ln in row["prompt"].split("\n") if ln.strip().startswith(("import ", "from "))]
                        self.assertEqual((prompt, choices, gold), (chat_prompt(self.enc, row["prompt"]), [], 0))
                        self.assertEqual(strings, ["\n".join(imports), row["test"], row["entry_point"]])
        refs = [it[3][0] for it in self.files["04_GSM8K.bin"][1]]
        self.assertEqual(sorted(refs), sorted(["19", "135", "45", "1200", "-3", "7.5"]))


class ChatEvalRun(unittest.TestCase):
    """Runs chat_eval.py in a temporary directory (no tests of its own)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_chat_eval_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def chat_eval(self, out, *args):
        return run([sys.executable, "dev/data/chat_eval.py", "--tokenizer", TOKENIZER, "--out", out] + list(args))

    def assertSameFiles(self, out_dir, names, code, out):
        differ = [n for n in names if read(os.path.join(out_dir, n)) == b""
                  or read(os.path.join(out_dir, n)) != read(os.path.join(COMMITTED, n))]
        self.assertTrue(code == 0 and not differ, "exit %d, files missing or different: %s\n%s" % (code, differ, out[-3000:]))


@needs_packages("tiktoken", "numpy")
class TestFiles(ChatEvalRun):
    """chat_eval.py --mini and the committed dev/data/chat_tasks."""

    def test_reproduces_committed(self):
        """chat_eval.py --mini writes exactly the committed dev/data/chat_tasks (and nothing else)"""
        out_dir = os.path.join(self.dir, "out")
        code, out = self.chat_eval(out_dir, "--mini")
        self.assertSameFiles(out_dir, FILES, code, out)
        self.assertEqual(sorted(os.listdir(out_dir)), FILES, "files left behind")

    def test_study_bundle(self):
        """chat_eval.py --mini --spellingbee --max-per-task 16 writes exactly the committed dev/data/chat_tasks_study; its
        SpellingBee item 0 (test example 0) is the user message nanochat 950a1dc^'s SpellingBee printed, reference '1'"""
        out_dir = os.path.join(self.dir, "study")
        code, out = self.chat_eval(out_dir, "--mini", "--spellingbee", "--max-per-task", "16")
        study = os.path.join(REPO, "dev/data/chat_tasks_study")
        names = sorted(os.listdir(study))
        differ = [n for n in names if read(os.path.join(out_dir, n)) != read(os.path.join(study, n))]
        self.assertTrue(code == 0 and len(names) == 7 and not differ, "exit %d, differ: %s\n%s" % (code, differ, out[-2000:]))
        import climbmix
        enc, _ = climbmix.read_tokenizer(os.path.join(REPO, TOKENIZER))
        head, items = read_chat_file(os.path.join(study, "06_SpellingBee.bin"))
        self.assertEqual(len(items), 16)
        self.assertEqual(items[0], ([BOS, US] + enc.encode_ordinary("How many 'v' are in the word level?") + [UE, AS], [], 0, ["1"]))

    def test_committed_files(self):
        """the committed files parsed by a reader written from the format: headers, index.txt, item 0 decoded to text"""
        pieces, _ = token_pieces(os.path.join(REPO, TOKENIZER))
        want = {"01_ARC-Easy.bin": (0, 8, 0.25, 0, "ARC-Easy", ARC_EASY_0),
                "02_ARC-Challenge.bin": (0, 6, 0.25, 0, "ARC-Challenge", None),
                "03_MMLU.bin": (0, 8, 0.25, 0, "MMLU", MMLU_0),
                "04_GSM8K.bin": (1, 6, 0.0, 1, "GSM8K", GSM8K_0),
                "05_HumanEval.bin": (1, 4, 0.0, 2, "HumanEval", HUMANEVAL_0)}
        for name, (kind, n, base, checker, label, text0) in want.items():
            with self.subTest(file=name):
                head, items = read_chat_file(os.path.join(COMMITTED, name))
                self.assertEqual(head, dict(kind=kind, n=n, vocab=4096, bos=BOS, max_per_task=-1, baseline=base,
                                            checker=checker, label=label))
                for prompt, choices, gold, strings in items:
                    self.assertEqual((prompt[:2], prompt[-2:]), ([BOS, US], [UE, AS]))
                    self.assertEqual([t for t in prompt if t >= BOS], [BOS, US, UE, AS], "special tokens inside the text")
                    self.assertEqual(len(strings), {0: 0, 1: 1, 2: 3}[checker])
                    self.assertTrue(kind == 1 or gold < len(choices))
                if text0 is not None:
                    decoded = b"".join(pieces[t] for t in items[0][0]).decode("utf-8")
                    self.assertEqual(decoded, "<|bos|><|user_start|>" + text0 + "<|user_end|><|assistant_start|>")
        with open(os.path.join(COMMITTED, "index.txt"), encoding="utf-8") as f:
            self.assertEqual(f.read(), "01_ARC-Easy.bin ARC-Easy categorical 8 0.25\n"
                                       "02_ARC-Challenge.bin ARC-Challenge categorical 6 0.25\n"
                                       "03_MMLU.bin MMLU categorical 8 0.25\n"
                                       "04_GSM8K.bin GSM8K generative 6 0\n"
                                       "05_HumanEval.bin HumanEval generative 4 0\n")

    def test_max_per_task_and_tasks(self):
        """--max-per-task 2 --tasks GSM8K,MMLU: 03_MMLU.bin and 04_GSM8K.bin with the committed files' first 2 items"""
        out_dir = os.path.join(self.dir, "out")
        code, out = self.chat_eval(out_dir, "--mini", "--max-per-task", "2", "--tasks", "GSM8K,MMLU")
        self.assertEqual(code, 0, out)
        self.assertEqual(sorted(os.listdir(out_dir)), ["03_MMLU.bin", "04_GSM8K.bin", "index.txt"])
        for name in ("03_MMLU.bin", "04_GSM8K.bin"):
            head, items = read_chat_file(os.path.join(out_dir, name))
            chead, citems = read_chat_file(os.path.join(COMMITTED, name))
            self.assertEqual((head["n"], head["max_per_task"]), (2, 2))
            self.assertEqual(dict(head, n=chead["n"], max_per_task=-1), chead)
            self.assertEqual(items, citems[:2])
        with open(os.path.join(out_dir, "index.txt"), encoding="utf-8") as f:
            self.assertEqual(f.read(), "03_MMLU.bin MMLU categorical 2 0.25\n04_GSM8K.bin GSM8K generative 2 0\n")


@needs_packages("tiktoken", "numpy", "pyarrow")
class TestHubLayout(ChatEvalRun):
    """chat_eval.py reading the hub's parquet layout from --cache-dir."""

    def test_hub_layout_offline(self):
        """the hub path: the bundle as parquet + manifest.json in --cache-dir (ARC's choices a struct), --offline: the same files"""
        import pyarrow as pa
        import pyarrow.parquet as pq
        cache = os.path.join(self.dir, "cache")
        for split in SPLIT_FILES:
            d = os.path.join(cache, HUB_DIRS[split])
            os.makedirs(d)
            rows = jsonl(os.path.join(BUNDLE, split + ".jsonl"))
            cut = len(rows) // 2
            for k, shard in enumerate([rows[:cut], rows[cut:]]):  # two shards, concatenated in order
                pq.write_table(pa.Table.from_pylist(shard), os.path.join(d, "%05d.parquet" % k))
            with open(os.path.join(d, "manifest.json"), "w") as f:
                json.dump(["00000.parquet", "00001.parquet"], f)
        out_dir = os.path.join(self.dir, "out")
        code, out = self.chat_eval(out_dir, "--offline", "--cache-dir", cache)
        self.assertSameFiles(out_dir, FILES, code, out)


@needs_packages("tiktoken", "numpy")
class TestErrors(unittest.TestCase):
    """Bad input: exit code 1 and one `error:` line naming the problem."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_chat_eval_err_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def argv(self, *args):
        return [sys.executable, "dev/data/chat_eval.py", "--tokenizer", TOKENIZER, "--out", os.path.join(self.dir, "out")] + list(args)

    def source(self, name, edit=None, drop=None):
        """a copy of the bundle, without `drop`, with `edit` (a function of the rows) applied to file `name`"""
        return copy_jsonl(BUNDLE, os.path.join(self.dir, name), SPLIT_FILES, edit, drop)

    def test_errors(self):
        """errors: missing source file, --offline without the data, a letter of 2 tokens, bad rows, bad flags"""
        check_one_error(self, self.argv("--source", self.source("a", drop="gsm8k_test")), "missing gsm8k_test.jsonl",
                        "--source without gsm8k_test.jsonl", anywhere=True)
        check_one_error(self, self.argv("--offline", "--cache-dir", os.path.join(self.dir, "empty")),
                        "--offline: allenai/ai2_arc ARC-Easy/test is not downloaded", "--offline, empty cache", anywhere=True)

        def two_token_letter(rows):
            rows[2]["choices"]["label"] = ["1", "2", "3", "10"]
            rows[2]["answerKey"] = "10"
        check_one_error(self, self.argv("--source", self.source("b", edit=("arc_easy_test", two_token_letter))),
                        "arc_easy_test.jsonl line 3 (ARC-Easy): the letter '10' is 2 tokens", "a letter of 2 tokens",
                        anywhere=True)

        def bad_key(rows):
            rows[0]["answerKey"] = "E"
        check_one_error(self, self.argv("--source", self.source("c", edit=("arc_challenge_test", bad_key))),
                        "arc_challenge_test.jsonl line 1 (ARC-Challenge): answerKey 'E' must be one of the labels",
                        "answerKey not a label", anywhere=True)

        def no_answer(rows):
            rows[1]["answer"] = "No answer line."
        check_one_error(self, self.argv("--source", self.source("d", edit=("gsm8k_test", no_answer))),
                        "gsm8k_test.jsonl line 2 (GSM8K): the answer has no '#### N' line", "GSM8K without ####",
                        anywhere=True)
        check_one_error(self, self.argv("--mini", "--max-per-task", "0"), "--max-per-task", anywhere=True)
        check_one_error(self, self.argv("--mini", "--tasks", "ARC-Easy,SQuAD"), "unknown task SQuAD", anywhere=True)
        check_one_error(self, self.argv("--mini", "--source", BUNDLE), "not allowed with", anywhere=True)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "out")), "an error left output behind")


# -----------------------------------------------------------------------------
# The reference scorer's pure-Python parts (dev/reference/tokenizer_file.py, score_chat.py; no torch needed)

@needs_packages("tiktoken")
class TestReferenceTokenizer(unittest.TestCase):
    """tokenizer_file.TokenizerFile: tiktoken's encode_ordinary and decode without tiktoken."""

    @classmethod
    def setUpClass(cls):
        import climbmix
        import tokenizer_file
        cls.enc, _ = climbmix.read_tokenizer(os.path.join(REPO, TOKENIZER))
        cls.tok = tokenizer_file.TokenizerFile(os.path.join(REPO, TOKENIZER))

    def test_encode_numbers(self):
        """what the calculator's results look like (ints, floats, negatives, exponents, tuples, strings): tiktoken's ids"""
        import random
        texts = ["24", "1200", "-3", "7.5", "0.30000000000000004", "1e+16", "-2.5e-07", "()", "inf", "123456789012345678901",
                 "3", "1j", "Hello World", "b'abc'", " 48", "12 34"]
        r = random.Random(7)
        texts += ["".join(r.choice("0123456789.-+e()' abcXYZ_\n") for _ in range(r.randint(1, 24))) for _ in range(2000)]
        for t in texts:
            self.assertEqual(self.tok.encode_ordinary(t), self.enc.encode_ordinary(t), repr(t))

    def test_encode_test_text(self):
        """dev/data/encoder_test.txt (multilingual, adversarial), whole and line by line: tiktoken's ids"""
        with open(os.path.join(HERE, "encoder_test.txt"), encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(self.tok.encode_ordinary(text), self.enc.encode_ordinary(text))
        for line in text.split("\n"):
            self.assertEqual(self.tok.encode_ordinary(line), self.enc.encode_ordinary(line), repr(line))

    def test_decode(self):
        """decode: the tokens' bytes (special tokens as their text), UTF-8 with errors='replace', as tiktoken"""
        import random
        r = random.Random(3)
        self.assertEqual(self.tok.decode(list(range(4096))), self.enc.decode(list(range(4096))))
        for _ in range(2000):
            ids = [r.randrange(4096) for _ in range(r.randint(0, 10))]
            self.assertEqual(self.tok.decode(ids), self.enc.decode(ids))
        self.assertEqual(self.tok.decode([PS] + self.enc.encode_ordinary("2*3") + [PE]), "<|python_start|>2*3<|python_end|>")
        self.assertEqual(self.tok.special, dict(zip(SPECIAL_NAMES, range(4087, 4096))))

    def test_fingerprint(self):
        """fingerprint(): the devil tokenizer's, as train_gpt records it in exported weights"""
        self.assertEqual(self.tok.fingerprint(), "f3671f9c1b7b2e0b")


@needs_packages("tiktoken")
class TestReferenceScorer(unittest.TestCase):
    """score_chat.py's calculator, checkers and generation loop (the model replaced by a scripted next token)."""

    @classmethod
    def setUpClass(cls):
        import score_chat
        import tokenizer_file
        cls.sc = score_chat
        cls.tok = tokenizer_file.TokenizerFile(os.path.join(REPO, TOKENIZER))
        cls.sp = score_chat.Specials(cls.tok)

    def E(self, text):
        return self.tok.encode_ordinary(text)

    def test_calculator(self):
        """use_calculator: nanochat engine.py's rules (commas, no '**', the .count() branch, dangerous words, errors -> None)"""
        calc = self.sc.use_calculator
        cases = [("3*8", 24), ("1,200/4", 300.0), ("10 - 4.5", 5.5), ("(2+3)*4", 20), ("7/2", 3.5), ("-3", -3),
                 ("2**10", None), ("1/0", None), ("3 +", None), ("()", ()), ("", None),
                 ("'strawberry'.count('r')", 3), ('"banana".count("an")', 2), ("'ab'.upper()", None),
                 ("__import__('os')", None), ("'x'.count('x') and open", None), ("abc", None), ("2^3", None),
                 ("'a,b'.count(',')", 3), ("x.count(1)", None)]
        for expr, want in cases:
            got = calc(expr)
            self.assertEqual((got, type(got)), (want, type(want)), expr)

    def test_checkers(self):
        """extract_answer (first '#### ', commas, sign) and extract_program (first fenced block, else all, stripped)"""
        ea, ep = self.sc.extract_answer, self.sc.extract_program
        self.assertEqual([ea("so #### 1,200 packs"), ea("#### -3\n#### 4"), ea("####5"), ea("#### 7.5."), ea("none")],
                         ["1200", "-3", None, "7.5.", None])
        self.assertEqual(ep("Here:\n```python\ndef f():\n    return 1\n```\nand ```\nx\n```"), "def f():\n    return 1")
        self.assertEqual(ep("```\n  y = 2\n```"), "y = 2")
        self.assertEqual(ep("  def g(): pass \n"), "def g(): pass")

    def test_execute_code(self):
        """execute_code: a bundle solution (fenced) passes its test, a wrong one fails with the exception's line, a hang times out,
        output that is not UTF-8 is no error"""
        row = jsonl(os.path.join(BUNDLE, "humaneval_test.jsonl"))[3]
        imports = "import re\nfrom collections import Counter"
        good = "Here it is:\n```python\n" + row["prompt"] + row["canonical_solution"] + "```\nDone."
        self.assertEqual(self.sc.execute_code(self.sc.humaneval_program(imports, good, row["test"], row["entry_point"])), (True, None))
        bad = "def most_common_word(text):\n    return 'cat'\n"
        ok, err = self.sc.execute_code(self.sc.humaneval_program(imports, bad, row["test"], row["entry_point"]))
        self.assertEqual((ok, err), (False, "AssertionError"))
        self.assertEqual(self.sc.execute_code("while True: pass", timeout=0.5), (False, "Execution timed out (process killed)"))
        self.assertEqual(self.sc.execute_code("import os\nos.remove('x')")[0], False)  # the guard
        self.assertEqual(self.sc.execute_code("import sys\nsys.stdout.buffer.write(b'\\xff')\nsys.exit(1)"), (False, "Execution failed"))

    def test_unicode_answers(self):
        """HumanEval verdicts that only the decoding and Python's Unicode whitespace decide, by nanochat's code: broken UTF-8
        in a comment (decoded to U+FFFD), a no-break space after ```python and a trailing U+3000 pass; U+200B (not
        whitespace) after ```python fails. dev/test/test_infra.cu checks that the trainer's checker gives these verdicts."""
        test = "def check(candidate):\n    assert candidate(2) == 3\n    assert candidate(-1) == 0\n"
        broken = self.tok.decode(self.E("```python\ndef add_one(x):\n    # one more ") + [self.tok.ranks[b"\xff"], self.tok.ranks[b"\xe3"],
                                 self.tok.ranks[b"\x80"]] + self.E("\n    return x + 1\n```"))
        self.assertEqual(broken.count("\ufffd"), 2)
        cases = [(broken, True), ("```python\u00a0\ndef add_one(x):\n    return x + 1\n```", True),
                 ("def add_one(x):\n    return x + 1\u3000", True), ("```python\u200b\ndef add_one(x):\n    return x + 1\n```", False)]
        for completion, want in cases:
            ok, _ = self.sc.execute_code(self.sc.humaneval_program("import math", completion, test, "add_one"))
            self.assertEqual(ok, want, repr(completion))

    def script(self, tokens):
        """a next_token that returns `tokens` in order and records the sequences it was asked about"""
        calls, it = [], iter(tokens)

        def next_token(seq):
            calls.append(list(seq))
            return next(it)
        return next_token, calls

    def test_generate_calculator(self):
        """generate: <|python_start|>12*10<|python_end|> forces <|output_start|>120<|output_end|> (the model not asked there)"""
        prompt = [BOS, US] + self.E("Q") + [UE, AS]
        call = [PS] + self.E("12*10") + [PE]
        tail = self.E(" so #### 120")
        nt, calls = self.script(call + tail + [AE])
        out, stop = self.sc.generate(nt, prompt, self.tok, self.sp, 512, 1000)
        forced = [OS] + self.E("120") + [OE]
        self.assertEqual((out, stop), (call + forced + tail, "end"))
        self.assertEqual(len(calls), len(call) + len(tail) + 1)
        self.assertEqual(calls[len(call)], prompt + call + forced, "the model is asked again only after the forced tokens")
        self.assertEqual(self.tok.decode(out), "<|python_start|>12*10<|python_end|><|output_start|>120<|output_end|> so #### 120")

    def test_generate_limits(self):
        """generate: max_new counts forced tokens; seq_len bounds prompt + answer; BOS ends; no output for None or an empty call"""
        prompt = [BOS, US, UE, AS]
        call = [PS] + self.E("3*8") + [PE]
        nt, _ = self.script(call + [AE])
        self.assertEqual(self.sc.generate(nt, prompt, self.tok, self.sp, len(call) + 2, 1000),
                         (call + [OS] + self.E("24")[:1], "max_new_tokens"))
        words = self.E(" one two three four")
        nt, _ = self.script(words)
        self.assertEqual(self.sc.generate(nt, prompt, self.tok, self.sp, 512, 7), (words[:3], "seq_len"))
        nt, _ = self.script(self.E("x") + [BOS])
        self.assertEqual(self.sc.generate(nt, prompt, self.tok, self.sp, 512, 100), (self.E("x"), "end"))
        seq = [PS] + self.E("2**3") + [PE, PS, PE, PE] + self.E("1+1") + [PE]  # refused, empty, no start: nothing forced
        nt, _ = self.script(seq + [AE])
        self.assertEqual(self.sc.generate(nt, prompt, self.tok, self.sp, 512, 100), (seq, "end"))


if __name__ == "__main__":
    unittest.main()
