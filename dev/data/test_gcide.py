"""dev/data/gcide.py offline, on a hand-made dict-gcide package (an ar archive holding data.tar.xz with a
dictd dictionary in dictionary order: headwords of one to three entries each, spelt differently within a
headword, a few headless pieces that continue the entry before them, one entry listed under two index
names, and dictd's header record listed under a second name as GCIDE lists its records). Checked: every
entry becomes one document that decodes back exactly once and dictd's record none; no headword has
entries on both sides of the split (by the headwords the package was built from, not gcide.py's reader);
the order is shuffled, the same bytes twice for a seed, another order for another seed; a directory
written before prep.json existed, or with other settings, is refused, not reused; bad input is one error
line. Needs tiktoken and rustbpe. Run with `make test`."""
import collections
import gzip
import io
import json
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
from xsatest import needs_packages, run  # noqa: E402
import climbmix  # noqa: E402,F401  (read back with the preparation script's own reader of tokenizer files)
from test_climbmix import shard_documents  # noqa: E402

BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
FILES = ["prep.json", "tokenizer.bin", "train_000000.bin", "train_000001.bin", "train_000002.bin", "train_000003.bin",
         "val_000000.bin"]


def b64(n):
    s = ""
    while True:
        s = BASE64[n % 64] + s
        n //= 64
        if n == 0:
            return s


