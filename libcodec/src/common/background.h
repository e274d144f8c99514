// One background thread that runs jobs one at a time, in order: an output's write(2) of one
// buffer runs there while the caller fills the next (OutputFile::write_behind).
#pragma once

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "gift/gift.h"

namespace gift {

// Tests reach the path where no thread can be had: with false, jobs of BackgroundJobs that
// have not started a thread yet run on the caller's thread.
void set_background_threads_for_test(bool allowed);

// Whether the calling thread is a BackgroundJob's own (every signal blocked there), not a
// caller running a job itself.
bool on_background_thread();

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
  // Where no thread can be had, every job runs here, and its result still comes from wait().
  giftResult_t start(std::function<giftResult_t()> job);
  // Waits for the job in progress: its result, as start gives it. A failure is reported once.
  giftResult_t wait();

 private:
  // A side's polling for the other before it sleeps (background.cc says why): on until a
  // poll runs out, then off for some waits. The thread's side naps after its poll
  // (Poll::naps), off for some waits after a nap that ran late.
  struct Poll {
    unsigned off = 0;       // waits left that sleep at once
    unsigned naps_off = 0;  // waits left that sleep without napping first
    bool naps = false;
    template <typename Ready>
    void until(Ready ready);
  };

  static void* run(void* self);
  void finish(giftResult_t r);  // with mutex_ held

  pthread_t thread_{};
  bool started_ = false, inline_ = false;  // a thread runs the jobs; none could be had
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<giftResult_t()> job_;  // set: queued or running
  std::atomic<bool> busy_{false};      // bool(job_), read without mutex_ while polling
  bool pending_ = false;               // a job started and not yet waited for
  Poll caller_poll_;                   // wait()'s
  std::atomic<bool> stop_{false};
  giftResult_t result_ = GIFT_OK;
  std::string message_;
};

}  // namespace gift
