// ggml's RPC backend, both ends.
//
// The client end: a model whose layers do not all fit this box takes some of
// them to `lmsp rpc-server` processes on other boxes. llama.cpp sees each
// server's devices as GPUs: the first layers stay on this box's CPU, the
// rest go to the servers (n_gpu_layers, and the servers' shares as
// tensor_split). The KV cells of a layer live where the layer does, and so
// does its attention. The output matrix stays here (a tensor override to the
// CPU's buffer type): what crosses the last connection each step is a row of
// n_embd floats a token, not n_vocab logits (576 against 49,152 for SmolLM2).
//
// ggml's client aborts the process when a server does not answer, when the
// HELLO shows another protocol version, and when a connection breaks
// mid-command (RPC_STATUS_ASSERT in ggml-rpc.cpp). So every server is greeted
// here first, on a socket of our own with a timeout, and refused with an
// error naming it; and ggml's client talks to each server through a relay of
// this process (rpc_relay.cpp), which answers for a server lost mid-command,
// so that the engine raises BackendLost instead of the process aborting.
//
// The server end computes what this box's engine would: the tiled products
// are installed in its CPU backend as in the engine's, and each graph runs on
// ggml's reference kernels unless it is one of the engine's tiled steps.
// The protocol cannot say which kernels the client's engine chose for a step,
// so the server reads it from the graph: an engine split over servers feeds
// a sequence at most kMinTiledRows - 1 rows in a one-row step
// (BatchPlan::one_row_cap), and every tiled chunk is at least kMinTiledRows
// rows (batch_plan.cpp), so a step is tiled exactly where its flash attention
// takes kMinTiledRows query rows or more of one sequence. Where the engine
// keeps one kind of step (no tiles), the reference kernels change no bits of
// what it computes. So a split model's logits equal the local engine's bit
// for bit.
#include "rpc.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "batch_plan.h"
#include "errors.h"
#include "ggml-cpu.h"
#include "llama.h"
#include "rpc_relay.h"
#include "tile_matmul.h"

#if defined(LMSP_RPC)
#include "ggml-backend-impl.h"  // ggml/src of the pinned source: a device's and a backend's interface
#include "ggml-rpc.h"
#endif

namespace lmsp {

#if defined(LMSP_RPC)

bool rpc_built() { return true; }

std::string rpc_protocol() {
    return std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION) + "." +
           std::to_string(RPC_PROTO_PATCH_VERSION);
}

namespace {

// ggml-rpc.cpp's HELLO: command 14, its request (the transport's 24 bytes of
// capabilities, zero for plain TCP) and its answer (version, then 24 bytes).
constexpr uint8_t kHelloCommand = 14;
constexpr size_t kCapsBytes = 24;
constexpr double kMaxTimeoutS = 86400;  // a day: the relay counts milliseconds in an int

// The relay of each server some live model's buffers are on (while it
// answers): ggml's client keeps one connection per endpoint, and a server
// serves one client at a time, so every engine on a server shares it.
std::mutex g_relays_mu;
std::map<std::string, std::weak_ptr<RpcRelay>> g_relays;

}  // namespace

struct RpcLease {
    std::vector<std::shared_ptr<RpcRelay>> relays;  // one per server, in the split's order
};

std::string rpc_lost(const RpcLease & lease) {
    for (const auto & relay : lease.relays) {
        if (relay->lost()) return relay->lost_reason();
    }
    return "";
}

std::string rpc_hello(const std::string & endpoint, int timeout_ms) {
    net::Fd s;
    net::connect_to(s, endpoint, timeout_ms);
    uint8_t request[1 + 8 + kCapsBytes] = {kHelloCommand};
    const uint64_t size = kCapsBytes;
    std::memcpy(request + 1, &size, sizeof(size));
    uint8_t answer[8 + 4 + kCapsBytes];
    if (!net::send_all(s.fd, request, sizeof(request), timeout_ms) ||
        !net::recv_all(s.fd, answer, sizeof(answer), timeout_ms)) {
        throw RpcUnreachable("RPC server " + endpoint + " took the connection but did not answer its greeting within " +
                             std::to_string(timeout_ms) +
                             " ms (not an RPC server, or one serving another client: each serves one at a time)");
    }
    uint64_t got = 0;
    std::memcpy(&got, answer, sizeof(got));
    const std::string version = std::to_string(answer[8]) + "." + std::to_string(answer[9]) + "." +
                                std::to_string(answer[10]);
    if (got != 4 + kCapsBytes || answer[8] != RPC_PROTO_MAJOR_VERSION || answer[9] > RPC_PROTO_MINOR_VERSION) {
        throw RpcUnreachable("RPC server " + endpoint + " speaks protocol " + (got == 4 + kCapsBytes ? version : "?") +
                             ", this build " + rpc_protocol() + ": run the same lmsp version on both boxes");
    }
    return version;
}

