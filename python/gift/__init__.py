"""gift: FP8 gradient frames (the GIFT format) and the replica-exact compressed all-reduce.

A binding of libgift's public C API. Names and defaults are the command line's (giftc):

    frame = gift.encode({"w": w, "b": b}, fp8="e4m3", scale="block:128")
    out = gift.decode(frame)               # {"w": ndarray, "b": ndarray}
    with gift.open(frame) as f: f.tensors  # what each tensor is and how it was encoded

Tensors are NumPy arrays or torch tensors of float32, float16 or bfloat16 (torch.bfloat16,
or ml_dtypes.bfloat16 arrays, since NumPy itself has no bfloat16). C-contiguous buffers are
read and written in place, never copied. As giftc does, matrices (2 dimensions and more) are
encoded to FP8 and vectors and scalars are stored losslessly. A failing call raises
gift.GiftError with the library's code and message.

CUDA tensors (with a libgift built with CUDA; gift.have_cuda) are coded on their device
(gift_cuda.h), in place and on the current torch stream, with the host's bytes:
gift.encode_tensor/decode_tensor, decoding a frame into them, and ReducePlan(device=...).
Frames are host bytes, so gift.encode copies a CUDA tensor to the host first.

gift.ReducePlan exposes the local steps of the compressed all-reduce (gift_transport.h and
gift_transport_cuda.h), and gift.ddp the PyTorch DDP communication hook built on them.
"""
import contextlib
import operator
import os

from . import _gift
from ._errors import GiftError

__all__ = ["GiftError", "Basis", "Frame", "ReducePlan", "encode", "decode", "open", "quant_params",
           "encode_tensor", "decode_tensor", "have_cuda", "cpu_target", "cpu_targets",
           "limit_cpu_target"]

# Whether this libgift codes CUDA tensors (built with CUDA; a device may still be missing).
have_cuda = _gift.have_cuda


def cpu_target():
    """The instruction set the CPU codec uses ("AVX3", "AVX2", ...), as giftc bench names it."""
    return _gift.cpu_target()


def cpu_targets():
    """The names limit_cpu_target takes in this libgift, widest first."""
    return _gift.cpu_target_names().split()


def limit_cpu_target(name=None):
    """Limits the CPU codec, process-wide, to instruction sets no wider than `name` (any case;
    None lifts the limit), as giftc's GIFT_CPU_TARGET does: for machines whose widest vectors
    run slower. Every instruction set gives the same bytes, except in GIFT coordinates on sets
    without fused multiply-add (SSE4 and narrower: within fp32 rounding; giftCpuLimitTarget in
    gift.h). Call it while no other thread is in the codec. Raises GiftError for a name this
    libgift has no code for."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, not {type(name).__name__}")
    _gift.limit_cpu_target(name)

_FP8 = {"e4m3": 0, "e5m2": 1}
_SCALE_DTYPES = {"f32": 0, "e8m0": 1}
_ROUNDING = {"nearest": 0, "stochastic": 1}
_COORDS = {"euclidean": 0, "gift": 1, "auto": 2}
_LAYOUTS = {0: "tensor", 1: "row", 2: "block", 3: "tile"}
_REDUCE_OPS = {"sum": 0, "avg": 1}
# giftDType_t codes by dtype name, and back (NumPy's, ml_dtypes' and torch's names agree).
_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_ITEMSIZE = {0: 4, 1: 2, 2: 2}


def _choice(what, table, value):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise ValueError(f"{what}: {value!r} is not {', '.join(table)}") from None


def _int(what, value, low=0, high=2**32 - 1):
    """An integer option in [low, high], refused by name otherwise (pybind's own refusal names
    no option)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: {value!r} is not an integer") from None
    if isinstance(value, bool) or not low <= v <= high:
        raise ValueError(f"{what}: {value!r} is not an integer in [{low}, {high}]")
    return v


def _flag(what, value):
    """A yes/no option: a bool (or 0 or 1), not any object Python would call true."""
    if value in (True, False) and not isinstance(value, (str, bytes)):
        return bool(value)
    raise TypeError(f"{what}: {value!r} is not True or False")


