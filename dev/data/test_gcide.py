"""dev/data/gcide.py offline, on a hand-made dict-gcide package (an ar archive holding data.tar.xz with a
dictd dictionary of 120 entries, one of them listed under two headwords): every entry becomes one
document that decodes back exactly, every 50th goes to validation, dictd's own records are left out, and
a file that is not the package is one error line. Needs tiktoken and rustbpe. Run with `make test`."""
import gzip
import io
import os
import shutil
import sys
import tarfile
import tempfile
import lzma
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
from xsatest import needs_packages, run  # noqa: E402
import climbmix  # noqa: E402,F401  (read back with the preparation script's own reader of tokenizer files)
from test_climbmix import shard_documents  # noqa: E402

BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64(n):
    s = ""
    while True:
        s = BASE64[n % 64] + s
        n //= 64
        if n == 0:
            return s


def fake_deb(entries):
    """The bytes of a .deb with usr/share/dictd/gcide.dict.dz and gcide.index holding `entries`."""
    text, index = b"00-database-short\n   a header record\n", ["00-database-short\tA\tm"]
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


@needs_packages("tiktoken", "rustbpe")
class TestGcideOffline(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_gcide_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_entries_to_shards(self):
        entries = ["Word%d \\Word%d\\, n.\n   A meaning numbered %d, with caf\u00e9 and \u00bd in it.\n   [1913 Webster]" % (k, k, k * k)
                   for k in range(120)]
        deb = os.path.join(self.dir, "dict-gcide_0_all.deb")
        with open(deb, "wb") as f:
            f.write(fake_deb(entries))
        out = os.path.join(self.dir, "out")
        code, text = run([sys.executable, "dev/data/gcide.py", "--deb", deb, "--out", out, "--vocab-size", "300", "--workers", "1"])
        self.assertEqual(code, 0, text)

        enc, _ = climbmix.read_tokenizer(os.path.join(out, "tokenizer.bin"))
        bos = climbmix.bos_id(enc)
        pieces = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
        train = []
        for i in range(4):
            train += [d.decode("utf-8") for d in shard_documents(os.path.join(out, "train_%06d.bin" % i), pieces, bos)]
        val = [d.decode("utf-8") for d in shard_documents(os.path.join(out, "val_000000.bin"), pieces, bos)]
        with self.subTest("every 50th entry (49, 99) is validation, the others train, in order, decoding back exactly"):
            self.assertEqual(val, [entries[49], entries[99]])
            self.assertEqual(train, [e for k, e in enumerate(entries) if k not in (49, 99)])
        with self.subTest("a rerun reuses what is there"):
            code, text = run([sys.executable, "dev/data/gcide.py", "--deb", deb, "--out", out, "--vocab-size", "300", "--workers", "1"])
            self.assertTrue(code == 0 and "reusing" in text, text)

    def test_not_the_package(self):
        bad = os.path.join(self.dir, "x.deb")
        with open(bad, "wb") as f:
            f.write(b"not an archive")
        code, err = run([sys.executable, "dev/data/gcide.py", "--deb", bad, "--out", os.path.join(self.dir, "o")], want_stdout=False)
        self.assertTrue(code == 1 and err.count("\n") == 1 and "gcide.py: error: not a .deb" in err, "exit %d: %s" % (code, err))


if __name__ == "__main__":
    unittest.main()
