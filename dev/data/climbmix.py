#!/usr/bin/env python3
"""
Prepare ClimbMix-400B for xsa-train, the way nanochat does (dev/docs/data.md#where-the-data-comes-from).

  1. Download parquet shards of karpathy/climbmix-400b-shuffle: train shards 0..N-1 and the
     validation shard 6542 (or, offline, use the parquet files already in --parquet-dir).
  2. Train the tokenizer exactly as nanochat's scripts/tok_train.py does: rustbpe, GPT-4 style split
     pattern with 1-2 digit numbers, vocab = mergeable tokens + 9 special tokens, trained on the first
     ~2B characters of the train files (documents cropped to 10,000 characters).
  3. Write tokenizer.bin and one token shard per parquet file (train_NNNNNN.bin, val_000000.bin):
     every document encoded with encode_ordinary and a BOS token prepended; and beside each shard its
     row groups (train_NNNNNN.bin.rowgroups), which the loader's ranks stride over as nanochat's do.

`--upgrade-tokenizer PATH` only rewrites a tokenizer file of version 1 (no split pattern) as version 2, in
place, token ids unchanged (the C++ encoder needs the pattern).

File formats: see dev/data/README.md. Needs: python3 -m pip install -r dev/data/requirements.txt

The functions here take iterators of documents so other corpora can reuse them
(dev/data/make_devil.py does).
"""

import array
import collections
import http.client
import os
import struct
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import xsa_cli  # noqa: E402

# -----------------------------------------------------------------------------
# Constants (nanochat's; dev/docs/data.md#where-the-data-comes-from, dev/data/README.md)

BASE_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
MAX_SHARD = 6542  # shard_06542 is the validation shard
VAL_SHARD = MAX_SHARD

# nanochat's split pattern: GPT-4's with \p{N}{1,2} instead of \p{N}{1,3}
SPLIT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""

# appended after the mergeable ranks, in this order (the first is BOS)
SPECIAL_TOKENS = [
    "<|bos|>",
    "<|user_start|>",
    "<|user_end|>",
    "<|assistant_start|>",
    "<|assistant_end|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|output_start|>",
    "<|output_end|>",
]
BOS = "<|bos|>"
MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + 1  # the 256 bytes, the specials and at least one merge

DOC_CAP = 10_000                 # tokenizer training crops each document to this many characters
TOKENIZER_CHARS = 2_000_000_000  # and stops once more than this many characters have been seen

# nanochat's sampling prompts (scripts/base_train.py)
DEFAULT_PROMPTS = [
    "The capital of France is",
    "The chemical symbol of gold is",
    "If yesterday was Friday, then tomorrow will be",
    "The opposite of hot is",
    "The planets of the solar system are:",
    "My favorite color is",
    "If 5*x + 3 = 13, then x is",
]

SHARD_MAGIC = 20240520
SHARD_VERSION_U16 = 1
SHARD_VERSION_U32 = 2
TOKENIZER_MAGIC = 20241201
TOKENIZER_VERSION = 2  # 2 stores the split pattern after the header; 1 (read too) did not: it was SPLIT_PATTERN
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4

DEFAULT_DATA_DIR = os.path.join("~", ".cache", "xsa-train", "climbmix", "parquet")
DEFAULT_OUT_DIR = os.path.join("~", ".cache", "xsa-train", "climbmix")


class PrepError(Exception):
    """An error reported to the user as one line, exit code 1."""


def log(msg):
    print(msg, flush=True)


# -----------------------------------------------------------------------------
# Download (resumable, size-checked, retried, parallel)

def shard_name(index):
    return f"shard_{index:05d}.parquet"


def _is_complete_parquet(path):
    """Cheap check: a parquet file starts and ends with the magic b'PAR1'."""
    try:
        size = os.path.getsize(path)
        if size < 12:
            return False
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(size - 4)
            tail = f.read(4)
        return head == b"PAR1" and tail == b"PAR1"
    except OSError:
        return False