def _parse_scale(scale, params):
    if scale == "tensor":
        params["layout"] = 0
    elif scale == "row":
        params["layout"] = 1
    elif isinstance(scale, str) and scale.startswith("block:") and scale[6:].isdigit():
        params["layout"] = 2
        params["block"] = _int("scale: block", int(scale[6:]))
    elif isinstance(scale, str) and scale.startswith("tile:") and "x" in scale:
        rows, cols = scale[5:].split("x", 1)
        if not (rows.isdigit() and cols.isdigit()):
            raise ValueError(f"scale: {scale!r} is not tile:RxC with R and C counts")
        params["layout"] = 3
        params["tile_rows"] = _int("scale: tile rows", int(rows))
        params["tile_cols"] = _int("scale: tile columns", int(cols))
    else:
        raise ValueError(f"scale: {scale!r} is not tensor, row, block:N or tile:RxC")


def quant_params(fp8="e4m3", scale="block:128", scale_dtype="f32", rounding="nearest", seed=0,
                 keep_nonfinite=False):
    """The encoding parameters (giftQuantParams) for the command line's option values."""
    p = _gift.default_params()
    p["kind"] = _choice("fp8", _FP8, fp8)
    _parse_scale(scale, p)
    p["scale_dtype"] = _choice("scale_dtype", _SCALE_DTYPES, scale_dtype)
    p["rounding"] = _choice("rounding", _ROUNDING, rounding)
    p["seed"] = _int("seed", seed, high=2**64 - 1)
    p["nonfinite"] = 1 if _flag("keep_nonfinite", keep_nonfinite) else 0
    _gift.check_params(p)
    return p


def _dtype_name(dtype):
    """float32, float16 or bfloat16 from a torch dtype, a NumPy dtype or type, or a name."""
    if str(dtype).startswith("torch."):
        return str(dtype)[6:]
    if isinstance(dtype, str):
        return dtype
    import numpy as np
    return np.dtype(dtype).name


class _Buffer:
    """A contiguous buffer: its address, bytes, dtype name and shape, and its CUDA device
    (None in host memory). `owner` keeps the array or tensor alive while the address is in
    use."""

    __slots__ = ("owner", "address", "nbytes", "dtype", "shape", "device")

    def __init__(self, owner, address, nbytes, dtype, shape, device=None):
        self.owner, self.address, self.nbytes, self.dtype, self.shape, self.device = (
            owner, address, nbytes, dtype, tuple(int(d) for d in shape), device)


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _buffer(x, what, writable=False):
    if _is_torch(x):
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{what}: a {x.device.type} tensor; gift works on CPU and CUDA "
                             "tensors")
        if not x.is_contiguous():
            raise ValueError(f"{what}: not contiguous (call .contiguous() first)")
        if writable:
            # Written through its address, which autograd does not see: a tensor that requires
            # grad is refused, and the write counts as an in-place change (a version), so
            # that a backward that saved the tensor's old values fails instead of using these.
            if x.requires_grad:
                raise ValueError(f"{what}: requires grad; gift writes it outside autograd "
                                 "(give a tensor without grad, such as .detach())")
            if not x.is_inference():  # which has no version to count
                import torch
                with torch.no_grad():
                    x.view(-1)[:0].zero_()
        dtype = str(x.dtype).replace("torch.", "")
        device = x.device if x.is_cuda else None
        return _Buffer(x, x.data_ptr(), x.numel() * x.element_size(), dtype, x.shape, device)
    import numpy as np
    if not isinstance(x, np.ndarray):
        if writable:
            raise TypeError(f"{what}: needs a NumPy array or a torch tensor to write into")
        x = np.asarray(x, dtype=np.float32)  # a scalar stays 0-d (ascontiguousarray made it 1-d)
        if x.ndim:
            x = np.ascontiguousarray(x)  # an __array__ may give another memory order
    if not x.dtype.isnative:
        # The library reads and writes the machine's byte order.
        if writable:
            raise ValueError(f"{what}: byte order {x.dtype.byteorder!r} is not the machine's "
                             "(an array of dtype.newbyteorder('=') can be written into)")
        x = x.astype(x.dtype.newbyteorder("="))
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: not C-contiguous (np.ascontiguousarray makes a copy that is)")
    if writable and not x.flags.writeable:
        raise ValueError(f"{what}: read-only array")
    return _Buffer(x, x.__array_interface__["data"][0], x.nbytes, x.dtype.name, x.shape)


