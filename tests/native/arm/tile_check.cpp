// The ARM tiles against ggml's NEON vec_dot, bit for bit, run under qemu-user
// by tests/native/test_tile_matmul_arm.py (built by CMakeLists.txt here).
//
// 1. The tiles alone (csrc/tile_matmul_neon.cpp): every type, weight rows of
//    one to three tiles, every count of activation rows from 1 to 9 (each
//    tile shape and remainder) and past a chunk of 64, rows of 1 to 9 blocks
//    (odd and even: vec_dot's last odd block) and the catalog models' row
//    lengths (1 to 8 super-blocks for q4_K and q6_K); every element compared
//    with vec_dot of its one row and column.
// 2. The hook (csrc/tile_matmul.cpp) as the extension installs it: every type
//    passes its install check, and a mul_mat of several rows computed by
//    ggml's CPU backend on two threads takes the tiles and gives vec_dot's
//    bits.
// Prints each difference; exits 1 if there was any.

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "tile_matmul.h"
#include "tile_matmul_neon.h"

namespace {

constexpr int kBlock = 32;
// the types the hook of tile_matmul.cpp offers
const ggml_type kTypes[] = {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
const char * const kTypeNames[] = {"q4_1", "q5_0", "q8_0", "q4_K", "q6_K"};
int g_failures = 0;

// Values of a normal distribution, each row at a scale of its own (1e-3 to
// 1e3) so that the sums' exponents vary.
std::vector<float> random_rows(int rows, int k, std::mt19937 & rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
    std::vector<float> v(size_t(rows) * size_t(k));
    for (int r = 0; r < rows; ++r) {
        const float scale = std::pow(10.0f, exponent(rng));
        for (int i = 0; i < k; ++i) v[size_t(r) * size_t(k) + size_t(i)] = normal(rng) * scale;
    }
    return v;
}

struct Quantized {
    std::vector<uint8_t> weights, act;
    size_t w_row = 0, a_row = 0;
};

// `rows` weight rows of `type` and `n` activation rows quantized to its
// vec_dot_type, as ggml's mul_mat quantizes them
Quantized quantized(ggml_type type, int rows, int n, int k, uint32_t seed) {
    std::mt19937 rng(seed);
    const std::vector<float> wf = random_rows(rows, k, rng), af = random_rows(n, k, rng);
    const ggml_type q = ggml_get_type_traits_cpu(type)->vec_dot_type;
    Quantized d;
    d.w_row = ggml_row_size(type, k);
    d.a_row = ggml_row_size(q, k);
    d.weights.resize(d.w_row * size_t(rows));
    d.act.resize(d.a_row * size_t(n));
    ggml_quantize_chunk(type, wf.data(), d.weights.data(), 0, rows, k, nullptr);
    for (int i = 0; i < n; ++i) {
        ggml_get_type_traits_cpu(q)->from_float(af.data() + size_t(i) * size_t(k), d.act.data() + size_t(i) * d.a_row,
                                                k);
    }
    return d;
}

// ggml's vec_dot of weight row r and activation row a, one row (nrc = 1)
float one_row(ggml_type type, const Quantized & d, int k, int r, int a) {
    float s = 0.0f;
    ggml_get_type_traits_cpu(type)->vec_dot(k, &s, 0, d.weights.data() + size_t(r) * d.w_row, 0,
                                            d.act.data() + size_t(a) * d.a_row, 0, 1);
    return s;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// vec_dot of every weight row and activation row: want[a * rows + r]
std::vector<float> one_rows(ggml_type type, const Quantized & d, int rows, int n, int k) {
    std::vector<float> want(size_t(rows) * size_t(n));
    for (int a = 0; a < n; ++a) {
        for (int r = 0; r < rows; ++r) want[size_t(a) * size_t(rows) + size_t(r)] = one_row(type, d, k, r, a);
    }
    return want;
}

// Columns [r0, r1) of the first n rows of `got` against `want` (both `ld`
// floats a row), bit for bit; prints the first differences.
void compare(const char * what, ggml_type type, int r0, int r1, int n, int k, const std::vector<float> & got,
             const std::vector<float> & want, int ld) {
    int shown = 0;
    for (int a = 0; a < n; ++a) {
        for (int r = r0; r < r1; ++r) {
            const float w = want[size_t(a) * size_t(ld) + size_t(r)], h = got[size_t(a) * size_t(ld) + size_t(r)];
            if (bits(w) == bits(h)) continue;
            ++g_failures;
            if (shown++ < 4) {
                std::printf("DIFF %s %s weight rows %d-%d n=%d k=%d: [%d][%d] vec_dot %.9g (%08" PRIx32
                            ") tiles %.9g (%08" PRIx32 ")\n",
                            what, ggml_type_name(type), r0, r1, n, k, a, r, double(w), bits(w), double(h), bits(h));
            }
        }
    }
}

// For each type and row length, 12 weight rows by 66 activation rows, and
// the products of their parts: weight rows [r0, r1) by the first n rows.
int check_tiles() {
    constexpr int kRows = 12, kActs = 66;
    const int ranges[][2] = {{0, 4}, {0, 8}, {0, 12}, {4, 12}, {8, 12}};
    int shapes = 0;
    uint32_t seed = 1;
    for (const ggml_type type : {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) {
        for (const int blocks : {1, 2, 3, 4, 5, 6, 7, 8, 9, 18, 48}) {
            if (ggml_blck_size(type) == 256 && blocks > 8) continue;  // 2,048 values, Gemma 3's longest rows
            const int k = blocks * int(ggml_blck_size(type));
            const Quantized d = quantized(type, kRows, kActs, k, seed++);
            const std::vector<float> want = one_rows(type, d, kRows, kActs, k);
            for (const auto & range : ranges) {
                for (const int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, kActs}) {
                    std::vector<float> got(size_t(kRows) * size_t(n), std::nanf(""));
                    lmsp::neon::product(type, d.weights.data(), d.w_row, range[0], range[1], d.act.data(), d.a_row, n,
                                        blocks, got.data(), kRows);
                    compare("tiles", type, range[0], range[1], n, k, got, want, kRows);
                    ++shapes;
                }
            }
        }
    }
    return shapes;
}

// The install check of each type the hook offers, and its list of what runs.
void check_install() {
    lmsp::install_tile_matmul();
    const std::vector<std::string> taken = lmsp::tile_matmul_types();
    bool all = lmsp::tile_matmul_built();
    for (const char * type : kTypeNames) all = all && std::find(taken.begin(), taken.end(), type) != taken.end();
    if (!all) {
        std::printf("DIFF install: built %d, types taken:", int(lmsp::tile_matmul_built()));
        for (const std::string & t : lmsp::tile_matmul_types()) std::printf(" %s", t.c_str());
        std::printf(" (want q4_1 q5_0 q8_0 q4_K q6_K)\n");
        ++g_failures;
    }
}

// weights (rows x k of `type`) by n f32 rows through ggml's CPU backend
std::vector<float> backend_mul_mat(ggml_backend_t cpu, ggml_type type, const Quantized & d, const float * x, int rows,
                                   int n, int k) {
    ggml_init_params params = {4 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * w = ggml_new_tensor_2d(ctx, type, k, rows);
    ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    ggml_tensor * out = ggml_mul_mat(ctx, w, a);
    ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    ggml_backend_tensor_set(w, d.weights.data(), 0, d.weights.size());
    ggml_backend_tensor_set(a, x, 0, size_t(n) * size_t(k) * sizeof(float));
    ggml_backend_graph_compute(cpu, graph);
    std::vector<float> got(size_t(rows) * size_t(n));
    ggml_backend_tensor_get(out, got.data(), 0, got.size() * sizeof(float));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return got;
}

// mul_mat of 2 to 9 rows on two threads: the tiles take it, with vec_dot's bits
// (the K-quants' 8 and more rows too: ggml's own tiled K-quant matmul is x86's).
void check_backend() {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    uint32_t seed = 1000;
    for (const ggml_type type : kTypes) {
        for (const int n : {2, 5, 9}) {
            const int rows = 16, k = ggml_blck_size(type) == 256 ? 3 * 256 : 18 * kBlock;
            std::mt19937 rng(seed++);
            const std::vector<float> x = random_rows(n, k, rng);
            Quantized d = quantized(type, rows, 0, k, seed++);
            const ggml_type q = ggml_get_type_traits_cpu(type)->vec_dot_type;
            d.a_row = ggml_row_size(q, k);
            d.act.resize(d.a_row * size_t(n));
            for (int i = 0; i < n; ++i) {
                ggml_get_type_traits_cpu(q)->from_float(x.data() + size_t(i) * size_t(k),
                                                        d.act.data() + size_t(i) * d.a_row, k);
            }
            const int64_t before = lmsp::tile_matmul_products();
            const std::vector<float> got = backend_mul_mat(cpu, type, d, x.data(), rows, n, k);
            if (lmsp::tile_matmul_products() != before + 1) {
                std::printf("DIFF backend %s n=%d: the tiles did not take the product\n", ggml_type_name(type), n);
                ++g_failures;
            }
            compare("backend", type, 0, rows, n, k, got, one_rows(type, d, rows, n, k), rows);
        }
    }
    ggml_backend_free(cpu);
}

}  // namespace

int main() {
    ggml_cpu_init();
    const int shapes = check_tiles();
    check_install();
    check_backend();
    std::printf("%d tile shapes and the backend's products checked against vec_dot: %d differences\n", shapes,
                g_failures);
    return g_failures == 0 ? 0 : 1;
}
