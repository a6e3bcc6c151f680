// Sizes rounded up to an alignment: pages for shared memory, 256 B or 2 MiB for device memory.
#pragma once

#include <cstdint>

namespace coloader {

constexpr uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace coloader
