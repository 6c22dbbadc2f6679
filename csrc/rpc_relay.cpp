// Why a relay: ggml's RPC client (ggml-rpc.cpp of the pinned source) sends
// every command from one dispatcher thread per server and aborts the process
// (RPC_STATUS_ASSERT -> GGML_ABORT) when a send or a receive fails. A server
// lost mid-generation would end the whole worker. So ggml's client is pointed
// at a relay this process runs instead: it forwards bytes both ways to the
// real server and reads the client's stream closely enough to know which
// answers are owed. Once the server is lost (a reset or closed connection,
// TCP keepalive or the user timeout giving up on a powered-off box, or no
// byte from or to a server the relay waits for within its answer timeout: a
// stopped or deadlocked process whose kernel still acknowledges) the relay
// completes what it was delivering with zeros and answers every pending and
// later command itself, with a well-formed answer of the size ggml expects.
// ggml's client never sees a failure; the engine, which checks its relays
// after each step, raises BackendLost for that step instead (rpc.cpp).
//
// The wire format (ggml-rpc.cpp): a request is | cmd (1 byte) | size
// (uint64) | size bytes |, an answer | size (uint64) | size bytes |. Which
// commands are answered, and with how many bytes, is the table below; the
// static_assert on the protocol version makes a llama.cpp update revisit it.
#include "rpc_relay.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "errors.h"
#include "notifier.h"
#include "rpc.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(LMSP_RPC)
#include "ggml-rpc.h"
#endif

namespace lmsp {

namespace net {

void Fd::reset(int f) {
    if (fd >= 0) ::close(fd);
    fd = f;
}

void split_endpoint(const std::string & endpoint, std::string & host, std::string & port) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) {
        throw InvalidArgument("an RPC server is HOST:PORT, not '" + endpoint + "'");
    }
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
}

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
        s.reset(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
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
        s.reset();
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

}  // namespace net

#if defined(LMSP_RPC)

namespace {

static_assert(RPC_PROTO_MAJOR_VERSION == 7 && RPC_PROTO_MINOR_VERSION == 0,
              "another RPC protocol: check the commands and answer sizes below against ggml-rpc.cpp");

// ggml-rpc.cpp's enum rpc_cmd, in its order (RPC_CMD_HELLO is 14 there).
enum Cmd : uint8_t {
    kAllocBuffer = 0,
    kGetAlignment,
    kGetMaxSize,
    kBufferGetBase,
    kFreeBuffer,
    kBufferClear,
    kSetTensor,
    kSetTensorHash,
    kGetTensor,
    kCopyTensor,
    kGraphCompute,
    kGetDeviceMemory,
    kInitTensor,
    kGetAllocSize,
    kHello,
    kDeviceCount,
    kGraphRecompute,
    kMemsetTensor,
    kCmdCount,
};

constexpr int64_t kNoAnswer = -1;
constexpr size_t kCapsBytes = 24;  // RPC_CONN_CAPS_SIZE (transport.h)
constexpr size_t kMaxBuffered = size_t(8) << 20;
constexpr int kConnectMs = 5000;

// The bytes of each command's answer, from the structs of ggml-rpc.cpp (the
// commands its client sends with an output pointer); kNoAnswer for the others.
// GET_TENSOR's answer is the size its request asks for (`tail`: the last 8
// bytes of rpc_msg_get_tensor_req, its `size`).
int64_t answer_bytes(uint8_t cmd, uint64_t tail) {
    switch (cmd) {
        case kHello: return 4 + kCapsBytes;     // rpc_msg_hello_rsp
        case kAllocBuffer: return 16;           // rpc_msg_alloc_buffer_rsp
        case kGetAlignment: return 8;           // rpc_msg_get_alignment_rsp
        case kGetMaxSize: return 8;             // rpc_msg_get_max_size_rsp
        case kBufferGetBase: return 8;          // rpc_msg_buffer_get_base_rsp
        case kSetTensorHash: return 1;          // rpc_msg_set_tensor_hash_rsp
        case kGetTensor: return int64_t(tail);  // the data asked for
        case kCopyTensor: return 1;             // rpc_msg_copy_tensor_rsp
        case kGetAllocSize: return 8;           // rpc_msg_get_alloc_size_rsp
        case kGetDeviceMemory: return 16;       // rpc_msg_get_device_memory_rsp
        case kDeviceCount: return 4;            // rpc_msg_device_count_rsp
        default:
            return kNoAnswer;  // FREE_BUFFER, INIT_TENSOR, MEMSET_TENSOR, SET_TENSOR,
                               // BUFFER_CLEAR, GRAPH_COMPUTE, GRAPH_RECOMPUTE
    }
}

void put_u64(std::vector<uint8_t> & out, uint64_t v) {
    uint8_t b[8];
    std::memcpy(b, &v, 8);
    out.insert(out.end(), b, b + 8);
}

// The relay's own answer: zeros, except where a zero would stop ggml's client
// (a HELLO of this build's version) or divide by zero (an alignment). An
// ALLOC_BUFFER answered with remote_ptr 0 makes a later load fail cleanly.
void fake_answer(std::vector<uint8_t> & out, uint8_t cmd, uint64_t size) {
    put_u64(out, size);
    const size_t at = out.size();
    out.resize(at + size, 0);
    if (cmd == kHello && size >= 3) {
        out[at] = RPC_PROTO_MAJOR_VERSION;
        out[at + 1] = RPC_PROTO_MINOR_VERSION;
        out[at + 2] = RPC_PROTO_PATCH_VERSION;
    } else if (cmd == kGetAlignment && size == 8) {
        out[at] = 32;
    } else if (cmd == kGetMaxSize && size == 8) {
        std::memset(&out[at], 0xff, 8);
    }
}

// Bytes waiting to be written to one side.
struct Out {
    std::vector<uint8_t> buf;
    size_t off = 0;
    size_t left() const { return buf.size() - off; }
    void add(const uint8_t * p, size_t n) { buf.insert(buf.end(), p, p + n); }
    // false: the socket failed (errno says why); `moved`: some bytes went
    bool flush(int fd, bool * moved = nullptr) {
        while (left() > 0) {
            const ssize_t k = ::send(fd, buf.data() + off, left(), MSG_NOSIGNAL);
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) return false;
            off += size_t(k);
            if (moved != nullptr) *moved = true;
        }
        if (off == buf.size()) buf.clear(), off = 0;
        return true;
    }
};

