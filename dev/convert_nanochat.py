#!/usr/bin/env python3
"""
nanochat checkpoints in and out of xsa-train, without PyTorch.

    python3 dev/convert_nanochat.py in  NANOCHAT_DIR [--step N] -o MODEL.safetensors [--tokenizer auto|none|PATH]
    python3 dev/convert_nanochat.py out MODEL.safetensors -o NANOCHAT_DIR [--step N] [--tokenizer-dir DIR]

`in` reads what nanochat's checkpoint_manager.save_checkpoint writes into a checkpoint directory
(BASE/base_checkpoints/d12: model_NNNNNN.pt = torch.save(model.state_dict()), meta_NNNNNN.json with
"model_config") and writes a weights file of this repository (the format of `train_gpt --export-safetensors`:
fp32 tensors under nanochat's names, the configuration in the metadata), which `train_gpt --init-from`,
`eval_core -e`, `sample -e`, `chat_sft --init-from` take. `out` writes model_NNNNNN.pt + meta_NNNNNN.json that
nanochat's checkpoint_manager.build_model loads (strict load_state_dict), from such a weights file or a
checkpoint ckpt_*.safetensors (its optimizer state is left out).

What the conversion relies on (nanochat 92d63d4, nanochat/gpt.py and nanochat/checkpoint_manager.py):
  * GPTConfig: sequence_len, vocab_size, n_layer, n_head, n_kv_head, n_embd, window_pattern (a missing
    window_pattern is "L", as _patch_missing_config_keys does); head_dim = n_embd // n_head; the short
    window is -(-sequence_len // 4 // 128) * 128; value embeddings, smear and backout always on.
  * The state dict: fp32 parameters, except transformer.wte.weight and value_embeds.*.weight, which
    init_weights casts to the compute dtype (bf16 on Ampere and later GPUs; fp32 on CPU); vocabulary rows
    padded to a multiple of 64; a "_orig_mod." prefix (torch.compile) is stripped as build_model strips it;
    missing resid_lambdas / x0_lambdas become 1 / 0 as _patch_missing_keys does.
  * torch.save's zip format: ARCHIVE/data.pkl (pickle protocol 2: an OrderedDict of
    torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks) with the storage a
    persistent id ('storage', torch.FloatStorage | torch.BFloat16Storage | ..., key, location, numel)),
    ARCHIVE/data/KEY (each storage's raw little-endian bytes), ARCHIVE/version. Read here with zipfile, a
    restricted unpickler (only those globals: nothing else in a file can run) and numpy; bf16 stays raw
    uint16 until it is widened to fp32 (exact: bf16 is the top half of fp32). The .pt written uses only
    globals of torch.load(weights_only=True)'s allow list.
  * The tokenizer: nanochat keeps it in BASE/tokenizer/tokenizer.pkl (a pickled tiktoken Encoding) and
    token_bytes.pt; the meta does not name it. `in` converts it (by default the one of the base directory
    above the checkpoint directory) into an xsa-train tokenizer file with dev/data/climbmix.py's code (needs
    tiktoken) and records it in the weights' metadata; `out --tokenizer-dir` writes tokenizer.pkl and
    token_bytes.pt from an xsa-train tokenizer file.

XSA has no nanochat equivalent: `out` refuses a model whose XSA layers have a nonzero alpha (fixed, or
learnable with a nonzero logit); alpha 0 is standard attention and converts exactly. It also refuses what
nanochat's GPT cannot express (value embeddings or smear off, head_dim * n_head != n_embd, another short window).

Round trip: `in` records the source dtypes, step and meta in the weights' metadata (nanochat.dtypes,
nanochat.step, nanochat.meta); `out` of that file writes the same tensors, byte for byte, and the same meta.
Without that record (a model trained here), wte and the value embeddings are written as bf16 (rounded to
nearest even, as torch's .to(torch.bfloat16)), the rest fp32: --embeddings-dtype fp32 keeps them exact.

Every bad input ends with one `error:` line on stderr and exit code 1. Needs numpy; tiktoken only for tokenizers.
"""
import argparse
import collections
import io
import json
import math
import mmap
import os
import pickle
import re
import struct
import sys
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "data"))       # climbmix.py: the tokenizer file from a tiktoken Encoding
sys.path.insert(0, os.path.join(HERE, "reference"))  # tokenizer_file.py: reads a tokenizer file, its fingerprint
sys.path.insert(0, HERE)                             # xsa_cli.py: the one-line error of a bad flag
import xsa_cli  # noqa: E402

VOCAB_PAD = 64
VE_GATE_CHANNELS = 12
SMEAR_CHANNELS = 24
ORIG_MOD = "_orig_mod."
NANOCHAT_CONFIG_KEYS = ["sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "window_pattern"]
CHECKPOINT_EXTRAS = re.compile(r"^(optimizer\.state|dataloader\.state(\.rank\d+)?)$")  # ckpt_*.safetensors, not weights


class ConvertError(Exception):
    """A bad input or a model that cannot be converted: one `error:` line, exit code 1."""


def _numpy():
    try:
        import numpy
    except ModuleNotFoundError:
        raise ConvertError(f"needs the Python package 'numpy', which {sys.executable} cannot import: "
                           f"{sys.executable} -m pip install -r dev/requirements.txt")
    return numpy


# ----------------------------------------------------------------------------------------------------
# torch.save files, read and written without torch

# storage class (torch.<Name>Storage) -> (dtype name, numpy dtype of its raw elements; bf16 as uint16)
STORAGES = {
    "FloatStorage": ("float32", "<f4"), "BFloat16Storage": ("bfloat16", "<u2"), "HalfStorage": ("float16", "<f2"),
    "DoubleStorage": ("float64", "<f8"), "LongStorage": ("int64", "<i8"), "IntStorage": ("int32", "<i4"),
    "ShortStorage": ("int16", "<i2"), "CharStorage": ("int8", "i1"), "ByteStorage": ("uint8", "u1"),
    "BoolStorage": ("bool", "u1"), "ComplexFloatStorage": ("complex64", "<c8"),
    "ComplexDoubleStorage": ("complex128", "<c16"),
}
STORAGE_OF = {dtype: name for name, (dtype, _) in STORAGES.items()}


class _StorageClass:
    def __init__(self, name):
        self.name = name


class _StorageRef:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class _TensorRef:
    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    return _TensorRef(storage, storage_offset, size, stride)


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _TensorRef(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data


class _TorchUnpickler(pickle.Unpickler):
    """Builds only what a state dict holds: OrderedDicts, and tensors as _TensorRef. Any other global is refused
    before anything is called, so a file cannot run code here."""
    GLOBALS = {("collections", "OrderedDict"): collections.OrderedDict,
               ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
               ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
               ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}

    def find_class(self, module, name):
        if (module, name) in self.GLOBALS:
            return self.GLOBALS[(module, name)]
        if module == "torch" and name in STORAGES:
            return _StorageClass(name)
        raise ConvertError(f"holds an object of type {module}.{name}; a model file holds only tensors")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageClass)
                and isinstance(pid[2], str) and isinstance(pid[4], int) and pid[4] >= 0):
            raise ConvertError(f"has a storage reference this converter does not know: {pid!r:.80}")
        return _StorageRef(pid[1], pid[2], pid[4])


