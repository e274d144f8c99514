// gift._gift: the binding of libgift's public C API (gift.h, gift_basis.h, gift_transport.h,
// and in CUDA builds gift_cuda.h and gift_transport_cuda.h).
// It stays thin on purpose: buffers arrive as addresses and byte counts that the Python layer
// (gift/__init__.py) takes from NumPy arrays and torch tensors after checking their dtype,
// contiguity and size, so the binding needs neither NumPy's nor torch's headers and works
// with any version of either (zero-copy on both). Calls that take buffers take a `stream`
// too: None for host memory, or a CUDA stream's handle (torch.cuda.Stream.cuda_stream) for
// device memory, the work then being enqueued on that stream.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gift/gift.h"
#include "gift/gift_basis.h"
#include "gift/gift_transport.h"
#ifdef GIFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gift/gift_cuda.h"
#include "gift/gift_transport_cuda.h"
#endif

namespace py = pybind11;

namespace {

// A failed libgift call; translated into gift.GiftError(code, name, message).
struct Failure {
  giftResult_t code;
  std::string message;
};

void check(giftResult_t rc) {
  if (rc != GIFT_OK) throw Failure{rc, giftGetLastErrorMessage()};
}

template <typename T>
T* address(uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

// A name, key or path for the C API, which ends it at its first NUL: refused there, as Python's
// open() refuses one, rather than cut short ("a\0b" and "a\0c" were both "a").
const char* c_string(const std::string& s, const char* what) {
  if (s.find('\0') != std::string::npos) {
    throw py::value_error(std::string(what) + " holds a NUL character");
  }
  return s.c_str();
}

#ifdef GIFT_HAVE_CUDA
constexpr bool kHaveCuda = true;
#else
constexpr bool kHaveCuda = false;
#endif

// Where a call's buffers live: the host (stream None) or a CUDA device, whose work is
// enqueued on the given stream.
struct Where {
  bool device = false;
  uintptr_t stream = 0;
};

void require_cuda() {
  if (!kHaveCuda) {
    throw Failure{GIFT_ERROR_DEVICE,
                  "this libgift was built without CUDA: device buffers need "
                  "a build with GIFT_WITH_CUDA"};
  }
}

Where where(const py::object& stream) {
  if (stream.is_none()) return {};
  require_cuda();
  return {true, stream.cast<uintptr_t>()};
}

#ifdef GIFT_HAVE_CUDA
cudaStream_t cuda_stream(const Where& w) { return reinterpret_cast<cudaStream_t>(w.stream); }

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Failure{GIFT_ERROR_DEVICE, std::string(what) + " failed: " + cudaGetErrorName(e)};
  }
}
#endif

giftQuantParams quant_params(const py::dict& d) {
  giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  p.kind = giftFp8Kind_t(d["kind"].cast<int>());
  p.layout = giftScaleLayout_t(d["layout"].cast<int>());
  p.block = d["block"].cast<uint32_t>();
  p.tile_rows = d["tile_rows"].cast<uint32_t>();
  p.tile_cols = d["tile_cols"].cast<uint32_t>();
  p.scale_dtype = giftScaleDType_t(d["scale_dtype"].cast<int>());
  p.rounding = giftRounding_t(d["rounding"].cast<int>());
  p.seed = d["seed"].cast<uint64_t>();
  p.nonfinite = giftNonFinite_t(d["nonfinite"].cast<int>());
  check(giftQuantParamsValidate(&p));
  return p;
}

py::dict params_dict(const giftQuantParams& p) {
  py::dict d;
  d["kind"] = int(p.kind);
  d["layout"] = int(p.layout);
  d["block"] = p.block;
  d["tile_rows"] = p.tile_rows;
  d["tile_cols"] = p.tile_cols;
  d["scale_dtype"] = int(p.scale_dtype);
  d["rounding"] = int(p.rounding);
  d["seed"] = p.seed;
  d["tensor_index"] = p.tensor_index;
  d["nonfinite"] = int(p.nonfinite);
  return d;
}

