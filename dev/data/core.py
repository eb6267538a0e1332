#!/usr/bin/env python3
"""
Tokenize a CORE eval bundle (nanochat's format) into task files for xsa-train (dev/docs/evaluation.md#core).

  python3 dev/data/core.py --bundle DIR --tokenizer tokenizer.bin --out OUT
  python3 dev/data/core.py --bundle-zip [PATH_OR_URL] --tokenizer tokenizer.bin --out OUT

A bundle is a directory with `core.yaml` (the task list, under `icl_tasks`), `eval_meta_data.csv` (random
baselines, columns "Eval Task" and "Random baseline" in percent) and `eval_data/<dataset_uri>` (JSON lines).
For every task, in the order of core.yaml, this does what nanochat's evaluate_core / evaluate_example do
before the model runs: shuffle the items with random.Random(1337), keep the first --max-per-task, draw the
few-shot examples of item idx with random.Random(1234 + idx), render the prompts, encode them with BOS in
front, and find the scored span of every prompt. The result is one binary file per task plus index.txt;
the format is in dev/data/README.md ("CORE task files"). The trainer (and dev/reference/score_core.py) only
run the model on these tokens: scoring needs no tokenizer.

The tokenizer is rebuilt from tokenizer.bin with climbmix.read_tokenizer (mergeable ranks = the byte strings
of the normal tokens with rank = id, nanochat's split pattern, the 9 special tokens), i.e. the same tiktoken
Encoding climbmix.py encodes the token shards with. --verify-shard re-encodes documents of a token shard to
check that on a given tokenizer.

Needs: tiktoken (dev/data/requirements.txt). PyYAML is used for core.yaml when installed; otherwise a small
built-in reader for the subset of YAML that eval bundles use.
"""

import array
import csv
import json
import os
import random
import re
import shutil
import struct
import sys
import time
import urllib.error
import urllib.request
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import climbmix  # noqa: E402  (tokenizer file reader; needs only the standard library at import)
import xsa_cli  # noqa: E402

# -----------------------------------------------------------------------------
# Constants

EVAL_BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "xsa-train")

CORE_MAGIC = 20241202
CORE_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
LABEL_INT = 9            # the label occupies int32 slots 9..40 (128 bytes)
LABEL_BYTES = 128        # at most 127 bytes of UTF-8, NUL-padded

TASK_TYPES = {"multiple_choice": 0, "schema": 1, "language_modeling": 2}

SHUFFLE_SEED = 1337      # random.Random(1337).shuffle(items)
FEWSHOT_SEED = 1234      # random.Random(1234 + idx).sample(other indices, shots)
SEPARATOR = "\n\n"       # between few-shot examples and after the last one


class CoreError(Exception):
    """An error reported to the user as one line, exit code 1."""


log = climbmix.log
# -----------------------------------------------------------------------------
# core.yaml: PyYAML if available, else a reader for the subset eval bundles use (a mapping holding a
# block sequence of flat mappings; scalars plain, "double-quoted", 'single-quoted' or [flow, lists])

_DQ_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
               "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85",
               "_": "\xa0", "L": "\u2028", "P": "\u2029"}
_HEX_LEN = {"x": 2, "u": 4, "U": 8}


def _scan_quoted(s, i):
    """s[i] is a quote; returns (value, index after the closing quote)."""
    q = s[i]
    out = []
    i += 1
    while i < len(s):
        c = s[i]
        if q == "'" and c == "'":
            if s[i + 1:i + 2] == "'":
                out.append("'")
                i += 2
                continue
            return "".join(out), i + 1
        if q == '"' and c == '"':
            return "".join(out), i + 1
        if q == '"' and c == "\\":
            e = s[i + 1:i + 2]
            if e in _HEX_LEN:
                n = _HEX_LEN[e]
                h = s[i + 2:i + 2 + n]
                if len(h) != n or not all(ch in "0123456789abcdefABCDEF" for ch in h):
                    raise ValueError(f"bad escape \\{e}{h}")
                out.append(chr(int(h, 16)))
                i += 2 + n
                continue
            if e not in _DQ_ESCAPES:
                raise ValueError(f"unknown escape \\{e}")
            out.append(_DQ_ESCAPES[e])
            i += 2
            continue
        out.append(c)
        i += 1
    raise ValueError("unterminated quoted string")