def _tensor_ref_ok(t):
    return (isinstance(t, _TensorRef) and isinstance(t.storage, _StorageRef) and isinstance(t.offset, int)
            and isinstance(t.size, tuple) and isinstance(t.stride, tuple) and len(t.size) == len(t.stride)
            and all(isinstance(d, int) and d >= 0 for d in t.size) and all(isinstance(s, int) and s >= 0 for s in t.stride)
            and t.offset >= 0)


class TorchFile:
    """A torch.save zip file of a dict of tensors. entries: [(name, _TensorRef)] in the file's order;
    tensor(ref) returns its elements as a C-contiguous numpy array of the storage's raw dtype."""

    def __init__(self, path):
        self.path = path
        try:
            self.zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile:
            with open(path, "rb") as f:
                head = f.read(2)
            if head[:1] == b"\x80":
                raise ConvertError(f"'{path}' is a torch.save file of the legacy format (before PyTorch 1.6, or "
                                   "_use_new_zipfile_serialization=False): load and save it again with a current torch")
            raise ConvertError(f"'{path}' is not a torch.save file (not a zip archive: truncated or corrupt?)")
        except OSError as e:
            raise ConvertError(f"cannot read '{path}': {e.strerror}")
        names = self.zip.namelist()
        pkls = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise ConvertError(f"'{path}' is a zip archive but not a torch.save file (no ARCHIVE/data.pkl)")
        self.prefix = pkls[0][:-len("data.pkl")]
        if self.prefix + "byteorder" in names and self._read(self.prefix + "byteorder").strip() != b"little":
            raise ConvertError(f"'{path}' was saved on a big-endian machine; only little-endian files are read")
        try:
            obj = _TorchUnpickler(io.BytesIO(self._read(pkls[0]))).load()
        except ConvertError as e:
            raise ConvertError(f"'{path}' {e}")
        except Exception as e:  # anything else a damaged pickle raises
            raise ConvertError(f"'{path}': its data.pkl cannot be read ({type(e).__name__}: {e})")
        if not isinstance(obj, dict):
            raise ConvertError(f"'{path}' holds a {type(obj).__name__}, not a state dict (a dict of tensors)")
        self.entries = []
        for name, t in obj.items():
            if not isinstance(name, str) or not _tensor_ref_ok(t):
                raise ConvertError(f"'{path}': entry {name!r:.80} is not a tensor; a model file holds only tensors")
            self.entries.append((name, t))

    def _read(self, member):
        try:
            return self.zip.read(member)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as e:
            raise ConvertError(f"'{self.path}': member {member} cannot be read ({e}): the file is corrupt")

    @staticmethod
    def dtype(t):
        return STORAGES[t.storage.cls.name][0]

    def tensor(self, name, t):
        np = _numpy()
        npdtype = np.dtype(STORAGES[t.storage.cls.name][1])
        member = self.prefix + "data/" + t.storage.key
        try:
            info = self.zip.getinfo(member)
        except KeyError:
            raise ConvertError(f"'{self.path}': tensor {name}'s storage {member} is missing from the archive")
        if info.file_size != t.storage.numel * npdtype.itemsize:
            raise ConvertError(f"'{self.path}': tensor {name}'s storage {member} has {info.file_size} bytes, its record "
                               f"says {t.storage.numel} x {npdtype.itemsize}")
        numel = math.prod(t.size)
        if numel and t.offset + sum((d - 1) * s for d, s in zip(t.size, t.stride)) >= t.storage.numel:
            raise ConvertError(f"'{self.path}': tensor {name} (shape {list(t.size)}, offset {t.offset}, stride "
                               f"{list(t.stride)}) reaches past its storage of {t.storage.numel} elements")
        storage = np.frombuffer(self._read(member), dtype=npdtype)
        if numel == 0:
            return np.zeros(t.size, dtype=npdtype)
        contiguous = [math.prod(t.size[i + 1:]) for i in range(len(t.size))]
        if all(d == 1 or s == c for d, s, c in zip(t.size, t.stride, contiguous)):
            return storage[t.offset:t.offset + numel].reshape(t.size)
        view = np.lib.stride_tricks.as_strided(storage[t.offset:], shape=t.size,
                                               strides=[s * npdtype.itemsize for s in t.stride], writeable=False)
        return np.ascontiguousarray(view)