uint64_t scale_bytes(const py::dict& params, uint64_t rows, uint64_t cols) {
  const giftQuantParams p = quant_params(params);
  uint64_t bytes = 0;
  check(giftScaleBytes(&p, rows, cols, &bytes));
  return bytes;
}

// giftEncode, or giftEncodeDevice on `stream`. On a device, `stats` (device memory for one
// giftEncodeStats, or 0) is read back once the stream has run the encode, so that
// non-finite input fails the call as it does on the host; with 0 the call does not wait.
void encode_tensor(const py::dict& params, uintptr_t src, int dtype, uint64_t rows, uint64_t cols,
                   uintptr_t codes, uintptr_t scales, uint64_t scale_bytes,
                   const py::object& stream, [[maybe_unused]] uintptr_t stats) {
  const giftQuantParams p = quant_params(params);
  const Where w = where(stream);
  py::gil_scoped_release nogil;
  if (!w.device) {
    check(giftEncode(nullptr, &p, address<const void>(src), giftDType_t(dtype), rows, cols,
                     address<uint8_t>(codes), address<void>(scales), scale_bytes, nullptr));
    return;
  }
#ifdef GIFT_HAVE_CUDA
  auto* d_stats = address<giftEncodeStats>(stats);
  check(giftEncodeDevice(&p, address<const void>(src), giftDType_t(dtype), rows, cols,
                         address<uint8_t>(codes), address<void>(scales), scale_bytes, d_stats,
                         nullptr, 0, cuda_stream(w)));
  if (!d_stats) return;
  giftEncodeStats seen;
  check_cuda(cudaMemcpyAsync(&seen, d_stats, sizeof seen, cudaMemcpyDeviceToHost, cuda_stream(w)),
             "cudaMemcpyAsync of the statistics");
  check_cuda(cudaStreamSynchronize(cuda_stream(w)), "cudaStreamSynchronize");
  if (seen.nonfinite_count && p.nonfinite == GIFT_NONFINITE_ERROR) {
    throw Failure{GIFT_ERROR_NONFINITE_INPUT, std::to_string(seen.nonfinite_count) +
                                                  " non-finite value(s) in the input, the "
                                                  "first at index " +
                                                  std::to_string(seen.first_nonfinite)};
  }
#endif
}

// giftDecode, or giftDecodeDevice on `stream`.
void decode_tensor(const py::dict& params, uintptr_t codes, uintptr_t scales, uint64_t scale_bytes,
                   uint64_t rows, uint64_t cols, uintptr_t dst, int dtype,
                   const py::object& stream) {
  const giftQuantParams p = quant_params(params);
  const Where w = where(stream);
  py::gil_scoped_release nogil;
  if (!w.device) {
    check(giftDecode(nullptr, &p, address<const uint8_t>(codes), address<const void>(scales),
                     scale_bytes, rows, cols, address<void>(dst), giftDType_t(dtype)));
    return;
  }
#ifdef GIFT_HAVE_CUDA
  check(giftDecodeDevice(&p, address<const uint8_t>(codes), address<const void>(scales),
                         scale_bytes, rows, cols, address<void>(dst), giftDType_t(dtype),
                         cuda_stream(w)));
#endif
}

std::string id_hex(giftBasisId id) {
  char hex[33];
  giftBasisIdFormat(id, hex);
  return hex;
}

py::bytes id_bytes(giftBasisId id) {
  return py::bytes(reinterpret_cast<const char*>(&id), sizeof id);
}

