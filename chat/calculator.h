// calculator.h: nanochat's calculator tool (nanochat/engine.py: use_calculator, eval_with_timeout) in C++.
//
//   static inline bool calculator_eval(const std::string& expr, std::string* out, bool* unsupported = nullptr);
//
// The chat model writes <|python_start|> expr <|python_end|>; the inference engine evaluates expr and, when
// the result is not None, feeds <|output_start|> str(result) <|output_end|> back. calculator_eval returns
// false for None and otherwise true with *out = str(result), exactly as nanochat under CPython 3.10 (its
// .python-version) and 3.11, which agree on all of this (dev/data/test_calculator.py compares the two on
// thousands of expressions). Where a result is None only because this file does not implement what Python
// would do (the list under "Unsupported" below), *unsupported (if given) is set to true; it is false for
// every other result. Later Pythons differ here and there: 3.12's str.splitlines takes any object, its int
// has is_integer, and its huge-int // and str() import a module (_pylong), which fails under the empty
// builtins; 3.13 takes deeper nesting.
//
// nanochat's rules, in order:
//  1. expr = expr with every ',' removed.
//  2. If every character is one of "0123456789*+-/.() ": None if "**" occurs, else the value of Python's
//     eval(expr, {"__builtins__": {}}, {}) (with a 3 s timeout); any exception gives None.
//  3. Else every character must be one of a-z A-Z 0-9 ' " ( ) . _ and space (else None); None if the
//     lowercased expr contains any of __ import exec eval compile open file input raw_input globals locals
//     vars dir getattr setattr delattr hasattr (anywhere, string literals included); None if ".count(" does
//     not occur; else eval as in 2.
//  4. The text is str(result). (A None result gives None. An int of more than 4300 decimal digits gives
//     None here: Python's str() raises ValueError for it, outside nanochat's try, so the engine would stop.)
//
// What Python's eval does with those characters, and so what this file implements:
//  * Tokens as CPython 3.10/3.11's tokenizer reads them: int literals (decimal, 0x 0o 0b, '_' separators, no
//    leading zeros except in 0, 00, ...; over 4300 decimal digits: SyntaxError), float literals (5. .5 007.5
//    1e5 1_0.5e3; correctly rounded, overflow to inf), imaginary literals (2j), string and bytes literals
//    ('...', "...", '''...''', """...""", prefixes r u f b br rb fr rf in any case; no backslash can occur,
//    so no escapes; adjacent literals concatenate, bytes with str is a SyntaxError), names, keywords,
//    ( ) . ... + - * / //. A number running into a letter is a SyntaxError except before the keywords
//    and else for if in is not or (1if 1else 2 is 1: a deprecation warning only). Leading spaces are
//    dropped as eval does. More than 200 nested parentheses: SyntaxError.
//  * The expression grammar: a if b else c, or, and, not, the comparisons in, not in, is, is not (chained:
//    a in b in c is (a in b) and (b in c), c unevaluated when the first is false), binary + - (left),
//    * / // (left), unary + -, calls, attribute access, parenthesised expressions, () and ....
//    (% and ** cannot occur: % is in neither character set, "**" is refused; lambda needs ':' and so is
//    always a SyntaxError; yield and await are SyntaxErrors outside a function; names other than True
//    False None are unbound (the builtins are empty): NameError when evaluated.) Evaluation is lazy as in
//    Python: 'a'.count('a') or x is 1.
//  * Arithmetic as Python's: ints are unbounded (exact + - * and floor division //), int / int is the
//    correctly rounded float (OverflowError when too large), an int meeting a float is converted to the
//    correctly rounded float (OverflowError over 1.8e308), float // is CPython's floor division (inf // 1 is
//    nan), division by zero raises; () + (), () * n and n * () give () (OverflowError beyond 64 bits).
//  * Values: int, bool, float, complex (only from literals: real part +0), None, str, bytes, tuples, lists,
//    Ellipsis, bound methods (truthy, never equal, not printable). The methods of str and bytes (all of them
//    except those listed below), of list and tuple (count index, and list's append clear copy extend insert
//    pop remove reverse sort: those return None or raise, which matters under and/or/if), and of the numbers
//    (real imag numerator denominator conjugate bit_length bit_count as_integer_ratio is_integer). At most
//    one argument can be written (no commas), so replace, maketrans and insert always raise TypeError.
//  * str(result): Python's repr of floats (shortest round-trip digits; exponent form below 1e-4 and from
//    1e16: 1e-05, 1e+16, 1.5e+20; inf, nan, -0.0), of complex numbers (2j, 1e+16j), of str and bytes inside
//    tuples and lists ('a', "it's", b'x'), Ellipsis, True, False.
//
// Unsupported (returns None and sets *unsupported, where Python may give a value; all far from what a chat
// model writes):
//  * generator expressions (any use of the keywords for or async);
//  * x is y when x and y are equal floats, complex numbers, strs or bytes, or equal ints outside -5..256
//    (the answer is a CPython implementation detail: constant sharing, caches). Everything else about `is`
//    is implemented: None, True, False, Ellipsis, () and the ints -5..256 are singletons in CPython; different
//    values or types are different objects; each list, non-empty tuple and bound method is a new object;
//  * printing a bound method (its text holds a memory address);
//  * the methods str.encode and bytes.decode with an argument (codec names), bytes.hex with an argument,
//    bytes.fromhex, int.to_bytes, int.from_bytes, float.hex, float.fromhex (bytes.fromhex and int.to_bytes
//    would bring characters outside the character sets into strings);
//  * str/bytes center ljust rjust zfill to a width over 100000 (Python builds the string or raises
//    MemoryError);
//  * ints of more than 4096 32-bit limbs (about 39500 decimal digits, or 32768 hex digits in a literal)
//    anywhere in a computation, e.g. the
//    product of ten 4000-digit literals (Python computes it when its 3 s timeout allows; the result has too
//    many digits for str() unless divided down again);
//  * expressions nested more than 100 parentheses deep (Python's parser runs out of stack at about 28
//    stack levels per parenthesis, 6000 in all, the exact point depending on the constructs inside), or whose
//    syntax tree is more than 1000 levels deep (Python: RecursionError at about 3000 levels, less the caller's
//    stack depth times 3). Within these limits Python never fails for depth; beyond them it may or may not.
// Python's 3 s timeout cannot trigger within these limits (no ** operator; int sizes are bounded by the
// input length). The work here is at most about quadratic in the input length.
//
// No exception leaves calculator_eval (std::bad_alloc included: None), and no input can crash it.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

namespace calc_detail {

// ------------------------------------------------------------------------------------------------
// errors: Python raised (None), or this file does not implement what Python would do (None, flagged)

struct Fail {
    bool unsupported;
};
[[noreturn]] static inline void py_error() { throw Fail{false}; }
[[noreturn]] static inline void unsupported() { throw Fail{true}; }

// ------------------------------------------------------------------------------------------------
// unbounded integers: sign and magnitude, base 2^32 limbs, least significant first, no leading zero limbs

constexpr size_t MAX_LIMBS = 4096;

struct Big {
    bool neg = false;
    std::vector<uint32_t> m;
    bool is_zero() const { return m.empty(); }
    void trim() {
        while (!m.empty() && m.back() == 0) m.pop_back();
        if (m.empty()) neg = false;
    }
};

static inline void check_size(const Big& a) {
    if (a.m.size() > MAX_LIMBS) unsupported();
}

static inline Big big_from_u64(uint64_t v, bool neg = false) {
    Big b;
    if (v) b.m.push_back((uint32_t)v);
    if (v >> 32) b.m.push_back((uint32_t)(v >> 32));
    b.neg = neg && v;
    return b;
}

static inline int cmp_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
    for (size_t i = a.size(); i-- > 0;)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

static inline int big_cmp(const Big& a, const Big& b) {
    if (a.neg != b.neg) return a.neg ? -1 : 1;
    int c = cmp_mag(a.m, b.m);
    return a.neg ? -c : c;
}

static inline std::vector<uint32_t> add_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    const std::vector<uint32_t>& x = a.size() >= b.size() ? a : b;
    const std::vector<uint32_t>& y = a.size() >= b.size() ? b : a;
    std::vector<uint32_t> r(x.size() + 1);
    uint64_t carry = 0;
    for (size_t i = 0; i < x.size(); i++) {
        uint64_t s = (uint64_t)x[i] + (i < y.size() ? y[i] : 0) + carry;
        r[i] = (uint32_t)s;
        carry = s >> 32;
    }
    r[x.size()] = (uint32_t)carry;
    return r;
}

// a - b for |a| >= |b|
static inline std::vector<uint32_t> sub_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    std::vector<uint32_t> r(a.size());
    int64_t borrow = 0;
    for (size_t i = 0; i < a.size(); i++) {
        int64_t t = (int64_t)a[i] - borrow - (int64_t)(i < b.size() ? b[i] : 0);
        borrow = t < 0;
        r[i] = (uint32_t)(t + (borrow ? ((int64_t)1 << 32) : 0));
    }
    return r;
}

static inline Big big_add(const Big& a, const Big& b) {
    Big r;
    if (a.neg == b.neg) {
        r.m = add_mag(a.m, b.m);
        r.neg = a.neg;
    } else if (cmp_mag(a.m, b.m) >= 0) {
        r.m = sub_mag(a.m, b.m);
        r.neg = a.neg;
    } else {
        r.m = sub_mag(b.m, a.m);
        r.neg = b.neg;
    }
    r.trim();
    check_size(r);
    return r;
}