void tune_upstream(int fd) {
    const int on = 1, idle = 5, interval = 2, count = 3;
    const unsigned user_timeout_ms = 15000;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
#if defined(TCP_KEEPIDLE)
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
#endif
#if defined(TCP_USER_TIMEOUT)
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
#endif
    (void)idle, (void)interval, (void)count, (void)user_timeout_ms;
}

// "2", "0.5": a timeout in seconds as a person reads it
std::string seconds_of(int ms) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f", double(ms) / 1000.0);
    std::string out = text;
    out.erase(out.find_last_not_of('0') + 1);
    if (out.back() == '.') out.pop_back();
    return out;
}

std::mutex g_endpoints_mu;
std::map<std::string, std::string> g_endpoints;  // relay endpoint -> server

}  // namespace

// One connection of ggml's client, the connection to the server it is
// forwarded on, and where each stream stands in its messages.
struct RpcRelay::Link {
    int client = -1;
    net::Fd up;
    Out to_client, to_server;
    // the request being read: its 9-byte head, the payload bytes still to
    // come and the last 8 it had
    uint8_t head[9] = {};
    size_t head_have = 0;
    uint64_t body_left = 0;
    uint64_t tail = 0;
    // the answers owed, oldest first: (command, bytes)
    std::deque<std::pair<uint8_t, uint64_t>> owed;
    // the answer being read: its 8-byte size, then the bytes still to come
    uint8_t rhead[8] = {};
    size_t rhead_have = 0;
    uint64_t rbody_left = 0;
    uint64_t seen[kCmdCount] = {};  // each command's answer size as the live server sent it

    void keep_tail(const uint8_t * p, size_t n) {
        uint8_t t[8];
        std::memcpy(t, &tail, 8);
        if (n >= 8) {
            std::memcpy(t, p + n - 8, 8);
        } else {
            std::memmove(t, t + n, 8 - n);
            std::memcpy(t + 8 - n, p, n);
        }
        std::memcpy(&tail, t, 8);
    }
    // the relay waits for the server: it owes an answer, or holds bytes for it
    bool waiting() const { return up.fd >= 0 && (!owed.empty() || to_server.left() > 0); }
    void request_done(bool lost);
    void from_client(const uint8_t * p, size_t n, bool lost);
    bool from_server(const uint8_t * p, size_t n);
    void answer_all();
};

