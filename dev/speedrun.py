#!/usr/bin/env python3
"""The study from nothing to its report in one command, as nanochat's `bash runs/speedrun.sh`:

    python3 dev/speedrun.py --depth 24 [--seeds 1,2,3] [--xsa 1.0] [--ranks 8] [--out DIR] [--data-dir DIR]
                            [--num-shards N] [--vocab-size V] [--dry-run] [--offline-fixtures DIR] [--cpu]
                            [--extra-flags="TRAIN_GPT FLAGS"] [--sft-flags="CHAT_SFT FLAGS"] [--prep-flags STAGE="FLAGS"]

Five stages, in order, each the command the README gives for it:

  1. data         dev/data/climbmix.py: ClimbMix shards (train 0..N-1 and validation shard 6542), nanochat's
                  tokenizer, token shards and their row-group files, into the data directory
  2. core_tasks   dev/data/core.py twice: CORE's task files with nanochat's 500 items per task (CORE during
                  training) into DATA/core_tasks_500, and with every item (the full CORE after each run) into
                  DATA/core_tasks
  3. sft_data     dev/data/sft.py --mixture study: the study's SFT mixture into DATA/sft
  4. chat_tasks   dev/data/chat_eval.py --spellingbee: the study's six ChatCORE tasks into DATA/chat_tasks
  5. study        dev/study.py on the study file this script writes into OUT (modelled on
                  dev/studies/paper_d24.json: the study's optimizer --muon-eq 0 --muon-plus 0, --ranks, every data
                  path named, --keep-checkpoints 2, "sft" and "core_final"): the base runs of baseline and XSA
                  over the seeds, then each finished run's SFT + ChatCORE (chat_sft), then its CORE on every
                  item (eval_core), then OUT/report.md

A stage whose outputs are complete is skipped, so running the same command again goes on where it stopped
(the scripts themselves reuse what they finished: climbmix.py keeps downloaded files, tokenizer.bin and
complete shards; core.py, sft.py and chat_eval.py write their index or metadata file last; study.py skips
finished runs and resumes interrupted ones from their checkpoints). How each stage is judged complete:
  data        DATA/tokenizer.bin of --vocab-size, and train_000000.bin .. train_{N-1}.bin and val_000000.bin
              complete (climbmix.read_shard_header: the size matches the header's count) with a current
              .rowgroups file beside each (climbmix.row_groups_current)
  core_tasks  per directory: index.txt (core.py writes it last), every task file it lists there with CORE's
              magic, the tokenizer's vocabulary and BOS, and the items-per-task setting (500, or -1 = all)
  sft_data    DATA/sft/sft_meta.json (sft.py writes it last) of the study mixture, made with this tokenizer
              (its SHA-256) from this source (the hub, or the fixtures), and both conversation files
  chat_tasks  DATA/chat_tasks/index.txt (written last) listing SpellingBee among its tasks, every file with
              ChatCORE's magic, the tokenizer's vocabulary and BOS, all items
  study       every (arm, seed) run finished (study.run_state), its sft/ run finished, its core_final.csv
              written, and OUT/report.md newer than all of them
The checks look at the outputs, not at the flags that made them: to redo a stage with other flags, delete
its outputs (or give another --data-dir / --out).

--dry-run prints every command, says which stages are done, and per stage the disk, time and memory it needs:
estimates, labelled so, from the documented numbers (dev/data/README.md "How many shards", the d24
performance model of dev/docs/performance.md) and from the trainer's own plan (`train_gpt ... -n 0`: the
parameters, the memory plan per rank and the step count), run with a stand-in tokenizer of the same
vocabulary (the -n 0 plan depends on the data only through it). Nothing is written.

--offline-fixtures DIR downloads nothing: DIR/parquet holds parquet files (climbmix.py --parquet-dir: sorted,
the last one validation), DIR/core_bundle a CORE bundle (core.py --bundle), DIR/sft the SFT sources (sft.py
--source, with identity_conversations.jsonl and words_alpha.txt), DIR/chat the ChatCORE sources (chat_eval.py
--source, with words_alpha.txt). dev/test_speedrun.py builds one from dev/data/make_test_parquet.py and the
committed mini bundles.

The trainer is ./train_gpt built for CUDA (make train_gpt on a GPU machine), with ./chat_sft and
./eval_core_cuda beside it; --cpu takes ./train_gpt_cpu, ./chat_sft and ./eval_core instead (tiny tests only).
A SIGINT or SIGTERM is passed on to the running stage (study.py passes it to the trainer, which writes a
checkpoint); rerun the same command to go on. Every bad input ends with one "error:" line and exit code 1; a
stage that fails stops the run with the stage named and the command to rerun.

Standard library only.
"""
import json
import math
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

DEV = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(DEV)
sys.path.insert(0, DEV)
sys.path.insert(0, os.path.join(DEV, "data"))
import climbmix  # noqa: E402  (dev/data/climbmix.py: the standard library at import; its packages load where used)
import study  # noqa: E402  (dev/study.py)
import xsa_cli  # noqa: E402  (dev/xsa_cli.py)

# The documented numbers the estimates use
DOC_SHARDS = {12: 40, 24: 120}  # dev/data/README.md "How many shards" (with margin)
SHARD_TOKENS = 60e6             # ~60M tokens per ClimbMix shard with the 32768-token tokenizer (README: an estimate)
PACKING_KEPT = 0.65             # best-fit packing at T = 2048 keeps ~65% of the document tokens (README)
SHARD_MARGIN = 1.17             # the margin of README's 120 over its 103 shards for d24
PARQUET_MB = 100                # a ClimbMix shard is ~100 MB of parquet holding >= 250M characters (README)
SHARD_CHARS = 250e6
TIKTOKEN_MB_S = 7.5             # tiktoken's encode_ordinary, one thread, a loaded 2-core VM (README, "Speed")
H200_PEAK = 989e12              # bf16 dense FLOP/s, and the d24 model's 37-46% MFU (dev/docs/performance.md, an estimate)
MFU_RANGE = (0.37, 0.46)
DATA_PACKAGES = ["rustbpe", "tiktoken", "pyarrow", "numpy"]  # dev/data/requirements.txt, as the data scripts import them

