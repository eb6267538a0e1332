"""dictd databases, the format of Debian's dict-* dictionary packages: `NAME.index` lists each headword
with the offset and length of its entry in `NAME.dict` (numbers in base64 digits, most significant
first; `NAME.dict.dz` is gzip-compatible). Read by make_devil.py (the embedded corpus) and gcide.py."""

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


class DictdError(Exception):
    pass


def b64_number(s):
    v = 0
    for c in s:
        if c not in B64:
            raise ValueError(f"{c!r} is not a base64 digit")
        v = v * 64 + B64.index(c)
    return v


def entries(data, index_text, where, errors="strict"):
    """The entries of the dictionary text `data` (bytes) as strings, in file order: one per distinct span
    (aliases point at the same text), dictd's own 00-database-* records left out, trailing whitespace
    stripped, empty entries dropped. `errors`: how bytes that are not UTF-8 are decoded ("strict": an error)."""
    spans = set()
    for line in index_text.splitlines():
        if not line.strip():
            continue
        parts = line.split("\t")
        try:
            if len(parts) != 3:
                raise ValueError("not 3 fields")
            word, off, length = parts
            if word.startswith("00database") or word.startswith("00-database"):
                continue
            span = (b64_number(off), b64_number(length))
        except ValueError:
            raise DictdError(f"{where}: bad index line {line[:80]!r}")
        if span[0] + span[1] > len(data):
            raise DictdError(f"{where}: the entry of {word!r} ends past the dictionary's text ({span[0]} + {span[1]} > {len(data)})")
        spans.add(span)
    out = []
    for off, length in sorted(spans):
        text = data[off:off + length].decode("utf-8", errors).rstrip()
        if text:
            out.append(text)
    return out