static inline Big big_neg(Big a) {
    if (!a.is_zero()) a.neg = !a.neg;
    return a;
}

static inline Big big_mul(const Big& a, const Big& b) {
    Big r;
    if (a.is_zero() || b.is_zero()) return r;
    if (a.m.size() + b.m.size() > MAX_LIMBS + 1) unsupported();
    r.m.assign(a.m.size() + b.m.size(), 0);
    for (size_t i = 0; i < a.m.size(); i++) {
        uint64_t carry = 0;
        for (size_t j = 0; j < b.m.size(); j++) {
            uint64_t t = (uint64_t)a.m[i] * b.m[j] + r.m[i + j] + carry;
            r.m[i + j] = (uint32_t)t;
            carry = t >> 32;
        }
        r.m[i + b.m.size()] = (uint32_t)carry;
    }
    r.neg = a.neg != b.neg;
    r.trim();
    check_size(r);
    return r;
}

// q = |u| / |v|, r = |u| % |v| (v nonzero): Knuth's algorithm D
static inline void divmod_mag(const std::vector<uint32_t>& u, const std::vector<uint32_t>& v, std::vector<uint32_t>& q,
                              std::vector<uint32_t>& r) {
    q.clear();
    r.clear();
    if (cmp_mag(u, v) < 0) {
        r = u;
        return;
    }
    const size_t n = v.size(), m = u.size() - n;
    if (n == 1) {
        q.assign(u.size(), 0);
        uint64_t rem = 0;
        for (size_t i = u.size(); i-- > 0;) {
            uint64_t cur = (rem << 32) | u[i];
            q[i] = (uint32_t)(cur / v[0]);
            rem = cur % v[0];
        }
        if (rem) r.push_back((uint32_t)rem);
        while (!q.empty() && q.back() == 0) q.pop_back();
        return;
    }
    const int s = __builtin_clz(v[n - 1]);
    std::vector<uint32_t> vn(n), un(u.size() + 1);
    for (size_t i = n; i-- > 0;) vn[i] = (v[i] << s) | (s && i ? (uint32_t)((uint64_t)v[i - 1] >> (32 - s)) : 0);
    un[u.size()] = s ? (uint32_t)((uint64_t)u.back() >> (32 - s)) : 0;
    for (size_t i = u.size(); i-- > 0;) un[i] = (u[i] << s) | (s && i ? (uint32_t)((uint64_t)u[i - 1] >> (32 - s)) : 0);
    q.assign(m + 1, 0);
    const uint64_t B = (uint64_t)1 << 32;
    for (size_t j = m + 1; j-- > 0;) {
        uint64_t num = ((uint64_t)un[j + n] << 32) | un[j + n - 1];
        uint64_t qhat = num / vn[n - 1], rhat = num % vn[n - 1];
        while (qhat >= B || qhat * vn[n - 2] > ((rhat << 32) | un[j + n - 2])) {
            qhat--;
            rhat += vn[n - 1];
            if (rhat >= B) break;
        }
        int64_t borrow = 0;
        uint64_t carry = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t p = qhat * vn[i] + carry;
            carry = p >> 32;
            int64_t t = (int64_t)un[i + j] - borrow - (int64_t)(p & 0xffffffffu);
            un[i + j] = (uint32_t)t;
            borrow = t < 0;
        }
        int64_t t = (int64_t)un[j + n] - borrow - (int64_t)carry;
        un[j + n] = (uint32_t)t;
        if (t < 0) {
            qhat--;
            uint64_t c = 0;
            for (size_t i = 0; i < n; i++) {
                uint64_t s2 = (uint64_t)un[i + j] + vn[i] + c;
                un[i + j] = (uint32_t)s2;
                c = s2 >> 32;
            }
            un[j + n] += (uint32_t)c;
        }
        q[j] = (uint32_t)qhat;
    }
    r.assign(n, 0);
    for (size_t i = 0; i < n; i++) r[i] = (un[i] >> s) | (s ? (uint32_t)((uint64_t)un[i + 1] << (32 - s)) : 0);
    while (!q.empty() && q.back() == 0) q.pop_back();
    while (!r.empty() && r.back() == 0) r.pop_back();
}

// Python's a // b (floor); ZeroDivisionError for b == 0
static inline Big big_floordiv(const Big& a, const Big& b) {
    if (b.is_zero()) py_error();
    Big q, r;
    divmod_mag(a.m, b.m, q.m, r.m);
    q.neg = a.neg != b.neg;
    if (q.neg && !r.m.empty()) {
        std::vector<uint32_t> one{1};
        q.m = add_mag(q.m, one);
    }
    q.trim();
    return q;
}

static inline size_t big_bitlen(const Big& a) {
    if (a.is_zero()) return 0;
    return 32 * (a.m.size() - 1) + (32 - __builtin_clz(a.m.back()));
}

static inline std::vector<uint32_t> shl_mag(const std::vector<uint32_t>& a, size_t bits) {
    if (a.empty()) return a;
    size_t limbs = bits / 32, b = bits % 32;
    std::vector<uint32_t> r(a.size() + limbs + 1, 0);
    for (size_t i = 0; i < a.size(); i++) {
        uint64_t v = (uint64_t)a[i] << b;
        r[i + limbs] |= (uint32_t)v;
        r[i + limbs + 1] |= (uint32_t)(v >> 32);
    }
    while (!r.empty() && r.back() == 0) r.pop_back();
    return r;
}

// |a| / |b| correctly rounded (round half to even), as CPython's long_true_divide and PyLong_AsDouble (b = 1);
// OverflowError when the result does not fit a double
static inline double big_truediv(const Big& a, const Big& b) {
    if (b.is_zero()) py_error();
    const bool negate = a.neg != b.neg;
    if (a.is_zero()) return negate ? -0.0 : 0.0;
    const long na = (long)big_bitlen(a), nb = (long)big_bitlen(b);
    const long diff = na - nb;
    if (diff >= 1025) py_error();                              // >= 2^1024
    if (diff <= -1076) return negate ? -0.0 : 0.0;             // < 2^-1075: rounds to 0
    const long shift = 55 - diff;                              // the quotient gets 55 or 56 bits
    std::vector<uint32_t> A = shift >= 0 ? shl_mag(a.m, (size_t)shift) : a.m;
    std::vector<uint32_t> Bm = shift < 0 ? shl_mag(b.m, (size_t)-shift) : b.m;
    std::vector<uint32_t> q, r;
    divmod_mag(A, Bm, q, r);
    uint64_t qq = 0;
    for (size_t i = q.size(); i-- > 0;) qq = (qq << 32) | q[i];
    const int qbits = 64 - __builtin_clzll(qq);
    const long e = qbits - 1 - shift;                          // the value is in [2^e, 2^(e+1))
    const long u = std::max(e - 52, -1074L);                   // exponent of the last kept bit
    const long d = u + shift;                                  // bits of qq below it (>= 2)
    uint64_t mant;
    if (d > 60) {
        mant = 0;
    } else {
        mant = qq >> d;
        uint64_t rem = qq & (((uint64_t)1 << d) - 1), half = (uint64_t)1 << (d - 1);
        if (rem > half || (rem == half && (!r.empty() || (mant & 1)))) mant++;
    }
    double x = std::ldexp((double)mant, (int)u);
    if (std::isinf(x)) py_error();
    return negate ? -x : x;
}

static inline double big_to_double(const Big& a) { return big_truediv(a, big_from_u64(1)); }

// a finite integral double as a Big (exact)
static inline Big big_from_integral_double(double x) {
    int e;
    double f = std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
    uint64_t mant = (uint64_t)std::ldexp(f, 53);
    long e2 = e - 53;
    Big r = big_from_u64(mant);
    if (e2 >= 0) {
        r.m = shl_mag(r.m, (size_t)e2);
    } else {
        uint64_t v = e2 <= -64 ? 0 : mant >> -e2;
        r = big_from_u64(v);
    }
    r.neg = x < 0 && !r.is_zero();
    return r;
}

static inline bool big_to_i64(const Big& a, int64_t* out) {
    if (a.m.size() > 2) return false;
    uint64_t v = 0;
    for (size_t i = a.m.size(); i-- > 0;) v = (v << 32) | a.m[i];
    if (a.neg) {
        if (v > (uint64_t)1 << 63) return false;
        *out = (int64_t)(0 - v);
    } else {
        if (v >= (uint64_t)1 << 63) return false;
        *out = (int64_t)v;
    }
    return true;
}

