// gtest_mpi_main.cpp — one main() for every test binary, single-process or under mpirun.
//
// - Only rank 0 prints GoogleTest's usual output; the other ranks stay quiet.
// - After the run every test's result is combined over ranks: a test passes only if it passed on
//   every rank. Rank 0 prints one machine-readable line per test, which tests/run_all.sh counts:
//       NZRESULT PASS Suite.Name
//       NZRESULT FAIL Suite.Name ranks=1,3
// - Each rank writes the name of the test it is in to $NZ_PROGRESS_DIR/rank.<r>, so that when a run
//   times out the runner can say which test each rank was stuck in.
#include <gtest/gtest.h>  // testing::InitGoogleTest, RUN_ALL_TESTS, listeners
#include <mpi.h>          // MPI_Init, MPI_Allreduce, MPI_Gather

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

class ProgressWriter : public testing::EmptyTestEventListener {
 public:
  explicit ProgressWriter(std::string path) : path_(std::move(path)) {}
  void OnTestStart(const testing::TestInfo& info) override {
    if (FILE* f = fopen(path_.c_str(), "w")) {
      fprintf(f, "%s.%s\n", info.test_suite_name(), info.name());
      fclose(f);
    }
  }
  void OnTestProgramEnd(const testing::UnitTest&) override {
    if (FILE* f = fopen(path_.c_str(), "w")) {
      fprintf(f, "(finished)\n");
      fclose(f);
    }
  }

 private:
  std::string path_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  if (const char* dir = getenv("NZ_PROGRESS_DIR"))
    listeners.Append(new ProgressWriter(std::string(dir) + "/rank." + std::to_string(rank)));

  int rc = RUN_ALL_TESTS();
  if (GTEST_FLAG_GET(list_tests)) {  // the names were listed and nothing ran: no verdict to give
    MPI_Finalize();
    return rc;
  }

  // Combine per-test results over ranks (every rank ran the same tests in the same order).
  const testing::UnitTest& ut = *testing::UnitTest::GetInstance();
  int any_failed = 0;
  for (int s = 0; s < ut.total_test_suite_count(); s++) {
    const testing::TestSuite& suite = *ut.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); t++) {
      const testing::TestInfo& info = *suite.GetTestInfo(t);
      if (!info.should_run()) continue;
      int failed = info.result()->Failed() ? 1 : 0;
      int skipped = info.result()->Skipped() ? 1 : 0;
      std::vector<int> all_failed(size), all_skipped(size);
      MPI_Gather(&failed, 1, MPI_INT, all_failed.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
      MPI_Gather(&skipped, 1, MPI_INT, all_skipped.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (rank != 0) continue;
      std::string ranks;
      bool skip_all = true;
      for (int r = 0; r < size; r++) {
        if (all_failed[r]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
        skip_all = skip_all && all_skipped[r];
      }
      const char* verdict = !ranks.empty() ? "FAIL" : (skip_all ? "SKIP" : "PASS");
      printf("NZRESULT %s %s.%s%s%s\n", verdict, suite.name(), info.name(),
             ranks.empty() ? "" : " ranks=", ranks.c_str());
      any_failed |= !ranks.empty();
    }
  }
  fflush(stdout);
  MPI_Finalize();
  return (rc != 0 || any_failed) ? 1 : 0;
}
