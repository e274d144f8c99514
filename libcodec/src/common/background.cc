#include "common/background.h"

#include <signal.h>
#include <sys/prctl.h>
#include <time.h>

#include <atomic>
#include <chrono>

#include "common/error.h"
#include "common/processors.h"

namespace gift {
namespace {

// The thread's own stack: its jobs are write(2) calls, checksums (XXH3's state lives on the
// heap) and messages, and a default 8 MiB stack counts against RLIMIT_DATA, which callers
// bound memory with.
constexpr size_t kStackBytes = size_t(256) << 10;

std::atomic<bool> threads_allowed{true};  // set_background_threads_for_test
thread_local bool background_thread = false;

// Each side of a job polls for the other for up to kPoll before it sleeps on the condition
// variable: the caller for the job's end (wait), the thread for the next job. Waking a thread
// blocked in a futex takes tens of microseconds on a virtual machine, and a pipeline of jobs
// that each write a few hundred KiB (about 100 us) paid it twice per job on its slower side.
// A poll that runs out turns that side's polling off for the next kPollsOff waits: the other
// side is the slower one, or shares this side's processor with it or another process, where
// polling holds back what it waits for. giftc decode --threads 1 of a 512 MiB fp32 dump in
// 512 KiB bands, Zen 4 VM, medians of 7 to 9 interleaved rounds, each pair from one run:
// - polling always: 0.161 s, against 0.233 s sleeping at once (cp of the dump 0.17 s);
// - with another process busy on one of the 2 processors, polling always took 0.50 s, against
//   0.19 s;
// - this way: 0.171 s against 0.249 s (cp 0.176 s), and busy 0.241 s against 0.232 s.
// Never where the process has one processor.
constexpr auto kPoll = std::chrono::microseconds(200);
constexpr unsigned kPollsOff = 64;

// Whether ready() held within kPoll.
template <typename Ready>
bool poll_until(Ready ready) {
  const auto end = std::chrono::steady_clock::now() + kPoll;
  for (unsigned k = 1; !ready(); ++k) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
    if (k % 64 == 0 && std::chrono::steady_clock::now() > end) return false;
  }
  return true;
}

// Past its poll, the thread naps (kNap at a time) for up to kNaps before it sleeps on the
// condition variable. A job started while it naps costs the caller no futex wake, since the
// condition variable has no waiter; where the thread is the faster side, as it is for encode's
// codes, a nap's delay comes out of its slack. giftc encode --threads 1 of a 512 MiB bf16 dump
// (Zen 4 VM: 1 MiB of codes a band every 0.45 ms, written in 0.25 ms, so the poll runs out and
// goes off) woke the thread 250 times, 5.6% of the encoding thread's time in the kernel's
// wake-up path. The caller does not nap: where it waits, the thread is the slower side
// (decode's output), and a nap's delay would be the thread's, left without a job.
// A nap that takes over kNapLate (another thread or process held the processor) turns naps off
// as a poll that runs out does; naps that run out without a job do not (a gap past kNaps, at a
// tensor's end say, tells nothing of their cost). Where every processor is busy, a nap's
// wake-up may take the processor from the caller: with another process busy on one of the 2
// processors, napping on took 170.1 ms against 160.1 sleeping at once; with this rule, 175.8
// against 176.6 (medians of 9 interleaved rounds). Late naps are not only that case's (a few a
// run on an idle VM too: 10% of the naps idle, 7% busy, in one run each), so the rule keeps
// naps on for part of a run. Idle, medians of 15 interleaved rounds: 126.9 ms sleeping at
// once, 120.9 napping (cp 148.0 ms). Identical binaries differ by up to 5% in such medians on
// this VM, so these say less than they seem to: the README has this release's encode against
// the last with that control. A nap of 20 us takes about 45 us there, with the thread's timer
// slack at kNapSlackNs (the default 50 us made it 90 us).
constexpr auto kNap = std::chrono::microseconds(20);
constexpr auto kNapLate = 10 * kNap;
constexpr auto kNaps = std::chrono::milliseconds(1);
constexpr unsigned long kNapSlackNs = 1000;

// Naps until ready() holds (true), kNaps pass or a nap runs late (false; *late says which).
template <typename Ready>
bool nap_until(Ready ready, bool* late) {
  const timespec nap{0, std::chrono::nanoseconds(kNap).count()};
  auto t = std::chrono::steady_clock::now();
  const auto end = t + kNaps;
  *late = false;
  while (!ready()) {
    if (t > end) return false;
    nanosleep(&nap, nullptr);
    const auto woke = std::chrono::steady_clock::now();
    if ((*late = woke - t > kNapLate)) return false;
    t = woke;
  }
  return true;
}

}  // namespace

