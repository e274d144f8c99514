// BLAS and LAPACK, loaded when first needed: fitting a basis (and making its whitener), error
// metrics against A; encoding and decoding in GIFT coordinates apply a basis's whitener
// without them. Linked, they were loaded at every start of every program that links
// libgift: OpenBLAS's 12,000 symbol bindings, its thread pool and LAPACKE's, 4.5 ms of each
// giftc run (8 ms in all), most of which (inspect, decode, encode in Euclidean coordinates)
// never call them; and under a tight ulimit -d, OpenBLAS's pool kept giftc from starting at
// all. Their threads are OpenBLAS's own: it reads OPENBLAS_NUM_THREADS as it is loaded.
#pragma once

#include <cblas.h>
#include <lapacke.h>

#include "gift/gift.h"

namespace gift::linalg {

struct Functions {
  decltype(&::cblas_dgemm) dgemm;
  decltype(&::cblas_sgemm) sgemm;
  decltype(&::cblas_dsyrk) dsyrk;
  decltype(&::cblas_dtrmm) dtrmm;
  decltype(&::cblas_dtrsm) dtrsm;
  decltype(&::cblas_strmm) strmm;
  decltype(&::cblas_strsm) strsm;
  decltype(&::LAPACKE_dsyevd) dsyevd;
  decltype(&::LAPACKE_dgeqrf) dgeqrf;
  decltype(&::LAPACKE_dorgqr) dorgqr;
  decltype(&::LAPACKE_dpotrf) dpotrf;
};

// Loads the libraries once, from any thread: GIFT_ERROR_IO naming the library or function
// that cannot be had (on every call, the first failure's message).
giftResult_t load();
// What load() found; only once it has succeeded.
const Functions& functions();

}  // namespace gift::linalg
