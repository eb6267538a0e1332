#!/usr/bin/env python3
"""
nanochat's SFT data mixture as conversation files for xsa-train (dev/data/README.md, "SFT mixture").

  python3 dev/data/sft.py --tokenizer TOKENIZER.bin --out DIR            # download from the HuggingFace hub
  python3 dev/data/sft.py --tokenizer TOKENIZER.bin --out DIR --offline  # only what --cache-dir already holds
  python3 dev/data/sft.py --tokenizer TOKENIZER.bin --out DIR --source SRC   # six local JSON-lines files
  python3 dev/data/sft.py --mini --tokenizer dev/data/devil/tokenizer.bin --out dev/data/sft_mini_tokens

This is the data side of nanochat's scripts/chat_sft.py (commit 92d63d4): the same datasets, the same
row order, the same conversations, the same mixture order and the same tokens and loss mask as its
tokenizer.render_conversation gives, written once to files so the trainer only packs them into rows:

  * datasets, read as nanochat's tasks/common.py load_hub_dataset reads them (the hub's parquet export):
    HuggingFaceTB/smol-smoltalk (default; train, test), cais/mmlu (all; auxiliary_train, test),
    openai/gsm8k (main; train, test);
  * each dataset's rows permuted with numpy.random.default_rng(42).permutation(n) (HubDataset.shuffle(seed=42));
  * conversations as tasks/smoltalk.py, tasks/mmlu.py (render_mc) and tasks/gsm8k.py (calculator parts) build
    them;
  * the mixtures of chat_sft.py: train = SmolTalk train + MMLU auxiliary_train x 3 + GSM8K train x 4, val =
    SmolTalk test + the first 5200 MMLU test rows + the first 420 GSM8K test rows, each a TaskMixture
    (all (task, row) pairs in task order, then random.Random(42).shuffle);
  * every conversation rendered as render_conversation does (BOS, the chat special tokens, text encoded
    with encode_ordinary, the mask of the tokens the model is trained to predict, cut to --max-tokens).

Output: DIR/sft_train.bin, DIR/sft_val.bin (format in dev/data/README.md, "SFT conversation file") and
DIR/sft_meta.json, each written to a .tmp file and renamed. Deterministic: the same bytes on every run,
whatever --workers.

Needs tiktoken and numpy, and pyarrow for the hub's parquet files (dev/data/requirements.txt).
"""

import array
import collections
import hashlib
import json
import os
import random
import re
import shutil
import struct
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import climbmix  # noqa: E402  (tokenizer reader, downloads; needs only the standard library at import)
import xsa_cli  # noqa: E402

# -----------------------------------------------------------------------------
# Constants

NANOCHAT_COMMIT = "92d63d4"  # the nanochat commit whose chat_sft.py this reproduces

SFT_MAGIC = 20261202
SFT_VERSION = 1
HEADER_INTS = 256

ROW_SEED = 42        # HubDataset.shuffle(seed=42): numpy.random.default_rng(42).permutation(n)
MIXTURE_SEED = 42    # TaskMixture: random.Random(42).shuffle(index_map)
DEFAULT_MAX_TOKENS = 2048   # render_conversation's default max_tokens, which chat_sft.py uses
DEFAULT_MMLU_EPOCHS = 3     # chat_sft.py --mmlu-epochs
DEFAULT_GSM8K_EPOCHS = 4    # chat_sft.py --gsm8k-epochs
MMLU_VAL_STOP = 5200        # MMLU(subset="all", split="test", stop=5200)
GSM8K_VAL_STOP = 420        # GSM8K(subset="main", split="test", stop=420)
MMLU_LETTERS = ("A", "B", "C", "D")

BOS, USER_START, USER_END, ASSISTANT_START, ASSISTANT_END, PYTHON_START, PYTHON_END, OUTPUT_START, OUTPUT_END = \
    climbmix.SPECIAL_TOKENS  # nanochat's 9 special tokens, in their order

HUB_URL = "https://huggingface.co"
HUB_LISTING = "{hub}/api/datasets/{repo}/parquet/{subset}/{split}"  # a JSON list of the split's parquet URLs
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "xsa-train", "sft")
MINI_SOURCE = "dev/data/sft_mini"

# The study's mixture (nanochat's chat_sft.py before 950a1dc, 2026-07-03): two more files and two tasks made
# from a word list (tasks/customjson.py, tasks/spellingbee.py of that time)
STUDY_COMMIT = "950a1dc^"
IDENTITY_FILE = ("identity_conversations.jsonl", "https://karpathy-public.s3.us-west-2.amazonaws.com/identity_conversations.jsonl")
WORDS_FILE = ("words_alpha.txt", "https://raw.githubusercontent.com/dwyl/english-words/refs/heads/master/words_alpha.txt")
IDENTITY_COPIES = 2          # CustomJSON(identity) twice: "2 epochs of these"
SIMPLE_SPELLING_SIZE = 200000  # SimpleSpelling(size=200000, split="train")
SPELLING_BEE_SIZE = 80000    # SpellingBee(size=80000, split="train")

BATCH = 256           # conversations per rendering job
REPORT_EVERY = 5.0    # seconds between progress lines


class SftError(Exception):
    """An error reported to the user as one line, exit code 1."""


class ConversationError(Exception):
    """A conversation that nanochat would refuse (an assert in its code); the caller adds which row."""


log = climbmix.log


# A dataset split: where it lives on the hub, the columns read, and its file name for --source.
Split = collections.namedtuple("Split", "key repo subset split columns")

SPLITS = {s.key: s for s in [
    Split("smoltalk_train", "HuggingFaceTB/smol-smoltalk", "default", "train", ("messages",)),
    Split("smoltalk_test", "HuggingFaceTB/smol-smoltalk", "default", "test", ("messages",)),
    Split("mmlu_auxiliary_train", "cais/mmlu", "all", "auxiliary_train", ("question", "choices", "answer", "subject")),
    Split("mmlu_test", "cais/mmlu", "all", "test", ("question", "choices", "answer", "subject")),
    Split("gsm8k_train", "openai/gsm8k", "main", "train", ("question", "answer")),
    Split("gsm8k_test", "openai/gsm8k", "main", "test", ("question", "answer")),
]}


