// test_checkpoint.cpp — sharded checkpoints (docs/checkpoints.md), tested against independent
// truth: an uninterrupted run, the memory ledger, the published CRC-32C check values.
//   - CRC-32C: the check value of "123456789" and RFC 3720's test vectors;
//   - resume: a run stopped at step K and resumed with the same --steps ends with the same model
//     file, byte for byte, and the same losses for steps K+1.., for every stage, N = 1..4, with
//     accumulation, in fp32 and bf16, offload on both tiers;
//   - size: each shard holds exactly the ledger's params + master + Adam m, v of its rank (plus
//     the header docs/checkpoints.md documents), and that is the formula's;
//   - a checkpoint of another model or precision: one line, exit 2;
//   - reshard: a stage1 checkpoint of 4 ranks resumed by stage3 and by stage0_ddp on 3 ranks
//     (accum 1) gives the same model, bit for bit;
//   - consolidate: the merged model file is byte for byte the one stage0_ddp saves at that step;
//   - no temporary file outlives its writer: not a failed commit, an exit() nor SIGTERM.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>

#include "io/atomic_file.h"
#include "io/crc32c.h"
#include "harness.h"

using namespace nzt;

namespace {

const std::string kTiny = "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 "
                          "--clip 0.5 ";
const int kSteps = 6, kStop = 3;  // checkpoints every 3 steps: the resumed run starts at step 3
const std::vector<const char*>& kStages = all_stages();  // stages.txt

std::string step_dir(const std::string& ckpt_dir, int step) {
  char name[32];
  snprintf(name, sizeof name, "/step-%08d", step);
  return ckpt_dir + name;
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

// A run that checkpoints every kStop steps into its own directory.
struct CkptRun {
  RunResult run;
  std::string ckpt_dir;
};
CkptRun checkpointed(const std::string& stage, int N, const std::string& flags, const std::string& tag) {
  static int counter = 0;
  CkptRun c;
  c.ckpt_dir = temp_dir() + "/ckpt_" + stage + "_" + tag + "_" + std::to_string(counter++);
  c.run = run_trainer(stage, N, flags + " --ckpt-dir " + c.ckpt_dir + " --ckpt-every " + std::to_string(kStop), tag);
  return c;
}

// The losses from step `from` (1-based) on.
std::vector<double> losses_from(const Json& report, int from) {
  std::vector<double> out;
  for (const Json& s : report["steps_log"].arr)
    if (int(s["step"].d()) >= from) out.push_back(s["loss"].d());
  return out;
}

}  // namespace

// The check value of the CRC-32C catalogue, and RFC 3720 (iSCSI) appendix B.4's vectors.
TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(nz::crc32c(0, "123456789", 9), 0xE3069283u);
  unsigned char buf[32];
  memset(buf, 0, sizeof buf);
  EXPECT_EQ(nz::crc32c(0, buf, 32), 0x8A9136AAu);
  memset(buf, 0xff, sizeof buf);
  EXPECT_EQ(nz::crc32c(0, buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
  EXPECT_EQ(nz::crc32c(0, buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
  EXPECT_EQ(nz::crc32c(0, buf, 32), 0x113FDB5Cu);
  // in pieces of every split: the same as at once (the 8-byte rounds and the tail agree)
  const char* text = "The quick brown fox jumps over the lazy dog, twice over.";
  const size_t n = strlen(text);
  const uint32_t whole = nz::crc32c(0, text, n);
  for (size_t k = 0; k <= n; k++) EXPECT_EQ(nz::crc32c(nz::crc32c(0, text, k), text + k, n - k), whole) << k;
}

// Stop at step 3, resume with --steps 6: the same model file and losses as the run that never
// stopped, for every stage, with accumulation (2): in fp32 on 1, 3 and 4 ranks (one rank, padded
// slices, the most ranks), in bf16 on 3 (fp16's resume, with the loss scaler: test_loss_scale).
TEST(Checkpoint, ResumeIsBitForBitEveryStage) {
  struct Case { const char* prec; int N; };
  for (const Case c : {Case{"fp32", 1}, Case{"fp32", 3}, Case{"fp32", 4}, Case{"bf16", 3}})
    for (const char* stage : kStages) {
      SCOPED_TRACE(std::string(stage) + " N=" + std::to_string(c.N) + " " + c.prec);
      const std::string flags = kTiny + "--accum 2 --steps " + std::to_string(kSteps) + " --precision " + c.prec;
      CkptRun full = checkpointed(stage, c.N, flags, "full");
      ASSERT_EQ(full.run.exit_code, 0) << full.run.output;
      RunResult resumed = run_trainer(stage, c.N, flags + " --resume " + step_dir(full.ckpt_dir, kStop), "resumed");
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      EXPECT_TRUE(same_model_bits(full.run.model_path, resumed.model_path));
      EXPECT_EQ(losses_from(full.run.report, kStop + 1), losses_from(resumed.report, kStop + 1));
      EXPECT_EQ(losses_from(resumed.report, 1).size(), size_t(kSteps - kStop));  // it did not start over
    }
}

// The same for offload with its state on disk (streamed in chunks of 100 elements).
TEST(Checkpoint, ResumeIsBitForBitOffloadOnDisk) {
  const std::string flags = kTiny + "--accum 2 --steps " + std::to_string(kSteps);
  struct Case {
    std::string stage, extra;
  };
  std::vector<Case> cases;
  for (const char* prec : {"fp32", "bf16"})
    cases.push_back({"offload", std::string("--precision ") + prec + " --offload-to disk --offload-chunk 100 "
                                "--offload-dir " + fresh_dir(std::string("disk_") + prec)});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.stage + " " + c.extra);
    CkptRun full = checkpointed(c.stage, 3, flags + " " + c.extra, "full");
    ASSERT_EQ(full.run.exit_code, 0) << full.run.output;
    RunResult resumed = run_trainer(c.stage, 3, flags + " " + c.extra + " --resume " + step_dir(full.ckpt_dir, kStop),
                                    "resumed");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(same_model_bits(full.run.model_path, resumed.model_path));
    EXPECT_EQ(losses_from(full.run.report, kStop + 1), losses_from(resumed.report, kStop + 1));
  }
}

// Writing checkpoints changes nothing in the run itself.
TEST(Checkpoint, CheckpointingDoesNotChangeTheRun) {
  const std::string flags = kTiny + "--steps " + std::to_string(kSteps);
  RunResult plain = run_trainer("stage3", 3, flags, "plain");
  CkptRun ck = checkpointed("stage3", 3, flags, "ck");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(ck.run.exit_code, 0) << ck.run.output;
  EXPECT_TRUE(compare_runs(plain, ck.run).identical()) << compare_runs(plain, ck.run).str();
}

// Each rank's shard = the header of docs/checkpoints.md + exactly what the ledger says the rank holds of params,
// master and Adam m, v (summed over device, host and disk), which is also the formula's.
TEST(Checkpoint, ShardBytesEqualTheLedgersModelState) {
  for (const char* stage : kStages)
    for (const char* prec : {"fp32", "bf16"}) {
      SCOPED_TRACE(std::string(stage) + " " + prec);
      const int N = 3;
      CkptRun r = checkpointed(stage, N, kTiny + "--steps 3 --precision " + prec, "bytes");
      ASSERT_EQ(r.run.exit_code, 0) << r.run.output;
      const Json& rep = r.run.report;
      const uint64_t header = 8 + 6 * 4 + 32 * rep["units"].size();
      const Json& formula = rep["formula"];
      const uint64_t want_formula =
          formula["params"].u() + formula["master"].u() + formula["adam_m"].u() + formula["adam_v"].u();
      for (int rank = 0; rank < N; rank++) {
        uint64_t ledger = 0;
        for (const auto& [where, loc] : rep["ranks"][rank]["ledger"].obj)  // device, host, disk
          if (loc.has("peak"))
            for (const char* cat : {"params", "master", "adam_m", "adam_v"}) ledger += loc["peak"][cat].u();
        char name[32];
        snprintf(name, sizeof name, "/rank-%05d.shard", rank);
        const uint64_t bytes = file_size(step_dir(r.ckpt_dir, 3) + name);
        EXPECT_EQ(bytes, header + ledger) << "rank " << rank;
        EXPECT_EQ(ledger, want_formula) << "rank " << rank;
      }
    }
}

// Reshard: stage1's checkpoint of 4 ranks, resumed by stage3 and by stage0_ddp on 3 ranks at
// accum 1 (where every stage computes the same numbers): the same model, bit for bit. And
// consolidate: the checkpoints merged into a model file are byte for byte stage0_ddp's model file
// of the same step.
TEST(Checkpoint, ReshardAcrossStagesAndWorldSizesAndConsolidate) {
  const std::string flags = kTiny + "--steps " + std::to_string(kSteps);
  CkptRun src = checkpointed("stage1", 4, flags, "src");
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string from = " --resume " + step_dir(src.ckpt_dir, kStop);
  CkptRun z3 = checkpointed("stage3", 3, flags + from, "to_z3");
  RunResult ddp = run_trainer("stage0_ddp", 3, flags + from, "to_ddp");
  ASSERT_EQ(z3.run.exit_code, 0) << z3.run.output;
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_TRUE(compare_runs(ddp, z3.run).identical()) << compare_runs(ddp, z3.run).str();
  // and the resharded run really continued from step 3 on 3 ranks: not the 4-rank run's numbers
  EXPECT_FALSE(same_model_bits(src.run.model_path, z3.run.model_path));

  // consolidate the 3-rank stage3 checkpoint at step 6: stage0_ddp's model file of step 6
  std::string out;
  const std::string merged = temp_dir() + "/merged.model";
  int rc = run_command(bin_dir() + "/consolidate --ckpt " + z3.ckpt_dir + " --out " + merged, &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(same_model_bits(ddp.model_path, merged));
  // and the 4-rank stage1 checkpoint at step 6 is the 4-rank stage0_ddp model of step 6
  CkptRun ddp4 = checkpointed("stage0_ddp", 4, flags, "ddp4");
  ASSERT_EQ(ddp4.run.exit_code, 0) << ddp4.run.output;
  const std::string merged4 = temp_dir() + "/merged4.model";
  rc = run_command(bin_dir() + "/consolidate --ckpt " + step_dir(src.ckpt_dir, kSteps) + " --out " + merged4 +
                       " --with-optimizer", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(same_model_bits(ddp4.run.model_path, merged4));
  // --with-optimizer: Adam's m and v gathered from stage1's four slices are, byte for byte, the
  // full moments every stage0_ddp rank keeps (the two compute the same numbers at any accum)
  const std::string whole4 = temp_dir() + "/whole4.model";
  rc = run_command(bin_dir() + "/consolidate --ckpt " + ddp4.ckpt_dir + " --out " + whole4 + " --with-optimizer", &out);
  ASSERT_EQ(rc, 0) << out;
  for (const char* part : {".adam_m", ".adam_v"}) {
    EXPECT_EQ(file_size(merged4 + part), file_size(merged4)) << part;
    EXPECT_TRUE(same_model_bits(whole4 + part, merged4 + part)) << part;
  }
}

// A checkpoint of another model or precision is one line and exit code 2; nothing is trained.
TEST(Checkpoint, ResumingAnotherModelOrPrecisionIsOneLine) {
  CkptRun src = checkpointed("stage2", 2, kTiny + "--steps 3", "other");
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string ck = " --resume " + step_dir(src.ckpt_dir, 3);
  for (const std::string& change : {std::string("--layers 3"), std::string("--precision bf16")}) {
    RunResult r = run_trainer("stage2", 2, kTiny + "--steps 6 " + change + ck, "other");
    EXPECT_EQ(r.exit_code, 2) << change << ": " << r.output;
    EXPECT_NE(r.output.find(change == "--layers 3" ? "a checkpoint of another model" : "a fp32 checkpoint"),
              std::string::npos) << r.output;
    EXPECT_NE(r.output.find("HINT"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
  }
}

// A temporary file (PATH.tmp.XXXXXX) never outlives its writer: a failed commit removes it at once
// (its caller may exit() on the error, as user_error does, and skip the destructor), and so do an
// exit() and a SIGTERM (what mpirun sends a stopped job) with a writer still writing.
TEST(AtomicFile, NoTemporaryFileOutlivesItsWriter) {
  const std::string dir = fresh_dir("atomic");
  auto temporary_files = [&] {
    int n = 0;
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) n += strstr(e->d_name, ".tmp.") != nullptr;
      closedir(d);
    }
    return n;
  };
  {
    const std::string target = dir + "/target";  // a directory that is not empty: the rename fails
    mkdir(target.c_str(), 0755);
    fclose(fopen((target + "/inside").c_str(), "w"));
    nz::AtomicFile f(target);
    ASSERT_TRUE(f.write("x", 1));
    EXPECT_EQ(temporary_files(), 1);
    EXPECT_FALSE(f.commit());
    EXPECT_EQ(temporary_files(), 0) << "a failed commit leaves its temporary file: " << f.error();
  }
  for (const char* how : {"exit", "SIGTERM"}) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("NZ_KEEP_TEST_FILES", "1", 1);  // the scratch directory is the parent's to remove
      nz::AtomicFile f(dir + "/partial");
      f.write("partial", 7);
      if (strcmp(how, "exit") == 0) exit(2);  // no destructor runs
      raise(SIGTERM);
      _exit(99);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (strcmp(how, "exit") == 0) EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
    else EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "the signal still ends it: " << status;
    EXPECT_EQ(temporary_files(), 0) << how << " left the temporary file";
  }
}
