#!/usr/bin/env python3
"""
Score ChatCORE task files (written by dev/data/chat_eval.py) with the PyTorch reference model, as nanochat's
scripts/chat_eval.py scores them (nanochat 92d63d4), in float64: the reference for the trainer's ChatCORE.

    /usr/bin/python3 dev/reference/score_chat.py --weights MODEL.safetensors [--tasks dev/data/chat_tasks]
        [--tokenizer TOKENIZER.bin] [--max-per-task K] [--max-new-tokens 512] [--out scores.json]

MODEL.safetensors: weights under nanochat's names with the config in the metadata (train_gpt
--export-safetensors; loaded as score_core.py loads them). The tokenizer (for the generative tasks: decoding the
answer, encoding the calculator's results) is --tokenizer, by default the `tokenizer` the weights' metadata names;
it must have the task files' vocabulary and BOS, and the weights' `tokenizer_fingerprint` where they record one.
It is read by tokenizer_file.py (no tiktoken: Debian's python3 has torch but not tiktoken).

Per task file (index.txt order), the first K items (--max-per-task, default all):

* categorical (ARC, MMLU): the prompt alone through the model; the logits at its last position restricted to
  the item's letter ids; prediction = the first maximum (torch.argmax); correct iff it is gold. Prompts longer
  than seq_len run at full length as in score_core.py (up to nanochat's rotary limit of 10 x seq_len).
* generative (GSM8K, HumanEval, SpellingBee): greedy decoding as nanochat's Engine.generate at temperature 0: the
  next token is the first argmax over the whole vocabulary of the full forward of the sequence so far (no KV cache);
  generation ends at <|assistant_end|> or BOS (not part of the answer), after --max-new-tokens tokens (nanochat's
  512), or when the sequence (prompt + answer) reaches the model's seq_len (nanochat has no such limit; the
  trainer stops there too, and a prompt of seq_len tokens or more gets no answer and is wrong). The calculator
  tool, exactly as Engine: the tokens after <|python_start|> up to <|python_end|> are decoded and given to
  use_calculator; a result that is not None is forced in as <|output_start|>, encode(str(result)),
  <|output_end|> (forced tokens count as generated tokens). The answer's text is the decode of its tokens
  (special tokens as their text). GSM8K and SpellingBee (the gsm8k checker): correct iff extract_answer(answer) ==
  the reference number. HumanEval:
  program = imports + "\\n\\n" + extract_program(answer) + "\\n\\n" + test + "\\n" + "check(entry_point)", run by
  execute_code (a fresh python subprocess behind nanochat's guard, 5 s, 256 MB); correct iff it runs to its end (a
  marker written after it arrives) and exits with 0. nanochat 92d63d4 counts the exit status only, so that a program
  that calls sys.exit(0) before its tests passes; its runner before f4f69f9 (2026-07-03, the study's) and OpenAI's
  HumanEval count that as a failure, and so do this and the trainer (dev/docs/evaluation.md#chatcore).

Accuracy per task; centered = (acc - baseline) / (1 - baseline); ChatCORE = the mean of the centered accuracies
(nanochat prints it only when all five tasks ran, or all six with SpellingBee before July 2026; with fewer
this prints their mean, labelled as such).
"""
import argparse
import collections
import json
import os
import re
import secrets
import signal
import struct
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tokenizer_file  # noqa: E402  (standard library only)

CHAT_MAGIC = 20261203
CHAT_VERSION = 1
HEADER_INTS = 256
KIND_NAMES = {0: "categorical", 1: "generative"}
CHECKER_NAMES = {0: "letter", 1: "gsm8k", 2: "humaneval"}
STRINGS = {"letter": 0, "gsm8k": 1, "humaneval": 3}
CHATCORE_TASKS = ["ARC-Easy", "ARC-Challenge", "MMLU", "GSM8K", "HumanEval"]
STUDY_TASKS = CHATCORE_TASKS + ["SpellingBee"]  # ChatCORE before nanochat 950a1dc (July 2026): the study's
ROTARY_FACTOR = 10  # nanochat precomputes rotary tables for 10 * sequence_len positions
DEFAULT_TASKS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "dev", "data", "chat_tasks")
REPO = os.path.dirname(os.path.dirname(HERE))


class ScoreError(Exception):
    pass


# -----------------------------------------------------------------------------
# Task files (format: dev/data/README.md, "ChatCORE task files")