def split_label(spec):
    return f"{spec.repo} {spec.subset}/{spec.split}"


# -----------------------------------------------------------------------------
# Rows: the same dicts ({column: value}) from the hub's parquet files or from local JSON lines, so that
# everything after loading is one code path.

def read_text(path, missing=""):
    """A UTF-8 text file's text; SftError if it is missing (`missing` says what to do), unreadable or not UTF-8."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise SftError(f"{path}: no such file{missing}")
    except OSError as e:
        raise SftError(f"{path}: cannot read ({e.strerror})")
    except UnicodeDecodeError:
        raise SftError(f"{path}: not UTF-8")


def json_lines(path, missing=""):
    """(line number, value) of every non-blank line of a JSON-lines file (blank lines, e.g. at the end, hold none)."""
    out = []
    for n, line in enumerate(read_text(path, missing).split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise SftError(f"{path} line {n}: bad JSON ({e.msg})")
    return out


class JsonlRows:
    def __init__(self, spec, path):
        self.spec = spec
        self.path = path
        self.rows, self.lines = [], []
        for n, row in json_lines(path, f" (--source needs {', '.join(k + '.jsonl' for k in SPLITS)})"):
            if not isinstance(row, dict):
                raise SftError(f"{path} line {n}: a row must be a JSON object with the columns "
                               f"{', '.join(spec.columns)}")
            missing = [c for c in spec.columns if c not in row]
            if missing:
                raise SftError(f"{path} line {n}: no '{missing[0]}' (a {spec.key} row has {', '.join(spec.columns)})")
            self.rows.append(row)
            self.lines.append(n)
        if not self.rows:
            raise SftError(f"{path}: no rows")

    def __len__(self):
        return len(self.rows)

    def row(self, i):
        return self.rows[i]

    def where(self, i):
        return f"{self.path} line {self.lines[i]}"


class ParquetRows:
    """The hub's parquet shards of one split, concatenated in the listing's order (as load_hub_dataset's
    pa.concat_tables); rows are read one at a time, as HubDataset.__getitem__ does, so the 460K SmolTalk
    conversations never all become Python objects at once."""

    def __init__(self, spec, paths):
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.spec = spec
        tables = []
        for path in paths:
            try:
                pf = pq.ParquetFile(path)
                names = pf.schema_arrow.names
            except Exception as e:  # pyarrow raises several types for a corrupt file
                raise SftError(f"{path}: cannot read parquet file ({' '.join(str(e).split())})")
            missing = [c for c in spec.columns if c not in names]
            if missing:
                raise SftError(f"{path}: no column '{missing[0]}' (columns: {', '.join(names) or 'none'}); "
                               f"{split_label(spec)} should have {', '.join(spec.columns)}")
            tables.append(pq.read_table(path, columns=list(spec.columns)))
        table = pa.concat_tables(tables)
        # kept chunked (indexing finds the chunk by binary search): combining SmolTalk's chunks into one array
        # could pass the 2 GiB limit of a string array's 32-bit offsets
        self.columns = {c: table.column(c) for c in spec.columns}
        self.n = table.num_rows
        if not self.n:
            raise SftError(f"{split_label(spec)}: no rows in {os.path.dirname(paths[0])}")

    def __len__(self):
        return self.n

    def row(self, i):
        return {c: col[i].as_py() for c, col in self.columns.items()}

    def where(self, i):
        return f"{split_label(self.spec)} row {i}"


# -----------------------------------------------------------------------------
# The hub's parquet export (nanochat's load_hub_dataset): a listing of shard URLs, the shards downloaded
# once into the cache as 00000.parquet, 00001.parquet, ... and manifest.json (the file names) written last,
# so a split is complete exactly when its manifest exists.

def split_cache_dir(cache_dir, spec):
    return os.path.join(cache_dir, spec.repo.replace("/", "--"), spec.subset, spec.split)


def fetch_listing(url, retries, timeout=60):
    last = None
    for attempt in range(retries):
        if attempt:
            delay = min(60, 2 ** attempt)
            log(f"{url}: attempt {attempt}/{retries - 1} failed ({last}); retrying in {delay}s")
            time.sleep(delay)
        try:
            req = urllib.request.Request(url, headers={"User-Agent": "xsa-train-sft/1.0"})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read()
            break
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500 and e.code not in (408, 429):
                raise SftError(f"{url}: HTTP {e.code} {e.reason}")
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
    else:
        raise SftError(f"{url}: failed after {retries} attempts ({last})")
    try:
        urls = json.loads(body)
    except ValueError:
        raise SftError(f"{url}: the listing is not JSON")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        raise SftError(f"{url}: expected a non-empty JSON list of parquet URLs")
    return urls


def hub_split_paths(spec, cache_dir, offline, retries, hub_url=HUB_URL, script="sft.py"):
    """The local parquet files of one split, downloaded first unless the manifest says they are there."""
    d = split_cache_dir(cache_dir, spec)
    manifest = os.path.join(d, "manifest.json")
    if not os.path.exists(manifest):
        if offline:
            raise SftError(f"--offline: {split_label(spec)} is not downloaded (no {manifest}); run {script} once "
                           f"without --offline (same --cache-dir) to download it, or use --source DIR")
        os.makedirs(d, exist_ok=True)
        listing = HUB_LISTING.format(hub=hub_url.rstrip("/"), repo=spec.repo, subset=spec.subset, split=spec.split)
        urls = fetch_listing(listing, retries)
        names = [f"{k:05d}.parquet" for k in range(len(urls))]
        log(f"{split_label(spec)}: downloading {len(urls)} parquet files into {d}")
        progress = climbmix._Progress(len(urls))  # climbmix's download counters
        stop = threading.Event()

        def report():
            while not stop.wait(REPORT_EVERY):
                log(f"{spec.key}: {progress.line()}")

        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()
        try:
            for url, name in zip(urls, names):
                # resumable (.tmp + HTTP Range), size- and magic-checked, retried; a finished file is skipped
                climbmix.download_file(url, os.path.join(d, name), progress, retries=retries)
        finally:
            stop.set()
            reporter.join()
        log(f"{spec.key}: {progress.line()}")
        climbmix.write_atomic(manifest, (json.dumps(names) + "\n").encode("utf-8"))
    try:
        with open(manifest, encoding="utf-8") as f:
            names = json.load(f)
    except (OSError, ValueError) as e:
        raise SftError(f"{manifest}: cannot read ({e}); delete {d} to download the split again")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise SftError(f"{manifest}: not a list of parquet file names; delete {d} to download the split again")
    paths = [os.path.join(d, n) for n in names]
    for p in paths:
        if not os.path.isfile(p):
            raise SftError(f"{p}: missing although {manifest} lists it; delete {d} to download the split again")
    return paths


class IdentityFile:
    """The identity conversations (tasks/customjson.py's input): one JSON list of messages per line."""

    def __init__(self, path):
        self.path = path
        lines = json_lines(path)
        self.lines, self.items = [n for n, _ in lines], [v for _, v in lines]

    def __len__(self):
        return len(self.items)


class WordList:
    """The spelling tasks' words: one per line, stripped (the real list: 370,105 lowercase English words)."""

    def __init__(self, path):
        self.path = path
        self.words = [line.strip() for line in read_text(path).splitlines()]
        for n, w in enumerate(self.words, 1):
            if not w:
                raise SftError(f"{path} line {n}: an empty word (the spelling tasks draw letters from every word)")

    def __len__(self):
        return len(self.words)


# The study mixture's two files: {key: ((file name, URL), reader)}
EXTRA_INPUTS = {"identity": (IDENTITY_FILE, IdentityFile), "words": (WORDS_FILE, WordList)}


def extra_input_path(key, args, script):
    """Where one of EXTRA_INPUTS is: in --source DIR, or in --cache-dir (downloaded there first, resumable and
    size-checked, unless --offline)."""
    (name, url), _ = EXTRA_INPUTS[key]
    if args.source is not None:
        return os.path.join(os.path.expanduser(args.source), name)
    path = os.path.join(os.path.expanduser(args.cache_dir), "files", name)
    if not os.path.isfile(path):
        if args.offline:
            raise SftError(f"--offline: {name} is not downloaded (no {path}); run {script} once without --offline "
                           f"(same --cache-dir) to download it, or use --source DIR")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log(f"{key}: downloading {url}")
        climbmix.download_file(url, path, retries=args.retries, parquet=False)
    return path


def load_rows(keys, args, splits=SPLITS, script="sft.py"):
    """{key: rows} for the splits a mixture (or chat_eval.py's tasks: `splits`, `script`) needs, all loaded (and
    the downloads done) before any rendering; the study mixture's identity conversations and word list too."""
    out = {}
    for k in [k for k in keys if k in EXTRA_INPUTS]:
        out[k] = EXTRA_INPUTS[k][1](extra_input_path(k, args, script))
        log(f"{k}: {len(out[k]):,} {'words' if k == 'words' else 'conversations'} ({out[k].path})")
    keys = [k for k in keys if k not in EXTRA_INPUTS]
    if args.source is not None:
        src = os.path.expanduser(args.source)
        if not os.path.isdir(src):
            raise SftError(f"--source {src}: no such directory")
        missing = [k + ".jsonl" for k in keys if not os.path.isfile(os.path.join(src, k + ".jsonl"))]
        if missing:
            raise SftError(f"--source {src}: missing {', '.join(missing)} (one JSON object per line with the hub's "
                           "columns; see dev/data/README.md)")
        for k in keys:
            out[k] = JsonlRows(splits[k], os.path.join(src, k + ".jsonl"))
    else:
        cache_dir = os.path.expanduser(args.cache_dir)
        paths = {k: hub_split_paths(splits[k], cache_dir, args.offline, args.retries, args.hub_url, script) for k in keys}
        for k in keys:
            out[k] = ParquetRows(splits[k], paths[k])
    for k in keys:
        log(f"{k}: {len(out[k]):,} rows ({split_label(splits[k])})")
    return out


# -----------------------------------------------------------------------------
# Conversations, as nanochat's tasks build them (their asserts become ConversationError)

def render_mc(question, letters, choices):
    """tasks/common.py render_mc: the letter comes *after* its choice and right after '=' (no space), so that
    it is the same token as the assistant's one-letter answer."""
    query = f"Multiple Choice question: {question}\n"
    query += "".join(f"- {choice}={letter}\n" for letter, choice in zip(letters, choices))
    query += "\nRespond only with the letter of the correct answer."
    return query


def _message(m, i):
    if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ConversationError(f"message {i} is not an object with 'role' and 'content'")
    return m


def smoltalk_conversation(row):
    """tasks/smoltalk.py: an optional leading system message, then at least 2 messages alternating user,
    assistant, user, ..., every content a string."""
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise ConversationError("'messages' must be a non-empty list")
    messages = [_message(m, i) for i, m in enumerate(messages)]
    rest = messages[1:] if messages[0]["role"] == "system" else messages
    if len(rest) < 2:
        raise ConversationError("needs at least 2 messages after the optional system message")
    for i, m in enumerate(rest):
        want = "user" if i % 2 == 0 else "assistant"
        if m["role"] != want:
            raise ConversationError(f"message {i} (not counting a system message) has role {m['role']!r}, "
                                    f"expected {want!r}")
    for i, m in enumerate(messages):
        if not isinstance(m["content"], str):  # nanochat checks the rest; the system one is joined as a string
            raise ConversationError(f"message {i}: content must be a string")
    return {"messages": messages}


def mmlu_conversation(row):
    """tasks/mmlu.py: user = render_mc(question, ABCD, choices), assistant = the answer's letter."""
    q, choices, answer = row["question"], row["choices"], row["answer"]
    if not isinstance(q, str):
        raise ConversationError("'question' must be a string")
    if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, str) for c in choices):
        raise ConversationError("'choices' must be a list of 4 strings")
    # nanochat indexes letters[answer]; a negative index would pick a letter from the end there
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < 4:
        raise ConversationError(f"'answer' must be 0, 1, 2 or 3, got {answer!r}")
    return {"messages": [{"role": "user", "content": render_mc(q, MMLU_LETTERS, choices)},
                         {"role": "assistant", "content": MMLU_LETTERS[answer]}]}