CORE_MAGIC, CHAT_MAGIC, SFT_MAGIC, TOKENIZER_MAGIC = 20241202, 20261203, 20261202, 20241201
STAGE_FLAGS = ("data", "core_tasks", "sft_data", "chat_tasks")  # --prep-flags STAGE=...
# flags the speedrun sets itself: not in --extra-flags (train_gpt) ...
OWN_TRAIN_FLAGS = {"-d", "--depth", "--ranks", "-i", "--train", "-j", "--val", "--tokenizer", "--core-tasks"}
# ... nor in --sft-flags (chat_sft)
OWN_SFT_FLAGS = {"--sft", "--init-from", "-o", "--output", "--resume", "--chatcore-tasks"}


class SpeedrunError(Exception):
    pass


def log(msg=""):
    print(msg, flush=True)


def show(path):
    """A path as printed: relative to the repository root (where every command runs) when inside it."""
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel if os.sep in rel else "./" + rel


def python_word():
    which = shutil.which("python3")
    return "python3" if which and os.path.realpath(which) == os.path.realpath(sys.executable) else show(sys.executable)


def show_argv(argv):
    """A command as printed: python3 for this interpreter, paths inside the repository relative to it."""
    return shlex.join([python_word() if w == sys.executable else show(w) if os.path.isabs(w) else w for w in argv])


def gb(n_bytes):
    return f"{n_bytes / 1e9:,.1f} GB"


def duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def flag_names(flags):
    return [w.split("=", 1)[0] for w in shlex.split(flags) if w.startswith("-") and not re.fullmatch(r"-[0-9.]+", w)]


# ----------------------------------------------------------------------------------------------------
# The command line

