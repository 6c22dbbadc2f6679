// A relay between ggml's RPC client and one RPC server, in this process, and
// the socket helpers the client end shares. Why and how: rpc_relay.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace lmsp {

namespace net {

// A socket (or any descriptor) closed with its holder.
struct Fd {
    int fd = -1;
    Fd() = default;
    explicit Fd(int f) : fd(f) {}
    Fd(const Fd &) = delete;
    Fd & operator=(const Fd &) = delete;
    ~Fd() { reset(); }
    void reset(int f = -1);
};

// HOST and PORT of "HOST:PORT" ("[v6]:PORT" too); InvalidArgument otherwise.
void split_endpoint(const std::string & endpoint, std::string & host, std::string & port);
// Whether `fd` became ready for `events` within `timeout_ms` (< 0: no limit).
bool wait_for(int fd, short events, int timeout_ms);
// A connected non-blocking socket to `endpoint`, or RpcUnreachable naming it.
void connect_to(Fd & s, const std::string & endpoint, int timeout_ms);
bool send_all(int fd, const uint8_t * p, size_t n, int timeout_ms);
bool recv_all(int fd, uint8_t * p, size_t n, int timeout_ms);

}  // namespace net

// Listens on 127.0.0.1 (a port of its own) for ggml's client and forwards
// each of its connections to `server` over a connection of its own, until
// that server is lost; from then on it answers every command itself. The
// server is lost, too, when the relay waits for it (owes the client an answer,
// or holds bytes for the server) and the server neither sends nor takes a byte
// for `timeout_ms`: a process stopped or deadlocked on a box whose kernel
// still acknowledges every byte.
class RpcRelay {
public:
    // Throws NativeFailure when it cannot listen.
    RpcRelay(std::string server, int timeout_ms);
    ~RpcRelay();  // closes both its sockets and ends its thread
    RpcRelay(const RpcRelay &) = delete;
    RpcRelay & operator=(const RpcRelay &) = delete;

    const std::string & server() const { return server_; }
    // "127.0.0.1:PORT": the endpoint ggml's client is given
    const std::string & endpoint() const { return endpoint_; }
    bool lost() const { return lost_.load(); }
    // why the server was lost ("RPC server HOST:PORT lost: ..."); empty while it answers
    std::string lost_reason() const;

private:
    struct Link;  // one client connection and its upstream (rpc_relay.cpp)
    void run();
    void serve(int client);
    int poll_ms(const Link & link, std::chrono::steady_clock::time_point heard) const;
    void lose(Link & link, const std::string & why);

    std::string server_;
    int timeout_ms_;
    std::string endpoint_;
    net::Fd listen_;
    int wake_r_ = -1, wake_w_ = -1;  // written by the destructor: the thread ends
    std::atomic<bool> lost_{false};
    mutable std::mutex mu_;
    std::string reason_;
    std::thread thread_;
};

// The server a relay's endpoint stands for (`endpoint` itself where it is no
// relay's): what users see of a device ggml names by its endpoint.
std::string rpc_server_of(const std::string & endpoint);

}  // namespace lmsp
