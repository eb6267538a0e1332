#!/usr/bin/env python3
"""
nanochat's ChatCORE tasks as task files for xsa-train (dev/data/README.md, "ChatCORE").

  python3 dev/data/chat_eval.py --tokenizer TOKENIZER.bin --out DIR            # download from the HuggingFace hub
  python3 dev/data/chat_eval.py --tokenizer TOKENIZER.bin --out DIR --offline  # only what --cache-dir already holds
  python3 dev/data/chat_eval.py --tokenizer TOKENIZER.bin --out DIR --source SRC   # five local JSON-lines files
  python3 dev/data/chat_eval.py --mini --tokenizer dev/data/devil/tokenizer.bin --out dev/data/chat_tasks

This is the data side of nanochat's scripts/chat_eval.py (commit 92d63d4): the same five tasks, the same row
order, the same conversations and the same prompt tokens as its tokenizer.render_for_completion gives, plus
what its checkers compare with, written once to files so that the trainer (and dev/reference/score_chat.py)
only run the model and check answers:

  * tasks, in ChatCORE's order: ARC-Easy and ARC-Challenge (allenai/ai2_arc, subsets ARC-Easy /
    ARC-Challenge, split test), MMLU (cais/mmlu, all, test), GSM8K (openai/gsm8k, main, test), HumanEval
    (openai/openai_humaneval, subset openai_humaneval, test), read as nanochat's load_hub_dataset reads them
    (the hub's parquet export; sft.py's download code);
  * each dataset's rows permuted with numpy.random.default_rng(42).permutation(n) (HubDataset.shuffle(seed=42)),
    the first --max-per-task kept (chat_eval.py's max_problems);
  * conversations as tasks/arc.py, tasks/mmlu.py, tasks/gsm8k.py and tasks/humaneval.py build them; the prompt is
    render_for_completion: render_conversation (with its max_tokens=2048 cut) of every message but the last
    (the assistant's), then <|assistant_start|>;
  * categorical tasks (ARC, MMLU): the token of each letter (encode_ordinary, exactly one token, as chat_eval.py
    asserts) and the gold letter's index; generative tasks: GSM8K's reference number (tasks/gsm8k.py
    extract_answer of the reference solution's last text part), HumanEval's imports (extract_imports of the
    prompt), test code and entry point.

Output: DIR/NN_<label>.bin (01_ARC-Easy.bin .. 05_HumanEval.bin; a task keeps its number under --tasks) and
DIR/index.txt, each written to a .tmp file and renamed, index.txt last. Deterministic: the same bytes on every run.

Needs tiktoken and numpy, and pyarrow for the hub's parquet files (dev/data/requirements.txt).
"""

import array
import collections
import os
import re
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import climbmix  # noqa: E402  (tokenizer reader; needs only the standard library at import)
import sft  # noqa: E402  (hub downloads, JSON-lines rows, render_mc, render_conversation, GSM8K parts)
import xsa_cli  # noqa: E402

# -----------------------------------------------------------------------------
# Constants

NANOCHAT_COMMIT = "92d63d4"  # the nanochat commit whose scripts/chat_eval.py this reproduces

CHAT_MAGIC = 20261203
CHAT_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
LABEL_INT = 9            # the label occupies int32 slots 9..40 (128 bytes)
LABEL_BYTES = 128        # at most 127 bytes of UTF-8, NUL-padded

KINDS = {"categorical": 0, "generative": 1}
CHECKERS = {"letter": 0, "gsm8k": 1, "humaneval": 2}

ROW_SEED = sft.ROW_SEED                    # HubDataset.shuffle(seed=42)
MAX_TOKENS = sft.DEFAULT_MAX_TOKENS        # render_for_completion calls render_conversation(conversation): 2048
MMLU_LETTERS = sft.MMLU_LETTERS
DEFAULT_CACHE_DIR = sft.DEFAULT_CACHE_DIR  # shared with sft.py: the MMLU and GSM8K test splits are downloaded once
MINI_SOURCE = "dev/data/chat_bundle"