def _plain_scalar(s):
    if s in ("", "~", "null", "Null", "NULL"):
        return None
    if s in ("true", "True", "TRUE"):
        return True
    if s in ("false", "False", "FALSE"):
        return False
    if re.fullmatch(r"[-+]?[0-9]+", s):
        return int(s)
    if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", s):
        return float(s)
    return s


def _strip_comment(s):
    """Remove a ' #' comment outside quotes; returns the stripped rest."""
    i = 0
    while i < len(s):
        c = s[i]
        if c in "\"'":
            _, i = _scan_quoted(s, i)
            continue
        if c == "#" and (i == 0 or s[i - 1] in " \t"):
            return s[:i].strip()
        i += 1
    return s.strip()


def _parse_value(s):
    s = _strip_comment(s)
    if not s:
        return None
    if s[0] in "\"'":
        v, j = _scan_quoted(s, 0)
        if s[j:].strip():
            raise ValueError(f"text after a quoted string: {s!r}")
        return v
    if s[0] == "[":
        if not s.endswith("]"):
            raise ValueError(f"unterminated flow sequence: {s!r}")
        body = s[1:-1].strip()
        items, i, cur = [], 0, ""
        while i < len(body):
            c = body[i]
            if c in "\"'" and not cur.strip():
                v, i = _scan_quoted(body, i)
                cur = None
                items.append(v)
                while i < len(body) and body[i] in " \t":
                    i += 1
                if i < len(body):
                    if body[i] != ",":
                        raise ValueError(f"bad flow sequence: {s!r}")
                    i += 1
                cur = ""
                continue
            if c == ",":
                items.append(_plain_scalar(cur.strip()))
                cur = ""
            else:
                cur += c
            i += 1
        if cur.strip():
            items.append(_plain_scalar(cur.strip()))
        return items
    if s[0] in "{|>&*!":
        raise ValueError(f"unsupported YAML construct: {s!r}")
    return _plain_scalar(s)


def _split_key(s):
    """'key: value' -> (key, value text) or None if s is not a mapping entry."""
    m = re.match(r"([A-Za-z0-9_.\- ]+?)\s*:(\s+|$)(.*)$", s)
    if not m:
        return None
    return m.group(1), m.group(3)


def simple_yaml_load(text):
    lines = []
    for raw in text.splitlines():
        if raw.strip() == "" or raw.lstrip().startswith("#"):
            continue
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise ValueError("tab in indentation")
        indent = len(raw) - len(raw.lstrip(" "))
        lines.append((indent, raw.strip()))
    pos = [0]

    def block(indent):
        if pos[0] >= len(lines):
            return None
        ind, s = lines[pos[0]]
        if ind != indent:
            raise ValueError(f"unexpected indentation at {s!r}")
        if s == "-" or s.startswith("- "):
            return sequence(indent)
        return mapping(indent)

    def child(parent_indent, allow_same_indent_seq):
        if pos[0] >= len(lines):
            return None
        ind, s = lines[pos[0]]
        if ind > parent_indent or (allow_same_indent_seq and ind == parent_indent
                                   and (s == "-" or s.startswith("- "))):
            return block(ind)
        return None

    def mapping(indent, first=None):
        out = {}
        while True:
            if first is not None:
                s, first = first, None
            else:
                if pos[0] >= len(lines):
                    break
                ind, s = lines[pos[0]]
                if ind != indent or s == "-" or s.startswith("- "):
                    break
                pos[0] += 1
            kv = _split_key(s)
            if kv is None:
                raise ValueError(f"expected 'key: value', got {s!r}")
            key, rest = kv
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            if _strip_comment(rest) == "":
                out[key] = child(indent, True)
            else:
                out[key] = _parse_value(rest)
        return out

    def sequence(indent):
        out = []
        while pos[0] < len(lines):
            ind, s = lines[pos[0]]
            if ind != indent or not (s == "-" or s.startswith("- ")):
                break
            pos[0] += 1
            rest = s[1:].strip()
            if rest == "":
                out.append(child(indent, False))
            elif _split_key(rest) is not None and rest[0] not in "\"'[":
                # "- key: value" starts a mapping whose keys sit at the column of "key"
                col = indent + (len(s) - len(s[1:].lstrip()))
                out.append(mapping(col, first=rest))
            else:
                out.append(_parse_value(rest))
        return out

    result = block(lines[0][0]) if lines else None
    if pos[0] != len(lines):
        raise ValueError(f"could not parse line {lines[pos[0]][1]!r}")
    return result