static inline Big big_from_digits(const std::string& digits, int base) {  // digits valid for base, no '_'
    Big r;
    if (base == 10) {
        size_t i = 0, first = digits.size() % 9;
        if (first == 0) first = 9;
        while (i < digits.size()) {
            size_t len = i == 0 ? std::min(first, digits.size()) : 9;
            uint32_t chunk = 0, mul = 1;
            for (size_t k = 0; k < len; k++) {
                chunk = chunk * 10 + (uint32_t)(digits[i + k] - '0');
                mul *= 10;
            }
            uint64_t carry = chunk;
            for (size_t k = 0; k < r.m.size(); k++) {
                uint64_t t = (uint64_t)r.m[k] * mul + carry;
                r.m[k] = (uint32_t)t;
                carry = t >> 32;
            }
            if (carry) r.m.push_back((uint32_t)carry);
            i += len;
        }
    } else {
        const int bits = base == 2 ? 1 : base == 8 ? 3 : 4;
        if (digits.size() * (size_t)bits > MAX_LIMBS * 32 + 64) unsupported();
        size_t pos = 0;
        for (size_t i = digits.size(); i-- > 0;) {
            char c = digits[i];
            uint32_t v = (uint32_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
            for (int k = 0; k < bits; k++, pos++) {
                if (pos / 32 >= r.m.size()) r.m.push_back(0);
                if ((v >> k) & 1) r.m[pos / 32] |= (uint32_t)1 << (pos % 32);
            }
        }
    }
    r.trim();
    check_size(r);
    return r;
}

// decimal text; false when Python's str() refuses it (more than 4300 digits)
static inline bool big_to_string(const Big& a, std::string* out) {
    if (a.is_zero()) {
        *out = "0";
        return true;
    }
    if (big_bitlen(a) > 14300) return false;  // 2^14300 > 10^4304
    std::vector<uint32_t> cur = a.m;
    std::vector<uint32_t> chunks;
    while (!cur.empty()) {
        uint64_t rem = 0;
        for (size_t i = cur.size(); i-- > 0;) {
            uint64_t t = (rem << 32) | cur[i];
            cur[i] = (uint32_t)(t / 1000000000u);
            rem = t % 1000000000u;
        }
        while (!cur.empty() && cur.back() == 0) cur.pop_back();
        chunks.push_back((uint32_t)rem);
    }
    std::string s = std::to_string(chunks.back());
    for (size_t i = chunks.size() - 1; i-- > 0;) {
        std::string c = std::to_string(chunks[i]);
        s += std::string(9 - c.size(), '0') + c;
    }
    if (s.size() > 4300) return false;
    *out = (a.neg ? "-" : "") + s;
    return true;
}

// ------------------------------------------------------------------------------------------------
// floats: Python's repr

// add_dot_0: Python's float repr ("5.0"); without: the parts of a complex repr ("5j")
static inline std::string float_repr(double x, bool add_dot_0 = true) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    std::string sign = std::signbit(x) ? "-" : "";
    if (x == 0) return sign + (add_dot_0 ? "0.0" : "0");
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, std::fabs(x), std::chars_format::scientific);
    std::string s(buf, res.ptr);
    size_t epos = s.find('e');
    std::string digits;
    for (size_t i = 0; i < epos; i++)
        if (s[i] != '.') digits += s[i];
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    int exp10 = 0;
    bool eneg = s[epos + 1] == '-';
    for (size_t i = epos + 2; i < s.size(); i++) exp10 = exp10 * 10 + (s[i] - '0');
    if (eneg) exp10 = -exp10;
    const int decpt = exp10 + 1, nd = (int)digits.size();
    std::string r;
    if (decpt <= -4 || decpt > 16) {
        r = digits.substr(0, 1);
        if (nd > 1) r += "." + digits.substr(1);
        int ae = exp10 < 0 ? -exp10 : exp10;
        r += std::string("e") + (exp10 < 0 ? "-" : "+") + (ae < 10 ? "0" : "") + std::to_string(ae);
    } else if (decpt <= 0) {
        r = "0." + std::string((size_t)-decpt, '0') + digits;
    } else if (decpt >= nd) {
        r = digits + std::string((size_t)(decpt - nd), '0') + (add_dot_0 ? ".0" : "");
    } else {
        r = digits.substr(0, (size_t)decpt) + "." + digits.substr((size_t)decpt);
    }
    return sign + r;
}

// a float literal without '_' (digits, '.', e/E and exponent digits), as CPython: correctly rounded, inf on
// overflow, 0 on underflow
static inline double parse_float(const std::string& s) {
    double d = 0;
    auto res = std::from_chars(s.data(), s.data() + s.size(), d);
    if (res.ec == std::errc()) return d;
    // out of range: overflow or underflow, decided by the decimal exponent of the first nonzero digit
    size_t epos = s.find_first_of("eE");
    std::string mant = s.substr(0, epos);
    long ex = 0;
    if (epos != std::string::npos)
        for (size_t i = epos + 1; i < s.size(); i++) {
            if (s[i] >= '0' && s[i] <= '9') ex = std::min(ex * 10 + (s[i] - '0'), 1000000000L);
        }
    if (epos != std::string::npos && s.size() > epos + 1 && s[epos + 1] == '-') ex = -ex;
    size_t dot = mant.find('.');
    std::string ip = mant.substr(0, dot), fp = dot == std::string::npos ? "" : mant.substr(dot + 1);
    long mag = 0;
    size_t i = ip.find_first_not_of('0');
    if (i != std::string::npos) {
        mag = (long)(ip.size() - i - 1) + ex;
    } else {
        size_t j = fp.find_first_not_of('0');
        if (j == std::string::npos) return 0.0;
        mag = -(long)(j + 1) + ex;
    }
    return mag > 0 ? HUGE_VAL : 0.0;
}

// ------------------------------------------------------------------------------------------------
// values

struct Val {
    enum Kind { INT, BOOL, FLOAT, COMPLEX, NONE, STR, BYTES, TUPLE, LIST, ELLIPSIS, METHOD } k = NONE;
    Big i;                    // INT
    bool b = false;           // BOOL
    double f = 0;             // FLOAT; COMPLEX: the imaginary part (the real part is +0.0)
    std::string s;            // STR, BYTES; METHOD: its name
    std::vector<Val> items;   // TUPLE, LIST; METHOD: {the object it is bound to}
};

static inline Val v_int(Big b) { Val v; v.k = Val::INT; v.i = std::move(b); return v; }
static inline Val v_int(int64_t x) { return v_int(big_from_u64(x < 0 ? 0 - (uint64_t)x : (uint64_t)x, x < 0)); }
static inline Val v_bool(bool b) { Val v; v.k = Val::BOOL; v.b = b; return v; }
static inline Val v_float(double f) { Val v; v.k = Val::FLOAT; v.f = f; return v; }
static inline Val v_none() { return Val(); }
static inline Val v_str(std::string s, bool bytes = false) { Val v; v.k = bytes ? Val::BYTES : Val::STR; v.s = std::move(s); return v; }
static inline Val v_seq(std::vector<Val> items, bool list) { Val v; v.k = list ? Val::LIST : Val::TUPLE; v.items = std::move(items); return v; }

static inline bool is_intlike(const Val& v) { return v.k == Val::INT || v.k == Val::BOOL; }
static inline Big as_big(const Val& v) { return v.k == Val::BOOL ? big_from_u64(v.b ? 1 : 0) : v.i; }
static inline bool is_number(const Val& v) { return is_intlike(v) || v.k == Val::FLOAT || v.k == Val::COMPLEX; }

static inline bool truthy(const Val& v) {
    switch (v.k) {
        case Val::INT: return !v.i.is_zero();
        case Val::BOOL: return v.b;
        case Val::FLOAT: return v.f != 0;  // nan is true
        case Val::COMPLEX: return v.f != 0;
        case Val::NONE: return false;
        case Val::STR: case Val::BYTES: return !v.s.empty();
        case Val::TUPLE: case Val::LIST: return !v.items.empty();
        default: return true;  // Ellipsis, methods
    }
}

// Python's ==, for the values that can meet in `in`, count, index and remove
static inline bool py_eq(const Val& a, const Val& b) {
    if (is_number(a) && is_number(b)) {
        if (a.k == Val::COMPLEX || b.k == Val::COMPLEX) {
            // complex(0, f) == x: x's imaginary part (0 unless complex) equal, and x's real part 0
            double ia = a.k == Val::COMPLEX ? a.f : 0, ib = b.k == Val::COMPLEX ? b.f : 0;
            if (ia != ib) return false;
            const Val& o = a.k == Val::COMPLEX ? b : a;
            if (o.k == Val::COMPLEX) return true;
            return o.k == Val::FLOAT ? o.f == 0 : as_big(o).is_zero();
        }
        if (a.k == Val::FLOAT && b.k == Val::FLOAT) return a.f == b.f;
        if (a.k == Val::FLOAT || b.k == Val::FLOAT) {
            double x = a.k == Val::FLOAT ? a.f : b.f;
            Big n = as_big(a.k == Val::FLOAT ? b : a);
            if (!std::isfinite(x) || std::floor(x) != x) return false;
            return big_cmp(big_from_integral_double(x), n) == 0;
        }
        return big_cmp(as_big(a), as_big(b)) == 0;
    }
    if (a.k != b.k) return false;
    switch (a.k) {
        case Val::NONE: case Val::ELLIPSIS: return true;
        case Val::STR: case Val::BYTES: return a.s == b.s;
        case Val::TUPLE: case Val::LIST:
            if (a.items.size() != b.items.size()) return false;
            for (size_t i = 0; i < a.items.size(); i++)
                if (!py_eq(a.items[i], b.items[i])) return false;
            return true;
        default: return false;  // bound methods: never bound to the same object here
    }
}