BOS, ASSISTANT_START = sft.BOS, sft.ASSISTANT_START


class ChatEvalError(Exception):
    """An error reported to the user as one line, exit code 1."""


log = climbmix.log
ConversationError = sft.ConversationError

Split = sft.Split
SPLITS = {s.key: s for s in [
    Split("arc_easy_test", "allenai/ai2_arc", "ARC-Easy", "test", ("question", "choices", "answerKey")),
    Split("arc_challenge_test", "allenai/ai2_arc", "ARC-Challenge", "test", ("question", "choices", "answerKey")),
    sft.SPLITS["mmlu_test"],
    sft.SPLITS["gsm8k_test"],
    Split("humaneval_test", "openai/openai_humaneval", "openai_humaneval", "test",
          ("prompt", "canonical_solution", "test", "entry_point")),
]}

# ChatCORE's tasks in scripts/chat_eval.py's order (all_tasks), with their baselines (baseline_accuracies)
TaskSpec = collections.namedtuple("TaskSpec", "number label split kind checker baseline")
TASKS = [
    TaskSpec(1, "ARC-Easy", "arc_easy_test", "categorical", "letter", 0.25),
    TaskSpec(2, "ARC-Challenge", "arc_challenge_test", "categorical", "letter", 0.25),
    TaskSpec(3, "MMLU", "mmlu_test", "categorical", "letter", 0.25),
    TaskSpec(4, "GSM8K", "gsm8k_test", "generative", "gsm8k", 0.0),
    TaskSpec(5, "HumanEval", "humaneval_test", "generative", "humaneval", 0.0),
    # before nanochat 950a1dc (July 2026), and so in the study's ChatCORE: only with --spellingbee or --tasks
    TaskSpec(6, "SpellingBee", "words", "generative", "gsm8k", 0.0),
]
HEAD_TASKS = 5                   # ChatCORE's tasks at nanochat 92d63d4: the first five
SPELLING_BEE_EXAMPLES = 256      # SpellingBee(size=256, split="test")


# -----------------------------------------------------------------------------
# The tasks' conversations and references (nanochat's asserts become ConversationError)

def arc_conversation(row):
    """tasks/arc.py: user = render_mc(question, labels, texts), assistant = answerKey; the letters are the
    row's own labels (usually A-D, sometimes 1-4, 3 or 5 of them)."""
    q, choices, answer = row["question"], row["choices"], row["answerKey"]
    if not isinstance(q, str) or not isinstance(answer, str):
        raise ConversationError("'question' and 'answerKey' must be strings")
    if not isinstance(choices, dict) or not isinstance(choices.get("text"), list) \
            or not isinstance(choices.get("label"), list):
        raise ConversationError("'choices' must be an object with the lists 'text' and 'label'")
    texts, letters = choices["text"], choices["label"]
    if not all(isinstance(x, str) for x in texts + letters):
        raise ConversationError("'choices' texts and labels must be strings")
    # nanochat zips the two lists (a shorter one would silently drop choices) and compares letters as strings
    # (a repeated label would make two answers right): both are refused here, the real splits have neither
    if len(texts) != len(letters) or not letters:
        raise ConversationError(f"{len(texts)} choice texts but {len(letters)} labels")
    if len(set(letters)) != len(letters):
        raise ConversationError(f"repeated choice labels {letters}")
    if answer not in letters:
        raise ConversationError(f"answerKey {answer!r} must be one of the labels {letters}")
    return {"messages": [{"role": "user", "content": sft.render_mc(q, letters, texts)},
                         {"role": "assistant", "content": answer}],
            "letters": list(letters)}


def mmlu_conversation(row):
    """tasks/mmlu.py: sft.py's MMLU conversation, letters A-D."""
    conv = sft.mmlu_conversation(row)
    conv["letters"] = list(MMLU_LETTERS)
    return conv