class Basis {
 public:
  explicit Basis(giftBasis* b) : b_(b, giftBasisFree) {}
  static std::shared_ptr<Basis> load(const std::string& path) {
    giftBasis* b = nullptr;
    check(giftBasisLoad(c_string(path, "path"), &b));
    return std::make_shared<Basis>(b);
  }
  static std::shared_ptr<Basis> from_bytes(const py::bytes& data) {
    const std::string_view v = data;
    giftBasis* b = nullptr;
    check(giftBasisFromBytes(v.data(), v.size(), &b));
    return std::make_shared<Basis>(b);
  }
  py::bytes to_bytes(int zstd_level) const {
    void* data = nullptr;
    uint64_t size = 0;
    check(giftBasisSerialize(b_.get(), zstd_level, &data, &size));
    std::unique_ptr<void, decltype(&giftFree)> owned(data, giftFree);
    return py::bytes(static_cast<const char*>(data), size);
  }
  void save(const std::string& path, int zstd_level) const {
    check(giftBasisSave(b_.get(), c_string(path, "path"), zstd_level));
  }
  std::string id() const { return id_hex(giftBasisGetId(b_.get())); }
  py::bytes id_raw() const { return id_bytes(giftBasisGetId(b_.get())); }
  py::list entries() const {
    py::list out;
    for (uint64_t i = 0; i < giftBasisEntryCount(b_.get()); ++i) {
      giftBasisEntryInfo e = GIFT_BASIS_ENTRY_INFO_INIT;
      check(giftBasisGetEntry(b_.get(), i, &e));
      py::dict d;
      d["name"] = e.name;
      d["dim"] = e.dim;
      d["rank"] = e.rank;
      d["damping"] = e.damping;
      d["source"] = e.source;
      out.append(d);
    }
    return out;
  }
  const giftBasis* get() const { return b_.get(); }

 private:
  std::unique_ptr<giftBasis, decltype(&giftBasisFree)> b_;
};

const giftBasis* basis_of(const std::shared_ptr<Basis>& b) { return b ? b->get() : nullptr; }

// moments: (name, address of dim x dim doubles, dim, source) per matrix.
std::shared_ptr<Basis> fit_basis(
    const std::vector<std::tuple<std::string, uintptr_t, uint32_t, std::string>>& moments,
    uint32_t rank, double damping, bool damping_relative, uint64_t seed) {
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  fp.rank = rank;
  fp.damping = damping;
  fp.damping_relative = damping_relative;
  fp.seed = seed;
  giftBasisBuilder* raw = nullptr;
  check(giftBasisBuilderCreate(&fp, &raw));
  std::unique_ptr<giftBasisBuilder, decltype(&giftBasisBuilderFree)> builder(raw,
                                                                             giftBasisBuilderFree);
  for (const auto& [name, a, dim, source] : moments) {
    check(giftBasisBuilderAdd(builder.get(), c_string(name, "matrix name"),
                              address<const double>(a), dim, c_string(source, "source"), nullptr, 0,
                              nullptr, 0, nullptr, nullptr));
  }
  giftBasis* b = nullptr;
  check(giftBasisBuilderFinish(builder.get(), &b));
  return std::make_shared<Basis>(b);
}

class Writer {
 public:
  Writer() {
    giftFrameWriter* w = nullptr;
    check(giftFrameWriterCreate(&w));
    w_.reset(w);
  }
  void set_threads(int threads) { check(giftFrameWriterSetThreads(w_.get(), threads)); }
  void set_compression(int level) { check(giftFrameWriterSetCompression(w_.get(), level)); }
  void add_metadata(const std::string& key, const std::string& value) {
    check(giftFrameWriterAddMetadata(w_.get(), c_string(key, "metadata key"),
                                     c_string(value, "metadata value")));
  }
  void embed_basis(const std::shared_ptr<Basis>& b) {
    check(giftFrameWriterEmbedBasis(w_.get(), basis_of(b)));
  }
  // params None stores the tensor losslessly; coords_mode is a giftCoordsMode_t.
  void add(const std::string& name, const std::vector<uint64_t>& shape, int dtype, uintptr_t data,
           const py::object& params, uint32_t tensor_index, const std::shared_ptr<Basis>& basis,
           int coords_mode, double margin, uint32_t min_dim) {
    if (params.is_none()) {
      py::gil_scoped_release nogil;
      check(giftFrameWriterAddTensor(w_.get(), c_string(name, "tensor name"), shape.data(),
                                     uint32_t(shape.size()), giftDType_t(dtype),
                                     address<const void>(data), nullptr));
      return;
    }
    giftQuantParams p = quant_params(params.cast<py::dict>());
    p.tensor_index = tensor_index;
    giftSelectParams select = GIFT_SELECT_PARAMS_INIT;
    select.mode = giftCoordsMode_t(coords_mode);
    select.margin = margin;
    select.min_dim = min_dim;
    py::gil_scoped_release nogil;
    check(giftFrameWriterAddTensorInBasis(
        w_.get(), c_string(name, "tensor name"), shape.data(), uint32_t(shape.size()),
        giftDType_t(dtype), address<const void>(data), &p, basis_of(basis), &select, nullptr));
  }
  py::bytes finish() {
    void* data = nullptr;
    uint64_t size = 0;
    check(giftFrameWriterFinish(w_.get(), &data, &size));
    std::unique_ptr<void, decltype(&giftFree)> owned(data, giftFree);
    return py::bytes(static_cast<const char*>(data), size);
  }
  void write_file(const std::string& path) {
    check(giftFrameWriterWriteFile(w_.get(), c_string(path, "path")));
  }