def parse_args(argv):
    p = xsa_cli.ArgumentParser(prog="speedrun.py", description="The study from nothing to its report in one command: data, "
                               "tokenizer, CORE tasks, SFT data, ChatCORE tasks, base runs of baseline and XSA over seeds, SFT + "
                               "ChatCORE, full CORE, report. Rerun the same command to go on where it stopped.")
    p.add_argument("--depth", type=int, required=True, help="the model's depth (-d): 12 or 24 as the study, any other too")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds; every arm runs each (default 1,2,3, paper_d24's)")
    p.add_argument("--xsa", default="1.0", help="the XSA arm's alpha, in (0, 1], or learn (default 1.0)")
    p.add_argument("--ranks", type=int, default=8, help="GPUs per run (default 8, the study's: its data order depends on it)")
    p.add_argument("--out", help="the study's directory (default dev/studies/out/speedrun_dN)")
    p.add_argument("--data-dir", help="where the prepared data go (climbmix.py's --out; default $XSA_DATA_DIR or "
                   "~/.cache/xsa-train/climbmix, where the trainer looks); downloaded parquet files in DIR/parquet")
    p.add_argument("--num-shards", type=int, help="ClimbMix train shards (default 40 at d12, 120 at d24 as dev/data/README.md "
                   "says; other depths from the trainer's plan)")
    p.add_argument("--vocab-size", type=int, default=32768, help="the tokenizer's vocabulary (default 32768, nanochat's)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, what is done and the estimates; run nothing")
    p.add_argument("--offline-fixtures", metavar="DIR", help="download nothing: the sources in DIR/parquet, DIR/core_bundle, "
                   "DIR/sft, DIR/chat (tests)")
    p.add_argument("--cpu", action="store_true", help="the CPU backend: ./train_gpt_cpu, ./chat_sft, ./eval_core (tiny tests only)")
    p.add_argument("--extra-flags", default="", help="train_gpt flags added to every base run (write --extra-flags=\"...\")")
    p.add_argument("--sft-flags", default="", help="chat_sft flags added to every SFT run (write --sft-flags=\"...\")")
    p.add_argument("--prep-flags", action="append", default=[], metavar="STAGE=FLAGS",
                   help=f"flags added to one preparation stage's script, STAGE one of {', '.join(STAGE_FLAGS)} (repeatable)")
    args = p.parse_args(argv)
    if args.depth < 1:
        p.error(f"--depth must be >= 1, not {args.depth}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds must be comma-separated whole numbers, not '{args.seeds}'")
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        p.error(f"--seeds must be distinct non-negative whole numbers, not '{args.seeds}'")
    args.seeds = seeds
    if args.xsa != "learn":
        try:
            alpha = float(args.xsa)
        except ValueError:
            alpha = math.nan
        if not 0.0 < alpha <= 1.0:
            p.error(f"--xsa must be an alpha in (0, 1] or learn, not '{args.xsa}'")
    if args.ranks < 1:
        p.error(f"--ranks must be >= 1, not {args.ranks}")
    if args.vocab_size < climbmix.MIN_VOCAB:
        p.error(f"--vocab-size must be >= {climbmix.MIN_VOCAB} (256 bytes, 9 special tokens, 1 merge), not {args.vocab_size}")
    if args.num_shards is not None:
        if args.offline_fixtures:
            p.error("--num-shards with --offline-fixtures: the fixtures' parquet files decide the shards")
        if not 1 <= args.num_shards <= climbmix.MAX_SHARD:
            p.error(f"--num-shards must be in 1..{climbmix.MAX_SHARD}, not {args.num_shards}")
    for option, value, own in (("--extra-flags", args.extra_flags, OWN_TRAIN_FLAGS | set(study.ARM_FLAGS) | study.RUNNER_FLAGS),
                               ("--sft-flags", args.sft_flags, OWN_SFT_FLAGS | study.RUNNER_FLAGS)):
        try:
            names = flag_names(value)
        except ValueError as e:
            p.error(f"{option}: {e}")
        bad = [n for n in names if n in own]
        if bad:
            p.error(f"{option} sets {bad[0]}, which the speedrun sets itself (its own options, the arms or the runner)")
    args.steps = None
    words = shlex.split(args.extra_flags)
    for i, w in enumerate(words):
        name, eq, value = w.partition("=")
        if name in ("-n", "--steps"):
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if not value.isdigit() or int(value) < 1:
                p.error(f"--extra-flags sets {name} {value}: the runs need at least 1 step (--dry-run shows the plan)")
            args.steps = int(value)
    prep = {}
    for item in args.prep_flags:
        stage, eq, flags = item.partition("=")
        if not eq or stage not in STAGE_FLAGS:
            p.error(f"--prep-flags takes STAGE=FLAGS with STAGE one of {', '.join(STAGE_FLAGS)}, not '{item}'")
        try:
            prep[stage] = prep.get(stage, []) + shlex.split(flags)
        except ValueError as e:
            p.error(f"--prep-flags {stage}: {e}")
    args.prep = prep
    return args


# ----------------------------------------------------------------------------------------------------
# Files: headers read the way the formats of dev/data/README.md lay them out

def read_ints(path, n):
    try:
        with open(path, "rb") as f:
            head = f.read(4 * n)
    except OSError:
        return None
    return struct.unpack(f"<{n}i", head) if len(head) == 4 * n else None


def tokenizer_info(path):
    """(vocab size, BOS id) of a tokenizer file, or None."""
    h = read_ints(path, 4)
    return (h[2], h[3]) if h and h[0] == TOKENIZER_MAGIC else None


def task_dir_state(directory, magic, tok, vocab_bos, max_field, max_value, need_label=None):
    """(done, why) of a CORE or ChatCORE task directory: index.txt (written last), every file it lists with the
    format's magic, the tokenizer's (vocabulary, BOS) `tok` in the header fields vocab_bos, and the items-per-task
    setting max_value in field max_field."""
    index = os.path.join(directory, "index.txt")
    try:
        with open(index, encoding="utf-8") as f:
            lines = [line.split() for line in f if line.strip()]
    except OSError:
        return False, f"no {show(index)}"
    if not lines:
        return False, f"{show(index)} lists no tasks"
    if need_label and need_label not in [l[1] for l in lines if len(l) > 1]:
        return False, f"{show(index)} has no {need_label} task"
    for line in lines:
        path = os.path.join(directory, line[0])
        h = read_ints(path, 16)
        if not h or h[0] != magic:
            return False, f"{show(path)} is missing or not a task file"
        if (h[vocab_bos[0]], h[vocab_bos[1]]) != tok:
            return False, f"{show(path)} was made with another tokenizer (vocabulary {h[vocab_bos[0]]}, BOS {h[vocab_bos[1]]})"
        if h[max_field] != max_value:
            return False, f"{show(path)} holds at most {h[max_field]} items per task, not {max_value}"
    return True, f"{show(directory)}: {len(lines)} task files"


# ----------------------------------------------------------------------------------------------------
# The trainer's plan (-n 0) with a stand-in tokenizer of the run's vocabulary

def write_standin(directory, vocab):
    """A tokenizer file of `vocab` tokens (the 256 bytes, distinct 2- or 3-byte pieces for the merges, the 9 specials;
    no prompts) and two tiny token shards: what `train_gpt -n 0` reads (the tokenizer's vocabulary; the shards'
    names). Returns (train glob, val glob, tokenizer path)."""
    specials = climbmix.SPECIAL_TOKENS
    n_merges = vocab - 256 - len(specials)
    pieces = [bytes([b]) for b in range(256)]
    width = 2
    while len(pieces) < 256 + n_merges:
        for k in range(256 ** width):
            if len(pieces) == 256 + n_merges:
                break
            pieces.append(k.to_bytes(width, "big"))
        width += 1
    pattern = climbmix.SPLIT_PATTERN.encode("utf-8")
    header = [0] * 256
    header[:6] = [TOKENIZER_MAGIC, 2, vocab, vocab - len(specials), 0, len(pattern)]
    body = [struct.pack("<256i", *header), pattern]
    body += [struct.pack("<BI", 0, len(p)) + p for p in pieces]
    body += [struct.pack("<BI", 1, len(s.encode())) + s.encode() for s in specials]
    tok = os.path.join(directory, "tokenizer.bin")
    with open(tok, "wb") as f:
        f.write(b"".join(body))
    bos = vocab - len(specials)
    version = climbmix.shard_version(vocab)
    for name in ("train_000000.bin", "val_000000.bin"):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(climbmix.shard_header(2, version) + struct.pack("<2H" if version == 1 else "<2I", bos, 0))
    return os.path.join(directory, "train_*.bin"), os.path.join(directory, "val_*.bin"), tok


PLAN_FIELDS = {
    "backend": r"^backend: (.*)$",
    "batch": r"activations for B=(\d+)",
    "params": r"^parameters: .*\btotal (\d+)",
    "flops": r"FLOPs/token \(6N \+ attention\): ([0-9.e+-]+)",
    "mem_params": r"^memory plan[^:]*: parameters ([0-9.]+) MiB",
    "mem_opt": r"optimizer state ([0-9.]+) MiB",
    "mem_opt_all": r"the largest share of ([0-9.]+) MiB",
    "mem_total": r"; total ([0-9.]+) MiB \(",
    "mem_free": r"\((?:free on the GPU|available on this machine): ([0-9.]+) MiB\)",
    "steps": r"^plan: (\d+) steps x",
    "step_tokens": r"^plan: \d+ steps x (\d+) tokens",
}


def trainer_plan(trainer, flags_of, vocab):
    """The trainer's -n 0 output for the base flags (flags_of(train, val, tokenizer) -> words) with a stand-in
    tokenizer: {"argv", "lines", field: value}. A trainer that refuses the flags is an error (its own line)."""
    with tempfile.TemporaryDirectory(prefix="speedrun_plan_") as tmp:
        train, val, tok = write_standin(tmp, vocab)
        argv = [trainer] + flags_of(train, val, tok) + ["-o", os.path.join(tmp, "out"), "-n", "0"]  # (--save-every needs an -o)
        try:
            p = subprocess.run(argv, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SpeedrunError(f"cannot run the trainer's plan ({show(trainer)} ... -n 0): {e}")
    text = (p.stdout + p.stderr).replace(tmp, "STAND-IN")
    if p.returncode != 0:
        last = [l for l in text.splitlines() if l.strip()][-1:] or [f"exit {p.returncode}"]
        raise SpeedrunError(f"the trainer refuses the study's flags ({show(trainer)} ... -n 0): {last[0]}")
    # the plan's data lines are about the stand-in's two tokens, not the study's data: left out
    lines = [l for l in text.splitlines() if not l.startswith(("data: ", "warning: this plan reads ", "note: "))]
    plan = {"argv": [show(trainer)] + [w.replace(tmp, "STAND-IN") for w in argv[1:]], "lines": lines}
    for key, rx in PLAN_FIELDS.items():
        m = next((re.search(rx, l) for l in plan["lines"] if re.search(rx, l)), None)
        plan[key] = (m.group(1) if key == "backend" else float(m.group(1))) if m else None
    plan["cpu_backend"] = bool(plan["backend"] and plan["backend"].startswith("CPU"))
    return plan


# ----------------------------------------------------------------------------------------------------
# The speedrun

class Step:
    """One command of a stage and the check of its outputs: check() -> (done, why); before() runs first."""

    def __init__(self, argv, check, before=None):
        self.argv, self.check, self.before = argv, check, before


class Speedrun:
    def __init__(self, args):
        self.args = args
        self.depth = args.depth
        env = os.environ.get("XSA_DATA_DIR")  # ("none": the trainer's embedded corpus, no data directory)
        self.data = os.path.abspath(os.path.expanduser(args.data_dir or (env if env != "none" else None) or
                                                       os.path.join("~", ".cache", "xsa-train", "climbmix")))
        self.out = (os.path.abspath(os.path.expanduser(args.out)) if args.out else
                    os.path.join(REPO, "dev", "studies", "out", f"speedrun_d{args.depth}"))
        self.study_file = os.path.join(self.out, "study.json")
        self.fixtures = os.path.abspath(os.path.expanduser(args.offline_fixtures)) if args.offline_fixtures else None
        self.py = sys.executable
        self.arms = {"baseline": "", "xsa": f"-x {args.xsa}"}
        self.runs = [(arm, seed, study.run_dir_of(self.out, "", arm, seed)) for seed in args.seeds for arm in self.arms]
        self.plan = None
        self.plan_note = None
        self.num_shards = None
        self.parquet = []
        if self.fixtures:
            if not os.path.isdir(self.fixtures):
                raise SpeedrunError(f"--offline-fixtures {args.offline_fixtures}: no such directory")
            for sub in ("parquet", "core_bundle", "sft", "chat"):
                if not os.path.isdir(os.path.join(self.fixtures, sub)):
                    raise SpeedrunError(f"--offline-fixtures {args.offline_fixtures}: no {sub}/ in it (it needs parquet/, "
                                        "core_bundle/, sft/ and chat/)")
            pq = os.path.join(self.fixtures, "parquet")
            self.parquet = sorted(f for f in os.listdir(pq) if f.endswith(".parquet"))
            if len(self.parquet) < 2:
                raise SpeedrunError(f"{pq}: needs at least 2 parquet files (train files, then the last one as validation)")
            self.num_shards = len(self.parquet) - 1
        elif args.num_shards is not None:
            self.num_shards = args.num_shards
        elif args.depth in DOC_SHARDS:
            self.num_shards = DOC_SHARDS[args.depth]
        self.tok_path = os.path.join(self.data, "tokenizer.bin")
        # the binaries: the trainer, and chat_sft and eval_core beside it, as study.py finds them
        self.trainer = os.path.join(REPO, "train_gpt_cpu" if args.cpu else "train_gpt")
        self.binaries = [self.trainer, os.path.join(REPO, "chat_sft"), study.core_final_binary(self.trainer)]

    # --- the study file
    def base_flags(self, train=None, val=None, tok=None):
        return (["-d", str(self.depth), "--muon-eq", "0", "--muon-plus", "0", "--ranks", str(self.args.ranks),
                 "--save-every", "500", "--keep-checkpoints", "2",
                 "-i", train or os.path.join(self.data, "train_*.bin"), "-j", val or os.path.join(self.data, "val_*.bin"),
                 "--tokenizer", tok or self.tok_path, "--core-tasks", os.path.join(self.data, "core_tasks_500")] +
                shlex.split(self.args.extra_flags))

    def study_spec(self):
        d = self.data
        return {"name": f"speedrun_d{self.depth}",
                "note": (f"Written by dev/speedrun.py (the protocol of dev/studies/paper_d24.json at depth {self.depth}): base training "
                         "on ClimbMix with the study's optimizer (--muon-eq 0 --muon-plus 0), --ranks as given (the data order "
                         "depends on it), every data path named (a missing file stops the run), CORE on 500 items per task during "
                         "training and on every item after each run (core_final), a checkpoint every 500 steps with the last 2 "
                         "kept; then nanochat's SFT of the study's time (sft.py --mixture study) and its six-task ChatCORE "
                         "(chat_eval.py --spellingbee). Prepared and run by: " + self.rerun_command()),
                "base": shlex.join(self.base_flags()),
                "arms": self.arms,
                "seeds": self.args.seeds,
                "sft": shlex.join(["--sft", os.path.join(d, "sft"), "--chatcore-tasks", os.path.join(d, "chat_tasks")] +
                                  shlex.split(self.args.sft_flags)),
                "core_final": shlex.join(["-c", os.path.join(d, "core_tasks")])}

    def rerun_command(self):
        script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO) if sys.argv and sys.argv[0].endswith(".py") else "dev/speedrun.py"
        return shlex.join(["python3", script] + sys.argv[1:])

    def check_study_file(self, spec):
        """A study file already in OUT must be this one, but for its seeds (a study grows with more seeds)."""
        if not os.path.exists(self.study_file):
            return
        try:
            with open(self.study_file, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            raise SpeedrunError(f"cannot read {show(self.study_file)}: {e}")
        for key in ("name", "base", "arms", "sft", "core_final"):
            if old.get(key) != spec[key]:
                raise SpeedrunError(f"{show(self.study_file)} is another study ('{key}' was {json.dumps(old.get(key))}, now "
                                    f"{json.dumps(spec[key])}); give another --out, or delete {show(self.out)} to start it again")

    def validate_spec(self, spec):
        """study.py's own checks of the study file, before anything runs."""
        with tempfile.TemporaryDirectory(prefix="speedrun_study_") as tmp:
            path = os.path.join(tmp, "study.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(spec, f)
            try:
                study.load_study(path)
            except study.StudyError as e:
                raise SpeedrunError(str(e).replace(path, "the study file"))

    # --- the stages' checks
    def check_data(self):
        info = tokenizer_info(self.tok_path)
        if info is None:
            return False, f"no {show(self.tok_path)}"
        if info[0] != self.args.vocab_size:
            raise SpeedrunError(f"{show(self.tok_path)} has a vocabulary of {info[0]}, not --vocab-size {self.args.vocab_size}: "
                                "give that --vocab-size, another --data-dir, or delete the directory's tokenizer and shards")
        shards = [os.path.join(self.data, f"train_{i:06d}.bin") for i in range(self.num_shards)]
        shards.append(os.path.join(self.data, "val_000000.bin"))
        for path in shards:
            if climbmix.read_shard_header(path) is None:
                return False, f"{show(path)} is missing or incomplete"
            if not climbmix.row_groups_current(path):
                return False, f"{show(path)}{climbmix.ROWGROUP_SUFFIX} is missing or stale"
        return True, f"tokenizer (vocabulary {info[0]}), {self.num_shards} train shards and the validation shard"

    def check_core(self, max_per_task):
        directory = os.path.join(self.data, "core_tasks_500" if max_per_task > 0 else "core_tasks")
        return task_dir_state(directory, CORE_MAGIC, tokenizer_info(self.tok_path), (5, 6), 7, max_per_task)

    def check_sft(self):
        meta_path = os.path.join(self.data, "sft", "sft_meta.json")
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return False, f"no {show(meta_path)}"
        source = os.path.join(self.fixtures, "sft") if self.fixtures else "hub"
        if meta.get("mixture") != "study":
            return False, f"{show(meta_path)} is of the '{meta.get('mixture')}' mixture, not the study's"
        if meta.get("source") != source:
            return False, f"{show(meta_path)} was made from {meta.get('source')}, not {show(source) if self.fixtures else source}"
        if not os.path.isfile(self.tok_path) or meta.get("tokenizer_sha256") != climbmix.sha256_file(self.tok_path):
            return False, f"{show(meta_path)} was made with another tokenizer"
        for name in ("sft_train.bin", "sft_val.bin"):
            h = read_ints(os.path.join(self.data, "sft", name), 8)
            if not h or h[0] != SFT_MAGIC or (h[6], h[7]) != tokenizer_info(self.tok_path):
                return False, f"{show(os.path.join(self.data, 'sft', name))} is missing or not of this tokenizer"
        return True, f"{meta['splits']['train']['conversations']:,} train and {meta['splits']['val']['conversations']:,} val conversations"

    def check_chat(self):
        return task_dir_state(os.path.join(self.data, "chat_tasks"), CHAT_MAGIC, tokenizer_info(self.tok_path), (4, 5), 6, -1,
                              need_label="SpellingBee")

    def study_counts(self):
        base = [d for _, _, d in self.runs if study.run_state(d) == "done"]
        sft = [d for d in base if study.run_state(os.path.join(d, "sft")) == "done"]
        core = [d for d in base if study.read_core_final(d) is not None]
        return base, sft, core

    def check_study(self):
        base, sft, core = self.study_counts()
        n = len(self.runs)
        report = os.path.join(self.out, "report.md")
        if len(base) < n or len(sft) < n or len(core) < n:
            return False, f"{len(base)} of {n} base runs, {len(sft)} SFT runs and {len(core)} full COREs done"
        outputs = [os.path.join(d, f) for d in base for f in ("metrics.jsonl", "sft/metrics.jsonl", "core_final.csv")]
        if not os.path.isfile(report) or os.path.getmtime(report) < max(os.path.getmtime(p) for p in outputs):
            return False, f"every run is done; {show(report)} is still to be written"
        return True, f"{n} base runs, their SFT and full CORE, and {show(report)}"

    # --- the stages
    def stages(self):
        d, py = self.data, self.py
        fx = self.fixtures
        prep = self.args.prep
        tok = self.tok_path
        if fx:
            climb = ["--parquet-dir", os.path.join(fx, "parquet")]
        else:
            climb = ["--num-shards", str(self.num_shards), "--data-dir", os.path.join(d, "parquet")]
        data = [py, "dev/data/climbmix.py"] + climb + ["--out", d, "--vocab-size", str(self.args.vocab_size)] + prep.get("data", [])
        bundle = ["--bundle", os.path.join(fx, "core_bundle")] if fx else ["--bundle-zip"]
        core500 = ([py, "dev/data/core.py"] + bundle + ["--tokenizer", tok, "--out", os.path.join(d, "core_tasks_500"),
                                                          "--max-per-task", "500"] + prep.get("core_tasks", []))
        core_all = ([py, "dev/data/core.py"] + bundle + ["--tokenizer", tok, "--out", os.path.join(d, "core_tasks"),
                                                           "--verify-shard", os.path.join(d, "val_000000.bin")] +
                    prep.get("core_tasks", []))
        src = lambda name: ["--source", os.path.join(fx, name)] if fx else []  # noqa: E731
        sft = ([py, "dev/data/sft.py", "--mixture", "study", "--tokenizer", tok, "--out", os.path.join(d, "sft")] + src("sft") +
               prep.get("sft_data", []))
        chat = ([py, "dev/data/chat_eval.py", "--spellingbee", "--tokenizer", tok, "--out", os.path.join(d, "chat_tasks")] +
                src("chat") + prep.get("chat_tasks", []))
        run_study = [py, "dev/study.py", self.study_file, "--out", self.out, "--binary", self.trainer]
        return [("data", "ClimbMix shards, tokenizer, token shards", [Step(data, self.check_data)]),
                ("core_tasks", "CORE task files (500 per task for training, all items for the final CORE)",
                 [Step(core500, lambda: self.check_core(500)), Step(core_all, lambda: self.check_core(-1))]),
                ("sft_data", "the study's SFT mixture", [Step(sft, self.check_sft)]),
                ("chat_tasks", "the study's ChatCORE tasks (six, with SpellingBee)", [Step(chat, self.check_chat)]),
                ("study", "base runs, SFT + ChatCORE, full CORE, report",
                 [Step(run_study, self.check_study, before=self.write_study_file)])]

    def write_study_file(self):
        spec = self.study_spec()
        self.check_study_file(spec)
        os.makedirs(self.out, exist_ok=True)
        climbmix.write_atomic(self.study_file, (json.dumps(spec, indent=1) + "\n").encode("utf-8"))

    def state(self, step):
        return step.check()

    # --- the checks before anything runs
    def need_plan(self):
        """The trainer's -n 0 plan (for the dry run, the run's flags, and the default shard count of other depths)."""
        trainer = self.trainer
        if not os.access(trainer, os.X_OK):
            if self.args.cpu or not os.access(os.path.join(REPO, "train_gpt_cpu"), os.X_OK):
                self.plan_note = f"{show(trainer)} is not built, so there is no plan from the trainer"
                return None
            trainer = os.path.join(REPO, "train_gpt_cpu")
            self.plan_note = (f"./train_gpt is not built, so this is ./train_gpt_cpu's plan: its parameters and steps are the "
                              "study's, its memory plan (fp32, the CPU's micro-batch) is not a GPU's")
        self.plan = trainer_plan(trainer, lambda tr, va, tk: self.base_flags(tr, va, tk), self.args.vocab_size)
        if self.args.steps:  # an -n in --extra-flags: the runs take that many steps, not the horizon's
            self.plan["steps"] = self.args.steps
        if self.plan["cpu_backend"] and not self.args.cpu and trainer == self.trainer:
            self.plan_note = ("./train_gpt is the CPU backend (make train_gpt builds it where nvidia-smi finds no GPU): the "
                              "memory plan is not a GPU's")
        if self.num_shards is None:  # another depth: the documents its horizon reads, with README's margin
            docs = self.plan["steps"] * self.plan["step_tokens"] / PACKING_KEPT
            self.num_shards = min(climbmix.MAX_SHARD, max(2, int(math.ceil(docs * SHARD_MARGIN / SHARD_TOKENS / 10.0)) * 10))
        return self.plan

    def check_binaries(self):
        missing = [b for b in self.binaries if not os.access(b, os.X_OK)]
        if missing:
            names = [os.path.basename(b) for b in missing]
            hint = ("" if self.args.cpu else " on the GPU machine (train_gpt is the CUDA backend where nvidia-smi finds a GPU), "
                    "or --cpu for ./train_gpt_cpu (tiny tests only)")
            raise SpeedrunError(f"not built: {', '.join('./' + n for n in names)}: run `make {' '.join(names)}`{hint}")

    def check_packages(self):
        import importlib.util
        missing = [p for p in DATA_PACKAGES if importlib.util.find_spec(p) is None]
        if missing:
            raise SpeedrunError(f"the data stages need the Python packages {', '.join(missing)}, which {sys.executable} cannot "
                                f"import: {sys.executable} -m pip install -r dev/data/requirements.txt")


# ----------------------------------------------------------------------------------------------------
# The dry run: commands, what is done, estimates

def free_note(path, need):
    """The free space of the file system `path` will be on, and whether `need` bytes fit there."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    free = shutil.disk_usage(path).free
    return f"free there now: {gb(free)}" + (" (NOT ENOUGH)" if need > free else "")


def dry_run(sr):
    a = sr.args
    plan = sr.plan
    n_runs = len(sr.runs)
    log(f"speedrun (dry run): depth {a.depth}, baseline against XSA ({sr.arms['xsa']}) over seeds "
        f"{', '.join(map(str, a.seeds))} ({n_runs} base runs), --ranks {a.ranks}")
    log(f"  data: {sr.data}" + (f" (offline fixtures: {sr.fixtures})" if sr.fixtures else ""))
    log(f"  study: {show(sr.out)} (study file {show(sr.study_file)}, report {show(os.path.join(sr.out, 'report.md'))})")
    missing = [os.path.basename(b) for b in sr.binaries if not os.access(b, os.X_OK)]
    log(f"  binaries: {'all built' if not missing else 'not built: ' + ', '.join(missing) + ' (make ' + ' '.join(missing) + ')'}")
    import importlib.util
    pk = [p for p in DATA_PACKAGES if importlib.util.find_spec(p) is None]
    if pk:
        log(f"  packages: {', '.join(pk)} not importable by {sys.executable}: {sys.executable} -m pip install -r dev/data/requirements.txt")
    log("Nothing is run or written. Disk, time and memory below are ESTIMATES, each with the documented number it comes from.")
    log()
    if plan:
        log(f"The trainer's plan ({show_argv(plan['argv'])}; STAND-IN: a tokenizer of vocabulary {a.vocab_size} and empty shards, "
            "since -n 0 reads the data only for its vocabulary):")
        for line in plan["lines"]:
            if line.strip():
                log(f"  | {line}")
    if sr.plan_note:
        log(f"  note: {sr.plan_note}")
    log()
    stages = sr.stages()
    states = []
    for k, (name, title, steps) in enumerate(stages, 1):
        results = [sr.state(s) for s in steps]
        done = all(r[0] for r in results)
        states.append(done)
        why = "; ".join(r[1] for r in results if (r[0] if done else not r[0]))
        log(f"stage {k}/{len(stages)} {name}: {title}: {'DONE, skipped' if done else 'to do'} ({why})")
        for s, r in zip(steps, results):
            log(f"  {'(done) ' if r[0] else ''}$ {show_argv(s.argv)}")
        for line in estimates(sr, name, plan):
            log(f"  {line}")
        if name == "study":
            study_commands(sr, plan)
        log()
    todo = [stages[i][0] for i, d in enumerate(states) if not d]
    log(f"to do: {', '.join(todo)}" if todo else "every stage is done: nothing to run")


def estimates(sr, name, plan):
    a = sr.args
    out = []
    if name == "data":
        n = sr.num_shards
        if sr.fixtures:
            size = sum(os.path.getsize(os.path.join(sr.fixtures, "parquet", f)) for f in sr.parquet)
            out.append(f"disk: the fixtures' {len(sr.parquet)} parquet files are {size / 1e6:.1f} MB; the token shards are of that order")
            return out
        parquet = (n + 1) * PARQUET_MB * 1e6
        width = 2 if a.vocab_size <= 65536 else 4
        tokens = (n + 1) * SHARD_TOKENS * width
        out.append(f"disk (estimate): {gb(parquet)} of parquet ({n + 1} files x ~{PARQUET_MB} MB) + {gb(tokens)} of token shards "
                   f"({n + 1} x ~{SHARD_TOKENS / 1e6:.0f}M tokens x {width} bytes) [dev/data/README.md, How many shards]; "
                   + free_note(sr.data, parquet + tokens))
        workers = os.cpu_count() or 1
        enc = (n + 1) * SHARD_CHARS / 1e6 / (TIKTOKEN_MB_S * workers)
        out.append(f"time (estimate): the download at the network's rate ({duration(parquet / 100e6)} at an assumed 100 MB/s); "
                   f"encoding ~{gb((n + 1) * SHARD_CHARS)} of text at {TIKTOKEN_MB_S} MB/s per worker x {workers} workers: "
                   f"~{duration(enc)} [README's tiktoken speed on a loaded 2-core VM]; the tokenizer's training: no documented number")
        if plan and plan["steps"]:
            need = plan["steps"] * plan["step_tokens"] / PACKING_KEPT / SHARD_TOKENS
            out.append(f"enough? the plan's {plan['steps'] * plan['step_tokens'] / 1e9:.2f}B training tokens / {PACKING_KEPT} kept by "
                       f"packing = ~{need:.0f} shards of ~{SHARD_TOKENS / 1e6:.0f}M tokens (estimate); {n} chosen"
                       + (" (README's number for this depth)" if a.num_shards is None and a.depth in DOC_SHARDS else ""))
        out.append("memory: no documented number")
    elif name in ("core_tasks", "sft_data", "chat_tasks"):
        what = {"core_tasks": "the CORE bundle (22 tasks) tokenized twice", "sft_data": "the study's mixture rendered once",
                "chat_tasks": "six test splits tokenized"}[name]
        out.append(f"disk, time, memory: no documented numbers ({what}; small next to the token shards)")
    elif name == "study" and plan:
        ckpt = (plan["mem_params"] + (plan["mem_opt_all"] or plan["mem_opt"])) * 2 ** 20
        n = len(sr.runs)
        out.append(f"disk (estimate): a checkpoint holds the fp32 parameters and the whole optimizer state, "
                   f"{plan['mem_params']:,.0f} + {plan['mem_opt_all'] or plan['mem_opt']:,.0f} MiB = {gb(ckpt)} [the plan]; "
                   f"per run 2 kept (--keep-checkpoints 2; a third while one is written) + SFT's final one: "
                   f"{n} x 3 x {gb(ckpt)} = {gb(3 * n * ckpt)}; " + free_note(sr.out, 3 * n * ckpt))
        if plan["cpu_backend"] and not a.cpu:
            out.append(f"memory: the CPU plan's {plan['mem_total']:,.0f} MiB per rank is not a GPU's (fp32 activations, its own "
                       "micro-batch); run there, this dry run prints the GPU's plan")
        else:
            out.append(f"memory: {plan['mem_total']:,.0f} MiB per rank (the plan's total for {int(plan['batch'] or 0)} rows per "
                       f"micro-batch; {'free on the GPU' if not plan['cpu_backend'] else 'available on this machine'}: "
                       f"{plan['mem_free'] or 0:,.0f} MiB) [the plan]; SFT trains the same model and optimizer: about the same")
        if a.cpu:
            out.append("time: the CPU backend has no documented speed; the trainer times one micro-step and prints its estimate "
                       "when it starts")
        else:
            flops = plan["steps"] * plan["step_tokens"] * plan["flops"]
            lo, hi = (flops / (a.ranks * H200_PEAK * m) for m in reversed(MFU_RANGE))
            out.append(f"time (estimate): per base run {plan['steps']:.0f} steps x {plan['step_tokens']:,.0f} tokens x {plan['flops']:.4g} "
                       f"FLOPs/token = {flops:.3g} FLOPs on {a.ranks} H200 at {MFU_RANGE[0]:.0%}-{MFU_RANGE[1]:.0%} MFU of "
                       f"{H200_PEAK / 1e12:.0f} TFLOP/s: {duration(lo)} to {duration(hi)}; {n} runs: {duration(n * lo)} to "
                       f"{duration(n * hi)} [dev/docs/performance.md's d24 model on one H200; evaluations and the gradient "
                       "exchange not counted]; SFT and the full CORE: no documented numbers")
    return out


def study_commands(sr, plan):
    """What study.py runs for the runs that are not done: the trainer, chat_sft and eval_core per (arm, seed)."""
    spec = sr.study_spec()
    steps = int(plan["steps"]) if plan and plan["steps"] else None
    ckpt = f"ckpt_{steps:06d}.safetensors" if steps else "ckpt_LAST.safetensors"
    lines = []
    for arm, seed, d in sr.runs:
        state = study.run_state(d)
        if state == "done":
            continue
        argv = ([show(sr.trainer)] + shlex.split(spec["base"]) + shlex.split(spec["arms"][arm]) + ["--seed", str(seed)] +
                (["--resume", d] if state == "resume" else ["-o", d]))
        lines.append(show_argv(argv))
    for arm, seed, d in sr.runs:
        if study.run_state(os.path.join(d, "sft")) != "done":
            argv = ["./chat_sft"] + shlex.split(spec["sft"]) + ["--init-from", os.path.join(d, ckpt), "-o", os.path.join(d, "sft")]
            lines.append(show_argv(argv))
    for arm, seed, d in sr.runs:
        if study.read_core_final(d) is None:
            argv = ["./" + os.path.basename(sr.binaries[2]), "-e", os.path.join(d, ckpt)] + shlex.split(spec["core_final"]) + \
                   ["-o", os.path.join(d, "core_final.csv")]
            lines.append(show_argv(argv))
    if lines:
        log(f"  study.py writes {show(sr.study_file)} and runs, seed by seed (a run with a checkpoint resumes with --resume):")
        for line in lines:
            log(f"    $ {line}")
        log(f"    then writes {show(os.path.join(sr.out, 'report.md'))}")


# ----------------------------------------------------------------------------------------------------
# Running the stages

def run_child(argv):
    """Runs argv from the repository root in its own process group (a Ctrl-C reaches it once: through here), passing
    SIGINT and SIGTERM on. Returns (exit code, the signals received)."""
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, process_group=0)
    got = []

    def forward(sig, frame):
        got.append(sig)
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return code, got


def run(sr):
    stages = sr.stages()
    rerun = sr.rerun_command()
    for k, (name, title, steps) in enumerate(stages, 1):
        for step in steps:
            done, why = sr.state(step)
            if done:
                log(f"speedrun: stage {k}/{len(stages)} {name}: done ({why}), skipped")
                continue
            if step.before:
                step.before()
            log(f"speedrun: stage {k}/{len(stages)} {name} ({title}): running {show_argv(step.argv)}")
            code, got = run_child(step.argv)
            if got:
                sig = signal.Signals(got[0])
                log(f"speedrun: stopped by {sig.name} in stage {name}; rerun the same command to go on: {rerun}")
                sys.exit(128 + sig.value)
            if code != 0:
                raise SpeedrunError(f"stage {k}/{len(stages)} {name} failed (exit {code}): {show_argv(step.argv)}; "
                                    f"once its cause is fixed, rerun: {rerun}")
            done, why = sr.state(step)
            if not done:
                raise SpeedrunError(f"stage {k}/{len(stages)} {name} ended without its outputs ({why}): {show_argv(step.argv)}; "
                                    f"rerun: {rerun}")
    log(f"speedrun: every stage is done; the report: {show(os.path.join(sr.out, 'report.md'))}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sr = Speedrun(args)
        spec = sr.study_spec()
        sr.validate_spec(spec)
        sr.check_study_file(spec)
        if args.dry_run:
            sr.need_plan()
            dry_run(sr)
            return
        if sr.num_shards is None or not all(sr.state(s)[0] for s in sr.stages()[-1][2]):
            sr.check_binaries()
            sr.need_plan()  # the trainer accepts the flags and fits the plan before hours of data preparation
            if sr.plan_note and not args.cpu:
                raise SpeedrunError(f"{sr.plan_note.split(':')[0]}; the study needs the CUDA backend: `make train_gpt chat_sft "
                                    "eval_core_cuda` on a GPU machine, or --cpu for tiny tests")
        if not all(sr.state(s)[0] for _, _, steps in sr.stages()[:4] for s in steps):
            sr.check_packages()
        run(sr)
    except SpeedrunError as e:
        print(f"speedrun.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # between stages (a running stage gets the signal passed on instead)
        print("speedrun: interrupted; rerun the same command to go on", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
