"""dev/plot_run.py on real train_gpt runs (two tiny runs, without and with XSA): the four PNG files, whole
and of the drawn size; its errors on bad input and without matplotlib. Run with `make test`."""
import os
import shlex
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "test"))
import xsatest  # noqa: E402
from xsatest import binary, check_one_error, needs_packages, run  # noqa: E402

PLOT = [sys.executable, "dev/plot_run.py"]
TINY = "-d 2 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-every 2 --eval-tokens 256 --sample-every -1 --core-every -1 -n 4"
# figure size (inches) x 110 dpi, as plot_run.py draws them
SIZES = {"loss.png": (1320, 495), "schedule.png": (1320, 495), "speed.png": (770, 495), "diagnostics.png": (1320, 880)}


def png_size(path):
    """(width, height) from a PNG file's IHDR chunk, or None if it is not a PNG."""
    data = xsatest.read(path)
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


@needs_packages("matplotlib")
class TestPlots(xsatest.TempDirTest):
    PREFIX = "xsa_plot_"

    def test_two_runs_overlaid(self):
        for name, extra in (("base", ""), ("xsa", " -x 1")):
            code, out = run([binary("train_gpt_cpu")] + shlex.split(TINY + extra + " -o " + self.q(name)))
            self.assertEqual(code, 0, out[-1500:])
        code, out = run(PLOT + [self.path("base"), self.path("xsa")])
        self.assertEqual(code, 0, out)
        plots = self.path("base", "plots")
        self.assertEqual(out.split(), [os.path.join(plots, n) for n in ("loss.png", "schedule.png", "speed.png", "diagnostics.png")])
        for name, size in SIZES.items():
            with self.subTest("%s: a whole PNG of %dx%d pixels" % (name, *size)):
                self.assertEqual(png_size(os.path.join(plots, name)), size)
        self.assertFalse([n for n in os.listdir(plots) if n.endswith(".tmp")])
        code, out = run(PLOT + [os.path.join(self.path("xsa"), "metrics.jsonl"), "--out", self.path("elsewhere")])
        with self.subTest("one run given as its metrics.jsonl, --out DIR"):
            self.assertTrue(code == 0 and all(png_size(self.path("elsewhere", n)) == s for n, s in SIZES.items()), out)

    def test_bad_input(self):
        self.write("bad.jsonl", '{"step": 0, "kind": "train", "loss": 1.0}\n')
        check_one_error(self, PLOT + [self.path("nowhere")], "neither a run directory", anywhere=True)
        check_one_error(self, PLOT + [self.path("bad.jsonl")], "'dt_ms'", anywhere=True)
        check_one_error(self, PLOT + [self.path("bad.jsonl"), "--bogus"], "plot_run.py: error: unrecognized arguments: --bogus (see --help)",
                        anywhere=True)


class TestWithoutMatplotlib(unittest.TestCase):
    def test_missing_package(self):
        script = ("import sys, runpy; sys.modules['matplotlib'] = None; sys.argv = ['plot_run.py', 'x']; "
                  "runpy.run_path('dev/plot_run.py', run_name='__main__')")
        code, err = run([sys.executable, "-c", script], want_stdout=False)
        self.assertTrue(code == 1 and err.count("\n") == 1 and "needs the Python package 'matplotlib'" in err and
                        "-m pip install -r dev/requirements.txt" in err, "exit %d: %s" % (code, err))


if __name__ == "__main__":
    unittest.main()
