#!/usr/bin/env python3
"""Tests of nanochat's calculator tool in C++ (chat/calculator.h: calculator_eval), run through dev/data/bin/calc,
against nanochat's own rules (nanochat/engine.py: use_calculator, eval_with_timeout) written out again here with
the eval of the Python running this file: the reference, never calc's own output.

    make dev/data/bin/calc && python3 dev/data/test_calculator.py        (or all suites: make test)

What calc must print for an expression: str() of nanochat's value where the expression is in the calculator's
scope, and None everywhere else (where Python raises, and where it gives a value out of scope). The scope is the
one at the top of chat/calculator.h, decided here from the expression and Python's value (in_scope):
  * an expression of the first character set whose value is an int or a float (not the empty tuple, Ellipsis);
  * an expression of the second that is 'text'.count('sub') (COUNT_CALL);
  * either one at most MAX_CHARS long once the commas are removed, with at most MAX_PARENS nested parentheses.

Suites:
  * the tool calls of the committed data (the GSM8K annotations of dev/data/sft_mini, also as rendered into
    dev/data/sft_mini_tokens, and of dev/data/chat_bundle; the SpellingBee calls that sft.py's own code makes
    from the committed word lists, and that form over every word of the committed text): every one gives
    Python's text, and a summary of the counts is printed;
  * hand-picked cases of every rule with what nanochat gives (checked against Python first); cases out of scope
    and over the caps (Python gives a value, calc None); inputs that would take gigabytes or seconds (calc under
    a memory and a time limit);
  * thousands of random ones (seeded): arithmetic, count calls and near misses, token soups, random bytes.
Standard library only; CPython 3.10 to 3.13 give the same answers on all of it.
"""
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
from xsatest import REPO, binary, token_pieces  # noqa: E402

sys.path.insert(0, HERE)
import sft  # noqa: E402  (the SFT mixture's own GSM8K and SpellingBee code; the standard library at import)

CHARS_MATH = "0123456789*+-/.() "
CHARS_STR = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ "
DANGEROUS = ['__', 'import', 'exec', 'eval', 'compile', 'open', 'file', 'input', 'raw_input', 'globals', 'locals',
             'vars', 'dir', 'getattr', 'setattr', 'delattr', 'hasattr']
MAX_CHARS, MAX_PARENS = 1000, 100  # chat/calculator.h's caps
COUNT_CALL = re.compile(r""" *(?:'[^']*'|"[^"]*") *\. *count *\( *(?:'[^']*'|"[^"]*") *\) *""")


# ----------------------------------------------------------------------------------------------------
# the reference: nanochat's use_calculator, rule for rule

def _timeout(signum, frame):
    raise TimeoutError()


def eval_with_timeout(formula, max_time=3):
    """nanochat's eval_with_timeout: the value, or None for any exception (its 3 s alarm included)."""
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.setitimer(signal.ITIMER_REAL, max_time)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nanochat: SyntaxWarning; DeprecationWarning is ignored by default
            return eval(formula, {"__builtins__": {}}, {})
    except Exception:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def use_calculator(expr):
    """nanochat/engine.py's use_calculator."""
    expr = expr.replace(",", "")
    if all([x in CHARS_MATH for x in expr]):
        if "**" in expr:
            return None
        return eval_with_timeout(expr)
    if not all([x in CHARS_STR for x in expr]):
        return None
    expr_lower = expr.lower()
    if any(pattern in expr_lower for pattern in DANGEROUS):
        return None
    if '.count(' not in expr:
        return None
    return eval_with_timeout(expr)


def python_text(value):
    """The text nanochat's engine feeds back for a value (None: no result). str() of an int over 4300 digits
    raises (in nanochat's engine, outside its try): no result."""
    if value is None:
        return None
    try:
        return str(value)
    except ValueError:
        return None


def paren_depth(s):
    depth = deepest = 0
    for c in s:
        depth += (c == "(") - (c == ")")
        deepest = max(deepest, depth)
    return deepest


def in_scope(expr, value):
    """Whether the calculator gives nanochat's value for this expression (see the top of this file)."""
    e = expr.replace(",", "")
    if len(e) > MAX_CHARS:
        return False
    if all(c in CHARS_MATH for c in e):
        return type(value) in (int, float) and paren_depth(e) <= MAX_PARENS
    return COUNT_CALL.fullmatch(e) is not None


