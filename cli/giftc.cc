// giftc: FP8 gradient compression on the command line. One subcommand per file.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "commands.h"

namespace {

// Inputs are memory-mapped: a file truncated by another process while giftc reads it raises
// SIGBUS on the vanished pages. That is an I/O error like any other, reported as one; the
// output, still unnamed, disappears with the process (or its temporary name is removed).
extern "C" void input_vanished(int) {
  // Every thread reading the vanished pages faults: one reports, the others wait for its exit.
  static std::atomic_flag reported = ATOMIC_FLAG_INIT;
  if (reported.test_and_set()) {
    for (;;) ::pause();
  }
  static const char msg[] =
      "giftc: an input file shrank while it was being read (it is memory-mapped); nothing "
      "was written\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
  giftRemoveTemporaryFiles();
  ::_exit(giftc::kIoError);
}

// Interrupted or told to stop: an output still under a temporary name (file systems without
// unnamed files) is removed, then the signal ends the process as it would have (SA_RESETHAND;
// raised again, it is delivered when this returns).
extern "C" void stopped(int sig) {
  giftRemoveTemporaryFiles();
  ::raise(sig);
}

// Signals that a shell left ignored (nohup, a background job) stay ignored.
void on_stop_signals() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    struct sigaction old = {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    struct sigaction act = {};
    act.sa_handler = stopped;
    act.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &act, nullptr);
  }
}

// Text on standard output (inspect, compare, bench, help) that did not all reach it, on a full
// disk say, fails the command as any other write does, rather than ending it silently cut.
int with_stdout_flushed(int rc) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (rc != giftc::kOk || (flushed && !std::ferror(stdout) && !std::cout.fail())) return rc;
  std::fprintf(stderr, "giftc: standard output: write failed%s%s\n", err ? ": " : "",
               err ? std::strerror(err) : "");
  return giftc::kIoError;
}

// A standard stream the caller closed (2>&-) is held by /dev/null, opened for the other
// direction: no file giftc opens takes its number (with stderr closed, encode's scratch file
// became fd 2 and took a warning into the frame; with stdout closed, encode -c wrote the frame
// into its scratch file and exited 0), and using it fails as on the closed stream (EBADF).
void hold_closed_standard_streams() {
  for (const int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int held = ::open("/dev/null", (fd == STDIN_FILENO ? O_WRONLY : O_RDONLY) | O_CLOEXEC);
    if (held != fd) ::_exit(giftc::kIoError);  // the lowest free number: fd, or no /dev/null
  }
}

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  hold_closed_standard_streams();
  return with_stdout_flushed(run(argc, argv));
}

namespace {

int run(int argc, char** argv) {
  using namespace giftc;
  struct sigaction bus = {};
  bus.sa_handler = input_vanished;
  ::sigaction(SIGBUS, &bus, nullptr);
  // A write past the file-size limit (ulimit -f) fails with EFBIG, reported as any other
  // failed write, and the unfinished output goes, where SIGXFSZ would end the process (and
  // its background writer has every signal blocked, so it gets EFBIG already).
  ::signal(SIGXFSZ, SIG_IGN);
  on_stop_signals();
  if (const char* target = std::getenv("GIFT_CPU_TARGET"); target && *target) {
    if (giftCpuLimitTarget(target) != GIFT_OK) {
      std::fprintf(stderr, "giftc: GIFT_CPU_TARGET: %s\n",
                   shown(giftGetLastErrorMessage(), stderr).c_str());
      return kUsage;
    }
  }
  CLI::App app("giftc: encode, inspect, decode and compare FP8 gradient dumps (GIFT format)",
               "giftc");
  app.require_subcommand(1);
  app.fallthrough();  // -q and -v also after the subcommand
  app.set_version_flag("-V,--version", std::string("giftc ") + std::to_string(GIFT_VERSION_MAJOR) +
                                           "." + std::to_string(GIFT_VERSION_MINOR) + "." +
                                           std::to_string(GIFT_VERSION_PATCH) + " (GIFT format " +
                                           std::to_string(GIFT_FORMAT_MAJOR) + "." +
                                           std::to_string(GIFT_FORMAT_MINOR) + ")");
  Verbosity v;
  app.add_flag("-q,--quiet", v.quiet, "No messages but errors")
      ->excludes(app.add_flag("-v,--verbose", v.verbose, "More messages"));
  add_encode(app, v);
  add_decode(app, v);
  add_inspect(app, v);
  add_compare(app, v);
  add_fit(app, v);
  add_bench(app, v);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      // Through stdio, whose failed write with_stdout_flushed reports with its reason (lost
      // where std::endl flushed it).
      std::ostringstream text;
      const int rc = app.exit(e, text, std::cerr);
      std::fputs(text.str().c_str(), stdout);
      return rc == 0 ? kOk : kUsage;
    }
    // As every other error: prefixed with the program, and naming the help that applies.
    std::string command = "giftc", what = e.what();
    for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
    // giftc's own options are flags, so its first other argument is the command it was given;
    // an option before it that giftc's own are not is named as such (giftc --bogus encode).
    const auto given = std::find_if(argv + 1, argv + argc, [](const char* a) { return *a != '-'; });
    const auto unknown = std::find_if(argv + 1, given, [&](const char* a) {
      return !app.get_option_no_throw(a) && std::strcmp(a, "--") != 0;
    });
    const auto commands = [&](std::string text) {
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        text += " " + sub->get_name();
      return text;
    };
    if (unknown != given) {
      command = "giftc";
      what = commands(std::string("'") + *unknown +
                      "' is not an option of giftc (a command's options follow it); commands:");
    } else if (command == "giftc" && dynamic_cast<const CLI::RequiredError*>(&e)) {
      what = commands(given == argv + argc
                          ? "a command is required:"
                          : std::string("'") + *given + "' is not a command; commands:");
    }
    std::fprintf(stderr, "giftc: %s\nTry '%s --help' for more information.\n",
                 shown(what, stderr).c_str(), command.c_str());
    return kUsage;
  } catch (const Failure& f) {
    std::fprintf(stderr, "giftc: %s\n", shown(f.what(), stderr).c_str());
    return f.code;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "giftc: out of memory\n");
    return kIoError;
  } catch (const std::exception& e) {  // e.g. JSON output of strings that are not UTF-8
    std::fprintf(stderr, "giftc: %s\n", shown(e.what(), stderr).c_str());
    return kBadInput;
  }
  return kOk;
}

}  // namespace