 private:
  std::unique_ptr<giftFrameWriter, decltype(&giftFrameWriterFree)> w_{nullptr, giftFrameWriterFree};
};

// A verified frame over a buffer it holds (bytes, bytearray, a NumPy array: the exporter stays
// locked while the frame is open), or over a mapped file.
class Frame {
 public:
  explicit Frame(const py::buffer& data)
      : view_(std::make_unique<py::buffer_info>(data.request())) {
    // The frame is read as view_->size * itemsize bytes from ptr: only a C-contiguous view
    // has them there (a reversed or strided view would be read past its end).
    py::ssize_t stride = view_->itemsize;
    for (py::ssize_t d = view_->ndim - 1; d >= 0; --d) {
      if (view_->shape[d] > 1 && view_->strides[d] != stride) {
        throw py::value_error(
            "frame: the buffer is not C-contiguous (np.ascontiguousarray makes a copy that is)");
      }
      stride *= view_->shape[d];
    }
    giftFrame* f = nullptr;
    check(giftFrameOpen(view_->ptr, uint64_t(view_->size * view_->itemsize), &f));
    f_.reset(f);
  }
  explicit Frame(const std::string& path) {
    giftFrame* f = nullptr;
    check(giftFrameOpenFile(c_string(path, "path"), &f));
    f_.reset(f);
  }
  void set_threads(int threads) { check(giftFrameSetThreads(f_.get(), threads)); }
  py::dict info() const {
    giftFrameInfo i = GIFT_FRAME_INFO_INIT;
    check(giftFrameGetInfo(f_.get(), &i));
    py::dict d;
    d["format_version"] = py::make_tuple(i.format_major, i.format_minor);
    d["kind"] = i.kind == GIFT_FRAME_BASIS ? "basis" : "tensors";
    d["producer"] = i.producer;
    d["tensor_count"] = i.tensor_count;
    d["has_basis"] = bool(i.has_basis);
    d["basis_id"] = i.has_basis || i.kind == GIFT_FRAME_BASIS
                        ? py::object(py::str(id_hex(i.basis_id)))
                        : py::object(py::none());
    d["bytes"] = i.bytes;
    return d;
  }
  py::dict metadata() const {
    py::dict d;
    giftFrameInfo i = GIFT_FRAME_INFO_INIT;
    check(giftFrameGetInfo(f_.get(), &i));
    for (uint64_t k = 0; k < i.metadata_count; ++k) {
      const char* key = nullptr;
      const char* value = nullptr;
      check(giftFrameMetadata(f_.get(), k, &key, &value));
      d[py::str(key)] = py::str(value);
    }
    return d;
  }
  uint64_t count() const { return giftFrameTensorCount(f_.get()); }
  py::dict tensor_info(uint64_t index) const {
    giftTensorInfo t = GIFT_TENSOR_INFO_INIT;
    check(giftFrameTensorInfo(f_.get(), index, &t));
    py::dict d;
    d["name"] = py::str(t.name);
    d["shape"] = py::tuple(py::cast(std::vector<uint64_t>(t.shape, t.shape + t.ndim)));
    d["elements"] = t.elements;
    d["dtype"] = int(t.dtype);
    d["raw"] = bool(t.raw);
    d["coords"] = t.coords == GIFT_COORDS_GIFT ? "gift" : "euclidean";
    d["basis_id"] = t.coords == GIFT_COORDS_GIFT ? py::object(py::str(id_hex(t.basis_id)))
                                                 : py::object(py::none());
    d["params"] = t.raw ? py::object(py::none()) : py::object(params_dict(t.params));
    d["stored_bytes"] = t.stored_bytes;
    d["raw_bytes"] = t.raw_bytes;
    d["compressed"] = bool(t.compressed);
    if (t.selection.made) {
      py::dict s;
      s["chosen"] = t.selection.chosen == GIFT_COORDS_GIFT ? "gift" : "euclidean";
      s["euclidean_error"] = t.selection.euclidean_error;
      s["gift_error"] = t.selection.gift_error;
      s["transform_flops"] = t.selection.transform_flops;
      s["reason"] = py::str(t.selection.reason);
      d["selection"] = s;
    } else {
      d["selection"] = py::none();
    }
    if (t.has_stats) {
      d["amax"] = t.amax;
      d["rms"] = t.rms;
      d["nonfinite_count"] = t.nonfinite_count;
    }
    return d;
  }
  void decode_into(uint64_t index, const std::shared_ptr<Basis>& basis, uintptr_t dst,
                   uint64_t bytes, int dtype) {
    py::gil_scoped_release nogil;
    check(giftFrameDecodeTensorWithBasis(f_.get(), index, basis_of(basis), address<void>(dst),
                                         bytes, giftDType_t(dtype)));
  }
  // Codes and scales as they lie in the frame (copies: the frame may be closed first).
  py::tuple tensor_data(uint64_t index) {
    giftTensorInfo t = GIFT_TENSOR_INFO_INIT;
    check(giftFrameTensorInfo(f_.get(), index, &t));
    const uint8_t* codes = nullptr;
    const void* scales = nullptr;
    uint64_t scale_bytes = 0;
    check(giftFrameTensorData(f_.get(), index, &codes, &scales, &scale_bytes));
    return py::make_tuple(py::bytes(reinterpret_cast<const char*>(codes), t.elements),
                          py::bytes(static_cast<const char*>(scales), scale_bytes));
  }
  void verify() { check(giftFrameVerify(f_.get())); }