GSM_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_answer(completion):
    """tasks/gsm8k.py extract_answer: the number after the first '#### ', stripped, commas removed; None if
    there is none."""
    match = GSM_RE.search(completion)
    if match:
        return match.group(1).strip().replace(",", "")
    return None


def gsm8k_conversation(row):
    """tasks/gsm8k.py: sft.py's GSM8K conversation; the reference is extract_answer of the last (text) part of
    the assistant message, as GSM8K.evaluate takes it."""
    conv = sft.gsm8k_conversation(row)
    ref = extract_answer(conv["messages"][-1]["content"][-1]["text"])
    if ref is None:
        # nanochat would compare None == extract_answer(completion): every completion without a '#### N' would
        # count as right; the real test split always has the answer line
        raise ConversationError("the answer has no '#### N' line after its last calculator annotation")
    conv["strings"] = [ref]
    return conv


def extract_imports(prompt):
    """tasks/humaneval.py extract_imports: the import lines at the top of the prompt (stripped), skipping blank
    and comment lines, up to the first other line."""
    imports = []
    for line in prompt.split("\n"):
        stripped = line.strip()
        if stripped.startswith("import ") or stripped.startswith("from "):
            imports.append(stripped)
        elif stripped and not stripped.startswith("#"):
            break
    return "\n".join(imports)


def humaneval_conversation(row):
    """tasks/humaneval.py: user = the prompt, assistant = prompt + "\\n" + canonical solution; the checker needs
    the prompt's imports, the test code and the entry point."""
    fields = ("prompt", "canonical_solution", "test", "entry_point")
    bad = [f for f in fields if not isinstance(row[f], str)]
    if bad:
        raise ConversationError(f"'{bad[0]}' must be a string")
    prompt = row["prompt"]
    return {"messages": [{"role": "user", "content": prompt},
                         {"role": "assistant", "content": f"{prompt}\n{row['canonical_solution']}"}],
            "strings": [extract_imports(prompt), row["test"], row["entry_point"]]}


def spelling_bee_conversation(words, index):
    """tasks/spellingbee.py (before 950a1dc), a test example: sft.py's SpellingBee conversation; the reference is
    extract_answer of its last text part, as SpellingBee.evaluate takes it (the same check as GSM8K's)."""
    conv = sft.spelling_bee_conversation(words, index, "test")
    conv["strings"] = [extract_answer(conv["messages"][-1]["content"][-1]["text"])]
    return conv


BUILDERS = {"arc_easy_test": arc_conversation, "arc_challenge_test": arc_conversation,
            "mmlu_test": mmlu_conversation, "gsm8k_test": gsm8k_conversation,
            "humaneval_test": humaneval_conversation}


def render_for_completion(conversation, enc, special):
    """nanochat tokenizer.py render_for_completion: the conversation without its last (assistant) message,
    rendered by render_conversation (cut to 2048 tokens), then <|assistant_start|>. Returns (ids, cut)."""
    messages = conversation["messages"]
    if not messages or messages[-1]["role"] != "assistant":
        raise ConversationError("the last message must be from the assistant")
    ids, _ = sft.render_conversation({"messages": messages[:-1]}, enc, special, max_tokens=1 << 62)
    cut = len(ids) > MAX_TOKENS
    return ids[:MAX_TOKENS] + [special[ASSISTANT_START]], cut


def letter_ids(enc, letters, cache):
    """scripts/chat_eval.py run_categorical_eval: tokenizer.encode(letter) must be exactly one token."""
    out = []
    for letter in letters:
        if letter not in cache:
            ids = enc.encode_ordinary(letter)
            if len(ids) != 1:
                raise ConversationError(f"the letter {letter!r} is {len(ids)} tokens {ids} with this tokenizer; "
                                        "nanochat's categorical eval needs every letter to be one token")
            cache[letter] = ids[0]
        out.append(cache[letter])
    return out


# -----------------------------------------------------------------------------
# Rows (sft.py's readers), tasks

