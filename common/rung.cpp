// rung.cpp — stages.txt's columns (rung.h), read from the copy of stages.txt the build compiles in.
#include "rung.h"

#include <sstream>
#include <vector>

#include "runtime/check.h"  // user_error

namespace nz {

namespace {

// stages.txt's rung lines, as the Makefile writes them into stages_txt.inc (one string each)
const char* const kStagesTxt[] = {
#include "stages_txt.inc"
};

struct RungLine {
  std::string name;
  RungColumns columns;
};

// Every rung line, its columns read; a word that is no column stops any trainer with one line.
std::vector<RungLine> read_lines() {
  std::vector<RungLine> lines;
  for (const char* text : kStagesTxt) {
    std::istringstream words(text);
    RungLine line;
    words >> line.name;
    if (line.name[0] == '+') line.name.erase(0, 1);  // a trainer beside the ladder
    for (std::string w; words >> w;) {
      if (w == "prune-mask") line.columns.prune_mask = true;
      else if (w == "cpu-only") line.columns.cpu_only = true;
      else
        user_error("stages.txt: %s's column \"%s\" is unknown, expected prune-mask or cpu-only (its header says "
                   "what each means); fix the line and rebuild", line.name.c_str(), w.c_str());
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

RungColumns rung_columns(const std::string& rung) {
  for (const RungLine& line : read_lines())
    if (line.name == rung) return line.columns;
  return {};
}

std::string rungs_with(bool RungColumns::*column) {
  std::vector<std::string> names;
  for (const RungLine& line : read_lines())
    if (line.columns.*column) names.push_back(line.name);
  std::string list;
  for (size_t i = 0; i < names.size(); i++)
    list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return list;
}

}  // namespace nz