 private:
  std::unique_ptr<py::buffer_info> view_;  // declared first: outlives the frame
  std::unique_ptr<giftFrame, decltype(&giftFrameClose)> f_{nullptr, giftFrameClose};
};

#ifdef GIFT_HAVE_CUDA
// Makes `device` current for a scope (the device plans' host calls run on their device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
#endif

// One bucket shape's plan on the host (giftReducePlan) or on the CUDA device current at its
// creation (giftReduceDevicePlan): the same steps, message bytes, GIFT coordinates and saved
// states, so each step is one method taking its buffers where the plan lives, and a state
// saved by either kind loads into the other.
class ReducePlan {
 public:
  // tensors: (name, dtype, shape) per tensor of the bucket, in bucket order.
  ReducePlan(const py::dict& config, int world, int rank,
             const std::vector<std::tuple<std::string, int, std::vector<uint64_t>>>& tensors,
             bool device)
      : tensors_(tensors) {
    giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
    c.kind = giftFp8Kind_t(config["kind"].cast<int>());
    c.block = config["block"].cast<uint32_t>();
    c.scale_dtype = giftScaleDType_t(config["scale_dtype"].cast<int>());
    c.rounding = giftRounding_t(config["rounding"].cast<int>());
    c.seed = config["seed"].cast<uint64_t>();
    c.op = giftReduceOp_t(config["op"].cast<int>());
    c.error_feedback = config["error_feedback"].cast<bool>();
    c.integrity = config["integrity"].cast<bool>();
    c.threads = config["threads"].cast<int>();
    c.coords = giftCoordsMode_t(config["coords"].cast<int>());
    c.reselect_every = config["reselect_every"].cast<uint32_t>();
    c.nonfinite = giftNonFinite_t(config["nonfinite"].cast<int>());
    std::vector<giftBucketTensor> d;
    for (const auto& [name, dtype, shape] : tensors_) {
      d.push_back({c_string(name, "tensor name"), giftDType_t(dtype), uint32_t(shape.size()),
                   shape.data()});
    }
    if (!device) {
      giftReducePlan* p = nullptr;
      check(giftReducePlanCreate(&c, world, rank, d.data(), d.size(), &p));
      host_.reset(p);
      return;
    }
    require_cuda();
#ifdef GIFT_HAVE_CUDA
    check_cuda(cudaGetDevice(&device_id_), "cudaGetDevice");
    giftReduceDevicePlan* p = nullptr;
    check(giftReduceDevicePlanCreate(&c, world, rank, d.data(), d.size(), &p));
    device_.reset(p);
#endif
  }
  bool device() const { return !host_; }
  uint64_t message_bytes() const {
#ifdef GIFT_HAVE_CUDA
    if (device()) return giftReduceDevicePlanMessageBytes(device_.get());
#endif
    return giftReducePlanMessageBytes(host_.get());
  }
  // The plan copies the whiteners it needs, so the basis need not outlive the call. A device
  // plan waits for its enqueued work first.
  void set_basis(const std::shared_ptr<Basis>& basis) {
#ifdef GIFT_HAVE_CUDA
    if (device()) {
      py::gil_scoped_release nogil;
      DeviceScope on(device_id_);
      check(giftReduceDevicePlanSetBasis(device_.get(), basis_of(basis)));
      return;
    }
#endif
    check(giftReducePlanSetBasis(host_.get(), basis_of(basis)));
  }
  std::vector<std::string> coords() const {
    std::vector<giftCoords_t> c(tensors_.size());
#ifdef GIFT_HAVE_CUDA
    if (device()) {
      check(giftReduceDevicePlanCoords(device_.get(), c.data(), c.size()));
    } else {
      check(giftReducePlanCoords(host_.get(), c.data(), c.size()));
    }
#else
    check(giftReducePlanCoords(host_.get(), c.data(), c.size()));
#endif
    std::vector<std::string> out;
    for (giftCoords_t x : c) out.push_back(x == GIFT_COORDS_GIFT ? "gift" : "euclidean");
    return out;
  }
  // Tensor i is at base + offsets[i]: absolute addresses with base 0, or a bucket's tensors
  // within one buffer, whose offsets the caller keeps between calls.
  void encode_shards(uintptr_t base, const std::vector<uint64_t>& offsets, uintptr_t send,
                     const py::object& stream) {
    const std::vector<const void*> t = pointers<const void*>(base, offsets);
    const Where w = on(stream);
    py::gil_scoped_release nogil;
    if (!w.device) {
      check(giftReduceEncodeShards(host_.get(), t.data(), address<uint8_t>(send)));
      return;
    }
#ifdef GIFT_HAVE_CUDA
    check(giftReduceEncodeShardsDevice(device_.get(), t.data(), address<uint8_t>(send),
                                       cuda_stream(w)));
#endif
  }
  void sum_shard(uintptr_t recv, uintptr_t out, const py::object& stream) {
    const Where w = on(stream);
    py::gil_scoped_release nogil;
    if (!w.device) {
      check(giftReduceSumShard(host_.get(), address<const uint8_t>(recv), address<uint8_t>(out)));
      return;
    }
#ifdef GIFT_HAVE_CUDA
    check(giftReduceSumShardDevice(device_.get(), address<const uint8_t>(recv),
                                   address<uint8_t>(out), cuda_stream(w)));
#endif
  }
  void decode_result(uintptr_t gathered, uintptr_t base, const std::vector<uint64_t>& offsets,
                     const py::object& stream) {
    const std::vector<void*> t = pointers<void*>(base, offsets);
    const Where w = on(stream);
    py::gil_scoped_release nogil;
    if (!w.device) {
      check(giftReduceDecodeResult(host_.get(), address<const uint8_t>(gathered), t.data()));
      return;
    }
#ifdef GIFT_HAVE_CUDA
    check(giftReduceDecodeResultDevice(device_.get(), address<const uint8_t>(gathered), t.data(),
                                       cuda_stream(w)));
#endif
  }
  // Host plans only: device plans report through status().
  void abandon(uintptr_t msgs, int n) {
    if (device()) {
      throw Failure{GIFT_ERROR_INVALID_ARGUMENT, "abandon: a device plan reports through status()"};
    }
    check(giftReduceAbandon(host_.get(), address<uint8_t>(msgs), n));
  }
  // What a device plan's enqueued steps saw (non-finite values, foreign messages); waits for
  // them. Host steps report at once, so there is nothing left to report.
  void status() {
#ifdef GIFT_HAVE_CUDA
    if (device()) {
      py::gil_scoped_release nogil;
      check(giftReduceDevicePlanStatus(device_.get()));
    }
#endif
  }
  // The same bytes from host and device plans; a device plan waits for its enqueued work and
  // copies its residuals from or to device memory.
  py::bytes save_state() {
    std::string s;
#ifdef GIFT_HAVE_CUDA
    if (device()) {
      py::gil_scoped_release nogil;
      DeviceScope on(device_id_);
      s.resize(giftReduceDevicePlanStateBytes(device_.get()));
      check(giftReduceDevicePlanSaveState(device_.get(), s.data(), s.size()));
    }
#endif
    if (!device()) {
      s.resize(giftReducePlanStateBytes(host_.get()));
      check(giftReducePlanSaveState(host_.get(), s.data(), s.size()));
    }
    return py::bytes(s);
  }
  void load_state(const py::bytes& state) {
    const std::string_view v = state;
#ifdef GIFT_HAVE_CUDA
    if (device()) {
      py::gil_scoped_release nogil;
      DeviceScope on(device_id_);
      check(giftReduceDevicePlanLoadState(device_.get(), v.data(), v.size()));
      return;
    }
#endif
    check(giftReducePlanLoadState(host_.get(), v.data(), v.size()));
  }