def fake_deb(entries):
    """The bytes of a .deb with usr/share/dictd/gcide.dict.dz and gcide.index holding `entries`, after
    dictd's header record, which is indexed under 00-database-short and 00-gcide-short as in GCIDE."""
    text, index = b"00-database-short\n   a header record\n\n", ["00-database-short\tA\tm", "00-gcide-short\tA\tm"]
    for k, e in enumerate(entries):
        data = (e + "\n\n").encode("utf-8")
        index.append("word%d\t%s\t%s" % (k, b64(len(text)), b64(len(data))))
        if k == 7:
            index.append("alias\t%s\t%s" % (b64(len(text)), b64(len(data))))  # one entry under two headwords
        text += data
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        for name, data in (("./usr/share/dictd/gcide.dict.dz", gzip.compress(text)), ("./usr/share/dictd/gcide.index", "\n".join(index).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = b"!<arch>\n"
    for name, data in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", lzma.compress(tar_bytes.getvalue()))):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8) + str(len(data)).encode().ljust(10) + b"`\n"
        out += data + (b"\n" if len(data) % 2 else b"")
    return out


def dictionary():
    """(entries in dictionary order, {entry: its headword number}): headword g has g % 3 + 1 entries, written
    as GCIDE varies a headword between entries (case, a hyphen or space, an accent as a Unicode letter or in
    GCIDE's ASCII "'e"), and every tenth headword a headless piece after its last entry (GCIDE's index
    splits a few entries at a blank line). The numbers are the truth the split is checked against."""
    spellings = ["Word%d", "word-%d", "W\u00f6rd %d", "WO'RD%d"]
    entries, group = [], {}
    for g in range(300):
        for j in range(g % 3 + 1):
            e = "%s \\Word%d\\, n.\n   Sense %d of headword %d, with caf\u00e9 and \u00bd in it.\n   [1913 Webster]" % (
                spellings[(g + j) % 4] % g, g, j, g)
            entries.append(e)
            group[e] = g
        if g % 10 == 5:
            e = "[1913 Webster]\n\n   %d. (Zool.) A later sense of headword %d." % (g % 3 + 2, g)
            entries.append(e)
            group[e] = g
    return entries, group


@needs_packages("tiktoken", "rustbpe")
class TestGcideOffline(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_gcide_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.entries, self.group = dictionary()
        self.deb = os.path.join(self.dir, "dict-gcide_0_all.deb")
        with open(self.deb, "wb") as f:
            f.write(fake_deb(self.entries))

    def prepare(self, out, *flags):
        return run([sys.executable, "dev/data/gcide.py", "--deb", self.deb, "--out", os.path.join(self.dir, out),
                    "--vocab-size", "300", "--workers", "1"] + list(flags))

    def read_split(self, out):
        """(train documents in shard order, validation documents), decoded from the shards."""
        out = os.path.join(self.dir, out)
        enc, _ = climbmix.read_tokenizer(os.path.join(out, "tokenizer.bin"))
        bos = climbmix.bos_id(enc)
        pieces = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
        train = []
        for i in range(4):
            train += [d.decode("utf-8") for d in shard_documents(os.path.join(out, "train_%06d.bin" % i), pieces, bos)]
        val = [d.decode("utf-8") for d in shard_documents(os.path.join(out, "val_000000.bin"), pieces, bos)]
        return train, val

    def files(self, out, names=FILES):
        """{name: bytes} of the output files."""
        result = {}
        for name in names:
            with open(os.path.join(self.dir, out, name), "rb") as f:
                result[name] = f.read()
        return result

    def test_split_by_headword(self):
        code, text = self.prepare("out")
        self.assertEqual(code, 0, text)
        train, val = self.read_split("out")
        with self.subTest("every entry decodes back exactly once across the splits; dictd's record is not one"):
            self.assertEqual(collections.Counter(train + val), collections.Counter(self.entries))
        train_groups, val_groups = {self.group.get(d) for d in train}, {self.group.get(d) for d in val}
        with self.subTest("no headword has entries on both sides"):
            self.assertEqual(sorted(train_groups & val_groups), [])
        with self.subTest("validation holds a few whole headwords, some of several entries (so the check bites)"):
            sizes = collections.Counter(self.group.get(d) for d in val)
            self.assertTrue(2 <= len(val_groups) <= 20 and max(sizes.values()) >= 2, sizes)
        with self.subTest("prep.json records the seed, the rules and the counts"):
            with open(os.path.join(self.dir, "out", "prep.json")) as f:
                prep = json.load(f)
            self.assertEqual((prep["settings"]["shuffle_seed"], prep["settings"]["prep_version"]), (1234, 2))
            self.assertIn("headword", prep["settings"]["holdout"])
            self.assertEqual((prep["counts"]["train_entries"], prep["counts"]["val_entries"]), (len(train), len(val)))
        with self.subTest("a rerun with the same settings reuses the directory, unchanged"):
            before = self.files("out")
            code, text = self.prepare("out")
            self.assertTrue(code == 0 and "reusing" in text, text)
            self.assertEqual(self.files("out"), before)

    def test_shuffled_and_seeded(self):
        runs = {}
        for out, seed in (("a", "1234"), ("b", "1234"), ("c", "7")):
            code, text = self.prepare(out, "--shuffle-seed", seed)
            self.assertEqual(code, 0, text)
            runs[out] = self.read_split(out)
        train, val = runs["a"]
        position = {e: k for k, e in enumerate(self.entries)}
        with self.subTest("the training entries are not in dictionary order"):
            in_order = sum(position[y] > position[x] for x, y in zip(train, train[1:]))
            self.assertLess(in_order, 0.7 * (len(train) - 1), "%d of %d consecutive pairs in dictionary order" % (in_order, len(train) - 1))
        with self.subTest("the same seed gives the same bytes"):
            self.assertEqual(self.files("a"), self.files("b"))
        with self.subTest("another seed gives another order of the same entries, and the same validation entries"):
            train_c, val_c = runs["c"]
            self.assertNotEqual(train_c, train)
            self.assertEqual(sorted(train_c), sorted(train))
            self.assertEqual(sorted(val_c), sorted(val))

    def refused(self, out, *flags):
        """(exit code, stderr) of gcide.py on an existing output directory."""
        return run([sys.executable, "dev/data/gcide.py", "--deb", self.deb, "--out", os.path.join(self.dir, out),
                    "--vocab-size", "300", "--workers", "1"] + list(flags), want_stdout=False)

    def test_earlier_directory_refused(self):
        code, text = self.prepare("out")
        self.assertEqual(code, 0, text)
        prep = os.path.join(self.dir, "out", "prep.json")
        if os.path.exists(prep):
            os.remove(prep)  # now the files the first gcide.py left (dictionary order): its names, no prep.json
        before = self.files("out", FILES[1:])
        code, err = self.refused("out")
        self.assertTrue(code == 1 and err.count("\n") == 1 and "gcide.py: error:" in err and "earlier gcide.py" in err,
                        "exit %d: %s" % (code, err))
        self.assertEqual(self.files("out", FILES[1:]), before)
        self.assertFalse(os.path.exists(prep))

    def test_other_settings_refused(self):
        code, text = self.prepare("out")
        self.assertEqual(code, 0, text)
        before = self.files("out", FILES[1:])
        with self.subTest("another seed: one error line naming it, nothing changed"):
            code, err = self.refused("out", "--shuffle-seed", "7")
            self.assertTrue(code == 1 and err.count("\n") == 1 and "error:" in err and "shuffle_seed 1234, now 7" in err,
                            "exit %d: %s" % (code, err))
            self.assertEqual(self.files("out", FILES[1:]), before)
        with self.subTest("a prep.json that is not one: one error line"):
            with open(os.path.join(self.dir, "out", "prep.json"), "w") as f:
                f.write("[1, 2")
            code, err = self.refused("out")
            self.assertTrue(code == 1 and err.count("\n") == 1 and "not a gcide.py preparation record" in err,
                            "exit %d: %s" % (code, err))

    def test_bad_seed(self):
        for seed in ("-1", "x"):
            with self.subTest(seed=seed):
                code, err = run([sys.executable, "dev/data/gcide.py", "--deb", self.deb, "--out", os.path.join(self.dir, "o"),
                                 "--shuffle-seed", seed], want_stdout=False)
                self.assertTrue(code == 1 and err.count("\n") == 1 and "gcide.py: error:" in err and "--shuffle-seed" in err,
                                "exit %d: %s" % (code, err))

    def test_not_the_package(self):
        bad = os.path.join(self.dir, "x.deb")
        with open(bad, "wb") as f:
            f.write(b"not an archive")
        code, err = run([sys.executable, "dev/data/gcide.py", "--deb", bad, "--out", os.path.join(self.dir, "o")], want_stdout=False)
        self.assertTrue(code == 1 and err.count("\n") == 1 and "gcide.py: error: not a .deb" in err, "exit %d: %s" % (code, err))


if __name__ == "__main__":
    unittest.main()
