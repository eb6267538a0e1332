#!/usr/bin/env python3
"""The committed reference files are what the PyTorch reference makes of them now, and the reference passes its
own checks. The C++ suites compare the trainer with dev/reference/data/*.safetensors; this suite makes sure those
files are not stale or edited by hand: it copies dev/reference (and dev/data/core_tasks, which make_core_ref.py
scores) into a temporary directory, deletes there every file the generators write, runs make_refs.py,
make_optim_refs.py and make_core_ref.py, and compares what they wrote with the committed files; then it runs
check_reference.py and check_optim.py ("N passed, N failed", exit 0).

    python3 dev/reference/test_reference_files.py        (or all suites: make test)

Every file: the same tensors (names, dtypes, shapes, in order) and the same metadata, and
  * integer tensors (token ids, CORE's per-item verdicts): equal;
  * float tensors: |new - committed| <= 1e-6 |committed| (L2 over the tensor). They hold a float64 truth
    stored in float32 (one rounding: 6e-8); another CPU's BLAS may change the float64 values in their last
    bits, which can move an element by one float32 step, nothing near 1e-6, while any change to the model,
    the optimizer or a seed moves them by far more;
  * diag.* (cosines and attention weights, between -1 and 1; cos(z, v) is 0 at alpha 1, so its relative error
    means nothing): max |new - committed| <= 1e-6;
  * tol_bf16.* (the CUDA suite's bf16 tolerances, make_refs.py: mean + 4 sd of 8 stochastically rounded runs,
    a statistic of a few draws): within a factor 1.5 of the committed value. Measured on 2026-12-06: the nine
    files written on 2026-11-29 come back with tolerances up to 17% away (gpu_xsa_d64's loss), also when
    made here by the scripts of that day, so it is not the scripts (the machine or torch build that wrote them
    is not recorded); every other tensor of every file came back bit for bit (cos(z, v) at alpha 1 within 1e-16).

The chat scores (score_chat.py, 30 s and a sandbox) and the nanochat checkpoint (make_nanochat_ckpt.py, which
needs a prepared tokenizer) are left out. Needs an interpreter that imports torch (xsatest.torch_python;
Debian's python3-torch): the suite skips without one, saying so, and fails in CI (.ci/run installs it).
About 30 s of CPU.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test"))
import xsatest  # noqa: E402
from xsatest import REPO  # noqa: E402

PYTHON, TRIED = xsatest.torch_python()
REFERENCE = os.path.join(REPO, "dev", "reference")
GENERATORS = ("make_refs.py", "make_optim_refs.py", "make_core_ref.py")
INPUTS = ("core_model.safetensors", "chat_model.safetensors")  # models the generators read, not what they write
FLOAT_REL = 1e-6
DIAG_ABS = 1e-6
TOL_FACTOR = 1.5


def read_safetensors(path):
    """(metadata, [(name, dtype, shape, values as a tuple)]) in file order. Standard library only: the
    comparison must not depend on what this interpreter has installed."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    data = raw[8 + n:]
    formats = {"F32": "f", "I32": "i", "F64": "d", "I64": "q"}
    tensors = []
    for name, t in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        begin, end = t["data_offsets"]
        fmt = formats[t["dtype"]]
        count = (end - begin) // struct.calcsize(fmt)
        tensors.append((name, t["dtype"], t["shape"], struct.unpack("<%d%s" % (count, fmt), data[begin:end])))
    return metadata, tensors


def differences(new_path, committed_path):
    """The ways the regenerated file breaks this suite's rules against the committed one: [] when it keeps them."""
    new_meta, new = read_safetensors(new_path)
    old_meta, old = read_safetensors(committed_path)
    if new_meta != old_meta:
        return ["metadata: %s, committed %s" % (new_meta, old_meta)]
    if [t[:3] for t in new] != [t[:3] for t in old]:
        return ["tensors (name, dtype, shape): %s, committed %s" % ([t[:3] for t in new], [t[:3] for t in old])]
    found = []
    for (name, dtype, _, x), (_, _, _, y) in zip(new, old):
        if dtype in ("I32", "I64"):
            if x != y:
                found.append("%s: %d of %d integers differ" % (name, sum(a != b for a, b in zip(x, y)), len(y)))
        elif name.startswith("tol_bf16."):
            ratio = max(x[0] / y[0], y[0] / x[0]) if x[0] > 0 and y[0] > 0 else math.inf
            if ratio > TOL_FACTOR:
                found.append("%s: %.3g, committed %.3g (factor %.2f > %.1f)" % (name, x[0], y[0], ratio, TOL_FACTOR))
        elif name.startswith("diag."):
            worst = max(abs(a - b) for a, b in zip(x, y))
            if not worst <= DIAG_ABS:
                found.append("%s: max |difference| %.3g > %.0e" % (name, worst, DIAG_ABS))
        else:
            diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, y)))
            norm = math.sqrt(sum(b * b for b in y))
            if not diff <= FLOAT_REL * norm:
                found.append("%s: |difference| %.3g > %.0e x |committed| %.3g" % (name, diff, FLOAT_REL, norm))
    return found