class _Progress:
    """Shared download counters; a reporter thread prints a line every few seconds."""

    def __init__(self, nfiles):
        self.lock = threading.Lock()
        self.nfiles = nfiles
        self.files_done = 0
        self.totals = {}         # name -> expected size in bytes (once known)
        self.have = {}           # name -> bytes on disk (final or .tmp)
        self.session_bytes = 0   # bytes received by this process
        self.t0 = time.time()

    def line(self):
        with self.lock:
            done = sum(self.have.values())
            known = list(self.totals.values())
            unknown = self.nfiles - len(known)
            est = (sum(known) / len(known)) if known else 100e6  # ClimbMix shards are ~100 MB
            total = sum(known) + unknown * est
            rate = self.session_bytes / max(1e-9, time.time() - self.t0)
            approx = "~" if unknown else ""
            return (f"download: {self.files_done}/{self.nfiles} files, "
                    f"{done / 1e6:,.1f} / {approx}{total / 1e6:,.1f} MB, {rate / 1e6:.2f} MB/s")


def _content_range_total(value):
    # "bytes 100-199/12345" or "bytes */12345"
    if not value or "/" not in value:
        return None
    tail = value.rsplit("/", 1)[1].strip()
    return int(tail) if tail.isdigit() else None


def download_file(url, dest, progress=None, retries=10, timeout=60, chunk=1 << 20, parquet=True):
    """Download url to dest. Resumes a partial dest + '.tmp' with an HTTP Range request; checks the size
    against Content-Length / Content-Range and (parquet=True) the parquet magic; renames into place only when
    complete. A dest that already exists is taken as complete (it only appears through that rename)."""
    def complete(path):
        return not parquet or _is_complete_parquet(path)

    name = os.path.basename(dest)
    tmp = dest + ".tmp"
    if os.path.exists(dest):
        if complete(dest):
            if progress:
                with progress.lock:
                    size = os.path.getsize(dest)
                    progress.totals[name] = size
                    progress.have[name] = size
                    progress.files_done += 1
            return "skipped"
        log(f"{dest}: not a complete parquet file, downloading it again")
        os.replace(dest, tmp)  # keep what is there; the size check below decides
    last_err = None
    for attempt in range(retries):
        if attempt:
            delay = min(60, 2 ** attempt)
            log(f"{name}: attempt {attempt}/{retries - 1} failed ({last_err}); retrying in {delay}s")
            time.sleep(delay)
        try:
            have = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            headers = {"User-Agent": "xsa-train-climbmix/1.0"}
            if have:
                headers["Range"] = f"bytes={have}-"
            req = urllib.request.Request(url, headers=headers)
            try:
                resp = urllib.request.urlopen(req, timeout=timeout)
            except urllib.error.HTTPError as e:
                if e.code == 416 and have:
                    # Range not satisfiable: the .tmp is already complete, or longer than the file
                    total = _content_range_total(e.headers.get("Content-Range"))
                    e.close()
                    if total == have and complete(tmp):
                        os.replace(tmp, dest)
                        if progress:
                            with progress.lock:
                                progress.totals[name] = total
                                progress.have[name] = total
                                progress.files_done += 1
                        return "downloaded"
                    os.remove(tmp)
                    raise IOError(f"HTTP 416 with {have} bytes on disk; restarting from 0")
                if 400 <= e.code < 500 and e.code not in (408, 429):
                    e.close()  # not found, forbidden, ...: retrying will not help
                    raise PrepError(f"{url}: HTTP {e.code} {e.reason}")
                raise
            with resp:
                status = resp.status
                length = resp.headers.get("Content-Length")
                length = int(length) if length and length.isdigit() else None
                if have and status == 206:
                    total = _content_range_total(resp.headers.get("Content-Range"))
                    if total is None and length is not None:
                        total = have + length
                    mode = "ab"
                elif status == 200:
                    if have:
                        log(f"{name}: server ignored the Range request; restarting from 0")
                    have = 0
                    total = length
                    mode = "wb"
                else:
                    raise IOError(f"unexpected HTTP status {status}")
                if progress:
                    with progress.lock:
                        if total is not None:
                            progress.totals[name] = total
                        progress.have[name] = have
                with open(tmp, mode) as f:
                    while True:
                        buf = resp.read(chunk)
                        if not buf:
                            break
                        f.write(buf)
                        have += len(buf)
                        if progress:
                            with progress.lock:
                                progress.have[name] = have
                                progress.session_bytes += len(buf)
            size = os.path.getsize(tmp)
            if total is not None and size != total:
                if size > total:
                    os.remove(tmp)
                raise IOError(f"size mismatch: {size} bytes on disk, {total} expected")
            if not complete(tmp):
                os.remove(tmp)
                raise IOError("downloaded file is not a parquet file (no PAR1 magic)")
            os.replace(tmp, dest)
            if progress:
                with progress.lock:
                    progress.files_done += 1
            return "downloaded"
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            # HTTP 5xx/408/429, timeouts, connection resets, truncated bodies
            last_err = f"{type(e).__name__}: {e}"
    raise PrepError(f"{url}: download failed after {retries} attempts ({last_err})")


