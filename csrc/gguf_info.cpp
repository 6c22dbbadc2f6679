#include "gguf_info.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <new>

#include "errors.h"
#include "ggml.h"
#include "gguf.h"
#include "text.h"

namespace lmsp {
namespace {

struct GgufDeleter {
    void operator()(gguf_context * ctx) const { gguf_free(ctx); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;

struct FileCloser {
    void operator()(FILE * f) const { std::fclose(f); }
};

// Integer metadata of any integer width; nullopt when absent or not an integer.
std::optional<uint64_t> get_uint(const gguf_context * ctx, const std::string & key) {
    const int64_t id = gguf_find_key(ctx, key.c_str());
    if (id < 0) {
        return std::nullopt;
    }
    switch (gguf_get_kv_type(ctx, id)) {
        // clang-format off
        case GGUF_TYPE_UINT8:  return gguf_get_val_u8(ctx, id);
        case GGUF_TYPE_UINT16: return gguf_get_val_u16(ctx, id);
        case GGUF_TYPE_UINT32: return gguf_get_val_u32(ctx, id);
        case GGUF_TYPE_UINT64: return gguf_get_val_u64(ctx, id);
        case GGUF_TYPE_INT8:   { auto v = gguf_get_val_i8(ctx, id);  if (v >= 0) return uint64_t(v); break; }
        case GGUF_TYPE_INT16:  { auto v = gguf_get_val_i16(ctx, id); if (v >= 0) return uint64_t(v); break; }
        case GGUF_TYPE_INT32:  { auto v = gguf_get_val_i32(ctx, id); if (v >= 0) return uint64_t(v); break; }
        case GGUF_TYPE_INT64:  { auto v = gguf_get_val_i64(ctx, id); if (v >= 0) return uint64_t(v); break; }
        // clang-format on
        case GGUF_TYPE_ARRAY: {
            // some models store per-layer head counts; take the first entry
            const enum gguf_type at = gguf_get_arr_type(ctx, id);
            // (gguf_get_arr_data asserts on an array of strings: the type first)
            if (gguf_get_arr_n(ctx, id) == 0 || (at != GGUF_TYPE_UINT32 && at != GGUF_TYPE_INT32)) break;
            const void * data = gguf_get_arr_data(ctx, id);
            if (at == GGUF_TYPE_UINT32) return uint64_t(static_cast<const uint32_t *>(data)[0]);
            if (at == GGUF_TYPE_INT32) {
                const int32_t v = static_cast<const int32_t *>(data)[0];
                if (v >= 0) return uint64_t(v);
            }
            break;
        }
        default: break;
    }
    return std::nullopt;
}

// String metadata; text that is not UTF-8 makes the file corrupt.
std::optional<std::string> get_str(const gguf_context * ctx, const std::string & key, const std::string & path) {
    const int64_t id = gguf_find_key(ctx, key.c_str());
    if (id < 0 || gguf_get_kv_type(ctx, id) != GGUF_TYPE_STRING) {
        return std::nullopt;
    }
    const char * s = gguf_get_val_str(ctx, id);
    if (s == nullptr) {
        return std::nullopt;
    }
    std::string out(s);
    if (!utf8_valid(out)) {
        throw ModelFormatError("corrupt GGUF metadata in " + path + ": " + key + " is not valid UTF-8");
    }
    return out;
}

// Boolean metadata; ``fallback`` when absent or not a boolean.
bool get_bool(const gguf_context * ctx, const std::string & key, bool fallback) {
    const int64_t id = gguf_find_key(ctx, key.c_str());
    if (id < 0 || gguf_get_kv_type(ctx, id) != GGUF_TYPE_BOOL) return fallback;
    return gguf_get_val_bool(ctx, id);
}

// A hyperparameter: llama.cpp reads these as 32-bit values, so anything
// larger is corrupt (and would not fit a database integer either).
uint64_t get_dim(const gguf_context * ctx, const std::string & key, const std::string & path, uint64_t fallback) {
    const uint64_t v = get_uint(ctx, key).value_or(fallback);
    if (v > uint64_t(INT32_MAX)) {
        throw ModelFormatError("corrupt GGUF metadata in " + path + ": " + key + " = " + std::to_string(v) +
                               " is out of range");
    }
    return v;
}

// llama_ftype values (general.file_type) to the names people use for them.
const char * ftype_name(uint64_t ftype) {
    switch (ftype) {
        // clang-format off
        case 0: return "F32";       case 1: return "F16";       case 2: return "Q4_0";
        case 3: return "Q4_1";      case 7: return "Q8_0";      case 8: return "Q5_0";
        case 9: return "Q5_1";      case 10: return "Q2_K";     case 11: return "Q3_K_S";
        case 12: return "Q3_K_M";   case 13: return "Q3_K_L";   case 14: return "Q4_K_S";
        case 15: return "Q4_K_M";   case 16: return "Q5_K_S";   case 17: return "Q5_K_M";
        case 18: return "Q6_K";     case 19: return "IQ2_XXS";  case 20: return "IQ2_XS";
        case 21: return "Q2_K_S";   case 22: return "IQ3_XS";   case 23: return "IQ3_XXS";
        case 24: return "IQ1_S";    case 25: return "IQ4_NL";   case 26: return "IQ3_S";
        case 27: return "IQ3_M";    case 28: return "IQ2_S";    case 29: return "IQ2_M";
        case 30: return "IQ4_XS";   case 31: return "IQ1_M";    case 32: return "BF16";
        case 36: return "TQ1_0";    case 37: return "TQ2_0";    case 38: return "MXFP4_MOE";
        case 39: return "NVFP4";    case 40: return "Q1_0";     case 41: return "Q2_0";
        // clang-format on
        default: return nullptr;
    }
}

std::string upper(std::string s) {
    for (char & c : s) {
        if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
    }
    return s;
}

}  // namespace

GgufInfo read_gguf_info(const std::string & path) {
    log::install();

    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            throw FileMissing("model file not found: " + path);
        }
        throw ModelFormatError("cannot open model file " + path + ": " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        throw ModelFormatError("not a regular file: " + path);
    }
    const uint64_t file_size = uint64_t(st.st_size);

