#!/usr/bin/env python3
"""The CPU-scale study's corpus: GCIDE, the Collaborative International Dictionary of English (Webster's
1913 with additions; GPL-3.0-or-later, see dev/data/README.md), from Debian's dict-gcide package: about
40 MB of text in 126,000 entries, so about 10M tokens, large enough that a small model trained on a CPU
for hours does not just memorise it (the embedded corpus has 93K tokens).

    python3 dev/data/gcide.py [--out DIR] [--deb FILE] [--vocab-size 8192] [--shuffle-seed 1234]

Steps: the .deb (`apt-get download dict-gcide` into DIR, which checks it against Debian's signed index;
or --deb FILE, offline) -> its gcide.dict.dz and gcide.index (read with the standard library: the .deb
is an ar archive holding a tar) -> one document per dictionary entry -> validation held out by headword
group, the entries shuffled with a recorded seed (both below) -> a tokenizer trained on the training
entries (rustbpe, nanochat's split pattern and special tokens, as dev/data/climbmix.py does) ->
TRAIN_SHARDS training shards and one validation shard, each in the shuffled order.

Why: the loader reads shards in order and does not shuffle, and a dictionary in file order is sorted by
headword, so a short run trained on "A" to "C" only, most validation entries came from letters never
trained on, and an entry held out sat next to a training entry of the same headword (a near-duplicate
across the split). So:
  * an entry's headword is its text before the backslash that opens its pronunciation, on its first line
    or at the start of the second (`Acerous \\Ac"er*ous\\, a.`), decomposed (NFKD), case-folded and reduced
    to its letters and digits ("Caf'e", "cafe" and "Café" are one headword; so are "Bird's-eye" and
    "Birdseye"); an entry that does not start that way takes the headword of the entry before it (GCIDE
    0.48.5 has 12: 11 pieces of the entry before them, split off at a blank line in dictd's index, and the
    dictionary's preface, the first entry, whose headword is "");
  * the entries of one headword all go to validation or all to training: a headword is held out when
    SHA-256("gcide-val:" + headword), its first 8 bytes read big-endian, is 0 mod 50 (about 2%); the rule
    has no seed, so every shuffle seed has the same validation entries, only in another order;
  * entry k (numbered from 0 in file order) is ordered by SHA-256("<seed>:<k>"): a shuffle fixed by
    --shuffle-seed and the same on every machine and Python version.
DIR/prep.json records these settings (and the .deb's SHA-256). A finished or interrupted DIR with the same
settings is reused (finished files are kept); one with other settings, or one written before prep.json
existed (dictionary order), is refused: give another --out or delete it. Then:

    ./train_gpt -i "DIR/train_*.bin" -j "DIR/val_*.bin" --tokenizer DIR/tokenizer.bin --core-every -1 ...

Needs tiktoken and rustbpe (python3 -m pip install -r dev/data/requirements.txt).
"""
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import climbmix  # noqa: E402
import dictd  # noqa: E402
import xsa_cli  # noqa: E402
from climbmix import PrepError, log  # noqa: E402

DEFAULT_OUT = os.path.join("~", ".cache", "xsa-train", "gcide")
TRAIN_SHARDS = 4
VAL_ONE_IN = 50  # a headword is held out when its hash is 0 mod VAL_ONE_IN
DEFAULT_SHUFFLE_SEED = 1234
DICT_MEMBER, INDEX_MEMBER = "usr/share/dictd/gcide.dict.dz", "usr/share/dictd/gcide.index"

# What a prepared directory was made with. Version 1 (the first gcide.py) wrote no prep.json: entries in
# dictionary order, every 50th held out. Change PREP_VERSION whenever the documents, their order or the
# split change, so that a directory made otherwise is refused instead of silently reused.
PREP_VERSION = 2
PREP_FILE = "prep.json"
ORDER_RULE = 'entry k (from 0, in file order) sorted by SHA-256("<seed>:<k>")'
HOLDOUT_RULE = (f'by headword (text before the first backslash, NFKD, case-folded, letters and digits only; a headless '
                f'entry takes the previous entry\'s): validation when SHA-256("gcide-val:" + headword)[:8] big-endian '
                f'is 0 mod {VAL_ONE_IN}')
