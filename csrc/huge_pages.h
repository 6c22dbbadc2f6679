// Transparent huge pages under the weights the engine reads into memory.
//
// A decode step reads every weight once, a stream of the whole model. On
// pages of 4 KiB the CPU walks the page tables again every 4 KiB of it; a
// huge page (2 MiB on x86-64, and on ARM with 4 KiB pages) takes one TLB
// entry for 512 of them. llama.cpp's own tools read a model through a file
// mapping, with a page table entry for every 4 KiB.
//
// The weights are read before any of this runs, so their memory is made of
// small pages. MADV_HUGEPAGE marks it for huge pages from then on, and
// MADV_COLLAPSE (Linux 6.1) copies each whole huge page of it into one. A
// collapse may wait for the kernel to compact memory into a free huge page
// (tenths of a second for 256 MiB on a VM whose memory is fragmented), so it
// runs on a thread of its own at the lowest priority, paced, while the
// engine serves: its steps speed up as the pages collapse. On a kernel
// before 6.1 khugepaged collapses the marked memory in its own time. A system
// whose transparent huge pages are off ("never") is left as it is.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace lmsp {

// The size of a huge page of anonymous memory (the PMD size), or 0 where
// transparent huge pages are off or unknown (not Linux, no sysfs entry).
size_t huge_page_size();

// Huge pages for some ranges of memory: each marked at construction, its
// whole pages of `page` bytes collapsed on the object's thread. The ranges
// must outlive the thread: stop() (or the destructor) ends it after the page
// it is on.
class HugePageCollapse {
public:
    HugePageCollapse(const std::vector<std::pair<void *, size_t>> & ranges, size_t page);
    ~HugePageCollapse() { stop(); }
    HugePageCollapse(const HugePageCollapse &) = delete;
    HugePageCollapse & operator=(const HugePageCollapse &) = delete;

    // The bytes collapsed into huge pages so far.
    size_t bytes() const { return bytes_.load(); }
    // Whether the thread still has pages to collapse.
    bool pending() const { return !done_.load(); }
    void stop();

private:
    void run();

    size_t page_;
    std::vector<char *> pages_;  // the start of each whole page to collapse
    std::atomic<size_t> bytes_{0};
    std::atomic<bool> done_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;  // under mu_
    std::thread thread_;
};

}  // namespace lmsp