_CALC = re.compile(r"(<<[^>]+>>)")


def gsm8k_parts(answer):
    """tasks/gsm8k.py: the solution split at its calculator annotations <<expr=result>>; the text between them
    (empty pieces included) a "text" part, each annotation a "python" part (expr) and a "python_output" part
    (result), split at the *last* '=' (an annotation without '=' gives the whole as expr and "" as result)."""
    parts = []
    for piece in _CALC.split(answer):
        if piece.startswith("<<") and piece.endswith(">>"):
            inner = piece[2:-2]
            expr, result = inner.rsplit("=", 1) if "=" in inner else (inner, "")
            parts.append({"type": "python", "text": expr})
            parts.append({"type": "python_output", "text": result})
        else:
            parts.append({"type": "text", "text": piece})
    return parts


def gsm8k_conversation(row):
    q, a = row["question"], row["answer"]
    if not isinstance(q, str) or not isinstance(a, str):
        raise ConversationError("'question' and 'answer' must be strings")
    return {"messages": [{"role": "user", "content": q},
                         {"role": "assistant", "content": gsm8k_parts(a)}]}


BUILDERS = {"smoltalk": smoltalk_conversation, "mmlu": mmlu_conversation, "gsm8k": gsm8k_conversation}


# -----------------------------------------------------------------------------
# Tasks and mixtures (tasks/common.py Task, TaskMixture)