HEAD = re.compile(r"([^\\\n]+?)[ \t]*\n?[ \t]*\\")  # `Acerous \Ac"er*ous\, a.`: the head before the pronunciation
OUTPUTS = re.compile(r"tokenizer\.bin|(train|val)_\d{6}\.bin")  # what an earlier preparation may have left


def ar_members(data):
    """{name: bytes} of an ar archive (the container of a .deb)."""
    if data[:8] != b"!<arch>\n":
        raise PrepError("not a .deb (no ar archive signature)")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise PrepError("not a .deb (a bad ar member header)")
        members[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    return members


def dictionary_files(deb_path):
    """(gcide.dict text as bytes, gcide.index text) from the package file."""
    try:
        with open(deb_path, "rb") as f:
            members = ar_members(f.read())
    except OSError as e:
        raise PrepError(f"cannot read {deb_path}: {e.strerror}")
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        raise PrepError(f"{deb_path}: no data.tar member")
    raw = members[name]
    if name.endswith(".xz"):
        raw = lzma.decompress(raw)
    elif name.endswith(".gz"):
        raw = gzip.decompress(raw)
    elif name != "data.tar":
        raise PrepError(f"{deb_path}: {name} is compressed in a way this script does not read")
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        files = {m.name.lstrip("./"): m for m in tar.getmembers()}
        if DICT_MEMBER not in files or INDEX_MEMBER not in files:
            raise PrepError(f"{deb_path}: no {DICT_MEMBER} and {INDEX_MEMBER}: not the dict-gcide package")
        dict_dz = tar.extractfile(files[DICT_MEMBER]).read()
        index = tar.extractfile(files[INDEX_MEMBER]).read().decode("utf-8", "replace")
    return gzip.decompress(dict_dz), index  # dictzip is gzip with an index in an extra field


def entries(text, index):
    """The dictionary's entries in file order (dictd.entries; GCIDE holds a few bytes that are not UTF-8,
    decoded as U+FFFD, and 9 entries that start with whitespace, stripped). dictd's own records
    (00-database-short and so on) are left out: dictd.entries drops those listed only under their own
    names, and GCIDE lists four under a second name as well (00-gcide-short, ...); such a record's text
    starts with its name."""
    try:
        docs = [e.lstrip() for e in dictd.entries(text, index, "gcide.index", errors="replace")]
    except dictd.DictdError as e:
        raise PrepError(str(e))
    return [d for d in docs if not re.match(r"00-?database", d)]


def headword(entry):
    """The entry's normalised headword, or "" for an entry that does not start with one."""
    m = HEAD.match(entry)
    if not m:
        return ""
    # NFKD splits an accented letter into the letter and a combining mark, which is not alphanumeric;
    # GCIDE writes most accents in ASCII ("Caf'e"), so dropping punctuation covers those
    return "".join(c for c in unicodedata.normalize("NFKD", m.group(1)).casefold() if c.isalnum())


def group_keys(docs):
    """Each entry's headword group: its headword, or the group of the entry before it when it has none
    (a piece of that entry, split off by a blank line; "" before the first headword)."""
    keys, key = [], ""
    for d in docs:
        key = headword(d) or key
        keys.append(key)
    return keys


def sha256_int(text):
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def is_validation(key):
    # no seed: the validation entries are the same for every shuffle seed, and a headword's side does
    # not depend on the rest of the dictionary
    return sha256_int("gcide-val:" + key) % VAL_ONE_IN == 0


def shuffled(n, seed):
    """0..n-1 in the order of ORDER_RULE: hashes rather than random.shuffle, whose results Python does
    not promise to keep across versions."""
    return sorted(range(n), key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).digest())


