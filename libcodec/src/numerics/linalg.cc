#include "numerics/linalg.h"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "common/error.h"

// The libraries' sonames, from those the build found (cmake/GiftOptions.cmake).
#ifndef GIFT_BLAS_SONAME
#error "GIFT_BLAS_SONAME: the BLAS library to load, by its soname"
#endif
#ifndef GIFT_LAPACKE_SONAME
#error "GIFT_LAPACKE_SONAME: the LAPACKE library to load, by its soname"
#endif

namespace gift::linalg {
namespace {

Functions loaded;
std::string failure;  // why load() failed, or empty

// Each library stays loaded for the life of the process, as a linked one would. BLAS's
// symbols are global, as a linked library's are, so that LAPACKE's LAPACK calls go to the BLAS
// library found (OpenBLAS holds LAPACK too) before the liblapack.so.3 LAPACKE depends on:
// loaded locally, a system whose liblapack.so.3 is netlib's fitted another basis.
void load_once() {
  const auto open = [](const char* soname, int scope) {
    void* h = ::dlopen(soname, RTLD_NOW | scope);
    if (!h) failure = std::string("cannot load ") + soname + ": " + ::dlerror();
    return h;
  };
  void* blas = open(GIFT_BLAS_SONAME, RTLD_GLOBAL);
  void* lapacke = blas ? open(GIFT_LAPACKE_SONAME, RTLD_LOCAL) : nullptr;
  if (!lapacke) return;
  const auto get = [](void* h, const char* soname, const char* name, auto* fn) {
    if (!failure.empty()) return;
    void* p = ::dlsym(h, name);
    if (!p) failure = std::string(soname) + " has no " + name;
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
  Functions f{};
  get(blas, GIFT_BLAS_SONAME, "cblas_dgemm", &f.dgemm);
  get(blas, GIFT_BLAS_SONAME, "cblas_sgemm", &f.sgemm);
  get(blas, GIFT_BLAS_SONAME, "cblas_dsyrk", &f.dsyrk);
  get(blas, GIFT_BLAS_SONAME, "cblas_dtrmm", &f.dtrmm);
  get(blas, GIFT_BLAS_SONAME, "cblas_dtrsm", &f.dtrsm);
  get(blas, GIFT_BLAS_SONAME, "cblas_strmm", &f.strmm);
  get(blas, GIFT_BLAS_SONAME, "cblas_strsm", &f.strsm);
  get(lapacke, GIFT_LAPACKE_SONAME, "LAPACKE_dsyevd", &f.dsyevd);
  get(lapacke, GIFT_LAPACKE_SONAME, "LAPACKE_dgeqrf", &f.dgeqrf);
  get(lapacke, GIFT_LAPACKE_SONAME, "LAPACKE_dorgqr", &f.dorgqr);
  get(lapacke, GIFT_LAPACKE_SONAME, "LAPACKE_dpotrf", &f.dpotrf);
  if (failure.empty()) loaded = f;
}

}  // namespace

giftResult_t load() {
  static std::once_flag once;
  std::call_once(once, load_once);
  if (!failure.empty()) {
    return fail(GIFT_ERROR_IO, "BLAS and LAPACK (fitting bases, whiteners, metrics against A): %s",
                failure.c_str());
  }
  return GIFT_OK;
}

const Functions& functions() { return loaded; }

}  // namespace gift::linalg