class Task:
    """One dataset split, its rows permuted as HubDataset.shuffle(seed=42) permutes them, optionally only the
    first `stop` of those (Task(stop=...)). Every copy of a task in a mixture (an "epoch") has the same order:
    nanochat builds each copy with the same seed."""

    def __init__(self, rows, stop=None):
        import numpy as np
        self.rows = rows
        self.key = rows.spec.key
        self.builder = BUILDERS[self.key.split("_")[0]]
        self.perm = np.random.default_rng(ROW_SEED).permutation(len(rows))
        # nanochat's len is stop itself (and a stop past the end fails when that row is read); the real test
        # splits are longer than their stops, so min() only changes what a small --source split gives
        self.stop = stop
        self.length = len(rows) if stop is None else min(stop, len(rows))

    def __len__(self):
        return self.length

    def physical(self, i):
        return int(self.perm[i])

    def conversation(self, i):
        p = self.physical(i)
        try:
            return self.builder(self.rows.row(p))
        except ConversationError as e:
            raise SftError(f"{self.rows.where(p)} ({self.key}): {e}")


def mixture_index_map(lengths, seed=MIXTURE_SEED):
    """TaskMixture: every (task index, local index) pair, tasks in list order and rows in order, then shuffled
    with random.Random(seed) (the shuffle only depends on the list's length)."""
    index_map = [(t, i) for t, n in enumerate(lengths) for i in range(n)]
    random.Random(seed).shuffle(index_map)
    return index_map


def head_mixtures(rows, args):
    """chat_sft.py at nanochat 92d63d4: (train tasks, val tasks)."""
    train = ([Task(rows["smoltalk_train"])]
             + [Task(rows["mmlu_auxiliary_train"]) for _ in range(args.mmlu_epochs)]
             + [Task(rows["gsm8k_train"]) for _ in range(args.gsm8k_epochs)])
    val = [Task(rows["smoltalk_test"]),
           Task(rows["mmlu_test"], stop=MMLU_VAL_STOP),
           Task(rows["gsm8k_test"], stop=GSM8K_VAL_STOP)]
    return train, val


# -----------------------------------------------------------------------------
# The study's extra tasks: identity conversations and the two spelling tasks

SPELLING_LETTERS = "abcdefghijklmnopqrstuvwxyz"
SPELLING_TEST_SEED_OFFSET = 10_000_000  # a test example's seed: this + its index (a train example's: its index)
SPELLING_SHUFFLE_SEED = 42              # SimpleSpelling draws from the word list shuffled with random.Random(42)
# SpellingBee's user messages (data augmentation), in nanochat's order: the order decides which one a seed picks
SPELLING_BEE_TEMPLATES = [
    "How many {letter} are in the word {word}", "How many {letter} are in {word}", "Count the number of {letter} in {word}",
    "How many times does {letter} appear in {word}", "What's the count of {letter} in {word}",
    "In the word {word}, how many {letter} are there", "How many letter {letter} are in the word {word}",
    "Count how many {letter} appear in {word}", "Tell me the number of {letter} in {word}",
    "How many occurrences of {letter} are in {word}", "Find the count of {letter} in {word}",
    "Can you count the {letter} letters in {word}", "What is the frequency of {letter} in {word}",
    "How many {letter}s are in {word}", "How many {letter}'s are in {word}", "Count all the {letter} in {word}",
    "How many times is {letter} in {word}", "Number of {letter} in {word}", "Total count of {letter} in {word}",
    "How many {letter} does {word} have", "How many {letter} does {word} contain", "What's the number of {letter} in {word}",
    "{word} has how many {letter}", "In {word}, count the {letter}", "How many {letter} appear in {word}",
    "Count the {letter} in {word}", "Give me the count of {letter} in {word}", "How many instances of {letter} in {word}",
    "Show me how many {letter} are in {word}", "Calculate the number of {letter} in {word}",
    "¿Cuántas {letter} hay en {word}?", "¿Cuántas veces aparece {letter} en {word}?", "Cuenta las {letter} en {word}",
    "¿Cuántas letras {letter} tiene {word}?",
    "{word}中有多少个{letter}", "{word}里有几个{letter}", "数一下{word}中的{letter}", "{word}这个词里有多少{letter}",
    "{word}에 {letter}가 몇 개 있나요", "{word}에서 {letter}의 개수는", "{word}에 {letter}가 몇 번 나오나요",
    "{word}라는 단어에 {letter}가 몇 개",
    "Combien de {letter} dans {word}", "Combien de fois {letter} apparaît dans {word}", "Compte les {letter} dans {word}",
    "Wie viele {letter} sind in {word}", "Wie oft kommt {letter} in {word} vor", "Zähle die {letter} in {word}",
    "{word}に{letter}は何個ありますか", "{word}の中に{letter}がいくつ", "{word}に{letter}が何回出てくる",
]