def split(docs, seed):
    """(train, val, training groups, validation groups): the entries of each side in the shuffled order."""
    keys = group_keys(docs)
    order = shuffled(len(docs), seed)
    train = [docs[k] for k in order if not is_validation(keys[k])]
    val = [docs[k] for k in order if is_validation(keys[k])]
    val_groups = {k for k in keys if is_validation(k)}
    return train, val, len(set(keys)) - len(val_groups), len(val_groups)


def short(value):
    """A setting as an error message shows it (the rules are long sentences)."""
    text = json.dumps(value)
    return text if len(text) <= 48 else text[:45] + "..."


def refuse_earlier(out):
    """Refuses an output directory written by gcide.py before prep.json existed: its shards are in dictionary
    order with every 50th entry held out, and reusing them would pass them off as this version's. Refusing
    rather than rebuilding: the old files may be what other runs read."""
    if os.path.exists(os.path.join(out, PREP_FILE)):
        return
    old = sorted(n for n in os.listdir(out) if OUTPUTS.fullmatch(n))
    if old:
        raise PrepError(f"{out} holds {', '.join(old)} but no {PREP_FILE}: written by an earlier gcide.py (entries in "
                        f"dictionary order, every 50th held out), not reused; give another --out, or delete those files "
                        f"to prepare {out} again")