def _float_buffer(x, what, writable=False):
    b = _buffer(x, what, writable)
    if b.dtype not in _DTYPES:
        raise TypeError(f"{what}: dtype {b.dtype}; gift takes float32, float16 and bfloat16")
    return b


def _byte_buffer(x, what, nbytes=None, writable=False):
    b = _buffer(x, what, writable)
    if b.dtype != "uint8":
        raise TypeError(f"{what}: dtype {b.dtype}, not uint8")
    if nbytes is not None and b.nbytes != nbytes:
        raise ValueError(f"{what}: {b.nbytes} bytes, not {nbytes}")
    return b


def _zero_bytes(like, n):
    """n zero bytes: a uint8 torch tensor on `like`'s device when `like` is a torch tensor,
    else NumPy. Zero because device plans never write the padding of their messages."""
    if _is_torch(like):
        import torch
        return torch.zeros(n, dtype=torch.uint8, device=like.device)
    import numpy as np
    return np.zeros(n, dtype=np.uint8)


def _place(buffers, what):
    """The one CUDA device of `buffers` (None: all in host memory), and the handle of its
    current torch stream (None on the host), for the binding's `stream` argument."""
    devices = {b.device for b in buffers}
    if len(devices) > 1:
        places = sorted(str(d) if d else "the host" for d in devices)
        raise ValueError(f"{what}: buffers on {', '.join(places)}; they must be on one device")
    device = devices.pop() if devices else None
    if device is None:
        return None, None
    import torch
    return device, torch.cuda.current_stream(device).cuda_stream


def _on(device):
    """The CUDA device made current while the binding enqueues work for it (a stream takes
    only kernels of its own device)."""
    if device is None:
        return contextlib.nullcontext()
    import torch
    return torch.cuda.device(device)


def _matrix(shape):
    """The rows x cols view of a shape, as gift.h codes it (a scalar is 1 x 1)."""
    cols = shape[-1] if shape else 1
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows, cols


def _numpy_dtype(name):
    import numpy as np
    if name != "bfloat16":
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("bfloat16 NumPy arrays need ml_dtypes (pip install ml_dtypes)") from None
    return np.dtype(ml_dtypes.bfloat16)


def _like(x, shape, dtype):
    """An uninitialized array of x's kind (torch, on x's device, or NumPy) of `dtype` (as
    _dtype_name takes it)."""
    name = _dtype_name(dtype)
    if _is_torch(x):
        import torch
        return torch.empty(shape, dtype=getattr(torch, name), device=x.device)
    import numpy as np
    return np.empty(shape, dtype=_numpy_dtype(name))


class Basis:
    """A set of per-matrix whiteners (GIFT coordinates) named by a 128-bit id."""

    def __init__(self, handle):
        self._b = handle

    @classmethod
    def load(cls, path):
        return cls(_gift.Basis.load(os.fspath(path)))

    @classmethod
    def from_bytes(cls, data):
        return cls(_gift.Basis.from_bytes(bytes(data)))

    @classmethod
    def fit(cls, moments, rank=32, damping=1e-3, damping_relative=True, seed=1,
            source="activations"):
        """Fits a whitener per matrix from its input side's second moment: `moments` maps a
        matrix name to a d_in x d_in symmetric positive semi-definite array (activation
        statistics E[x x^T], or W^T W / rows of gradients with source="gradients"). A zero
        moment (a matrix that saw no input: a frozen or dead layer) gets no whitener, so that
        matrix stays Euclidean wherever the basis is used."""
        import numpy as np
        held = []
        for name, a in moments.items():
            if not isinstance(name, str):
                raise TypeError(f"matrix names are strings; {name!r} is a {type(name).__name__}")
            a = np.ascontiguousarray(np.asarray(a, dtype=np.float64))
            if a.ndim != 2 or a.shape[0] != a.shape[1]:
                raise ValueError(f"moment of {name!r}: shape {a.shape} is not square")
            held.append((name, a))
        entries = [(n, a.__array_interface__["data"][0], a.shape[0], source) for n, a in held]
        return cls(_gift.Basis.fit(entries, _int("rank", rank), float(damping),
                                   _flag("damping_relative", damping_relative),
                                   _int("seed", seed, high=2**64 - 1)))

    def to_bytes(self, zstd=0):
        return self._b.to_bytes(zstd)

    def save(self, path, zstd=0):
        self._b.save(os.fspath(path), zstd)

    @property
    def id(self):
        """32 hexadecimal digits, high half first (as giftc prints it)."""
        return self._b.id

    @property
    def id_bytes(self):
        """The 16 bytes of the id (giftBasisId as the library stores it)."""
        return self._b.id_bytes

    @property
    def entries(self):
        return self._b.entries()

    def __repr__(self):
        return f"gift.Basis(id={self.id}, {len(self.entries)} matrices)"

    def __reduce__(self):
        return (Basis.from_bytes, (self.to_bytes(),))