def task_items(spec, rows, max_per_task, enc, special):
    """The task's items in nanochat's order (rows permuted, the first max_per_task kept): a list of
    (prompt ids, letter ids, gold, strings), and the number of prompts cut to 2048 tokens."""
    import numpy as np
    if spec.split == "words":  # SpellingBee: made from the word list, example i from seed i; not permuted
        size, perm = SPELLING_BEE_EXAMPLES, range(SPELLING_BEE_EXAMPLES)
        build = lambda p: spelling_bee_conversation(rows.words, p)  # noqa: E731
    else:
        size, perm = len(rows), np.random.default_rng(ROW_SEED).permutation(len(rows))
        build = lambda p: BUILDERS[spec.split](rows.row(p))  # noqa: E731
    n = size if max_per_task < 0 else min(max_per_task, size)
    items, cut, cache = [], 0, {}
    for i in range(n):
        p = int(perm[i])
        try:
            conv = build(p)
            prompt, was_cut = render_for_completion(conv, enc, special)
            if spec.kind == "categorical":
                letters = conv["letters"]
                choices = letter_ids(enc, letters, cache)
                gold = letters.index(conv["messages"][-1]["content"])
                strings = []
            else:
                choices, gold, strings = [], 0, conv["strings"]
        except ConversationError as e:
            raise ChatEvalError(f"{rows.where(p) if spec.split != 'words' else f'example {p}'} ({spec.label}): {e}")
        cut += was_cut
        items.append((prompt, choices, gold, strings))
    return items, cut


# -----------------------------------------------------------------------------
# The task file (dev/data/README.md, "ChatCORE task files")

def header_bytes(spec, n_items, vocab, bos, max_per_task):
    h = bytearray(HEADER_BYTES)
    struct.pack_into("<7i", h, 0, CHAT_MAGIC, CHAT_VERSION, KINDS[spec.kind], n_items, vocab, bos, max_per_task)
    struct.pack_into("<f", h, 28, spec.baseline)
    struct.pack_into("<i", h, 32, CHECKERS[spec.checker])
    lb = spec.label.encode("utf-8")
    assert len(lb) < LABEL_BYTES
    h[4 * LABEL_INT:4 * LABEL_INT + len(lb)] = lb
    return bytes(h)


def _u32s(values):
    a = array.array("I", [len(values)] + list(values))
    if a.itemsize != 4:
        raise RuntimeError("unexpected C type sizes")
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def item_bytes(prompt, choices, gold, strings):
    out = [_u32s(prompt), _u32s(choices), struct.pack("<I", gold), struct.pack("<I", len(strings))]
    for s in strings:
        b = s.encode("utf-8")
        out.append(struct.pack("<I", len(b)))
        out.append(b)
    return b"".join(out)


def task_file_name(spec):
    return f"{spec.number:02d}_{spec.label}.bin"


# -----------------------------------------------------------------------------
# Main

