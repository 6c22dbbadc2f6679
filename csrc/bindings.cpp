// pybind11 glue only: conversions, GIL release and exception translation.
// The engine itself is plain C++ (engine.h, gguf_info.h, text.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <new>
#include <optional>

#include "bindings_kv.h"
#include "bindings_rpc.h"
#include "bindings_tiles.h"
#include "chat_template_py.h"  // the chat layer's part of the module
#include "engine.h"
#include "errors.h"
#include "gguf_info.h"
#include "grammar.h"
#include "llama.h"
#include "quantize.h"
#include "text.h"
#include "tile_matmul.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

// Python exception classes, created once and kept for the life of the process.
PyObject * g_native_error = nullptr;
PyObject * g_model_format_error = nullptr;
PyObject * g_context_length_error = nullptr;
PyObject * g_engine_closed_error = nullptr;

PyObject * new_exception(py::module_ & m, const char * name, PyObject * bases, const char * doc) {
    const std::string qualified = std::string("lmsp._native.") + name;
    PyObject * type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
    if (type == nullptr) throw py::error_already_set();
    Py_INCREF(type);  // the module holds one reference, the translator another
    m.add_object(name, py::reinterpret_borrow<py::object>(type));
    return type;
}

// Short calls keep the GIL. Giving it away costs little when nobody waits for
// it, but in the service other threads do (the commit thread, gevent's pool),
// and taking it back then waits for one of them to let go: a request's submit
// took 0.35 ms at the 90th percentile with the GIL given away, 0.08 ms with it
// held (traced in the service, 60 requests at 1 client). Long inputs still run
// without it, so that other threads go on meanwhile.
constexpr size_t kGilFreeBytes = 64 * 1024;  // tokenizing this much takes about a millisecond

template <class F>
auto with_gil_free_if(bool long_work, F && f) {
    if (!long_work) return f();
    py::gil_scoped_release nogil;
    return f();
}

// Exception text may quote file names or llama.cpp's log: make it valid UTF-8.
std::string clean(const char * what) {
    std::string raw(what), out;
    lmsp::utf8_take(raw, out, true);
    return out;
}

py::dict info_dict(const lmsp::GgufInfo & i) {
    py::dict d;
    d["architecture"] = i.architecture;
    d["name"] = i.name ? py::object(py::str(*i.name)) : py::object(py::none());
    d["parameters"] = i.parameters;
    d["quantization"] = i.quantization;
    d["context_length"] = i.context_length;
    d["chat_template"] = i.chat_template ? py::object(py::str(*i.chat_template)) : py::object(py::none());
    d["decomposes_text"] = i.decomposes_text;
    d["vocab_size"] = i.vocab_size;
    d["n_embd"] = i.n_embd;
    d["n_layer"] = i.n_layer;
    d["n_head"] = i.n_head;
    d["n_head_kv"] = i.n_head_kv;
    d["tensor_count"] = i.tensor_count;
    d["size_bytes"] = i.size_bytes;
    return d;
}

std::string fspath(const py::object & path) {
    py::object p = py::module_::import("os").attr("fspath")(path);
    if (!py::isinstance<py::str>(p)) throw py::type_error("model path must be a str or os.PathLike of str");
    return p.cast<std::string>();
}

int32_t as_int32(const py::handle & v, const char * what) {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
        throw py::type_error(std::string(what) + " must be an int");
    }
    const long long x = v.cast<long long>();
    if (x < INT32_MIN || x > INT32_MAX) throw lmsp::InvalidArgument(std::string(what) + " is out of range");
    return int32_t(x);
}

std::vector<int32_t> as_tokens(const py::handle & seq, const char * what) {
    if (py::isinstance<py::str>(seq) || py::isinstance<py::bytes>(seq)) {
        throw py::type_error(std::string(what) + " must be a list of token ids");
    }
    std::vector<int32_t> out;
    for (const py::handle item : py::iter(seq)) {
        out.push_back(as_int32(item, what));
    }
    return out;
}

std::string as_str(const py::handle & v, const char * what) {
    if (!py::isinstance<py::str>(v)) throw py::type_error(std::string(what) + " must be a str");
    return v.cast<std::string>();
}