def _handle(basis):
    return None if basis is None else basis._b


def _named_tensors(tensors):
    if isinstance(tensors, dict):
        for name in tensors:
            if not isinstance(name, str):
                raise TypeError(f"tensor names are strings; {name!r} is a {type(name).__name__}")
        return list(tensors.items())
    return [("tensor", tensors)]


def encode(tensors, fp8="e4m3", scale="block:128", scale_dtype="f32", rounding="nearest",
           seed=0, basis=None, coords=None, metadata=None, keep_nonfinite=False, zstd=0,
           threads=0, embed_basis=False, margin=0.05, min_dim=16):
    """Encodes a dict of name -> tensor (or one tensor, named "tensor") to frame bytes, as
    `giftc encode` does: matrices in FP8, in the order given (tensor i is seeded with index
    i), vectors and scalars losslessly. coords (euclidean, gift or auto) picks the
    coordinates of matrices the basis covers; without it, auto with a basis, else
    euclidean. A CUDA tensor is copied to the host first (frames are host bytes; for FP8
    codes that stay on the device, encode_tensor)."""
    params = quant_params(fp8, scale, scale_dtype, rounding, seed, keep_nonfinite)
    mode = coords or ("auto" if basis is not None else "euclidean")
    mode_code = _choice("coords", _COORDS, mode)
    if mode != "euclidean" and basis is None:
        raise ValueError(f"coords={mode!r} needs a basis")
    if embed_basis and basis is None:
        raise ValueError("embed_basis needs a basis")
    w = _gift.Writer()
    w.set_compression(zstd)
    w.set_threads(threads)
    for key, value in (metadata or {}).items():
        if not (isinstance(key, str) and isinstance(value, str)):
            raise TypeError(f"metadata keys and values are strings; {key!r}: {value!r} is not")
        w.add_metadata(key, value)
    if embed_basis:
        w.embed_basis(basis._b)
    for i, (name, t) in enumerate(_named_tensors(tensors)):
        b = _float_buffer(t, f"tensor {name!r}")
        if b.device is not None:
            b = _float_buffer(t.cpu(), f"tensor {name!r}")
        fp8_coded = len(b.shape) >= 2
        w.add(name, list(b.shape), _DTYPES[b.dtype], b.address, params if fp8_coded else None,
              i, _handle(basis), mode_code, margin, min_dim)
    return w.finish()


class _ClosedFrame:
    def __getattr__(self, name):
        raise ValueError("the frame is closed")


