#include "pipeline/substitution.h"

namespace coloader {

std::optional<uint32_t> ReplacementFor(uint32_t i, const std::vector<bool>& failed) {
  const uint32_t n = static_cast<uint32_t>(failed.size());
  for (uint32_t k = 1; k < n; ++k)
    if (!failed[(i + k) % n]) return (i + k) % n;
  return std::nullopt;
}

}  // namespace coloader
