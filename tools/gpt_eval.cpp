// gpt_eval — mean cross-entropy of a saved model over a text file.
//
//   build/bin/gpt_eval --model PATH --data FILE [--seq T] [--split all|val] [--windows N]
//
// Cuts the text (or its validation split, the last 10% as the trainers use it) into consecutive
// windows of T bytes, predicts every next byte, and prints the mean loss in nats per byte.
// With --split val --seq T --windows N it reproduces a trainer's validation loss.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "io/model_file.h"
#include "comm.h"
#include "input/data.h"
#include "input/tool_flags.h"  // ToolFlags: the loop over argv
#include "runtime/device.h"
#include "model.h"
#include "inference/quant.h"

using namespace nz;

const char* const kUsage =
    "usage: gpt_eval --model PATH --data FILE [--seq T] [--split all|val] [--windows N]\n"
    "  --model    a model file written by a trainer's --save-model\n"
    "  --data     the text to score\n"
    "  --seq      window length in bytes (default: the model's context)\n"
    "  --split    all (default): the whole file; val: its last 10%, as the trainers split it\n"
    "  --windows  score only the first N windows (default: all)\n"
    "  --weights-int8   score the model as generate --weights-int8 runs it: every unit quantised\n"
    "                   to int8 (one fp32 scale per block of 64) and dequantised\n"
    "  --int8-embed 1|0 with --weights-int8: the tied embedding in int8 too (default 1)\n"
    "  --weights-int4   score the model as generate --weights-int4 runs it: int4, one fp32 scale per\n"
    "                   block (the project's quantizer, kernels/quantize.h)\n"
    "  --int4-block B   with --weights-int4: values per scale, a power of two 8..65536 (default 64)\n"
    "  --int4-embed 1|0 with --weights-int4: the tied embedding in int4 too (default 0: kept fp32)\n";

int main(int argc, char** argv) {
  Comm comm(&argc, &argv);
  std::string model_path, data_path, split = "all";
  int seq = 0, windows = 0, batch = 8, int8 = 0, int8_embed = 1;
  int int4 = 0, int4_embed = 0;  // --weights-int4 (quant.h): the embedding kept by default
  long int4_block = long(kInt4Block);
  bool int4_block_given = false;
  for (ToolFlags f(argc, argv, "gpt_eval", kUsage); f.next();) {
    if (f.is("--model")) model_path = f.value();
    else if (f.is("--data")) data_path = f.value();
    else if (f.is("--seq")) seq = int(f.whole_number(1, 1 << 24, "a positive whole number"));
    else if (f.is("--windows")) windows = int(f.whole_number(1, 1 << 24, "a positive whole number"));
    else if (f.is("--split")) split = f.value();
    else if (f.is("--weights-int8")) int8 = 1;
    else if (f.is("--weights-int4")) int4 = 1;
    else if (f.is("--int4-block")) {
      const std::string v = f.value();
      char* end;
      int4_block = strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || !valid_quant_block(int4_block))
        user_error("--int4-block %s: expected a power of two from 8 to 65536 (a whole number of bytes of codes per "
                   "block); e.g. --int4-block 32", v.c_str());
      int4_block_given = true;
    } else if (f.is("--int4-embed")) int4_embed = f.zero_or_one();
    else if (f.is("--int8-embed")) int8_embed = f.zero_or_one();
    else f.unknown();
  }
  if (model_path.empty()) user_error("--model PATH is required; see gpt_eval --help");
  if (data_path.empty()) user_error("--data FILE is required; see gpt_eval --help");
  if (int4 && int8) user_error("--weights-int4 with --weights-int8: one format at a time, expected one; drop one");
  if ((int4_block_given || int4_embed) && !int4)
    user_error("--int4-block and --int4-embed go with --weights-int4, expected it beside them; add --weights-int4");
  if (split != "all" && split != "val") user_error("--split %s: valid: all, val", split.c_str());
  check_data_file(data_path);  // a regular file of bounded size, before anything is opened
  GPTConfig cfg;
  std::vector<float> weights;
  load_model(model_path, &cfg, &weights);
  if (seq == 0) seq = cfg.ctx;
  if (seq > cfg.ctx) user_error("--seq %d: longer than the model's context %d", seq, cfg.ctx);
  select_device("cpu", 0, false);

  // The text as windows: reuse the trainers' loader for the validation split, or the whole file.
  std::vector<int> toks, tgts;  // all windows, concatenated
  if (split == "val") {
    DataLoader d(data_path, 1, seq, 0);
    int n = d.num_val_windows();
    if (windows) n = std::min(n, windows);
    toks.resize(size_t(n) * seq);
    tgts.resize(toks.size());
    for (int j = 0; j < n; j++) d.val_window(j, toks.data() + size_t(j) * seq, tgts.data() + size_t(j) * seq);
  } else {
    FILE* f = fopen(data_path.c_str(), "rb");
    if (!f) user_error("--data %s: cannot open it; give a readable text file", data_path.c_str());
    std::vector<unsigned char> bytes;
    int c;
    while ((c = fgetc(f)) != EOF) bytes.push_back((unsigned char)c);
    fclose(f);
    if (bytes.size() < size_t(seq) + 1)
      user_error("--data %s: %zu bytes, shorter than one window of --seq %d + 1", data_path.c_str(), bytes.size(), seq);
    size_t n = (bytes.size() - 1) / seq;
    if (windows) n = std::min(n, size_t(windows));
    for (size_t j = 0; j < n; j++)
      for (int t = 0; t < seq; t++) {
        toks.push_back(bytes[j * seq + t]);
        tgts.push_back(bytes[j * seq + t + 1]);
      }
  }
  const int n_windows = int(toks.size() / seq);
  if (n_windows == 0) user_error("--data %s: no complete window of %d bytes to score", data_path.c_str(), seq);

  // The model in fp32, on the CPU.
  Layout L = make_layout(cfg, 1);
  std::vector<float> params = padded_params(L, weights);
  if (int8) int8_roundtrip(L, &params, !int8_embed);  // what generate --weights-int8 computes with
  if (int4) int4_roundtrip(L, &params, !int4_embed, size_t(int4_block));  // and --weights-int4
  batch = std::min(batch, n_windows);
  GPT model(L, DType::F32, batch, seq);
  double sum = 0;
  for (int w = 0; w < n_windows; w += batch) {
    int b = std::min(batch, n_windows - w);
    model.set_batch(toks.data() + size_t(w) * seq, tgts.data() + size_t(w) * seq, b);
    for (int u = 0; u < L.num_units(); u++) model.forward(u, params.data() + L.units[u].offset);
    model.head_forward(params.data());
    sum += model.take_loss_sum();
    if (n_windows > 64 && (w / batch) % 32 == 0) fprintf(stderr, "\r%d/%d windows", w + b, n_windows);
  }
  if (n_windows > 64) fprintf(stderr, "\n");
  double mean = sum / (double(n_windows) * seq);
  printf("mean cross-entropy: %.6f nats/byte (%.4f bits/byte) over %d windows of %d bytes%s\n", mean,
         mean / std::log(2.0), n_windows, seq,
         int8 ? (int8_embed ? ", int8 weights" : ", int8 weights (embedding kept fp32)")
         : int4 ? (int4_embed ? ", int4 weights" : ", int4 weights (embedding kept fp32)") : "");
  if (int4) printf("int4: blocks of %ld values\n", int4_block);
  return 0;
}
