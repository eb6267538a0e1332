"""
A tokenizer file (dev/data/README.md, "Tokenizer"; climbmix.py writes them) read without tiktoken: the standard
library only, so that the reference scripts run under Debian's python3 (torch, no tiktoken).

    tok = TokenizerFile(path)
    tok.decode(ids)            # text: the tokens' bytes concatenated (a special token's bytes are its text),
                               # then UTF-8 with errors="replace", as tiktoken's Encoding.decode
    tok.encode_ordinary(text)  # ids, as tiktoken's Encoding.encode_ordinary with the file's ranks and pattern
    tok.special["<|bos|>"]     # the special tokens' ids
    tok.fingerprint()          # train_gpt's tokenizer fingerprint (recorded in exported weights)

encode_ordinary is tiktoken's algorithm written out: the text is cut into chunks by the file's split pattern
(leftmost-first matches, as fancy-regex finds them), and each chunk is one token if its bytes are a token, else
byte-pair merged: start from single bytes, repeatedly merge the adjacent pair whose concatenation has the lowest
rank (id), the leftmost one on ties, until no adjacent pair is a token. Python's re has no \\p{...}: the
pattern's \\p{L} (letters: Lu Ll Lt Lm Lo), \\p{N} (numbers: Nd Nl No) and \\s / \\S (Unicode White_Space, as the
Rust regex crate defines \\s; Python's own \\s also takes U+001C..U+001F) are replaced by explicit classes built
from Python's unicodedata; the possessive quantifiers ?+ and ++ need Python >= 3.11. Exact for ASCII text (all
that score_chat.py encodes: the calculator's results); for other text the classes follow Python's Unicode
version, which may differ from tiktoken's in characters added recently.
"""
import re
import struct
import sys
import unicodedata

TOKENIZER_MAGIC = 20241201
HEADER_INTS = 256
# nanochat's pattern: what a version-1 file (which stores none) was written with
NANOCHAT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
               (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]  # Unicode PropList.txt


class TokenizerFileError(Exception):
    pass


def _ranges(prefix):
    """[(lo, hi)] of the code points whose general category starts with prefix ('L' or 'N')."""
    out, start = [], None
    for cp in range(sys.maxunicode + 1):
        if unicodedata.category(chr(cp)).startswith(prefix):
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, sys.maxunicode))
    return out


def _class_body(ranges):
    def esc(cp):
        return f"\\U{cp:08x}"
    return "".join(esc(lo) if lo == hi else f"{esc(lo)}-{esc(hi)}" for lo, hi in ranges)


_CLASSES = {}


def translate_pattern(pattern):
    """The split pattern with \\p{L}, \\p{N}, \\s and \\S replaced by explicit classes (for Python's re)."""
    if not _CLASSES:
        _CLASSES.update(L=_class_body(_ranges("L")), N=_class_body(_ranges("N")), s=_class_body(WHITE_SPACE))
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1:i + 2]
            if nxt == "p" or nxt == "P":
                m = re.match(r"\{(\w+)\}", pattern[i + 2:])
                if nxt == "P" or not m or m.group(1) not in ("L", "N"):
                    raise TokenizerFileError(f"split pattern: unsupported {pattern[i:i + 8]!r} (only \\p{{L}} and \\p{{N}})")
                body = _CLASSES[m.group(1)]
                out.append(body if in_class else f"[{body}]")
                i += 2 + len(m.group(0))
                continue
            if nxt in ("s", "S"):
                if in_class and nxt == "S":
                    raise TokenizerFileError("split pattern: \\S inside a character class is not supported")
                body = _CLASSES["s"]
                out.append(body if in_class else (f"[{body}]" if nxt == "s" else f"[^{body}]"))
                i += 2
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            # a ']' or '^]' right after '[' is a literal
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1:i + 2] == "]":
                out.append("]")
                i += 1
        elif c == "]" and in_class:
            in_class = False
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


class TokenizerFile:
    def __init__(self, path):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise TokenizerFileError(f"{path}: cannot read ({e.strerror})")
        if len(data) < 4 * HEADER_INTS:
            raise TokenizerFileError(f"{path}: not a tokenizer file (shorter than its header)")
        h = struct.unpack_from(f"<{HEADER_INTS}i", data, 0)
        if h[0] != TOKENIZER_MAGIC or h[1] not in (1, 2):
            raise TokenizerFileError(f"{path}: not a tokenizer file (magic {h[0]} version {h[1]})")
        self.vocab_size, self.bos = h[2], h[3]
        pos = 4 * HEADER_INTS
        self.pattern = NANOCHAT_PATTERN
        if h[1] == 2:
            self.pattern = data[pos:pos + h[5]].decode("utf-8")
            pos += h[5]
        self.pieces, self.special, self.ranks = [], {}, {}
        try:
            for i in range(self.vocab_size):
                is_special, n = struct.unpack_from("<BI", data, pos)
                b = data[pos + 5:pos + 5 + n]
                if len(b) != n:
                    raise struct.error("truncated")
                pos += 5 + n
                self.pieces.append(b)
                if is_special:
                    self.special[b.decode("utf-8")] = i
                else:
                    self.ranks[b] = i
        except struct.error:
            raise TokenizerFileError(f"{path}: truncated tokenizer file")
        self.special_ids = set(self.special.values())
        self._regex = None

    def fingerprint(self):
        """train_gpt's tokenizer_fingerprint (the `tokenizer_fingerprint` of exported weights): FNV-1a 64 over every
        token's special flag (1 byte), byte length (uint32 LE) and bytes, as 16 hex digits."""
        h = 1469598103934665603
        for i, p in enumerate(self.pieces):
            for b in bytes([i in self.special_ids]) + struct.pack("<I", len(p)) + p:
                h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        return f"{h:016x}"

    def decode_bytes(self, ids):
        return b"".join(self.pieces[i] for i in ids)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _bpe(self, piece):
        if piece in self.ranks:
            return [self.ranks[piece]]
        parts = [piece[k:k + 1] for k in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for k in range(len(parts) - 1):
                r = self.ranks.get(parts[k] + parts[k + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, k
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [self.ranks[p] for p in parts]

    def encode_ordinary(self, text):
        if self._regex is None:
            self._regex = re.compile(translate_pattern(self.pattern))
        ids = []
        for m in self._regex.finditer(text):
            ids.extend(self._bpe(m.group(0).encode("utf-8")))
        return ids
