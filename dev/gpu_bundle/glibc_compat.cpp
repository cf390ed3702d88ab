// glibc_compat.cpp — linked into the GPU bundle's binaries only (make gpu-bundle, NZ_BUNDLE=1).
// The bundle links the C++ runtime statically so that the GPU machine's own libstdc++ does not
// matter; but this machine's libstdc++.a (GCC 12 on glibc 2.36) seeds std::random_device with
// arc4random, which glibc has had only since 2.36, and that one symbol would make every binary
// refuse to start on an older glibc (Ubuntu 22.04 has 2.35). Defining it here, from getrandom
// (glibc 2.25), keeps the bundle at glibc 2.34 (dev/gpu_bundle/bundle_check.sh checks the version).
#include <sys/random.h>  // getrandom

#include <cstdint>

extern "C" uint32_t arc4random(void) {
  uint32_t v = 0;
  while (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
  }
  return v;
}