// Chat messages from [{"role": str, "content": str}]; `size`: their contents' length.
std::vector<lmsp::ChatMessage> as_messages(const py::object & messages, size_t & size) {
    std::vector<lmsp::ChatMessage> msgs;
    for (const py::handle m : py::iter(messages)) {
        if (!py::isinstance<py::dict>(m)) throw py::type_error("each message must be a dict");
        py::dict d = py::reinterpret_borrow<py::dict>(m);
        if (!d.contains("role") || !d.contains("content")) {
            throw lmsp::InvalidArgument("each message needs 'role' and 'content'");
        }
        msgs.push_back({as_str(d["role"], "role"), as_str(d["content"], "content")});
        size += msgs.back().content.size();
    }
    return msgs;
}

// A grammar from {"gbnf": str, "lazy": bool, "triggers": [{"type": "word" |
// "pattern" | "pattern_full" | "token", "value": str, "token": int}],
// "preserved": [str], "prefill": str}; only "gbnf" is required.
lmsp::GrammarSpec as_grammar(const py::handle & value) {
    if (!py::isinstance<py::dict>(value)) throw py::type_error("grammar must be a dict or None");
    py::dict d = py::reinterpret_borrow<py::dict>(value);
    if (!d.contains("gbnf")) throw lmsp::InvalidArgument("grammar needs 'gbnf'");
    lmsp::GrammarSpec g;
    g.gbnf = as_str(d["gbnf"], "grammar.gbnf");
    if (d.contains("lazy")) g.lazy = py::bool_(d["lazy"]);
    if (d.contains("prefill")) g.prefill = as_str(d["prefill"], "grammar.prefill");
    if (d.contains("preserved")) {
        for (const py::handle t : py::iter(d["preserved"])) g.preserved.push_back(as_str(t, "grammar.preserved"));
    }
    if (d.contains("triggers")) {
        using Kind = lmsp::GrammarTrigger::Kind;
        for (const py::handle t : py::iter(d["triggers"])) {
            if (!py::isinstance<py::dict>(t)) throw py::type_error("each grammar trigger must be a dict");
            py::dict td = py::reinterpret_borrow<py::dict>(t);
            lmsp::GrammarTrigger trig;
            const std::string kind = td.contains("type") ? as_str(td["type"], "trigger.type") : "word";
            if (kind == "word") {
                trig.kind = Kind::word;
            } else if (kind == "pattern") {
                trig.kind = Kind::pattern;
            } else if (kind == "pattern_full") {
                trig.kind = Kind::pattern_full;
            } else if (kind == "token") {
                trig.kind = Kind::token;
            } else {
                throw lmsp::InvalidArgument("grammar trigger type must be word, pattern, pattern_full or token");
            }
            if (td.contains("value")) trig.value = as_str(td["value"], "trigger.value");
            if (td.contains("token")) trig.token = as_int32(td["token"], "trigger.token");
            g.triggers.push_back(std::move(trig));
        }
    }
    return g;
}

py::dict timings_dict(const lmsp::Timings & t) {
    return py::dict("queued_ms"_a = t.queued_ms, "prompt_ms"_a = t.prompt_ms, "first_token_ms"_a = t.first_token_ms,
                    "decode_ms"_a = t.decode_ms, "total_ms"_a = t.total_ms, "tokens_per_s"_a = t.tokens_per_s);
}

py::dict result_dict(lmsp::StepResult & r) {
    py::dict d;
    d["seq"] = r.seq;
    d["tokens"] = py::cast(r.tokens);
    if (!r.logprobs.empty()) d["logprobs"] = py::cast(r.logprobs);
    if (!r.top_logprobs.empty()) {
        py::list top;
        for (const auto & alternatives : r.top_logprobs) {
            py::list one;
            for (const auto & a : alternatives) one.append(py::make_tuple(a.token, a.logprob));
            top.append(std::move(one));
        }
        d["top_logprobs"] = std::move(top);
    }
    d["text"] = py::str(r.text);
    const char * f = lmsp::finish_name(r.finish);
    d["finish"] = f ? py::object(py::str(f)) : py::object(py::none());
    d["error"] = r.finish == lmsp::Finish::error ? py::object(py::str(r.error)) : py::object(py::none());
    if (!r.code.empty()) d["code"] = r.code;
    d["n_prompt"] = r.n_prompt;
    d["n_generated"] = r.n_generated;
    d["n_cached"] = r.n_cached;
    d["n_loaded"] = r.n_loaded;
    d["prefix_refused"] = r.prefix_refused;
    d["timings"] = r.timings ? timings_dict(*r.timings) : py::dict();
    return d;
}

