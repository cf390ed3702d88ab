// mutant_precompiled.h — the headers most deliberately broken trainers include (tests/*/*mutants.mk:
// a rung's train.cpp, or one library file, with a line changed), compiled once into a precompiled
// header (the Makefile's MUTANT_PCH) and included first into every mutant's object, as the test
// programs' (precompiled.h): each mutant parsed the Trainer's headers again, most of its compile.
// Only headers: adding one here changes no mutant (each still includes what it uses, and defines no
// macro before them).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "muon.h"
#include "runtime/check.h"
#include "trainer.h"