def download_shards(indices, data_dir, workers, base_url=BASE_URL, retries=10, report_every=5.0):
    """Download the given shard indices into data_dir in parallel. Returns the local paths in the order
    of `indices`."""
    from concurrent.futures import ThreadPoolExecutor
    os.makedirs(data_dir, exist_ok=True)
    jobs = [(f"{base_url}/{shard_name(i)}", os.path.join(data_dir, shard_name(i))) for i in indices]
    progress = _Progress(len(jobs))
    stop = threading.Event()

    def reporter():
        while not stop.wait(report_every):
            log(progress.line())

    log(f"downloading {len(jobs)} shards into {data_dir} with {workers} parallel downloads")
    th = threading.Thread(target=reporter, daemon=True)
    th.start()
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
            futures = [ex.submit(download_file, url, dest, progress, retries) for url, dest in jobs]
            results, errors = [], []
            for f in futures:  # let the other downloads finish even if one fails
                try:
                    results.append(f.result())
                except PrepError as e:
                    errors.append(str(e))
    finally:
        stop.set()
        th.join()
    log(progress.line())
    if errors:
        more = f" (and {len(errors) - 1} more failed)" if len(errors) > 1 else ""
        raise PrepError(errors[0] + more)
    log(f"download: {results.count('downloaded')} downloaded, {results.count('skipped')} already present")
    return [dest for _, dest in jobs]


# -----------------------------------------------------------------------------
# Parquet documents

def list_parquet_split(parquet_dir):
    """nanochat's split rule: *.parquet files sorted by name; the last is validation, the rest train."""
    if not os.path.isdir(parquet_dir):
        raise PrepError(f"{parquet_dir}: no such directory")
    files = sorted(f for f in os.listdir(parquet_dir) if f.endswith(".parquet") and not f.endswith(".tmp"))
    if not files:
        raise PrepError(f"{parquet_dir}: no parquet files (*.parquet)")
    if len(files) < 2:
        raise PrepError(f"{parquet_dir}: only one parquet file ({files[0]}); need at least 2 "
                        "(train files + the last one as validation)")
    paths = [os.path.join(parquet_dir, f) for f in files]
    return paths[:-1], paths[-1]


