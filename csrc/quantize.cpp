#include "quantize.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "errors.h"
#include "gguf_info.h"
#include "llama.h"

namespace lmsp {

namespace {

// llama.cpp's file types for the names users know them by (llama-quantize's).
const std::pair<const char *, llama_ftype> kTypes[] = {
    {"f16", LLAMA_FTYPE_MOSTLY_F16},   {"bf16", LLAMA_FTYPE_MOSTLY_BF16},     {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
    {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K}, {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q5_k_s", LLAMA_FTYPE_MOSTLY_Q5_K_S},
    {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0}, {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S},
    {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0}, {"iq4_xs", LLAMA_FTYPE_MOSTLY_IQ4_XS}, {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M},
    {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},
};

bool same_file(const std::string & a, const std::string & b) {
    struct stat sa {};
    struct stat sb {};
    return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

std::vector<std::string> quantize_types() {
    std::vector<std::string> names;
    for (const auto & [name, ftype] : kTypes) names.emplace_back(name);
    return names;
}

void quantize(const std::string & src, const std::string & dst, const std::string & type, int n_threads) {
    const llama_ftype * ftype = nullptr;
    for (const auto & entry : kTypes) {
        if (type == entry.first) ftype = &entry.second;
    }
    if (ftype == nullptr) {
        std::string known;
        for (const auto & entry : kTypes) known += std::string(known.empty() ? "" : ", ") + entry.first;
        throw InvalidArgument("unknown quantization type '" + type + "' (known: " + known + ")");
    }
    if (n_threads < 0) throw InvalidArgument("n_threads must be >= 0");
    const GgufInfo info = read_gguf_info(src);  // a bad file is refused here, not aborted on
    if (!info.unloadable.empty()) throw ModelFormatError(info.unloadable);
    if (same_file(src, dst)) throw InvalidArgument("the output would overwrite the model itself");
    for (const int t : info.matrix_types) {
        const ggml_type kind = ggml_type(t);
        if (kind != GGML_TYPE_F32 && kind != GGML_TYPE_F16 && kind != GGML_TYPE_BF16) {
            // llama.cpp refuses this too (a second rounding loses more than the first)
            throw InvalidArgument(src + " is already quantized (" + info.quantization +
                                  "): quantize from its f32, f16 or bf16 file");
        }
    }
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.ftype = *ftype;
    params.nthread = n_threads;
    // written beside dst and renamed over it once complete: dst is never a partial file
    const std::string part = dst + ".part-" + std::to_string(getpid());
    if (llama_model_quantize(src.c_str(), part.c_str(), &params) != 0) {
        std::remove(part.c_str());
        throw NativeFailure("llama.cpp could not quantize " + src + " to " + type + " (LMSP_LLAMA_LOG=1 shows why)");
    }
    if (std::rename(part.c_str(), dst.c_str()) != 0) {
        const int err = errno;
        std::remove(part.c_str());
        throw NativeFailure("cannot write " + dst + ": " + std::strerror(err));
    }
}

}  // namespace lmsp
