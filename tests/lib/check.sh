# check.sh — the verdict lines every shell check prints (tests/run_all.sh counts them), sourced:
#   source tests/lib/check.sh; check_suite NAME
# then:
#   pass CASE                       NZRESULT PASS NAME.CASE
#   fail CASE WHY                   NZRESULT FAIL NAME.CASE (WHY)
#   expect_error CASE WORDS CMD...  bad input: CMD must exit 2 and print exactly one line holding WORDS
check_suite() { check_name=$1; }
pass() { echo "NZRESULT PASS $check_name.$1"; }
fail() { echo "NZRESULT FAIL $check_name.$1 ($2)"; }
expect_error() {
  local name=$1 want=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc = 2 ] && grep -q -- "$want" <<<"$out" && [ "$(grep -c . <<<"$out")" = 1 ]; then pass "$name"
  else fail "$name" "exit $rc, want 2 and one line with '$want'; got: $(head -c 300 <<<"$out")"; fi
}
