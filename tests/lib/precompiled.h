// precompiled.h — the headers most test programs include, compiled once into a precompiled header
// (the Makefile's TEST_PCH) and included first into every test program's object: GoogleTest's and
// the harness's take most of a test's compile time at -O0, and were parsed again for each of them.
// Only headers: adding one here changes no test (each still includes what it uses). They come
// before a test's own lines, so a macro a test defines does not reach them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "harness.h"
#include "kernels/kernels.h"
#include "ledger.h"
#include "model.h"
#include "runtime/rng.h"
#include "zero_formulas.h"
