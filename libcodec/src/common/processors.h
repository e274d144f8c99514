// How many processors this process may keep busy: its CPU affinity, and the CPU quota of its
// cgroup. OpenMP runtimes count the first only, so in a container limited to 2 CPUs of a
// 64-processor host they start 64 threads, which the quota then stops for most of each
// period, and every parallel loop waits for the last of them.
#pragma once

#include <string>

namespace gift {

// The CPU limit the cgroups of this process set: the lowest ceil(quota / period) from its
// cgroup up to the root of the hierarchy as mounted (cgroup v1's cpu controller,
// cpu.cfs_quota_us and cpu.cfs_period_us; cgroup v2's cpu.max), at least 1; 0 where no quota
// is set or none can be read (a cgroup outside the mounted part of its hierarchy included). Every
// path it reads (/proc/self/cgroup, /proc/self/mountinfo and the cgroup files) is prefixed with
// `root`: "" for this machine, a folder in tests.
int cgroup_cpu_limit(const std::string& root);

// omp_get_num_procs(), capped at cgroup_cpu_limit("") where that is set (the cgroup files are
// read once, at the first call).
int processors();

}  // namespace gift