def expected(expr):
    """(what calc must print, Python's text): Python's text in scope, else None."""
    value = use_calculator(expr)
    text = python_text(value)
    return (text if text is not None and in_scope(expr, value) else None), text


def run_calc(exprs, memory_mb=None, timeout=600):
    """calc's answer for each expression: its text, or None. memory_mb: under that address-space limit (not with
    the sanitizer builds of $XSA_BIN_DIR, whose shadow memory takes terabytes of address space)."""
    assert not any("\n" in e for e in exprs), "an expression is one line"
    data = b"".join(e.encode("latin-1") + b"\n" for e in exprs)
    limit = None
    if memory_mb and not os.environ.get("XSA_BIN_DIR"):
        import resource
        limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))  # noqa: E731
    p = subprocess.run([binary("dev/data/bin/calc")], input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, preexec_fn=limit)
    if p.returncode != 0:
        raise AssertionError("calc exited %d: %s" % (p.returncode, p.stderr.decode("utf-8", "replace")[-2000:]))
    lines = p.stdout.decode("latin-1").split("\n")
    if len(lines) != len(exprs) + 1 or lines[-1] != "":
        raise AssertionError("calc printed %d lines for %d expressions" % (len(lines) - 1, len(exprs)))
    return [None if line == "None" else line for line in lines[:-1]]


def short(s, n=160):
    return s if len(s) <= n else s[:n] + "... (%d chars)" % len(s)


class Tally:
    """calc against the reference over a list of expressions (each distinct one run once)."""

    def __init__(self, exprs):
        self.calls, exprs = len(exprs), list(dict.fromkeys(exprs))
        self.distinct = len(exprs)
        self.values = self.nones = self.out_of_scope = 0  # agreeing: on a value, on None, None where Python has one
        self.mismatches = []                              # (expr, calc, Python)
        for expr, got in zip(exprs, run_calc(exprs)):
            want, text = expected(expr)
            if got != want:
                self.mismatches.append((expr, got, text))
            elif got is not None:
                self.values += 1
            elif text is None:
                self.nones += 1
            else:
                self.out_of_scope += 1

    def check(self, test, what, out_of_scope_ok=True):
        """Every expression as expected; out_of_scope_ok=False: none out of scope either (calc gives Python's text)."""
        text = ("%s: %d expressions (%d distinct): %d give Python's value, %d None on both sides, %d None where "
                "Python gives a value (out of scope, over a cap), %d disagree"
                % (what, self.calls, self.distinct, self.values, self.nones, self.out_of_scope, len(self.mismatches)))
        print("\n    " + text, file=sys.stderr)
        lines = ["%r: calc %r, Python %r" % (short(e), c, short(r or "None")) for e, c, r in self.mismatches[:25]]
        test.assertFalse(self.mismatches, "%s:\n  %s" % (text, "\n  ".join(lines)))
        if not out_of_scope_ok:
            test.assertEqual(self.out_of_scope, 0, text)


# ----------------------------------------------------------------------------------------------------
# the tool calls of the committed data

