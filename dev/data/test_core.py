#!/usr/bin/env python3
"""Tests of dev/data/core.py: offline on the small bundle dev/data/core_bundle with the embedded tokenizer,
it reproduces the committed task files dev/data/core_tasks byte for byte. (Those files' contents are
checked against prompts and spans worked out by hand, and scored, by dev/test/test_infra.cu.) On a hand-made
bundle of items whose options nanochat scores as NaN (empty answer spans), it writes the spans nanochat
computes and says per task how many such items there are.

    python3 dev/data/test_core.py        (or all suites: make test)

Needs tiktoken (python3 -m pip install -r dev/data/requirements.txt): without it the test is skipped,
except where the environment variable CI is set (there it fails).
"""
import json
import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
import xsatest  # noqa: E402
from xsatest import REPO, needs_packages, read, run  # noqa: E402

TASK_FILES = ["01_completion_zeroshot.bin", "02_devil_lm.bin", "03_devil_definitions.bin", "04_devil_schema.bin", "index.txt"]


@needs_packages("tiktoken")
class TestCoreOffline(xsatest.TempDirTest):
    PREFIX = "xsa_core_py_"

    def test_reproduces_committed_tasks(self):
        """dev/data/core.py offline on dev/data/core_bundle: output identical to the committed dev/data/core_tasks"""
        out_dir = os.path.join(self.dir, "out")
        code, out = run([sys.executable, "dev/data/core.py", "--bundle", "dev/data/core_bundle", "--tokenizer", "dev/data/devil/tokenizer.bin",
                         "--out", out_dir])
        differ = [name for name in TASK_FILES
                  if read(os.path.join(out_dir, name)) == b"" or read(os.path.join(out_dir, name)) != read(os.path.join(REPO, "dev/data/core_tasks", name))]
        self.assertTrue(code == 0 and not differ, "exit %d, files missing or different: %s\n%s" % (code, differ, out[-3000:]))


# Items nanochat scores with an empty answer span (its losses[i, start-1:end-1] is empty, the mean NaN), one task
# per kind, and a task without any: (label, icl_task_type, items)
EMPTY_SPAN_TASKS = [
    # (a) a choice that is a token prefix of every other choice: its span is [n, n), at its prompt's end
    ("prefix_choice", "multiple_choice", [
        {"query": "What do you call a man who lies and steals?", "choices": ["a liar", "a liar and a thief"], "gold": 0},
        {"query": "What do you call a man who lies and cheats?", "choices": ["a liar and a cheat", "a liar"], "gold": 1},
        {"query": "What do you call a man who steals?", "choices": ["a thief", "a robber"], "gold": 0}]),
    # (b) choices all identical: every span is [n, n)
    ("same_choices", "multiple_choice", [
        {"query": "What do you call a man who lies?", "choices": ["a liar", "a liar", "a liar"], "gold": 0}]),
    # (c) a schema item whose options are all identical: the whole prompt is the common suffix, [0, n)
    ("same_schema", "schema", [
        {"context_options": ["The man is", "The man is"], "continuation": "a liar.", "gold": 1}]),
    ("plain", "schema", [
        {"context_options": ["The lawyer", "The friend"], "continuation": "had spent it all.", "gold": 0}]),
]


def write_bundle(root, tasks):
    """An eval bundle (core.yaml, eval_meta_data.csv, eval_data/) of 0-shot tasks (label, type, items)."""
    os.makedirs(os.path.join(root, "eval_data"))
    yaml = ["icl_tasks:"]
    csv = ["Eval Task,Random baseline"]
    for label, ttype, items in tasks:
        yaml += ["- label: " + label, "  dataset_uri: %s.jsonl" % label, "  num_fewshot: [0]", "  icl_task_type: " + ttype]
        csv.append(label + ",50")
        with open(os.path.join(root, "eval_data", label + ".jsonl"), "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(item) + "\n" for item in items))
    with open(os.path.join(root, "core.yaml"), "w") as f:
        f.write("\n".join(yaml) + "\n")
    with open(os.path.join(root, "eval_meta_data.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")


def read_items(path):
    """The items of a task file (dev/data/README.md, "CORE task files"): [(gold, [(tokens, start, end)])]."""
    data = read(path)
    pos, items = 1024, []
    for _ in range(struct.unpack_from("<i", data, 12)[0]):
        n, gold = struct.unpack_from("<II", data, pos)
        pos += 8
        prompts = []
        for _ in range(n):
            nt, s, e = struct.unpack_from("<III", data, pos)
            prompts.append((list(struct.unpack_from("<%dI" % nt, data, pos + 12)), s, e))
            pos += 12 + 4 * nt
        items.append((gold, prompts))
    return items


def nanochat_spans(ttype, tokens):
    """nanochat's batch_sequences_mc / batch_sequences_schema: find_common_length from the left / right."""
    n = min(len(t) for t in tokens)
    idx = range(n) if ttype == "multiple_choice" else range(-1, -n - 1, -1)
    common = next((i for i, j in enumerate(idx) if any(t[j] != tokens[0][j] for t in tokens)), n)
    if ttype == "multiple_choice":
        return [(common, len(t)) for t in tokens]
    return [(len(t) - common, len(t)) for t in tokens]


@needs_packages("tiktoken")
class TestCoreEmptySpans(xsatest.TempDirTest):
    PREFIX = "xsa_core_py_"

    def test_empty_spans(self):
        """core.py on items with empty answer spans (a choice a token prefix of the others, identical choices, identical schema options): nanochat's spans, and a count per task"""
        bundle, out_dir = os.path.join(self.dir, "bundle"), os.path.join(self.dir, "out")
        write_bundle(bundle, EMPTY_SPAN_TASKS)
        code, out = run([sys.executable, "dev/data/core.py", "--bundle", bundle, "--tokenizer", "dev/data/devil/tokenizer.bin", "--out", out_dir])
        self.assertEqual(code, 0, out)
        empty_items = {}
        for k, (label, ttype, _) in enumerate(EMPTY_SPAN_TASKS):
            items = read_items(os.path.join(out_dir, "%02d_%s.bin" % (k + 1, label)))
            for _, prompts in items:
                self.assertEqual([(s, e) for _, s, e in prompts], nanochat_spans(ttype, [t for t, _, _ in prompts]), label)
            # whether nanochat's losses[i, start-1:end-1] takes no position of the item's rows (as long as its longest
            # prompt); every span, empty or not, ends at its prompt's end
            empty = [any(not list(range(max(len(t) for t, _, _ in p)))[s - 1:e - 1] for _, s, e in p) for _, p in items]
            self.assertTrue(all(e == len(t) for _, p in items for t, _, e in p), label)
            empty_items[label] = sum(empty)
        self.assertEqual(empty_items, {"prefix_choice": 2, "same_choices": 1, "same_schema": 1, "plain": 0})
        lines = [line for line in out.splitlines() if "empty answer span" in line]
        self.assertEqual(lines, ["prefix_choice: 2 items have an option with an empty answer span (scored as nanochat: NaN loss)",
                                 "same_choices: 1 item has an option with an empty answer span (scored as nanochat: NaN loss)",
                                 "same_schema: 1 item has an option with an empty answer span (scored as nanochat: NaN loss)"], out)


if __name__ == "__main__":
    unittest.main()