// Python's `is`, where the answer is not an implementation detail
static inline bool py_is(const Val& a, const Val& b) {
    if (a.k != b.k) return false;  // different types: different objects (bool and int included)
    switch (a.k) {
        case Val::NONE: case Val::ELLIPSIS: return true;
        case Val::BOOL: return a.b == b.b;
        case Val::TUPLE: return a.items.empty() && b.items.empty();  // () is a singleton; others are new
        case Val::LIST: case Val::METHOD: return false;               // each a new object
        case Val::INT: {
            if (big_cmp(a.i, b.i) != 0) return false;
            int64_t x;
            if (big_to_i64(a.i, &x) && x >= -5 && x <= 256) return true;  // CPython's cached small ints
            break;
        }
        case Val::FLOAT: case Val::COMPLEX:
            if (std::memcmp(&a.f, &b.f, sizeof(double)) != 0) return false;
            break;
        default: if (a.s != b.s) return false; break;
    }
    unsupported();  // equal ints, floats, strs, bytes: CPython's caching and constant sharing decide
}

static inline bool int_to_string(const Big& b, std::string* out) { return big_to_string(b, out); }

static inline std::string quote_repr(const std::string& s, bool bytes) {
    char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string r = bytes ? "b" : "";
    r += q;
    for (unsigned char c : s) {
        if (c == (unsigned char)q || c == '\\') { r += '\\'; r += (char)c; }
        else if (c == '\t') r += "\\t";
        else if (c == '\n') r += "\\n";
        else if (c == '\r') r += "\\r";
        else if (c < 0x20 || c >= 0x7f) {
            const char* hex = "0123456789abcdef";
            r += "\\x";
            r += hex[c >> 4];
            r += hex[c & 15];
        } else r += (char)c;
    }
    r += q;
    return r;
}

// Python's repr (top = false) or str (top = true); false where Python raises (ints over 4300 digits)
static inline bool to_text(const Val& v, bool top, std::string* out) {
    switch (v.k) {
        case Val::INT: return int_to_string(v.i, out);
        case Val::BOOL: *out = v.b ? "True" : "False"; return true;
        case Val::FLOAT: *out = float_repr(v.f); return true;
        case Val::COMPLEX: *out = float_repr(v.f, false) + "j"; return true;
        case Val::NONE: *out = "None"; return true;
        case Val::STR: *out = top ? v.s : quote_repr(v.s, false); return true;
        case Val::BYTES: *out = quote_repr(v.s, true); return true;
        case Val::ELLIPSIS: *out = "Ellipsis"; return true;
        case Val::TUPLE: case Val::LIST: {
            std::string r = v.k == Val::LIST ? "[" : "(";
            for (size_t i = 0; i < v.items.size(); i++) {
                std::string t;
                if (!to_text(v.items[i], false, &t)) return false;
                if (i) r += ", ";
                r += t;
            }
            if (v.k == Val::TUPLE && v.items.size() == 1) r += ",";
            r += v.k == Val::LIST ? "]" : ")";
            *out = r;
            return true;
        }
        default: unsupported();  // a bound method: "<built-in method ... at 0x...>"
    }
}

// ------------------------------------------------------------------------------------------------
// str and bytes (their content: ASCII, see the character sets)

static inline bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
static inline bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
static inline bool is_alpha(char c) { return is_upper(c) || is_lower(c); }
static inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
static inline char to_upper(char c) { return is_lower(c) ? (char)(c - 32) : c; }
static inline char to_lower(char c) { return is_upper(c) ? (char)(c + 32) : c; }
static inline bool is_ws(char c, bool bytes) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (!bytes && c >= '\x1c' && c <= '\x1f');
}

static inline size_t count_sub(const std::string& s, const std::string& sub) {
    if (sub.empty()) return s.size() + 1;
    size_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) n++;
    return n;
}

static inline std::vector<Val> split_ws(const std::string& s, bool bytes) {
    std::vector<Val> r;
    size_t i = 0;
    while (true) {
        while (i < s.size() && is_ws(s[i], bytes)) i++;
        if (i >= s.size()) break;
        size_t j = i;
        while (j < s.size() && !is_ws(s[j], bytes)) j++;
        r.push_back(v_str(s.substr(i, j - i), bytes));
        i = j;
    }
    return r;
}

static inline std::vector<Val> split_sep(const std::string& s, const std::string& sep, bool bytes, bool from_right) {
    std::vector<Val> r;
    if (!from_right) {
        size_t i = 0;
        for (size_t p = s.find(sep); p != std::string::npos; p = s.find(sep, i)) {
            r.push_back(v_str(s.substr(i, p - i), bytes));
            i = p + sep.size();
        }
        r.push_back(v_str(s.substr(i), bytes));
    } else {
        size_t end = s.size();
        while (true) {
            size_t p = end >= sep.size() ? s.rfind(sep, end - sep.size()) : std::string::npos;
            if (p == std::string::npos) break;
            r.push_back(v_str(s.substr(p + sep.size(), end - p - sep.size()), bytes));
            end = p;
        }
        r.push_back(v_str(s.substr(0, end), bytes));
        std::reverse(r.begin(), r.end());
    }
    return r;
}

// the items of an iterable argument (str: 1-char strs; bytes: ints), or py_error (not iterable)
static inline std::vector<Val> iter_items(const Val& v) {
    std::vector<Val> r;
    if (v.k == Val::STR) {
        for (char c : v.s) r.push_back(v_str(std::string(1, c)));
    } else if (v.k == Val::BYTES) {
        for (unsigned char c : v.s) r.push_back(v_int((int64_t)c));
    } else if (v.k == Val::TUPLE || v.k == Val::LIST) {
        r = v.items;
    } else {
        py_error();
    }
    return r;
}

// Python's `needle in hay`
static inline bool py_contains(const Val& hay, const Val& needle) {
    if (hay.k == Val::STR) {
        if (needle.k != Val::STR) py_error();
        return hay.s.find(needle.s) != std::string::npos;
    }
    if (hay.k == Val::BYTES) {
        if (needle.k == Val::BYTES) return hay.s.find(needle.s) != std::string::npos;
        if (!is_intlike(needle)) py_error();
        int64_t c;
        if (!big_to_i64(as_big(needle), &c) || c < 0 || c > 255) py_error();
        return hay.s.find((char)(unsigned char)c) != std::string::npos;
    }
    if (hay.k == Val::TUPLE || hay.k == Val::LIST) {
        for (const Val& x : hay.items)
            if (py_eq(x, needle)) return true;
        return false;
    }
    py_error();  // not a container
}

// an index-sized int argument (center, pop, ...): TypeError for other types, OverflowError beyond 64 bits
static inline int64_t index_arg(const Val& v) {
    if (!is_intlike(v)) py_error();
    int64_t x;
    if (!big_to_i64(as_big(v), &x)) py_error();
    return x;
}

// the substring argument of count/find/index (bytes also take an int 0..255)
static inline std::string sub_arg(const Val& self, const Val& a) {
    if (self.k == Val::STR) {
        if (a.k != Val::STR) py_error();
        return a.s;
    }
    if (a.k == Val::BYTES) return a.s;
    if (!is_intlike(a)) py_error();
    int64_t c;
    if (!big_to_i64(as_big(a), &c) || c < 0 || c > 255) py_error();
    return std::string(1, (char)(unsigned char)c);
}

static inline const std::string& same_kind(const Val& self, const Val& a) {
    if (a.k != self.k) py_error();
    return a.s;
}