def python_parts(conversation):
    """The texts of a conversation's python parts: its tool calls."""
    return [p["text"] for m in conversation["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "python"]


def gsm8k_calls(path):
    return [c for _, row in sft.json_lines(os.path.join(REPO, path)) for c in python_parts(sft.gsm8k_conversation(row))]


def rendered_calls(path):
    """The tool calls in a committed SFT conversation file (dev/data/README.md), decoded with the embedded
    tokenizer: the tokens between <|python_start|> and <|python_end|>, as the trainer sees them."""
    pieces, _ = token_pieces(os.path.join(REPO, "dev/data/devil/tokenizer.bin"))
    start, end = pieces.index(b"<|python_start|>"), pieces.index(b"<|python_end|>")
    with open(os.path.join(REPO, path), "rb") as f:
        data = f.read()
    magic, _, c_lo, c_hi, n_lo, n_hi = struct.unpack_from("<6I", data, 0)
    assert magic == 20261202, path
    n_conv, n_tokens = c_lo | c_hi << 32, n_lo | n_hi << 32
    calls, call = [], None
    for t in struct.unpack_from("<%dI" % n_tokens, data, 1024 + 8 * (n_conv + 1)):
        if t == start:
            call = []
        elif t == end and call is not None:
            calls.append(b"".join(pieces[i] for i in call).decode("utf-8"))
            call = None
        elif call is not None:
            call.append(t)
    return calls


def committed_words():
    """Every word (ASCII letters, lowercased) of the committed SFT and ChatCORE text: a wider word list than the
    30 of words_alpha.txt for SpellingBee's form (nanochat's 370K-word list is not in the repository)."""
    words = set()
    for d in ("dev/data/sft_mini", "dev/data/chat_bundle"):
        for name in sorted(os.listdir(os.path.join(REPO, d))):
            if name.endswith((".jsonl", ".txt")):
                words.update(re.findall(r"[a-z]+", sft.read_text(os.path.join(REPO, d, name)).lower()))
    return sorted(words)


class TestToolCalls(unittest.TestCase):
    def test_committed_tool_calls(self):
        """every tool call of the committed data gives Python's text (None where Python's is None)"""
        mini_words = sft.WordList(os.path.join(REPO, "dev/data/sft_mini/words_alpha.txt")).words
        bundle_words = sft.WordList(os.path.join(REPO, "dev/data/chat_bundle/words_alpha.txt")).words
        sources = [
            ("GSM8K, SFT mixture (sft_mini gsm8k_train, gsm8k_test)",
             gsm8k_calls("dev/data/sft_mini/gsm8k_train.jsonl") + gsm8k_calls("dev/data/sft_mini/gsm8k_test.jsonl")),
            ("GSM8K, SFT mixture as rendered (sft_mini_tokens sft_train.bin, sft_val.bin)",
             rendered_calls("dev/data/sft_mini_tokens/sft_train.bin") + rendered_calls("dev/data/sft_mini_tokens/sft_val.bin")),
            ("GSM8K, ChatCORE (chat_bundle gsm8k_test)", gsm8k_calls("dev/data/chat_bundle/gsm8k_test.jsonl")),
            # the study mixture's 80,000 SpellingBee examples and ChatCORE's 256, made by sft.py's own code
            ("SpellingBee, study mixture (sft_mini words_alpha, 80,000 train examples)",
             [c for i in range(80000) for c in python_parts(sft.spelling_bee_conversation(mini_words, i, "train"))]),
            ("SpellingBee, ChatCORE (chat_bundle words_alpha, 256 test examples)",
             [c for i in range(256) for c in python_parts(sft.spelling_bee_conversation(bundle_words, i, "test"))]),
            ("SpellingBee's form, every word of the committed text x 26 letters",
             ["'%s'.count('%s')" % (w, c) for w in committed_words() for c in sft.SPELLING_LETTERS]),
        ]
        for what, calls in sources:
            self.assertTrue(calls, what)
            Tally(calls).check(self, what, out_of_scope_ok=False)


# ----------------------------------------------------------------------------------------------------
# hand-picked cases

BIG = "123456789012345678901234567890"
# (expression, what nanochat gives): calc gives the same (each is in scope, or None in Python)
CASES = [
    # the rules: commas, the two character sets, **, the forbidden patterns, .count(
    ("1,000,000*3", "3000000"), ("(1,2)", "12"), (",,,", None), ("", None), ("   ", None), (" 1", "1"), ("1 ", "1"),
    ("2**3", None), ("2* *3", None), ("7%3", None), ("2^3", None), ("1\t+1", None), ("1\r", None), ("1\x00", None),
    ("\xe9.count('a')", None), ("x", None), ("3 x 4", None), ("$5*2", None),
    ("'abc'.count('b')", "1"), ("'abc'.count ('b')", None), ("'abc'.upper()", None), ("'a-b'.count('-')", None),
    ("'directory'.count('r')", None), ("'OPEN'.count('o')", None), ("'a__b'.count('_')", None), ("'opening'.count('n')", None),
    ("'profile'.count('f')", None), ("'a_b'.count('_')", "1"), ("'Exec'.count('e')", None), ("'vars'.count('a')", None),
    ("'dirt'.count('t')", None), ("'abc'.count('b'),", "1"), ("'a,b'.count(',')", "3"),
    # numbers and arithmetic
    ("10/2", "5.0"), ("2/3", "0.6666666666666666"), ("3*4", "12"), ("-0.0", "-0.0"), ("0.0*-1", "-0.0"), ("7//2", "3"),
    ("-7//2", "-4"), ("7//-2", "-4"), ("-7//-2", "3"), ("7.5//2", "3.0"), ("-7.5//2", "-4.0"), ("7.5//-2", "-4.0"),
    ("-0.0//1", "-0.0"), ("0.0//-1", "-0.0"), ("1//0.0", None), ("1.0/0", None), ("0/0", None), ("1/0", None),
    ("5//0", None), ("5.0//0", None), ("2*-3", "-6"), ("(1+2)*3", "9"), (".5", "0.5"), ("5.", "5.0"), ("1..2", None),
    ("1.2.3", None), ("1 .5", None), ("1. 5", None), (". 5", None), (".", None), ("-", None), ("()*1.5", None),
    ("()+1", None), ("-()", None), ("()//1", None), ("()*9223372036854775808", None), ("...+1", None), ("... ...", None),
    ("007", None), ("00", "0"), ("0", "0"), ("000", "0"), ("0.07", "0.07"), ("007.5", "7.5"), ("00.5", "0.5"), ("08", None),
    ("0" * 5000 + "1", None), ("--5", "5"), ("+-+-5", "5"), ("- - 5", "5"), ("- -5", "5"), ("-(-5)", "5"), ("+5.5", "5.5"),
    ("3 4", None), ("3 (4)", None), ("(3)(4)", None), ("()()", None), ("()(*())", None), ("(*())", None), ("*()", None),
    ("1 2", None), ("1/", None), ("/1", None), ("1//", None), ("1///2", None), ("1/ /2", None), ("(1", None), ("1)", None),
    (")(", None), ("12*.25", "3.0"), ("1/2*10", "5.0"), ("(1/3)*60", "20.0"), ("4-7", "-3"), ("3*2.50", "7.5"),
    ("99999999999*99999999999", "9999999999800000000001"), (BIG + "*" + BIG, str(int(BIG) ** 2)),
    (BIG + "//7", str(int(BIG) // 7)), ("-" + BIG + "//7", str(-int(BIG) // 7)), (BIG + "-" + BIG + "1", str(int(BIG) - int(BIG + "1"))),
    ("9007199254740993/1", "9007199254740992.0"), ("9007199254740995/1", "9007199254740996.0"),
    ("9007199254740993*1.0", "9007199254740992.0"), ("9007199254740993+0.0", "9007199254740992.0"),
    ("1/3", "0.3333333333333333"), (BIG + "/" + BIG[::-1], None), (BIG + "/" + BIG[::-1].lstrip("0"), repr(int(BIG) / int(BIG[::-1]))),
    ("1" + "0" * 400 + "/3", None), ("1" + "0" * 308 + "/1", "1e+308"), ("1" + "0" * 309 + "/1", None),
    ("1/1" + "0" * 400, "0.0"), ("-1/1" + "0" * 400, "-0.0"), ("0/-5", "-0.0"), ("-0/5", "0.0"), ("0.0/-5", "-0.0"),
    ("1" + "0" * 309 + "*1.0", None), ("1" + "0" * 308 + "*1.0", "1e+308"),
    ("1" + "0" * 309 + ".0", "inf"), ("-1" + "0" * 309 + ".0", "-inf"), ("1" + "0" * 309 + ".0-1" + "0" * 309 + ".0", "nan"),
    ("1" + "0" * 309 + ".0*0", "nan"), ("1" + "0" * 309 + ".0//1", "nan"), ("1//1" + "0" * 309 + ".0", "0.0"),
    ("-1//1" + "0" * 309 + ".0", "-1.0"), ("0." + "0" * 322 + "5", "5e-323"), ("0." + "0" * 400 + "1", "0.0"),
    ("0.1+0.2", "0.30000000000000004"), ("1.1*1.1", "1.2100000000000002"), ("100000000000000000.0", "1e+17"),
    ("10000000000000000.0", "1e+16"), ("1000000000000000.0", "1000000000000000.0"), ("0.0001", "0.0001"),
    ("0.00001", "1e-05"), ("0.000015", "1.5e-05"), ("150000000000000000000.0", "1.5e+20"), ("1/7", "0.14285714285714285"),
    ("123456789.123456789", "123456789.12345679"), ("2/0.5", "4.0"), ("10/4", "2.5"), ("3-5", "-2"), ("-3*-3", "9"),
    ("1" * 4301, None), ("1" * 3000 + "*" + "1" * 3000, None), ("(" * 201 + "1" + ")" * 201, None),
    ("1" + "+1" * 20000, None), ("-" * 20000 + "1", None),
    # up to the caps: 1000 characters (once the commas are removed), 100 parentheses
    ("(" * 100 + "1" + ")" * 100, "1"), ("(" * 100 + "-" * 799 + "1" + ")" * 100, "-1"), ("(-" * 100 + "1" + ")" * 100, "1"),
    ("1" + "+1" * 499, "500"), ("-" * 999 + "1", "-1"), ("1," * 900 + "1", "1" * 901), ("9" * 1000, "9" * 1000),
    ("9" * 499 + "*" + "9" * 500, str(int("9" * 499) * int("9" * 500))),
    # 'text'.count('sub')
    ("'strawberry'.count('r')", "3"), ('"strawberry".count("r")', "3"), ("'abc'.count('')", "4"), ("''.count('')", "1"),
    ("''.count('a')", "0"), ("'aaa'.count('aa')", "1"), ("'Mississippi'.count('ss')", "2"), ("'ABC'.count('a')", "0"),
    ('"it\'s".count("\'")', "1"), ("'say \"hi\"'.count('\"')", "2"), (" 'abc' .count( 'b' ) ", "1"),
    ("'abc'. count('b')", None), ("'abc'. count('.count(')", "0"), ("'a'.count('.count(')", "0"), ("'.count('.count ('(')", "1"),
    ("'a b c'.count(' ')", "2"), ("'a'.count(\"'\")", "0"), ("'" + "a" * 987 + "'.count('a')", "987"),
    # what Python refuses
    ("'abc.count('b')", None), ("'a'.count('a'", None), ("'a'.count('a'))", None), ("'a'.count()", None),
    ("'a'.count(1)", None), ("'a'.count(a)", None), ("b'ab'.count('b')", None), ("'ab'.count(b'b')", None),
    ("'''a''''.count('a')", None), ("'''''.count('')", None), ("ur'ab'.count('b')", None), ("bu'a'.count('a')", None),
    ("rr'a'.count('a')", None), ("x or 'a'.count('a')", None), ("'a'.count('a')('a')", None), ("None.count('a')", None),
    ("'a'.upper.count('a')", None), ("lambda x 'a'.count('a')", None), ("yield 'a'.count('a')", None),
    ("import os.count(1)", None), ("'a'.count('a')x", None), ("'a'.count('a') 'b'", None), ("'a'.count('a').count('a')", None),
    ("count('a')", None), (".count('a')", None), ("'a'.count('a' 'a' x)", None),
]
# Python gives a value, calc None: out of scope
OUT_OF_SCOPE = [
    "()", "(())", "( )", "() + ()", "()*3", "3*()", "()*-5", "()*9223372036854775807", "...", "(...)",
    "'x.count(y'", "('strawberry').count('r')", "('straw' 'berry').count('r')", "'straw''berry'.count('r')",
    "'''it's'''.count('t')", "r'ab'.count('b')", "R'ab'.count(u'b')", "f'ab'.count(F'b')", "b'ab'.count(b'b')",
    "'a'.count('a' 'a')", "'abc'.count(('b'))", "'Hello World'.lower().count('o')", "'a b'.split().count('b')",
    "' '.join('abc').count(' ')", "'a'.center(5).count(' ')", "b'abc'.count(97)", "'a'.count('a') or x",
    "not 'a'.count('a')", "'a'.count('a') if 1 else 2", "1if 'a'.count('a') else 2", "0x1f if 'a'.count('a') else 0",
    "1e5 if 'a'.count('a') else 0", "2j if 'a'.count('a') else 0", "'a'.count('a') is None", "'a'.count('a') and b'x'",
    "True and 'a'.count('a')", "'a'.count('a') if 'x.count(y' else 0",
]
# Python gives a value, calc None: over a cap (1000 characters, 100 parentheses)
OVER_CAPS = [
    "1" + "+1" * 500, "-" * 1000 + "1", "(" * 101 + "1" + ")" * 101, "(" * 150 + "1" + ")" * 150, "0" * 5000, "1" * 4300,
    "1" * 4300 + "+1", "(" + "9" * 800 + "*" + "9" * 800 + ")//" + "9" * 800, "1" * 4301 + ".0", "1" * 1001,
    "'" + "a" * 988 + "'.count('a')", "'a'.count('" + "a" * 990 + "')",
]
# inputs that would take gigabytes or seconds (Python is not run on these): calc gives None, in little memory and time
BOMBS = [
    "'a'.zfill(99999).join('b'.zfill(99999)).count('a')",  # 10 GB in the calculator before this one
    "'a'.center(99999).join('a'.center(99999)).count('a')",
    "'ab'.join('ab'.join('ab'.join('ab'.join('ab'.join('ab'.join('ab'.join('abcd'))))))).count('a')",
    "'a'.center(99999999999).count('a')", "'a'.zfill(2147483647).count('0')", "'a'.expandtabs(2147483647).count('a')",
    "9" * 100000 + "*" + "9" * 100000, "(" * 100000 + "1" + ")" * 100000, "-" * 1000000 + "1", "1" + "+1" * 500000,
    ",".join(["9" * 1000] * 500),
]
# the slowest expressions under the caps: calc gives Python's text, quickly
WORST = [
    "9" * 499 + "*" + "9" * 500, "9" * 300 + "//7" * 233, "9" * 500 + "/" + "7" * 499, "1/" + "9" * 998,
    "(" + "9" * 330 + "*" + "9" * 330 + ")//" + "9" * 330, "9" * 998 + ".0", "9" * 300 + "/1.5" * 150,
    "(" * 100 + "-" * 799 + "9" + ")" * 100, "9" * 250 + "*" + "9" * 250 + "*" + "9" * 247 + "*" + "9" * 248,
    "'" + "a" * 700 + "'.count('" + "a" * 280 + "b')", "'" + "ab" * 490 + "'.count('b')",
]


class TestCases(unittest.TestCase):
    def test_hand_picked(self):
        """hand-picked cases of every rule: Python gives what nanochat's rules say, and calc the same"""
        for expr, want in CASES:
            self.assertEqual(python_text(use_calculator(expr)), want, "Python on %r" % short(expr))
        Tally([e for e, _ in CASES]).check(self, "hand-picked", out_of_scope_ok=False)

    def test_out_of_scope(self):
        """what Python gives a value for outside the calculator's scope or over its caps: calc gives None"""
        exprs = OUT_OF_SCOPE + OVER_CAPS
        for expr in exprs:
            value = use_calculator(expr)
            self.assertTrue(value is not None and not in_scope(expr, value), "Python on %r: %r" % (short(expr), value))
        for expr, got in zip(exprs, run_calc(exprs)):
            self.assertIsNone(got, "calc on %r" % short(expr))

    def test_bombs(self):
        """inputs that would take gigabytes or seconds: None from calc within 256 MB; the slowest expressions under
        the caps (20 times each): Python's text; all of it in well under a second"""
        start = time.monotonic()
        self.assertEqual(run_calc(BOMBS, memory_mb=256, timeout=60), [None] * len(BOMBS))
        got = run_calc(WORST * 20, memory_mb=256, timeout=60)
        seconds = time.monotonic() - start
        want = [expected(e)[0] for e in WORST]
        self.assertTrue(all(w is not None for w in want), want)
        self.assertEqual(got, want * 20)
        self.assertLess(seconds, 5, "calc took %.1f s" % seconds)

    def test_plain_output(self):
        """one line per line of input (the last one without '\\n' too), None for no result; an argument: error"""
        calc = binary("dev/data/bin/calc")
        p = subprocess.run([calc], input=b"10/2\n'a'.count('a') or 1\n\n2*3", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, b"5.0\nNone\nNone\n6\n", b""))
        p = subprocess.run([calc], input=b"", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, b"", b""))
        p = subprocess.run([calc, "--tagged"], input=b"1\n", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual((p.returncode, p.stdout), (1, b""))
        self.assertTrue(p.stderr.startswith(b"error: ") and p.stderr.count(b"\n") == 1, p.stderr)


# ----------------------------------------------------------------------------------------------------
# random expressions

def sp(rng):
    return rng.choice(["", "", "", " ", " ", "  "])


def int_literal(rng):
    r = rng.random()
    if r < 0.45:
        n = str(rng.randint(0, 20))
    elif r < 0.75:
        n = str(rng.randint(0, 10 ** rng.randint(1, 12)))
    elif r < 0.9:
        n = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.randint(10, 70)))
    elif r < 0.95:
        n = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.randint(70, 400)))
    else:
        n = rng.choice(["0", "00", "000", "007", "0" + str(rng.randint(1, 99)), "1" + "0" * rng.randint(14, 25), "9007199254740993"])
    if len(n) > 3 and rng.random() < 0.08:  # thousands separators, or commas anywhere
        if rng.random() < 0.7:
            head = len(n) % 3 or 3
            n = n[:head] + "".join("," + n[i:i + 3] for i in range(head, len(n), 3))
        else:
            i = rng.randint(1, len(n) - 1)
            n = n[:i] + "," + n[i:]
    return n