def read_task_file(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 * HEADER_INTS:
        raise ScoreError(f"{path}: shorter than the {4 * HEADER_INTS}-byte header")
    h = struct.unpack_from(f"<{HEADER_INTS}i", data, 0)
    if h[0] != CHAT_MAGIC or h[1] != CHAT_VERSION:
        raise ScoreError(f"{path}: not a ChatCORE task file (magic {h[0]} version {h[1]})")
    if h[2] not in KIND_NAMES or h[8] not in CHECKER_NAMES:
        raise ScoreError(f"{path}: unknown kind {h[2]} or checker {h[8]}")
    kind, checker = KIND_NAMES[h[2]], CHECKER_NAMES[h[8]]
    if (kind == "categorical") != (checker == "letter"):
        raise ScoreError(f"{path}: a {kind} task with the {checker} checker")
    if any(h[41:]):
        raise ScoreError(f"{path}: nonzero reserved header fields")
    baseline = struct.unpack_from("<f", data, 28)[0]
    label = data[36:36 + 128].split(b"\0", 1)[0].decode("utf-8")
    task = dict(file=os.path.basename(path), label=label, kind=kind, checker=checker, n_items=h[3],
                vocab_size=h[4], bos=h[5], max_per_task=h[6], baseline=float(baseline), items=[])
    pos = 4 * HEADER_INTS

    def u32():
        nonlocal pos
        (v,) = struct.unpack_from("<I", data, pos)
        pos += 4
        return v

    def ids():
        nonlocal pos
        n = u32()
        out = list(struct.unpack_from(f"<{n}I", data, pos))
        pos += 4 * n
        return out

    try:
        for k in range(h[3]):
            prompt, choices, gold = ids(), ids(), u32()
            strings = []
            for _ in range(u32()):
                n = u32()
                b = data[pos:pos + n]
                if len(b) != n:
                    raise struct.error("truncated")
                strings.append(b.decode("utf-8"))
                pos += n
            if not prompt or prompt[0] != h[5]:
                raise ScoreError(f"{path}: item {k}'s prompt does not start with BOS {h[5]}")
            if max(prompt + choices) >= h[4]:
                raise ScoreError(f"{path}: item {k} has a token id >= the vocabulary size {h[4]}")
            if kind == "categorical" and not (choices and gold < len(choices)):
                raise ScoreError(f"{path}: item {k} has {len(choices)} choices and gold {gold}")
            if kind == "generative" and (choices or gold):
                raise ScoreError(f"{path}: generative item {k} has choices or a gold index")
            if len(strings) != STRINGS[checker]:
                raise ScoreError(f"{path}: item {k} has {len(strings)} strings, the {checker} checker needs "
                                 f"{STRINGS[checker]}")
            task["items"].append(dict(prompt=prompt, choices=choices, gold=gold, strings=strings))
    except struct.error:
        raise ScoreError(f"{path}: truncated")
    except UnicodeDecodeError:
        raise ScoreError(f"{path}: a string is not UTF-8")
    if pos != len(data):
        raise ScoreError(f"{path}: {len(data) - pos} bytes after the last item")
    return task


def list_task_files(d):
    index = os.path.join(d, "index.txt")
    if not os.path.exists(index):
        raise ScoreError(f"{d}: no index.txt (not a directory written by dev/data/chat_eval.py)")
    with open(index, encoding="utf-8") as f:
        names = [line.split()[0] for line in f if line.strip()]
    if not names:
        raise ScoreError(f"{index}: no task files")
    return [os.path.join(d, n) for n in names]


# -----------------------------------------------------------------------------
# nanochat's checkers and tools, restated (tasks/gsm8k.py, tasks/humaneval.py, nanochat/engine.py,
# nanochat/execution.py at 92d63d4)

GSM_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_answer(completion):
    """tasks/gsm8k.py: the number after the first '#### ', stripped, commas removed; None without one."""
    match = GSM_RE.search(completion)
    if match:
        return match.group(1).strip().replace(",", "")
    return None


def extract_program(completion):
    """tasks/humaneval.py: the first ```python / ``` block's body (stripped), else the whole completion stripped."""
    matches = re.findall(r"```(?:python)?\s*\n(.*?)\n```", completion, re.DOTALL)
    if matches:
        return matches[0].strip()
    return completion.strip()


class _Timeout(Exception):
    pass


def eval_with_timeout(formula, max_time=3):
    """engine.py eval_with_timeout: eval with no builtins, a SIGALRM after max_time seconds; any exception -> None."""
    def handler(signum, frame):
        raise _Timeout(f"'{formula}': timed out after {max_time} seconds")
    try:
        signal.signal(signal.SIGALRM, handler)
        signal.alarm(max_time)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            result = eval(formula, {"__builtins__": {}}, {})
        signal.alarm(0)
        return result
    except Exception:
        signal.alarm(0)
        return None


MATH_CHARS = "0123456789*+-/.() "
STRING_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ "
DANGEROUS = ["__", "import", "exec", "eval", "compile", "open", "file", "input", "raw_input", "globals", "locals",
             "vars", "dir", "getattr", "setattr", "delattr", "hasattr"]


def use_calculator(expr):
    """engine.py use_calculator: commas removed; a pure arithmetic expression (without '**') is evaluated;
    otherwise only a string expression of STRING_CHARS using .count( and none of the dangerous words; else None."""
    expr = expr.replace(",", "")
    if all(x in MATH_CHARS for x in expr):
        if "**" in expr:
            return None
        return eval_with_timeout(expr)
    if not all(x in STRING_CHARS for x in expr):
        return None
    if any(p in expr.lower() for p in DANGEROUS):
        return None
    if ".count(" not in expr:
        return None
    return eval_with_timeout(expr)


# execution.py's GUARD, verbatim
GUARD = r"""
import faulthandler, builtins, os, shutil, subprocess, sys
maximum_memory_bytes = {maximum_memory_bytes}
if maximum_memory_bytes is not None and sys.platform != "darwin":
    # (the resource limit calls seem to fail on macOS, skip them there)
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (maximum_memory_bytes, maximum_memory_bytes))
    resource.setrlimit(resource.RLIMIT_DATA, (maximum_memory_bytes, maximum_memory_bytes))
    resource.setrlimit(resource.RLIMIT_STACK, (maximum_memory_bytes, maximum_memory_bytes))
faulthandler.disable()
builtins.exit = None
builtins.quit = None
builtins.help = None
os.environ["OMP_NUM_THREADS"] = "1"
for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir",
             "setuid", "fork", "forkpty", "killpg", "rename", "renames", "truncate",
             "replace", "unlink", "fchmod", "fchown", "chmod", "chown", "chroot",
             "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
    setattr(os, name, None)
for name in ("rmtree", "move", "chown"):
    setattr(shutil, name, None)
subprocess.Popen = None
for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
    sys.modules[name] = None
"""


def execute_code(code, timeout=5.0, maximum_memory_bytes=256 * 1024 * 1024):
    """execution.py execute_code: (success, error line or None). The guard, then the code exec'd from its repr,
    with sys.executable -c in a temporary directory, PATH=/usr/bin:/bin only, no stdin. Success needs the exit
    status 0 and the marker (a nonce) that the statement after the code writes to a pipe: a program that exits
    with 0 before its end fails, as in nanochat's runner before f4f69f9 (not 92d63d4's; module docstring)."""
    guard = GUARD.format(maximum_memory_bytes=maximum_memory_bytes)
    nonce = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)  # (a process the program left may hold the write end)
    program = (guard + f"\npassed = os.write\nexec(compile({code!r}, '<llm>', 'exec'), {{'__name__': '__main__'}})\n"
               f"passed({write_end}, b'{nonce}')\n")
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            # errors="replace": a program may write any bytes, and only the exit status and the marker decide
            p = subprocess.run([sys.executable, "-c", program], cwd=tmpdir, env={"PATH": "/usr/bin:/bin"}, pass_fds=(write_end,),
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=timeout)
        try:
            marked = os.read(read_end, 64) == nonce.encode()
        except BlockingIOError:
            marked = False
    except subprocess.TimeoutExpired:
        return False, "Execution timed out (process killed)"
    finally:
        os.close(read_end)
        os.close(write_end)
    if p.returncode == 0 and marked:
        return True, None
    if p.returncode == 0:
        return False, "Exited with 0 before the end of the program"
    return False, (p.stderr.strip().splitlines() or ["Execution failed"])[-1]


