#!/usr/bin/env bash
# Prints what each failed ctest test said about its failure, for the end of
# the CI log (which is what a reader sees first; ctest's own summary names
# the tests but not why): the harness's "failed checks" block, else a
# sanitizer's SUMMARY line, else the FAIL and harness lines, else the
# output's last lines. Arguments: ctest build directories.
for dir in "$@"; do
  t="$dir/Testing/Temporary"
  [ -s "$t/LastTestsFailed.log" ] && [ -f "$t/LastTest.log" ] || continue
  failed=$(cut -d: -f2 "$t/LastTestsFailed.log" | tr '\n' ' ')
  awk -v failed=" $failed" -v where="$dir" '
    function keep(s) { if (nk < 12) k[++nk] = s }
    function done(   i, from) {
      nk = 0
      if (nsum) for (i = 1; i <= nsum; i++) keep(sum[i])
      else if (san != "") keep(san)
      else if (nfail) for (i = (nfail > 6 ? nfail - 5 : 1); i <= nfail; i++) keep(fl[i])
      else for (i = (nout > 3 ? nout - 2 : 1); i <= nout; i++) keep(out[i])
      why[name] = ""
      for (i = 1; i <= nk; i++) why[name] = why[name] "  " k[i] "\n"
    }
    /^[0-9]+\/[0-9]+ Test: / { name = $3; nout = nsum = nfail = insum = inout = 0; san = ""; next }
    /^Output:$/ { inout = 1; next }
    /^<end of output>$/ { if (name != "" && index(failed, " " name " ")) done(); inout = 0; next }
    !inout { next }
    /^---- failed checks$/ { insum = 1; next }
    insum && /^----$/ { insum = 0; next }
    insum { sum[++nsum] = $0; next }
    /^SUMMARY: [A-Za-z]+Sanitizer/ { san = $0 }
    /^FAIL |^harness: / { fl[++nfail] = $0 }
    { out[++nout] = $0 }
    END { for (n in why) printf "== why %s failed (%s)\n%s", n, where, why[n] }
  ' "$t/LastTest.log"
done