def float_literal(rng):
    r = rng.random()
    d = lambda lo, hi: "".join(rng.choice("0123456789") for _ in range(rng.randint(lo, hi)))  # noqa: E731
    if r < 0.5:
        return "%s.%s" % (rng.randint(0, 1000), d(1, 6))
    if r < 0.6:
        return "." + d(1, 5)
    if r < 0.7:
        return str(rng.randint(0, 100)) + "."
    if r < 0.8:
        return "0." + "0" * rng.randint(0, 8) + d(1, 20)
    if r < 0.87:
        return d(1, 25) + "." + d(0, 25)
    if r < 0.92:
        return rng.choice(["007.5", "00.5", "0.07", "0.0", "0.", "1" + "0" * rng.randint(305, 312) + ".0", "0." + "0" * rng.randint(300, 330) + "7"])
    return str(rng.randint(1, 9)) + "0" * rng.randint(14, 22) + ".0"


def ratio(rng):
    """big / big: exponents from 1e-400 to 1e400 (overflow, subnormals, underflow), and ints meeting floats"""
    a = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 400)))
    b = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 400)))
    op = rng.choice(["/", "/", "/", "//", "*", "+", "-"])
    if rng.random() < 0.3:
        b = float_literal(rng)
    s = rng.choice(["", "-"]) + a + sp(rng) + op + sp(rng) + rng.choice(["", "-"]) + b
    return s if rng.random() < 0.5 else s + sp(rng) + rng.choice(["/", "*", "//", "+"]) + sp(rng) + rng.choice([float_literal(rng), int_literal(rng)])


