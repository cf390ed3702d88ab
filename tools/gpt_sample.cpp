// gpt_sample — generate text from a saved model.
//
//   build/bin/gpt_sample --model PATH --prompt TEXT [--length N] [--temperature X] [--seed N] [--window T]
//
// Feeds the prompt, then samples one byte at a time from the model's softmax (scaled by the
// temperature), feeding each byte back in. The model sees the last T bytes (--window, default 64,
// the trainers' default --seq, or the context if shorter): a model trained on sequences of T bytes has never used the position
// embeddings beyond T, so a longer window would feed it untrained positions.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "io/model_file.h"
#include "comm.h"
#include "runtime/device.h"
#include "model.h"
#include "runtime/rng.h"
#include "inference/sampling.h"
#include "input/tool_flags.h"  // ToolFlags: the loop over argv

using namespace nz;

const char* const kUsage =
    "usage: gpt_sample --model PATH [--prompt TEXT] [--length N] [--temperature X] [--seed N]\n"
    "  --model        a model file written by a trainer's --save-model\n"
    "  --prompt       text to continue (default: a newline)\n"
    "  --length       bytes to generate (default 200)\n"
    "  --temperature  0 (greedy: always the likeliest byte) to 100; lower is more predictable (default 0.8)\n"
    "  --seed         random seed (default 1)\n"
    "  --window       bytes of context the model sees, at most its context; use the --seq it was\n"
    "                 trained with (default 64, the trainers' default)\n";

int main(int argc, char** argv) {
  Comm comm(&argc, &argv);
  std::string model_path, prompt = "\n";
  int length = 200;
  int window_arg = -1;  // --window; default: the trainers' default --seq, 64, or the context if shorter
  float temperature = 0.8f;
  uint64_t seed = 1;
  for (ToolFlags f(argc, argv, "gpt_sample", kUsage); f.next();) {
    if (f.is("--model")) model_path = f.value();
    else if (f.is("--prompt")) prompt = f.value();
    else if (f.is("--length")) length = int(f.whole_number(1, 1000000, "a whole number in 1..1000000"));
    else if (f.is("--temperature")) temperature = float(f.number(0, 100, "a number from 0 (greedy) to 100"));
    else if (f.is("--seed")) {
      const std::string v = f.value();
      char* end;
      errno = 0;
      unsigned long long x = strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end || v[0] == '-' || errno == ERANGE)
        user_error("--seed %s: expected a whole number from 0 to %llu", v.c_str(), ~0ull);
      seed = x;
    } else if (f.is("--window")) {
      window_arg = int(f.whole_number(1, 1 << 20, "a whole number from 1 to the model's context"));
    } else {
      f.unknown();
    }
  }
  if (model_path.empty()) user_error("--model PATH is required; see gpt_sample --help");
  if (prompt.empty()) user_error("--prompt: give at least one character");
  GPTConfig cfg;
  std::vector<float> weights;
  load_model(model_path, &cfg, &weights);
  select_device("cpu", 0, false);
  Layout L = make_layout(cfg, 1);
  std::vector<float> params = padded_params(L, weights);
  if (window_arg > cfg.ctx)
    user_error("--window %d: longer than the model's context %d; use --window %d or less", window_arg, cfg.ctx,
               cfg.ctx);
  const int T = window_arg > 0 ? window_arg : std::min(64, cfg.ctx);
  GPT model(L, DType::F32, 1, T);
  std::vector<int> ctx(prompt.begin(), prompt.end());
  for (int& c : ctx) c &= 0xff;
  std::vector<int> window(T, 0), targets(T, 0);
  std::vector<float> probs(cfg.vocab);
  Rng rng(seed);
  fputs(prompt.c_str(), stdout);
  for (int i = 0; i < length; i++) {
    // the last T bytes; positions after the text are padding the causal mask never lets it see
    int n = std::min<int>(T, int(ctx.size()));
    std::copy(ctx.end() - n, ctx.end(), window.begin());
    model.set_batch(window.data(), targets.data(), 1);
    for (int u = 0; u < L.num_units(); u++) model.forward(u, params.data() + L.units[u].offset);
    model.head_forward(params.data());
    model.probs_row(n - 1, probs.data());
    const int next = sample_byte(probs.data(), cfg.vocab, temperature, rng);
    ctx.push_back(next);
    fputc(next, stdout);
    fflush(stdout);
  }
  fputc('\n', stdout);
  return 0;
}