class _PickleWriter:
    """Pickle protocol 2 opcodes, written by hand: only those torch.load(weights_only=True) accepts (PyTorch 1.13
    and later), and only the globals of its allow list."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")  # PROTO 2

    def glob(self, module, name):
        self.out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    def string(self, s):
        b = s.encode("utf-8")
        self.out += b"X" + struct.pack("<I", len(b)) + b

    def integer(self, v):
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        elif -2 ** 31 <= v < 2 ** 31:
            self.out += b"J" + struct.pack("<i", v)
        else:
            b = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            self.out += b"\x8a" + bytes([len(b)]) + b  # LONG1

    def int_tuple(self, values):
        if not values:
            self.out += b")"  # EMPTY_TUPLE
            return
        self.out += b"("  # MARK
        for v in values:
            self.integer(v)
        self.out += b"t"  # TUPLE

    def ordered_dict(self):
        self.glob("collections", "OrderedDict")
        self.out += b")R"  # EMPTY_TUPLE REDUCE

    def tensor(self, storage_class, key, shape):
        numel = math.prod(shape)
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.out += b"(("  # MARK (the arguments) MARK (the persistent id)
        self.string("storage")
        self.glob("torch", storage_class)
        self.string(key)
        self.string("cpu")
        self.integer(numel)
        self.out += b"tQ"  # TUPLE BINPERSID
        self.integer(0)  # storage offset
        self.int_tuple(shape)
        self.int_tuple([math.prod(shape[i + 1:]) for i in range(len(shape))])  # contiguous strides
        self.out += b"\x89"  # NEWFALSE: requires_grad
        self.ordered_dict()  # backward hooks
        self.out += b"tR"  # TUPLE REDUCE


def write_torch_file(path, tensors, single=False):
    """torch.save's zip layout: ARCHIVE/data.pkl, ARCHIVE/byteorder, ARCHIVE/data/0.., ARCHIVE/version, each
    record's data 64-byte aligned as torch aligns it. tensors: [(name, dtype name, numpy array of its raw
    elements)] written as an OrderedDict in that order, or with single=True one tensor alone (token_bytes.pt)."""
    w = _PickleWriter()
    if not single:
        w.ordered_dict()
        w.out += b"("  # MARK
    for key, (name, dtype, array) in enumerate(tensors):
        if not single:
            w.string(name)
        w.tensor(STORAGE_OF[dtype], str(key), list(array.shape))
    if not single:
        w.out += b"u"  # SETITEMS
    w.out += b"."  # STOP
    archive = os.path.splitext(os.path.basename(path))[0] or "archive"
    records = [("data.pkl", bytes(w.out)), ("byteorder", b"little")]
    records += [(f"data/{key}", memoryview(array.reshape(-1).view("u1")))
                for key, (_, _, array) in enumerate(tensors)]
    records.append(("version", b"3\n"))
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            info = zipfile.ZipInfo(f"{archive}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            zip64 = 20 if len(data) * 1.05 > zipfile.ZIP64_LIMIT else 0
            start = z.fp.tell() + 30 + len(info.filename.encode("utf-8")) + zip64 + 4  # the data, after a 4-byte extra header
            pad = -start % 64
            info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # "FB" + padding, as torch's writer pads
            z.writestr(info, data)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------
# safetensors (llmc/safetensors.h): u64 header length, JSON header, data

SAFE_DTYPES = {"F32": "<f4", "I32": "<i4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8"}


def read_safetensors(path):
    """(metadata dict, {name: (dtype, shape, numpy array)} in file order) of a safetensors file, memory-mapped."""
    np = _numpy()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise ConvertError(f"cannot read '{path}': {e.strerror}")
    if size < 8:
        raise ConvertError(f"'{path}' is not a safetensors file (only {size} bytes)")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > size - 8:
        raise ConvertError(f"'{path}' is not a safetensors file (header length {n} does not fit the file)")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("a key appears twice")
        return dict(pairs)
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"), object_pairs_hook=no_duplicates)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertError(f"'{path}' is not a safetensors file (its header is not valid JSON: {e})")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ConvertError(f"'{path}': __metadata__ is not an object of strings")
    data_start, data_len = 8 + n, size - 8 - n
    tensors = {}
    for name, info in header.items():
        ok = (isinstance(info, dict) and info.get("dtype") in SAFE_DTYPES and isinstance(info.get("shape"), list)
              and all(isinstance(d, int) and d >= 0 for d in info["shape"]) and isinstance(info.get("data_offsets"), list)
              and len(info["data_offsets"]) == 2 and all(isinstance(o, int) for o in info["data_offsets"]))
        if not ok:
            raise ConvertError(f"'{path}': tensor {name} has a malformed entry in the header (dtype one of "
                               f"{', '.join(SAFE_DTYPES)}, shape, data_offsets)")
        dt = np.dtype(SAFE_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"])
        if not 0 <= begin <= end <= data_len or end - begin != count * dt.itemsize:
            raise ConvertError(f"'{path}': tensor {name} has data_offsets [{begin}, {end}] that do not match its shape "
                               f"or the file size ({data_len} data bytes)")
        array = np.frombuffer(buf, dtype=dt, count=count, offset=data_start + begin).reshape(info["shape"])
        tensors[name] = (info["dtype"], tuple(info["shape"]), array)
    return meta, tensors


def write_safetensors(path, metadata, tensors):
    """tensors: [(name, float32 numpy array)], written in that order as F32, the header padded so that the data
    starts 8-byte aligned (as llmc/safetensors.h writes); to PATH.tmp, then renamed."""
    header = {"__metadata__": metadata}
    offset = 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, a in tensors:
                f.write(memoryview(a.reshape(-1).view("u1")))
        os.replace(tmp, path)
    except OSError as e:
        raise ConvertError(f"cannot write '{path}': {e.strerror}")


# ----------------------------------------------------------------------------------------------------
# The model: configuration and parameter tables (train_gpt.cu's param_table; nanochat's state_dict order)

def nanochat_short_window(sequence_len):
    return -(-sequence_len // 4 // 128) * 128  # nanochat's GPT._compute_window_sizes, literally


def has_ve(cfg, layer):
    return cfg["value_embeds"] and layer % 2 == (cfg["n_layer"] - 1) % 2


def padded_vocab(cfg):
    return (cfg["vocab_size"] + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD


def layer_tensors(cfg, layer):
    C, H, Hkv, D = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    p = f"transformer.h.{layer}."
    t = [(p + "attn.c_q.weight", (H * D, C)), (p + "attn.c_k.weight", (Hkv * D, C)), (p + "attn.c_v.weight", (Hkv * D, C)),
         (p + "attn.c_proj.weight", (C, H * D))]
    if cfg["xsa_learnable"] and layer in cfg["xsa_layers"]:
        t.append((p + "attn.xsa_logit", (H,)))
    if has_ve(cfg, layer):
        t.append((p + "attn.ve_gate.weight", (Hkv, VE_GATE_CHANNELS)))
    return t + [(p + "mlp.c_fc.weight", (4 * C, C)), (p + "mlp.c_proj.weight", (C, 4 * C))]


def param_table(cfg):
    """[(name, shape)] in train_gpt's order (param_table in train_gpt.cu; the order of its files)."""
    C, L, Vp = cfg["n_embd"], cfg["n_layer"], padded_vocab(cfg)
    kvd = cfg["n_kv_head"] * cfg["head_dim"]
    t = [("transformer.wte.weight", (Vp, C))]
    for layer in range(L):
        t += layer_tensors(cfg, layer)
    t += [("lm_head.weight", (Vp, C)), ("resid_lambdas", (L,)), ("x0_lambdas", (L,))]
    if cfg["smear"]:
        t += [("smear_gate.weight", (1, SMEAR_CHANNELS)), ("smear_lambda", (1,))]
    t.append(("backout_lambda", (1,)))
    return t + [(f"value_embeds.{layer}.weight", (Vp, kvd)) for layer in range(L) if has_ve(cfg, layer)]


def nanochat_order(cfg):
    """The names in the order of nanochat's GPT.state_dict(): the GPT's own parameters as registered, then its
    modules' (transformer, lm_head, smear_gate, value_embeds)."""
    names = ["resid_lambdas", "x0_lambdas", "smear_lambda", "backout_lambda", "transformer.wte.weight"]
    for layer in range(cfg["n_layer"]):
        names += [n for n, _ in layer_tensors(cfg, layer)]
    names += ["lm_head.weight", "smear_gate.weight"]
    return names + [f"value_embeds.{layer}.weight" for layer in range(cfg["n_layer"]) if has_ve(cfg, layer)]