def spelling_seed(index, split):
    return index if split == "train" else SPELLING_TEST_SEED_OFFSET + index


def spelling_bee_conversation(words, index, split):
    """SpellingBee example `index` of `split`: how often a letter occurs in a word, answered by spelling the
    word out with a running count, then checking with the python tool, then '#### N'. Every random draw is
    nanochat's, in its order (so the same word list gives the same examples)."""
    rng = random.Random(spelling_seed(index, split))
    word = rng.choice(words)
    letter = rng.choice(word) if rng.random() < 0.9 else rng.choice(SPELLING_LETTERS)  # mostly a letter of the word
    count = word.count(letter)
    template = rng.choice(SPELLING_BEE_TEMPLATES)
    if rng.random() < 0.3:
        template = template.lower()
    letter_quote, word_quote = rng.choice(["", "'", '"']), rng.choice(["", "'", '"'])
    user = template.format(letter=letter_quote + letter + letter_quote, word=word_quote + word + word_quote)
    if rng.random() < 0.5:
        user += "?"
    lines, running = [], 0
    for position, char in enumerate(word, 1):
        running += char == letter
        # no space between the position and the letter: " a" would be another token than "a"
        lines.append(f"{position}:{char} hit! count={running}" if char == letter else f"{position}:{char}")
    spelled = (f"We are asked to find the number '{letter}' in the word '{word}'. Let me try a manual approach first.\n\n"
               f"First spell the word out:\n{word}:{','.join(word)}\n\nThen count the occurrences of '{letter}':\n"
               + "".join(line + "\n" for line in lines) + f"\nThis gives us {running}.")
    parts = [{"type": "text", "text": spelled},
             {"type": "text", "text": "\n\nLet me double check this using Python:\n\n"},
             {"type": "python", "text": f"'{word}'.count('{letter}')"},
             {"type": "python_output", "text": str(count)},
             {"type": "text", "text": f"\n\nPython gives us {count}.\n\nMy final answer is:\n\n#### {count}"}]
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": parts}]}


def simple_spelling_conversation(shuffled_words, index, split):
    """SimpleSpelling example `index`: 'Spell the word: W' -> 'W:w,o,r,d' (from the shuffled word list)."""
    word = random.Random(spelling_seed(index, split)).choice(shuffled_words)
    return {"messages": [{"role": "user", "content": f"Spell the word: {word}"},
                         {"role": "assistant", "content": f"{word}:{','.join(word)}"}]}


