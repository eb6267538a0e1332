"""What train_gpt does without data flags: the ClimbMix shards that dev/data/climbmix.py wrote into its
default directory when they are there (with their CORE task files, or CORE off), else the embedded corpus,
with a warning when a plan reads it many times over. Standard library only; run with `make test`.
"""
import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402

TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --eval-tokens 256 --sample-every -1".split()
DEVIL = os.path.join(xsatest.REPO, "dev", "data", "devil")


class DefaultData(xsatest.TempDirTest):
    PREFIX = "xsa_defaults_"

    def setUp(self):
        super().setUp()
        for key in ("XSA_DATA_DIR", "HOME"):
            saved = os.environ.get(key)
            self.addCleanup(lambda key=key, saved=saved: os.environ.pop(key, None) if saved is None else os.environ.update({key: saved}))

    def cache(self, with_core):
        """A ClimbMix-style cache directory (the embedded files under climbmix.py's output names)."""
        cache = os.path.join(self.dir, "climbmix")
        os.makedirs(cache)
        for name in ("tokenizer.bin", "train_000000.bin", "val_000000.bin"):
            shutil.copy(os.path.join(DEVIL, name), os.path.join(cache, name))
        if with_core:
            shutil.copytree(os.path.join(xsatest.REPO, "dev", "data", "core_tasks"), os.path.join(cache, "core"))
        os.environ["XSA_DATA_DIR"] = cache
        return cache

    def train(self, *extra):
        return xsatest.run([xsatest.binary("train_gpt_cpu")] + TINY + list(extra))

    def test_climbmix_cache_is_the_default(self):
        cache = self.cache(with_core=False)
        code, out = self.train("-n", "1", "--core-every", "1")
        self.assertEqual(code, 0, out)
        self.assertIn("data: the ClimbMix shards in %s (found there" % cache, out)
        self.assertIn("data: 1 training shard (%s/train_*.bin)" % cache, out)
        self.assertIn("CORE: off, no task files in %s/core" % cache, out)
        self.assertNotIn("CORE: 4 tasks", out)

    def test_climbmix_cache_with_core_tasks(self):
        cache = self.cache(with_core=True)
        code, out = self.train("-n", "1", "--core-every", "1")
        self.assertEqual(code, 0, out)
        self.assertIn("CORE: 4 tasks from %s/core" % cache, out)

    def test_data_flags_win(self):
        self.cache(with_core=False)
        code, out = self.train("-n", "1", "--core-every", "-1", "-i", "dev/data/devil/train_*.bin")
        self.assertEqual(code, 0, out)
        self.assertNotIn("ClimbMix", out)
        self.assertIn("data: 1 training shard (dev/data/devil/train_*.bin)", out)

    def test_data_dir_named_but_unusable(self):
        # XSA_DATA_DIR set on purpose but without the data: one error naming what is missing, not the embedded corpus
        os.makedirs(os.path.join(self.dir, "half"))
        shutil.copy(os.path.join(DEVIL, "tokenizer.bin"), os.path.join(self.dir, "half", "tokenizer.bin"))
        os.environ["XSA_DATA_DIR"] = os.path.join(self.dir, "half")
        xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu")] + TINY + ["-n", "1"], "XSA_DATA_DIR is '%s', which lacks train_*.bin"
                                % os.path.join(self.dir, "half"))

    def test_embedded_corpus_read_many_times_warns(self):
        # no ClimbMix cache: XSA_DATA_DIR unset and a HOME without ~/.cache/xsa-train/climbmix
        os.environ.pop("XSA_DATA_DIR", None)
        os.environ["HOME"] = self.dir
        # 8000 steps of 128 tokens read the 93K tokens 11 times; the warning comes with the data, before the
        # model is built, so a missing --init-from file ends the run right after it
        code, out = self.train("-n", "8000", "--core-every", "-1", "--init-from", os.path.join(self.dir, "missing.safetensors"))
        self.assertEqual(code, 1, out)
        self.assertIn("warning: this plan reads the 93", out)
        self.assertIn("python3 dev/data/climbmix.py", out)
        code, out = self.train("-n", "1", "--core-every", "-1")
        self.assertNotIn("warning: this plan reads", out)


if __name__ == "__main__":
    unittest.main()
