#include "common/processors.h"

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <exception>
#include <fstream>
#include <vector>

namespace gift {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t next; (next = s.find(sep, at)) != std::string::npos; at = next + 1)
    out.push_back(s.substr(at, next - at));
  out.push_back(s.substr(at));
  return out;
}

bool has(const std::vector<std::string>& list, const char* item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// mountinfo writes a space, tab, newline or backslash in a path as \ooo.
std::string unescape(const std::string& s) {
  const auto octal = [&](size_t i) { return i < s.size() && s[i] >= '0' && s[i] <= '7'; };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// ceil(quota / period) of one cgroup's folder; 0 where it sets no quota or cannot be read.
uint64_t limit_of(const std::string& dir, bool v2) {
  std::string quota_text;
  uint64_t period = 0;
  if (v2) {
    std::ifstream f(dir + "/cpu.max");  // "max 100000" or "150000 100000"
    if (!(f >> quota_text >> period)) return 0;
  } else {
    std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");  // -1: none
    if (!(q >> quota_text) || !(p >> period)) return 0;
  }
  if (quota_text.empty() || quota_text.find_first_not_of("0123456789") != std::string::npos ||
      quota_text.size() > 18 || period == 0)
    return 0;
  const uint64_t quota = std::stoull(quota_text);
  return quota / period + (quota % period != 0);
}

}  // namespace

int cgroup_cpu_limit(const std::string& root) try {
  // This process's cgroup in the hierarchy that holds cgroup v1's cpu controller, and in the
  // unified one ("0::"); on a hybrid system both appear, and only the one with the controller
  // has the files.
  std::string v1_path, v2_path;
  std::ifstream cgroups(root + "/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos || line.compare(b + 1, 1, "/") != 0)
      continue;  // the kernel writes absolute paths
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    // A cgroup outside the cgroup namespace's root reads "/..": not below any folder this
    // process sees, so its quota is unknown here.
    if (has(split(path, '/'), "..")) continue;
    if (line.compare(0, a, "0") == 0 && controllers.empty()) v2_path = path;
    if (has(split(controllers, ','), "cpu")) v1_path = path;
  }

  uint64_t limit = 0;
  std::ifstream mounts(root + "/proc/self/mountinfo");
  for (std::string line; std::getline(mounts, line);) {
    // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
    const std::vector<std::string> f = split(line, ' ');
    const auto dash = std::find(f.begin() + std::min<size_t>(f.size(), 6), f.end(), "-");
    if (f.end() - dash < 4) continue;
    const bool v2 = dash[1] == "cgroup2" && !v2_path.empty();
    const bool v1 = dash[1] == "cgroup" && has(split(dash[3], ','), "cpu") && !v1_path.empty();
    if (!v1 && !v2) continue;
    // The cgroup's folder under the mount: its path less the mount's root, which a container
    // without its own cgroup namespace sees as its cgroup; a cgroup outside it is not there
    // (nor is any where a namespace did not mount cgroupfs again: its mounts' root is "/..").
    const std::string& path = v2 ? v2_path : v1_path;
    const std::string mount_root = unescape(f[3]), mount_point = root + unescape(f[4]);
    std::string rel;
    if (mount_root == "/") {
      rel = path;
    } else if (path == mount_root ||
               path.compare(0, mount_root.size() + 1, mount_root + "/") == 0) {
      rel = path.substr(mount_root.size());
    } else {
      continue;
    }
    // A quota limits the cgroups below it too: the lowest from this one up to the mount (rel
    // is empty or starts with '/').
    for (;;) {
      const uint64_t l = limit_of(mount_point + rel, v2);
      if (l > 0) limit = limit > 0 ? std::min(limit, l) : l;
      if (rel.empty() || rel == "/") break;
      rel.resize(rel.rfind('/'));
    }
  }
  return static_cast<int>(std::min<uint64_t>(limit, INT_MAX));
} catch (const std::exception&) {  // std::bad_alloc: no limit known, as for unreadable files
  return 0;
}

int processors() {
  static const int limit = cgroup_cpu_limit("");
  // omp_get_num_procs() asks the kernel for the calling thread's affinity mask (a system
  // call), and a frame's every tensor asks a few times: 10% of giftc encode's time for
  // 200,000 tensors of 4 x 4. Each thread keeps its own answer (threads may be pinned apart)
  // for kAffinityNanos, so that a new affinity is still seen that soon.
  constexpr int64_t kAffinityNanos = 50'000'000;
  thread_local int64_t until = INT64_MIN;
  thread_local int procs = 1;
  timespec now;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);  // no system call (vDSO)
  const int64_t t = int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  if (t >= until) {
    procs = std::max(1, omp_get_num_procs());
    until = t + kAffinityNanos;
  }
  return limit > 0 ? std::min(procs, limit) : procs;
}

}  // namespace gift
