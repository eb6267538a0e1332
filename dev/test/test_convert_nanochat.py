#!/usr/bin/env python3
"""Tests of dev/convert_nanochat.py (nanochat checkpoints in and out), on the tiny nanochat checkpoint that PyTorch wrote
(dev/reference/data/nanochat_ckpt/, made by dev/reference/make_nanochat_ckpt.py, with its reference loss):

  * `in`, then train_gpt_cpu --init-from on the committed token row: its loss at step 0 equals PyTorch's float64
    loss of the nanochat model within 1e-6 (relative); it trains 2 steps; `in` wrote every tensor as the original's
    bytes (fp32 as they are, bf16 as the top halves of fp32 with zero low halves);
  * `out` of that: every tensor's storage bytes and storage type equal the original .pt's, in the same order, and the
    meta is the same; the pickle uses only opcodes and globals of torch.load(weights_only=True)'s allow list, the
    records are 64-byte aligned as torch aligns them; `out` of what train_gpt then exported works too;
  * the tokenizer: `in` converts nanochat's tokenizer.pkl (found in the base directory) into the embedded corpus's
    tokenizer, records it, and `sample` and `eval_core` take the weights with it; `out --tokenizer-dir` writes a
    tokenizer.pkl with the same tokens and a token_bytes.pt with the storage bytes of the one torch wrote;
  * torch.compile's "_orig_mod." prefix is stripped; PyTorch 2.x's further records are read past (a big-endian file is
    refused); XSA with a nonzero alpha is refused, alpha 0 converts;
  * bad inputs: one `error:` line, exit code 1.

The .pt files are read here by a few lines of pickle (their own), not by the converter's parser. No PyTorch needed.

    python3 dev/test/test_convert_nanochat.py        (or all suites: make test)

Needs numpy (and tiktoken for the tokenizer tests): without them the tests are skipped, except where the environment
variable CI is set (there they fail).
"""
import collections
import io
import json
import math
import os
import pickle
import pickletools
import shutil
import struct
import sys
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from xsatest import REPO, TempDirTest, binary, check_one_error, jsonl, needs_packages, run, token_pieces  # noqa: E402

CONVERTER = os.path.join(REPO, "dev", "convert_nanochat.py")
DATA = os.path.join(REPO, "dev", "reference", "data", "nanochat_ckpt")
CKPT = os.path.join(DATA, "base_checkpoints", "d3")
MODEL_PT = os.path.join(CKPT, "model_000500.pt")
META = os.path.join(CKPT, "meta_000500.json")
TOKENS = os.path.join(DATA, "tokens.bin")
DEVIL_TOKENIZER = "dev/data/devil/tokenizer.bin"
FLAGS = ["-d", "3", "--dim", "24", "--heads", "2", "--kv-heads", "1", "--head-dim", "12", "-t", "256"]

