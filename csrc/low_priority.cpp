#include "low_priority.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <thread>

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#endif

namespace lmsp {

namespace {

// The worker: a queue of jobs and the thread that runs them. It is never
// destroyed (a static std::thread still running at exit would terminate the
// process); a forked child, which has no copy of the thread, makes its own.
class Worker {
public:
    Worker() : pid_(getpid()) {
        std::thread([this] { loop(); }).detach();
    }

    void run(const std::function<void()> & job) {
        std::packaged_task<void()> task(job);
        std::future<void> done = task.get_future();
        {
            std::lock_guard<std::mutex> lk(mu_);
            jobs_.push_back(std::move(task));
        }
        cv_.notify_one();
        done.get();
    }

    pid_t pid() const { return pid_; }
    int nice() const { return nice_; }

private:
    void loop() {
        nice_ = lower_this_thread();
        for (;;) {
            std::packaged_task<void()> task;
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [this] { return !jobs_.empty(); });
                task = std::move(jobs_.front());
                jobs_.pop_front();
            }
            task();  // its exception goes to its future
        }
    }

    const pid_t pid_;
    int nice_ = -100;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::packaged_task<void()>> jobs_;
};

std::mutex g_mu;
Worker * g_worker = nullptr;

Worker & worker() {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_worker == nullptr || g_worker->pid() != getpid()) g_worker = new Worker();  // a parent's is left as is
    return *g_worker;
}

using Clock = std::chrono::steady_clock;

// This thread's CPU time.
Clock::duration thread_cpu() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                       std::chrono::nanoseconds(ts.tv_nsec));
}

// Slicing by 8: eight tables of the reflected polynomial 0xEDB88320.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
    Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1U) != 0 ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
        for (size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFU];
    }
    return t;
}

const Tables & tables() {
    static const Tables t = make_tables();
    return t;
}

}  // namespace

void run_low_priority(const std::function<void()> & job) { worker().run(job); }

void paced(size_t n, const std::function<void(size_t, size_t)> & piece) {
    const size_t pieces = (n + kPaceBytes - 1) / kPaceBytes;
    paced_pieces(
        pieces, [&](size_t i) { piece(i * kPaceBytes, std::min(kPaceBytes, n - i * kPaceBytes)); },
        [](Clock::duration d) {
            std::this_thread::sleep_for(d);
            return true;
        });
}

void paced_pieces(size_t n, const std::function<void(size_t)> & piece,
                  const std::function<bool(Clock::duration)> & rest) {
    const Clock::duration credit = -std::chrono::duration_cast<Clock::duration>(kPaceCredit);
    Clock::duration owed{};  // rest still due; below zero, time off the core beyond it
    Clock::time_point last = Clock::now();
    for (size_t i = 0; i < n; ++i) {
        const Clock::time_point start = Clock::now();
        owed = std::max(owed - (start - last), credit);  // asleep, or waiting for a core
        const Clock::duration cpu = thread_cpu();
        piece(i);
        const Clock::duration used = thread_cpu() - cpu;
        last = Clock::now();
        owed = std::max(owed + used * kPaceRest - ((last - start) - used), credit);  // less the time preempted
        if (owed > Clock::duration::zero() && i + 1 < n && !rest(owed)) return;
    }
}

int lower_this_thread() {
#if defined(__linux__)
    const auto tid = id_t(syscall(SYS_gettid));
    if (setpriority(PRIO_PROCESS, tid, kLowPriorityNice) == 0) return getpriority(PRIO_PROCESS, tid);
#endif
    return -100;
}

int low_priority_nice() {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_worker != nullptr && g_worker->pid() == getpid() ? g_worker->nice() : -100;
}

uint32_t crc32(const uint8_t * data, size_t n, uint32_t crc) {
    const Tables & t = tables();
    uint32_t c = ~crc;
    while (n >= 8) {
        const uint32_t lo = c ^ (uint32_t(data[0]) | uint32_t(data[1]) << 8 | uint32_t(data[2]) << 16 |
                                 uint32_t(data[3]) << 24);
        const uint32_t hi = uint32_t(data[4]) | uint32_t(data[5]) << 8 | uint32_t(data[6]) << 16 |
                            uint32_t(data[7]) << 24;
        c = t[7][lo & 0xFFU] ^ t[6][(lo >> 8) & 0xFFU] ^ t[5][(lo >> 16) & 0xFFU] ^ t[4][lo >> 24] ^ t[3][hi & 0xFFU] ^
            t[2][(hi >> 8) & 0xFFU] ^ t[1][(hi >> 16) & 0xFFU] ^ t[0][hi >> 24];
        data += 8;
        n -= 8;
    }
    while (n-- > 0) c = t[0][(c ^ *data++) & 0xFFU] ^ (c >> 8);
    return ~c;
}

}  // namespace lmsp