 private:
  Where on(const py::object& stream) const {
    const Where w = where(stream);
    if (w.device != device()) {
      throw Failure{GIFT_ERROR_INVALID_ARGUMENT,
                    device() ? "a device plan takes device buffers and a stream"
                             : "a host plan takes host buffers, without a stream"};
    }
    return w;
  }
  template <typename P>
  std::vector<P> pointers(uintptr_t base, const std::vector<uint64_t>& offsets) const {
    if (offsets.size() != tensors_.size()) {
      throw Failure{GIFT_ERROR_INVALID_ARGUMENT, "the plan has " + std::to_string(tensors_.size()) +
                                                     " tensors, not " +
                                                     std::to_string(offsets.size())};
    }
    std::vector<P> p;
    p.reserve(offsets.size());
    for (uint64_t x : offsets) p.push_back(reinterpret_cast<P>(base + x));
    return p;
  }

  // The names and shapes giftBucketTensor points at while the plan is created.
  std::vector<std::tuple<std::string, int, std::vector<uint64_t>>> tensors_;
  std::unique_ptr<giftReducePlan, decltype(&giftReducePlanDestroy)> host_{nullptr,
                                                                          giftReducePlanDestroy};
#ifdef GIFT_HAVE_CUDA
  std::unique_ptr<giftReduceDevicePlan, decltype(&giftReduceDevicePlanDestroy)> device_{
      nullptr, giftReduceDevicePlanDestroy};
  int device_id_ = 0;  // the CUDA device the plan lives on
#endif
};

}  // namespace

