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
// stage to fit a device; the largest model a stage fits on N devices. Every sixth question is one of
// the FAQ's, and from edition 2 on (below) every seventh (i = 6, 13, ...) one of the rungs beside the
// ladder's, in turn: tensor parallelism's (tensor/formulas.h: the elements a tensor rank
// all-reduces per step, or its parameter bytes), Ulysses' (ulysses/formulas.h: the all-to-all's elements per block and rank, or the largest S)
// and Muon's (muon_formulas.h: stage1's optimizer state per rank, or gather-all's elements per step).
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

// ---- editions: what a seed's questions are ----
// A seed's questions change when the quiz gains a kind of question, and a result line, an answers file
// or a certificate of the old questions must still be graded against them, so every one names its
// edition: edition 1 (the ladder's and the FAQ's questions) is what the lines without a number say
// (`nzquiz1`, `nzcert1`, `nzquiz-answers`), edition 2 (every seventh question one of the rungs', below)
// what `nzquiz2`, `nzcert2` and `nzquiz-answers2` say. What is made now is kQuizEdition's;
// --quiz-edition 1 prints and grades the old quiz. Never change an edition's questions: add one.
constexpr int kQuizEdition = 2;   // the edition made now
constexpr int kQuizEditions = 2;  // editions 1 .. kQuizEditions are graded

std::vector<QuizQuestion> make_quiz(uint64_t seed, int count, int edition = kQuizEdition);
// The flags that print a quiz again: `--seed S --count C`, and ` --quiz-edition E` for an old edition.
std::string quiz_flags(uint64_t seed, int count, int edition);

// Grades the answers in `path` (one per line: `Q<n> <number>` or `<n> <number>`; `#` comments and
// blank lines ignored) against the quiz of (seed, count). Prints one line per question and the
// score; returns the number of questions not answered correctly. A file that cannot be read or a
// line that is not an answer is a user error (one line, exit 2). A right answer to a question with
// two conventions says which one it matched.
// explain: under each wrong answer, its worked explanation (indented lines). result: after the
// score, the result line a learner pastes for an instructor (quiz_result_line).
int check_quiz(uint64_t seed, int count, const std::string& path, bool explain = false, bool result = false,
               int edition = kQuizEdition);

// The result line of a graded quiz: `nzquiz2 seed=S count=C answers=A1,A2,... score=R/C code=XXXXXXXX`
// (`nzquiz1` in edition 1: the magic names the edition), the answers as given (`-` for none) and a
// check code over all of it (FNV-1a, 32 bits). The code catches a line edited by hand or garbled on the way; it is a checksum, not a signature: anyone with
// zero_estimate can make one, and --verify grades the answers again rather than trusting the score.
std::string quiz_result_line(uint64_t seed, int count, const std::vector<std::string>& answers, int right,
                             int edition = kQuizEdition);
// zero_estimate --verify LINE [--course-pub FILE]: a self-study result line (nzquiz1, nzquiz2) has its
// code checked and its answers graded again against its edition's quiz; a course's certificate (nzcert1,
// nzcert2) is checked with the course's
// public key (verify_certificate). Prints one line; returns 0 when the line holds, 1 when it does
// not. A line that is neither, or a field out of its range (a seed that is not a whole number from 1
// to 2^30, as --seed takes it), is a user error (one line, exit 2).
int verify_quiz_result(const std::string& line, const std::string& course_pub = "");

// The answer key of (seed, count), for the instructor: one line `Q<n> <answer>   # unit, tolerance`
// per question (a file of them scores 100%), the paper's answer beside the exact one where they differ.
void print_quiz_key(uint64_t seed, int count, int edition = kQuizEdition);

