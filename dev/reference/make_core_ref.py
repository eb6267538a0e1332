#!/usr/bin/env python3
"""
The reference for the CORE test of dev/test/test_infra.cu: score_core.py (PyTorch, float64) scores the committed
tiny model dev/reference/data/core_model.safetensors (exported by train_gpt after 300 steps on the
embedded corpus) on dev/data/core_tasks/, and this script stores what it found in
dev/reference/data/core_scores.safetensors:
  core.value F32 [1]                  the CORE value
  core.<label>.correct I32 [items]    per item, 1 if the model got it right
  core.<label>.losses F32 [items, k]  per multiple-choice / schema item, each option's mean span loss
Run from anywhere with /usr/bin/python3 (needs torch).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io  # noqa: E402

MODEL = os.path.join(HERE, "data", "core_model.safetensors")
TASKS = os.path.join(HERE, "..", "data", "core_tasks")
OUT = os.path.join(HERE, "data", "core_scores.safetensors")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        scores_path = os.path.join(tmp, "scores.json")
        subprocess.run([sys.executable, os.path.join(HERE, "score_core.py"), "--weights", MODEL, "--tasks", TASKS,
                        "--out", scores_path], check=True)
        scores = json.load(open(scores_path))
    tensors = {"core.value": np.array([scores["core"]], dtype=np.float32)}
    for task in scores["tasks"]:
        label = task["label"]
        tensors[f"core.{label}.correct"] = np.array([it["correct"] for it in task["items"]], dtype=np.int32)
        if task["type"] != "language_modeling":
            tensors[f"core.{label}.losses"] = np.array([it["losses"] for it in task["items"]], dtype=np.float32)
    safetensors_io.save(OUT, tensors, {"format": "xsa-core-ref-1", "tasks": ",".join(t["label"] for t in scores["tasks"])})
    print(f"wrote {OUT}: CORE {scores['core']:.6f}")


if __name__ == "__main__":
    main()