def humaneval_program(imports, completion, test, entry_point):
    return imports + "\n\n" + extract_program(completion) + "\n\n" + test + "\n" + f"check({entry_point})"


# -----------------------------------------------------------------------------
# Generation (nanochat's Engine.generate / generate_batch, one row, temperature 0)

class Specials:
    def __init__(self, tok):
        names = ["<|bos|>", "<|assistant_end|>", "<|python_start|>", "<|python_end|>", "<|output_start|>",
                 "<|output_end|>"]
        missing = [n for n in names if n not in tok.special]
        if missing:
            raise ScoreError(f"the tokenizer has no {', '.join(missing)} (ChatCORE needs nanochat's chat tokens)")
        (self.bos, self.assistant_end, self.python_start, self.python_end, self.output_start,
         self.output_end) = [tok.special[n] for n in names]


def generate(next_token, prompt, tok, sp, max_new, seq_len):
    """(answer tokens, why it stopped: 'end' | 'max_new_tokens' | 'seq_len'). next_token(seq) = the greedy next
    token after the token list seq. The stop token is not part of the answer."""
    seq, out = list(prompt), []
    forced = collections.deque()
    in_python, expr = False, []
    while True:
        if len(out) >= max_new:
            return out, "max_new_tokens"
        if len(seq) >= seq_len:
            return out, "seq_len"
        t = forced.popleft() if forced else next_token(seq)
        seq.append(t)
        if t == sp.assistant_end or t == sp.bos:
            return out, "end"
        out.append(t)
        if t == sp.python_start:
            in_python, expr = True, []
        elif t == sp.python_end and in_python:
            in_python = False
            if expr:
                result = use_calculator(tok.decode(expr))
                if result is not None:
                    forced.append(sp.output_start)
                    forced.extend(tok.encode_ordinary(str(result)))
                    forced.append(sp.output_end)
            expr = []
        elif in_python:
            expr.append(t)