def check_parquet(path):
    """Raise PrepError unless path is a readable parquet file with a string column `text`."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        schema = pq.ParquetFile(path).schema_arrow
    except Exception as e:  # pyarrow raises several types for a corrupt or non-parquet file
        raise PrepError(f"{path}: cannot read parquet file ({e})")
    if "text" not in schema.names:
        raise PrepError(f"{path}: no 'text' column (columns: {', '.join(schema.names) or 'none'})")
    t = schema.field("text").type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise PrepError(f"{path}: column 'text' has type {t}, expected string")


def iter_parquet_docs(paths):
    """Documents of the `text` column: files in order, row groups in order, rows in order."""
    import pyarrow.parquet as pq
    for path in paths:
        pf = pq.ParquetFile(path)
        for rg in range(pf.num_row_groups):
            texts = pf.read_row_group(rg, columns=["text"]).column("text").to_pylist()
            for i, t in enumerate(texts):
                if t is None:
                    raise PrepError(f"{path}: row group {rg}, row {i}: 'text' is null")
                yield t


# -----------------------------------------------------------------------------
# Tokenizer

def tokenizer_training_texts(docs, max_chars=TOKENIZER_CHARS, doc_cap=DOC_CAP):
    """nanochat's tok_train text iterator: crop each document to doc_cap characters, stop once more
    than max_chars characters have been seen (the document that crosses the limit is included)."""
    nchars = 0
    for doc in docs:
        text = doc[:doc_cap]
        nchars += len(text)
        yield text
        if nchars > max_chars:
            return


def make_encoding(mergeable_ranks, pattern=SPLIT_PATTERN):
    """tiktoken Encoding from mergeable ranks (bytes -> id, ids 0..n-1) with the 9 specials appended."""
    import tiktoken
    n = len(mergeable_ranks)
    if sorted(mergeable_ranks.values()) != list(range(n)):
        raise PrepError("mergeable ranks are not the contiguous ids 0..n-1")
    special = {name: n + i for i, name in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name="rustbpe", pat_str=pattern, mergeable_ranks=mergeable_ranks,
                             special_tokens=special)


def train_tokenizer(texts, vocab_size):
    """Train with rustbpe as nanochat does and return the tiktoken Encoding (vocab_size in total,
    the last 9 ids being the special tokens). `texts` is an iterator of (already cropped) strings."""
    import rustbpe
    if vocab_size < MIN_VOCAB:
        raise PrepError(f"vocab size {vocab_size} is too small: need at least {MIN_VOCAB} "
                        f"(256 bytes + {len(SPECIAL_TOKENS)} special tokens + 1 merge)")
    nspecial = len(SPECIAL_TOKENS)
    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(texts, vocab_size - nspecial, pattern=SPLIT_PATTERN)
    ranks = {bytes(k): v for k, v in tok.get_mergeable_ranks()}
    if len(ranks) != vocab_size - nspecial:
        log(f"warning: the training text only gave {len(ranks) - 256} merges; "
            f"vocab size is {len(ranks) + nspecial}, not {vocab_size}")
    return make_encoding(ranks, tok.get_pattern())


def special_ids(enc):
    return {enc.encode_single_token(name): name for name in SPECIAL_TOKENS}


def bos_id(enc):
    return enc.encode_single_token(BOS)


def prompt_tokens(enc, prompts):
    bos = bos_id(enc)
    return [[bos] + enc.encode_ordinary(p) for p in prompts]


def tokenizer_bytes(enc, prompts):
    """The tokenizer file as bytes (format in dev/data/README.md), with the sample prompts encoded."""
    return tokenizer_file_bytes(enc, prompt_tokens(enc, prompts))


def tokenizer_file_bytes(enc, toks):
    """The tokenizer file of `enc` (its ranks, specials and split pattern) with sample prompts given as
    token id lists."""
    V = enc.n_vocab
    specials = special_ids(enc)
    if sorted(specials) != list(range(V - len(SPECIAL_TOKENS), V)):
        raise PrepError("special tokens are not the last ids of the vocabulary")
    pattern = enc._pat_str.encode("utf-8")
    header = [0] * HEADER_INTS
    header[0] = TOKENIZER_MAGIC
    header[1] = TOKENIZER_VERSION
    header[2] = V
    header[3] = bos_id(enc)
    header[4] = len(toks)
    header[5] = len(pattern)
    out = [struct.pack(f"<{HEADER_INTS}i", *header), pattern]
    for i in range(V):
        if i in specials:
            b = specials[i].encode("utf-8")
            out.append(struct.pack("<BI", 1, len(b)))
        else:
            b = enc.decode_single_token_bytes(i)
            out.append(struct.pack("<BI", 0, len(b)))
        out.append(b)
    for ids in toks:
        out.append(struct.pack(f"<I{len(ids)}I", len(ids), *ids))
    return b"".join(out)


def sha256_file(path):
    """The SHA-256 of a file, hex, read 1 MiB at a time."""
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_tokenizer(path, enc, prompts=DEFAULT_PROMPTS):
    write_atomic(path, tokenizer_bytes(enc, prompts))


def read_tokenizer(path):
    """Rebuild the Encoding from a tokenizer file written by write_tokenizer (ids of normal tokens are
    their BPE ranks; the split pattern is the file's, or SPLIT_PATTERN for a version-1 file, which has
    none). Returns (enc, prompts_token_lists)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PrepError(f"{path}: cannot read ({e.strerror})")
    where = f"{path}: not a tokenizer file"
    if len(data) < HEADER_BYTES:
        raise PrepError(f"{where} (shorter than the {HEADER_BYTES}-byte header)")
    h = struct.unpack_from(f"<{HEADER_INTS}i", data, 0)
    if h[0] != TOKENIZER_MAGIC or h[1] not in (1, TOKENIZER_VERSION):
        raise PrepError(f"{where} (magic {h[0]} version {h[1]}, expected {TOKENIZER_MAGIC} version 1 or {TOKENIZER_VERSION})")
    V, bos, P = h[2], h[3], h[4]
    pos = HEADER_BYTES
    pattern = SPLIT_PATTERN
    if h[1] >= 2:
        if not 0 < h[5] <= len(data) - pos:
            raise PrepError(f"{path}: split pattern of {h[5]} bytes, the file has {len(data) - pos} after its header")
        try:
            pattern = data[pos:pos + h[5]].decode("utf-8")
        except UnicodeDecodeError:
            raise PrepError(f"{path}: the split pattern is not UTF-8")
        pos += h[5]
    ranks, specials = {}, []
    try:
        for i in range(V):
            is_special, n = struct.unpack_from("<BI", data, pos)
            pos += 5
            b = data[pos:pos + n]
            if len(b) != n:
                raise struct.error("truncated")
            pos += n
            if is_special:
                specials.append((i, b.decode("utf-8")))
            else:
                ranks[b] = i
        prompts = []
        for _ in range(P):
            (n,) = struct.unpack_from("<I", data, pos)
            ids = list(struct.unpack_from(f"<{n}I", data, pos + 4))
            pos += 4 + 4 * n
            prompts.append(ids)
    except struct.error:
        raise PrepError(f"{path}: truncated tokenizer file")
    if pos != len(data):
        raise PrepError(f"{path}: {len(data) - pos} unexpected bytes after the last record")
    want = [(len(ranks) + i, name) for i, name in enumerate(SPECIAL_TOKENS)]
    if specials != want:
        raise PrepError(f"{path}: special tokens are not nanochat's 9, after the mergeable tokens")
    enc = make_encoding(ranks, pattern)
    if bos != bos_id(enc):
        raise PrepError(f"{path}: BOS id {bos} in the header, expected {bos_id(enc)}")
    return enc, prompts