// the method `name` of str or bytes `self`, called with args (0 or 1)
static inline Val str_method(const Val& self, const std::string& name, const std::vector<Val>& args) {
    const bool bytes = self.k == Val::BYTES;
    const std::string& s = self.s;
    const size_t n = args.size();
    auto need = [&](size_t lo, size_t hi) {
        if (n < lo || n > hi) py_error();
    };
    auto predicate = [&](bool (*ok)(char), bool empty_value) {
        need(0, 0);
        if (s.empty()) return v_bool(empty_value);
        for (char c : s)
            if (!ok(c)) return v_bool(false);
        return v_bool(true);
    };
    if (name == "count" || name == "find" || name == "rfind" || name == "index" || name == "rindex") {
        need(1, 1);
        std::string sub = sub_arg(self, args[0]);
        if (name == "count") return v_int((int64_t)count_sub(s, sub));
        size_t p = name == "find" || name == "index" ? s.find(sub) : s.rfind(sub);
        if (p == std::string::npos) {
            if (name[0] == 'f' || name[1] == 'f') return v_int((int64_t)-1);
            py_error();  // ValueError: substring not found
        }
        return v_int((int64_t)p);
    }
    if (name == "lower" || name == "upper" || name == "swapcase" || name == "casefold" || name == "capitalize" ||
        name == "title") {
        need(0, 0);
        std::string r = s;
        bool prev_cased = false;
        for (size_t i = 0; i < r.size(); i++) {
            char c = r[i];
            if (name == "lower" || name == "casefold") r[i] = to_lower(c);
            else if (name == "upper") r[i] = to_upper(c);
            else if (name == "swapcase") r[i] = is_upper(c) ? to_lower(c) : to_upper(c);
            else if (name == "capitalize") r[i] = i == 0 ? to_upper(c) : to_lower(c);
            else {
                r[i] = prev_cased ? to_lower(c) : to_upper(c);
                prev_cased = is_alpha(c);
            }
        }
        return v_str(r, bytes);
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        need(0, 1);
        bool ws = n == 0 || args[0].k == Val::NONE;
        std::string chars = ws ? "" : same_kind(self, args[0]);
        auto strip_it = [&](char c) { return ws ? is_ws(c, bytes) : chars.find(c) != std::string::npos; };
        size_t i = 0, j = s.size();
        if (name != "rstrip")
            while (i < j && strip_it(s[i])) i++;
        if (name != "lstrip")
            while (j > i && strip_it(s[j - 1])) j--;
        return v_str(s.substr(i, j - i), bytes);
    }
    if (name == "split" || name == "rsplit") {
        need(0, 1);
        if (n == 0 || args[0].k == Val::NONE) return v_seq(split_ws(s, bytes), true);
        const std::string& sep = same_kind(self, args[0]);
        if (sep.empty()) py_error();  // ValueError: empty separator
        return v_seq(split_sep(s, sep, bytes, name == "rsplit"), true);
    }
    if (name == "splitlines") {  // no line breaks can occur; keepends: an int that fits a C int
        need(0, 1);
        if (n == 1) {
            if (!is_intlike(args[0])) py_error();
            int64_t k;
            if (!big_to_i64(as_big(args[0]), &k) || k < INT32_MIN || k > INT32_MAX) py_error();
        }
        std::vector<Val> r;
        if (!s.empty()) r.push_back(v_str(s, bytes));
        return v_seq(r, true);
    }
    if (name == "partition" || name == "rpartition") {
        need(1, 1);
        const std::string& sep = same_kind(self, args[0]);
        if (sep.empty()) py_error();
        size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
        std::vector<Val> r;
        if (p == std::string::npos) {
            if (name == "partition") r = {v_str(s, bytes), v_str("", bytes), v_str("", bytes)};
            else r = {v_str("", bytes), v_str("", bytes), v_str(s, bytes)};
        } else {
            r = {v_str(s.substr(0, p), bytes), v_str(sep, bytes), v_str(s.substr(p + sep.size()), bytes)};
        }
        return v_seq(r, false);
    }
    if (name == "startswith" || name == "endswith") {
        need(1, 1);
        auto match = [&](const std::string& x) {
            if (x.size() > s.size()) return false;
            return name == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
        };
        if (args[0].k == Val::TUPLE) {
            for (const Val& x : args[0].items) {
                if (x.k != self.k) py_error();
                if (match(x.s)) return v_bool(true);
            }
            return v_bool(false);
        }
        return v_bool(match(same_kind(self, args[0])));
    }
    if (name == "removeprefix" || name == "removesuffix") {
        need(1, 1);
        const std::string& x = same_kind(self, args[0]);
        if (x.size() <= s.size()) {
            if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return v_str(s.substr(x.size()), bytes);
            if (name == "removesuffix" && s.compare(s.size() - x.size(), x.size(), x) == 0)
                return v_str(s.substr(0, s.size() - x.size()), bytes);
        }
        return v_str(s, bytes);
    }
    if (name == "join") {
        need(1, 1);
        std::vector<Val> items = iter_items(args[0]);
        std::string r;
        for (size_t i = 0; i < items.size(); i++) {
            if (items[i].k != self.k) py_error();
            if (i) r += s;
            r += items[i].s;
        }
        return v_str(r, bytes);
    }
    if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
        need(1, 1);
        int64_t width = index_arg(args[0]);
        if (width <= (int64_t)s.size()) return v_str(s, bytes);
        if (width > 100000) unsupported();
        size_t marg = (size_t)width - s.size();
        if (name == "ljust") return v_str(s + std::string(marg, ' '), bytes);
        if (name == "rjust") return v_str(std::string(marg, ' ') + s, bytes);
        if (name == "zfill") {  // no sign character can occur
            return v_str(std::string(marg, '0') + s, bytes);
        }
        size_t left = marg / 2 + (marg & (size_t)width & 1);
        return v_str(std::string(left, ' ') + s + std::string(marg - left, ' '), bytes);
    }
    if (name == "expandtabs") {  // no tab can occur; tabsize: an int that fits a C int
        need(0, 1);
        if (n == 1) {
            if (!is_intlike(args[0])) py_error();
            int64_t k;
            if (!big_to_i64(as_big(args[0]), &k) || k < INT32_MIN || k > INT32_MAX) py_error();
        }
        return v_str(s, bytes);
    }
    if (name == "isalpha") return predicate(is_alpha, false);
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return predicate(is_digit, false);
    if (name == "isalnum") return predicate([](char c) { return is_alpha(c) || is_digit(c); }, false);
    if (name == "isascii") return predicate([](char c) { return (unsigned char)c < 128; }, true);
    if (name == "isprintable") return predicate([](char c) { return c >= 0x20 && c < 0x7f; }, true);
    if (name == "isspace") {
        need(0, 0);
        bool all = !s.empty();
        for (char c : s) all = all && is_ws(c, bytes);
        return v_bool(all);
    }
    if (name == "islower" || name == "isupper") {
        need(0, 0);
        bool cased = false, bad = false;
        for (char c : s) {
            if (name == "islower" ? is_lower(c) : is_upper(c)) cased = true;
            if (name == "islower" ? is_upper(c) : is_lower(c)) bad = true;
        }
        return v_bool(cased && !bad);
    }
    if (name == "istitle") {
        need(0, 0);
        bool cased = false, prev_cased = false;
        for (char c : s) {
            if (is_upper(c)) {
                if (prev_cased) return v_bool(false);
                prev_cased = cased = true;
            } else if (is_lower(c)) {
                if (!prev_cased) return v_bool(false);
                prev_cased = cased = true;
            } else {
                prev_cased = false;
            }
        }
        return v_bool(cased);
    }
    if (name == "isidentifier") {
        need(0, 0);
        bool ok = !s.empty() && (is_alpha(s[0]) || s[0] == '_');
        for (char c : s) ok = ok && (is_alpha(c) || is_digit(c) || c == '_');
        return v_bool(ok);
    }
    if (name == "format") {  // no replacement field can occur: the string itself, whatever the argument
        return v_str(s, bytes);
    }
    if (name == "format_map") {
        need(1, 1);
        return v_str(s, bytes);
    }
    if (name == "encode" || name == "decode") {
        if (n) unsupported();  // codec names
        return v_str(s, name == "encode");
    }
    if (name == "hex") {
        if (n) unsupported();  // separators
        std::string r;
        const char* hex = "0123456789abcdef";
        for (unsigned char c : s) {
            r += hex[c >> 4];
            r += hex[c & 15];
        }
        return v_str(r);
    }
    if (name == "translate") {
        need(1, 1);
        const Val& table = args[0];
        if (bytes) {  // None, or bytes of 256
            if (table.k == Val::NONE) return v_str(s, true);
            if (table.k != Val::BYTES) py_error();
            if (table.s.size() != 256) py_error();
            std::string r = s;
            for (char& c : r) c = table.s[(unsigned char)c];
            return v_str(r, true);
        }
        // str: table[ord(c)] for each character: a LookupError keeps it, a str replaces it, an int is chr(int),
        // None deletes it; a table that cannot be indexed raises (only once a character is looked up)
        std::string r;
        for (char c : s) {
            const size_t i = (unsigned char)c;
            if (table.k == Val::STR) {
                r += i < table.s.size() ? table.s[i] : c;
            } else if (table.k == Val::BYTES) {
                r += i < table.s.size() ? table.s[i] : c;  // chr of the byte: the byte (printable ASCII here)
            } else if (table.k == Val::LIST || table.k == Val::TUPLE) {
                if (i >= table.items.size()) r += c;
                else if (table.items[i].k == Val::STR) r += table.items[i].s;
                else if (table.items[i].k == Val::NONE) continue;
                else unsupported();  // an int: chr(int) (cannot occur: such tuples have 2 items)
            } else {
                py_error();  // not subscriptable
            }
        }
        return v_str(r);
    }
    if (name == "replace" || name == "maketrans") py_error();  // they need two arguments (str.maketrans: one dict)
    unsupported();  // fromhex
}

static inline Val seq_method(const Val& self, const std::string& name, const std::vector<Val>& args) {
    const size_t n = args.size();
    auto need = [&](size_t lo, size_t hi) {
        if (n < lo || n > hi) py_error();
    };
    const std::vector<Val>& it = self.items;
    if (name == "count") {
        need(1, 1);
        int64_t c = 0;
        for (const Val& x : it) c += py_eq(x, args[0]);
        return v_int(c);
    }
    if (name == "index") {
        need(1, 1);
        for (size_t i = 0; i < it.size(); i++)
            if (py_eq(it[i], args[0])) return v_int((int64_t)i);
        py_error();
    }
    // list only (mutations of a list nothing else can see: only what they return or raise matters)
    if (name == "copy") { need(0, 0); return self; }
    if (name == "clear" || name == "reverse" || name == "sort") { need(0, 0); return v_none(); }  // items: all str or all bytes
    if (name == "append") { need(1, 1); return v_none(); }
    if (name == "extend") { need(1, 1); iter_items(args[0]); return v_none(); }
    if (name == "remove") {
        need(1, 1);
        for (const Val& x : it)
            if (py_eq(x, args[0])) return v_none();
        py_error();
    }
    if (name == "pop") {
        need(0, 1);
        if (it.empty() && n == 0) py_error();
        int64_t i = n ? index_arg(args[0]) : -1;
        if (i < 0) i += (int64_t)it.size();
        if (i < 0 || i >= (int64_t)it.size()) py_error();
        return it[(size_t)i];
    }
    py_error();  // insert: two arguments
}

