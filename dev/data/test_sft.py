#!/usr/bin/env python3
"""Tests of dev/data/sft.py (nanochat's SFT mixture as conversation files), offline:

  * render_conversation on hand-made conversations, against ids built here from the special ids and the
    encode_ordinary of each text piece, and masks written out;
  * render_mc's exact text, the GSM8K calculator split, the row permutation and the TaskMixture order
    (the literal expectations were printed by nanochat 92d63d4's own tasks/common.py);
  * the study mixture's spelling and identity tasks (expectations printed by nanochat 950a1dc^'s own
    tasks/spellingbee.py) and the mini study mixture's make-up;
  * `sft.py --mini` reproduces the committed dev/data/sft_mini_tokens byte for byte (also with one worker,
    and from the hub's parquet layout in --cache-dir with --offline);
  * a reader written here from dev/data/README.md ("SFT conversation file") checks the committed files and
    that every conversation decodes back to the text of the row it came from, with the right mask;
  * errors: one `error:` line and exit code 1.

    python3 dev/data/test_sft.py        (or all suites: make test)

Needs tiktoken, numpy and pyarrow (python3 -m pip install -r dev/data/requirements.txt): without them the
tests are skipped, except where the environment variable CI is set (there they fail).
"""
import json
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
from xsatest import REPO, check_one_error, copy_jsonl, jsonl, needs_packages, read, run, token_pieces  # noqa: E402

sys.path.insert(0, HERE)

MINI = os.path.join(REPO, "dev/data/sft_mini")
COMMITTED = os.path.join(REPO, "dev/data/sft_mini_tokens")
TOKENIZER = "dev/data/devil/tokenizer.bin"
FILES = ["sft_train.bin", "sft_val.bin", "sft_meta.json"]
SPLIT_FILES = ["smoltalk_train", "smoltalk_test", "mmlu_auxiliary_train", "mmlu_test", "gsm8k_train", "gsm8k_test"]

# the devil tokenizer (vocab 4096): nanochat's 9 special tokens are the last 9 ids, in this order
BOS, US, UE, AS, AE, PS, PE, OS, OE = range(4087, 4096)
SPECIAL_NAMES = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                 "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>"]
SFT_MAGIC = 20261202
# the hub's datasets and their cache folders (repo with / -> --, then the subset)
HUB_REPOS = {"smoltalk": "HuggingFaceTB/smol-smoltalk", "mmlu": "cais/mmlu", "gsm8k": "openai/gsm8k"}
HUB_DIRS = {"smoltalk": "HuggingFaceTB--smol-smoltalk/default", "mmlu": "cais--mmlu/all", "gsm8k": "openai--gsm8k/main"}


def read_sft_file(path):
    """An SFT conversation file as (header ints, offsets, tokens, mask), parsed from the format in
    dev/data/README.md; raises AssertionError where the file breaks it."""
    data = read(path)
    assert len(data) >= 1024, "%s: shorter than the header" % path
    h = struct.unpack_from("<256i", data, 0)
    lo_c, hi_c, lo_n, hi_n = struct.unpack_from("<4I", data, 8)
    C, N = lo_c | hi_c << 32, lo_n | hi_n << 32
    assert h[0] == SFT_MAGIC and h[1] == 1, "%s: magic %d version %d" % (path, h[0], h[1])
    assert all(x == 0 for x in h[9:]), "%s: header ints 9..255 are not 0" % path
    assert len(data) == 1024 + 8 * (C + 1) + 5 * N, "%s: %d bytes, expected %d" % (path, len(data), 1024 + 8 * (C + 1) + 5 * N)
    offsets = struct.unpack_from("<%dQ" % (C + 1), data, 1024)
    pos = 1024 + 8 * (C + 1)
    tokens = struct.unpack_from("<%dI" % N, data, pos)
    mask = data[pos + 4 * N:]
    return h, C, N, offsets, tokens, mask


# -----------------------------------------------------------------------------
# What each row must become, restated here from nanochat's tasks (not with sft.py's code): a list of
# segments (special token name, or text) with the mask of their tokens.

def mc_text(question, choices):
    lines = ["Multiple Choice question: " + question]
    for letter, choice in zip("ABCD", choices):
        lines.append("- " + choice + "=" + letter)
    return "\n".join(lines) + "\n\nRespond only with the letter of the correct answer."


