#include "cuda_sim/wmma.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace specdec::sim {

const std::array<uint8_t, 256>& fragment_positions(FragmentKind kind) {
  // One fixed random permutation of the 256 entries per kind (seeded by the kind).
  static const auto maps = [] {
    std::array<std::array<uint8_t, 256>, 5> m;
    for (size_t k = 0; k < m.size(); ++k) {
      std::iota(m[k].begin(), m[k].end(), 0);
      std::mt19937 rng(0x5eed + static_cast<unsigned>(k));
      std::shuffle(m[k].begin(), m[k].end(), rng);
    }
    return m;
  }();
  return maps[static_cast<size_t>(kind)];
}

void check_matrix_pointer(const void* p, unsigned ldm, size_t bytes, const char* what,
                          const std::source_location& at) {
  const std::string site = std::string(what) + " at " + at.file_name() + ":" +
                           std::to_string(at.line());
  check_aligned(p, 32, site);
  if (ldm * bytes % 16 != 0)
    fail(site + ": the leading dimension " + std::to_string(ldm) + " is not a multiple of " +
         std::to_string(16 / bytes) + " elements");
}

}  // namespace specdec::sim
