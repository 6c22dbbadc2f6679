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
// error naming it; the last case stays an abort (see docs/RPC.md).
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
#include "tile_matmul.h"

#if defined(LMSP_RPC)
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

void split_endpoint(const std::string & endpoint, std::string & host, std::string & port) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) {
        throw InvalidArgument("an RPC server is HOST:PORT, not '" + endpoint + "'");
    }
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
}

// Waits until `fd` is ready for `events`, at most until `deadline_ms` left.
bool wait_for(int fd, short events, int timeout_ms) {
    pollfd p{fd, events, 0};
    int rc;
    do {
        rc = ::poll(&p, 1, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    return rc > 0;
}

void connect_to(Fd & s, const std::string & endpoint, int timeout_ms) {
    std::string host, port;
    split_endpoint(endpoint, host, port);
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * found = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
        throw RpcUnreachable("RPC server " + endpoint + ": cannot resolve " + host);
    }
    std::string why = "no address";
    for (addrinfo * a = found; a != nullptr; a = a->ai_next) {
        s.fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (s.fd < 0) continue;
        int rc = ::connect(s.fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS && wait_for(s.fd, POLLOUT, timeout_ms)) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
        } else if (rc != 0 && errno == EINPROGRESS) {
            errno = ETIMEDOUT;
        }
        if (rc == 0) {
            ::freeaddrinfo(found);
            return;
        }
        why = std::strerror(errno);
        ::close(s.fd);
        s.fd = -1;
    }
    ::freeaddrinfo(found);
    throw RpcUnreachable("RPC server " + endpoint + " does not answer: " + why);
}

bool send_all(int fd, const uint8_t * p, size_t n, int timeout_ms) {
    while (n > 0) {
        if (!wait_for(fd, POLLOUT, timeout_ms)) return false;
        const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        p += k;
        n -= size_t(k);
    }
    return true;
}

bool recv_all(int fd, uint8_t * p, size_t n, int timeout_ms) {
    while (n > 0) {
        if (!wait_for(fd, POLLIN, timeout_ms)) return false;
        const ssize_t k = ::recv(fd, p, n, 0);
        if (k <= 0) return false;
        p += k;
        n -= size_t(k);
    }
    return true;
}

// The servers some live model's buffers are on, each with how many models:
// ggml's client keeps one connection per server while any of them lives.
std::mutex g_leases_mu;
std::map<std::string, int> g_leases;

struct Lease {
    std::vector<std::string> servers;
    ~Lease() {
        std::lock_guard<std::mutex> lk(g_leases_mu);
        for (const std::string & s : servers) {
            if (--g_leases[s] == 0) g_leases.erase(s);
        }
    }
};

std::shared_ptr<void> lease_servers(const std::vector<std::string> & servers);

}  // namespace

std::string rpc_hello(const std::string & endpoint, int timeout_ms) {
    Fd s;
    connect_to(s, endpoint, timeout_ms);
    uint8_t request[1 + 8 + kCapsBytes] = {kHelloCommand};
    const uint64_t size = kCapsBytes;
    std::memcpy(request + 1, &size, sizeof(size));
    uint8_t answer[8 + 4 + kCapsBytes];
    if (!send_all(s.fd, request, sizeof(request), timeout_ms) || !recv_all(s.fd, answer, sizeof(answer), timeout_ms)) {
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

std::shared_ptr<void> lease_servers(const std::vector<std::string> & servers) {
    for (const std::string & s : servers) {
        bool connected;
        {
            std::lock_guard<std::mutex> lk(g_leases_mu);
            connected = g_leases.count(s) > 0;
        }
        if (!connected) rpc_hello(s, 5000);
    }
    auto lease = std::make_shared<Lease>();
    std::lock_guard<std::mutex> lk(g_leases_mu);
    for (const std::string & s : servers) g_leases[s]++;
    lease->servers = servers;
    return lease;
}

}  // namespace

RpcSplit rpc_split(const std::vector<std::string> & servers, const std::vector<float> & shares, int32_t n_layer) {
    if (servers.size() > GGML_RPC_MAX_SERVERS) {
        throw InvalidArgument("at most " + std::to_string(GGML_RPC_MAX_SERVERS) + " RPC servers");
    }
    if (!shares.empty() && shares.size() != servers.size() + 1) {
        throw InvalidArgument("tensor_split takes one share for this box, then one for each RPC server");
    }
    for (const float f : shares) {
        if (!(f >= 0.0f) || !std::isfinite(f)) throw InvalidArgument("tensor_split shares must be >= 0");
    }
    RpcSplit out;
    out.lease = lease_servers(servers);  // greets those this process has no connection to
    std::vector<double> weight;          // this box, then each device
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), &free, &total);
    weight.push_back(shares.empty() ? double(free) : double(shares[0]));
    for (size_t i = 0; i < servers.size(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(servers[i].c_str());
        const size_t n = reg == nullptr ? 0 : ggml_backend_reg_dev_count(reg);
        if (n == 0) throw RpcUnreachable("RPC server " + servers[i] + " lends no device");
        for (size_t d = 0; d < n; ++d) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, d);
            ggml_backend_dev_memory(dev, &free, &total);
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
    split_endpoint(endpoint, host, port);
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

std::string rpc_hello(const std::string &, int) { not_built(); }
RpcSplit rpc_split(const std::vector<std::string> &, const std::vector<float> &, int32_t) { not_built(); }
void rpc_serve(const std::string &, const std::string &, int32_t, size_t) { not_built(); }

#endif

}  // namespace lmsp
