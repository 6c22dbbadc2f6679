// Transparent huge pages under the weights the engine reads into memory.
//
// A decode step reads every weight once, a stream of the whole model. On
// pages of 4 KiB the CPU walks the page tables again every 4 KiB of it; a
// huge page (2 MiB on x86-64, and on ARM with 4 KiB pages) takes one TLB
// entry for 512 of them. llama.cpp's own tools read a model through a file
// mapping, whose pages are the page cache's 4 KiB ones.
//
// The weights are read before any of this runs, so their memory is made of
// small pages; MADV_COLLAPSE (Linux 6.1) copies each whole huge page of it
// into one at once, and MADV_HUGEPAGE asks khugepaged to do the same later
// where that could not be done now (an older kernel, no free huge page). A
// system whose transparent huge pages are off ("never") is left as it is.
#pragma once

#include <cstddef>

namespace lmsp {

// The size of a huge page of anonymous memory (the PMD size), or 0 where
// transparent huge pages are off or unknown (not Linux, no sysfs entry).
size_t huge_page_size();

// Asks for huge pages under [base, base + size): the whole pages of `page`
// bytes within it, now and from then on. Returns the bytes that are huge
// pages now (a multiple of `page`; 0 where `page` is 0).
size_t back_with_huge_pages(void * base, size_t size, size_t page);

}  // namespace lmsp