// The Python-facing engine: holds the C++ engine, owns nothing else.
class PyEngine {
public:
    PyEngine(const py::object & model_path, int32_t n_ctx, int32_t n_parallel, int32_t n_threads, int32_t n_gpu_layers,
             int32_t n_batch, int32_t prefill_chunk, bool batch_invariant, bool prefix_cache, bool use_mmap,
             bool huge_pages, bool swa_full, size_t kept_logits_bytes, std::vector<std::string> rpc_servers,
             std::vector<float> tensor_split, double rpc_timeout) {
        const std::string path = fspath(model_path);
        lmsp::EngineOptions o;
        o.n_ctx = n_ctx;
        o.n_parallel = n_parallel;
        o.n_threads = n_threads;
        o.n_gpu_layers = n_gpu_layers;
        o.n_batch = n_batch;
        o.prefill_chunk = prefill_chunk;
        o.batch_invariant = batch_invariant;
        o.prefix_cache = prefix_cache;
        o.use_mmap = use_mmap;
        o.huge_pages = huge_pages;
        o.swa_full = swa_full;
        o.kept_logits_bytes = kept_logits_bytes;
        o.rpc_servers = std::move(rpc_servers);
        o.tensor_split = std::move(tensor_split);
        o.rpc_timeout = rpc_timeout;
        py::gil_scoped_release nogil;
        engine_ = std::make_unique<lmsp::Engine>(path, o);
    }

    lmsp::Engine & e() { return *engine_; }

    py::dict info() {
        py::dict d = info_dict(engine_->info());
        d["n_ctx"] = engine_->n_ctx();
        d["n_parallel"] = engine_->n_parallel();
        d["n_vocab"] = engine_->n_vocab();
        d["backend"] = engine_->backend();
        d["batch_invariant"] = engine_->batch_invariant();
        d["reference_kernels"] = engine_->reference_kernels();
        d["tile_matmul"] = lmsp::tile_matmul_types();
        d["has_chat_template"] = engine_->has_chat_template();
        d["fim_tokens"] = engine_->fim_tokens();
        d["kv_format"] = engine_->kv_format();
        d["n_swa"] = engine_->n_swa();
        d["swa_full"] = engine_->swa_full();
        d["layers"] = engine_->layer_places();
        d["weights_in_huge_pages"] = engine_->weights_in_huge_pages();
        d["huge_pages_pending"] = engine_->huge_pages_pending();
        return d;
    }