def expected_segments(kind, row):
    """[kind, value, mask]: ["S", special token name, m] or ["T", UTF-8 text, m] (empty texts, which give no
    tokens, left out)."""
    if kind == "smoltalk":
        msgs = [dict(m) for m in row["messages"]]
        if msgs[0]["role"] == "system":
            msgs[1]["content"] = msgs[0]["content"] + "\n\n" + msgs[1]["content"]
            msgs = msgs[1:]
        turns = [(m["role"], m["content"]) for m in msgs]
    elif kind == "mmlu":
        turns = [("user", mc_text(row["question"], row["choices"])), ("assistant", "ABCD"[row["answer"]])]
    else:
        parts = []
        pos = 0
        for m in re.finditer(r"<<([^>]+)>>", row["answer"]):
            parts.append(("text", row["answer"][pos:m.start()]))
            inner = m.group(1)
            cut = inner.rfind("=")
            parts += [("python", inner[:cut] if cut >= 0 else inner), ("python_output", inner[cut + 1:] if cut >= 0 else "")]
            pos = m.end()
        parts.append(("text", row["answer"][pos:]))
        turns = [("user", row["question"]), ("assistant", parts)]

    def S(name, m):
        return ["S", name, m]

    def T(text, m):
        return ["T", text.encode("utf-8"), m]

    segs = [S("<|bos|>", 0)]
    for role, content in turns:
        if role == "user":
            segs += [S("<|user_start|>", 0), T(content, 0), S("<|user_end|>", 0)]
            continue
        segs.append(S("<|assistant_start|>", 0))
        if isinstance(content, str):
            segs.append(T(content, 1))
        else:
            for part, text in content:
                if part == "text":
                    segs.append(T(text, 1))
                elif part == "python":
                    segs += [S("<|python_start|>", 1), T(text, 1), S("<|python_end|>", 1)]
                else:
                    segs += [S("<|output_start|>", 0), T(text, 0), S("<|output_end|>", 0)]
        segs.append(S("<|assistant_end|>", 1))
    return [s for s in segs if not (s[0] == "T" and s[1] == b"")]


def actual_segments(tokens, mask, pieces, vocab):
    """The tokens of one conversation as segments: ("S", name) per special token, ("T", bytes) per run of
    normal tokens, each with its mask (which must be the same for the whole run)."""
    segs = []
    for t, m in zip(tokens, mask):
        if t >= vocab - 9:
            segs.append(["S", SPECIAL_NAMES[t - (vocab - 9)], m])
        elif segs and segs[-1][0] == "T" and segs[-1][2] == m:
            segs[-1][1] += pieces[t]
        else:
            segs.append(["T", bytearray(pieces[t]), m])
    return [[k, bytes(v) if k == "T" else v, m] for k, v, m in segs]