# torch.load(weights_only=True): the opcodes PyTorch 1.13's restricted unpickler accepts, and the globals a state dict needs
WEIGHTS_ONLY_OPCODES = {"APPEND", "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "BINPERSID", "BINPUT", "BINUNICODE",
                        "BUILD", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET", "EMPTY_TUPLE", "GLOBAL", "LONG1", "LONG_BINGET",
                        "LONG_BINPUT", "MARK", "NEWFALSE", "NEWOBJ", "NEWTRUE", "NONE", "PROTO", "REDUCE", "SETITEM",
                        "SETITEMS", "SHORT_BINSTRING", "STOP", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"}
ALLOWED_GLOBALS = {"collections OrderedDict", "torch._utils _rebuild_tensor_v2", "torch FloatStorage",
                   "torch BFloat16Storage", "torch HalfStorage", "torch IntStorage"}
ITEMSIZE = {"FloatStorage": 4, "BFloat16Storage": 2, "HalfStorage": 2, "IntStorage": 4}


def convert(*argv):
    return run([sys.executable, CONVERTER, *argv])


# ----------------------------------------------------------------------------------------------------
# .pt files, read here: a zip whose ARCHIVE/data.pkl names each tensor's storage ARCHIVE/data/KEY

class _Storage:
    def __init__(self, name):
        self.name = name


class _PtUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict  # (torch's state dicts carry a _metadata attribute)
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: (storage, offset, tuple(size), tuple(stride))
        if module == "torch" and name.endswith("Storage"):
            return _Storage(name)
        raise pickle.UnpicklingError("unexpected global %s.%s" % (module, name))

    def persistent_load(self, pid):
        return (pid[1].name, pid[2], pid[4])  # storage type, key, numel


def pt_records(path):
    """(archive prefix, {member: bytes}) of a torch.save zip."""
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    prefix = [n for n in members if n.endswith("/data.pkl")][0][:-len("data.pkl")]
    return prefix, members


def pt_tensors(path):
    """[(name, storage type, shape, the storage's raw bytes)] in the file's order (contiguous, offset 0 tensors)."""
    prefix, members = pt_records(path)
    obj = _PtUnpickler(io.BytesIO(members[prefix + "data.pkl"])).load()
    out = []
    for name, ((kind, key, numel), offset, size, stride) in (obj.items() if isinstance(obj, dict) else [("", obj)]):
        assert offset == 0 and numel == math.prod(size), name
        out.append((name, kind, size, members[prefix + "data/" + key]))
    return out


def rewrite_pt(src, dst, edit=lambda pkl: pkl, extra=None):
    """A copy of the .pt src with its data.pkl passed through edit(bytes) -> bytes, and the records {name: bytes} of
    extra added after data.pkl."""
    prefix, members = pt_records(src)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, edit(data) if name == prefix + "data.pkl" else data)
            if name == prefix + "data.pkl":
                for record, value in (extra or {}).items():
                    z.writestr(prefix + record, value)


def rename_strings(pkl, rename):
    """The pickle with each BINUNICODE string s replaced by rename(s) (memo indices, not offsets, tie a pickle together)."""
    out, last = bytearray(), 0
    for op, arg, pos in pickletools.genops(pkl):
        if op.name == "BINUNICODE" and rename(arg) != arg:
            new = rename(arg).encode()
            out += pkl[last:pos] + b"X" + struct.pack("<I", len(new)) + new
            last = pos + 5 + len(arg.encode())
    return bytes(out + pkl[last:])