def arith(rng, depth):
    if depth <= 0 or rng.random() < 0.25:
        r = rng.random()
        if r < 0.6:
            return int_literal(rng)
        if r < 0.96:
            return float_literal(rng)
        return rng.choice(["()", "( )", "...", "(())"])
    r = rng.random()
    if r < 0.6:
        op = rng.choice(["+", "-", "*", "/", "//", "+", "-", "*", "/", "//", "*"])
        return arith(rng, depth - 1) + sp(rng) + op + sp(rng) + arith(rng, depth - 1)
    if r < 0.75:
        return "".join(rng.choice("+-") + sp(rng) for _ in range(rng.randint(1, 3))) + arith(rng, depth - 1)
    if r < 0.97:
        return "(" + sp(rng) + arith(rng, depth - 1) + sp(rng) + ")"
    return "(" + arith(rng, depth - 1) + ")" + sp(rng) + "(" + rng.choice(["", arith(rng, depth - 1), "*()"]) + ")"


def mutate(rng, s, chars):
    for _ in range(rng.randint(1, 3)):
        i = rng.randint(0, len(s))
        r = rng.random()
        if r < 0.4:
            s = s[:i] + rng.choice(chars) + s[i:]
        elif r < 0.7:
            s = s[:i] + s[i + 1:]
        else:
            s = s[:i] + rng.choice(chars) + s[i + 1:]
    return s


