// test_rung_columns.cpp — stages.txt's columns as the Trainer sees them (common/rung.h): the copy
// compiled into the library says, for every rung, what stages.txt says now (a stale copy, a word
// read wrongly or a line left out fails here), a rung without a line has the defaults, and the
// facts the trainers rely on hold (zeropp runs on the CPU only; the ladder takes --prune-mask).
// stages.txt is read here on its own, word by word, as the truth.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "rung.h"

namespace {

struct Line {
  std::string name;
  std::set<std::string> words;
};

// stages.txt's rung lines (from the repository's root, where the tests run)
std::vector<Line> stages_txt() {
  std::ifstream f("stages.txt");
  EXPECT_TRUE(f.good()) << "stages.txt not found: run the tests from the repository's root";
  std::vector<Line> lines;
  for (std::string text; std::getline(f, text);) {
    const size_t at = text.find_first_not_of('+');
    if (at == std::string::npos || !std::isalpha((unsigned char)text[at])) continue;  // comments, blank
    std::istringstream words(text.substr(at));
    Line line;
    words >> line.name;
    for (std::string w; words >> w;) line.words.insert(w);
    lines.push_back(line);
  }
  return lines;
}

TEST(RungColumns, TheLibrarysCopyIsStagesTxt) {
  const std::vector<Line> lines = stages_txt();
  ASSERT_GE(lines.size(), 8u);
  std::string takers;  // the prune-mask rungs, joined as the message joins them
  std::vector<std::string> with_mask;
  for (const Line& l : lines) {
    const nz::RungColumns c = nz::rung_columns(l.name);
    EXPECT_EQ(c.prune_mask, l.words.count("prune-mask") == 1) << l.name;
    EXPECT_EQ(c.cpu_only, l.words.count("cpu-only") == 1) << l.name;
    if (l.words.count("prune-mask")) with_mask.push_back(l.name);
  }
  for (size_t i = 0; i < with_mask.size(); i++)
    takers += (i == 0 ? "" : i + 1 == with_mask.size() ? " or " : ", ") + with_mask[i];
  EXPECT_EQ(nz::rungs_with(&nz::RungColumns::prune_mask), takers);
}

TEST(RungColumns, ARungWithoutALineHasTheDefaults) {
  const nz::RungColumns c = nz::rung_columns("no_such_rung");
  EXPECT_FALSE(c.prune_mask);
  EXPECT_FALSE(c.cpu_only);
}

// What the trainers and their docs rely on (docs/zeropp.md, docs/compression.md)
TEST(RungColumns, ZeroppIsCpuOnlyAndTheLadderTakesPruneMasks) {
  EXPECT_TRUE(nz::rung_columns("zeropp").cpu_only);
  EXPECT_FALSE(nz::rung_columns("zeropp").prune_mask);
  for (const char* r : {"pipeline", "infinity"}) EXPECT_FALSE(nz::rung_columns(r).prune_mask) << r;
  for (const char* r : {"stage0_ddp", "stage1", "stage2", "stage3", "offload"}) {
    EXPECT_TRUE(nz::rung_columns(r).prune_mask) << r;
    EXPECT_FALSE(nz::rung_columns(r).cpu_only) << r;
  }
}

}  // namespace