PYBIND11_MODULE(_gift, m) {
  m.doc() = "libgift's C API; use the gift package, which checks buffers before they get here";
  py::register_exception_translator([](std::exception_ptr e) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const Failure& f) {
      const py::object cls = py::module_::import("gift._errors").attr("GiftError");
      const py::object err = cls(int(f.code), giftGetErrorString(f.code), f.message);
      PyErr_SetObject(cls.ptr(), err.ptr());
    }
  });
  m.def("version_number", &giftVersionNumber);
  m.def("cpu_target", &giftCpuTargetName);
  m.def("cpu_target_names", &giftCpuTargetNames);
  m.def("limit_cpu_target", [](const std::optional<std::string>& name) {
    check(giftCpuLimitTarget(name ? c_string(*name, "name") : nullptr));
  });
  m.def("error_string", [](int code) { return giftGetErrorString(giftResult_t(code)); });
  m.def("default_params", [] { return params_dict(GIFT_QUANT_PARAMS_INIT); });
  m.def("check_params", [](const py::dict& d) { quant_params(d); });
  m.attr("have_cuda") = kHaveCuda;
  m.def("cuda_device_count", [] {
#ifdef GIFT_HAVE_CUDA
    return giftCudaDeviceCount();
#else
    return 0;
#endif
  });
  m.def("scale_bytes", &scale_bytes);
  m.def("encode_tensor", &encode_tensor);
  m.def("decode_tensor", &decode_tensor);
  m.def(
      "convert",
      [](uintptr_t src, int src_dtype, uintptr_t dst, int dst_dtype, uint64_t n) {
        check(giftConvert(address<const void>(src), giftDType_t(src_dtype), address<void>(dst),
                          giftDType_t(dst_dtype), n));
      },
      py::call_guard<py::gil_scoped_release>());

  py::class_<Basis, std::shared_ptr<Basis>>(m, "Basis")
      .def_static("load", &Basis::load)
      .def_static("from_bytes", &Basis::from_bytes)
      .def_static("fit", &fit_basis)
      .def("to_bytes", &Basis::to_bytes)
      .def("save", &Basis::save)
      .def_property_readonly("id", &Basis::id)
      .def_property_readonly("id_bytes", &Basis::id_raw)
      .def("entries", &Basis::entries);

  py::class_<Writer>(m, "Writer")
      .def(py::init<>())
      .def("set_threads", &Writer::set_threads)
      .def("set_compression", &Writer::set_compression)
      .def("add_metadata", &Writer::add_metadata)
      .def("embed_basis", &Writer::embed_basis)
      .def("add", &Writer::add)
      .def("finish", &Writer::finish)
      .def("write_file", &Writer::write_file);

  py::class_<Frame>(m, "Frame")
      .def(py::init<const py::buffer&>())
      .def(py::init<const std::string&>())
      .def("set_threads", &Frame::set_threads)
      .def("info", &Frame::info)
      .def("metadata", &Frame::metadata)
      .def("count", &Frame::count)
      .def("tensor_info", &Frame::tensor_info)
      .def("decode_into", &Frame::decode_into)
      .def("tensor_data", &Frame::tensor_data)
      .def("verify", &Frame::verify);

  py::class_<ReducePlan>(m, "ReducePlan")
      .def(
          py::init<const py::dict&, int, int,
                   const std::vector<std::tuple<std::string, int, std::vector<uint64_t>>>&, bool>())
      .def_property_readonly("device", &ReducePlan::device)
      .def_property_readonly("message_bytes", &ReducePlan::message_bytes)
      .def("set_basis", &ReducePlan::set_basis)
      .def_property_readonly("coords", &ReducePlan::coords)
      .def("encode_shards", &ReducePlan::encode_shards)
      .def("sum_shard", &ReducePlan::sum_shard)
      .def("abandon", &ReducePlan::abandon)
      .def("decode_result", &ReducePlan::decode_result)
      .def("status", &ReducePlan::status)
      .def("save_state", &ReducePlan::save_state)
      .def("load_state", &ReducePlan::load_state);
}
