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

}  // namespace giftc
