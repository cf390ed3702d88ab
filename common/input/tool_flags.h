// tool_flags.h — the tools' command lines (consolidate, gpt_eval, gpt_sample, prune, generate): the
// loop over argv they share. Each tool names its flags in one if-chain; --help (or -h) prints its
// usage and exits 0; a flag without its value, or one the tool does not know, is one line that
// points at the tool's --help (exit 2). The trainers' command line is cli.h's.
#pragma once
#include <string>

namespace nz {

class ToolFlags {
 public:
  // usage: printed as it is (no format) by --help.
  ToolFlags(int argc, char** argv, const char* tool, std::string usage);

  // Moves to the next flag; false after the last. --help and -h print the usage and exit 0.
  bool next();
  bool is(const char* name) const { return flag_ == name; }
  const std::string& flag() const { return flag_; }
  // The current flag's value: the argument after it ("--model needs a value; see TOOL --help").
  std::string value();
  // The value as a whole number from lo to hi, else one line: "FLAG V: expected <expected>" (by
  // default "a whole number from LO to HI").
  long whole_number(long lo, long hi, const char* expected = nullptr);
  // The value as 0 or 1 ("FLAG V: expected 0 or 1").
  bool zero_or_one();
  // The value as a number from lo to hi, else one line: "FLAG V: expected <expected>".
  double number(double lo, double hi, const char* expected);
  // The current flag is none of this tool's: "unknown flag FLAG; see TOOL --help".
  [[noreturn]] void unknown() const;

 private:
  int argc_, i_ = 0;
  char** argv_;
  const char* tool_;
  std::string usage_, flag_;
};

}  // namespace nz