def parse_args(argv=None):
    p = xsa_cli.ArgumentParser(description="nanochat's ChatCORE tasks (chat_eval.py at nanochat 92d63d4) as task files "
                               "for xsa-train (format: dev/data/README.md, 'ChatCORE task files').")
    p.add_argument("--tokenizer", required=True, help="tokenizer.bin of the model to evaluate (climbmix.py's)")
    p.add_argument("--out", required=True, help="output directory: NN_<label>.bin and index.txt")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--source", default=None, metavar="DIR",
                     help="read the splits from DIR/<split>.jsonl (arc_easy_test, arc_challenge_test, mmlu_test, "
                          "gsm8k_test, humaneval_test) instead of the hub")
    src.add_argument("--mini", action="store_true", help=f"the committed mini bundle: --source {MINI_SOURCE}")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR,
                   help="where the hub's parquet files are downloaded (default %(default)s, shared with sft.py)")
    p.add_argument("--offline", action="store_true",
                   help="never use the network: every split must already be complete in --cache-dir")
    p.add_argument("--max-per-task", type=int, default=-1,
                   help="keep the first N items of each permuted task (default -1 = all; nanochat's -x)")
    p.add_argument("--tasks", default=None,
                   help="comma-separated labels, a subset of " + ",".join(t.label for t in TASKS) +
                        " (default: the first five, ChatCORE's at nanochat 92d63d4)")
    p.add_argument("--spellingbee", action="store_true",
                   help="add SpellingBee, ChatCORE's sixth task before July 2026 (the study's ChatCORE); its word "
                        f"list is {sft.WORDS_FILE[0]} in --source, or downloaded")
    p.add_argument("--retries", type=int, default=10, help="download attempts per file (default %(default)s)")
    p.add_argument("--hub-url", default=sft.HUB_URL,
                   help="where the dataset listings are fetched from (default %(default)s)")
    args = p.parse_args(argv)
    if args.mini:
        args.source = MINI_SOURCE
    if args.max_per_task == 0 or args.max_per_task < -1:
        p.error("--max-per-task must be -1 (all) or >= 1")
    if args.retries < 1:
        p.error("--retries must be >= 1")
    if args.tasks is not None:
        want = [x.strip() for x in args.tasks.split(",") if x.strip()]
        labels = [t.label for t in TASKS]
        unknown = [x for x in want if x not in labels]
        if unknown or not want:
            p.error(f"--tasks: unknown task {', '.join(unknown) or '(none given)'} (the tasks: {', '.join(labels)})")
        args.tasks = want
    return args


def run(args):
    t0 = time.time()
    enc, special = sft.load_chat_tokenizer(args.tokenizer, "chat_eval.py")
    log(f"tokenizer {args.tokenizer}: vocab {enc.n_vocab}, BOS {special[BOS]}")

    default = [t.label for t in TASKS[:HEAD_TASKS]] + (["SpellingBee"] if args.spellingbee else [])
    tasks = [t for t in TASKS if t.label in (args.tasks if args.tasks is not None else default)]
    rows = sft.load_rows([t.split for t in tasks], args, SPLITS, "chat_eval.py")  # every split read (and downloaded) before anything is written
    # every task rendered before anything is written, so that an input error leaves --out untouched
    prepared = []
    for t in tasks:
        items, cut = task_items(t, rows[t.split], args.max_per_task, enc, special)
        if not items:
            raise ChatEvalError(f"{t.label}: no items")
        prepared.append((t, items, cut))

    out = os.path.expanduser(args.out)
    os.makedirs(out, exist_ok=True)
    index = []
    for t, items, cut in prepared:
        data = header_bytes(t, len(items), enc.n_vocab, special[BOS], args.max_per_task) + \
            b"".join(item_bytes(*it) for it in items)
        name = task_file_name(t)
        climbmix.write_atomic(os.path.join(out, name), data)
        index.append(f"{name} {t.label} {t.kind} {len(items)} {t.baseline:g}\n")
        lengths = [len(it[0]) for it in items]
        extra = ""
        if t.kind == "categorical":
            extra = f", {sum(len(it[1]) for it in items) / len(items):.2f} choices per item"
        source = f"{len(rows[t.split]):,} {'words' if t.split == 'words' else 'rows'}"
        log(f"{name}: {t.kind} ({t.checker}), {len(items):,} items of {source}, prompt tokens mean "
            f"{sum(lengths) / len(lengths):.1f} max {max(lengths)}, {cut} cut to {MAX_TOKENS}{extra}, "
            f"baseline {t.baseline:g}, {len(data):,} bytes")
    climbmix.write_atomic(os.path.join(out, "index.txt"), "".join(index).encode("utf-8"))
    log(f"done: {len(prepared)} task files and index.txt in {out} in {time.time() - t0:.1f}s")


def main(argv=None):
    climbmix.run_cli("chat_eval.py", run, parse_args(argv), (ChatEvalError, sft.SftError))


if __name__ == "__main__":
    main()