static inline Val number_method(const Val& self, const std::string& name, const std::vector<Val>& args) {
    if (name == "to_bytes" || name == "from_bytes" || name == "hex" || name == "fromhex") unsupported();
    if (!args.empty()) py_error();  // none of the others takes an argument
    if (name == "conjugate") {
        if (self.k == Val::COMPLEX) { Val v = self; v.f = -v.f; return v; }
        return self.k == Val::BOOL ? v_int(as_big(self)) : self;
    }
    if (self.k == Val::FLOAT) {
        if (name == "is_integer") return v_bool(std::isfinite(self.f) && std::floor(self.f) == self.f);
        if (name == "as_integer_ratio") {
            if (!std::isfinite(self.f)) py_error();
            int e;
            double fr = std::frexp(std::fabs(self.f), &e);
            uint64_t mant = (uint64_t)std::ldexp(fr, 53);
            long e2 = e - 53;
            while (mant && !(mant & 1) && e2 < 0) {
                mant >>= 1;
                e2++;
            }
            Big num = big_from_u64(mant, self.f < 0), den = big_from_u64(1);
            if (mant == 0) e2 = 0;
            if (e2 > 0) num.m = shl_mag(num.m, (size_t)e2);
            if (e2 < 0) den.m = shl_mag(den.m, (size_t)-e2);
            return v_seq({v_int(num), v_int(den)}, false);
        }
        py_error();  // cannot occur: get_attr gives only the methods above
    }
    Big v = as_big(self);
    if (name == "bit_length") return v_int((int64_t)big_bitlen(v));
    if (name == "bit_count") {
        int64_t c = 0;
        for (uint32_t x : v.m) c += __builtin_popcount(x);
        return v_int(c);
    }
    if (name == "as_integer_ratio") return v_seq({v_int(v), v_int((int64_t)1)}, false);
    py_error();  // cannot occur: get_attr gives only the methods above
}

static inline bool in_list(const std::string& name, const char* const* names) {
    for (; *names; names++)
        if (name == *names) return true;
    return false;
}

// obj.name (CPython 3.11's attributes without "__": those with it cannot get through nanochat's filter)
static inline Val get_attr(const Val& obj, const std::string& name) {
    static const char* const str_attrs[] = {"capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs",
        "find", "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
        "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip",
        "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition",
        "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper",
        "zfill", nullptr};
    static const char* const bytes_attrs[] = {"capitalize", "center", "count", "decode", "endswith", "expandtabs", "find",
        "fromhex", "hex", "index", "isalnum", "isalpha", "isascii", "isdigit", "islower", "isspace", "istitle", "isupper",
        "join", "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind",
        "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase",
        "title", "translate", "upper", "zfill", nullptr};
    static const char* const int_methods[] = {"as_integer_ratio", "bit_count", "bit_length", "conjugate", "from_bytes",
        "to_bytes", nullptr};
    static const char* const float_methods[] = {"as_integer_ratio", "conjugate", "fromhex", "hex", "is_integer", nullptr};
    static const char* const tuple_attrs[] = {"count", "index", nullptr};
    static const char* const list_attrs[] = {"append", "clear", "copy", "count", "extend", "index", "insert", "pop",
        "remove", "reverse", "sort", nullptr};
    Val m;
    m.k = Val::METHOD;
    m.s = name;
    m.items.push_back(obj);
    switch (obj.k) {
        case Val::STR: if (in_list(name, str_attrs)) return m; break;
        case Val::BYTES: if (in_list(name, bytes_attrs)) return m; break;
        case Val::TUPLE: if (in_list(name, tuple_attrs)) return m; break;
        case Val::LIST: if (in_list(name, list_attrs)) return m; break;
        case Val::INT: case Val::BOOL:
            if (name == "real" || name == "numerator") return v_int(as_big(obj));
            if (name == "imag") return v_int((int64_t)0);
            if (name == "denominator") return v_int((int64_t)1);
            if (in_list(name, int_methods)) return m;
            break;
        case Val::FLOAT:
            if (name == "real") return obj;
            if (name == "imag") return v_float(0.0);
            if (in_list(name, float_methods)) return m;
            break;
        case Val::COMPLEX:
            if (name == "real") return v_float(0.0);
            if (name == "imag") return v_float(obj.f);
            if (name == "conjugate") return m;
            break;
        default: break;
    }
    py_error();  // AttributeError
}

static inline Val call(const Val& f, const std::vector<Val>& args) {
    if (f.k != Val::METHOD) py_error();  // TypeError: not callable
    const Val& self = f.items[0];
    if (self.k == Val::STR || self.k == Val::BYTES) return str_method(self, f.s, args);
    if (self.k == Val::TUPLE || self.k == Val::LIST) return seq_method(self, f.s, args);
    return number_method(self, f.s, args);
}

// ------------------------------------------------------------------------------------------------
// arithmetic (the first character set: ints, floats, () and ...)

static inline double as_double(const Val& v) { return v.k == Val::FLOAT ? v.f : big_to_double(as_big(v)); }

static inline Val binary(char op, const Val& a, const Val& b) {  // op: + - * / and 'f' for //
    for (const Val* x : {&a, &b})  // cannot occur: no operator in the second character set
        if (x->k == Val::STR || x->k == Val::BYTES || x->k == Val::LIST || x->k == Val::BOOL) unsupported();
    if (a.k == Val::TUPLE || b.k == Val::TUPLE) {
        if (op == '+' && a.k == Val::TUPLE && b.k == Val::TUPLE) {
            std::vector<Val> r = a.items;
            r.insert(r.end(), b.items.begin(), b.items.end());
            return v_seq(r, false);
        }
        if (op == '*' && (is_intlike(a) || is_intlike(b))) {
            const Val& t = a.k == Val::TUPLE ? a : b;
            int64_t n;
            if (!big_to_i64(as_big(a.k == Val::TUPLE ? b : a), &n)) py_error();  // OverflowError
            if (n <= 0 || t.items.empty()) return v_seq({}, false);
            unsupported();  // cannot occur: tuples here are empty
        }
        py_error();
    }
    if (!(is_intlike(a) || a.k == Val::FLOAT) || !(is_intlike(b) || b.k == Val::FLOAT)) {
        if (is_number(a) && is_number(b)) unsupported();  // complex arithmetic: cannot occur (no j in set 1)
        py_error();
    }
    if (is_intlike(a) && is_intlike(b)) {
        Big x = as_big(a), y = as_big(b);
        switch (op) {
            case '+': return v_int(big_add(x, y));
            case '-': return v_int(big_add(x, big_neg(y)));
            case '*': return v_int(big_mul(x, y));
            case '/': return v_float(big_truediv(x, y));
            default: return v_int(big_floordiv(x, y));
        }
    }
    double x = as_double(a), y = as_double(b);  // OverflowError for huge ints
    switch (op) {
        case '+': return v_float(x + y);
        case '-': return v_float(x - y);
        case '*': return v_float(x * y);
        case '/':
            if (y == 0) py_error();
            return v_float(x / y);
        default: {  // CPython's float_floor_div (_float_div_mod)
            if (y == 0) py_error();
            double mod = std::fmod(x, y);
            double div = (x - mod) / y;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) {
                    mod += y;
                    div -= 1.0;
                }
            } else {
                mod = std::copysign(0.0, y);
            }
            double floordiv;
            if (div != 0) {
                floordiv = std::floor(div);
                if (div - floordiv > 0.5) floordiv += 1.0;
            } else {
                floordiv = std::copysign(0.0, x / y);
            }
            return v_float(floordiv);
        }
    }
}

static inline Val unary(char op, const Val& a) {
    if (is_intlike(a)) return v_int(op == '-' ? big_neg(as_big(a)) : as_big(a));
    if (a.k == Val::FLOAT) return v_float(op == '-' ? -a.f : a.f);
    if (a.k == Val::COMPLEX) unsupported();  // cannot occur: no j in set 1
    py_error();
}

// ------------------------------------------------------------------------------------------------
// tokenizer: CPython 3.11's, for the characters that can get here

struct Tok {
    enum Type { NUM, STR, NAME, OP, END } t;
    std::string text;  // NUM: the literal without '_'; STR: the content; NAME; OP
    bool bytes = false;
};

static inline bool ident_char(int c) { return c >= 0 && (is_alpha((char)c) || is_digit((char)c) || c == '_' || c >= 128); }

