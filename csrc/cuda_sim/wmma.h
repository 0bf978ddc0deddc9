// nvcuda::wmma for the CUDA simulation (docs/cuda_simulation.md): 16x16x16 fragments of half or
// bfloat16 (c10's types stand in for __half and __nv_bfloat16) with float accumulators.
//
// Every operation is warp-collective, as on a GPU: all 32 lanes of a warp must reach it at the
// same call site (the block scheduler fails the launch otherwise), with the same pointer, leading
// dimension and layout (loads and stores) or the same value (fill_fragment); pointers must be
// 32-byte aligned and leading dimensions multiples of 16 bytes. Which matrix element a lane's
// x[e] holds is unspecified in CUDA; here it follows a fixed random permutation per fragment kind
// (matrix_a and matrix_b of each layout, accumulator), so kernel code that assumes any mapping
// (lane l holds row l / 4, ...) gives wrong results, while element-wise operations between
// fragments of the same kind, which CUDA allows, work. An mma's products are exact in float
// (half and bfloat16 significands are short); their sum is taken in k order, then C is added.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <string>
#include <type_traits>

#include "cuda_sim/block_scheduler.h"

using __half = c10::Half;
using __nv_bfloat16 = c10::BFloat16;

namespace specdec::sim {

enum class FragmentKind { kMatrixARow, kMatrixACol, kMatrixBRow, kMatrixBCol, kAccumulator };
constexpr int kFragmentElements = 8;  // per lane: 16 x 16 / 32

// Element e of lane l's fragment of a kind holds the matrix entry row * 16 + col =
// fragment_positions(kind)[l * 8 + e].
const std::array<uint8_t, 256>& fragment_positions(FragmentKind kind);
// Fails unless p is 32-byte aligned and ldm elements of `bytes` each a multiple of 16 bytes.
void check_matrix_pointer(const void* p, unsigned ldm, size_t bytes, const char* what,
                          const std::source_location& at);

// A lane's part in a load or a store: its fragment's elements and the matrix in memory.
template <class T>
struct MatrixAccess {
  T* x;
  const void* p;
  unsigned ldm;
  bool col_major;
};

template <class T, FragmentKind kind, bool store>
std::string access_matrix(void* const* lanes) {
  const auto* first = static_cast<MatrixAccess<T>*>(lanes[0]);
  for (int l = 1; l < 32; ++l) {
    const auto* a = static_cast<MatrixAccess<T>*>(lanes[l]);
    if (a->p != first->p || a->ldm != first->ldm || a->col_major != first->col_major)
      return "lane " + std::to_string(l) + " passes another pointer, leading dimension or layout "
             "than lane 0 (they must be the same in every lane)";
  }
  const auto& pos = fragment_positions(kind);
  T* m = static_cast<T*>(const_cast<void*>(first->p));
  for (int l = 0; l < 32; ++l) {
    T* x = static_cast<MatrixAccess<T>*>(lanes[l])->x;
    for (int e = 0; e < kFragmentElements; ++e) {
      const unsigned r = pos[l * kFragmentElements + e] / 16, c = pos[l * kFragmentElements + e] % 16;
      T& at = m[first->col_major ? c * first->ldm + r : r * first->ldm + c];
      if constexpr (store) at = x[e]; else x[e] = at;
    }
  }
  return {};
}

// Gathers the 16 x 16 matrix that a fragment of `kind` holds across the lanes, as floats;
// elements(lane argument) gives a lane's elements.
template <class T, class Elements>
std::array<float, 256> gather(void* const* lanes, Elements elements, FragmentKind kind) {
  std::array<float, 256> m{};
  const auto& pos = fragment_positions(kind);
  for (int l = 0; l < 32; ++l) {
    const T* x = elements(lanes[l]);
    for (int e = 0; e < kFragmentElements; ++e)
      m[pos[l * kFragmentElements + e]] = static_cast<float>(x[e]);
  }
  return m;
}

}  // namespace specdec::sim

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the simulation has the 16x16x16 shape only");
  static constexpr int num_elements = specdec::sim::kFragmentElements;
  T x[num_elements];
};