def upgrade_tokenizer(path):
    """Rewrite a tokenizer file (version 1 or 2) as the current version, in place and atomically. Token ids
    and the stored prompt tokens are kept, so shards and task files made with it stay valid; only the header
    and the split pattern (a version-1 file's is SPLIT_PATTERN) change."""
    enc, prompts = read_tokenizer(path)
    write_atomic(path, tokenizer_file_bytes(enc, prompts))
    log(f"{path}: tokenizer version {TOKENIZER_VERSION}, vocab {enc.n_vocab}, split pattern {enc._pat_str}")


def read_prompts_file(path):
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.rstrip("\r\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise PrepError(f"{path}: cannot read prompts file ({e})")
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise PrepError(f"{path}: no prompts (one prompt per line expected)")
    return prompts


# -----------------------------------------------------------------------------
# Token shards

def shard_version(vocab_size):
    return SHARD_VERSION_U16 if vocab_size <= 65536 else SHARD_VERSION_U32


def shard_header(ntokens, version):
    header = [0] * HEADER_INTS
    header[0] = SHARD_MAGIC
    header[1] = version
    header[2] = ntokens & 0xFFFFFFFF
    header[3] = ntokens >> 32
    # the two halves of the count are packed unsigned (a reader may take them as int32 or uint32)
    return struct.pack("<2i2I252i", *header)


def read_shard_header(path):
    """(version, ntokens) of a token shard, or None if the file is missing or not a complete shard."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError:
        return None
    if len(head) != HEADER_BYTES:
        return None
    magic, version, lo, hi = struct.unpack_from("<2i2I", head, 0)
    if magic != SHARD_MAGIC or version not in (SHARD_VERSION_U16, SHARD_VERSION_U32):
        return None
    ntokens = lo | (hi << 32)
    width = 2 if version == SHARD_VERSION_U16 else 4
    if size != HEADER_BYTES + width * ntokens:
        return None
    return version, ntokens


# Row groups: SHARD.rowgroups beside a token shard made from a parquet file records where the file's row groups
# begin, so that ranks stride over row groups as nanochat does (dev/data/README.md, "Row-group files")

ROWGROUP_MAGIC = 20261205
ROWGROUP_SUFFIX = ".rowgroups"


def parquet_row_group_sizes(path):
    """The number of rows (documents) of each row group of a parquet file, from its footer."""
    import pyarrow.parquet as pq
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def row_groups_bytes(shard_path, sizes, bos):
    """The row-group file of a token shard whose documents are, in order, those of row groups of `sizes` documents:
    each group's first token (its first document's BOS; a group of none: where the next documents start) and
    document count. Raises PrepError if the shard does not hold exactly sum(sizes) documents."""
    import numpy as np
    head = read_shard_header(shard_path)
    if head is None:
        raise PrepError(f"{shard_path}: not a complete token shard")
    version, ntokens = head
    dtype = "<u2" if version == SHARD_VERSION_U16 else "<u4"
    tokens = np.memmap(shard_path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(ntokens,))
    starts = np.flatnonzero(tokens == bos)
    if len(starts) != sum(sizes) or (ntokens and starts[0] != 0):
        raise PrepError(f"{shard_path} holds {len(starts)} documents, but its parquet file's row groups hold {sum(sizes)}: "
                        "delete the shard and run again")
    header = struct.pack("<8i", ROWGROUP_MAGIC, 1, len(sizes), 0, ntokens & 0xFFFFFFFF, ntokens >> 32, 0, 0)
    pairs, before = [], 0
    for n in sizes:
        pairs += [int(starts[before]) if before < len(starts) else ntokens, n]
        before += n
    return header + struct.pack("<%dQ" % len(pairs), *pairs)


def write_row_groups(shard_path, parquet_path, bos):
    """Writes SHARD.rowgroups for a token shard made from parquet_path (through a temporary file)."""
    write_atomic(shard_path + ROWGROUP_SUFFIX, row_groups_bytes(shard_path, parquet_row_group_sizes(parquet_path), bos))


def row_groups_current(shard_path):
    """Whether SHARD.rowgroups exists and describes a shard of this one's token count."""
    head = read_shard_header(shard_path)
    try:
        with open(shard_path + ROWGROUP_SUFFIX, "rb") as f:
            magic, version, _, _, lo, hi = struct.unpack("<6i", f.read(24))
    except (OSError, struct.error):
        return False
    return head is not None and magic == ROWGROUP_MAGIC and version == 1 and ((lo & 0xFFFFFFFF) | (hi << 32)) == head[1]


