// crc32c.h — CRC-32C (Castagnoli), the checksum of the model file and of checkpoint shards.
//
// Polynomial 0x1EDC6F41 (reflected: 0x82F63B78), initial value and final XOR 0xFFFFFFFF; the
// check value of the nine bytes "123456789" is 0xE3069283 (tests/checkpoint/test_checkpoint.cpp). Computed
// eight bytes at a time with eight 256-entry tables ("slicing by 8"), a few hundred MB/s: a
// checkpoint's checksum costs less than writing it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nz {

// CRC-32C of n bytes, continuing from `crc` (the value returned for the bytes before them; start
// with 0). So crc32c(crc32c(0, a, na), b, nb) == crc32c(0, ab, na + nb).
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace nz