def identity_conversation(messages):
    """A CustomJSON line: a list of at least 2 messages, user and assistant in turn, each content a string."""
    if not isinstance(messages, list):
        raise ConversationError(f"expected a list of messages, got {type(messages).__name__}")
    if len(messages) < 2:
        raise ConversationError(f"a conversation needs at least 2 messages, got {len(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ConversationError(f"message {i} needs 'role' and 'content'")
        want = "user" if i % 2 == 0 else "assistant"
        if m["role"] != want:
            raise ConversationError(f"message {i} is from {m['role']!r} but should be from {want!r}")
        if not isinstance(m["content"], str):
            raise ConversationError(f"message {i}: content must be a string")
    return {"messages": messages}


class MadeTask:
    """A task that is not a hub split: the identity conversations (in file order) or a spelling task
    (example i made from seed i); nothing is permuted. It offers what Task offers to the mixture."""

    def __init__(self, key, source, split, n, make, where):
        self.key, self.stop, self.rows, self.length = key, None, self, n
        self.spec = Split(key, source, "-", split, ())
        self.make, self._where = make, where

    def __len__(self):
        return self.length

    def physical(self, i):
        return i

    def where(self, i):
        return self._where(i)

    def conversation(self, i):
        try:
            return self.make(i)
        except ConversationError as e:
            raise SftError(f"{self.where(i)} ({self.key}): {e}")


def study_mixtures(rows, args):
    """chat_sft.py before nanochat 950a1dc (the study's): the head mixture's tasks plus identity x 2 after
    SmolTalk, and SimpleSpelling and SpellingBee at the end; the same validation mixture."""
    head_train, val = head_mixtures(rows, args)
    identity, words = rows["identity"], rows["words"]
    shuffled = list(words.words)
    random.Random(SPELLING_SHUFFLE_SEED).shuffle(shuffled)
    identity_task = lambda: MadeTask("identity", identity.path, "train", len(identity.items),  # noqa: E731
                                     lambda i: identity_conversation(identity.items[i]), lambda i: f"{identity.path} line {identity.lines[i]}")
    train = ([head_train[0]] + [identity_task() for _ in range(IDENTITY_COPIES)] + head_train[1:]
             + [MadeTask("simple_spelling", words.path, "train", args.simple_spelling,
                         lambda i: simple_spelling_conversation(shuffled, i, "train"), lambda i: f"SimpleSpelling example {i}"),
                MadeTask("spelling_bee", words.path, "train", args.spelling_bee,
                         lambda i: spelling_bee_conversation(words.words, i, "train"), lambda i: f"SpellingBee example {i}")])
    return train, val


MIXTURES = {"head": (["smoltalk_train", "mmlu_auxiliary_train", "gsm8k_train", "smoltalk_test", "mmlu_test",
                      "gsm8k_test"], head_mixtures),
            "study": (["smoltalk_train", "mmlu_auxiliary_train", "gsm8k_train", "smoltalk_test", "mmlu_test",
                       "gsm8k_test", "identity", "words"], study_mixtures)}


# -----------------------------------------------------------------------------
# Rendering (nanochat tokenizer.py render_conversation)

def chat_special_ids(enc):
    """{name: id} of the 9 special tokens; SftError if the tokenizer lacks one."""
    ids = {}
    for name in climbmix.SPECIAL_TOKENS:
        try:
            ids[name] = enc.encode_single_token(name)
        except KeyError:
            raise SftError(f"the tokenizer has no special token {name}: conversations need nanochat's 9 "
                           f"({' '.join(climbmix.SPECIAL_TOKENS)})")
    return ids


def render_conversation(conversation, enc, special, max_tokens=DEFAULT_MAX_TOKENS):
    """(ids, mask) as nanochat's render_conversation: mask 1 marks the tokens the assistant is trained to
    produce (its text, its tool calls and <|assistant_end|>); everything else, including the python tool's
    output (which comes from Python at inference time), is mask 0. Text is encoded with encode_ordinary (the
    text of a special token is ordinary text, as tokenizer.encode(str) does). The result is cut to max_tokens."""
    messages = conversation["messages"]
    if not messages:
        raise ConversationError("no messages")
    if messages[0]["role"] == "system":
        # nanochat merges a leading system message into the user message after it
        if len(messages) < 2 or messages[1]["role"] != "user":
            raise ConversationError("a system message must be followed by a user message")
        first = dict(messages[1], content=messages[0]["content"] + "\n\n" + messages[1]["content"])
        messages = [first] + list(messages[2:])
    ids, mask = [special[BOS]], [0]

    def add(tokens, m):
        ids.extend(tokens)
        mask.extend([m] * len(tokens))

    for i, message in enumerate(messages):
        want = "user" if i % 2 == 0 else "assistant"
        if message["role"] != want:
            raise ConversationError(f"message {i} is from {message['role']!r} but should be from {want!r}")
        content = message["content"]
        if want == "user":
            if not isinstance(content, str):
                raise ConversationError(f"message {i}: a user message must be a string")
            add([special[USER_START]], 0)
            add(enc.encode_ordinary(content), 0)
            add([special[USER_END]], 0)
            continue
        add([special[ASSISTANT_START]], 0)
        if isinstance(content, str):
            add(enc.encode_ordinary(content), 1)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                    raise ConversationError(f"message {i}: a part must be an object with a string 'text'")
                kind = part.get("type")
                if kind == "text":
                    add(enc.encode_ordinary(part["text"]), 1)
                elif kind == "python":
                    add([special[PYTHON_START]], 1)
                    add(enc.encode_ordinary(part["text"]), 1)
                    add([special[PYTHON_END]], 1)
                elif kind == "python_output":
                    add([special[OUTPUT_START]], 0)
                    add(enc.encode_ordinary(part["text"]), 0)
                    add([special[OUTPUT_END]], 0)
                else:
                    raise ConversationError(f"message {i}: unknown part type {kind!r}")
        else:
            raise ConversationError(f"message {i}: content must be a string or a list of parts")
        add([special[ASSISTANT_END]], 1)
    return ids[:max_tokens], mask[:max_tokens]


# Rendering runs in worker processes (one Encoding each); a job is a list of conversations.
_WORKER = {}


def _worker_init(pattern, ranks, max_tokens):
    enc = climbmix.make_encoding(ranks, pattern)
    _WORKER.update(enc=enc, special=chat_special_ids(enc), max_tokens=max_tokens)


def _render_job(conversations):
    """('ok', tokens as uint32 LE bytes, mask bytes, [(length, trained, truncated)]) or ('error', k, message)."""
    enc, special, max_tokens = _WORKER["enc"], _WORKER["special"], _WORKER["max_tokens"]
    tokens, mask, stats = array.array("I"), bytearray(), []
    if tokens.itemsize != 4:
        raise RuntimeError("unexpected C type sizes")
    for k, conv in enumerate(conversations):
        try:
            ids, m = render_conversation(conv, enc, special, max_tokens=1 << 62)
        except ConversationError as e:
            return ("error", k, str(e))
        truncated = len(ids) > max_tokens
        ids, m = ids[:max_tokens], m[:max_tokens]
        tokens.extend(ids)
        mask.extend(m)
        stats.append((len(ids), sum(m), truncated))
    if sys.byteorder != "little":
        tokens.byteswap()
    return ("ok", tokens.tobytes(), bytes(mask), stats)


class Renderer:
    """Renders jobs in a spawn Pool (or in this process for workers <= 1), results in order, a few jobs in
    flight per worker."""

    def __init__(self, enc, max_tokens, workers):
        special = set(chat_special_ids(enc).values())
        ranks = {enc.decode_single_token_bytes(i): i for i in range(enc.n_vocab) if i not in special}
        state = (enc._pat_str, ranks, max_tokens)
        self.workers = workers
        self.pool = None
        if workers > 1:
            import multiprocessing as mp
            self.pool = mp.get_context("spawn").Pool(workers, initializer=_worker_init, initargs=state)
        else:
            _worker_init(*state)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.pool is None:
            return
        if exc_type is None or issubclass(exc_type, Exception):
            # close + join lets the workers finish the few jobs in flight (map keeps at most 4 per worker).
            # Pool.terminate can deadlock here: it stops the result handler while a worker may be writing a
            # large result into the pipe holding the queue's lock, then waits for that lock itself.
            self.pool.close()
        else:
            self.pool.terminate()  # Ctrl-C: the workers got the signal too and may have died mid-job
        self.pool.join()
        self.pool = None

    def map(self, jobs):
        """jobs: (tag, conversations); yields (tag, _render_job(conversations)) in order."""
        if self.pool is None:
            for tag, convs in jobs:
                yield tag, _render_job(convs)
            return
        pending = collections.deque()
        for tag, convs in jobs:
            pending.append((tag, self.pool.apply_async(_render_job, (convs,))))
            if len(pending) >= 4 * self.workers:
                t, r = pending.popleft()
                yield t, r.get()
        while pending:
            t, r = pending.popleft()
            yield t, r.get()


# -----------------------------------------------------------------------------
# The conversation file (dev/data/README.md, "SFT conversation file")

def sft_header(n_conv, n_tokens, vocab, bos, max_tokens):
    h = [SFT_MAGIC, SFT_VERSION, n_conv & 0xFFFFFFFF, n_conv >> 32, n_tokens & 0xFFFFFFFF, n_tokens >> 32,
         vocab, bos, max_tokens] + [0] * (HEADER_INTS - 9)
    # the 64-bit counts' halves are packed unsigned (a reader may take them as int32 or uint32)
    return struct.pack(f"<2i4I{HEADER_INTS - 6}i", *h)


def write_split(path, label, tasks, renderer, vocab, bos, max_tokens):
    """Render the mixture of `tasks` and write the file at `path` (tokens and mask go to two temporary files
    first, since the offsets come before them; then the file is assembled as path.tmp and renamed).
    Returns the statistics."""
    lengths = [len(t) for t in tasks]
    index_map = mixture_index_map(lengths)
    total = len(index_map)
    if not total:
        raise SftError(f"{label}: the mixture has no conversations")
    tok_tmp, mask_tmp, tmp = path + ".tokens.tmp", path + ".mask.tmp", path + ".tmp"
    offsets = array.array("Q", [0])
    if offsets.itemsize != 8:
        raise RuntimeError("unexpected C type sizes")
    per_task = [dict(conversations=0, tokens=0, trained_tokens=0, truncated=0) for _ in tasks]
    done = n_tokens = 0
    t0 = last = time.time()

    def jobs():
        for s in range(0, total, BATCH):
            entries = index_map[s:s + BATCH]
            yield entries, [tasks[t].conversation(i) for t, i in entries]

    try:
        with open(tok_tmp, "wb") as ft, open(mask_tmp, "wb") as fm:
            for entries, result in renderer.map(jobs()):
                if result[0] == "error":
                    t, i = entries[result[1]]
                    p = tasks[t].physical(i)
                    raise SftError(f"{tasks[t].rows.where(p)} ({tasks[t].key}): {result[2]}")
                _, tok_bytes, mask_bytes, stats = result
                ft.write(tok_bytes)
                fm.write(mask_bytes)
                for (t, _), (n, trained, truncated) in zip(entries, stats):
                    n_tokens += n
                    offsets.append(n_tokens)
                    st = per_task[t]
                    st["conversations"] += 1
                    st["tokens"] += n
                    st["trained_tokens"] += trained
                    st["truncated"] += truncated
                done += len(entries)
                now = time.time()
                if now - last >= REPORT_EVERY:
                    last = now
                    log(f"{label}: {done:,} / {total:,} conversations rendered, {n_tokens:,} tokens, "
                        f"{done / (now - t0):,.0f} conversations/s")
        if sys.byteorder != "little":
            offsets.byteswap()
        with open(tmp, "wb") as f:
            f.write(sft_header(total, n_tokens, vocab, bos, max_tokens))
            f.write(offsets.tobytes())
            for part in (tok_tmp, mask_tmp):
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 20)
        os.replace(tmp, path)
    finally:
        for p in (tok_tmp, mask_tmp, tmp):
            if os.path.exists(p):
                os.remove(p)
    return dict(file=os.path.basename(path), conversations=total, tokens=n_tokens,
                trained_tokens=sum(s["trained_tokens"] for s in per_task),
                truncated=sum(s["truncated"] for s in per_task), seconds=time.time() - t0, per_task=per_task)


