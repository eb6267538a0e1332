// fuzz_safetensors: a safetensors file (llmc/safetensors.h: safetensors_read: the u64 header length,
// the JSON header with its metadata, dtypes, shapes and data offsets). The input is the whole file. For an
// accepted file every tensor is fetched as the trainer fetches weights (get_f32 / get_i32 with its own
// element count) and every element read, so an offset or shape that points past the data is an ASan
// report; every metadata key is looked up.
#include "dev/fuzz/fuzz_util.h"
#include "llmc/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static FuzzFile file = fuzz_file("safetensors");
    const std::string& path = fuzz_write(file, data, size);
    SafetensorsFile st;
    if (!fuzz_parse(path, [&] { st = safetensors_read(path); })) return 0;
    uint32_t acc = 0;
    for (const SafeTensor& t : st.tensors) {
        const size_t n = t.numel();
        if (n * 4 != t.end - t.begin) abort();  // what get() relies on
        const uint32_t* p = t.dtype == "F32" ? (const uint32_t*)st.get_f32(t.name, n) : (const uint32_t*)st.get_i32(t.name, n);
        for (size_t i = 0; i < n; i++) acc += p[i];
    }
    for (const auto& kv : st.metadata) acc += (uint32_t)st.meta(kv.first).size();
    // a missing tensor or key is a rejection naming the file
    fuzz_parse(path, [&] { st.get_f32("no such tensor", 1); });
    fuzz_parse(path, [&] { st.meta("no such key"); });
    g_fuzz_sink = acc;
    return 0;
}

// A third of the mutations are structural (fuzz_mutate_json) on the JSON header, with the u64 header
// length in front kept equal to its size; the rest are libFuzzer's own.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
    uint64_t n = 0;
    if (seed % 3 == 0 && size >= 8 && (memcpy(&n, data, 8), n <= size - 8)) {
        std::string json((const char*)data + 8, n), rest((const char*)data + 8 + n, size - 8 - n);
        if (fuzz_mutate_json(&json, seed / 3) && 8 + json.size() + rest.size() <= max_size) {
            n = json.size();
            memcpy(data, &n, 8);
            memcpy(data + 8, json.data(), json.size());
            memcpy(data + 8 + json.size(), rest.data(), rest.size());
            return 8 + json.size() + rest.size();
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