namespace detail {
using specdec::sim::FragmentKind;
template <class Use, class Layout>
constexpr FragmentKind kind() {
  if constexpr (std::is_same_v<Use, accumulator>) return FragmentKind::kAccumulator;
  else if constexpr (std::is_same_v<Use, matrix_a>)
    return std::is_same_v<Layout, row_major> ? FragmentKind::kMatrixARow : FragmentKind::kMatrixACol;
  else
    return std::is_same_v<Layout, row_major> ? FragmentKind::kMatrixBRow : FragmentKind::kMatrixBCol;
}

template <FragmentKind k, bool store, class T>
void access(T* x, const T* p, unsigned ldm, bool col_major, const char* what,
            const std::source_location& at) {
  specdec::sim::check_matrix_pointer(p, ldm, sizeof(T), what, at);
  specdec::sim::MatrixAccess<T> lane{x, p, ldm, col_major};
  specdec::sim::warp_collective(what, at.file_name(), static_cast<int>(at.line()), &lane,
                                &specdec::sim::access_matrix<T, k, store>);
}
}  // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm,
                      std::source_location at = std::source_location::current()) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator's load takes its layout");
  detail::access<detail::kind<Use, Layout>(), false>(f.x, p, ldm, std::is_same_v<Layout, col_major>,
                                                     "wmma::load_matrix_sync", at);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout,
                             std::source_location at = std::source_location::current()) {
  detail::access<detail::FragmentKind::kAccumulator, false>(f.x, p, ldm, layout == mem_col_major,
                                                           "wmma::load_matrix_sync", at);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout,
                              std::source_location at = std::source_location::current()) {
  detail::access<detail::FragmentKind::kAccumulator, true>(const_cast<float*>(f.x), p, ldm,
                                                          layout == mem_col_major,
                                                          "wmma::store_matrix_sync", at);
}

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& v,
                   std::source_location at = std::source_location::current()) {
  struct Lane {
    T* x;
    T v;
  } lane{f.x, v};
  specdec::sim::warp_collective(
      "wmma::fill_fragment", at.file_name(), static_cast<int>(at.line()), &lane,
      [](void* const* lanes) {
        const T v0 = static_cast<Lane*>(lanes[0])->v;
        for (int l = 0; l < 32; ++l) {
          auto* me = static_cast<Lane*>(lanes[l]);
          if (std::memcmp(&me->v, &v0, sizeof(T)) != 0)
            return "lane " + std::to_string(l) + " fills another value than lane 0 (the value "
                   "must be common to the warp: which element a lane holds is unspecified)";
          for (int e = 0; e < specdec::sim::kFragmentElements; ++e) me->x[e] = v0;
        }
        return std::string();
      });
}

// D = A B + C; d may be c.
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c,
              std::source_location at = std::source_location::current()) {
  using specdec::sim::gather;
  struct Lane {
    const T* a;
    const T* b;
    const float* c;
    float* d;
  } lane{a.x, b.x, c.x, d.x};
  specdec::sim::warp_collective(
      "wmma::mma_sync", at.file_name(), static_cast<int>(at.line()), &lane,
      [](void* const* lanes) {
        const auto A = gather<T>(lanes, [](void* l) { return static_cast<Lane*>(l)->a; },
                                 detail::kind<matrix_a, LA>());
        const auto B = gather<T>(lanes, [](void* l) { return static_cast<Lane*>(l)->b; },
                                 detail::kind<matrix_b, LB>());
        const auto C = gather<float>(lanes, [](void* l) { return static_cast<Lane*>(l)->c; },
                                     detail::FragmentKind::kAccumulator);
        std::array<float, 256> D;
        for (int r = 0; r < 16; ++r)
          for (int n = 0; n < 16; ++n) {
            float sum = 0.f;
            for (int k = 0; k < 16; ++k) sum += A[r * 16 + k] * B[k * 16 + n];
            D[r * 16 + n] = sum + C[r * 16 + n];
          }
        const auto& pos = specdec::sim::fragment_positions(detail::FragmentKind::kAccumulator);
        for (int l = 0; l < 32; ++l)
          for (int e = 0; e < specdec::sim::kFragmentElements; ++e)
            static_cast<Lane*>(lanes[l])->d[e] = D[pos[l * specdec::sim::kFragmentElements + e]];
        return std::string();
      });
}

}  // namespace nvcuda::wmma