# -----------------------------------------------------------------------------
# Scoring

def score_task(model, cfg, task, tok, sp, max_items, max_new, log):
    import torch
    if task["vocab_size"] != cfg.vocab_size:
        raise ScoreError(f"{task['file']}: tokenized for vocab {task['vocab_size']}, the model has {cfg.vocab_size}")
    items = task["items"][:max_items] if max_items > 0 else task["items"]
    limit = ROTARY_FACTOR * cfg.seq_len
    out = []

    @torch.no_grad()
    def last_logits(seq):
        logits, _ = model(torch.tensor([seq], dtype=torch.long))
        return logits[0, -1]

    def next_token(seq):
        return int(torch.argmax(last_logits(seq)))

    t0 = time.time()
    for k, item in enumerate(items):
        prompt = item["prompt"]
        if task["kind"] == "categorical":
            if len(prompt) > limit:
                raise ScoreError(f"{task['file']}: item {k} has a {len(prompt)}-token prompt, over {limit} = "
                                 f"{ROTARY_FACTOR} x seq_len (nanochat's rotary limit)")
            focus = last_logits(prompt)[item["choices"]].tolist()
            pred = max(range(len(focus)), key=lambda i: (focus[i], -i))  # the first maximum
            out.append(dict(correct=int(pred == item["gold"]), gold=item["gold"], pred=pred, logits=focus))
            continue
        if task["bos"] != sp.bos:
            raise ScoreError(f"{task['file']}: BOS {task['bos']}, the tokenizer's is {sp.bos}")
        if len(prompt) >= cfg.seq_len:
            answer, stop = [], "seq_len"
        else:
            answer, stop = generate(next_token, prompt, tok, sp, max_new, cfg.seq_len)
        text = tok.decode(answer)
        r = dict(correct=0, stop=stop, tokens=answer, completion=text)
        if len(prompt) >= cfg.seq_len:
            r["note"] = "the prompt fills the context: no answer, wrong"
        elif task["checker"] == "gsm8k":
            r["answer"] = extract_answer(text)
            r["reference"] = item["strings"][0]
            r["correct"] = int(r["answer"] == r["reference"])
        else:
            imports, test, entry_point = item["strings"]
            ok, error = execute_code(humaneval_program(imports, text, test, entry_point))
            r["correct"], r["error"] = int(ok), error
        out.append(r)
        log(f"  {task['label']} item {k}: {len(answer)} tokens ({stop}), {'correct' if r['correct'] else 'wrong'}, "
            f"{time.time() - t0:.1f}s")
    acc = sum(r["correct"] for r in out) / len(out) if out else float("nan")
    base = task["baseline"]
    centered = (acc - base) / (1.0 - base)
    res = dict(file=task["file"], label=task["label"], kind=task["kind"], checker=task["checker"], baseline=base,
               n_items=len(out), accuracy=acc, centered=centered, items=out)
    if task["kind"] == "generative":
        res["stops"] = dict(collections.Counter(r["stop"] for r in out))
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description="Score ChatCORE task files with the PyTorch reference model.")
    p.add_argument("--weights", required=True, help="safetensors file (nanochat names, config in metadata)")
    p.add_argument("--tasks", default=DEFAULT_TASKS,
                   help="directory of task files from dev/data/chat_eval.py (default dev/data/chat_tasks)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.bin of the model (default: the `tokenizer` in the weights' metadata, relative to the "
                        "repository root if not found as given)")
    p.add_argument("--max-per-task", type=int, default=-1, help="score the first K items of each task (-1 = all)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="answer length limit (default %(default)s, nanochat's)")
    p.add_argument("--out", default=None, help="write the scores as JSON to this file")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="model dtype (default float64: the truth; float32 for a quick look)")
    p.add_argument("--quiet", action="store_true", help="no line per generated answer")
    args = p.parse_args(argv)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    try:
        if args.max_new_tokens < 1:
            raise ScoreError("--max-new-tokens must be >= 1")
        t0 = time.time()
        tasks = [read_task_file(f) for f in list_task_files(args.tasks)]
        import require_torch  # noqa: F401  (one error line where PyTorch is missing)
        import torch
        import safetensors_io
        from score_core import load_model
        dtype = torch.float64 if args.dtype == "float64" else torch.float32
        model, cfg = load_model(args.weights, dtype)
        _, meta = safetensors_io.load(args.weights)
        tok = sp = None
        if any(t["kind"] == "generative" for t in tasks):
            path = args.tokenizer or meta.get("tokenizer")
            if not path:
                raise ScoreError(f"{args.weights} names no tokenizer: give --tokenizer")
            if args.tokenizer is None and not os.path.isfile(path) and os.path.isfile(os.path.join(REPO, path)):
                path = os.path.join(REPO, path)
            try:
                tok = tokenizer_file.TokenizerFile(path)
            except tokenizer_file.TokenizerFileError as e:
                raise ScoreError(str(e))
            sp = Specials(tok)
            if tok.vocab_size != cfg.vocab_size:
                raise ScoreError(f"{path}: vocabulary {tok.vocab_size}, the model's is {cfg.vocab_size}")
            fp = meta.get("tokenizer_fingerprint")
            if fp and fp != tok.fingerprint():
                raise ScoreError(f"{path}: fingerprint {tok.fingerprint()}, the weights were trained with {fp} "
                                 f"({meta.get('tokenizer', '?')})")
        log(f"model: {args.weights} ({cfg.n_layer} layers, dim {cfg.n_embd}, vocab {cfg.vocab_size}, seq_len "
            f"{cfg.seq_len}), {args.dtype}; tokenizer: {path if tok else 'not needed'}")
        log(f"generation: greedy, at most {args.max_new_tokens} new tokens and the model's context (prompt + answer "
            f"<= seq_len {cfg.seq_len}; nanochat has no context limit), with the calculator tool")
        results = [score_task(model, cfg, t, tok, sp, args.max_per_task, args.max_new_tokens, log) for t in tasks]
    except (ScoreError, OSError, ValueError) as e:
        print(f"score_chat.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    mean = sum(r["centered"] for r in results) / len(results)
    complete = sorted(r["label"] for r in results) in (sorted(CHATCORE_TASKS), sorted(STUDY_TASKS))
    print(f"{'task':<16} {'kind':<12} {'items':>5} {'accuracy':>9} {'baseline':>8} {'centered':>9}  stops")
    for r in results:
        stops = ", ".join(f"{k} {v}" for k, v in sorted(r.get("stops", {}).items()))
        print(f"{r['label']:<16} {r['kind']:<12} {r['n_items']:>5} {r['accuracy']:>9.4f} {r['baseline']:>8g} "
              f"{r['centered']:>9.4f}  {stops}")
    name = "ChatCORE" if complete else f"mean centered accuracy ({len(results)} tasks; ChatCORE needs all 5, or 6 with SpellingBee)"
    print(f"{name} {mean:.6f} ({args.dtype}, max new tokens {args.max_new_tokens}, seq_len {cfg.seq_len}, "
          f"{time.time() - t0:.1f}s)")
    if args.out:
        doc = dict(weights=os.path.basename(args.weights), dtype=args.dtype, max_per_task=args.max_per_task,
                   max_new_tokens=args.max_new_tokens, seq_len=cfg.seq_len,
                   generation_limit="prompt + answer <= seq_len (nanochat has no context limit)",
                   config=dict(vars(cfg)), chatcore=mean if complete else None, mean_centered=mean, tasks=results)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