@needs_packages("tiktoken", "numpy", "pyarrow")
class TestRender(unittest.TestCase):
    """render_conversation and the conversation builders, on hand-made input."""

    @classmethod
    def setUpClass(cls):
        import climbmix
        import sft
        cls.sft = sft
        cls.enc, _ = climbmix.read_tokenizer(os.path.join(REPO, TOKENIZER))
        cls.special = sft.chat_special_ids(cls.enc)

    def E(self, text):
        return self.enc.encode_ordinary(text)

    def render(self, conv, max_tokens=2048):
        return self.sft.render_conversation(conv, self.enc, self.special, max_tokens)

    def test_special_ids(self):
        """the devil tokenizer's 9 special tokens are ids 4087..4095 in nanochat's order"""
        self.assertEqual([self.enc.encode_single_token(n) for n in SPECIAL_NAMES], list(range(4087, 4096)))

    def test_pair(self):
        """render: user/assistant pair; BOS and user tokens mask 0, <|assistant_start|> 0, reply and <|assistant_end|> 1"""
        self.assertEqual([len(self.E("Hi there")), len(self.E("Hello!"))], [3, 4])
        ids, mask = self.render({"messages": [{"role": "user", "content": "Hi there"},
                                              {"role": "assistant", "content": "Hello!"}]})
        self.assertEqual(ids, [BOS, US] + self.E("Hi there") + [UE, AS] + self.E("Hello!") + [AE])
        self.assertEqual(mask, [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1])

    def test_system_merge_multi_turn(self):
        """render: a system message joins the first user message with a blank line; two turns"""
        self.assertEqual([len(self.E(s)) for s in ("Be brief.\n\nWhy?", "Because.", "And now?", "Now.")], [6, 3, 4, 2])
        conv = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"},
                             {"role": "assistant", "content": "Because."}, {"role": "user", "content": "And now?"},
                             {"role": "assistant", "content": "Now."}]}
        ids, mask = self.render(conv)
        self.assertEqual(ids, [BOS, US] + self.E("Be brief.\n\nWhy?") + [UE, AS] + self.E("Because.") + [AE, US]
                         + self.E("And now?") + [UE, AS] + self.E("Now.") + [AE])
        self.assertEqual(mask, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1])
        self.assertEqual(conv["messages"][1]["content"], "Why?", "the input conversation was modified")

    def test_gsm8k_parts(self):
        """render: GSM8K parts; the tool call (python) is trained (mask 1), its output is not (mask 0)"""
        answer = "4 * 12 = <<4*12=48>>48 crayons.\n#### 48"
        parts = [{"type": "text", "text": "4 * 12 = "}, {"type": "python", "text": "4*12"},
                 {"type": "python_output", "text": "48"}, {"type": "text", "text": "48 crayons.\n#### 48"}]
        conv = self.sft.gsm8k_conversation({"question": "Mia has 4 boxes of 12.", "answer": answer})
        self.assertEqual(conv, {"messages": [{"role": "user", "content": "Mia has 4 boxes of 12."},
                                             {"role": "assistant", "content": parts}]})
        self.assertEqual([len(self.E(p)) for p in ("Mia has 4 boxes of 12.", "4 * 12 = ", "4*12", "48", "48 crayons.\n#### 48")],
                         [13, 9, 4, 2, 13])
        ids, mask = self.render(conv)
        self.assertEqual(ids, [BOS, US] + self.E("Mia has 4 boxes of 12.") + [UE, AS] + self.E("4 * 12 = ") + [PS]
                         + self.E("4*12") + [PE, OS] + self.E("48") + [OE] + self.E("48 crayons.\n#### 48") + [AE])
        self.assertEqual(mask, [0, 0] + [0] * 13 + [0, 0] + [1] * 9 + [1] + [1] * 4 + [1, 0] + [0] * 2 + [0]
                         + [1] * 13 + [1])

    def test_gsm8k_split(self):
        """GSM8K calculator split: at the last '=', no '=' gives an empty result, empty text pieces are kept"""
        split = self.sft.gsm8k_parts
        self.assertEqual(split("<<1+1=2>>2"), [{"type": "text", "text": ""}, {"type": "python", "text": "1+1"},
                                               {"type": "python_output", "text": "2"}, {"type": "text", "text": "2"}])
        self.assertEqual(split("a<<x=y=3>><<z>>b"), [
            {"type": "text", "text": "a"}, {"type": "python", "text": "x=y"}, {"type": "python_output", "text": "3"},
            {"type": "text", "text": ""}, {"type": "python", "text": "z"}, {"type": "python_output", "text": ""},
            {"type": "text", "text": "b"}])
        self.assertEqual(split("no calls\n#### 5"), [{"type": "text", "text": "no calls\n#### 5"}])

    def test_truncation(self):
        """render: ids and mask cut to max_tokens"""
        conv = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]}
        full = [BOS, US] + self.E("Hi there") + [UE, AS] + self.E("Hello!") + [AE]
        self.assertEqual(self.render(conv, 7), (full[:7], [0, 0, 0, 0, 0, 0, 0]))
        self.assertEqual(self.render(conv, 8), (full[:8], [0, 0, 0, 0, 0, 0, 0, 1]))
        self.assertEqual(self.render(conv, 12), (full, [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]))
        self.assertEqual(self.render(conv, 1), ([BOS], [0]))

    def test_special_text_is_ordinary(self):
        """render: the text '<|bos|>' in a message is ordinary text (encode_ordinary), not the BOS token"""
        ids, _ = self.render({"messages": [{"role": "user", "content": "<|bos|> is text"},
                                           {"role": "assistant", "content": "x"}]})
        self.assertEqual(ids, [BOS, US] + self.E("<|bos|> is text") + [UE, AS] + self.E("x") + [AE])
        self.assertEqual(ids.count(BOS), 1)

    def test_render_mc(self):
        """render_mc: tasks/common.py's exact text (letter after the choice, no space after '=')"""
        self.assertEqual(self.sft.render_mc("What is 2 + 2?", ("A", "B", "C", "D"), ["3", "4", "five", "22"]),
                         "Multiple Choice question: What is 2 + 2?\n- 3=A\n- 4=B\n- five=C\n- 22=D\n\n"
                         "Respond only with the letter of the correct answer.")
        conv = self.sft.mmlu_conversation({"question": "Q?", "choices": ["w", "x", "y", "z"], "answer": 3, "subject": "s"})
        self.assertEqual(conv["messages"], [
            {"role": "user", "content": "Multiple Choice question: Q?\n- w=A\n- x=B\n- y=C\n- z=D\n\n"
                                        "Respond only with the letter of the correct answer."},
            {"role": "assistant", "content": "D"}])

    def test_conversation_errors(self):
        """conversations nanochat asserts on are refused (roles, system placement, answer range)"""
        CE = self.sft.ConversationError
        bad = [
            lambda: self.render({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
            lambda: self.render({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "b"}]}),
            lambda: self.render({"messages": [{"role": "user", "content": "a"},
                                              {"role": "assistant", "content": [{"type": "code", "text": "x"}]}]}),
            lambda: self.sft.smoltalk_conversation({"messages": [{"role": "system", "content": "s"},
                                                                 {"role": "user", "content": "a"}]}),
            lambda: self.sft.smoltalk_conversation({"messages": [{"role": "assistant", "content": "a"},
                                                                 {"role": "user", "content": "b"}]}),
            lambda: self.sft.mmlu_conversation({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 4, "subject": ""}),
            lambda: self.sft.mmlu_conversation({"question": "q", "choices": ["a", "b", "c"], "answer": 0, "subject": ""}),
        ]
        for k, f in enumerate(bad):
            with self.subTest(case=k):
                self.assertRaises(CE, f)


