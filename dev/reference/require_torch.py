"""Imported before torch by the scripts that need PyTorch: without it they end with one error line that
says how to get it, not a traceback."""
import os
import sys

try:
    import torch  # noqa: F401
except ModuleNotFoundError:
    print(f"{os.path.basename(sys.argv[0])}: error: needs the Python package 'torch', which {sys.executable} cannot import: "
          "apt-get install python3-torch, then run it with /usr/bin/python3 (the benchmark's current PyTorch: "
          "python3 -m venv VENV && VENV/bin/pip install torch, then PY=VENV/bin/python)", file=sys.stderr)
    sys.exit(1)