namespace {

// The relays of `servers`: the one a live lease holds where its server still
// answers; else the server is greeted first (on a socket of our own, with a
// timeout: ggml's client would abort on a silent server) and gets a new
// relay, on a new port (ggml keeps its dispatcher and devices by endpoint: a
// lost relay's stay with it until the engines using them are gone), whose
// answer timeout is `timeout_ms`.
std::shared_ptr<RpcLease> lease_servers(const std::vector<std::string> & servers, int timeout_ms) {
    auto lease = std::make_shared<RpcLease>();
    for (const std::string & s : servers) {
        std::shared_ptr<RpcRelay> relay;
        {
            std::lock_guard<std::mutex> lk(g_relays_mu);
            const auto it = g_relays.find(s);
            if (it != g_relays.end()) relay = it->second.lock();
        }
        if (relay == nullptr || relay->lost()) {
            rpc_hello(s, 5000);
            relay = std::make_shared<RpcRelay>(s, timeout_ms);
            std::lock_guard<std::mutex> lk(g_relays_mu);
            g_relays[s] = relay;
        }
        lease->relays.push_back(relay);
    }
    return lease;
}

}  // namespace

RpcSplit rpc_split(const std::vector<std::string> & servers, const std::vector<float> & shares, int32_t n_layer,
                   double timeout_s) {
    if (servers.size() > GGML_RPC_MAX_SERVERS) {
        throw InvalidArgument("at most " + std::to_string(GGML_RPC_MAX_SERVERS) + " RPC servers");
    }
    if (!shares.empty() && shares.size() != servers.size() + 1) {
        throw InvalidArgument("tensor_split takes one share for this box, then one for each RPC server");
    }
    for (const float f : shares) {
        if (!(f >= 0.0f) || !std::isfinite(f)) throw InvalidArgument("tensor_split shares must be >= 0");
    }
    if (!(timeout_s > 0 && timeout_s <= kMaxTimeoutS)) {
        throw InvalidArgument("rpc_timeout must be more than 0 and at most 86400 seconds");
    }
    RpcSplit out;
    out.lease = lease_servers(servers, std::max(1, int(std::lround(timeout_s * 1000))));  // greets new ones
    std::vector<double> weight;                                                           // this box, then each device
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), &free, &total);
    weight.push_back(shares.empty() ? double(free) : double(shares[0]));
    for (size_t i = 0; i < servers.size(); ++i) {
        const std::string & relay = out.lease->relays[i]->endpoint();
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(relay.c_str());
        const size_t n = reg == nullptr ? 0 : ggml_backend_reg_dev_count(reg);
        if (out.lease->relays[i]->lost()) throw RpcUnreachable(out.lease->relays[i]->lost_reason());
        if (n == 0) throw RpcUnreachable("RPC server " + servers[i] + " lends no device");
        for (size_t d = 0; d < n; ++d) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, d);
            ggml_backend_dev_memory(dev, &free, &total);
            if (out.lease->relays[i]->lost()) throw RpcUnreachable(out.lease->relays[i]->lost_reason());
            out.devices.push_back(dev);
            weight.push_back(shares.empty() ? double(free) : double(shares[i + 1]) / double(n));
        }
    }
    out.devices.push_back(nullptr);
    out.overrides = {{"^(output|token_embd)\\.weight$", ggml_backend_cpu_buffer_type()}, {nullptr, nullptr}};
    double sum = 0;
    for (const double w : weight) sum += w;
    if (!(sum > 0)) throw InvalidArgument("tensor_split gives every share 0");
    // the repeating layers and the output layer, shared out; this box keeps the first ones
    const int32_t all = n_layer + 1;
    const auto local = int32_t(std::lround(double(all) * weight[0] / sum));
    out.n_gpu_layers = all - std::min(local, n_layer);
    for (size_t i = 1; i < weight.size(); ++i) out.server_split.push_back(float(weight[i]));
    out.server_split.resize(std::max(out.server_split.size(), llama_max_devices()), 0.0f);
    if (std::all_of(out.server_split.begin(), out.server_split.end(), [](float f) { return f == 0; })) {
        out.n_gpu_layers = 0;  // every share here
    }
    return out;
}