def run_script(copy, script):
    """(exit code, output) of one script of the copied dev/reference, with the torch interpreter."""
    p = subprocess.run([PYTHON, os.path.join(copy, "dev", "reference", script)], cwd=copy, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=900)
    return p.returncode, p.stdout.decode(errors="replace")


class TestRules(xsatest.TempDirTest):
    """The comparison itself, on files made here (no torch): it must catch what it is there to catch."""

    def write_file(self, path, tensors, metadata=None):
        header, blobs, offset = {"__metadata__": metadata or {"config": "x"}}, [], 0
        for name, dtype, values in tensors:
            blob = struct.pack("<%d%s" % (len(values), "f" if dtype == "F32" else "i"), *values)
            header[name] = {"dtype": dtype, "shape": [len(values)], "data_offsets": [offset, offset + len(blob)]}
            blobs.append(blob)
            offset += len(blob)
        text = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))

    def check(self, new, committed, metadata=None):
        self.write_file(self.path("new"), new, metadata)
        self.write_file(self.path("old"), committed)
        return differences(self.path("new"), self.path("old"))

    def test_rules(self):
        """Within each rule passes; past it, a changed integer, name, shape or metadata fails, each said."""
        base = [("logits", "F32", [1.0, -2.0, 3.0]), ("idx", "I32", [1, 2, 3]), ("diag.cos_zv", "F32", [1e-9, 0.0]),
                ("tol_bf16.loss", "F32", [0.01])]

        def edit(name, values):
            return [(n, t, values if n == name else v) for n, t, v in base]
        self.assertEqual(self.check(base, base), [])
        self.assertEqual(self.check(edit("logits", [1.0, -2.0, 3.000001]), base), [])  # 2.7e-7 relative
        self.assertEqual(self.check(edit("diag.cos_zv", [-5e-7, 4e-7]), base), [])
        self.assertEqual(self.check(edit("tol_bf16.loss", [0.0145]), base), [])
        for name, values, said in (("logits", [1.0, -2.0, 3.00001], "logits: |difference|"),
                                   ("idx", [1, 2, 4], "idx: 1 of 3 integers differ"),
                                   ("diag.cos_zv", [2e-6, 0.0], "diag.cos_zv: max |difference|"),
                                   ("tol_bf16.loss", [0.0051], "tol_bf16.loss: 0.0051, committed 0.01"),
                                   ("tol_bf16.loss", [0.016], "factor 1.60")):
            found = self.check(edit(name, values), base)
            self.assertEqual(len(found), 1, found)
            self.assertIn(said, found[0])
        self.assertIn("tensors (name, dtype, shape)", self.check(base[:3], base)[0])
        self.assertIn("tensors (name, dtype, shape)", self.check(edit("logits", [1.0, -2.0]), base)[0])
        self.assertIn("metadata", self.check(base, base, {"config": "y"})[0])


@xsatest.needs_torch(PYTHON, TRIED)
class TestReferenceFiles(xsatest.TempDirTest):
    def copy_reference(self, keep_generated):
        """This repository's dev/reference and dev/data/core_tasks under self.dir; the generated files deleted
        unless keep_generated."""
        copy = self.path("repo")
        for part in (("reference",), ("data", "core_tasks")):
            shutil.copytree(os.path.join(REPO, "dev", *part), os.path.join(copy, "dev", *part),
                            ignore=shutil.ignore_patterns("__pycache__"))
        for name in [] if keep_generated else self.generated():
            os.remove(os.path.join(copy, "dev", "reference", "data", name))
        return copy

    @staticmethod
    def generated():
        return sorted(n for n in os.listdir(os.path.join(REFERENCE, "data"))
                      if n.endswith(".safetensors") and n not in INPUTS)

    def test_regenerated_files_match(self):
        """make_refs.py, make_optim_refs.py and make_core_ref.py write every committed reference file again, each
        within the rules above; no file they write is missing from the repository."""
        copy = self.copy_reference(keep_generated=False)
        for script in GENERATORS:
            code, out = run_script(copy, script)
            self.assertEqual(code, 0, script + ":\n" + out)
        data = os.path.join(copy, "dev", "reference", "data")
        written = sorted(n for n in os.listdir(data) if n.endswith(".safetensors") and n not in INPUTS)
        self.assertEqual(written, self.generated())
        self.assertGreaterEqual(len(written), 17)
        for name in written:
            with self.subTest(file=name):
                self.assertEqual(differences(os.path.join(data, name), os.path.join(REFERENCE, "data", name)), [])

    def test_self_checks(self):
        """check_reference.py (the model against finite differences, its identities) and check_optim.py (the
        optimizer files recomputed) pass: exit 0, "N passed, 0 failed" with N > 0."""
        copy = self.copy_reference(keep_generated=True)
        for script in ("check_reference.py", "check_optim.py"):
            with self.subTest(script=script):
                code, out = run_script(copy, script)
                self.assertEqual(code, 0, out)
                self.assertRegex(out.rstrip("\n").split("\n")[-1], r"^[1-9][0-9]* passed, 0 failed$", out)


if __name__ == "__main__":
    unittest.main()