    {
        std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
        if (!f) {
            throw ModelFormatError("cannot open model file " + path + ": " + std::strerror(errno));
        }
        char magic[4] = {0, 0, 0, 0};
        const size_t n = std::fread(magic, 1, 4, f.get());
        if (n < 4 || std::memcmp(magic, "GGUF", 4) != 0) {
            throw ModelFormatError("not a GGUF file (bad magic): " + path);
        }
    }

    GgufPtr ctx;
    log::begin_capture();
    try {
        gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
        ctx.reset(gguf_init_from_file(path.c_str(), params));
    } catch (const std::bad_alloc &) {
        log::end_capture();
        throw ModelFormatError("corrupt GGUF header (absurd sizes): " + path);
    }
    const std::string why = log::end_capture();
    if (!ctx) {
        throw ModelFormatError("corrupt or truncated GGUF header in " + path + (why.empty() ? "" : " (" + why + ")"));
    }

    GgufInfo info;
    info.size_bytes = file_size;

    const auto arch = get_str(ctx.get(), "general.architecture", path);
    if (!arch || arch->empty()) {
        throw ModelFormatError("GGUF file has no general.architecture: " + path);
    }
    info.architecture = *arch;
    info.name = get_str(ctx.get(), "general.name", path);
    info.chat_template = get_str(ctx.get(), "tokenizer.chat_template", path);
    if (get_str(ctx.get(), "tokenizer.ggml.model", path) == std::optional<std::string>("bert")) {
        // llama.cpp's defaults: lowercase, and strip accents as it lowercases
        const bool lowercase = get_bool(ctx.get(), "tokenizer.ggml.normalizer.lowercase", true);
        info.decomposes_text = get_bool(ctx.get(), "tokenizer.ggml.normalizer.strip_accents", lowercase);
    }

    const std::string a = info.architecture + ".";
    info.context_length = get_dim(ctx.get(), a + "context_length", path, 0);
    info.n_embd = get_dim(ctx.get(), a + "embedding_length", path, 0);
    info.n_layer = get_dim(ctx.get(), a + "block_count", path, 0);
    info.n_head = get_dim(ctx.get(), a + "attention.head_count", path, 0);
    info.n_head_kv = get_dim(ctx.get(), a + "attention.head_count_kv", path, info.n_head);

