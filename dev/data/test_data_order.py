#!/usr/bin/env python3
"""The data order against nanochat's: parquet files with row groups of 100, 128, 256 and 1,024 documents go through
dev/data/climbmix.py (token shards and their row-group files), and the rows the loader packs for a rank
(dev/data/bin/batches, dataloader.h) must be the rows nanochat's loader packs from the same parquet files: its
_document_batches (rank r reads the row groups r, r+W, r+2W, ... of every file, in slices of 128 documents) and its
best-fit packing, written here from their description in dev/docs/data.md, reading the parquet files with pyarrow
(not the row-group files) and encoding the text with the tokenizer climbmix.py trained.

    python3 dev/data/test_data_order.py        (or all suites: make test; needs make dev/data/bin/batches)

Needs pyarrow, tiktoken and rustbpe (dev/data/requirements.txt), as test_climbmix.py.
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
from xsatest import REPO, binary, needs_packages, read, run  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "dev", "data"))
import climbmix  # noqa: E402

ROW_GROUPS = (100, 128, 256, 1024)
DOCS_PER_FILE = 9000  # 1,024-document row groups: 9 per file, so that rank 7 of 8 has one
B, T, BATCHES = 4, 96, 12
BUFFER, SLICE = 1000, 128  # nanochat's buffer_size and tokenizer_batch_size


def texts(seed, n):
    rng = random.Random(seed)
    words = ("the of and to in river mountain library engine theorem garden window weather history science music "
             "market village ocean language kitchen bicycle telescope café naïve Zürich 東京 42 7 -").split()
    return [" ".join(rng.choice(words) for _ in range(rng.choice((1, 2, 5, 9, 17, 33, 60)))) for _ in range(n)]


def nanochat_document_batches(files, rank, world):
    """nanochat's _document_batches: per epoch, per file, the row groups rank, rank + world, ..., each in slices of
    SLICE documents. `files`: per file, its row groups, each a list of documents (token lists)."""
    while True:
        for groups in files:
            for g in range(rank, len(groups), world):
                for i in range(0, len(groups[g]), SLICE):
                    yield groups[g][i:i + SLICE]


def nanochat_rows(files, rank, world, n_rows):
    """nanochat's BOS-aligned best-fit packing: rows of T + 1 tokens."""
    batches = nanochat_document_batches(files, rank, world)
    buffer, rows = [], []
    for _ in range(n_rows):
        row = []
        while len(row) < T + 1:
            while len(buffer) < BUFFER:
                buffer.extend(next(batches))
            remaining = T + 1 - len(row)
            best, best_len = -1, 0
            for i, doc in enumerate(buffer):
                if len(doc) <= remaining and len(doc) > best_len:
                    best, best_len = i, len(doc)
            if best >= 0:
                row.extend(buffer.pop(best))
            else:
                shortest = min(range(len(buffer)), key=lambda i: len(buffer[i]))
                row.extend(buffer.pop(shortest)[:remaining])
        rows.append(row)
    return rows