    int64_t submit(const py::object & prompt, const py::object & max_tokens, double temperature, double top_p,
                   const py::object & top_k, const py::object & seed, const py::object & stop,
                   const py::object & resume, const std::string & cache_key, bool logprobs, int32_t top_logprobs,
                   const py::object & grammar, const py::object & prefix, bool persist) {
        lmsp::SubmitRequest req;
        req.persist = persist;
        if (!prefix.is_none()) req.prefix = lmsp_py::as_prefix(prefix);
        req.logprobs = logprobs;
        req.top_logprobs = top_logprobs;
        if (!grammar.is_none()) req.grammar = as_grammar(grammar);
        req.prompt = as_tokens(prompt, "prompt");
        req.max_tokens = as_int32(max_tokens, "max_tokens");
        req.sampling.temperature = float(temperature);
        req.sampling.top_p = float(top_p);
        req.sampling.top_k = as_int32(top_k, "top_k");
        req.cache_key = cache_key;
        if (!py::isinstance<py::int_>(seed) || py::isinstance<py::bool_>(seed)) {
            throw py::type_error("seed must be an int");
        }
        req.sampling.seed = PyLong_AsUnsignedLongLongMask(seed.ptr());
        if (PyErr_Occurred()) throw py::error_already_set();
        if (py::isinstance<py::str>(stop)) {
            req.stop.push_back(stop.cast<std::string>());
        } else if (!stop.is_none()) {
            for (const py::handle s : py::iter(stop)) req.stop.push_back(as_str(s, "stop"));
        }
        if (!resume.is_none()) {
            if (!py::isinstance<py::dict>(resume)) throw py::type_error("resume must be a dict or None");
            py::dict r = resume;
            lmsp::ResumeState rs;
            if (r.contains("generated")) rs.generated = as_tokens(r["generated"], "resume.generated");
            if (r.contains("emitted")) rs.emitted = as_str(r["emitted"], "resume.emitted");
            if (r.contains("kv_state") && !r["kv_state"].is_none()) {
                py::object kv = r["kv_state"];
                if (!py::isinstance<py::bytes>(kv) && !PyByteArray_Check(kv.ptr()) && !PyMemoryView_Check(kv.ptr())) {
                    throw py::type_error("resume.kv_state must be bytes or None");
                }
                // a copy of any of the three (a memoryview need not be contiguous)
                py::object copy = py::reinterpret_steal<py::object>(PyBytes_FromObject(kv.ptr()));
                if (!copy) throw py::error_already_set();
                const char * data = PyBytes_AS_STRING(copy.ptr());
                rs.kv_state = std::vector<uint8_t>(data, data + PyBytes_GET_SIZE(copy.ptr()));
            }
            req.resume = std::move(rs);
        }
        // a queue push under the engine's lock, which its thread holds only briefly
        // (never while it decodes, never while it needs Python): with the GIL held,
        // unless a grammar is set up first, which can take milliseconds
        return with_gil_free_if(req.grammar.has_value(), [&] { return engine_->submit(std::move(req)); });
    }

    py::dict snapshot(int64_t seq, bool with_kv) {
        lmsp::Snapshot s;
        {
            py::gil_scoped_release nogil;
            s = engine_->snapshot(seq, with_kv);
        }
        py::dict d;
        d["generated"] = py::cast(s.generated);
        d["emitted"] = py::str(s.emitted);
        d["n_prompt"] = s.n_prompt;
        d["kv_state"] = s.kv_state ? py::object(py::bytes(reinterpret_cast<const char *>(s.kv_state->data()),
                                                          s.kv_state->size()))
                                   : py::object(py::none());
        return d;
    }

    py::object saved_prefix(int64_t seq, const py::object & into) { return lmsp_py::saved_prefix(*engine_, seq, into); }

    py::list poll() {
        std::vector<lmsp::StepResult> results;
        {
            py::gil_scoped_release nogil;
            results = engine_->poll();
        }
        py::list out;
        for (auto & r : results) out.append(result_dict(r));
        return out;
    }

    bool wait(const py::object & timeout, bool urgent) {
        double t = -1.0;
        if (!timeout.is_none()) {
            t = timeout.cast<double>();
            if (!(t >= 0.0)) throw lmsp::InvalidArgument("timeout must be >= 0 or None");
        }
        py::gil_scoped_release nogil;
        return engine_->wait(t, urgent);
    }

    py::array_t<float> eval_logits(const py::object & tokens) {
        std::vector<int32_t> toks = as_tokens(tokens, "tokens");
        std::vector<float> logits;
        {
            py::gil_scoped_release nogil;
            logits = engine_->eval_logits(toks);
        }
        const py::ssize_t rows = py::ssize_t(toks.size());
        const py::ssize_t cols = engine_->n_vocab();
        py::array_t<float> out({rows, cols});
        std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
        return out;
    }

    // one row per input: the normalized embedding of its tokens
    py::array_t<float> embed(const py::object & inputs) {
        if (py::isinstance<py::str>(inputs) || !py::isinstance<py::sequence>(inputs)) {
            throw py::type_error("inputs must be a sequence of token sequences");
        }
        std::vector<std::vector<int32_t>> seqs;
        for (const py::handle & item : py::reinterpret_borrow<py::sequence>(inputs)) {
            seqs.push_back(as_tokens(py::reinterpret_borrow<py::object>(item), "inputs"));
        }
        std::vector<std::vector<float>> vectors;
        {
            py::gil_scoped_release nogil;
            vectors = engine_->embed(seqs);
        }
        const py::ssize_t cols = vectors.empty() ? 0 : py::ssize_t(vectors[0].size());
        py::array_t<float> out({py::ssize_t(vectors.size()), cols});
        for (size_t i = 0; i < vectors.size(); ++i) {
            std::memcpy(out.mutable_data(py::ssize_t(i)), vectors[i].data(), vectors[i].size() * sizeof(float));
        }
        return out;
    }

