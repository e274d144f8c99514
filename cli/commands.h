// The subcommands; each file registers one on the application.
#pragma once

#include <CLI/CLI.hpp>

#include "common.h"

namespace giftc {

void add_encode(CLI::App& app, Verbosity& v);
void add_decode(CLI::App& app, Verbosity& v);
void add_inspect(CLI::App& app, Verbosity& v);
void add_compare(CLI::App& app, Verbosity& v);
void add_bench(CLI::App& app, Verbosity& v);
void add_fit(CLI::App& app, Verbosity& v);

// --fsync, of the commands that write files (open_output's `sync`).
void add_fsync_flag(CLI::App* command, bool* fsync);

// --threads N, of the commands that code (0 or none: all the processors giftc may use),
// refused when negative.
void add_threads_option(CLI::App* command, int* threads);
// A check for options that name a file: not empty (-o "" or --basis "" is a mistake, not the
// default).
CLI::Validator file_name();

// The threads the library codes on for --threads `asked` (giftCtxThreads), returned, and the
// process's threads held to them, each command's first step: OpenMP's default, which the library's
// calls that take no count run on (fit's measurements of the damping), and the count OpenBLAS
// starts with where a command loads it (fit, compare --activations), unless OPENBLAS_NUM_THREADS
// or GOTO_NUM_THREADS gives its own.
int bound_threads(int asked);

}  // namespace giftc