def same_settings(out, settings):
    """Whether DIR/prep.json is there with these settings (so its finished files are reused); refuses one
    made with other settings, for the same reason as refuse_earlier."""
    path = os.path.join(out, PREP_FILE)
    if not os.path.exists(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        had = record.get("settings") if isinstance(record, dict) else None
        why = "no settings object"
    except (OSError, ValueError) as e:
        had, why = None, e.strerror if isinstance(e, OSError) else f"not JSON: {e}"
    if not isinstance(had, dict):
        raise PrepError(f"{path} is not a gcide.py preparation record ({why}); delete {out} to prepare it again")
    differ = [f"{k} {short(had.get(k))}, now {short(settings.get(k))}" for k in sorted(set(had) | set(settings))
              if had.get(k) != settings.get(k)]
    if differ:
        raise PrepError(f"{out} was prepared with other settings ({'; '.join(differ)}); give another --out, or "
                        f"delete {out} to prepare it again")
    return True


def write_prep(out, settings, counts=None):
    record = {"settings": settings} if counts is None else {"settings": settings, "counts": counts}
    climbmix.write_atomic(os.path.join(out, PREP_FILE), (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def get_deb(out):
    """The dict-gcide package in `out`, downloaded with apt-get if it is not there yet."""
    have = sorted(n for n in os.listdir(out) if n.startswith("dict-gcide_") and n.endswith(".deb"))
    if not have:
        log("downloading Debian's dict-gcide with apt-get download (about 15 MB)")
        try:
            p = subprocess.run(["apt-get", "download", "dict-gcide"], cwd=out, capture_output=True, text=True)
        except OSError as e:
            raise PrepError(f"cannot run apt-get ({e.strerror}): on a machine without apt, download dict-gcide's .deb "
                            "from packages.debian.org and give it with --deb")
        have = sorted(n for n in os.listdir(out) if n.startswith("dict-gcide_") and n.endswith(".deb"))
        if p.returncode != 0 or not have:
            raise PrepError(f"apt-get download dict-gcide failed: {' '.join(p.stderr.split())[-300:]} "
                            "(apt-get update first, or give the .deb with --deb)")
    return os.path.join(out, have[-1])


def run(args):
    out = os.path.expanduser(args.out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise PrepError(f"cannot create {out}: {e.strerror}")
    refuse_earlier(out)  # before a download into it
    deb = args.deb or get_deb(out)
    try:
        with open(deb, "rb") as f:
            deb_sha = hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise PrepError(f"cannot read {deb}: {e.strerror}")
    settings = {"prep_version": PREP_VERSION, "deb": os.path.basename(deb), "deb_sha256": deb_sha,
                "shuffle_seed": args.shuffle_seed, "order": ORDER_RULE, "holdout": HOLDOUT_RULE,
                "vocab_size": args.vocab_size, "train_shards": TRAIN_SHARDS}
    resumed = same_settings(out, settings)
    text, index = dictionary_files(deb)
    docs = entries(text, index)
    train, val, train_groups, val_groups = split(docs, args.shuffle_seed)
    if len(train) < TRAIN_SHARDS or not val:
        raise PrepError(f"{deb}: {len(docs)} entries, too few for {TRAIN_SHARDS} training shards and a validation shard")
    log(f"{os.path.basename(deb)}: {len(docs):,} entries, {sum(map(len, docs)) / 1e6:.1f}M characters, "
        f"{train_groups + val_groups:,} headwords; {len(train):,} entries ({train_groups:,} headwords) for training, "
        f"{len(val):,} ({val_groups:,} headwords, 1 in {VAL_ONE_IN}) for validation; shuffle seed {args.shuffle_seed}")
    if resumed:
        log(f"reusing {out}: {PREP_FILE} has these settings")
    else:
        write_prep(out, settings)  # first, so that an interrupted run is recognised and continued
    tok_path = os.path.join(out, "tokenizer.bin")
    if os.path.exists(tok_path):
        enc, _ = climbmix.read_tokenizer(tok_path)
        if enc.n_vocab != args.vocab_size:
            raise PrepError(f"{tok_path} exists with vocab size {enc.n_vocab}, not {args.vocab_size}; delete {out} to start again")
        log(f"reusing {tok_path} (vocab {enc.n_vocab})")
    else:
        enc = climbmix.train_tokenizer(climbmix.tokenizer_training_texts(iter(train)), args.vocab_size)
        climbmix.write_tokenizer(tok_path, enc)
        log(f"wrote {tok_path}: vocab {enc.n_vocab}, trained on the training entries")
    per_shard = (len(train) + TRAIN_SHARDS - 1) // TRAIN_SHARDS
    jobs = [(os.path.join(out, f"train_{i:06d}.bin"), train[i * per_shard:(i + 1) * per_shard]) for i in range(TRAIN_SHARDS)]
    jobs.append((os.path.join(out, "val_000000.bin"), val))
    with climbmix.Encoder(enc, args.workers) as encoder:
        for path, shard_docs in jobs:
            if climbmix.read_shard_header(path) is None:
                climbmix.write_token_shard(path, iter(shard_docs), encoder)
        encoder.close()
    train_tokens = sum(climbmix.read_shard_header(p)[1] for p, _ in jobs[:-1])
    val_tokens = climbmix.read_shard_header(jobs[-1][0])[1]
    write_prep(out, settings, {"entries": len(docs), "train_entries": len(train), "val_entries": len(val),
                               "train_headwords": train_groups, "val_headwords": val_groups,
                               "train_tokens": train_tokens, "val_tokens": val_tokens})
    log(f"done: {TRAIN_SHARDS} training shards ({train_tokens:,} tokens) and a validation shard ({val_tokens:,} tokens) in {out}")


def main(argv=None):
    p = xsa_cli.ArgumentParser(prog="gcide.py",
                               description="GCIDE (Debian's dict-gcide) as token shards for xsa-train's CPU-scale study.")
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default %(default)s)")
    p.add_argument("--deb", help="the dict-gcide .deb to read (default: apt-get download it into --out)")
    p.add_argument("--vocab-size", type=int, default=8192, help="vocabulary incl. the 9 special tokens (default %(default)s)")
    p.add_argument("--shuffle-seed", type=int, default=DEFAULT_SHUFFLE_SEED,
                   help="seed of the entries' order, recorded in OUT/prep.json (default %(default)s)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="encoding processes (default %(default)s)")
    args = p.parse_args(argv)
    if args.vocab_size < climbmix.MIN_VOCAB:
        p.error(f"--vocab-size must be at least {climbmix.MIN_VOCAB}")
    if args.shuffle_seed < 0:
        p.error("--shuffle-seed must be 0 or more")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    climbmix.run_cli("gcide.py", run, args, PrepError)


if __name__ == "__main__":
    main()
