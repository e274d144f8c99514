// What the C API's opaque handles hold. Only src/api/ sees these.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/output_file.h"
#include "container/reader.h"
#include "container/writer.h"
#include "coords/basis.h"
#include "coords/fit.h"
#include "gift/gift_basis.h"

struct giftBasis {
  gift::coords::Basis basis;
};

struct giftFrame {
  std::unique_ptr<gift::container::FrameReader> reader;
  // The embedded basis, parsed on first use and kept.
  bool basis_read = false, has_basis = false;
  giftBasis basis;
  // The sections of the tensor giftFrameDecodeRows reads, kept for its bands.
  gift::container::FrameReader::SectionCache rows_cache;
  // Taken while the basis is parsed: whole-tensor decodes may run on several threads.
  std::mutex basis_mutex;
};

struct giftOutput {
  gift::OutputFile file;
};

struct giftFrameWriter {
  gift::container::FrameWriter writer;
  std::vector<std::unique_ptr<std::string>> reasons;  // of selections handed out
};

struct giftBasisBuilder {
  gift::coords::FitOptions options;
  std::vector<gift::coords::BasisEntry> entries;
  std::vector<std::string> left_out;  // added with a zero second moment: no whitener
};