namespace {

// The server's device: this box's CPU device, reporting `g_mem` bytes when
// asked, whose backends run the engine's kernels (the note at the top).
ggml_backend_dev_t g_cpu = nullptr;
ggml_backend_device g_served_dev;
size_t g_mem = 0;
ggml_threadpool_t g_threadpool = nullptr;
ggml_status (*g_cpu_compute)(ggml_backend_t, ggml_cgraph *) = nullptr;

bool tiled_step(ggml_cgraph * graph) {
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const ggml_tensor * t = ggml_graph_node(graph, i);
        if (t->op != GGML_OP_FLASH_ATTN_EXT) continue;
        if (size_t(t->src[0]->ne[1]) >= kMinTiledRows) return true;  // the query's rows of one sequence
    }
    return false;
}

ggml_status served_compute(ggml_backend_t backend, ggml_cgraph * graph) {
    ggml_backend_cpu_set_use_ref(backend, !tiled_step(graph));
    return g_cpu_compute(backend, graph);
}

void served_memory(ggml_backend_dev_t, size_t * free, size_t * total) {
    g_cpu->iface.get_memory(g_cpu, free, total);
    if (g_mem > 0) *free = *total = g_mem;
}

void served_props(ggml_backend_dev_t dev, ggml_backend_dev_props * props) {
    g_cpu->iface.get_props(g_cpu, props);
    served_memory(dev, &props->memory_free, &props->memory_total);
}

ggml_backend_t served_backend(ggml_backend_dev_t, const char * params) {
    ggml_backend_t backend = g_cpu->iface.init_backend(g_cpu, params);
    if (backend == nullptr) return nullptr;
    g_cpu_compute = backend->iface.graph_compute;
    backend->iface.graph_compute = served_compute;
    backend->device = &g_served_dev;
    if (g_threadpool != nullptr) ggml_backend_cpu_set_threadpool(backend, g_threadpool);
    return backend;
}

}  // namespace

void rpc_serve(const std::string & endpoint, const std::string & cache_dir, int32_t n_threads, size_t mem_bytes) {
    std::string host, port;
    net::split_endpoint(endpoint, host, port);
    if (n_threads < 1 || n_threads > GGML_MAX_N_THREADS) {
        throw InvalidArgument("threads must be between 1 and " + std::to_string(GGML_MAX_N_THREADS));
    }
    llama_backend_init();
    install_tile_matmul();  // before the backend computes anything, as in the engine
    g_cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (g_cpu == nullptr) throw NativeFailure("no CPU device");
    g_mem = mem_bytes;
    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    tpp.poll = 0;  // between the client's graphs its threads sleep: the other places compute meanwhile
    g_threadpool = ggml_threadpool_new(&tpp);
    if (g_threadpool == nullptr) throw NativeFailure("cannot start " + std::to_string(n_threads) + " CPU threads");
    g_served_dev = *g_cpu;
    g_served_dev.iface.get_memory = served_memory;
    g_served_dev.iface.get_props = served_props;
    g_served_dev.iface.init_backend = served_backend;
    ggml_backend_dev_t devices[] = {&g_served_dev};
    // returns only when it cannot listen or accept (having said why on stderr)
    ggml_backend_rpc_start_server(endpoint.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(), size_t(n_threads),
                                  1, devices);
    throw NativeFailure("the RPC server cannot listen on " + endpoint + " (in use, or not an address of this box)");
}

#else  // built without LMSP_RPC

bool rpc_built() { return false; }
std::string rpc_protocol() { return ""; }

namespace {
[[noreturn]] void not_built() { throw InvalidArgument("this build has no RPC backend (CMake option LMSP_RPC)"); }
}  // namespace

struct RpcLease {};
std::string rpc_lost(const RpcLease &) { return ""; }
std::string rpc_hello(const std::string &, int) { not_built(); }
RpcSplit rpc_split(const std::vector<std::string> &, const std::vector<float> &, int32_t, double) { not_built(); }
void rpc_serve(const std::string &, const std::string &, int32_t, size_t) { not_built(); }

#endif

}  // namespace lmsp
