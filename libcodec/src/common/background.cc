#include "common/background.h"

#include <signal.h>

#include <atomic>

#include "common/error.h"

namespace gift {
namespace {

// The thread's own stack: its jobs are write(2) calls, checksums (XXH3's state lives on the
// heap) and messages, and a default 8 MiB stack counts against RLIMIT_DATA, which callers
// bound memory with.
constexpr size_t kStackBytes = size_t(256) << 10;

std::atomic<bool> threads_allowed{true};  // set_background_threads_for_test
thread_local bool background_thread = false;

}  // namespace

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
  std::lock_guard<std::mutex> lock(mutex_);
  pending_ = true;
  if (inline_) {
    finish(job());
    return GIFT_OK;
  }
  job_ = std::move(job);
  changed_.notify_all();
  return GIFT_OK;
}

giftResult_t BackgroundJob::wait() {
  if (!pending_) return GIFT_OK;
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
}

void* BackgroundJob::run(void* self) {
  background_thread = true;
  BackgroundJob& b = *static_cast<BackgroundJob*>(self);
  std::unique_lock<std::mutex> lock(b.mutex_);
  for (;;) {
    b.changed_.wait(lock, [&] { return b.job_ || b.stop_; });
    if (!b.job_) return nullptr;  // stopped
    lock.unlock();
    const giftResult_t r = b.job_();
    lock.lock();
    b.finish(r);  // last_message() is this thread's own
    b.changed_.notify_all();
  }
}

}  // namespace gift
