// crc32c.cpp — CRC-32C by table lookup, eight bytes per round (crc32c.h).
#include "io/crc32c.h"

#include <cstring>

namespace nz {
namespace {

// table[0][b]: the CRC of byte b alone (the classic one-byte table). table[k][b]: the CRC of byte
// b followed by k zero bytes, so eight bytes can be folded in with eight independent look-ups.
struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t b = 0; b < 256; b++) {
      uint32_t c = b;
      for (int bit = 0; bit < 8; bit++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
      for (int b = 0; b < 256; b++) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
};
const Tables kTables;

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto& t = kTables.t;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {  // little-endian: the first four bytes fold into c directly
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; n > 0; n--, p++) c = (c >> 8) ^ t[0][(c ^ *p) & 0xff];
  return ~c;
}

}  // namespace nz