@needs_packages("tiktoken", "numpy", "pyarrow")
class TestOrder(unittest.TestCase):
    """The row permutation and the mixture order, against values printed by nanochat's own code."""

    def test_row_permutation(self):
        """rows: numpy default_rng(42).permutation, as nanochat's HubDataset.shuffle(seed=42) (n = 10)"""
        import numpy as np
        # printed by nanochat 92d63d4's HubDataset(table of 10 rows).shuffle(42).permutation
        self.assertEqual(np.random.default_rng(42).permutation(10).tolist(), [5, 6, 0, 7, 3, 2, 4, 9, 1, 8])

    def test_mixture_order(self):
        """mixture: TaskMixture's index_map for tasks of 3, 2 and 4 rows, and a restatement for larger ones"""
        import sft
        # printed by nanochat 92d63d4's TaskMixture([task of 3, task of 2, task of 4]).index_map
        self.assertEqual(sft.mixture_index_map([3, 2, 4]),
                         [(1, 0), (2, 1), (2, 2), (1, 1), (2, 3), (0, 2), (2, 0), (0, 0), (0, 1)])
        for lengths in ([1], [5, 0, 7], [40, 20, 20, 20, 15, 15, 15, 15]):
            pairs = []
            for t, n in enumerate(lengths):
                pairs += [(t, i) for i in range(n)]
            random.Random(42).shuffle(pairs)
            self.assertEqual(sft.mixture_index_map(lengths), pairs, lengths)


