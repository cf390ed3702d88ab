// tool_flags.cpp — the tools' argv loop and its value checks (tool_flags.h).
#include "input/tool_flags.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "runtime/check.h"  // user_error

namespace nz {

ToolFlags::ToolFlags(int argc, char** argv, const char* tool, std::string usage)
    : argc_(argc), argv_(argv), tool_(tool), usage_(std::move(usage)) {}

bool ToolFlags::next() {
  if (++i_ >= argc_) return false;
  flag_ = argv_[i_];
  if (flag_ == "--help" || flag_ == "-h") {
    fputs(usage_.c_str(), stdout);
    exit(0);
  }
  return true;
}

std::string ToolFlags::value() {
  if (i_ + 1 >= argc_) user_error("%s needs a value; see %s --help", flag_.c_str(), tool_);
  return argv_[++i_];
}

long ToolFlags::whole_number(long lo, long hi, const char* expected) {
  const std::string v = value();
  char* end;
  errno = 0;
  const long x = strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || errno == ERANGE || x < lo || x > hi) {
    if (expected) user_error("%s %s: expected %s", flag_.c_str(), v.c_str(), expected);
    user_error("%s %s: expected a whole number from %ld to %ld", flag_.c_str(), v.c_str(), lo, hi);
  }
  return x;
}

bool ToolFlags::zero_or_one() {
  const std::string v = value();
  if (v != "0" && v != "1") user_error("%s %s: expected 0 or 1", flag_.c_str(), v.c_str());
  return v == "1";
}

double ToolFlags::number(double lo, double hi, const char* expected) {
  const std::string v = value();
  char* end;
  const double x = strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x >= lo) || x > hi) user_error("%s %s: expected %s", flag_.c_str(), v.c_str(), expected);
  return x;
}

void ToolFlags::unknown() const { user_error("unknown flag %s; see %s --help", flag_.c_str(), tool_); }

}  // namespace nz