struct Tokenizer {
    const std::string& s;
    size_t p;
    explicit Tokenizer(const std::string& src, size_t start) : s(src), p(start) {}
    int nextc() { return p < s.size() ? (unsigned char)s[p++] : (p++, -1); }
    void backup() { p--; }
    bool lookahead(const char* t) const { return s.compare(p, strlen(t), t) == 0; }
    // CPython's verify_end_of_number: c (just read) may not start a name, except the keywords that can follow
    void verify_end_of_number(int c) {
        bool r = false;
        if (c == 'a') r = lookahead("nd");
        else if (c == 'e') r = lookahead("lse");
        else if (c == 'f') r = lookahead("or");
        else if (c == 'i') r = p < s.size() && (s[p] == 'f' || s[p] == 'n' || s[p] == 's');
        else if (c == 'o') r = lookahead("r");
        else if (c == 'n') r = lookahead("ot");
        if (!r && ident_char(c)) py_error();  // invalid ... literal (with r: a deprecation warning only)
    }
    int decimal_tail() {
        int c;
        while (true) {
            do c = nextc(); while (c >= 0 && is_digit((char)c));
            if (c != '_') break;
            c = nextc();
            if (!(c >= 0 && is_digit((char)c))) py_error();
        }
        return c;
    }
    // the number starting at p (a digit, or '.' and a digit); returns its text without '_'
    std::string number() {
        const size_t start = p;
        int c = nextc();
        auto isd = [](int ch) { return ch >= 0 && is_digit((char)ch); };
        auto isx = [](int ch) { return ch >= 0 && (is_digit((char)ch) || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f')); };
        bool done = false;
        if (c == '.') {
            c = nextc();
            goto fraction;
        }
        if (c == '0') {
            c = nextc();
            if (c == 'x' || c == 'X' || c == 'o' || c == 'O' || c == 'b' || c == 'B') {
                const int kind = c | 0x20;
                auto valid = [&](int ch) { return kind == 'x' ? isx(ch) : kind == 'o' ? (ch >= '0' && ch <= '7') : (ch == '0' || ch == '1'); };
                c = nextc();
                do {
                    if (c == '_') c = nextc();
                    if (!valid(c)) py_error();
                    do c = nextc(); while (valid(c));
                } while (c == '_');
                if (kind != 'x' && isd(c)) py_error();
                verify_end_of_number(c);
                done = true;
            } else {
                bool nonzero = false;
                while (true) {
                    if (c == '_') {
                        c = nextc();
                        if (!isd(c)) py_error();
                    }
                    if (c != '0') break;
                    c = nextc();
                }
                if (isd(c)) {
                    nonzero = true;
                    c = decimal_tail();
                }
                if (c == '.') {
                    c = nextc();
                    goto fraction;
                } else if (c == 'e' || c == 'E') {
                    goto exponent;
                } else if (c == 'j' || c == 'J') {
                    goto imaginary;
                } else if (nonzero) {
                    py_error();  // leading zeros in decimal integer literals are not permitted
                }
                verify_end_of_number(c);
                done = true;
            }
        } else {
            backup();
            c = decimal_tail();
            if (c == '.') {
                c = nextc();
                goto fraction;
            }
            goto after_fraction;
        }
        if (done) goto finish;
    fraction:
        if (isd(c)) c = decimal_tail();
    after_fraction:
        if (c == 'e' || c == 'E') {
        exponent : {
            const int e = c;
            c = nextc();
            if (c == '+' || c == '-') {
                c = nextc();
                if (!isd(c)) py_error();
            } else if (!isd(c)) {
                backup();
                verify_end_of_number(e);  // 1else: the number ends before the e
                backup();
                return strip_us(start, p);
            }
            c = decimal_tail();
        }
        }
        if (c == 'j' || c == 'J') {
        imaginary:
            c = nextc();
            verify_end_of_number(c);
        } else {
            verify_end_of_number(c);
        }
    finish:
        backup();
        return strip_us(start, p);
    }
    std::string strip_us(size_t a, size_t b) const {
        std::string r;
        for (size_t i = a; i < b && i < s.size(); i++)
            if (s[i] != '_') r += s[i];
        return r;
    }
    // the string literal whose opening quote is at p; returns its content
    std::string string_literal() {
        const int quote = nextc();
        int quote_size = 1, end_quote_size = 0;
        int c = nextc();
        if (c == quote) {
            c = nextc();
            if (c == quote) quote_size = 3;
            else end_quote_size = 1;  // the empty string
        }
        if (c != quote) backup();
        const size_t body = p;
        while (end_quote_size != quote_size) {
            c = nextc();
            if (c < 0) py_error();  // unterminated string literal (no newline or backslash can occur)
            if (c == quote) end_quote_size++;
            else end_quote_size = 0;
        }
        if (p - body < (size_t)quote_size) return "";
        return s.substr(body, p - body - (size_t)quote_size);
    }
    std::vector<Tok> run() {
        std::vector<Tok> toks;
        int level = 0, max_level = 0;
        while (true) {
            while (p < s.size() && s[p] == ' ') p++;
            if (p >= s.size()) break;
            const char c = s[p];
            const int c1 = p + 1 < s.size() ? (unsigned char)s[p + 1] : -1;
            if (is_alpha(c) || c == '_') {
                // string prefixes: b r u f in CPython's combinations
                bool saw_b = false, saw_r = false, saw_u = false, saw_f = false;
                size_t q = p;
                bool is_string = false;
                while (q < s.size()) {
                    char ch = (char)(s[q] | 0x20);
                    if (!(saw_b || saw_u || saw_f) && ch == 'b') saw_b = true;
                    else if (!(saw_b || saw_u || saw_r || saw_f) && ch == 'u') saw_u = true;
                    else if (!(saw_r || saw_u) && ch == 'r') saw_r = true;
                    else if (!(saw_f || saw_b || saw_u) && ch == 'f') saw_f = true;
                    else break;
                    q++;
                    if (q < s.size() && (s[q] == '\'' || s[q] == '"')) {
                        is_string = true;
                        break;
                    }
                }
                if (is_string) {
                    p = q;
                    Tok t{Tok::STR, string_literal(), saw_b};
                    toks.push_back(t);
                    continue;
                }
                size_t e = p;
                while (e < s.size() && ident_char((unsigned char)s[e])) e++;
                toks.push_back(Tok{Tok::NAME, s.substr(p, e - p), false});
                p = e;
            } else if (is_digit(c) || (c == '.' && c1 >= 0 && is_digit((char)c1))) {
                toks.push_back(Tok{Tok::NUM, number(), false});
            } else if (c == '\'' || c == '"') {
                toks.push_back(Tok{Tok::STR, string_literal(), false});
            } else if (c == '.') {
                bool ell = c1 == '.' && p + 2 < s.size() && s[p + 2] == '.';
                toks.push_back(Tok{Tok::OP, ell ? "..." : ".", false});
                p += ell ? 3 : 1;
            } else if (c == '(') {
                if (level >= 200) py_error();  // too many nested parentheses
                level++;
                max_level = std::max(max_level, level);
                toks.push_back(Tok{Tok::OP, "(", false});
                p++;
            } else if (c == ')') {
                if (level == 0) py_error();  // unmatched ')'
                level--;
                toks.push_back(Tok{Tok::OP, ")", false});
                p++;
            } else if (c == '+' || c == '-') {
                toks.push_back(Tok{Tok::OP, std::string(1, c), false});
                p++;
            } else if (c == '*' || c == '/') {
                bool dbl = c1 == c;
                toks.push_back(Tok{Tok::OP, dbl ? std::string(2, c) : std::string(1, c), false});
                p += dbl ? 2 : 1;
            } else {
                py_error();  // cannot occur after the character-set checks
            }
        }
        if (level > 0) py_error();  // '(' was never closed
        if (max_level > 100) unsupported();  // see the header comment: Python's parser stack
        toks.push_back(Tok{Tok::END, "", false});
        return toks;
    }
};

// ------------------------------------------------------------------------------------------------
// parser: Python's expression grammar over those tokens, into a tree; evaluation: Python's, lazily

constexpr int MAX_TREE_DEPTH = 1000;

struct Node {
    enum Kind { CONST, NAME, UNARY, BINARY, NOT, AND, OR, IFEXP, COMPARE, ATTR, CALL } k;
    char op = 0;               // UNARY: + -; BINARY: + - * / f(//)
    std::vector<int> kids;     // operands; COMPARE: n+1 operands for n ops; CALL: callee and 0 or 1 argument
    std::vector<int> ops;      // COMPARE: 0 in, 1 not in, 2 is, 3 is not
    bool starred = false;      // CALL: f(*x)
    Val v;                     // CONST
    std::string name;          // NAME, ATTR
    int depth = 1;
    explicit Node(Kind kind) : k(kind) {}
};

static inline bool is_keyword(const std::string& w) {
    static const char* const kw[] = {"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
        "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in",
        "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield", nullptr};
    return in_list(w, kw);
}

struct Parser {
    std::vector<Tok> toks;
    size_t pos = 0;
    std::vector<Node> nodes;
    int rec = 0;

    const Tok& peek(size_t k = 0) const { return toks[std::min(pos + k, toks.size() - 1)]; }
    bool is_op(const char* o, size_t k = 0) const { return peek(k).t == Tok::OP && peek(k).text == o; }
    bool is_kw(const char* w, size_t k = 0) const { return peek(k).t == Tok::NAME && peek(k).text == w; }
    void expect_op(const char* o) {
        if (!is_op(o)) py_error();
        pos++;
    }
    int add(Node n) {
        for (int kid : n.kids) n.depth = std::max(n.depth, nodes[(size_t)kid].depth + 1);
        if (n.depth > MAX_TREE_DEPTH) unsupported();
        nodes.push_back(std::move(n));
        return (int)nodes.size() - 1;
    }
    struct Enter {  // bounds the recursion (the tree depth bounds it too, but only once a subtree is built)
        Parser& p;
        explicit Enter(Parser& pp) : p(pp) {
            if (++p.rec > MAX_TREE_DEPTH + 250) unsupported();
        }
        ~Enter() { p.rec--; }
    };

    int expression() {
        Enter e(*this);
        if (is_kw("lambda")) py_error();  // needs ':'
        int body = disjunction();
        if (!is_kw("if")) return body;
        pos++;
        int cond = disjunction();
        if (!is_kw("else")) py_error();
        pos++;
        int other = expression();
        Node n(Node::IFEXP);
        n.kids = {body, cond, other};
        return add(n);
    }
    int boolop(bool is_or) {
        int first = is_or ? boolop(false) : inversion();
        const char* kw = is_or ? "or" : "and";
        if (!is_kw(kw)) return first;
        Node n(is_or ? Node::OR : Node::AND);
        n.kids.push_back(first);
        while (is_kw(kw)) {
            pos++;
            n.kids.push_back(is_or ? boolop(false) : inversion());
        }
        return add(n);
    }
    int disjunction() { return boolop(true); }
    int inversion() {
        if (is_kw("not")) {
            Enter e(*this);
            pos++;
            Node n(Node::NOT);
            n.kids = {inversion()};
            return add(n);
        }
        return comparison();
    }
    int comparison() {
        int first = sum();
        Node n(Node::COMPARE);
        n.kids.push_back(first);
        while (true) {
            int op;
            if (is_kw("in")) op = 0, pos++;
            else if (is_kw("not") && is_kw("in", 1)) op = 1, pos += 2;
            else if (is_kw("is") && is_kw("not", 1)) op = 3, pos += 2;
            else if (is_kw("is")) op = 2, pos++;
            else break;
            n.ops.push_back(op);
            n.kids.push_back(sum());
        }
        return n.ops.empty() ? first : add(n);
    }
    int sum() {
        int left = term();
        while (is_op("+") || is_op("-")) {
            char op = peek().text[0];
            pos++;
            Node n(Node::BINARY);
            n.op = op;
            n.kids = {left, term()};
            left = add(n);
        }
        return left;
    }
    int term() {
        int left = factor();
        while (is_op("*") || is_op("/") || is_op("//")) {
            char op = peek().text == "//" ? 'f' : peek().text[0];
            pos++;
            Node n(Node::BINARY);
            n.op = op;
            n.kids = {left, factor()};
            left = add(n);
        }
        return left;
    }
    int factor() {
        if (is_op("+") || is_op("-")) {
            Enter e(*this);
            char op = peek().text[0];
            pos++;
            Node n(Node::UNARY);
            n.op = op;
            n.kids = {factor()};
            return add(n);
        }
        int p = primary();
        if (is_op("**")) py_error();  // cannot occur ("**" is refused before)
        return p;
    }
    int primary() {
        int a = atom();
        while (true) {
            if (is_op(".")) {
                pos++;
                if (peek().t != Tok::NAME || is_keyword(peek().text)) py_error();
                Node n(Node::ATTR);
                n.name = peek().text;
                n.kids = {a};
                pos++;
                a = add(n);
            } else if (is_op("(")) {
                Enter e(*this);
                pos++;
                Node n(Node::CALL);
                n.kids = {a};
                if (!is_op(")")) {
                    if (is_op("*")) {
                        pos++;
                        n.starred = true;
                    }
                    n.kids.push_back(expression());
                }
                expect_op(")");
                a = add(n);
            } else {
                return a;
            }
        }
    }
    int atom() {
        const Tok& t = peek();
        Node n(Node::CONST);
        if (t.t == Tok::NAME) {
            if (t.text == "True" || t.text == "False") n.v = v_bool(t.text == "True");
            else if (t.text == "None") n.v = v_none();
            else if (is_keyword(t.text)) py_error();
            else {
                n.k = Node::NAME;
                n.name = t.text;
            }
            pos++;
            return add(n);
        }
        if (t.t == Tok::NUM) {
            n.v = number_value(t.text);
            pos++;
            return add(n);
        }
        if (t.t == Tok::STR) {
            bool bytes = t.bytes;
            std::string s;
            while (peek().t == Tok::STR) {
                if (peek().bytes != bytes) py_error();  // cannot mix bytes and nonbytes literals
                s += peek().text;
                pos++;
            }
            n.v = v_str(s, bytes);
            return add(n);
        }
        if (is_op("...")) {
            pos++;
            n.v.k = Val::ELLIPSIS;
            return add(n);
        }
        if (is_op("(")) {
            Enter e(*this);
            pos++;
            if (is_op(")")) {
                pos++;
                n.v = v_seq({}, false);
                return add(n);
            }
            int inner = expression();
            expect_op(")");
            return inner;
        }
        py_error();
    }
    static Val number_value(const std::string& t) {
        const char last = (char)(t.back() | 0x20);
        if (t.size() > 1 && t[0] == '0' && ((t[1] | 0x20) == 'x' || (t[1] | 0x20) == 'o' || (t[1] | 0x20) == 'b')) {
            const int base = (t[1] | 0x20) == 'x' ? 16 : (t[1] | 0x20) == 'o' ? 8 : 2;
            return v_int(big_from_digits(t.substr(2), base));
        }
        if (last == 'j') {
            Val v;
            v.k = Val::COMPLEX;
            v.f = parse_float(t.substr(0, t.size() - 1));
            return v;
        }
        if (t.find_first_of(".eE") != std::string::npos) return v_float(parse_float(t));
        size_t nz = t.find_first_not_of('0');
        if (nz == std::string::npos) return v_int((int64_t)0);
        if (t.size() > 4300) py_error();  // Exceeds the limit (4300 digits) for integer string conversion
        return v_int(big_from_digits(t, 10));
    }
};

struct Evaluator {
    const std::vector<Node>& nodes;
    Val eval(int id) {
        const Node& n = nodes[(size_t)id];
        switch (n.k) {
            case Node::CONST: return n.v;
            case Node::NAME: py_error();  // NameError: the builtins are empty
            case Node::UNARY: return unary(n.op, eval(n.kids[0]));
            case Node::BINARY: {
                Val a = eval(n.kids[0]);
                Val b = eval(n.kids[1]);
                return binary(n.op, a, b);
            }
            case Node::NOT: return v_bool(!truthy(eval(n.kids[0])));
            case Node::AND: case Node::OR: {
                Val v;
                for (size_t i = 0; i < n.kids.size(); i++) {
                    v = eval(n.kids[i]);
                    if (truthy(v) == (n.k == Node::OR)) return v;
                }
                return v;
            }
            case Node::IFEXP: return truthy(eval(n.kids[1])) ? eval(n.kids[0]) : eval(n.kids[2]);
            case Node::COMPARE: {
                Val left = eval(n.kids[0]);
                bool r = true;
                for (size_t i = 0; i < n.ops.size(); i++) {
                    Val right = eval(n.kids[i + 1]);
                    int op = n.ops[i];
                    r = op < 2 ? py_contains(right, left) != (op == 1) : py_is(left, right) != (op == 3);
                    if (!r) break;
                    left = std::move(right);
                }
                return v_bool(r);
            }
            case Node::ATTR: return get_attr(eval(n.kids[0]), n.name);
            case Node::CALL: {
                Val f = eval(n.kids[0]);
                std::vector<Val> args;
                if (n.kids.size() > 1) args.push_back(eval(n.kids[1]));
                if (n.starred) {
                    if (f.k != Val::METHOD) py_error();  // not callable
                    unsupported();  // cannot occur: no '*' in the second character set
                }
                return call(f, args);
            }
        }
        py_error();
    }
};

// Python's eval(src, {"__builtins__": {}}, {}) then str(): false for None (an exception or a None result)
static inline bool eval_to_text(const std::string& src, std::string* out) {
    size_t start = 0;
    while (start < src.size() && (src[start] == ' ' || src[start] == '\t')) start++;  // as eval does
    Tokenizer tz(src, start);
    Parser ps;
    ps.toks = tz.run();
    for (const Tok& t : ps.toks)
        if (t.t == Tok::NAME && (t.text == "for" || t.text == "async")) unsupported();  // generator expressions
    int root = ps.expression();
    if (ps.peek().t != Tok::END) py_error();
    Evaluator ev{ps.nodes};
    Val v = ev.eval(root);
    if (v.k == Val::NONE) return false;
    return to_text(v, true, out);
}

}  // namespace calc_detail

// nanochat's use_calculator(expr) and str() of its result: false for None (see the top of this file)
static inline bool calculator_eval(const std::string& expr_in, std::string* out, bool* unsupported = nullptr) {
    if (unsupported) *unsupported = false;
    try {
        std::string expr;
        for (char c : expr_in)
            if (c != ',') expr += c;
        auto all_in = [&](const char* set) {
            for (char c : expr)
                if (c == '\0' || !std::strchr(set, c)) return false;
            return true;
        };
        if (all_in("0123456789*+-/.() ")) {
            if (expr.find("**") != std::string::npos) return false;
        } else {
            if (!all_in("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ ")) return false;
            std::string lower = expr;
            for (char& c : lower) c = calc_detail::to_lower(c);
            static const char* const dangerous[] = {"__", "import", "exec", "eval", "compile", "open", "file", "input",
                "raw_input", "globals", "locals", "vars", "dir", "getattr", "setattr", "delattr", "hasattr", nullptr};
            for (const char* const* d = dangerous; *d; d++)
                if (lower.find(*d) != std::string::npos) return false;
            if (expr.find(".count(") == std::string::npos) return false;
        }
        std::string text;
        if (!calc_detail::eval_to_text(expr, &text)) return false;
        *out = text;
        return true;
    } catch (const calc_detail::Fail& f) {
        if (unsupported) *unsupported = f.unsupported;
        return false;
    } catch (...) {  // std::bad_alloc
        return false;
    }
}