class Frame:
    """An open, verified frame (bytes-like or a file, memory-mapped) for inspection and
    decoding. Use as a context manager or call close()."""

    def __init__(self, source):
        if isinstance(source, (str, os.PathLike)):
            self._f = _gift.Frame(os.fspath(source))
        elif _is_torch(source):
            self._f = _gift.Frame(_byte_buffer(source, "frame").owner.cpu().numpy())
        else:
            self._f = _gift.Frame(source)

    def close(self):
        self._f = _ClosedFrame()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def info(self):
        return self._f.info()

    @property
    def metadata(self):
        return self._f.metadata()

    @property
    def tensors(self):
        """One dict per tensor: name, shape, dtype, raw, coords, basis_id, params (with the
        command line's names: fp8, scale, scale_dtype, rounding), sizes, statistics."""
        return [self._describe(self._f.tensor_info(i)) for i in range(self._f.count())]

    @staticmethod
    def _describe(t):
        t["dtype"] = _DTYPE_NAMES[t["dtype"]]
        p = t["params"]
        if p is not None:
            scale = _LAYOUTS[p["layout"]]
            if scale == "block":
                scale = f"block:{p['block']}"
            elif scale == "tile":
                scale = f"tile:{p['tile_rows']}x{p['tile_cols']}"
            t["fp8"] = {v: k for k, v in _FP8.items()}[p["kind"]]
            t["scale"] = scale
            t["scale_dtype"] = {v: k for k, v in _SCALE_DTYPES.items()}[p["scale_dtype"]]
            t["rounding"] = {v: k for k, v in _ROUNDING.items()}[p["rounding"]]
        return t

    def _index(self, key):
        if isinstance(key, int):
            count = self._f.count()
            if not -count <= key < count:
                raise IndexError(f"tensor {key} of a frame of {count}")
            return key % count
        for i in range(self._f.count()):
            if self._f.tensor_info(i)["name"] == key:
                return i
        raise KeyError(key)

    def decode(self, key, basis=None, dtype=None, out=None):
        """Tensor `key` (name or index) as a NumPy array of its own dtype (bf16 as
        ml_dtypes.bfloat16 when installed, else float32), of `dtype`, or written into `out`
        (an array or tensor of its shape, decoded in place). Into a CUDA tensor, an FP8
        tensor in Euclidean coordinates is decoded on the device (its codes and scales
        copied there, on the current torch stream); the others (raw, whitened or
        compressed) are decoded on the host and copied."""
        import numpy as np
        i = self._index(key)
        t = self._f.tensor_info(i)
        if out is None:
            name = _dtype_name(dtype) if dtype is not None else _DTYPE_NAMES[t["dtype"]]
            if name == "bfloat16":
                try:
                    import ml_dtypes
                except ImportError:
                    # bf16's values all the same, held in float32 (exactly: bf16 is the top
                    # half of an fp32), so that they do not depend on an optional package.
                    bits = np.empty(t["shape"], dtype=np.uint16)
                    self._f.decode_into(i, _handle(basis), bits.__array_interface__["data"][0],
                                        bits.nbytes, _DTYPES["bfloat16"])
                    return (bits.astype(np.uint32) << 16).view(np.float32)
                np_dtype = ml_dtypes.bfloat16
            else:
                np_dtype = np.dtype(name)
            out = np.empty(t["shape"], dtype=np_dtype)
        b = _float_buffer(out, f"out for {t['name']!r}", writable=True)
        if b.shape != tuple(t["shape"]):
            raise ValueError(f"out for {t['name']!r}: shape {b.shape}, not {tuple(t['shape'])}")
        if b.device is None or t["elements"] == 0:
            self._f.decode_into(i, _handle(basis), b.address, b.nbytes, _DTYPES[b.dtype])
        elif t["raw"] or t["coords"] == "gift" or t["compressed"]:
            out.copy_(self.decode(i, basis, out=out.new_empty(out.shape, device="cpu")))
        else:
            import torch
            codes, scales = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(b.device)
                             for data in self._f.tensor_data(i))
            _decode_codes(t["params"], _buffer(codes.reshape(b.shape), "codes"),
                          _buffer(scales, "scales"), b)
        return out

    def codes(self, key):
        """The FP8 codes (uint8, the tensor's shape) and the scales (float32, or uint8 for
        e8m0) of tensor `key` as stored."""
        import numpy as np
        i = self._index(key)
        t = self._f.tensor_info(i)
        codes, scales = self._f.tensor_data(i)
        e8m0 = t["params"]["scale_dtype"] == _SCALE_DTYPES["e8m0"]
        return (np.frombuffer(codes, np.uint8).reshape(t["shape"]),
                np.frombuffer(scales, np.uint8 if e8m0 else np.float32))

    def verify(self):
        """Reads every section (checksums, decompression) and decodes every tensor."""
        self._f.verify()


def open(source):  # noqa: A001 (the package's name for it, as giftc inspect)
    """Frame over bytes (bytes, bytearray, a uint8 array) or a .gift file."""
    return Frame(source)


def decode(frame, basis=None, dtype=None, device=None):
    """Every tensor of a frame (bytes-like or a path) as a dict of NumPy arrays, or of torch
    tensors on `device` (such as "cuda": decoded there, see Frame.decode); tensors in GIFT
    coordinates need `basis` unless the frame carries it."""
    with Frame(frame) as f:
        if device is None:
            return {t["name"]: f.decode(i, basis, dtype) for i, t in enumerate(f.tensors)}
        import torch
        return {t["name"]: f.decode(i, basis, out=torch.empty(
                    t["shape"], dtype=getattr(torch, _dtype_name(dtype or t["dtype"])),
                    device=device))
                for i, t in enumerate(f.tensors)}


