// A model split over other boxes through ggml's RPC backend, and the server
// that lends this box's CPU to such a model (lmsp rpc-server). Why and how:
// rpc.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace lmsp {

// Whether this build has ggml's RPC backend (CMake option LMSP_RPC).
bool rpc_built();

// The protocol version this build speaks, "major.minor.patch".
std::string rpc_protocol();

// A server that does not answer, answers in another protocol version, or
// cannot take this client now. The message names its address.
struct RpcUnreachable : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A server lost while a model split over it ran: what the step computed is
// not to be used. The message names the server's address.
struct BackendLost : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The error code of a sequence that ended because a server was lost.
inline constexpr const char * kBackendLost = "backend_lost";

// Says hello to the server at `endpoint` (HOST:PORT) and returns its protocol
// version; throws RpcUnreachable when it does not answer within `timeout_ms`
// or speaks a version this build cannot (ggml's own client would abort the
// process on either).
std::string rpc_hello(const std::string & endpoint, int timeout_ms);

// The relays of a model's servers (rpc.cpp).
struct RpcLease;

// Why one of the lease's servers was lost ("RPC server HOST:PORT lost: ..."),
// or empty while every one answers.
std::string rpc_lost(const RpcLease & lease);

// Where a model's layers go: the first `local_layers` on this box's CPU, the
// rest (and the output layer) over the servers' devices in the proportions
// of `server_split`, in llama.cpp's terms (llama_model_params).
struct RpcSplit {
    std::vector<ggml_backend_dev_t> devices;  // the servers' devices, then nullptr
    std::vector<float> server_split;          // one share per device
    int32_t n_gpu_layers = 0;                 // layers (output included) on the servers
    // held while a model's buffers may be on the servers: ggml's client talks
    // to each server through a relay of this process (rpc_relay.h), shared by
    // every lease on that server while it answers
    std::shared_ptr<RpcLease> lease;
    // the output matrix (the tied token embedding of a model without one) stays
    // in this box's memory: the last server sends back a row of n_embd floats a
    // token, not the n_vocab logits computed there
    std::vector<llama_model_tensor_buft_override> overrides;
};

// The split of a model of `n_layer` layers over this box and `servers`:
// `shares` gives this box's share first, then each server's (llama.cpp's
// --tensor-split); empty shares go by each one's free memory. Every server
// this process is not connected to already is checked with rpc_hello first
// (a server serves one client at a time: a second greeting would wait).
// ggml's client is given each server's relay, whose endpoint stands for it.
// A relay made for this split takes `timeout_s` as its answer timeout (a
// server it waits for that sends and takes nothing that long is lost); one
// that serves a live model already keeps the timeout of the load that made it.
RpcSplit rpc_split(const std::vector<std::string> & servers, const std::vector<float> & shares, int32_t n_layer,
                   double timeout_s);

// Runs ggml's RPC server on `endpoint` over this box's CPU with the engine's
// kernels (the tiled products, and ggml's reference kernels wherever the
// engine would run them): returns only when it cannot listen (a NativeFailure
// saying why). `mem_bytes` (0: the host's free memory) is what it tells
// clients it has free; `cache_dir` (empty: none) keeps large tensors a
// client sent, by hash.
void rpc_serve(const std::string & endpoint, const std::string & cache_dir, int32_t n_threads, size_t mem_bytes);

}  // namespace lmsp