    py::dict stats() {
        const lmsp::EngineStats s = engine_->stats();
        return py::dict("active"_a = s.active, "waiting"_a = s.waiting, "steps"_a = s.steps, "ubatches"_a = s.ubatches,
                        "tokens_decoded"_a = s.tokens_decoded, "filler_rows"_a = s.filler_rows,
                        "tiled_steps"_a = s.tiled_steps, "tokens_generated"_a = s.tokens_generated,
                        "submitted"_a = s.submitted, "finished"_a = s.finished, "kv_copies"_a = s.kv_copies,
                        "kv_copy_us"_a = s.kv_copy_us, "kv_loads"_a = s.kv_loads, "kv_load_us"_a = s.kv_load_us,
                        "embed_passes"_a = s.embed_passes,
                        "embed_passes_without_logits"_a = s.embed_passes_without_logits);
    }

    void close() {
        py::gil_scoped_release nogil;
        engine_->close();
    }

private:
    std::unique_ptr<lmsp::Engine> engine_;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "lmsp native core: llama.cpp engine";
    m.attr("__version__") = LMSP_VERSION;
    lmsp::log::install();

    py::tuple native_bases = py::make_tuple(py::handle(PyExc_Exception));
    g_native_error = new_exception(m, "NativeError", native_bases.ptr(), "Base of the native engine's errors.");
    py::tuple value_bases = py::make_tuple(py::handle(g_native_error), py::handle(PyExc_ValueError));
    g_model_format_error = new_exception(m, "ModelFormatError", value_bases.ptr(),
                                         "Not GGUF, truncated, corrupt, or an unsupported architecture.");
    g_context_length_error = new_exception(m, "ContextLengthError", value_bases.ptr(),
                                           "The prompt (plus resumed tokens) does not fit the context.");
    py::tuple runtime_bases = py::make_tuple(py::handle(g_native_error), py::handle(PyExc_RuntimeError));
    g_engine_closed_error = new_exception(m, "EngineClosedError", runtime_bases.ptr(), "The engine is closed.");

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const lmsp::ModelFormatError & e) {
            PyErr_SetString(g_model_format_error, clean(e.what()).c_str());
        } catch (const lmsp::ContextLengthError & e) {
            PyErr_SetString(g_context_length_error, clean(e.what()).c_str());
        } catch (const lmsp::EngineClosedError & e) {
            PyErr_SetString(g_engine_closed_error, clean(e.what()).c_str());
        } catch (const lmsp::FileMissing & e) {
            PyErr_SetString(PyExc_FileNotFoundError, clean(e.what()).c_str());
        } catch (const lmsp::OutOfMemory & e) {
            PyErr_SetString(PyExc_MemoryError, clean(e.what()).c_str());
        } catch (const lmsp::InvalidArgument & e) {
            PyErr_SetString(PyExc_ValueError, clean(e.what()).c_str());
        } catch (const lmsp::UnknownSequence & e) {
            PyErr_SetString(PyExc_KeyError, clean(e.what()).c_str());
        } catch (const std::bad_alloc &) {
            PyErr_SetString(PyExc_MemoryError, "out of memory");
        } catch (const lmsp::NativeFailure & e) {
            PyErr_SetString(g_native_error, clean(e.what()).c_str());
        }
    });

    m.def("system_info", [] { return std::string(llama_print_system_info()); });
    m.def("set_logging", &lmsp::log::set_enabled, "enabled"_a,
          "Forward llama.cpp's log to stderr (off by default; LMSP_LLAMA_LOG=1 turns it on at import).");
    m.def(
        "read_gguf_info",
        [](const py::object & path) {
            const std::string p = fspath(path);
            lmsp::GgufInfo info;
            {
                py::gil_scoped_release nogil;
                info = lmsp::read_gguf_info(p);
            }
            return info_dict(info);
        },
        "path"_a, "GGUF metadata without loading the weights.");

    m.def(
        "quantize",
        [](const py::object & src, const py::object & dst, const std::string & type, int n_threads) {
            const std::string s = fspath(src), d = fspath(dst);
            py::gil_scoped_release nogil;
            lmsp::quantize(s, d, type, n_threads);
        },
        "src"_a, "dst"_a, "type"_a, "n_threads"_a = 0,
        "Write the GGUF model src to dst with its weights in type (see QUANTIZE_TYPES).");
    m.attr("QUANTIZE_TYPES") = py::tuple(py::cast(lmsp::quantize_types()));
    // both without the GIL: a large schema or grammar takes a while, other threads go on
    m.def("schema_grammar", &lmsp::schema_grammar, "schema"_a, py::call_guard<py::gil_scoped_release>(),
          "The GBNF grammar (root rule 'root') of the texts a JSON schema (given as JSON text) admits.");
    m.def("check_grammar", &lmsp::check_grammar, "gbnf"_a, py::call_guard<py::gil_scoped_release>(),
          "ValueError for GBNF text (root rule 'root') that the engine's grammar sampler would refuse.");

    lmsp_py::bind_tiles(m);
    bind_chat(m);

    py::class_<lmsp::TextStream>(m, "TextStream",
                                 "Streaming-safe UTF-8 text with stop strings (the engine's text module).")
        .def(py::init([](const py::object & stop) {
                 std::vector<std::string> stops;
                 if (py::isinstance<py::str>(stop)) {
                     stops.push_back(stop.cast<std::string>());
                 } else {
                     for (const py::handle s : py::iter(stop)) stops.push_back(as_str(s, "stop"));
                 }
                 for (const auto & s : stops) {
                     if (s.empty()) throw lmsp::InvalidArgument("stop strings must not be empty");
                 }
                 return lmsp::TextStream(stops);
             }),
             "stop"_a = py::tuple())
        .def(
            "push", [](lmsp::TextStream & t, const py::bytes & b) { return py::str(t.push(std::string(b))); }, "data"_a)
        .def("flush", [](lmsp::TextStream & t) { return py::str(t.flush()); })
        .def("adopt_emitted", &lmsp::TextStream::adopt_emitted, "already"_a)
        .def_property_readonly("stopped", &lmsp::TextStream::stopped)
        .def_property_readonly("emitted", [](const lmsp::TextStream & t) { return py::str(t.emitted()); });

    lmsp_py::bind_kv(m);
    lmsp_py::bind_rpc(m, g_native_error);

    py::class_<PyEngine>(m, "Engine")
        .def(py::init<const py::object &, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, bool, bool, bool, bool,
                      bool, size_t, std::vector<std::string>, std::vector<float>, double>(),
             "model_path"_a, py::kw_only(), "n_ctx"_a = 4096, "n_parallel"_a = 4, "n_threads"_a = 0,
             "n_gpu_layers"_a = 0, "n_batch"_a = 512, "prefill_chunk"_a = 256, "batch_invariant"_a = true,
             "prefix_cache"_a = true, "use_mmap"_a = false, "huge_pages"_a = true, "swa_full"_a = true,
             "kept_logits_bytes"_a = size_t(1) << 20, "rpc_servers"_a = std::vector<std::string>{},
             "tensor_split"_a = std::vector<float>{}, "rpc_timeout"_a = 60.0)
        .def_property_readonly("info", &PyEngine::info)
        .def_property_readonly("n_ctx", [](PyEngine & s) { return s.e().n_ctx(); })
        .def_property_readonly("n_vocab", [](PyEngine & s) { return s.e().n_vocab(); })
        .def_property_readonly("n_parallel", [](PyEngine & s) { return s.e().n_parallel(); })
        .def_property_readonly("closed", [](PyEngine & s) { return s.e().closed(); })
        .def_property_readonly("backend_lost", [](PyEngine & s) { return s.e().backend_lost(); })
        .def(
            "tokenize",
            [](PyEngine & s, const std::string & text, bool add_special, bool parse_special) {
                return with_gil_free_if(text.size() >= kGilFreeBytes,
                                        [&] { return s.e().tokenize(text, add_special, parse_special); });
            },
            "text"_a, "add_special"_a = true, "parse_special"_a = false)
        .def(
            "detokenize",
            [](PyEngine & s, const py::object & tokens) {
                std::vector<int32_t> t = as_tokens(tokens, "tokens");
                const std::string out = with_gil_free_if(t.size() * 4 >= kGilFreeBytes,
                                                         [&] { return s.e().detokenize(t); });
                return py::str(out);
            },
            "tokens"_a)
        .def(
            "token_bytes", [](PyEngine & s, int32_t token) { return py::bytes(s.e().token_piece(token)); }, "token"_a)
        .def(
            "apply_chat_template",
            [](PyEngine & s, const py::object & messages, bool add_generation_prompt) {
                size_t size = 0;
                const std::vector<lmsp::ChatMessage> msgs = as_messages(messages, size);
                const std::string out = with_gil_free_if(
                    size >= kGilFreeBytes, [&] { return s.e().apply_chat_template(msgs, add_generation_prompt); });
                return py::str(out);
            },
            "messages"_a, "add_generation_prompt"_a = true)
        .def(
            "chat_template",
            [](PyEngine & s) -> py::object {
                const lmsp::ChatTemplate * t = s.e().chat_template();
                if (t == nullptr) return py::none();
                return py::cast(t, py::return_value_policy::reference);
            },
            py::keep_alive<0, 1>(), "The model's chat template (None: it has none), kept alive with the engine.")
        .def(
            "chat_prompt",
            [](PyEngine & s, const py::object & messages, bool add_generation_prompt) {
                size_t size = 0;
                const std::vector<lmsp::ChatMessage> msgs = as_messages(messages, size);
                return with_gil_free_if(size >= kGilFreeBytes,
                                        [&] { return s.e().chat_prompt(msgs, add_generation_prompt); });
            },
            "messages"_a, "add_generation_prompt"_a = true)
        .def("submit", &PyEngine::submit, "prompt"_a, py::kw_only(), "max_tokens"_a, "temperature"_a = 1.0,
             "top_p"_a = 1.0, "top_k"_a = 0, "seed"_a = 0, "stop"_a = py::tuple(), "resume"_a = py::none(),
             "cache_key"_a = "", "logprobs"_a = false, "top_logprobs"_a = 0, "grammar"_a = py::none(),
             "prefix"_a = py::none(), "persist"_a = false)
        .def("saved_prefix", &PyEngine::saved_prefix, "seq_id"_a, "into"_a = py::none())
        .def(
            "cached_prefix",
            [](PyEngine & s, const py::object & tokens, const std::string & key) {
                return s.e().cached_prefix(as_tokens(tokens, "tokens"), key);
            },
            "tokens"_a, "cache_key"_a = "")
        .def(
            "usable_prefix",
            [](PyEngine & s, size_t n_prompt, size_t n_held, size_t tiled_rows, size_t tiled_min) {
                return s.e().usable_prefix(n_prompt, n_held, tiled_rows, tiled_min);
            },
            "n_prompt"_a, "n_held"_a, "tiled_rows"_a = 0, "tiled_min"_a = 0)
        .def(
            "cancel",
            [](PyEngine & s, int64_t seq) {
                py::gil_scoped_release nogil;
                return s.e().cancel(seq);
            },
            "seq_id"_a)
        .def("snapshot", &PyEngine::snapshot, "seq_id"_a, "with_kv"_a = false)
        .def("poll", &PyEngine::poll)
        .def("wait", &PyEngine::wait, "timeout"_a = py::none(), "urgent"_a = false)
        .def("fileno", [](PyEngine & s) { return s.e().fileno(); })
        .def("urgent_fileno", [](PyEngine & s) { return s.e().urgent_fileno(); })
        .def("eval_logits", &PyEngine::eval_logits, "tokens"_a)
        .def("embed", &PyEngine::embed, "inputs"_a)
        .def("stats", &PyEngine::stats)
        .def("close", &PyEngine::close)
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](PyEngine & s, const py::args &) { s.close(); });
}