def check_config(cfg, where):
    """What train_gpt's validate_config demands, so that a file written here always loads there."""
    L, H, Hkv, D, C = cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"], cfg["n_embd"]
    problems = []
    if not 1 <= L <= 4096:
        problems.append(f"n_layer {L} is not in [1, 4096]")
    if H < 1 or Hkv < 1 or H % Hkv:
        problems.append(f"n_head {H} is not a positive multiple of n_kv_head {Hkv}")
    if D < 2 or D % 2:
        problems.append(f"head_dim {D} is not even (rotary pairs channels)")
    if C < SMEAR_CHANNELS:
        problems.append(f"n_embd {C} is below {SMEAR_CHANNELS} (the smear gate reads 24 channels)")
    if not 2 <= cfg["vocab_size"] <= 1 << 24:
        problems.append(f"vocab_size {cfg['vocab_size']} is not in [2, 2^24]")
    if not 1 <= cfg["seq_len"] <= 1 << 24:
        problems.append(f"sequence length {cfg['seq_len']} is not in [1, 2^24]")
    if not re.fullmatch(r"[SL]{1,64}", cfg["window_pattern"]):
        problems.append(f"window_pattern '{cfg['window_pattern']}' is not 1 to 64 letters S and L")
    if max(C, H * D, Hkv * D) > 1 << 16:
        problems.append("a width over 65536")
    if problems:
        raise ConvertError(f"{where}: {'; '.join(problems)}")


def config_metadata(cfg):
    """train_gpt's config_to_metadata: the configuration as the strings its files carry."""
    return {"vocab_size": str(cfg["vocab_size"]), "n_layer": str(cfg["n_layer"]), "n_head": str(cfg["n_head"]),
            "n_kv_head": str(cfg["n_kv_head"]), "head_dim": str(cfg["head_dim"]), "n_embd": str(cfg["n_embd"]),
            "seq_len": str(cfg["seq_len"]), "window_pattern": cfg["window_pattern"], "short_window": str(cfg["short_window"]),
            "value_embeds": "1" if cfg["value_embeds"] else "0", "smear": "1" if cfg["smear"] else "0",
            "xsa_alpha": "%.9g" % cfg["xsa_alpha"], "xsa_learnable": "1" if cfg["xsa_learnable"] else "0",
            "xsa_layers": ",".join(str(layer) for layer in sorted(cfg["xsa_layers"]))}


def parse_layers(spec, n_layer, where):
    if spec in ("", "none"):
        return set()
    if spec == "all":
        return set(range(n_layer))
    layers = set()
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m or int(m.group(2) or m.group(1)) >= n_layer or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise ConvertError(f"{where}: metadata xsa_layers '{spec}' is not a list of layers 0..{n_layer - 1}")
        layers.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return layers


def config_from_metadata(meta, path):
    """The model configuration a train_gpt file records (train_gpt's config_from_metadata)."""
    if "n_layer" not in meta:
        raise ConvertError(f"'{path}' has no model configuration in its metadata (n_layer, n_embd, ...): not a weights "
                           "file or checkpoint of train_gpt")

    def integer(key, lo=0, hi=2 ** 31 - 1):
        v = meta.get(key)
        if v is None:
            raise ConvertError(f"'{path}' has no metadata key '{key}'")
        if not re.fullmatch(r"-?\d+", v) or not lo <= int(v) <= hi:
            raise ConvertError(f"'{path}': metadata {key} = '{v}' is not an integer in [{lo}, {hi}]")
        return int(v)
    cfg = {k: integer(k) for k in ("vocab_size", "n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "seq_len",
                                   "short_window")}
    cfg["value_embeds"] = integer("value_embeds", 0, 1) == 1
    cfg["smear"] = integer("smear", 0, 1) == 1
    cfg["xsa_learnable"] = "xsa_learnable" in meta and integer("xsa_learnable", 0, 1) == 1
    cfg["window_pattern"] = meta.get("window_pattern", "")
    try:
        cfg["xsa_alpha"] = float(meta.get("xsa_alpha", ""))
        if not math.isfinite(cfg["xsa_alpha"]):
            raise ValueError
    except ValueError:
        raise ConvertError(f"'{path}': metadata xsa_alpha = '{meta.get('xsa_alpha')}' is not a finite number")
    check_config(cfg, f"'{path}'")
    cfg["xsa_layers"] = parse_layers(meta.get("xsa_layers", ""), cfg["n_layer"], f"'{path}'")
    return cfg


# ----------------------------------------------------------------------------------------------------
# Tokenizers

class _PickledEncoding:
    """What a pickled tiktoken Encoding leaves: its __getstate__ value (a dict, or a registered encoding's name)."""

    def __setstate__(self, state):
        self.state = state


class _TokenizerUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("tiktoken.core", "Encoding"):
            return _PickledEncoding
        if (module, name) == ("_codecs", "encode"):  # bytes in pickle protocols 0-2
            import codecs
            return codecs.encode
        raise ConvertError(f"holds an object of type {module}.{name}, not a tiktoken Encoding")


def nanochat_tokenizer_encoding(pkl_path, vocab_size):
    """The tiktoken Encoding of nanochat's tokenizer.pkl, rebuilt with climbmix.py's make_encoding (nanochat's
    pattern, ranks and 9 special tokens) after checking that the pickle holds exactly that: read with a restricted
    unpickler, so the file cannot run code."""
    import climbmix
    try:
        with open(pkl_path, "rb") as f:
            obj = _TokenizerUnpickler(f).load()
    except OSError as e:
        raise ConvertError(f"cannot read '{pkl_path}': {e.strerror}")
    except ConvertError as e:
        raise ConvertError(f"'{pkl_path}' {e}")
    except Exception as e:
        raise ConvertError(f"'{pkl_path}' is not a pickled tokenizer ({type(e).__name__}: {e})")
    state = getattr(obj, "state", None)
    if isinstance(state, str):
        raise ConvertError(f"'{pkl_path}' is tiktoken's registered encoding '{state}', not a tokenizer trained by nanochat "
                           "(scripts/tok_train.py)")
    if not (isinstance(obj, _PickledEncoding) and isinstance(state, dict)
            and isinstance(state.get("mergeable_ranks"), dict) and isinstance(state.get("special_tokens"), dict)
            and isinstance(state.get("pat_str"), str)):
        raise ConvertError(f"'{pkl_path}' is not a pickled tiktoken Encoding (nanochat's tokenizer.pkl)")
    ranks, special = state["mergeable_ranks"], state["special_tokens"]
    n = len(ranks)
    if not all(isinstance(k, bytes) for k in ranks) or sorted(ranks.values()) != list(range(n)):
        raise ConvertError(f"'{pkl_path}': the mergeable ranks are not byte strings with the ids 0..{n - 1}")
    want = {name: n + i for i, name in enumerate(climbmix.SPECIAL_TOKENS)}
    if special != want:
        raise ConvertError(f"'{pkl_path}': the special tokens are not nanochat's 9 after the mergeable tokens")
    if n + len(want) != vocab_size:
        raise ConvertError(f"'{pkl_path}' has {n + len(want)} tokens, the model {vocab_size}: not the model's tokenizer")
    try:
        return climbmix.make_encoding(ranks, state["pat_str"])
    except ModuleNotFoundError as e:
        raise ConvertError(f"converting nanochat's tokenizer '{pkl_path}' needs the Python package '{e.name}', which "
                           f"{sys.executable} cannot import ({sys.executable} -m pip install -r dev/requirements.txt); "
                           "or pass --tokenizer FILE (an xsa-train tokenizer file) or --tokenizer none")
    except climbmix.PrepError as e:
        raise ConvertError(f"'{pkl_path}': {e}")


