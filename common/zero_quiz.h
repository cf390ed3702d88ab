// zero_quiz.h — numeric questions about ZeRO, generated from the formulas (zero_formulas.h), with
// their answer key and a grader: `zero_estimate --quiz [--seed S] [--count N]` prints them and
// `zero_estimate --quiz --check FILE` grades a learner's answers. The same seed always gives the
// same questions, so a class can share one quiz.
//
// Question kinds: per-rank model-state bytes of a GPT-2-shaped model (vocabulary 50257, as GPT-2
// has) for a stage, world size and precision; elements each rank sends per optimizer step with
// gradient accumulation; offload's host bytes and host<->device traffic; the fewest ranks for a
// stage to fit a device; the largest model a stage fits on N devices.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nz {

struct QuizQuestion {
  std::string text;    // the question, with its unit
  double answer;       // in the question's unit
  double rel_tol;      // accepted relative error (0: exact, for counts)
  std::string unit;    // "GB", "M elements", "ranks", "B parameters"
};

std::vector<QuizQuestion> make_quiz(uint64_t seed, int count);

// Grades the answers in `path` (one per line: `Q<n> <number>` or `<n> <number>`; `#` comments and
// blank lines ignored) against the quiz of (seed, count). Prints one line per question and the
// score; returns the number of questions not answered correctly. A file that cannot be read or a
// line that is not an answer is a user error (one line, exit 2).
int check_quiz(uint64_t seed, int count, const std::string& path);

}  // namespace nz