def _scales_like(x, params, scale_bytes):
    e8m0 = params["scale_dtype"] == _SCALE_DTYPES["e8m0"]
    return _like(x, (scale_bytes if e8m0 else scale_bytes // 4,), "uint8" if e8m0 else "float32")


def encode_tensor(x, fp8="e4m3", scale="block:128", scale_dtype="f32", rounding="nearest",
                  seed=0, keep_nonfinite=False):
    """The FP8 codes and scales of one tensor as gift.h's giftEncode writes them, without a
    frame: (codes, scales), codes uint8 of x's shape, scales 1-D (float32, or uint8 for
    e8m0) over x viewed as rows x cols (cols its last dimension). NumPy arrays and CPU
    tensors are coded on the host; CUDA tensors on their device (gift_cuda.h) with the same
    bytes, read in place and enqueued on the current torch stream, the results on that
    device. Non-finite input raises GiftError, on a device once the stream has run the
    encode (the call waits for it); with keep_nonfinite=True a device call never waits."""
    params = quant_params(fp8, scale, scale_dtype, rounding, seed, keep_nonfinite)
    b = _float_buffer(x, "x")
    rows, cols = _matrix(b.shape)
    scale_bytes = _gift.scale_bytes(params, rows, cols)
    codes = _like(x, b.shape, "uint8")
    scales = _scales_like(x, params, scale_bytes)
    c, sc = _buffer(codes, "codes"), _buffer(scales, "scales")
    device, stream = _place([b, c, sc], "encode_tensor")
    stats = 0
    if device is not None and not keep_nonfinite:
        import torch
        # Room for one giftEncodeStats (24 bytes, 8-aligned), read back by the binding.
        stats_buffer = torch.empty(3, dtype=torch.int64, device=device)
        stats = stats_buffer.data_ptr()
    with _on(device):
        _gift.encode_tensor(params, b.address, _DTYPES[b.dtype], rows, cols, c.address,
                            sc.address, scale_bytes, stream, stats)
    return codes, scales


def decode_tensor(codes, scales, out=None, dtype="float32", fp8="e4m3", scale="block:128",
                  scale_dtype="f32"):
    """The values of encode_tensor's (codes, scales), encoded with these parameters, as
    gift.h's giftDecode gives them: written into `out` (an array or tensor of codes' shape,
    float32, float16 or bfloat16) or into a new one of `dtype` beside codes. On a CUDA
    device (codes, scales and out all there) the decode is enqueued on the current torch
    stream."""
    params = quant_params(fp8, scale, scale_dtype)
    c = _byte_buffer(codes, "codes")
    rows, cols = _matrix(c.shape)
    scale_bytes = _gift.scale_bytes(params, rows, cols)
    sc = _buffer(scales, "scales")
    want = "float32" if scale_dtype == "f32" else "uint8"
    if sc.dtype != want:  # what encode_tensor gives; other bytes would be read as these
        raise TypeError(f"scales: dtype {sc.dtype}; {scale_dtype} scales are {want}")
    if sc.nbytes != scale_bytes:
        raise ValueError(f"scales: {sc.nbytes} bytes, not {scale_bytes} for codes of shape "
                         f"{c.shape} with these parameters")
    out = _like(codes, c.shape, dtype) if out is None else out
    o = _float_buffer(out, "out", writable=True)
    if o.shape != c.shape:
        raise ValueError(f"out: shape {o.shape}, not codes' {c.shape}")
    _decode_codes(params, c, sc, o)
    return out


def _decode_codes(params, codes, scales, out):
    rows, cols = _matrix(codes.shape)
    device, stream = _place([codes, scales, out], "decode")
    with _on(device):
        _gift.decode_tensor(params, codes.address, scales.address, scales.nbytes, rows, cols,
                            out.address, _DTYPES[out.dtype], stream)


class ReducePlan:
    """The local steps of the compressed all-reduce for one bucket shape on one rank
    (gift_transport.h): encode_shards -> all-to-all of message_bytes per rank -> sum_shard
    -> all-gather -> decode_result. `tensors` is [(name, dtype, shape), ...] in bucket order.

    device None: a host plan, whose buffers are NumPy arrays or CPU torch tensors. A CUDA
    device (torch.device or a name such as "cuda:0"): a device plan (gift_transport_cuda.h)
    on it, whose buffers are CUDA tensors there and whose steps are enqueued on the current
    torch stream, writing the host plan's message bytes (without integrity checksums, which
    device plans do not have: integrity defaults to False there and True on the host). What
    a device plan's data held (non-finite values unless kept, messages of another call or
    basis) is reported by status(), which waits for its steps. Device plans take a basis and
    save and load their state as host plans do, with the same bytes: a state saved from a
    host plan loads into a device plan of the same bucket, and back (set_basis, save_state
    and load_state wait for a device plan's enqueued steps). Buffers are used in place.

    coords (auto, gift or euclidean) and reselect_every take effect once a basis is set
    (set_basis): a matrix the basis covers by name, whose last dimension is its whitener's
    width, travels whitened always (gift) or where the estimates summed over the ranks say it
    helps (auto: measured on the first call after set_basis and every reselect_every calls,
    0 for that first call only, decided by rank 0 for all). Every rank must set the same basis.

    keep_nonfinite False: a NaN or Inf in the bucket fails encode_shards on a host plan
    (GiftError naming the tensor and element; the other ranks then wait in their exchange
    unless the caller tells them) and status() on a device plan. True: they travel as FP8
    NaN codes (Inf in E5M2) and every rank's result holds a NaN or Inf wherever a rank had
    one, as after an fp32 all-reduce. Either way a call whose result is not finite, or that
    never reaches decode_result, leaves this plan's error feedback and choice of
    coordinates as they were."""

    def __init__(self, world, rank, tensors, fp8="e4m3", block=128, scale_dtype="f32",
                 rounding="nearest", seed=0, op="avg", error_feedback=True, integrity=None,
                 threads=0, coords="auto", reselect_every=50, keep_nonfinite=False,
                 device=None):
        if device is not None:
            import torch
            device = torch.device(device)
            if device.type != "cuda":
                raise ValueError(f"device: {device} is not a CUDA device")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        if integrity is None:
            integrity = device is None
        config = {
            "kind": _choice("fp8", _FP8, fp8), "block": _int("block", block),
            "scale_dtype": _choice("scale_dtype", _SCALE_DTYPES, scale_dtype),
            "rounding": _choice("rounding", _ROUNDING, rounding),
            "seed": _int("seed", seed, high=2**64 - 1),
            "op": _choice("op", _REDUCE_OPS, op),
            "error_feedback": _flag("error_feedback", error_feedback),
            "integrity": _flag("integrity", integrity),
            "threads": _int("threads", threads, high=2**31 - 1),
            "coords": _choice("coords", _COORDS, coords),
            "reselect_every": _int("reselect_every", reselect_every),
            "nonfinite": 1 if _flag("keep_nonfinite", keep_nonfinite) else 0,
        }
        self._specs = []
        for name, dtype, shape in tensors:
            self._specs.append((str(name), _choice("dtype", _DTYPES, _dtype_name(dtype)),
                                [_int(f"{name}: shape", d, high=2**64 - 1) for d in shape]))
        self.world, self.rank, self.device = world, rank, device
        with _on(device):
            self._plan = _gift.ReducePlan(config, world, rank, self._specs, device is not None)

    @property
    def message_bytes(self):
        return self._plan.message_bytes

    @property
    def names(self):
        return [name for name, _, _ in self._specs]

    def set_basis(self, basis):
        """Sends the matrices `basis` (a gift.Basis, or None for none) covers in its
        coordinates from the next call on; load_state after it, since a state loads only
        into a plan holding the basis it was saved with."""
        with _on(self.device):
            self._plan.set_basis(_handle(basis))

    @property
    def coords(self):
        """"gift" or "euclidean" per tensor, in the plan's order: how it travels now."""
        return self._plan.coords

    def _stream(self, buffers, what):
        """The stream argument of a step over `buffers`, which must be where the plan is."""
        device, stream = _place(buffers, what)
        if device != self.device:
            raise ValueError(f"{what}: buffers on {device or 'the host'}, the plan on "
                             f"{self.device or 'the host'}")
        return stream

    def _tensor_addresses(self, tensors, writable):
        if len(tensors) != len(self._specs):
            raise ValueError(f"{len(tensors)} tensors for a plan of {len(self._specs)}")
        held = []
        for t, (name, code, shape) in zip(tensors, self._specs):
            b = _float_buffer(t, f"tensor {name!r}", writable)
            if b.dtype != _DTYPE_NAMES[code] or b.shape != tuple(shape):
                raise ValueError(f"tensor {name!r}: {b.dtype} {b.shape}, the plan has "
                                 f"{_DTYPE_NAMES[code]} {tuple(shape)}")
            held.append(b)
        return held

    def encode_shards(self, tensors, out=None):
        """Step 1: `world` messages, message r for rank r (world * message_bytes uint8)."""
        held = self._tensor_addresses(tensors, False)
        n = self.world * self.message_bytes
        out = _zero_bytes(tensors[0] if tensors else None, n) if out is None else out
        send = _byte_buffer(out, "out", n, writable=True)
        stream = self._stream(held + [send], "encode_shards")
        with _on(self.device):
            self._plan.encode_shards(0, [b.address for b in held], send.address, stream)
        return out

    def sum_shard(self, recv, out=None):
        """Step 3: this rank's reduced shard from the `world` messages it received."""
        r = _byte_buffer(recv, "recv", self.world * self.message_bytes)
        out = _zero_bytes(recv, self.message_bytes) if out is None else out
        o = _byte_buffer(out, "out", self.message_bytes, writable=True)
        stream = self._stream([r, o], "sum_shard")
        with _on(self.device):
            self._plan.sum_shard(r.address, o.address, stream)
        return out

    def decode_result(self, gathered, out_tensors):
        """Step 5: the all-gathered reduced messages decoded into out_tensors (which may be
        the tensors given to encode_shards: in place)."""
        g = _byte_buffer(gathered, "gathered", self.world * self.message_bytes)
        held = self._tensor_addresses(out_tensors, True)
        stream = self._stream(held + [g], "decode_result")
        with _on(self.device):
            self._plan.decode_result(g.address, 0, [b.address for b in held], stream)
        return out_tensors

    def encode_shards_at(self, addresses, out):
        """encode_shards for tensors at `addresses` (their data_ptr(), where `out` is), in
        the plan's order and of its dtypes and shapes, unchecked: one call for a whole
        bucket, without a Python object per tensor (the DDP hook's)."""
        send = _byte_buffer(out, "out", self.world * self.message_bytes, writable=True)
        stream = self._stream([send], "encode_shards_at")
        with _on(self.device):
            self._plan.encode_shards(0, addresses, send.address, stream)
        return out

    def decode_result_at(self, gathered, addresses):
        """decode_result into tensors at `addresses` (see encode_shards_at)."""
        g = _byte_buffer(gathered, "gathered", self.world * self.message_bytes)
        stream = self._stream([g], "decode_result_at")
        with _on(self.device):
            self._plan.decode_result(g.address, 0, addresses, stream)

    def abandon(self, out):
        """After a step failed on this rank (a host plan's): fills `out` (the step's output,
        whole messages: world of them for step 1's, one for step 3's) with messages that say
        so, to send in the call's remaining exchanges; the ranks that receive one fail their
        step with GIFT_ERROR_REMOTE naming this rank, instead of waiting for it."""
        m = self.message_bytes
        b = _byte_buffer(out, "out", writable=True)
        if b.nbytes % m or b.nbytes // m > self.world:
            raise ValueError(f"out: {b.nbytes} bytes are not whole messages of {m} for a world "
                             f"of {self.world}")
        self._plan.abandon(b.address, b.nbytes // m)
        return out

    def status(self):
        """Raises GiftError for what a device plan's steps saw since the last status (a
        non-finite value in an input or a sum unless kept, a message of another call or
        shard), after waiting for them. Host steps raise at once, so on the host this does
        nothing."""
        with _on(self.device):
            self._plan.status()

    def save_state(self):
        """The call counter, error-feedback residuals and choice of coordinates, for
        checkpoints: bytes, the same from host and device plans."""
        with _on(self.device):
            return self._plan.save_state()

    def load_state(self, state):
        """Restores what save_state returned, from a plan of the same config, world, rank and
        tensors (host or device), into a plan holding the same basis (set_basis first)."""
        with _on(self.device):
            self._plan.load_state(bytes(state))