// ---- a course's quiz and its signed certificate (docs/certificates.md) ----
// The instructor makes an Ed25519 key pair once (make course-keys: DIR/course.key, mode 0600, and
// DIR/course.pub); each student answers the quiz of a seed derived from their id and the course's
// public key, in a file whose first line names them and the quiz's edition (`nzquiz-answers2
// student=ID seed=S count=C`; `nzquiz-answers ...` is an edition-1 quiz's) and where every answer
// line is an attempt, the first one to each question the one graded. The instructor signs what a student sends (--sign, with the private key, which students never hold);
// --verify checks the certificate with the public key alone. Signatures are libsodium's: in the
// WebAssembly page (no libsodium) these functions say so (one line, exit 2).

// The student ids a course accepts: 1 to 64 of A-Z a-z 0-9 . _ @ -, the first a letter or digit
// (no spaces, no path characters).
bool valid_student_id(const std::string& id);

// --course-keys DIR: a new key pair, DIR/course.key (private, 0600) and DIR/course.pub; DIR is made
// (0700) when absent. An existing key file of either name is never overwritten: one line, exit 2.
void make_course_keys(const std::string& dir);

// What a course's quiz command was given (zero_estimate --quiz with --student, --course-pub,
// --signing-key or --sign).
struct CourseQuiz {
  std::string student;      // --student ID
  std::string course_pub;   // --course-pub FILE: the course's public key
  std::string signing_key;  // --signing-key FILE: the instructor's private key (--sign)
  std::string sign_file;    // --sign FILE: a student's answers, to certify
  std::string check_file;   // --check FILE: the student's own grading, first attempts counted
  bool key = false, explain = false, result = false, seed_given = false;
  int count = 10;
  int edition = 0;            // --quiz-edition E; 0: not given (kQuizEdition, or the answers file's own)
  std::string grade_seed_of;  // --grade-seed ID: the seed of a student's hidden grading runs
  std::string grade_line;     // --sign-grade LINE: a student's exercise verdicts, to sign
};
// Prints the student's questions (with the first line of their answers file), their key (--key),
// their grading (--check) or the certificate (--sign). Returns the exit code.
int run_course_quiz(const CourseQuiz& c);

// The seed of a student's quiz: 1 + (the first 8 bytes of SHA-256("nzquiz-seed1", 0, public key,
// id), big-endian) mod 2^30, inside --seed's range, so `--quiz --seed S` gives the same questions.
uint64_t student_seed(const unsigned char public_key[32], const std::string& student);

// --verify of an nzcert1 or nzcert2 line (the edition of its quiz, inside the signed text): the
// signature with the course's public key, the seed against the student's, the first answers graded again against the score. Returns 0 verified, 1 not.
int verify_certificate(const std::string& line, const std::string& course_pub);

// ---- a course's graded exercises: the hidden runs' seed and the signed grade record ----
// make grade SUBMISSIONS=DIR SIGNING_KEY=FILE (scripts/exercises.py, docs/certificates.md) asks for each
// student's seed, picks the hidden runs' initialisation seed, data order and sizes from it
// (scripts/exercise_hidden.py), grades, and has the verdicts signed as one line:
//   nzgrade1 student=ID seed=S exercises=NAME:PASS,NAME:FAIL,... passed=R/C date=D key=K sig=SIG
// SIG the Ed25519 signature of everything before " sig=", as a quiz certificate's.

// The seed of a student's hidden grading runs: student_seed's derivation under its own tag
// ("nzgrade-seed1"), so it is not the quiz's seed and nobody chooses it.
uint64_t grade_seed(const unsigned char public_key[32], const std::string& student);

// --grade-seed ID (with --signing-key or --course-pub): prints the student's grading seed.
// --sign-grade 'nzgrade1 student=ID seed=S exercises=...' --signing-key FILE: prints the signed record
// (the seed must be the student's own with this key). Returns the exit code.
int run_course_grade(const CourseQuiz& c);

// --verify of an nzgrade1 line: the signature with the course's public key, the seed against the
// student's, the count of passes against `passed`. Returns 0 verified, 1 not.
int verify_grade_record(const std::string& line, const std::string& course_pub);

}  // namespace nz