@needs_packages("pyarrow", "tiktoken", "rustbpe")
class TestDataOrder(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import pyarrow as pa
        import pyarrow.parquet as pq
        cls.dir = tempfile.mkdtemp(prefix="xsa_data_order_")
        cls.texts = [texts(1, DOCS_PER_FILE), texts(2, DOCS_PER_FILE), texts(3, 300)]  # two train files, the val file
        tokenizer, vocab = None, 512
        for size in ROW_GROUPS:
            pdir = os.path.join(cls.dir, "rg%d" % size)
            out = os.path.join(pdir, "out")
            os.makedirs(out)
            for i, t in enumerate(cls.texts):
                pq.write_table(pa.table({"text": t}), os.path.join(pdir, "shard_%05d.parquet" % i), row_group_size=size)
            if tokenizer:  # one tokenizer for all (climbmix.py reuses an existing one)
                shutil.copy(tokenizer, out)
            code, text = run([sys.executable, "dev/data/climbmix.py", "--parquet-dir", pdir, "--out", out, "--vocab-size", str(vocab),
                              "--tokenizer-chars", "200000", "--workers", "2"])
            if code != 0:
                shutil.rmtree(cls.dir, ignore_errors=True)
                raise AssertionError("dev/data/climbmix.py failed (exit %d):\n%s" % (code, text[-3000:]))
            tokenizer = os.path.join(out, "tokenizer.bin")
            vocab = climbmix.read_tokenizer(tokenizer)[0].n_vocab  # (fewer merges than asked for: the text has few words)
        enc, _ = climbmix.read_tokenizer(tokenizer)
        cls.bos, cls.vocab = climbmix.bos_id(enc), enc.n_vocab
        cls.tokens = [[[cls.bos] + enc.encode_ordinary(t) for t in file_texts] for file_texts in cls.texts[:2]]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def files(self, size):
        """The train files' documents in their row groups, as pyarrow reads the parquet files' row groups."""
        import pyarrow.parquet as pq
        files = []
        for i, docs in enumerate(self.tokens):
            meta = pq.ParquetFile(os.path.join(self.dir, "rg%d" % size, "shard_%05d.parquet" % i)).metadata
            groups, start = [], 0
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                groups.append(docs[start:start + n])
                start += n
            self.assertEqual(start, len(docs))
            files.append(groups)
        return files

    def loader_rows(self, size, rank, world, *resume_at):
        pattern = os.path.join(self.dir, "rg%d" % size, "out", "train_*")  # (matches the row-group files too: they are skipped)
        argv = [binary("dev/data/bin/batches"), pattern, str(self.vocab), str(self.bos), str(B), str(T), str(rank), str(world),
                str(BATCHES)] + [str(k) for k in resume_at]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        self.assertEqual(p.returncode, 0, p.stderr.decode("utf-8", "replace"))
        return [[int(t) for t in line.split()] for line in p.stdout.decode().splitlines()]

    def test_order(self):
        """loader: the rows of ranks of 1, 2 and 8 from parquet row groups of 100, 128, 256 and 1,024 documents are nanochat's"""
        for size in ROW_GROUPS:
            files = self.files(size)
            for world, ranks in ((1, (0,)), (2, (0, 1)), (8, (0, 3, 7))):
                for rank in ranks:
                    with self.subTest(row_group=size, ranks=world, rank=rank):
                        self.assertEqual(self.loader_rows(size, rank, world), nanochat_rows(files, rank, world, B * BATCHES))

    def test_resume(self):
        """loader: the state saved after 5 batches and restored gives the same rows (row groups of 100 and 1,024; 2 and 8 ranks)"""
        for size in (100, 1024):
            for world, rank in ((2, 1), (8, 6)):
                with self.subTest(row_group=size, ranks=world, rank=rank):
                    self.assertEqual(self.loader_rows(size, rank, world, 5), self.loader_rows(size, rank, world))

    def test_without_row_group_files(self):
        """loader: shards without row-group files (made before them) are read as row groups of 128 documents from each
        shard's start, as before; climbmix.py run again writes the files without encoding anything again"""
        size = 256
        out = os.path.join(self.dir, "rg%d" % size, "out")
        shards = sorted(f for f in os.listdir(out) if f.endswith(".bin") and f != "tokenizer.bin")
        saved = {f: read(os.path.join(out, f + ".rowgroups")) for f in shards}
        try:
            for f in shards:
                os.remove(os.path.join(out, f + ".rowgroups"))
            chunked = [[docs[i:i + SLICE] for i in range(0, len(docs), SLICE)] for docs in self.tokens]
            for world, rank in ((1, 0), (2, 1)):
                with self.subTest(ranks=world, rank=rank):
                    self.assertEqual(self.loader_rows(size, rank, world), nanochat_rows(chunked, rank, world, B * BATCHES))
            code, text = run([sys.executable, "dev/data/climbmix.py", "--parquet-dir", os.path.join(self.dir, "rg%d" % size), "--out", out,
                              "--vocab-size", str(self.vocab), "--workers", "2"])
            self.assertEqual(code, 0, text[-3000:])
            self.assertIn("3 of 3 token shards already written", text)
            self.assertIn("wrote the row groups of 3 shard(s)", text)
            for f in shards:
                self.assertEqual(read(os.path.join(out, f + ".rowgroups")), saved[f], f)
        finally:
            for f in shards:
                with open(os.path.join(out, f + ".rowgroups"), "wb") as fh:
                    fh.write(saved[f])


if __name__ == "__main__":
    unittest.main()
