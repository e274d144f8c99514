// GIFT coordinates in frames (FORMAT.md 2.4): what spans container/ and coords/, which
// know nothing of each other. The C API and nothing below it uses this.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "container/reader.h"
#include "container/writer.h"
#include "coords/basis.h"
#include "coords/select.h"
#include "gift/gift.h"

namespace gift::coords {

// A basis as a frame of kind Basis (.giftb), and back (checking its id against its contents).
giftResult_t serialize_basis(const Basis& b, int zstd_level, std::vector<uint8_t>* out);
giftResult_t parse_basis(const uint8_t* bytes, uint64_t size, const std::string& name, Basis* out);
giftResult_t read_basis_file(const std::string& path, Basis* out);

// The basis a frame carries, parsed into *out and checked to be the one Frame.basis_id
// names; *found is false (and *out untouched) when the frame carries none.
giftResult_t read_embedded_basis(const container::FrameReader& r, Basis* out, bool* found);

// The whitener tensor `index` (in GIFT coordinates) needs, from `basis` (null: none
// available). GIFT_ERROR_BASIS_MISSING with both ids when it is missing or different.
giftResult_t resolve_whitener(const container::FrameReader& r, size_t index, const Basis* basis,
                              const Whitener** out);

// Decodes tensor `index` of a frame, mapping tensors in GIFT coordinates back with `basis`;
// errors as resolve_whitener's.
giftResult_t decode_in_basis(const container::FrameReader& r, size_t index, const Basis* basis,
                             void* dst, uint64_t dst_bytes, giftDType_t dst_dtype);
// Rows of it, as FrameReader::decode_rows.
giftResult_t decode_rows_in_basis(const container::FrameReader& r, size_t index, const Basis* basis,
                                  uint64_t first_row, uint64_t rows, void* dst, uint64_t dst_bytes,
                                  giftDType_t dst_dtype,
                                  container::FrameReader::SectionCache* cache);

// The frame's record of a choice made for a tensor in basis `id`.
container::CoordsChoice record(const Selection& s, const BasisId& id);

// Adds a tensor to `w` in the coordinates the measured selection chooses (Euclidean without
// a basis, for non-matrices, or when asked); *out says what was chosen and why.
giftResult_t add_tensor_in_basis(container::FrameWriter* w, const std::string& name,
                                 const container::TensorShape& shape, giftDType_t dtype,
                                 const void* data, const giftQuantParams& p, const Basis* basis,
                                 const SelectOptions& o, Selection* out);

}  // namespace gift::coords
