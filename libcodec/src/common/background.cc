#include "common/background.h"

#include <pthread.h>
#include <signal.h>

#include "common/error.h"

namespace gift {

BackgroundJob::~BackgroundJob() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !job_; });
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

giftResult_t BackgroundJob::start(std::function<giftResult_t()> job) {
  if (const giftResult_t r = wait()) return r;
  if (!thread_.joinable()) {
    // Created with every signal blocked, so the thread inherits that mask: SIGINT and the
    // like still reach the threads that handled them before, and a handler never runs here.
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    try {
      thread_ = std::thread([this] { run(); });
    } catch (...) {
      pthread_sigmask(SIG_SETMASK, &before, nullptr);
      return job();  // no thread to be had: the job runs here
    }
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    pending_ = true;
  }
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

void BackgroundJob::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return job_ || stop_; });
    if (!job_) return;  // stopped
    lock.unlock();
    const giftResult_t r = job_();
    const std::string message = r ? last_message() : "";
    lock.lock();
    result_ = r;
    message_ = message;
    job_ = nullptr;
    changed_.notify_all();
  }
}

}  // namespace gift
