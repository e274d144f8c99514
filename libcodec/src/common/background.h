// One background thread that runs jobs one at a time, in order: an output's write(2) of one
// buffer runs there while the caller fills the next (OutputFile::write_behind).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "gift/gift.h"

namespace gift {

class BackgroundJob {
 public:
  BackgroundJob() = default;
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;
  // Waits for the job in progress, then ends the thread.
  ~BackgroundJob();

  // Waits for the job before, then starts `job` unless that one failed: then its result, with
  // its message raised again on this thread, and `job` is not run. The thread starts with the
  // first job, with every signal blocked (they go to the caller's threads, as before it).
  giftResult_t start(std::function<giftResult_t()> job);
  // Waits for the job in progress: its result, as start gives it. A failure is reported once.
  giftResult_t wait();
  // Whether a job has started and wait() has not returned since.
  bool busy() const { return pending_; }

 private:
  void run();

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<giftResult_t()> job_;  // set: queued or running
  bool pending_ = false;               // a job started and not yet waited for
  bool stop_ = false;
  giftResult_t result_ = GIFT_OK;
  std::string message_;
};

}  // namespace gift