// A whole request has come: its answer is owed, or given now when lost.
void RpcRelay::Link::request_done(bool lost) {
    const uint8_t cmd = head[0];
    const int64_t bytes = answer_bytes(cmd, tail);
    head_have = 0;
    tail = 0;
    if (bytes == kNoAnswer) return;
    uint64_t size = uint64_t(bytes);
    if (cmd != kGetTensor && cmd < kCmdCount && seen[cmd] != 0) size = seen[cmd];
    if (lost) {
        fake_answer(to_client.buf, cmd, size);
    } else {
        owed.emplace_back(cmd, size);
    }
}

void RpcRelay::Link::from_client(const uint8_t * p, size_t n, bool lost) {
    if (!lost) to_server.add(p, n);
    while (n > 0) {
        if (head_have < sizeof(head)) {
            const size_t k = std::min(n, sizeof(head) - head_have);
            std::memcpy(head + head_have, p, k);
            head_have += k, p += k, n -= k;
            if (head_have < sizeof(head)) break;
            std::memcpy(&body_left, head + 1, 8);
            if (body_left == 0) request_done(lost);
            continue;
        }
        const size_t k = size_t(std::min<uint64_t>(n, body_left));
        keep_tail(p, k);
        body_left -= k, p += k, n -= k;
        if (body_left == 0) request_done(lost);
    }
}

// Bytes of the server's answers, forwarded; false when it sent an answer no
// command asked for.
bool RpcRelay::Link::from_server(const uint8_t * p, size_t n) {
    to_client.add(p, n);
    while (n > 0) {
        if (owed.empty()) return false;
        if (rhead_have < sizeof(rhead)) {
            const size_t k = std::min(n, sizeof(rhead) - rhead_have);
            std::memcpy(rhead + rhead_have, p, k);
            rhead_have += k, p += k, n -= k;
            if (rhead_have < sizeof(rhead)) break;
            std::memcpy(&rbody_left, rhead, 8);
            if (owed.front().first < kCmdCount) seen[owed.front().first] = rbody_left;
        } else {
            const size_t k = size_t(std::min<uint64_t>(n, rbody_left));
            rbody_left -= k, p += k, n -= k;
        }
        if (rhead_have == sizeof(rhead) && rbody_left == 0) {
            owed.pop_front();
            rhead_have = 0;
        }
    }
    return true;
}

// The server is lost: the answer being delivered is completed with zeros
// (its size as owed where the server had not sent all of it), then every
// answer owed is given.
void RpcRelay::Link::answer_all() {
    if (!owed.empty() && rhead_have > 0) {
        if (rhead_have < sizeof(rhead)) {
            uint8_t want[8];
            std::memcpy(want, &owed.front().second, 8);
            to_client.add(want + rhead_have, sizeof(rhead) - rhead_have);
            rbody_left = owed.front().second;
        }
        to_client.buf.resize(to_client.buf.size() + rbody_left, 0);
        owed.pop_front();
    }
    rhead_have = 0;
    rbody_left = 0;
    for (const auto & [cmd, size] : owed) fake_answer(to_client.buf, cmd, size);
    owed.clear();
    to_server = Out{};
}

RpcRelay::RpcRelay(std::string server, int timeout_ms) : server_(std::move(server)), timeout_ms_(timeout_ms) {
    listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (listen_.fd < 0 || ::bind(listen_.fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_.fd, 8) != 0 || ::getsockname(listen_.fd, reinterpret_cast<sockaddr *>(&addr), &len) != 0) {
        throw NativeFailure(std::string("cannot listen for the RPC relay: ") + std::strerror(errno));
    }
    endpoint_ = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    {
        std::lock_guard<std::mutex> lk(g_endpoints_mu);
        g_endpoints[endpoint_] = server_;
    }
    open_notifier(wake_r_, wake_w_);
    thread_ = std::thread([this] { run(); });
}

RpcRelay::~RpcRelay() {
    signal_notifier(wake_w_);
    if (thread_.joinable()) thread_.join();
    close_notifier(wake_r_, wake_w_);
}

std::string RpcRelay::lost_reason() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reason_;
}

void RpcRelay::lose(Link & link, const std::string & why) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (reason_.empty()) reason_ = why;
    }
    lost_.store(true);  // before any answer of the relay's own reaches the client
    link.up.reset();
    link.answer_all();
}

