// One thread of the lowest CPU priority for the bulky work of a KV file (its
// checksum, its write and sync, the touching of a buffer's new pages), so that
// the threads that run the engine's steps keep their cores.
//
// The work runs here, not on the thread that asks for it: a Python thread
// lowered to that priority would hold the GIL at times, and then wait for a
// core while every thread that serves tokens waits for the GIL. A caller
// releases the GIL and waits for its job; the worker never takes the GIL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace lmsp {

// The worker's nice value (Linux gives each thread its own).
constexpr int kLowPriorityNice = 19;

// Runs `job` on the worker and waits for it; rethrows what it threw. The
// worker starts at the first call (again in a forked child).
void run_low_priority(const std::function<void()> & job);

// The worker's nice value once it runs; -100 before, or where the system gives
// a thread no nice value of its own.
int low_priority_nice();

// The CRC-32 of zlib (and of Python's zlib.crc32), continued from `crc`.
uint32_t crc32(const uint8_t * data, size_t n, uint32_t crc = 0);

}  // namespace lmsp
