// ggml's RPC backend in the module (rpc.h): the server, the greeting of a
// server, and the error of one that does not answer.
#pragma once

#include <pybind11/pybind11.h>

namespace lmsp_py {

// rpc_serve, rpc_hello, rpc_protocol and RpcUnreachableError (a NativeError
// and a ConnectionError) on the module.
void bind_rpc(pybind11::module_ & m, PyObject * native_error);

}  // namespace lmsp_py
