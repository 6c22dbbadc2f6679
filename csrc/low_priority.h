// One thread of the lowest CPU priority for the bulky work of a KV file (its
// checksum, its write and sync, the touching of a buffer's new pages), so that
// the threads that run the engine's steps keep their cores.
//
// The work runs here, not on the thread that asks for it: a Python thread
// lowered to that priority would hold the GIL at times, and then wait for a
// core while every thread that serves tokens waits for the GIL. A caller
// releases the GIL and waits for its job; the worker never takes the GIL.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace lmsp {

// The worker's nice value (Linux gives each thread its own).
constexpr int kLowPriorityNice = 19;

// Runs `job` on the worker and waits for it; rethrows what it threw. The
// worker starts at the first call (again in a forked child).
void run_low_priority(const std::function<void()> & job);

// Paced work: the most bytes one piece handles, the rest due after a piece as a
// multiple of its CPU time, and the most rest that time off the core (asleep
// longer than due, or preempted) may pay in advance.
constexpr size_t kPaceBytes = size_t(256) << 10;
constexpr int kPaceRest = 3;
constexpr std::chrono::milliseconds kPaceCredit{4};

// Calls `piece(offset, length)` over [0, n) in pieces of at most kPaceBytes and
// rests between them, so that the work takes a quarter of one core at most; the
// time the scheduler already kept this thread off its core counts as rest, so
// where the cores are busy it sleeps no more than that. A spare core is not
// free: the engine's step shares the memory bus (and on some machines a
// physical core) with it, and a whole checksum and write at once (tenths of a
// second for tens of megabytes) made each step during it nearly twice as long.
// For use inside a job of run_low_priority.
void paced(size_t n, const std::function<void(size_t, size_t)> & piece);

// The same pacing over `n` pieces of any size: `piece(i)` for i in [0, n),
// and `rest(d)` between them, which sleeps for d and returns false to stop
// (a thread of its own that its owner may end). For a thread at the lowest
// priority (lower_this_thread).
void paced_pieces(size_t n, const std::function<void(size_t)> & piece,
                  const std::function<bool(std::chrono::steady_clock::duration)> & rest);

// Puts the calling thread at kLowPriorityNice; its nice value then, or -100
// where the system gives a thread no nice value of its own.
int lower_this_thread();

// The worker's nice value once it runs; -100 before, or where the system gives
// a thread no nice value of its own.
int low_priority_nice();

// The CRC-32 of zlib (and of Python's zlib.crc32), continued from `crc`.
uint32_t crc32(const uint8_t * data, size_t n, uint32_t crc = 0);

}  // namespace lmsp