def read_safetensors(path):
    """(metadata, {name: (dtype, shape, bytes)}) read here."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    return meta, {k: (v["dtype"], tuple(v["shape"]), raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
                  for k, v in header.items()}


def write_safetensors(path, meta, tensors):
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def reference():
    with open(os.path.join(DATA, "reference.json")) as f:
        return json.load(f)


@needs_packages("numpy")
class TestConvert(TempDirTest):
    def convert_in(self, *extra):
        out = self.path("model.safetensors")
        code, text = convert("in", CKPT, "-o", out, "--tokenizer", DEVIL_TOKENIZER, *extra)
        self.assertEqual(code, 0, text)
        return out

    def test_loss_matches_pytorch_and_trains(self):
        """train_gpt_cpu --init-from the converted weights: the loss of the nanochat model on the committed row equals
        PyTorch's float64 loss within 1e-6; two steps train; what it exports converts back out."""
        model = self.convert_in()
        export = self.path("final.safetensors")
        code, text = run([binary("train_gpt_cpu"), "--init-from", model, *FLAGS, "-b", "1", "-B", "256", "-n", "2",
                          "-i", TOKENS, "-j", TOKENS, "--tokenizer", DEVIL_TOKENIZER, "--eval-every", "1",
                          "--sample-every", "-1", "--core-every", "-1", "--threads", "1", "-o", self.path("run"),
                          "--export-safetensors", export])
        self.assertEqual(code, 0, text)
        self.assertIn("weights loaded from " + model, text)
        losses = [r["loss"] for r in jsonl(self.path("run", "metrics.jsonl")) if r["kind"] == "train"]
        want = reference()["loss_float64"]
        self.assertEqual(len(losses), 2)
        self.assertLess(abs(losses[0] - want) / want, 1e-6, "train_gpt_cpu %r, PyTorch float64 %r" % (losses[0], want))
        self.assertTrue(math.isfinite(losses[1]) and losses[1] != losses[0], losses)
        code, text = convert("out", export, "-o", self.path("back"))
        self.assertEqual(code, 0, text)
        self.assertIn("rounded to bfloat16", text)  # trained here in fp32: the tables become nanochat's bf16
        kinds = {name: kind for name, kind, _, _ in pt_tensors(self.path("back", "model_000000.pt"))}
        self.assertEqual(kinds["transformer.wte.weight"], "BFloat16Storage")
        self.assertEqual(kinds["lm_head.weight"], "FloatStorage")

    def test_in_writes_the_original_bytes(self):
        """Every tensor of `in`'s file: fp32 ones are the original bytes; bf16 ones are the high halves of the fp32
        values, whose low halves are zero. Names, shapes, config metadata as train_gpt writes them."""
        meta, tensors = read_safetensors(self.convert_in())
        original = pt_tensors(MODEL_PT)
        self.assertEqual(sorted(tensors), sorted(name for name, _, _, _ in original))
        for name, kind, shape, data in original:
            dtype, st_shape, st_data = tensors[name]
            self.assertEqual((dtype, st_shape), ("F32", shape), name)
            if kind == "FloatStorage":
                self.assertEqual(st_data, data, name)
            else:
                self.assertEqual(kind, "BFloat16Storage", name)
                words = struct.unpack("<%dH" % (len(st_data) // 2), st_data)
                self.assertEqual(words[0::2], (0,) * (len(words) // 2), name)
                self.assertEqual(struct.pack("<%dH" % (len(words) // 2), *words[1::2]), data, name)
        for key, value in {"vocab_size": "4096", "n_layer": "3", "n_head": "2", "n_kv_head": "1", "head_dim": "12",
                           "n_embd": "24", "seq_len": "256", "window_pattern": "SSSL", "short_window": "128",
                           "value_embeds": "1", "smear": "1", "xsa_alpha": "0", "xsa_layers": "",
                           "tokenizer": DEVIL_TOKENIZER}.items():
            self.assertEqual(meta.get(key), value, key)

    def test_round_trip_is_byte_identical(self):
        """in then out: the same tensors (storage types, shapes, raw bytes) in the same order, the same meta; a pickle
        torch.load(weights_only=True) accepts; records 64-byte aligned; `out` refuses to overwrite."""
        model = self.convert_in()
        code, text = convert("out", model, "-o", self.path("nano"))
        self.assertEqual(code, 0, text)
        path = self.path("nano", "model_000500.pt")
        self.assertEqual(pt_tensors(path), pt_tensors(MODEL_PT))
        with open(META) as a, open(self.path("nano", "meta_000500.json")) as b:
            self.assertEqual(json.load(b), json.load(a))
        prefix, members = pt_records(path)
        self.assertEqual(members[prefix + "version"], b"3\n")
        ops = list(pickletools.genops(members[prefix + "data.pkl"]))
        self.assertLessEqual({op.name for op, _, _ in ops}, WEIGHTS_ONLY_OPCODES)
        self.assertLessEqual({arg for op, arg, _ in ops if op.name == "GLOBAL"}, ALLOWED_GLOBALS)
        with open(path, "rb") as f, zipfile.ZipFile(path) as z:
            for info in z.infolist():
                f.seek(info.header_offset + 26)
                n, e = struct.unpack("<HH", f.read(4))
                self.assertEqual((info.header_offset + 30 + n + e) % 64, 0, info.filename)
        check_one_error(self, [sys.executable, CONVERTER, "out", model, "-o", self.path("nano")], "exists; pass --overwrite 1", anywhere=True)
        code, text = convert("out", model, "-o", self.path("nano"), "--overwrite", "1", "--step", "7")
        self.assertEqual(code, 0, text)
        self.assertEqual(pt_tensors(self.path("nano", "model_000007.pt")), pt_tensors(MODEL_PT))

    def test_orig_mod_prefix(self):
        """A state dict saved from a torch.compile'd model ("_orig_mod." before every name) converts to the same
        weights, as nanochat's build_model strips the prefix."""
        os.makedirs(self.path("ckpt"))
        rewrite_pt(MODEL_PT, self.path("ckpt", "model_000500.pt"),
                   lambda pkl: rename_strings(pkl, lambda s: "_orig_mod." + s if "." in s or s.endswith("lambdas") or
                                              s.endswith("_lambda") else s))
        shutil.copy(META, self.path("ckpt"))
        code, text = convert("in", self.path("ckpt"), "-o", self.path("compiled.safetensors"), "--tokenizer", "none")
        self.assertEqual(code, 0, text)
        self.assertIn("_orig_mod.", text)
        _, a = read_safetensors(self.path("compiled.safetensors"))
        _, b = read_safetensors(self.convert_in())
        self.assertEqual(a, b)

    def test_newer_torch_records(self):
        """PyTorch 2.x writes more records (.format_version, .storage_alignment, byteorder, .data/serialization_id):
        read past; a big-endian file is refused."""
        records = {".format_version": b"1", ".storage_alignment": b"64", ".data/serialization_id": b"1234567890"}
        for name, byteorder in (("little", b"little"), ("big", b"big")):
            os.makedirs(self.path(name))
            rewrite_pt(MODEL_PT, self.path(name, "model_000500.pt"), extra=dict(records, byteorder=byteorder))
            shutil.copy(META, self.path(name))
        code, text = convert("in", self.path("little"), "-o", self.path("little.safetensors"), "--tokenizer", "none")
        self.assertEqual(code, 0, text)
        self.assertEqual(read_safetensors(self.path("little.safetensors"))[1], read_safetensors(self.convert_in())[1])
        check_one_error(self, [sys.executable, CONVERTER, "in", self.path("big"), "-o", self.path("big.safetensors")],
                        "big-endian", anywhere=True)

    def test_xsa(self):
        """XSA with a nonzero alpha (fixed, or learnable) cannot become nanochat's attention: refused. Alpha 0 is standard
        attention and converts."""
        meta, tensors = read_safetensors(self.convert_in())
        meta = {k: v for k, v in meta.items() if not k.startswith("nanochat.")}

        def variant(name, alpha, layers, logits=None):
            m = dict(meta, xsa_alpha=alpha, xsa_layers=layers, xsa_learnable="1" if logits else "0")
            t = dict(tensors)
            for layer, values in (logits or {}).items():
                t["transformer.h.%d.attn.xsa_logit" % layer] = ("F32", (2,), struct.pack("<2f", *values))
            write_safetensors(self.path(name), m, t)
            return [sys.executable, CONVERTER, "out", self.path(name), "-o", self.path(name + ".out")]
        check_one_error(self, variant("fixed.safetensors", "0.5", "0,2"), "XSA with alpha 0.5 on layers 0,2", anywhere=True)
        check_one_error(self, variant("learn.safetensors", "0", "1", {1: (0.0, 0.25)}), "learnable XSA with nonzero alpha on layers 1", anywhere=True)
        for argv in (variant("zero.safetensors", "0", "0,1,2"), variant("learn0.safetensors", "0", "1", {1: (0.0, 0.0)})):
            code, text = run(argv)
            self.assertEqual(code, 0, text)
            self.assertIn("standard attention", text)
            names = [name for name, _, _, _ in pt_tensors(os.path.join(argv[-1], "model_000000.pt"))]
            self.assertEqual(sorted(names), sorted(tensors))  # nanochat's names, no xsa_logit

    def test_help(self):
        code, text = convert("--help")
        self.assertEqual(code, 0, text)
        self.assertIn("in|out", text)

    def test_bad_inputs(self):
        """One `error:` line and exit code 1 for every bad input."""
        conv = [sys.executable, CONVERTER]
        check_one_error(self, conv, "the following arguments are required", anywhere=True)
        check_one_error(self, conv + ["in", CKPT], "-o/--output", anywhere=True)
        check_one_error(self, conv + ["in", CKPT, "-o", self.path("m"), "--step", "-1"], "not a step number", anywhere=True)
        check_one_error(self, conv + ["in", self.path("nothing"), "-o", self.path("m")], "no such directory", anywhere=True)
        os.makedirs(self.path("empty", "base_checkpoints"))
        check_one_error(self, conv + ["in", self.path("empty"), "-o", self.path("m")], "has no model_NNNNNN.pt", anywhere=True)
        check_one_error(self, conv + ["in", CKPT, "--step", "7", "-o", self.path("m")], "has no model_000007.pt", anywhere=True)

        def ckpt(name, pkl_edit=None, meta_edit=None, model=None):
            d = self.path(name)
            os.makedirs(d)
            if model is not None:
                with open(os.path.join(d, "model_000500.pt"), "wb") as f:
                    f.write(model)
            elif pkl_edit:
                rewrite_pt(MODEL_PT, os.path.join(d, "model_000500.pt"), pkl_edit)
            else:
                shutil.copy(MODEL_PT, d)
            with open(META) as f:
                meta = json.load(f)
            if meta_edit:
                meta_edit(meta)
            with open(os.path.join(d, "meta_000500.json"), "w") as f:
                json.dump(meta, f)
            return conv + ["in", d, "-o", self.path(name + ".safetensors"), "--tokenizer", "none"]
        two = ckpt("two")
        shutil.copy(MODEL_PT, self.path("two", "model_000600.pt"))
        check_one_error(self, two, "holds the steps 500, 600: pick one with --step N", anywhere=True)
        os.remove(self.path("two", "meta_000500.json"))
        check_one_error(self, two + ["--step", "500"], "meta_000500.json' is missing", anywhere=True)
        check_one_error(self, ckpt("unknown", lambda p: rename_strings(p, lambda s: "foo.weight" if s == "smear_lambda" else s)),
                        "holds the tensor 'foo.weight'", anywhere=True)
        check_one_error(self, ckpt("shape", meta_edit=lambda m: m["model_config"].update(n_embd=32)),
                        "tensor 'transformer.wte.weight' has shape [4096, 24], the model_config", anywhere=True)
        check_one_error(self, ckpt("config", meta_edit=lambda m: m["model_config"].update(rope_base=10000)),
                        "model_config has rope_base", anywhere=True)
        check_one_error(self, ckpt("dtype", lambda p: p.replace(b"torch\nFloatStorage\n", b"torch\nIntStorage\n")),
                        "has dtype int32", anywhere=True)
        check_one_error(self, ckpt("global", lambda p: p.replace(b"collections\nOrderedDict\n", b"os\nsystem\n")),
                        "holds an object of type os.system", anywhere=True)
        with open(MODEL_PT, "rb") as f:
            data = f.read()
        check_one_error(self, ckpt("truncated", model=data[:len(data) // 2]), "not a torch.save file", anywhere=True)
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF  # inside wte's storage: a CRC mismatch
        check_one_error(self, ckpt("crc", model=bytes(flipped)), "the file is corrupt", anywhere=True)
        check_one_error(self, ckpt("legacy", model=pickle.dumps({"a": 1}, protocol=2)), "legacy format", anywhere=True)
        check_one_error(self, conv + ["out", self.path("none.safetensors"), "-o", self.path("o")], "cannot read", anywhere=True)
        with open(self.path("junk.safetensors"), "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
        check_one_error(self, conv + ["out", self.path("junk.safetensors"), "-o", self.path("o")], "not a safetensors file", anywhere=True)
        write_safetensors(self.path("bare.safetensors"), {}, {"x": ("F32", (1,), b"\0\0\0\0")})
        check_one_error(self, conv + ["out", self.path("bare.safetensors"), "-o", self.path("o")], "no model configuration", anywhere=True)
        model = self.convert_in()
        meta, tensors = read_safetensors(model)
        write_safetensors(self.path("extra.safetensors"), meta, dict(tensors, stray=("F32", (1,), b"\0\0\0\0")))
        check_one_error(self, conv + ["out", self.path("extra.safetensors"), "-o", self.path("o")], "holds the tensor 'stray'", anywhere=True)
        write_safetensors(self.path("novaluembeds.safetensors"), dict(meta, value_embeds="0"),
                          {k: v for k, v in tensors.items() if "value_embeds" not in k and "ve_gate" not in k})
        check_one_error(self, conv + ["out", self.path("novaluembeds.safetensors"), "-o", self.path("o")],
                        "value embeddings off", anywhere=True)


@needs_packages("numpy", "tiktoken")
class TestTokenizer(TempDirTest):
    def test_tokenizer_in_and_out(self):
        """`in` finds nanochat's tokenizer.pkl in the base directory and converts it: the embedded corpus's tokens,
        recorded in the weights, which sample and eval_core then take without --tokenizer. `out --tokenizer-dir` writes
        nanochat's tokenizer.pkl (same tokens) and token_bytes.pt (the storage bytes torch wrote)."""
        model = self.path("model.safetensors")
        code, text = convert("in", CKPT, "-o", model)
        self.assertEqual(code, 0, text)
        tok = self.path("tokenizer.bin")
        self.assertEqual(token_pieces(tok), token_pieces(os.path.join(REPO, DEVIL_TOKENIZER)))
        meta, _ = read_safetensors(model)
        self.assertEqual(meta["tokenizer"], tok)
        code, text = run([binary("sample"), "-e", model, "-p", "The devil is", "-n", "4", "-t", "0"])
        self.assertEqual(code, 0, text)
        self.assertIn("The devil is", text)
        code, text = run([binary("eval_core"), "-e", model, "-c", "dev/data/core_tasks", "-m", "1"])
        self.assertEqual(code, 0, text)
        self.assertIn("CORE", text)

        code, text = convert("out", model, "-o", self.path("base", "base_checkpoints", "d3"), "--tokenizer-dir",
                             self.path("base", "tokenizer"))
        self.assertEqual(code, 0, text)
        self.assertEqual(pt_tensors(self.path("base", "tokenizer", "token_bytes.pt")),
                         pt_tensors(os.path.join(DATA, "tokenizer", "token_bytes.pt")))
        with open(self.path("base", "tokenizer", "tokenizer.pkl"), "rb") as f:
            enc = pickle.load(f)  # tiktoken's own unpickling, as nanochat's RustBPETokenizer.from_directory
        pieces, bos = token_pieces(os.path.join(REPO, DEVIL_TOKENIZER))
        self.assertEqual(enc.n_vocab, len(pieces))
        self.assertEqual(enc.encode_single_token("<|bos|>"), bos)
        self.assertEqual([enc.decode_single_token_bytes(i) for i in range(bos)], pieces[:bos])
        # a base directory converted back in: the same weights, the tokenizer found there
        code, text = convert("in", self.path("base", "base_checkpoints", "d3"), "-o", self.path("again.safetensors"))
        self.assertEqual(code, 0, text)
        self.assertEqual(read_safetensors(self.path("again.safetensors"))[1], read_safetensors(model)[1])


if __name__ == "__main__":
    unittest.main()
