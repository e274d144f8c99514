// The benchmarks' peak memory: this process's peak resident set so far.
#pragma once

#include <sys/resource.h>

// In MiB (Linux counts ru_maxrss in KiB).
inline double process_peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}