@needs_packages("tiktoken", "numpy", "pyarrow")
class TestMini(unittest.TestCase):
    """sft.py --mini and the committed dev/data/sft_mini_tokens."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_sft_py_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def assertSameFiles(self, out_dir, names, code, out):
        differ = [n for n in names if read(os.path.join(out_dir, n)) == b""
                  or read(os.path.join(out_dir, n)) != read(os.path.join(COMMITTED, n))]
        self.assertTrue(code == 0 and not differ, "exit %d, files missing or different: %s\n%s" % (code, differ, out[-3000:]))

    def test_reproduces_committed(self):
        """sft.py --mini writes exactly the committed dev/data/sft_mini_tokens (also with --workers 1)"""
        for workers in ([], ["--workers", "1"]):
            with self.subTest(workers=workers):
                out_dir = os.path.join(self.dir, "out%d" % len(workers))
                code, out = run([sys.executable, "dev/data/sft.py", "--mini", "--tokenizer", TOKENIZER, "--out", out_dir] + workers)
                self.assertSameFiles(out_dir, FILES, code, out)
                self.assertEqual([n for n in os.listdir(out_dir) if n not in FILES], [], "files left behind")

    def write_parquet(self, where):
        """The mini splits as the hub's parquet export: where(split spec) -> directory; two shards where a split
        has more than 10 rows. Returns {split file name: [shard paths]}."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        out = {}
        for name in SPLIT_FILES:
            kind, split = name.split("_", 1)
            rows = jsonl(os.path.join(MINI, name + ".jsonl"))
            d = where(HUB_DIRS[kind], split)
            os.makedirs(d, exist_ok=True)
            cut = len(rows) // 2 if len(rows) > 10 else len(rows)
            shards = [rows[:cut], rows[cut:]] if cut < len(rows) else [rows]
            out[name] = []
            for k, shard in enumerate(shards):
                if kind == "smoltalk":  # the hub's columns: messages list<struct<content, role>>, and others
                    table = pa.table({"messages": pa.array([r["messages"] for r in shard], pa.list_(pa.struct(
                        [("content", pa.string()), ("role", pa.string())]))), "source": ["mini"] * len(shard)})
                else:
                    table = pa.Table.from_pylist(shard)
                out[name].append(os.path.join(d, "%05d.parquet" % k))
                pq.write_table(table, out[name][-1])
        return out

    def test_hub_layout_offline(self):
        """the hub path: the mini splits as parquet shards + manifest.json in --cache-dir, --offline: the same files"""
        cache = os.path.join(self.dir, "cache")
        for name, paths in self.write_parquet(lambda repo, split: os.path.join(cache, repo, split)).items():
            with open(os.path.join(os.path.dirname(paths[0]), "manifest.json"), "w") as f:
                json.dump([os.path.basename(p) for p in paths], f)
        out_dir = os.path.join(self.dir, "out")
        code, out = run([sys.executable, "dev/data/sft.py", "--offline", "--cache-dir", cache, "--tokenizer", TOKENIZER,
                         "--out", out_dir, "--workers", "1"])
        self.assertSameFiles(out_dir, ["sft_train.bin", "sft_val.bin"], code, out)

    def test_hub_download(self):
        """the hub path with downloads, from a local HTTP server (listing, shards, manifest): the same files"""
        import functools
        import http.server
        import threading
        served = os.path.join(self.dir, "served")
        shards = self.write_parquet(lambda repo, split: os.path.join(served, "files", repo, split))

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=served))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        hub = "http://127.0.0.1:%d" % server.server_address[1]
        for name, paths in shards.items():  # the listing: /api/datasets/{repo}/parquet/{subset}/{split}
            kind, split = name.split("_", 1)
            listing = os.path.join(served, "api", "datasets", HUB_REPOS[kind], "parquet", HUB_DIRS[kind].split("/")[1], split)
            os.makedirs(os.path.dirname(listing), exist_ok=True)
            with open(listing, "w") as f:
                json.dump([hub + "/" + os.path.relpath(p, served).replace(os.sep, "/") for p in paths], f)
        cache, out_dir = os.path.join(self.dir, "cache"), os.path.join(self.dir, "out")
        code, out = run([sys.executable, "dev/data/sft.py", "--hub-url", hub, "--cache-dir", cache, "--retries", "1",
                         "--tokenizer", TOKENIZER, "--out", out_dir])
        self.assertSameFiles(out_dir, ["sft_train.bin", "sft_val.bin"], code, out)
        for name, paths in shards.items():
            kind, split = name.split("_", 1)
            d = os.path.join(cache, HUB_DIRS[kind], split)
            with open(os.path.join(d, "manifest.json")) as f:
                self.assertEqual(json.load(f), ["%05d.parquet" % k for k in range(len(paths))], name)
            for k, p in enumerate(paths):
                self.assertEqual(read(os.path.join(d, "%05d.parquet" % k)), read(p), name)
        server.shutdown()  # now offline from the cache alone
        shutil.rmtree(out_dir)
        code, out = run([sys.executable, "dev/data/sft.py", "--offline", "--cache-dir", cache, "--tokenizer", TOKENIZER,
                         "--out", out_dir])
        self.assertSameFiles(out_dir, ["sft_train.bin", "sft_val.bin"], code, out)

    def test_committed_files(self):
        """committed files: header, offsets, BOS at each start, mask 0/1, and every conversation decodes to its row"""
        import numpy as np
        pieces, bos = token_pieces(os.path.join(REPO, TOKENIZER))
        vocab = len(pieces)
        self.assertEqual((vocab, bos), (4096, BOS))
        with open(os.path.join(COMMITTED, "sft_meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        rows = {name: jsonl(os.path.join(MINI, name + ".jsonl")) for name in SPLIT_FILES}
        perm = {name: np.random.default_rng(42).permutation(len(r)).tolist() for name, r in rows.items()}
        mixtures = {"train": ["smoltalk_train"] + ["mmlu_auxiliary_train"] * 3 + ["gsm8k_train"] * 4,
                    "val": ["smoltalk_test", "mmlu_test", "gsm8k_test"]}
        stops = {"mmlu_test": 5200, "gsm8k_test": 420}
        for split, tasks in mixtures.items():
            with self.subTest(split=split):
                h, C, N, offsets, tokens, mask = read_sft_file(os.path.join(COMMITTED, "sft_%s.bin" % split))
                self.assertEqual(h[6:9], (4096, BOS, 2048), "vocab, BOS, max_tokens")
                lengths = [min(len(rows[t]), stops.get(t, len(rows[t]))) for t in tasks]
                self.assertEqual(C, sum(lengths))
                self.assertEqual((offsets[0], offsets[-1]), (0, N))
                self.assertTrue(all(a < b for a, b in zip(offsets, offsets[1:])), "offsets not strictly increasing")
                self.assertTrue(set(mask) <= {0, 1}, "mask values other than 0/1")
                self.assertTrue(all(t < vocab for t in tokens), "token id >= vocab")
                starts = [i for i, t in enumerate(tokens) if t == BOS]
                self.assertEqual(starts, list(offsets[:-1]), "BOS exactly at the conversation starts")
                m = meta["splits"][split]
                self.assertEqual((m["conversations"], m["tokens"], m["trained_tokens"]), (C, N, sum(mask)))
                self.assertLessEqual(max(b - a for a, b in zip(offsets, offsets[1:])), 2048)
                # the mixture order restated: all (task, row) pairs, random.Random(42).shuffle
                pairs = [(t, i) for t, n in enumerate(lengths) for i in range(n)]
                random.Random(42).shuffle(pairs)
                cut = 0
                for c, (t, i) in enumerate(pairs):
                    name = tasks[t]
                    row = rows[name][perm[name][i]]
                    want = expected_segments(name.split("_")[0], row)
                    a, b = offsets[c], offsets[c + 1]
                    got = actual_segments(tokens[a:b], mask[a:b], pieces, vocab)
                    if b - a == 2048 and got != want:  # cut: what is there must be the start of the conversation
                        cut += 1
                        n = len(got) - 1
                        ok = got[:n] == want[:n] and got[n][0] == want[n][0] and got[n][2] == want[n][2] and \
                            want[n][1].startswith(got[n][1])
                    else:
                        ok = got == want
                    self.assertTrue(ok, "%s conversation %d (%s row %d) does not decode to its row:\n got %r\nwant %r"
                                    % (split, c, name, perm[name][i], got[:12], want[:12]))
                self.assertEqual(cut, m["truncated"])
        self.assertEqual(meta["splits"]["train"]["truncated"], 1, "the mini train split has one conversation over 2048 tokens")


@needs_packages("tiktoken", "numpy", "pyarrow")
class TestStudyMixture(unittest.TestCase):
    """--mixture study (chat_sft.py before nanochat 950a1dc, the study's): the spelling and identity tasks against
    values printed by nanochat's own tasks/spellingbee.py and tasks/customjson.py of that time (run on the mini
    word list dev/data/sft_mini/words_alpha.txt), the SpellingBee rendering, and the mini mixture's make-up."""

    @classmethod
    def setUpClass(cls):
        import climbmix
        import sft
        cls.sft = sft
        cls.words = sft.WordList(os.path.join(MINI, "words_alpha.txt")).words
        cls.enc, _ = climbmix.read_tokenizer(os.path.join(REPO, TOKENIZER))
        cls.special = sft.chat_special_ids(cls.enc)

    def test_spelling_bee(self):
        """SpellingBee: the user message, the tool call and the answer of train examples 0-2 and test 0-2"""
        # printed by nanochat 950a1dc^'s SpellingBee(split=...).get_example(i) with the mini word list
        want = {("train", 0): ('count the number of "z" in \'puzzle\'?', "'puzzle'.count('z')", "#### 2"),
                ("train", 1): ("how many times is 't' in 'strawberry'", "'strawberry'.count('t')", "#### 1"),
                ("train", 2): ('in the word "puzzle", how many b are there', "'puzzle'.count('b')", "#### 0"),
                ("test", 0): ("How many 'v' are in the word level?", "'level'.count('v')", "#### 1"),
                ("test", 1): ('"a"에 "a"가 몇 번 나오나요?', "'a'.count('a')", "#### 1"),
                ("test", 2): ("Total count of 'u' in 'bubble'?", "'bubble'.count('u')", "#### 1")}
        for (split, i), (user, call, answer) in want.items():
            conv = self.sft.spelling_bee_conversation(self.words, i, split)
            parts = conv["messages"][1]["content"]
            self.assertEqual((conv["messages"][0]["content"], parts[2]["text"], parts[-1]["text"][-6:]), (user, call, answer), (split, i))
        # the whole spelled-out text of train example 0, as nanochat printed it
        self.assertEqual(self.sft.spelling_bee_conversation(self.words, 0, "train")["messages"][1]["content"][0]["text"],
                         "We are asked to find the number 'z' in the word 'puzzle'. Let me try a manual approach first.\n\n"
                         "First spell the word out:\npuzzle:p,u,z,z,l,e\n\nThen count the occurrences of 'z':\n1:p\n2:u\n"
                         "3:z hit! count=1\n4:z hit! count=2\n5:l\n6:e\n\nThis gives us 2.")

    def test_simple_spelling(self):
        """SimpleSpelling: train examples 0-2 draw from the word list shuffled with random.Random(42)"""
        shuffled = list(self.words)
        random.Random(42).shuffle(shuffled)
        # printed by nanochat 950a1dc^'s SimpleSpelling(split="train").get_example(i)["messages"][1]["content"]
        self.assertEqual([self.sft.simple_spelling_conversation(shuffled, i, "train")["messages"][1]["content"] for i in range(3)],
                         ["a:a", "abracadabra:a,b,r,a,c,a,d,a,b,r,a", "a:a"])

    def test_render_tool_parts(self):
        """render: SpellingBee's tool call is trained (mask 1), the tool's output is not (mask 0)"""
        conv = self.sft.spelling_bee_conversation(self.words, 0, "train")
        ids, mask = self.sft.render_conversation(conv, self.enc, self.special)
        at = ids.index(PS)
        call = self.enc.encode_ordinary("'puzzle'.count('z')")
        self.assertEqual(ids[at:at + len(call) + 5], [PS] + call + [PE, OS] + self.enc.encode_ordinary("2") + [OE])
        self.assertEqual(mask[at:at + len(call) + 5], [1] * (len(call) + 2) + [0, 0, 0])
        self.assertEqual((ids[-1], mask[-1]), (AE, 1))

    def test_identity_checks(self):
        """identity conversations: CustomJSON's checks (a list of >= 2 messages, user and assistant in turn, string contents)"""
        good = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        self.assertEqual(self.sft.identity_conversation(good), {"messages": good})
        for bad, why in (({"role": "user"}, "expected a list of messages"), (good[:1], "at least 2 messages"),
                         ([good[1], good[0]], "message 0 is from 'assistant'"),
                         ([good[0], {"role": "assistant", "content": ["x"]}], "content must be a string")):
            with self.assertRaises(self.sft.ConversationError) as e:
                self.sft.identity_conversation(bad)
            self.assertIn(why, str(e.exception))

    def test_mini_study_mixture(self):
        """sft.py --mini --mixture study: SmolTalk, identity x 2, MMLU x 3, GSM8K x 4, SimpleSpelling, SpellingBee in
        that order in the meta file, every conversation of them in the file; the validation file is the head mixture's"""
        out_dir = tempfile.mkdtemp(prefix="xsa_sft_study_")
        self.addCleanup(shutil.rmtree, out_dir, ignore_errors=True)
        code, out = run([sys.executable, "dev/data/sft.py", "--mini", "--mixture", "study", "--simple-spelling", "20", "--spelling-bee",
                         "12", "--tokenizer", TOKENIZER, "--out", out_dir])
        self.assertEqual(code, 0, out)
        with open(os.path.join(out_dir, "sft_meta.json")) as f:
            meta = json.load(f)
        tasks = [(t["name"], t["copies"], t["conversations"]) for t in meta["splits"]["train"]["tasks"]]
        self.assertEqual(tasks, [("smoltalk_train", 1, 40), ("identity", 2, 10), ("mmlu_auxiliary_train", 3, 60), ("gsm8k_train", 4, 60),
                                 ("simple_spelling", 1, 20), ("spelling_bee", 1, 12)])
        self.assertEqual((meta["nanochat_commit"], meta["splits"]["train"]["conversations"]), ("950a1dc^", 202))
        self.assertEqual(read(os.path.join(out_dir, "sft_val.bin")), read(os.path.join(COMMITTED, "sft_val.bin")))


@needs_packages("tiktoken", "numpy", "pyarrow")
class TestErrors(unittest.TestCase):
    """Bad input: exit code 1 and one `error:` line naming the problem."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_sft_err_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def sft(self, *args):
        return [sys.executable, "dev/data/sft.py", "--tokenizer", TOKENIZER, "--out", os.path.join(self.dir, "out")] + list(args)

    def source(self, name, edit=None, drop=None):
        """a copy of the mini source, without `drop`, with `edit` (a function of the rows) applied to file `name`"""
        return copy_jsonl(MINI, os.path.join(self.dir, name or "src"), SPLIT_FILES, edit, drop)

    def test_errors(self):
        """errors: missing source file, bad rows, no chat specials, --offline without the data, bad flags"""
        check_one_error(self, self.sft("--source", self.source("a", drop="gsm8k_test")), "missing gsm8k_test.jsonl",
                        "--source without gsm8k_test.jsonl", anywhere=True)

        def roles(rows):
            rows[3]["messages"][1]["role"] = "user"
        check_one_error(self, self.sft("--source", self.source("b", edit=("smoltalk_train", roles))),
                        "smoltalk_train.jsonl line 4 (smoltalk_train): message 1", "smoltalk roles", anywhere=True)

        def answer(rows):
            rows[0]["answer"] = 7
        check_one_error(self, self.sft("--source", self.source("c", edit=("mmlu_test", answer))),
                        "mmlu_test.jsonl line 1 (mmlu_test): 'answer' must be 0, 1, 2 or 3", "mmlu answer 7", anywhere=True)

        # the study mixture's two files: missing, an empty word, a bad identity line
        study = self.source("d")
        check_one_error(self, self.sft("--source", study, "--mixture", "study"), "identity_conversations.jsonl: no such file",
                        "--mixture study without the identity conversations", anywhere=True)
        with open(os.path.join(study, "identity_conversations.jsonl"), "w") as f:
            f.write('[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]\n[{"role": "user"}]\n')
        with open(os.path.join(study, "words_alpha.txt"), "w") as f:
            f.write("apple\n\nbanana\n")
        check_one_error(self, self.sft("--source", study, "--mixture", "study"), "words_alpha.txt line 2: an empty word",
                        "an empty word", anywhere=True)
        with open(os.path.join(study, "words_alpha.txt"), "w") as f:
            f.write("apple\nbanana\n")
        check_one_error(self, self.sft("--source", study, "--mixture", "study"), "identity_conversations.jsonl line 2 (identity): a conversation needs at least 2 messages",
                        "a bad identity conversation", anywhere=True)
        check_one_error(self, self.sft("--mixture", "study", "--offline", "--cache-dir", os.path.join(self.dir, "empty_cache")),
                        "--offline: identity_conversations.jsonl is not downloaded", "--offline without the identity file", anywhere=True)

        # a tokenizer without the chat special tokens: the 256 bytes and <|bos|> only (format: dev/data/README.md)
        pattern = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""".encode()
        tok = [struct.pack("<256i", *([20241201, 2, 257, 256, 0, len(pattern)] + [0] * 250)), pattern]
        tok += [struct.pack("<BI", 0, 1) + bytes([i]) for i in range(256)] + [struct.pack("<BI", 1, 7) + b"<|bos|>"]
        no_chat = os.path.join(self.dir, "no_chat.bin")
        with open(no_chat, "wb") as f:
            f.write(b"".join(tok))
        argv = self.sft("--mini")
        argv[argv.index(TOKENIZER)] = no_chat
        check_one_error(self, argv, "special tokens", "tokenizer without the chat special tokens", anywhere=True)

        check_one_error(self, self.sft("--offline", "--cache-dir", os.path.join(self.dir, "empty")),
                        "--offline: HuggingFaceTB/smol-smoltalk default/train is not downloaded", "--offline, empty cache",
                        anywhere=True)
        check_one_error(self, self.sft("--mini", "--max-tokens", "0"), "--max-tokens", anywhere=True)
        check_one_error(self, self.sft("--mini", "--source", MINI), "not allowed with", anywhere=True)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "out", "sft_meta.json")), "an error left output behind")


if __name__ == "__main__":
    unittest.main()