def tokenizer_file(path, vocab_size):
    """An xsa-train tokenizer file, checked: (TokenizerFile, fingerprint)."""
    import tokenizer_file as tf
    try:
        tok = tf.TokenizerFile(path)
    except tf.TokenizerFileError as e:
        raise ConvertError(str(e))
    if tok.vocab_size != vocab_size:
        raise ConvertError(f"the tokenizer '{path}' has {tok.vocab_size} tokens, the model {vocab_size}: not the model's tokenizer")
    return tok, tok.fingerprint()


def is_tokenizer_file(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == struct.pack("<i", 20241201)
    except OSError:
        return False


def convert_tokenizer_in(args, ckpt_dir, vocab_size):
    """{tokenizer, tokenizer_fingerprint} for the weights' metadata (empty: none), and a line saying what was done."""
    choice = args.tokenizer
    if choice == "none":
        return {}, "tokenizer: none recorded (--tokenizer none); sample and chat_cli then need --tokenizer FILE"
    if choice == "auto":
        guess = os.path.normpath(os.path.join(ckpt_dir, os.pardir, os.pardir, "tokenizer", "tokenizer.pkl"))  # BASE/tokenizer
        if not os.path.exists(guess):
            return {}, (f"tokenizer: none recorded (nanochat's would be {guess}, which does not exist); convert it with "
                        "--tokenizer BASE/tokenizer, or sample and chat_cli need --tokenizer FILE")
        pkl = guess
    elif os.path.isdir(choice):
        pkl = os.path.join(choice, "tokenizer.pkl")
        if not os.path.exists(pkl):
            raise ConvertError(f"--tokenizer {choice}: the directory has no tokenizer.pkl (nanochat's tokenizer directory "
                               "is BASE/tokenizer)")
    elif not os.path.exists(choice):
        raise ConvertError(f"--tokenizer {choice}: no such file or directory")
    elif is_tokenizer_file(choice):
        _, fingerprint = tokenizer_file(choice, vocab_size)
        return {"tokenizer": choice, "tokenizer_fingerprint": fingerprint}, f"tokenizer: {choice} (recorded as given)"
    else:
        pkl = choice
    enc = nanochat_tokenizer_encoding(pkl, vocab_size)
    out = args.tokenizer_out or os.path.join(os.path.dirname(args.output), "tokenizer.bin")
    import climbmix
    data = climbmix.tokenizer_bytes(enc, climbmix.DEFAULT_PROMPTS)
    if os.path.exists(out) and not args.overwrite:
        with open(out, "rb") as f:
            if f.read() != data:
                raise ConvertError(f"'{out}' exists with other contents; pass --tokenizer-out FILE, or --overwrite 1")
    else:
        climbmix.write_atomic(out, data)
    _, fingerprint = tokenizer_file(out, vocab_size)
    return ({"tokenizer": out, "tokenizer_fingerprint": fingerprint},
            f"tokenizer: {pkl} -> {out} (xsa-train's tokenizer file, recorded in the weights)")


# ----------------------------------------------------------------------------------------------------
# in: nanochat checkpoint directory -> safetensors

def find_checkpoint(path, step):
    """(directory, step) of a nanochat checkpoint: PATH is its directory (model_NNNNNN.pt + meta_NNNNNN.json) or
    its model_NNNNNN.pt."""
    if os.path.isfile(path):
        m = re.fullmatch(r"model_(\d+)\.pt", os.path.basename(path))
        if not m:
            raise ConvertError(f"'{path}' is a file but not nanochat's model_NNNNNN.pt; pass the checkpoint directory")
        if step is not None and step != int(m.group(1)):
            raise ConvertError(f"'{path}' is step {int(m.group(1))}, --step says {step}")
        return os.path.dirname(path) or ".", int(m.group(1))
    if not os.path.isdir(path):
        raise ConvertError(f"'{path}': no such directory (nanochat's checkpoints are in BASE/base_checkpoints/TAG)")
    try:
        steps = sorted(int(m.group(1)) for m in (re.search(r"model_(\d+)\.pt$", f) for f in os.listdir(path)) if m)
    except OSError as e:
        raise ConvertError(f"cannot list '{path}': {e.strerror}")
    if not steps:
        hint = ""
        if os.path.isdir(os.path.join(path, "base_checkpoints")):
            hint = f" (it looks like nanochat's base directory: pass {os.path.join(path, 'base_checkpoints', 'TAG')})"
        raise ConvertError(f"'{path}' has no model_NNNNNN.pt, so no nanochat checkpoint{hint}")
    if step is None:
        if len(steps) > 1:
            raise ConvertError(f"'{path}' holds the steps {', '.join(map(str, steps))}: pick one with --step N")
        step = steps[0]
    if not os.path.exists(os.path.join(path, f"model_{step:06d}.pt")):
        raise ConvertError(f"'{path}' has no model_{step:06d}.pt (its steps: {', '.join(map(str, steps))})")
    return path, step


def nanochat_config(meta, meta_path):
    """The model configuration of a nanochat meta, as this repository's (a missing window_pattern is 'L', as
    nanochat's _patch_missing_config_keys makes it)."""
    mc = meta.get("model_config") if isinstance(meta, dict) else None
    if not isinstance(mc, dict):
        raise ConvertError(f"'{meta_path}' has no \"model_config\" object (nanochat's meta_NNNNNN.json has one)")
    unknown = sorted(set(mc) - set(NANOCHAT_CONFIG_KEYS))
    if unknown:
        raise ConvertError(f"'{meta_path}': model_config has {', '.join(unknown)}, which nanochat 92d63d4's GPTConfig does "
                           f"not have ({', '.join(NANOCHAT_CONFIG_KEYS)}): a model this converter does not know")
    mc = dict(mc)
    notes = []
    if "window_pattern" not in mc:
        mc["window_pattern"] = "L"
        notes.append("model_config has no window_pattern: 'L', as nanochat patches old checkpoints")
    for k in NANOCHAT_CONFIG_KEYS[:-1]:
        if not isinstance(mc.get(k), int) or isinstance(mc.get(k), bool) or mc[k] < 1:
            raise ConvertError(f"'{meta_path}': model_config.{k} = {mc.get(k)!r} is not a positive integer")
    if not isinstance(mc["window_pattern"], str):
        raise ConvertError(f"'{meta_path}': model_config.window_pattern is not a string")
    if mc["n_embd"] % mc["n_head"]:
        raise ConvertError(f"'{meta_path}': n_embd {mc['n_embd']} is not a multiple of n_head {mc['n_head']} (nanochat asserts it)")
    if mc["n_kv_head"] > mc["n_head"] or mc["n_head"] % mc["n_kv_head"]:
        raise ConvertError(f"'{meta_path}': n_head {mc['n_head']} is not a multiple of n_kv_head {mc['n_kv_head']}")
    cfg = {"vocab_size": mc["vocab_size"], "n_layer": mc["n_layer"], "n_head": mc["n_head"], "n_kv_head": mc["n_kv_head"],
           "head_dim": mc["n_embd"] // mc["n_head"], "n_embd": mc["n_embd"], "seq_len": mc["sequence_len"],
           "window_pattern": mc["window_pattern"].upper(), "short_window": nanochat_short_window(mc["sequence_len"]),
           "value_embeds": True, "smear": True, "xsa_alpha": 0.0, "xsa_learnable": False, "xsa_layers": set()}
    check_config(cfg, f"'{meta_path}'")
    return cfg, notes


def to_float32(array, dtype):
    """Exact: bf16 is the top 16 bits of an fp32; fp16 widens exactly."""
    if dtype == "bfloat16":
        return (array.astype("<u4") << 16).view("<f4")
    return array.astype("<f4")


def command_in(args):
    np = _numpy()
    ckpt_dir, step = find_checkpoint(args.checkpoint, args.step)
    model_path = os.path.join(ckpt_dir, f"model_{step:06d}.pt")
    meta_path = os.path.join(ckpt_dir, f"meta_{step:06d}.json")
    if os.path.exists(args.output) and not args.overwrite:
        raise ConvertError(f"'{args.output}' exists; pass --overwrite 1 to replace it")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta_text = f.read()
        meta = json.loads(meta_text)
    except FileNotFoundError:
        raise ConvertError(f"'{meta_path}' is missing (nanochat writes meta_NNNNNN.json beside model_NNNNNN.pt)")
    except OSError as e:
        raise ConvertError(f"cannot read '{meta_path}': {e.strerror}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertError(f"'{meta_path}' is not valid JSON ({e})")
    cfg, notes = nanochat_config(meta, meta_path)
    pt = TorchFile(model_path)

    entries = {}
    stripped = 0
    for name, ref in pt.entries:
        if name.startswith(ORIG_MOD):
            name, stripped = name[len(ORIG_MOD):], stripped + 1
        if name in entries:
            raise ConvertError(f"'{model_path}' holds {name} twice (with and without the {ORIG_MOD} prefix)")
        entries[name] = ref
    if stripped:
        notes.append(f"{stripped} names had torch.compile's '{ORIG_MOD}' prefix: stripped, as nanochat's build_model does")
    table = param_table(cfg)
    wanted = dict(table)
    for name in entries:
        if name not in wanted:
            raise ConvertError(f"'{model_path}' holds the tensor '{name}', which nanochat's GPT with this model_config "
                               f"({cfg['n_layer']} layers) does not have")
    tensors, dtypes = [], {}
    for name, shape in table:
        ref = entries.get(name)
        if ref is None:
            if name in ("resid_lambdas", "x0_lambdas"):  # nanochat's _patch_missing_keys
                value = 1.0 if name == "resid_lambdas" else 0.0
                tensors.append((name, np.full(shape, value, dtype="<f4")))
                notes.append(f"{name} missing: {value:g}, as nanochat patches old checkpoints")
                continue
            raise ConvertError(f"'{model_path}' has no tensor '{name}' (needed by the model of {meta_path})")
        if tuple(ref.size) != shape:
            raise ConvertError(f"'{model_path}': tensor '{name}' has shape {list(ref.size)}, the model_config of "
                               f"{meta_path} gives {list(shape)}")
        dtype = pt.dtype(ref)
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ConvertError(f"'{model_path}': tensor '{name}' has dtype {dtype}; nanochat's parameters are float32, "
                               "bfloat16 or float16")
        values = to_float32(pt.tensor(name, ref), dtype)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ConvertError(f"'{model_path}': tensor '{name}' holds a non-finite value ({values.reshape(-1)[bad[0]]} at "
                               f"index {bad[0]})")
        if dtype != "float32":
            dtypes[name] = dtype
        tensors.append((name, np.ascontiguousarray(values)))

    metadata = config_metadata(cfg)
    tok_meta, tok_line = convert_tokenizer_in(args, ckpt_dir, cfg["vocab_size"])
    metadata.update(tok_meta)
    metadata.update({"nanochat.step": str(step), "nanochat.dtypes": json.dumps(dtypes), "nanochat.source": model_path,
                     "nanochat.meta": json.dumps(meta, separators=(",", ":")),
                     "nanochat.order": json.dumps([n[len(ORIG_MOD):] if n.startswith(ORIG_MOD) else n for n, _ in pt.entries])})
    write_safetensors(args.output, metadata, tensors)
    numel = sum(a.size for _, a in tensors)
    print(f"read {model_path} (step {step}): {cfg['n_layer']} layers, n_embd {cfg['n_embd']}, {cfg['n_head']} heads "
          f"({cfg['n_kv_head']} kv) x {cfg['head_dim']}, vocab {cfg['vocab_size']}, sequence_len {cfg['seq_len']}, "
          f"windows {cfg['window_pattern']} (short {cfg['short_window']})")
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.output}: {len(tensors)} tensors, {numel:,} parameters, fp32"
          + (f" ({', '.join(sorted(set(dtypes.values())))} widened exactly)" if dtypes else ""))
    print(tok_line)
    flags = (f"-d {cfg['n_layer']} --dim {cfg['n_embd']} --heads {cfg['n_head']} --kv-heads {cfg['n_kv_head']} "
             f"--head-dim {cfg['head_dim']} -t {cfg['seq_len']} --window-pattern {cfg['window_pattern']}")
    if "tokenizer" in metadata:
        flags += f" --tokenizer {metadata['tokenizer']}"
    print(f"train from it: ./train_gpt --init-from {args.output} {flags} ...")