void RpcRelay::run() {
    for (;;) {
        pollfd p[2] = {{wake_r_, POLLIN, 0}, {listen_.fd, POLLIN, 0}};
        if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
        if (p[0].revents != 0) return;
        if (p[1].revents == 0) continue;
        net::Fd client(::accept4(listen_.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (client.fd < 0) continue;
        const int on = 1;
        ::setsockopt(client.fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
        serve(client.fd);
        if (net::wait_for(wake_r_, POLLIN, 0)) return;
    }
}

// How long the relay may poll before the server's answer timeout runs out
// (-1: no limit, it does not wait for the server); 0 once it ran out. `heard`:
// the last byte from or to the server, or when the relay began waiting.
int RpcRelay::poll_ms(const Link & link, std::chrono::steady_clock::time_point heard) const {
    if (!link.waiting()) return -1;
    const auto quiet = std::chrono::steady_clock::now() - heard;
    const auto quiet_ms = std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count();
    return int(std::max<int64_t>(0, int64_t(timeout_ms_) - int64_t(quiet_ms)));
}

// One client connection, until it closes or the relay does.
void RpcRelay::serve(int client) {
    Link link;
    link.client = client;
    if (!lost()) {
        try {
            net::connect_to(link.up, server_, kConnectMs);
            tune_upstream(link.up.fd);
        } catch (const RpcUnreachable & e) {
            lose(link, e.what());
        }
    }
    std::vector<uint8_t> chunk(size_t(1) << 16);
    auto heard = std::chrono::steady_clock::now();
    bool waited = false;
    for (;;) {
        if (link.waiting() && !waited) heard = std::chrono::steady_clock::now();
        waited = link.waiting();
        const int wait_ms = poll_ms(link, heard);
        if (wait_ms == 0) {
            lose(link, "RPC server " + server_ + " lost: no answer for " + seconds_of(timeout_ms_) + " s");
            waited = false;
        }
        const bool up = link.up.fd >= 0;
        pollfd p[3] = {{wake_r_, POLLIN, 0}, {client, 0, 0}, {up ? link.up.fd : -1, 0, 0}};
        if (!up || link.to_server.left() < kMaxBuffered) p[1].events |= POLLIN;
        if (link.to_client.left() > 0) p[1].events |= POLLOUT;
        if (link.to_client.left() < kMaxBuffered) p[2].events |= POLLIN;
        if (link.to_server.left() > 0) p[2].events |= POLLOUT;
        if (::poll(p, 3, up ? wait_ms : -1) < 0 && errno != EINTR) return;
        if (p[0].revents != 0) return;
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            const ssize_t k = ::recv(client, chunk.data(), chunk.size(), 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return;  // the client left
            if (k > 0) link.from_client(chunk.data(), size_t(k), lost());
        }
        if (link.to_client.left() > 0 && !link.to_client.flush(client)) return;
        if (link.up.fd < 0) continue;
        if (p[2].revents & (POLLIN | POLLHUP | POLLERR)) {
            const ssize_t k = ::recv(link.up.fd, chunk.data(), chunk.size(), 0);
            if (k > 0) heard = std::chrono::steady_clock::now();
            if (k == 0) {
                lose(link, "RPC server " + server_ + " lost: it closed the connection");
            } else if (k < 0 && errno != EAGAIN && errno != EINTR) {
                lose(link, "RPC server " + server_ + " lost: " + std::strerror(errno));
            } else if (k > 0 && !link.from_server(chunk.data(), size_t(k))) {
                lose(link, "RPC server " + server_ + " lost: it sent an answer nothing asked for");
            }
        }
        bool moved = false;
        if (link.up.fd >= 0 && link.to_server.left() > 0 && !link.to_server.flush(link.up.fd, &moved)) {
            lose(link, "RPC server " + server_ + " lost: " + std::strerror(errno));
        }
        if (moved) heard = std::chrono::steady_clock::now();
        if (link.to_client.left() > 0 && !link.to_client.flush(client)) return;
    }
}

std::string rpc_server_of(const std::string & endpoint) {
    std::lock_guard<std::mutex> lk(g_endpoints_mu);
    const auto it = g_endpoints.find(endpoint);
    return it == g_endpoints.end() ? endpoint : it->second;
}

#else  // built without LMSP_RPC

RpcRelay::RpcRelay(std::string server, int timeout_ms) : server_(std::move(server)), timeout_ms_(timeout_ms) {
    throw InvalidArgument("this build has no RPC backend (CMake option LMSP_RPC)");
}
RpcRelay::~RpcRelay() = default;
std::string RpcRelay::lost_reason() const { return reason_; }
std::string rpc_server_of(const std::string & endpoint) { return endpoint; }

#endif

}  // namespace lmsp