def math_expr(rng):
    r = rng.random()
    if r < 0.2:
        s = ratio(rng)
    else:
        s = arith(rng, rng.randint(1, 6))
    r = rng.random()
    if r < 0.08:
        s = mutate(rng, s, CHARS_MATH)
    elif r < 0.1:
        s = s + rng.choice(["**", "%", "*", " ** "]) + int_literal(rng)
    return s




COUNT_WORDS = ["strawberry", "Mississippi", "bookkeeper", "hello world", "Hello World", "a", "", "aaa", "it's",
               'say "hi"', "a.b_c", "(x)", "x.count(y", "opening", "profile", "directory", "Exec", "__x", "vars", "1.5"]


def quoted(rng, s):
    """s in quotes Python takes (where s holds both kinds: a SyntaxError)"""
    q = rng.choice(["'", '"'])
    if q in s:
        q = "'" if q == '"' else '"'
    return q + s + q


def count_call(rng):
    """'text'.count('sub') in the spellings Python takes, near misses (mutations) and forms out of scope"""
    text = rng.choice(COUNT_WORDS) if rng.random() < 0.6 else "".join(rng.choice(CHARS_STR) for _ in range(rng.randint(0, 12)))
    sub = (rng.choice(["a", "r", "s", "", " ", "ss", "o", "A", "'", '"', "x", "ab"]) if rng.random() < 0.8
           else "".join(rng.choice(CHARS_STR) for _ in range(rng.randint(0, 3))))
    s = "".join([sp(rng), quoted(rng, text), sp(rng), ".", sp(rng), "count", sp(rng), "(", sp(rng), quoted(rng, sub),
                 sp(rng), ")", sp(rng)])
    r = rng.random()
    if r < 0.15:
        s = mutate(rng, s, CHARS_STR)
    elif r < 0.35:  # out of scope: Python gives a value (or raises), calc None
        s = rng.choice([
            "r" + s.lstrip(), "(" + s + ")", "(%s).count('a')" % quoted(rng, text), "%s %s.count('a')" % (quoted(rng, text), quoted(rng, sub)),
            "'''%s'''.count('a')" % text, "%s.lower().count('a')" % quoted(rng, text), s + " or x", s + " if 1 else 2",
            "not " + s, s + " is 1", "%s.count(%s)" % (quoted(rng, text), rng.choice(["1", "x", "", "('a')", "'a' 'b'"]))])
    return s