# ----------------------------------------------------------------------------------------------------
# out: safetensors -> nanochat checkpoint directory

def to_dtype(values, dtype):
    """fp32 values as dtype's raw elements (bf16: round to nearest even, as torch's .to(torch.bfloat16)) and how
    many of them changed."""
    np = _numpy()
    if dtype == "float32":
        return values, 0
    if dtype == "bfloat16":
        u = values.view("<u4")
        raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
        back = (raw.astype("<u4") << 16).view("<f4")
    else:
        raw = values.astype("<f2")
        back = raw.astype("<f4")
    if not np.isfinite(back).all():
        raise ConvertError(f"a value over {dtype}'s range would become infinite; use --embeddings-dtype fp32")
    return raw, int(np.count_nonzero(back != values))


def nanochat_refusals(cfg, tensors, path):
    """Why nanochat's GPT cannot hold this model, or [] (then the notes to print)."""
    problems, notes = [], []
    if cfg["head_dim"] * cfg["n_head"] != cfg["n_embd"]:
        problems.append(f"head_dim {cfg['head_dim']} x n_head {cfg['n_head']} != n_embd {cfg['n_embd']} (nanochat's head_dim is "
                        "n_embd / n_head)")
    if not cfg["value_embeds"]:
        problems.append("value embeddings off (nanochat always has them)")
    if not cfg["smear"]:
        problems.append("smear off (nanochat always has it)")
    if cfg["short_window"] != nanochat_short_window(cfg["seq_len"]):
        problems.append(f"short window {cfg['short_window']} (nanochat's for sequence_len {cfg['seq_len']} is "
                        f"{nanochat_short_window(cfg['seq_len'])})")
    layers = sorted(cfg["xsa_layers"])
    if layers:
        where = ",".join(map(str, layers))
        if cfg["xsa_learnable"]:
            nonzero = [layer for layer in layers
                       if tensors[f"transformer.h.{layer}.attn.xsa_logit"][2].any()]
            if nonzero:
                problems.append(f"learnable XSA with nonzero alpha on layers {','.join(map(str, nonzero))} (nanochat's "
                                "attention has no XSA: the converted model would compute something else; only alpha 0 converts)")
            else:
                notes.append(f"learnable XSA on layers {where} with every alpha 0 (tanh(0)): standard attention, dropped")
        elif cfg["xsa_alpha"] != 0:
            problems.append(f"XSA with alpha {cfg['xsa_alpha']:g} on layers {where} (nanochat's attention has no XSA: the "
                            "converted model would compute something else; only alpha 0 or no XSA converts)")
        else:
            notes.append(f"XSA on layers {where} with alpha 0: standard attention, converted exactly")
    if problems:
        raise ConvertError(f"'{path}' cannot become a nanochat model: {'; '.join(problems)}")
    return notes