    // llama.cpp asserts (aborting the process) on these instead of failing
    // the load, so the engine refuses them first
    {
        const auto u = [&](const char * k) { return get_uint(ctx.get(), a + k).value_or(0); };
        const uint64_t n_expert = u("expert_count"), n_used = u("expert_used_count");
        const uint64_t n_groups = u("expert_group_count"), n_group_used = u("expert_group_used_count");
        info.n_expert = n_expert;
        std::string & why = info.unloadable;
        // (a missing block_count makes llama.cpp throw, which is fine)
        if (get_uint(ctx.get(), a + "block_count") && (info.n_layer < 1 || info.n_layer > 512)) {
            why = "block_count must be between 1 and 512";
        } else if (u("nextn_predict_layers") > info.n_layer) {
            why = "nextn_predict_layers exceeds block_count";
        } else if (n_expert > 1024 || n_used > n_expert) {
            why = "expert counts out of range";
        } else if (n_expert > 0 &&
                   (n_used == 0 || n_groups >= n_expert ||
                    (n_groups > 0 && (n_expert % n_groups != 0 || n_group_used == 0 || n_group_used >= n_groups)))) {
            why = "inconsistent expert counts";
        } else if (n_expert == 0 && n_groups != 0) {
            why = "expert groups without experts";
        }
    }

    const int64_t tok_id = gguf_find_key(ctx.get(), "tokenizer.ggml.tokens");
    if (tok_id >= 0 && gguf_get_kv_type(ctx.get(), tok_id) == GGUF_TYPE_ARRAY) {
        info.vocab_size = gguf_get_arr_n(ctx.get(), tok_id);
    } else {
        info.vocab_size = get_dim(ctx.get(), a + "vocab_size", path, 0);
    }

    // Sizes: every tensor's data must lie inside the file, and the counts must add up.
    const int64_t n_tensors = gguf_get_n_tensors(ctx.get());
    info.tensor_count = uint64_t(std::max<int64_t>(n_tensors, 0));
    const uint64_t data_offset = gguf_get_data_offset(ctx.get());
    uint64_t data_end = data_offset;
    std::map<int, uint64_t> elements_by_type;
    for (int64_t i = 0; i < n_tensors; ++i) {
        const uint64_t off = gguf_get_tensor_offset(ctx.get(), i);
        const uint64_t size = gguf_get_tensor_size(ctx.get(), i);
        if (off > UINT64_MAX - data_offset || size > UINT64_MAX - data_offset - off) {
            throw ModelFormatError("corrupt GGUF tensor table (offset overflow) in " + path);
        }
        data_end = std::max(data_end, data_offset + off + size);
        const int64_t * ne = gguf_get_tensor_ne(ctx.get(), i);
        uint64_t count = 1;
        int dims = 0;
        for (int d = 0; d < GGML_MAX_DIMS; ++d) {
            if (ne[d] < 0) {
                throw ModelFormatError("corrupt GGUF tensor shape in " + path);
            }
            if (ne[d] > 1) ++dims;
            if (ne[d] != 0 && count > UINT64_MAX / uint64_t(ne[d])) {
                throw ModelFormatError("corrupt GGUF tensor shape (overflow) in " + path);
            }
            count *= uint64_t(ne[d]);
        }
        info.parameters += count;
        if (dims >= 2) {
            elements_by_type[int(gguf_get_tensor_type(ctx.get(), i))] += count;
        }
    }
    if (data_end > file_size) {
        throw ModelFormatError("truncated GGUF file " + path + ": tensor data needs " + std::to_string(data_end) +
                               " bytes, the file has " + std::to_string(file_size));
    }

    for (const auto & entry : elements_by_type) info.matrix_types.push_back(entry.first);

    const auto ftype = get_uint(ctx.get(), "general.file_type");
    const char * fname = ftype ? ftype_name(*ftype) : nullptr;
    if (fname != nullptr) {
        info.quantization = fname;
    } else if (!elements_by_type.empty()) {
        auto best = std::max_element(elements_by_type.begin(), elements_by_type.end(),
                                     [](const auto & x, const auto & y) { return x.second < y.second; });
        info.quantization = upper(ggml_type_name(ggml_type(best->first)));
    } else {
        info.quantization = "unknown";
    }
    return info;
}

}  // namespace lmsp