TOKENS = ["'a'", '"b"', "'''c'''", "b'a'", "r'x'", "'", '"', "(", ")", "(", ")", ".", "...", ".count(", ".count", "count",
          "x", "and", "or", "not", "in", "is", "if", "else", "for", "lambda", "None", "True", "False", "1", "0", "007", "1e5",
          "2j", "0x1f", "1_0", "_", "upper()", ".upper()", "split", " ", " ", "  ", "'ab'", "1.5", "yield", "await", "class"]


def token_soup(rng):
    s = "".join(rng.choice(TOKENS) + rng.choice(["", " "]) for _ in range(rng.randint(1, 12)))
    if ".count(" not in s and rng.random() < 0.7:
        s += ".count('a')" if rng.random() < 0.5 else " or 'a'.count('a')"
    return s


def garbage(rng):
    r = rng.random()
    if r < 0.35:
        return "".join(rng.choice(CHARS_MATH + ",") for _ in range(rng.randint(0, 20)))
    if r < 0.7:
        s = "".join(rng.choice(CHARS_STR + ",") for _ in range(rng.randint(0, 25)))
        if rng.random() < 0.7:
            i = rng.randint(0, len(s))
            s = s[:i] + ".count(" + s[i:]
        return s
    return "".join(chr(rng.randint(0, 255)) for _ in range(rng.randint(0, 20))).replace("\n", "")




class TestRandom(unittest.TestCase):
    def test_arithmetic(self):
        """random arithmetic over 0123456789*+-/.() and commas: GSM8K-like, long ints, floats at the extremes"""
        rng = random.Random(1234)
        Tally([math_expr(rng) for _ in range(5000)]).check(self, "random arithmetic")

    def test_count_calls(self):
        """random 'text'.count('sub') calls, their near misses and forms out of scope"""
        rng = random.Random(5678)
        Tally([count_call(rng) for _ in range(5000)]).check(self, "random count calls")

    def test_garbage(self):
        """token soups, random strings over both character sets, random bytes"""
        rng = random.Random(91011)
        Tally([token_soup(rng) for _ in range(2000)] + [garbage(rng) for _ in range(2000)]).check(self, "token soups and garbage")


if __name__ == "__main__":
    unittest.main()