# Worker state for the encoding pool (one Encoding per process)
_WORKER = {}


def _worker_init(pattern, ranks, version):
    enc = make_encoding(ranks, pattern)
    _WORKER["enc"] = enc
    _WORKER["bos"] = bos_id(enc)
    _WORKER["version"] = version


def _encode_batch(texts):
    """[BOS] + encode_ordinary(doc) for each doc, concatenated, as little-endian token bytes."""
    enc, bos = _WORKER["enc"], _WORKER["bos"]
    arr = array.array("H" if _WORKER["version"] == SHARD_VERSION_U16 else "I")
    if arr.itemsize != (2 if _WORKER["version"] == SHARD_VERSION_U16 else 4):
        raise RuntimeError("unexpected C type sizes")
    nbytes = 0
    for t in texts:
        arr.append(bos)
        arr.extend(enc.encode_ordinary(t))
        nbytes += len(t.encode("utf-8"))
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes(), len(arr), len(texts), nbytes


def _encoding_state(enc):
    """What a worker needs to rebuild `enc`: (pattern, mergeable ranks, shard version)."""
    specials = special_ids(enc)
    ranks = {enc.decode_single_token_bytes(i): i for i in range(enc.n_vocab) if i not in specials}
    return enc._pat_str, ranks, shard_version(enc.n_vocab)


