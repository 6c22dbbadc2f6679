// The chat layer's part of the extension module (chat_template_py.cpp).
#pragma once

#include <pybind11/pybind11.h>

void bind_chat(pybind11::module_ & m);