def write_tokenizer_out(args, meta, vocab_size, model_path):
    """nanochat's BASE/tokenizer: tokenizer.pkl (the tiktoken Encoding, pickled as nanochat pickles it) and
    token_bytes.pt (int32 byte length per token, 0 for special ones, as scripts/tok_train.py writes it)."""
    np = _numpy()
    path = args.tokenizer or meta.get("tokenizer")
    if not path:
        raise ConvertError(f"--tokenizer-dir: '{model_path}' does not name its tokenizer; pass --tokenizer FILE")
    if not os.path.exists(path):
        raise ConvertError(f"--tokenizer-dir: the tokenizer '{path}' is not readable from here; pass --tokenizer FILE")
    tok, fingerprint = tokenizer_file(path, vocab_size)
    if meta.get("tokenizer_fingerprint") and meta["tokenizer_fingerprint"] != fingerprint:
        raise ConvertError(f"the tokenizer '{path}' is not the one '{model_path}' was trained with (its tokens differ)")
    import climbmix
    try:
        enc, _ = climbmix.read_tokenizer(path)
    except ModuleNotFoundError as e:
        raise ConvertError(f"--tokenizer-dir needs the Python package '{e.name}', which {sys.executable} cannot import: "
                           f"{sys.executable} -m pip install -r dev/requirements.txt")
    except climbmix.PrepError as e:
        raise ConvertError(f"{e} (nanochat's tokenizer needs its 9 special tokens after the mergeable ones)")
    os.makedirs(args.tokenizer_dir, exist_ok=True)
    pkl, tb = os.path.join(args.tokenizer_dir, "tokenizer.pkl"), os.path.join(args.tokenizer_dir, "token_bytes.pt")
    for p in (pkl, tb):
        if os.path.exists(p) and not args.overwrite:
            raise ConvertError(f"'{p}' exists; pass --overwrite 1 to replace it")
    climbmix.write_atomic(pkl, pickle.dumps(enc))
    lengths = np.array([0 if i in tok.special_ids else len(p) for i, p in enumerate(tok.pieces)], dtype="<i4")
    write_torch_file(tb, [("", "int32", lengths)], single=True)
    return f"tokenizer: {path} -> {pkl}, {tb}"


def command_out(args):
    np = _numpy()
    if args.tokenizer and not args.tokenizer_dir:
        raise ConvertError("--tokenizer FILE names the tokenizer --tokenizer-dir DIR converts; pass --tokenizer-dir too")
    meta, tensors = read_safetensors(args.model)
    cfg = config_from_metadata(meta, args.model)
    table = dict(param_table(cfg))
    skipped = []
    for name, (dtype, shape, _) in tensors.items():
        if name not in table:
            if CHECKPOINT_EXTRAS.match(name):
                skipped.append(name)
                continue
            raise ConvertError(f"'{args.model}' holds the tensor '{name}', which the model of its metadata does not have")
        if shape != table[name]:
            raise ConvertError(f"'{args.model}': tensor '{name}' has shape {list(shape)}, the model of its metadata "
                               f"{list(table[name])}")
        if dtype != "F32":
            raise ConvertError(f"'{args.model}': tensor '{name}' has dtype {dtype}; train_gpt's weights are F32")
    for name in table:
        if name not in tensors:
            raise ConvertError(f"'{args.model}' has no tensor '{name}' (needed by the model of its metadata)")
    notes = nanochat_refusals(cfg, tensors, args.model)

    # the step, the dtypes, the meta: the nanochat file's own where this file came from one (convert_nanochat.py in)
    try:
        recorded_dtypes = json.loads(meta.get("nanochat.dtypes", "{}"))
        original_meta = json.loads(meta["nanochat.meta"]) if "nanochat.meta" in meta else None
    except ValueError:
        raise ConvertError(f"'{args.model}': metadata nanochat.dtypes or nanochat.meta is not valid JSON")
    step = args.step
    for key in ("nanochat.step", "step"):
        if step is None and re.fullmatch(r"\d+", meta.get(key, "")):
            step = int(meta[key])
    step = 0 if step is None else step
    embeddings = args.embeddings_dtype
    if embeddings == "auto" and "nanochat.dtypes" not in meta:
        embeddings = "bf16"

    def dtype_of(name):
        if embeddings == "auto":
            return recorded_dtypes.get(name, "float32")
        if name == "transformer.wte.weight" or name.startswith("value_embeds."):
            return "bfloat16" if embeddings == "bf16" else "float32"
        return "float32"

    names = [n for n in nanochat_order(cfg) if not n.endswith(".xsa_logit")]
    try:  # the order of the nanochat file this came from (the same as nanochat's own, unless an older nanochat wrote it)
        recorded_order = json.loads(meta.get("nanochat.order", "[]"))
    except ValueError:
        recorded_order = []
    if sorted(recorded_order) == sorted(names):
        names = recorded_order
    out_tensors, rounded = [], []
    for name in names:
        dtype = dtype_of(name)
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ConvertError(f"'{args.model}': metadata nanochat.dtypes gives {name} the dtype {dtype}")
        values = np.ascontiguousarray(tensors[name][2], dtype="<f4")
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ConvertError(f"'{args.model}': tensor '{name}' holds a non-finite value ({values.reshape(-1)[bad[0]]} at "
                               f"index {bad[0]})")
        raw, changed = to_dtype(values, dtype)
        if changed:
            rounded.append(f"{name}: {changed:,} of {values.size:,} values rounded to {dtype}")
        out_tensors.append((name, dtype, raw))

    model_config = {"sequence_len": cfg["seq_len"], "vocab_size": cfg["vocab_size"], "n_layer": cfg["n_layer"],
                    "n_head": cfg["n_head"], "n_kv_head": cfg["n_kv_head"], "n_embd": cfg["n_embd"],
                    "window_pattern": cfg["window_pattern"]}
    if original_meta is not None and isinstance(original_meta, dict):
        nano_meta = dict(original_meta)
        recorded_config = original_meta.get("model_config")
        nano_meta["model_config"] = {**(recorded_config if isinstance(recorded_config, dict) else {}), **model_config}
        nano_meta["step"] = step
    else:
        nano_meta = {"step": step, "val_bpb": None, "model_config": model_config, "max_seq_len": cfg["seq_len"],
                     "converted_from": os.path.basename(args.model)}

    os.makedirs(args.output, exist_ok=True)
    model_path = os.path.join(args.output, f"model_{step:06d}.pt")
    meta_path = os.path.join(args.output, f"meta_{step:06d}.json")
    for p in (model_path, meta_path):
        if os.path.exists(p) and not args.overwrite:
            raise ConvertError(f"'{p}' exists; pass --overwrite 1 to replace it")
    tok_line = None
    if args.tokenizer_dir:
        tok_line = write_tokenizer_out(args, meta, cfg["vocab_size"], args.model)
    try:
        write_torch_file(model_path, out_tensors)
        tmp = meta_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(nano_meta, f, indent=2)  # as nanochat's save_checkpoint writes it
        os.replace(tmp, meta_path)
    except OSError as e:
        raise ConvertError(f"cannot write into '{args.output}': {e.strerror}")

    kinds = collections.Counter(d for _, d, _ in out_tensors)
    print(f"read {args.model}: {cfg['n_layer']} layers, n_embd {cfg['n_embd']}, {cfg['n_head']} heads ({cfg['n_kv_head']} kv), "
          f"vocab {cfg['vocab_size']}, sequence_len {cfg['seq_len']}, windows {cfg['window_pattern']}")
    for note in notes + rounded:
        print(f"note: {note}")
    if skipped:
        print(f"note: left out {', '.join(skipped)} (a checkpoint's optimizer and loader state: nanochat keeps its own)")
    print(f"wrote {model_path} ({len(out_tensors)} tensors: "
          + ", ".join(f"{n} {d}" for d, n in sorted(kinds.items())) + f") and {meta_path} (step {step})")
    if tok_line:
        print(tok_line)
    else:
        print("tokenizer: not written; nanochat reads BASE/tokenizer/tokenizer.pkl and token_bytes.pt: --tokenizer-dir "
              "BASE/tokenizer writes them from the model's tokenizer file")