class Encoder:
    """Encodes batches of documents in a multiprocessing Pool (or in this process for workers <= 1),
    in order, with at most a few batches in flight per worker."""

    def __init__(self, enc, workers):
        self.state = _encoding_state(enc)
        self.version = self.state[2]
        self.workers = workers
        self.pool = None
        if workers > 1:
            import multiprocessing as mp
            # spawn: workers do not inherit the parent's threads (pyarrow, rustbpe) or locks
            self.pool = mp.get_context("spawn").Pool(workers, initializer=_worker_init, initargs=self.state)
        else:
            _worker_init(*self.state)

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def map(self, batches):
        """Yield _encode_batch(b) for each batch, in order."""
        if self.pool is None:
            for b in batches:
                yield _encode_batch(b)
            return
        pending = collections.deque()
        for b in batches:
            pending.append(self.pool.apply_async(_encode_batch, (b,)))
            if len(pending) >= 4 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _batched(docs, max_docs=256, max_chars=1 << 20):
    batch, chars = [], 0
    for d in docs:
        batch.append(d)
        chars += len(d)
        if len(batch) >= max_docs or chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def write_token_shard(path, docs, encoder, label=None, report_every=10.0):
    """Encode the documents (each: BOS + encode_ordinary(doc)) and write one token shard through a
    temporary file renamed into place. Returns (ndocs, ntokens, nbytes_of_text)."""
    label = label or os.path.basename(path)
    tmp = path + ".tmp"
    t0 = last = time.time()
    ndocs = ntokens = nbytes = 0
    with open(tmp, "wb") as f:
        f.write(shard_header(0, encoder.version))
        for data, nt, nd, nb in encoder.map(_batched(docs)):
            f.write(data)
            ntokens += nt
            ndocs += nd
            nbytes += nb
            now = time.time()
            if now - last >= report_every:
                last = now
                log(f"{label}: {ndocs:,} docs, {ntokens / 1e6:,.1f}M tokens, "
                    f"{nbytes / 1e6 / (now - t0):.1f} MB/s of text")
        f.seek(0)
        f.write(shard_header(ntokens, encoder.version))
    os.replace(tmp, path)
    dt = time.time() - t0
    log(f"{label}: wrote {ndocs:,} docs, {ntokens:,} tokens "
        f"({nbytes / max(1, ntokens - ndocs):.2f} bytes/token) in {dt:.1f}s")
    return ndocs, ntokens, nbytes


# -----------------------------------------------------------------------------
# Main