def load_core_yaml(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise CoreError(f"{path}: cannot read ({e.strerror})")
    try:
        import yaml
    except ImportError:
        yaml = None
    try:
        cfg = yaml.safe_load(text) if yaml is not None else simple_yaml_load(text)
    except Exception as e:  # yaml.YAMLError, ValueError from the built-in reader
        raise CoreError(f"{path}: cannot parse YAML ({' '.join(str(e).split())})")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("icl_tasks"), list):
        raise CoreError(f"{path}: no 'icl_tasks' list")
    tasks = []
    for k, t in enumerate(cfg["icl_tasks"]):
        if not isinstance(t, dict):
            raise CoreError(f"{path}: icl_tasks[{k}] is not a mapping")
        for key in ("label", "icl_task_type", "dataset_uri", "num_fewshot"):
            if key not in t:
                raise CoreError(f"{path}: icl_tasks[{k}] has no '{key}'")
        label = t["label"]
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", label):
            raise CoreError(f"{path}: icl_tasks[{k}]: label {label!r} is not a plain name ([A-Za-z0-9_.-])")
        if len(label.encode("utf-8")) > LABEL_BYTES - 1:
            raise CoreError(f"{path}: label {label!r} is longer than {LABEL_BYTES - 1} bytes")
        ttype = t["icl_task_type"]
        if ttype not in TASK_TYPES:
            raise CoreError(f"{path}: task {label}: unknown icl_task_type {ttype!r} "
                            f"(expected one of {', '.join(TASK_TYPES)})")
        shots = t["num_fewshot"]
        if not isinstance(shots, list) or not shots or not isinstance(shots[0], int) or shots[0] < 0:
            raise CoreError(f"{path}: task {label}: num_fewshot must be a list starting with an int >= 0")
        delim = t.get("continuation_delimiter", " ")
        if not isinstance(delim, str):
            raise CoreError(f"{path}: task {label}: continuation_delimiter must be a string")
        if not isinstance(t["dataset_uri"], str):
            raise CoreError(f"{path}: task {label}: dataset_uri must be a string")
        tasks.append(dict(order=k + 1, label=label, type=ttype, dataset_uri=t["dataset_uri"],
                          shots=shots[0], delimiter=delim))
    labels = [t["label"] for t in tasks]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise CoreError(f"{path}: duplicate task labels: {', '.join(dup)}")
    return tasks