# ----------------------------------------------------------------------------------------------------
# Command line

def nonnegative(text):
    if not re.fullmatch(r"\d+", text):
        raise argparse.ArgumentTypeError(f"'{text}' is not a step number (an integer >= 0)")
    return int(text)


def flag01(text):
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"'{text}' is not 0 or 1")
    return text == "1"


def parse_args(argv):
    p = xsa_cli.ArgumentParser(prog="convert_nanochat.py", description="Convert nanochat checkpoints to xsa-train weights (in) "
                               "and back (out), without PyTorch. Formats and what is checked: the docstring of this file and dev/docs/data.md.")
    sub = p.add_subparsers(dest="command", metavar="in|out", parser_class=xsa_cli.ArgumentParser)
    sub.required = True
    pin = sub.add_parser("in", help="nanochat checkpoint directory -> safetensors weights of xsa-train",
                         description="Convert nanochat's model_NNNNNN.pt + meta_NNNNNN.json into a safetensors weights "
                                     "file for train_gpt --init-from, eval_core, sample, chat_sft.")
    pin.add_argument("checkpoint", metavar="NANOCHAT_DIR", help="nanochat's checkpoint directory, e.g. "
                     "~/.cache/nanochat/base_checkpoints/d12 (or one of its model_NNNNNN.pt)")
    pin.add_argument("--step", type=nonnegative, metavar="N", help="which model_NNNNNN.pt (needed when the directory holds several)")
    pin.add_argument("-o", "--output", required=True, metavar="MODEL.safetensors", help="the weights file to write")
    pin.add_argument("--tokenizer", default="auto", metavar="auto|none|PATH",
                     help="auto (default): nanochat's tokenizer of the base directory above NANOCHAT_DIR "
                          "(BASE/tokenizer/tokenizer.pkl) when it exists, converted to an xsa-train tokenizer file; "
                          "PATH: that tokenizer.pkl or its directory (converted), or an xsa-train tokenizer file "
                          "(recorded as is); none: record no tokenizer. Converting needs tiktoken")
    pin.add_argument("--tokenizer-out", metavar="FILE", help="where the converted tokenizer goes (default tokenizer.bin "
                     "beside the output)")
    pin.add_argument("--overwrite", type=flag01, default=False, metavar="0|1", help="replace existing output files (0)")
    pout = sub.add_parser("out", help="safetensors weights of xsa-train -> nanochat checkpoint directory",
                          description="Write model_NNNNNN.pt + meta_NNNNNN.json that nanochat's checkpoint_manager loads, "
                                      "from a weights file (train_gpt --export-safetensors, convert_nanochat.py in) or "
                                      "a checkpoint ckpt_*.safetensors.")
    pout.add_argument("model", metavar="MODEL.safetensors")
    pout.add_argument("-o", "--output", required=True, metavar="NANOCHAT_DIR",
                      help="the checkpoint directory to write into, e.g. BASE/base_checkpoints/d12 (made if missing)")
    pout.add_argument("--step", type=nonnegative, metavar="N", help="the step in the file names and the meta (default: the step the "
                      "file records: nanochat's from `in`, a checkpoint's own, else 0)")
    pout.add_argument("--embeddings-dtype", choices=["auto", "bf16", "fp32"], default="auto",
                      help="dtype of wte and value_embeds: auto (default) = what the nanochat file had when the model came "
                           "from `in`, else bf16 (nanochat's on GPUs; rounded to nearest even); fp32 keeps them exact")
    pout.add_argument("--tokenizer-dir", metavar="DIR", help="also write nanochat's tokenizer.pkl and token_bytes.pt into "
                      "DIR (nanochat's BASE/tokenizer), from the model's tokenizer file (needs tiktoken)")
    pout.add_argument("--tokenizer", metavar="FILE", help="with --tokenizer-dir: the model's xsa-train tokenizer file, if not "
                      "where its metadata says")
    pout.add_argument("--overwrite", type=flag01, default=False, metavar="0|1", help="replace existing output files (0)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        (command_in if args.command == "in" else command_out)(args)
    except ConvertError as e:
        print(f"convert_nanochat.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("convert_nanochat.py: error: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