def parse_args(argv=None):
    p = xsa_cli.ArgumentParser(
        description="Download ClimbMix-400B parquet shards, train nanochat's tokenizer, write "
                    "tokenizer.bin and token shards for xsa-train (formats: dev/data/README.md).")
    p.add_argument("--num-shards", type=int, default=40,
                   help="download train shards 0..N-1 (plus the val shard 6542); default %(default)s, "
                        "enough for d12 (d24 needs ~120; estimates in dev/data/README.md)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                   help="where downloaded parquet files go (default %(default)s)")
    p.add_argument("--parquet-dir", default=None,
                   help="offline mode: use the *.parquet files in this directory (sorted by name; "
                        "the last one is validation), download nothing")
    p.add_argument("--base-url", default=BASE_URL, help="dataset URL prefix (default %(default)s)")
    p.add_argument("--download-only", action="store_true", help="stop after downloading")
    p.add_argument("--retries", type=int, default=10, help="download attempts per file (default %(default)s)")
    p.add_argument("--out", default=DEFAULT_OUT_DIR,
                   help="output directory for tokenizer.bin and the token shards (default %(default)s)")
    p.add_argument("--vocab-size", type=int, default=32768,
                   help="total vocabulary incl. the 9 special tokens (default %(default)s)")
    p.add_argument("--tokenizer-chars", type=int, default=TOKENIZER_CHARS,
                   help="train the tokenizer on the train documents until more than this many "
                        "characters have been seen (default %(default)s)")
    p.add_argument("--prompts-file", default=None,
                   help="sample prompts stored in tokenizer.bin, one per line (default: nanochat's 7)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="parallel downloads and encoding processes (default %(default)s)")
    p.add_argument("--upgrade-tokenizer", metavar="PATH", default=None,
                   help="only rewrite the tokenizer file PATH (version 1 or 2) as version 2, in place: the split "
                        "pattern is stored (the C++ encoder needs it), token ids stay, so its shards stay valid")
    args = p.parse_args(argv)
    if args.vocab_size < MIN_VOCAB:
        p.exit(1, f"climbmix.py: error: --vocab-size {args.vocab_size} is too small: need at least "
                  f"{MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} special tokens + 1 merge)\n")
    if args.parquet_dir is None and not 1 <= args.num_shards <= MAX_SHARD:
        p.exit(1, f"climbmix.py: error: --num-shards must be in 1..{MAX_SHARD}\n")
    if args.workers < 1:
        p.exit(1, "climbmix.py: error: --workers must be >= 1\n")
    if args.tokenizer_chars < 1:
        p.exit(1, "climbmix.py: error: --tokenizer-chars must be >= 1\n")
    return args


def run(args):
    if args.upgrade_tokenizer is not None:
        upgrade_tokenizer(args.upgrade_tokenizer)
        return
    t_start = time.time()
    prompts = read_prompts_file(args.prompts_file) if args.prompts_file else DEFAULT_PROMPTS

    # 1. the parquet files
    if args.parquet_dir is not None:
        train_paths, val_path = list_parquet_split(os.path.expanduser(args.parquet_dir))
    else:
        data_dir = os.path.expanduser(args.data_dir)
        # val shard first so a short run can already evaluate; then train shards in order
        indices = [VAL_SHARD] + list(range(args.num_shards))
        paths = download_shards(indices, data_dir, args.workers, args.base_url, args.retries)
        val_path, train_paths = paths[0], paths[1:]
        if args.download_only:
            return
    for path in train_paths + [val_path]:
        check_parquet(path)
    log(f"train: {len(train_paths)} parquet files ({os.path.basename(train_paths[0])} .. "
        f"{os.path.basename(train_paths[-1])}), val: {os.path.basename(val_path)}")

    out = os.path.expanduser(args.out)
    os.makedirs(out, exist_ok=True)

    # 2. the tokenizer (reused if tokenizer.bin exists, so that existing shards stay valid)
    tok_path = os.path.join(out, "tokenizer.bin")
    if os.path.exists(tok_path):
        enc, _ = read_tokenizer(tok_path)
        if enc.n_vocab != args.vocab_size:
            raise PrepError(f"{tok_path} exists with vocab size {enc.n_vocab}, not {args.vocab_size}; "
                            "delete it (and the shards next to it) or choose another --out")
        log(f"reusing {tok_path} (vocab {enc.n_vocab})")
    else:
        t0 = time.time()
        log(f"training tokenizer: vocab {args.vocab_size}, on the first {args.tokenizer_chars:,} characters "
            f"of the train documents (each cropped to {DOC_CAP:,})")
        seen = [0, 0]

        def counted(texts):
            for t in texts:
                seen[0] += 1
                seen[1] += len(t)
                yield t

        texts = counted(tokenizer_training_texts(iter_parquet_docs(train_paths), args.tokenizer_chars))
        enc = train_tokenizer(texts, args.vocab_size)
        log(f"tokenizer: trained on {seen[0]:,} docs, {seen[1]:,} characters in {time.time() - t0:.1f}s")
    write_tokenizer(tok_path, enc, prompts)
    log(f"wrote {tok_path}: vocab {enc.n_vocab}, BOS {bos_id(enc)}, {len(prompts)} prompts")

    # 3. the token shards, one per parquet file
    jobs = [(os.path.join(out, f"train_{i:06d}.bin"), p) for i, p in enumerate(train_paths)]
    jobs.append((os.path.join(out, "val_000000.bin"), val_path))
    todo = [(dst, src) for dst, src in jobs if read_shard_header(dst) is None]
    if len(todo) < len(jobs):
        log(f"{len(jobs) - len(todo)} of {len(jobs)} token shards already written, skipping them")
    if todo:
        with Encoder(enc, args.workers) as encoder:
            for k, (dst, src) in enumerate(todo):
                label = f"[{k + 1}/{len(todo)}] {os.path.basename(dst)} <- {os.path.basename(src)}"
                write_token_shard(dst, iter_parquet_docs([src]), encoder, label)
            encoder.close()
    # 4. their row groups (also for shards written before the row-group files existed)
    stale = [(dst, src) for dst, src in jobs if dst in dict(todo) or not row_groups_current(dst)]
    for dst, src in stale:
        write_row_groups(dst, src, bos_id(enc))
    if stale:
        log(f"wrote the row groups of {len(stale)} shard(s) ({ROWGROUP_SUFFIX} files)")
    total = 0
    for dst, _ in jobs:
        version, n = read_shard_header(dst)
        total += n
    log(f"done: {len(jobs)} token shards in {out}, {total:,} tokens, {time.time() - t_start:.1f}s")


def run_cli(prog, run, args, error_type):
    """The data scripts' main: an `error_type` error becomes one "error:" line and exit code 1."""
    try:
        run(args)
    except error_type as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    except ModuleNotFoundError as e:  # a package of requirements.txt, imported where it is first needed
        print(f"{prog}: error: needs the Python package '{e.name}', which {sys.executable} cannot import: "
              f"{sys.executable} -m pip install -r dev/data/requirements.txt", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)


def main(argv=None):
    run_cli("climbmix.py", run, parse_args(argv), PrepError)


if __name__ == "__main__":
    main()