def load_random_baselines(path):
    """{Eval Task: Random baseline (percent, as text)}, as nanochat reads eval_meta_data.csv; converted to float
    in run() only for the tasks used (nanochat converts every row)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            for c in ("Eval Task", "Random baseline"):
                if c not in cols:
                    raise CoreError(f"{path}: no '{c}' column (columns: {', '.join(cols) or 'none'})")
            return {row["Eval Task"]: row["Random baseline"] for row in reader}
    except OSError as e:
        raise CoreError(f"{path}: cannot read ({e.strerror})")


def load_items(path, label):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise CoreError(f"task {label}: cannot read {path} ({e.strerror})")
    except UnicodeDecodeError:
        raise CoreError(f"task {label}: {path} is not UTF-8")
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line.strip()))
        except json.JSONDecodeError as e:
            raise CoreError(f"task {label}: {path} line {n}: bad JSON ({e.msg})")
    if not items:
        raise CoreError(f"task {label}: {path} has no items")
    return items


# -----------------------------------------------------------------------------
# Rendering (nanochat's Jinja2 templates, written out as string concatenation; values that are not
# strings are converted with str(), as Jinja does)

def _s(v):
    return v if isinstance(v, str) else str(v)


def _need(item, fields, where):
    for name, kind in fields:
        if name not in item:
            raise CoreError(f"{where}: no '{name}' field")
        v = item[name]
        if kind == "list" and (not isinstance(v, list) or not v):
            raise CoreError(f"{where}: '{name}' must be a non-empty list")
        if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
            raise CoreError(f"{where}: '{name}' must be an integer")


def _gold_of(item, key, where):
    g = item["gold"]
    if not 0 <= g < len(item[key]):
        raise CoreError(f"{where}: gold {g} out of range for {len(item[key])} {key}")
    return g


def render_mc(item, delim, shots):
    """prefix = sum over examples of query + d + choices[gold] + '\\n\\n'; one prompt per choice."""
    prefix = "".join(_s(e["query"]) + delim + _s(e["choices"][e["gold"]]) + SEPARATOR for e in shots)
    return [prefix + _s(item["query"]) + delim + _s(c) for c in item["choices"]]


def render_schema(item, delim, shots):
    """prefix = sum over examples of context_options[gold] + d + continuation + '\\n\\n';
    one prompt per context option: prefix + option + d + continuation."""
    prefix = "".join(_s(e["context_options"][e["gold"]]) + delim + _s(e["continuation"]) + SEPARATOR
                     for e in shots)
    return [prefix + _s(o) + delim + _s(item["continuation"]) for o in item["context_options"]]


def render_lm(item, delim, shots):
    """Returns [without, with]: the contexts are trimmed; 'without' is stripped as a whole."""
    prefix = "".join(_s(e["context"]).strip() + delim + _s(e["continuation"]) + SEPARATOR for e in shots)
    base = prefix + _s(item["context"]).strip() + delim
    return [base.strip(), base + _s(item["continuation"])]


# -----------------------------------------------------------------------------
# Spans

def empty_span(start, end):
    """Whether nanochat's slice losses[start-1:end-1] of this span is empty, so that the option's mean loss is NaN:
    start == end (a multiple-choice choice that is a token prefix of every other choice, or choices all identical;
    a schema item without a common token suffix), or start == 0 (a schema item whose prompts are all identical:
    the whole prompt is the common suffix, and -1 is the last column). Such spans are written as they are; the
    trainer scores them as nanochat does (dev/docs/evaluation.md#scoring)."""
    return start == end or start == 0


def common_prefix_len(seqs):
    n = min(len(s) for s in seqs)
    for i in range(n):
        t = seqs[0][i]
        if any(s[i] != t for s in seqs):
            return i
    return n


def common_suffix_len(seqs):
    n = min(len(s) for s in seqs)
    for i in range(1, n + 1):
        t = seqs[0][-i]
        if any(s[-i] != t for s in seqs):
            return i - 1
    return n


class TaskEncoder:
    def __init__(self, enc):
        self.enc = enc
        self.bos = climbmix.bos_id(enc)

    def tokens(self, text):
        return [self.bos] + self.enc.encode_ordinary(text)

    def item(self, task, items, idx):
        """(prompt strings, [(tokens, start, end)], gold) of item idx of the (shuffled, truncated) list."""
        item = items[idx]
        ttype, k = task["type"], task["shots"]
        where = f"task {task['label']}: item {idx} (after shuffling)"
        if not isinstance(item, dict):
            raise CoreError(f"{where}: not a JSON object")
        shots = []
        if k > 0:
            rng = random.Random(FEWSHOT_SEED + idx)
            shots = [items[i] for i in rng.sample([i for i in range(len(items)) if i != idx], k)]
        if ttype == "multiple_choice":
            for j, e in enumerate([item] + shots):
                _need(e, [("query", "str"), ("choices", "list"), ("gold", "int")],
                      where if j == 0 else f"{where}: few-shot example")
                _gold_of(e, "choices", where if j == 0 else f"{where}: few-shot example")
            prompts = render_mc(item, task["delimiter"], shots)
            toks = [self.tokens(p) for p in prompts]
            start = common_prefix_len(toks)
            spans = [(t, start, len(t)) for t in toks]
            gold = item["gold"]
        elif ttype == "schema":
            for j, e in enumerate([item] + shots):
                _need(e, [("context_options", "list"), ("continuation", "str"), ("gold", "int")],
                      where if j == 0 else f"{where}: few-shot example")
                _gold_of(e, "context_options", where if j == 0 else f"{where}: few-shot example")
            prompts = render_schema(item, task["delimiter"], shots)
            toks = [self.tokens(p) for p in prompts]
            s = common_suffix_len(toks)
            spans = [(t, len(t) - s, len(t)) for t in toks]
            gold = item["gold"]
        else:  # language_modeling
            for j, e in enumerate([item] + shots):
                _need(e, [("context", "str"), ("continuation", "str")],
                      where if j == 0 else f"{where}: few-shot example")
            prompts = render_lm(item, task["delimiter"], shots)
            without, with_ = (self.tokens(p) for p in prompts)
            start, end = len(without), len(with_)
            if not (start < end and with_[:start] == without):
                raise CoreError(f"{where}: the prompt without the continuation ({start} tokens) is not a "
                                f"token prefix of the prompt with it ({end} tokens); context "
                                f"{_s(item['context'])[-40:]!r}, continuation {_s(item['continuation'])[:40]!r}")
            spans = [(with_, start, end)]
            gold = 0
        return prompts, spans, gold


# -----------------------------------------------------------------------------
# Task files

def header_bytes(ttype, n_items, shots, vocab, bos, max_per_task, rb, label):
    h = bytearray(HEADER_BYTES)
    struct.pack_into("<8i", h, 0, CORE_MAGIC, CORE_VERSION, TASK_TYPES[ttype], n_items, shots, vocab, bos,
                     max_per_task)
    struct.pack_into("<f", h, 32, rb)
    lb = label.encode("utf-8")
    assert len(lb) < LABEL_BYTES
    h[4 * LABEL_INT:4 * LABEL_INT + len(lb)] = lb
    return bytes(h)


def item_bytes(spans, gold):
    out = [struct.pack("<II", len(spans), gold)]
    for toks, s, e in spans:
        a = array.array("I", toks)
        if a.itemsize != 4:
            raise RuntimeError("unexpected C type sizes")
        if sys.byteorder != "little":
            a.byteswap()
        out.append(struct.pack("<III", len(toks), s, e))
        out.append(a.tobytes())
    return b"".join(out)


write_atomic = climbmix.write_atomic
def task_file_name(task):
    return f"{task['order']:02d}_{task['label']}.bin"


def task_items(task, bundle, max_per_task):
    """The task's items as nanochat evaluates them: shuffled with random.Random(1337), then truncated."""
    path = os.path.join(bundle, "eval_data", task["dataset_uri"])
    items = load_items(path, task["label"])
    random.Random(SHUFFLE_SEED).shuffle(items)
    if max_per_task > 0:
        items = items[:max_per_task]
    n = len(items)
    if task["shots"] > n - 1:
        raise CoreError(f"task {task['label']}: {task['shots']}-shot needs at least {task['shots'] + 1} items, "
                        f"have {n}" + (" (raise --max-per-task)" if max_per_task > 0 else ""))
    return items


def prepare_task(task, items, te, max_per_task, rb):
    """Returns (file bytes, stats dict, first item (prompts, spans, gold))."""
    n = len(items)
    vocab = te.enc.n_vocab
    parts = [header_bytes(task["type"], n, task["shots"], vocab, te.bos, max_per_task, rb, task["label"])]
    first = None
    ntok = []
    empty_items = 0
    for idx in range(n):
        prompts, spans, gold = te.item(task, items, idx)
        if idx == 0:
            first = (prompts, spans, gold)
        ntok.extend(len(toks) for toks, _, _ in spans)
        empty_items += any(empty_span(s, e) for _, s, e in spans)
        parts.append(item_bytes(spans, gold))
    stats = dict(n_items=n, n_prompts=len(ntok), max_tokens=max(ntok), mean_tokens=sum(ntok) / len(ntok),
                 empty_items=empty_items)
    return b"".join(parts), stats, first


# -----------------------------------------------------------------------------
# Bundle download / unzip

def download(url, dest, retries=5, timeout=60):
    """Download url to dest (via dest.tmp) with progress lines; checks the size against Content-Length."""
    tmp = dest + ".tmp"
    last = None
    for attempt in range(retries):
        if attempt:
            delay = min(60, 2 ** attempt)
            log(f"download failed ({last}); retry {attempt}/{retries - 1} in {delay}s")
            time.sleep(delay)
        try:
            req = urllib.request.Request(url, headers={"User-Agent": "xsa-train-core/1.0"})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                total = resp.headers.get("Content-Length")
                total = int(total) if total and total.isdigit() else None
                got, t0, tlast = 0, time.time(), 0.0
                with open(tmp, "wb") as f:
                    while True:
                        b = resp.read(1 << 20)
                        if not b:
                            break
                        f.write(b)
                        got += len(b)
                        now = time.time()
                        if now - tlast >= 2.0:
                            tlast = now
                            of = f" / {total / 1e6:,.1f}" if total else ""
                            log(f"{os.path.basename(dest)}: {got / 1e6:,.1f}{of} MB, "
                                f"{got / 1e6 / max(1e-9, now - t0):.2f} MB/s")
            if total is not None and got != total:
                raise IOError(f"got {got} bytes, Content-Length {total}")
            if not zipfile.is_zipfile(tmp):
                raise IOError("not a zip file")
            os.replace(tmp, dest)
            log(f"{os.path.basename(dest)}: {got:,} bytes")
            return
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
            if 400 <= e.code < 500 and e.code not in (408, 429):
                break
        except (urllib.error.URLError, OSError, IOError) as e:
            last = str(getattr(e, "reason", e))
    raise CoreError(f"cannot download {url}: {last}")


def bundle_from_zip(src, cache_dir):
    """Download (if src is a URL) and unzip into cache_dir; returns the directory holding core.yaml."""
    cache_dir = os.path.expanduser(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    if re.match(r"(?i)^(https?|ftp)://", src):
        name = os.path.basename(src.split("?", 1)[0]) or "eval_bundle.zip"
        zpath = os.path.join(cache_dir, name)
        if os.path.exists(zpath) and zipfile.is_zipfile(zpath):
            log(f"using the downloaded {zpath}")
        else:
            log(f"downloading {src} to {zpath}")
            download(src, zpath)
    else:
        zpath = os.path.expanduser(src)
        if not os.path.isfile(zpath):
            raise CoreError(f"{zpath}: no such file")
    if not zipfile.is_zipfile(zpath):
        raise CoreError(f"{zpath}: not a zip file")
    digest = climbmix.sha256_file(zpath)
    stem = os.path.splitext(os.path.basename(zpath))[0]
    out = os.path.join(cache_dir, stem)
    stamp = os.path.join(out, ".xsa_zip_sha256")
    if not (os.path.exists(stamp) and open(stamp).read().strip() == digest):
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with zipfile.ZipFile(zpath) as z:
                bad = z.testzip()
                if bad is not None:
                    raise CoreError(f"{zpath}: corrupt member {bad}")
                z.extractall(tmp)
        except zipfile.BadZipFile as e:
            raise CoreError(f"{zpath}: bad zip file ({e})")
        with open(os.path.join(tmp, ".xsa_zip_sha256"), "w") as f:
            f.write(digest + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        log(f"unzipped {zpath} to {out}")
    if os.path.exists(os.path.join(out, "core.yaml")):
        return out
    subs = [d for d in sorted(os.listdir(out)) if os.path.exists(os.path.join(out, d, "core.yaml"))]
    if len(subs) != 1:
        raise CoreError(f"{zpath}: no core.yaml at the top of the zip or in exactly one top-level folder")
    return os.path.join(out, subs[0])


# -----------------------------------------------------------------------------
# Tokenizer self-check on a token shard

def verify_shard(enc, path, max_docs):
    """Decode documents of a token shard written by climbmix.py and re-encode them; must be identical."""
    hdr = climbmix.read_shard_header(path)
    if hdr is None:
        raise CoreError(f"{path}: not a complete token shard")
    version, ntokens = hdr
    a = array.array("H" if version == climbmix.SHARD_VERSION_U16 else "I")
    with open(path, "rb") as f:
        f.seek(climbmix.HEADER_BYTES)
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    bos = climbmix.bos_id(enc)
    starts = [i for i, t in enumerate(a) if t == bos]
    if not starts or starts[0] != 0:
        raise CoreError(f"{path}: does not start with BOS {bos} (another tokenizer?)")
    starts.append(len(a))
    ndocs = min(max_docs, len(starts) - 1) if max_docs > 0 else len(starts) - 1
    for d in range(ndocs):
        doc = list(a[starts[d] + 1:starts[d + 1]])
        try:
            text = enc.decode_bytes(doc).decode("utf-8")
        except (UnicodeDecodeError, KeyError, ValueError):
            raise CoreError(f"{path}: document {d} does not decode to UTF-8 with this tokenizer")
        if enc.encode_ordinary(text) != doc:
            raise CoreError(f"{path}: document {d} re-encodes differently: this tokenizer does not reproduce "
                            "the shard's encoder")
    log(f"verified {path}: {ndocs} documents re-encode to the same tokens")


# -----------------------------------------------------------------------------
# Main

def parse_args(argv=None):
    p = xsa_cli.ArgumentParser(description="Tokenize a CORE eval bundle into xsa-train task files "
                               "(format: dev/data/README.md, 'CORE task files').")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--bundle", help="bundle directory (core.yaml, eval_meta_data.csv, eval_data/)")
    src.add_argument("--bundle-zip", nargs="?", const=EVAL_BUNDLE_URL, metavar="PATH_OR_URL",
                     help=f"bundle zip, a file or a URL, unzipped into --cache-dir (no value: {EVAL_BUNDLE_URL})")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR,
                   help="where --bundle-zip is downloaded and unzipped (default %(default)s)")
    p.add_argument("--tokenizer", required=True, help="tokenizer.bin of the model to evaluate")
    p.add_argument("--out", required=True, help="output directory for NN_<label>.bin and index.txt")
    p.add_argument("--max-per-task", type=int, default=-1,
                   help="keep the first N items of each shuffled task (default -1 = all; nanochat uses 500 "
                        "during training)")
    p.add_argument("--tasks", default=None, help="comma-separated labels: only these tasks (default: all)")
    p.add_argument("--verify-shard", default=None, metavar="FILE",
                   help="first check the tokenizer: re-encode documents of this token shard (written with "
                        "the same tokenizer.bin) and require identical tokens")
    p.add_argument("--verify-docs", type=int, default=2000,
                   help="documents checked by --verify-shard (default %(default)s, <= 0 = all)")
    p.add_argument("--show-first", action="store_true",
                   help="print the prompts, tokens and spans of the first item of every task")
    return p.parse_args(argv)


def show_item(enc, label, first):
    prompts, spans, gold = first
    log(f"--- {label}: first item, gold {gold}")
    for k, p in enumerate(prompts):
        log(f"prompt {k}: {json.dumps(p, ensure_ascii=False)}")
    for k, (toks, s, e) in enumerate(spans):
        log(f"sequence {k} ({len(toks)} tokens): {toks}")
        log(f"  span [{s}, {e}): {json.dumps(enc.decode_bytes(toks[s:e]).decode('utf-8', 'replace'), ensure_ascii=False)}")


def run(args):
    t0 = time.time()
    tok_path = os.path.expanduser(args.tokenizer)
    if not os.path.isfile(tok_path):
        raise CoreError(f"{tok_path}: no such tokenizer file")
    try:
        enc, _ = climbmix.read_tokenizer(tok_path)
    except climbmix.PrepError as e:
        raise CoreError(str(e))
    te = TaskEncoder(enc)
    if args.verify_shard:
        verify_shard(enc, os.path.expanduser(args.verify_shard), args.verify_docs)

    bundle = (os.path.expanduser(args.bundle) if args.bundle is not None
              else bundle_from_zip(args.bundle_zip, args.cache_dir))
    if not os.path.isdir(bundle):
        raise CoreError(f"{bundle}: no such bundle directory")
    for f in ("core.yaml", "eval_meta_data.csv", "eval_data"):
        if not os.path.exists(os.path.join(bundle, f)):
            raise CoreError(f"{bundle}: missing {f} (not an eval bundle)")
    tasks = load_core_yaml(os.path.join(bundle, "core.yaml"))
    baselines = load_random_baselines(os.path.join(bundle, "eval_meta_data.csv"))
    if args.tasks:
        want = [x.strip() for x in args.tasks.split(",") if x.strip()]
        unknown = [x for x in want if x not in {t["label"] for t in tasks}]
        if unknown:
            raise CoreError(f"--tasks: unknown labels {', '.join(unknown)} "
                            f"(core.yaml has {', '.join(t['label'] for t in tasks)})")
        tasks = [t for t in tasks if t["label"] in want]
    max_per_task = args.max_per_task if args.max_per_task > 0 else -1
    for t in tasks:
        if t["label"] not in baselines:
            raise CoreError(f"task {t['label']}: no row with 'Eval Task' = {t['label']} in eval_meta_data.csv")
        try:
            t["random_baseline"] = float(baselines[t["label"]])
        except (TypeError, ValueError):
            raise CoreError(f"eval_meta_data.csv: task {t['label']}: random baseline "
                            f"{baselines[t['label']]!r} is not a number")
        if not os.path.isfile(os.path.join(bundle, "eval_data", t["dataset_uri"])):
            raise CoreError(f"task {t['label']}: missing eval_data/{t['dataset_uri']}")
    # read every task before writing anything, so that most input errors leave --out untouched
    all_items = [task_items(t, bundle, max_per_task) for t in tasks]

    out = os.path.expanduser(args.out)
    os.makedirs(out, exist_ok=True)
    index = []
    log(f"tokenizer {tok_path}: vocab {enc.n_vocab}, BOS {te.bos}; bundle {bundle}: {len(tasks)} tasks; "
        f"max per task {max_per_task}")
    for t, items in zip(tasks, all_items):
        rb = t["random_baseline"]
        data, st, first = prepare_task(t, items, te, max_per_task, rb)
        name = task_file_name(t)
        write_atomic(os.path.join(out, name), data)
        index.append(f"{name} {t['label']} {t['type']} {st['n_items']} {t['shots']} {rb:g}\n")
        log(f"{name}: {t['type']}, {t['shots']}-shot, delimiter {json.dumps(t['delimiter'])}, {st['n_items']} items, "
            f"{st['n_prompts']} prompts, tokens mean {st['mean_tokens']:.1f} max {st['max_tokens']}, "
            f"random baseline {rb:g}%, {len(data):,} bytes")
        k = st["empty_items"]
        if k:
            log(f"{t['label']}: {k} item{' has' if k == 1 else 's have'} an option with an empty answer span "
                "(scored as nanochat: NaN loss)")
        if args.show_first:
            show_item(enc, t["label"], first)
    write_atomic(os.path.join(out, "index.txt"), "".join(index).encode("utf-8"))
    log(f"wrote {len(tasks)} task files and index.txt to {out} in {time.time() - t0:.1f}s")


def main(argv=None):
    climbmix.run_cli("core.py", run, parse_args(argv), CoreError)


if __name__ == "__main__":
    main()