template <typename Ready>
void BackgroundJob::Poll::until(Ready ready) {
  static const bool kTwoProcessors = processors() > 1;
  if (!kTwoProcessors) return;
  if (off) {
    --off;
  } else if (poll_until(ready)) {
    return;
  } else {
    off = kPollsOff;
  }
  if (!naps) return;
  bool late = false;
  if (naps_off) {
    --naps_off;
  } else if (!nap_until(ready, &late) && late) {
    naps_off = kPollsOff;
  }
}

void set_background_threads_for_test(bool allowed) { threads_allowed.store(allowed); }

bool on_background_thread() { return background_thread; }

BackgroundJob::~BackgroundJob() {
  if (!started_) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !job_; });
    stop_ = true;
  }
  changed_.notify_all();
  pthread_join(thread_, nullptr);
}

giftResult_t BackgroundJob::start(std::function<giftResult_t()> job) {
  if (const giftResult_t r = wait()) return r;
  if (!started_ && !inline_) {
    // Created with every signal blocked, so the thread inherits that mask: SIGINT and the
    // like still reach the threads that handled them before, and a handler never runs here.
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    pthread_attr_t attr;
    if (threads_allowed.load(std::memory_order_relaxed) && pthread_attr_init(&attr) == 0) {
      started_ = pthread_attr_setstacksize(&attr, kStackBytes) == 0 &&
                 pthread_create(&thread_, &attr, &BackgroundJob::run, this) == 0;
      pthread_attr_destroy(&attr);
      // Named, so that top -H, gdb and giftc's tests tell it from the codec's threads.
      if (started_) pthread_setname_np(thread_, "gift-write");
    }
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    inline_ = !started_;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ = true;
    if (inline_) {
      finish(job());
      return GIFT_OK;
    }
    job_ = std::move(job);
    busy_.store(true, std::memory_order_release);
  }
  changed_.notify_all();  // unlocked: the thread woken does not block on the mutex at once
  return GIFT_OK;
}

giftResult_t BackgroundJob::wait() {
  if (!pending_) return GIFT_OK;
  caller_poll_.until([&] { return !busy_.load(std::memory_order_acquire); });
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !job_; });
  pending_ = false;
  const giftResult_t r = result_;
  result_ = GIFT_OK;
  if (r) return fail(r, "%s", message_.c_str());
  return GIFT_OK;
}

void BackgroundJob::finish(giftResult_t r) {
  result_ = r;
  message_ = r ? last_message() : "";
  job_ = nullptr;
  busy_.store(false, std::memory_order_release);
}

void* BackgroundJob::run(void* self) {
  background_thread = true;
  (void)prctl(PR_SET_TIMERSLACK, kNapSlackNs, 0UL, 0UL, 0UL);  // this thread's own; may fail
  BackgroundJob& b = *static_cast<BackgroundJob*>(self);
  const auto ready = [&] { return b.busy_.load(std::memory_order_acquire) || b.stop_.load(); };
  std::unique_lock<std::mutex> lock(b.mutex_, std::defer_lock);
  Poll poll;
  poll.naps = true;
  for (;;) {
    if (!ready()) poll.until(ready);
    lock.lock();
    b.changed_.wait(lock, [&] { return b.job_ || b.stop_; });
    if (!b.job_) return nullptr;  // stopped
    lock.unlock();
    const giftResult_t r = b.job_();
    lock.lock();
    b.finish(r);  // last_message() is this thread's own
    lock.unlock();
    b.changed_.notify_all();  // unlocked, as in start()
  }
}

}  // namespace gift
