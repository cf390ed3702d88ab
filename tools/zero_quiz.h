// zero_quiz.h — numeric questions about ZeRO, generated from the formulas (zero_formulas.h), with
// their answer key and a grader: `zero_estimate --quiz [--seed S] [--count N]` prints the questions
// (never the key), `--quiz --key` the answer key for the instructor, and `--quiz --check FILE`
// grades a learner's answers. The same seed always gives the same questions, so a class can share
// one quiz.
//
// Every question states its conventions (GB = 10^9 bytes, what each precision keeps, what is
// counted). Where the ZeRO paper's way of counting and the exact count differ by more than the
// tolerance, both are accepted and the grader says which one an answer used: the elements sent,
// where the paper counts Ψ per reduce-scatter or all-gather (an all-reduce is 2Ψ) and a ring sends
// exactly Ψ(N-1)/N of them. (Padding a unit to a multiple of N changes the others by far less than 1%.)
//
// Question kinds: per-rank model-state bytes of a GPT-2-shaped model (vocabulary 50257, as GPT-2
// has) for a stage, world size and precision; elements each rank sends per optimizer step with
// gradient accumulation; offload's host bytes and host<->device traffic; the fewest ranks for a
// stage to fit a device; the largest model a stage fits on N devices.
#pragma once
#include <cmath>  // NAN
#include <cstdint>
#include <string>
#include <vector>

namespace nz {

struct QuizQuestion {
  std::string text;    // the question, with its unit
  double answer;       // in the question's unit
  double rel_tol;      // accepted relative error (0: exact, for counts)
  std::string unit;    // "GB", "M elements", "ranks", "B parameters"
  // Where two conventions give different answers: `answer` is the exact one, described by
  // `convention`; `paper_answer` the ZeRO paper's, described by `paper_convention`. NAN: one answer.
  std::string convention = "";
  double paper_answer = NAN;
  std::string paper_convention = "";
  std::string explanation = "";  // the worked answer, shown under a wrong one (--check --explain)
};

std::vector<QuizQuestion> make_quiz(uint64_t seed, int count);

// Grades the answers in `path` (one per line: `Q<n> <number>` or `<n> <number>`; `#` comments and
// blank lines ignored) against the quiz of (seed, count). Prints one line per question and the
// score; returns the number of questions not answered correctly. A file that cannot be read or a
// line that is not an answer is a user error (one line, exit 2). A right answer to a question with
// two conventions says which one it matched.
// explain: under each wrong answer, its worked explanation (indented lines). result: after the
// score, the result line a learner pastes for an instructor (quiz_result_line).
int check_quiz(uint64_t seed, int count, const std::string& path, bool explain = false, bool result = false);

// The result line of a graded quiz: `nzquiz1 seed=S count=C answers=A1,A2,... score=R/C code=XXXXXXXX`,
// the answers as given (`-` for none) and a check code over all of it (FNV-1a, 32 bits). The code
// catches a line edited by hand or garbled on the way; it is a checksum, not a signature: anyone with
// zero_estimate can make one, and --verify grades the answers again rather than trusting the score.
std::string quiz_result_line(uint64_t seed, int count, const std::vector<std::string>& answers, int right);
// zero_estimate --verify LINE: checks the code, grades the answers again and compares the score.
// Prints one line; returns 0 when the line holds, 1 when it does not. A line that is not a result
// line is a user error (one line, exit 2).
int verify_quiz_result(const std::string& line);

// The answer key of (seed, count), for the instructor: one line `Q<n> <answer>   # unit, tolerance`
// per question (a file of them scores 100%), the paper's answer beside the exact one where they differ.
void print_quiz_key(uint64_t seed, int count);

}  // namespace nz
