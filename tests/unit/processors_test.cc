// The processors a process may keep busy: cgroup CPU quotas read from fake /proc and cgroup
// trees laid out as the kernel writes them (cgroup v2 with and without a cgroup namespace,
// v1 in a hybrid layout as Docker's), and the public getters built on them.
#include "common/processors.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "gift/gift.h"

namespace {

// A folder standing for "/": put() writes a file under it, making the folders on its way.
class FakeRoot {
 public:
  FakeRoot() {
    char tmpl[] = "/tmp/gift-procs-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    dir_ = d ? d : "/nonexistent";
  }
  ~FakeRoot() { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  const std::string& dir() const { return dir_; }
  void put(const std::string& path, const std::string& text) const {
    for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
      ASSERT_TRUE(::mkdir((dir_ + path.substr(0, at)).c_str(), 0755) == 0 || errno == EEXIST);
    std::ofstream(dir_ + path) << text;
  }
  int limit() const { return gift::cgroup_cpu_limit(dir_); }

 private:
  std::string dir_;
};

// A cgroup v2 system: cgroupfs at /sys/fs/cgroup, its root the hierarchy's (a host's, or a
// container's own cgroup namespace's).
constexpr const char* kV2Mounts =
    "25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

TEST(Processors, CgroupV2QuotaIsRoundedUp) {
  FakeRoot r;
  r.put("/proc/self/cgroup", "0::/\n");
  r.put("/proc/self/mountinfo", kV2Mounts);
  r.put("/sys/fs/cgroup/cpu.max", "150000 100000\n");
  EXPECT_EQ(r.limit(), 2);
  r.put("/sys/fs/cgroup/cpu.max", "50000 100000\n");  // half a processor still gets one
  EXPECT_EQ(r.limit(), 1);
  r.put("/sys/fs/cgroup/cpu.max", "400000 100000\n");
  EXPECT_EQ(r.limit(), 4);
  r.put("/sys/fs/cgroup/cpu.max", "max 100000\n");
  EXPECT_EQ(r.limit(), 0);
}

TEST(Processors, TheLowestQuotaOnTheWayUpHolds) {
  FakeRoot r;
  r.put("/proc/self/cgroup", "0::/kubepods/pod1/c1\n");
  r.put("/proc/self/mountinfo", kV2Mounts);
  r.put("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n");
  r.put("/sys/fs/cgroup/kubepods/pod1/cpu.max", "300000 100000\n");
  r.put("/sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
  EXPECT_EQ(r.limit(), 3);
  r.put("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "800000 100000\n");
  EXPECT_EQ(r.limit(), 3);
  r.put("/sys/fs/cgroup/kubepods/cpu.max", "100000 100000\n");
  EXPECT_EQ(r.limit(), 1);
  r.put("/sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
  r.put("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "200000 100000\n");
  EXPECT_EQ(r.limit(), 2);  // the cgroup's own, below its parent's 3
}

// Docker on a hybrid host without a cgroup namespace: the cpu controller in a v1 hierarchy
// mounted at the container's own cgroup (the mount's root), beside a unified hierarchy.
TEST(Processors, CgroupV1QuotaUnderTheMountsRoot) {
  FakeRoot r;
  r.put("/proc/self/cgroup",
        "12:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
        "0::/docker/abc\n");
  r.put("/proc/self/mountinfo",
        "40 31 0:37 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime "
        "master:17 - cgroup cgroup rw,cpu,cpuacct\n"
        "41 31 0:38 /docker/abc /sys/fs/cgroup/memory ro,nosuid master:18 - cgroup cgroup "
        "rw,memory\n"
        "42 31 0:39 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw\n");
  r.put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n");
  r.put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  r.put("/sys/fs/cgroup/memory/cpu.cfs_quota_us", "50000\n");  // not the cpu controller's
  r.put("/sys/fs/cgroup/memory/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(r.limit(), 2);
  r.put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(r.limit(), 0);
}

TEST(Processors, MountPointsAreUnescaped) {
  FakeRoot r;
  r.put("/proc/self/cgroup", "0::/a\n");
  r.put("/proc/self/mountinfo", "30 25 0:26 / /cg\\040root rw shared:4 - cgroup2 cgroup2 rw\n");
  r.put("/cg root/a/cpu.max", "250000 100000\n");
  EXPECT_EQ(r.limit(), 3);
}

TEST(Processors, ACgroupOutsideTheMountIsNotRead) {
  FakeRoot r;
  r.put("/proc/self/cgroup", "0::/other\n");
  r.put("/proc/self/mountinfo", "30 25 0:26 /mine /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  r.put("/sys/fs/cgroup/cpu.max", "100000 100000\n");
  EXPECT_EQ(r.limit(), 0);
  r.put("/proc/self/cgroup", "0::/mine/job\n");  // under the mount's root: its folder "job"
  r.put("/sys/fs/cgroup/cpu.max", "300000 100000\n");
  r.put("/sys/fs/cgroup/job/cpu.max", "200000 100000\n");
  EXPECT_EQ(r.limit(), 2);
}

// A process outside its cgroup namespace's root (moved there after the namespace was made, or
// entered with nsenter without its cgroup) reads "/.." and below: no folder it sees is its
// cgroup or above it, so the namespace root's quota is not its own.
TEST(Processors, ACgroupAboveTheNamespacesRootIsNotRead) {
  FakeRoot r;
  r.put("/proc/self/mountinfo", kV2Mounts);
  r.put("/sys/fs/cgroup/cpu.max", "100000 100000\n");
  r.put("/sys/fs/cgroup/user.slice/x/cpu.max", "200000 100000\n");
  for (const char* path : {"0::/..\n", "0::/../../user.slice/x\n", "0::/a/../..\n"}) {
    r.put("/proc/self/cgroup", path);
    EXPECT_EQ(r.limit(), 0) << path;
  }
  r.put("/proc/self/cgroup", "0::/user.slice/x\n");
  EXPECT_EQ(r.limit(), 1);
}

TEST(Processors, NothingReadableOrDamagedFilesMeanNoLimit) {
  FakeRoot r;
  EXPECT_EQ(r.limit(), 0);  // no /proc at all
  r.put("/proc/self/cgroup", "0::/\n");
  EXPECT_EQ(r.limit(), 0);  // no mountinfo
  r.put("/proc/self/mountinfo",
        "garbage\n\n30 25 0:26 / /sys/fs/cgroup rw - cgroup2\n-\n"  // too few fields
        "30 25 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n");
  EXPECT_EQ(r.limit(), 0);  // no cpu.max
  for (const char* text : {"", "abc 100000", "100000", "100000 0", "100000 abc", "-5 100000",
                           "99999999999999999999999 100000", "1.5 100000"}) {
    r.put("/sys/fs/cgroup/cpu.max", text);
    EXPECT_EQ(r.limit(), 0) << "cpu.max: " << text;
  }
  r.put("/sys/fs/cgroup/cpu.max", "100000 100000");
  EXPECT_EQ(r.limit(), 1);
  r.put("/proc/self/cgroup", "0::relative/path\n");  // not as the kernel writes it
  EXPECT_EQ(r.limit(), 0);
}

TEST(Processors, ThreadCountsAreCappedAtTheProcessors) {
  const int procs = giftProcessors();
  EXPECT_EQ(procs, gift::processors());
  EXPECT_GE(procs, 1);
  EXPECT_LE(procs, omp_get_num_procs());
  const int limit = gift::cgroup_cpu_limit("");
  if (limit > 0) {
    EXPECT_LE(procs, limit);
  }
  giftCtx* raw = nullptr;
  ASSERT_EQ(giftCtxCreate(&raw), GIFT_OK);
  const std::unique_ptr<giftCtx, decltype(&giftCtxFree)> ctx(raw, giftCtxFree);
  EXPECT_EQ(giftCtxThreads(ctx.get()),
            std::min({omp_get_max_threads(), procs, omp_get_thread_limit()}));
  EXPECT_EQ(giftCtxThreads(nullptr), giftCtxThreads(ctx.get()));
  ASSERT_EQ(giftCtxSetThreads(ctx.get(), 1), GIFT_OK);
  EXPECT_EQ(giftCtxThreads(ctx.get()), 1);
  ASSERT_EQ(giftCtxSetThreads(ctx.get(), 100000), GIFT_OK);
  EXPECT_EQ(giftCtxThreads(ctx.get()), std::min(procs, omp_get_thread_limit()));
}

// Each thread's own count, as its OpenMP runtime gives it to that thread: libgomp counts the
// calling thread's affinity (a thread pinned to one processor, 1), LLVM's libomp and libgomp
// under OMP_PLACES or OMP_PROC_BIND the process's. A count kept for the whole process gave the
// pinned thread the one another thread had just taken (2 under libgomp).
TEST(Processors, EachThreadCountsAsItsRuntimeDoesForIt) {
  const int limit = gift::cgroup_cpu_limit("");
  const auto capped = [limit](int n) { return limit > 0 ? std::min(n, limit) : n; };
  const int procs = giftProcessors();
  EXPECT_EQ(procs, capped(std::max(1, omp_get_num_procs())));
  int pinned = 0, runtime = 0;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    pinned = giftProcessors();
    runtime = capped(std::max(1, omp_get_num_procs()));
  });
  t.join();
  EXPECT_EQ(pinned, runtime);
  EXPECT_EQ(giftProcessors(), procs);
}

// Inside a parallel region of two threads where the runtime allows no nested one, a call's
// regions get teams of one, and giftCtxThreads says so.
TEST(Processors, ANestedCallCountsTheOneThreadItGets) {
  const int levels = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  int inside[2] = {0, 0}, team[2] = {0, 0};
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    inside[t] = giftCtxThreads(nullptr);
#pragma omp parallel num_threads(4)
#pragma omp single
    team[t] = omp_get_num_threads();
  }
  omp_set_max_active_levels(levels);
  if (team[1] == 0) GTEST_SKIP() << "the runtime gave the outer region one thread";
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(team[t], 1);
    EXPECT_EQ(inside[t], 1);
  }
}

}  // namespace