def task_summary(tasks, per_task):
    """Per dataset split in mixture order (its copies together): rows, stop, copies and the totals."""
    out, index = [], {}
    for t, st in zip(tasks, per_task):
        if t.key not in index:
            spec = t.rows.spec
            index[t.key] = len(out)
            out.append(dict(name=t.key, dataset=spec.repo, subset=spec.subset, split=spec.split, rows=len(t.rows),
                            stop=t.stop, copies=0, conversations=0, tokens=0, trained_tokens=0, truncated=0))
        e = out[index[t.key]]
        e["copies"] += 1
        for k in ("conversations", "tokens", "trained_tokens", "truncated"):
            e[k] += st[k]
    return out


def pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "-"


# -----------------------------------------------------------------------------
# Main

def parse_args(argv=None):
    p = xsa_cli.ArgumentParser(description="nanochat's SFT mixture (chat_sft.py at nanochat 92d63d4) as conversation "
                               "files for xsa-train (format: dev/data/README.md, 'SFT conversation file').")
    p.add_argument("--tokenizer", required=True, help="tokenizer.bin of the model to fine-tune (climbmix.py's)")
    p.add_argument("--out", required=True, help="output directory: sft_train.bin, sft_val.bin, sft_meta.json")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--source", default=None, metavar="DIR",
                     help="read the splits from DIR/<split>.jsonl (smoltalk_train, smoltalk_test, "
                          "mmlu_auxiliary_train, mmlu_test, gsm8k_train, gsm8k_test) instead of the hub")
    src.add_argument("--mini", action="store_true", help=f"the committed mini mixture: --source {MINI_SOURCE}")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR,
                   help="where the hub's parquet files are downloaded (default %(default)s)")
    p.add_argument("--offline", action="store_true",
                   help="never use the network: every split must already be complete in --cache-dir")
    p.add_argument("--mixture", default="head", choices=sorted(MIXTURES),
                   help="head: nanochat 92d63d4's chat_sft.py mixture (default); study: the one before 950a1dc "
                        "(July 2026) that the study ran, with identity conversations x 2, SimpleSpelling and "
                        f"SpellingBee ({IDENTITY_FILE[0]} and {WORDS_FILE[0]} in --source, or downloaded)")
    p.add_argument("--mmlu-epochs", type=int, default=DEFAULT_MMLU_EPOCHS,
                   help="copies of MMLU auxiliary_train in the train mixture (default %(default)s)")
    p.add_argument("--gsm8k-epochs", type=int, default=DEFAULT_GSM8K_EPOCHS,
                   help="copies of GSM8K train in the train mixture (default %(default)s)")
    p.add_argument("--simple-spelling", type=int, default=SIMPLE_SPELLING_SIZE,
                   help="study mixture: SimpleSpelling examples (default %(default)s, nanochat's)")
    p.add_argument("--spelling-bee", type=int, default=SPELLING_BEE_SIZE,
                   help="study mixture: SpellingBee examples (default %(default)s, nanochat's)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="cut every conversation to this many tokens (default %(default)s, render_conversation's)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="rendering processes (default %(default)s); the output does not depend on it")
    p.add_argument("--retries", type=int, default=10, help="download attempts per file (default %(default)s)")
    p.add_argument("--hub-url", default=HUB_URL,
                   help="where the dataset listings are fetched from (default %(default)s; another value for a "
                        "mirror, or a local server in the tests)")
    args = p.parse_args(argv)
    if args.mini:
        args.source = MINI_SOURCE
    for name in ("mmlu_epochs", "gsm8k_epochs", "simple_spelling", "spelling_bee"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.max_tokens < 1:
        p.error("--max-tokens must be >= 1")
    if args.workers < 1:
        p.error("--workers must be >= 1")
    if args.retries < 1:
        p.error("--retries must be >= 1")
    return args


def load_chat_tokenizer(path, script):
    """(tiktoken Encoding, the 9 chat special ids) of the tokenizer file at `path` (~ expanded); errors name
    `script`, the caller (sft.py, chat_eval.py)."""
    tok_path = os.path.expanduser(path)
    if not os.path.isfile(tok_path):
        raise SftError(f"{tok_path}: no such tokenizer file")
    try:
        enc, _ = climbmix.read_tokenizer(tok_path)
    except climbmix.PrepError as e:
        raise SftError(f"{e} ({script} needs a tokenizer with nanochat's 9 special tokens: "
                       f"{' '.join(climbmix.SPECIAL_TOKENS)})")
    return enc, chat_special_ids(enc)


def run(args):
    t0 = time.time()
    tok_path = os.path.expanduser(args.tokenizer)
    enc, special = load_chat_tokenizer(tok_path, "sft.py")
    with open(tok_path, "rb") as f:
        tok_sha = hashlib.sha256(f.read()).hexdigest()
    log(f"tokenizer {args.tokenizer}: vocab {enc.n_vocab}, BOS {special[BOS]}")

    keys, make = MIXTURES[args.mixture]
    rows = load_rows(keys, args)  # every split read (and downloaded) before anything is written
    train_tasks, val_tasks = make(rows, args)

    out = os.path.expanduser(args.out)
    os.makedirs(out, exist_ok=True)
    splits = {}
    with Renderer(enc, args.max_tokens, args.workers) as renderer:
        for label, tasks in (("train", train_tasks), ("val", val_tasks)):
            log(f"{label}: rendering {sum(len(t) for t in tasks):,} conversations "
                f"({' + '.join(f'{t.key}[{len(t)}]' for t in tasks)})")
            st = write_split(os.path.join(out, f"sft_{label}.bin"), label, tasks, renderer, enc.n_vocab,
                             special[BOS], args.max_tokens)
            st["tasks"] = task_summary(tasks, st.pop("per_task"))
            splits[label] = st
            log(f"{label}: wrote {os.path.join(out, st['file'])}: {st['conversations']:,} conversations, "
                f"{st['tokens']:,} tokens, {st['trained_tokens']:,} trained ({pct(st['trained_tokens'], st['tokens'])}), "
                f"{st['truncated']:,} cut to {args.max_tokens} tokens, {st['seconds']:.1f}s")
            for e in st["tasks"]:
                log(f"  {e['name']} x{e['copies']}: {e['conversations']:,} conversations, {e['tokens']:,} tokens, "
                    f"{e['trained_tokens']:,} trained ({pct(e['trained_tokens'], e['tokens'])}), "
                    f"{e['truncated']:,} cut")
            del st["seconds"]  # the meta file holds only what the inputs determine

    meta = {
        "format": "xsa-train SFT conversation files, dev/data/README.md",
        "magic": SFT_MAGIC,
        "version": SFT_VERSION,
        "nanochat_commit": NANOCHAT_COMMIT if args.mixture == "head" else STUDY_COMMIT,
        "mixture": args.mixture,
        "mmlu_epochs": args.mmlu_epochs,
        "gsm8k_epochs": args.gsm8k_epochs,
        **({"simple_spelling": args.simple_spelling, "spelling_bee": args.spelling_bee} if args.mixture == "study" else {}),
        "max_tokens": args.max_tokens,
        "tokenizer": args.tokenizer,
        "tokenizer_sha256": tok_sha,
        "vocab_size": enc.n_vocab,
        "bos": special[BOS],
        "source": args.source if args.source is not None else "hub",
        "splits": splits,
    }
    climbmix.write_atomic(os.path.join(out, "sft_meta.json"),
                          (json.dumps(meta, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    log(f"done: {out} (sft_train.bin, sft_val.bin, sft_meta.json) in {time.time() - t0:.1f}s")


def main(argv=None):
    climbmix.run_cli("sft.py", run, parse_args(argv), SftError)


if __name__ == "__main__":
    main()
