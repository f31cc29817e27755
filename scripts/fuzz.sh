#!/usr/bin/env bash
# Runs every Go fuzz target (func FuzzXxx in a _test.go file) for a bounded
# time each: AIRLOCK_FUZZTIME (default 10s). A crash fails the run, and Go
# writes the input that crashed under the package's testdata/fuzz/FuzzXxx/;
# commit it with the fix so it stays in the seed corpus (plain `go test` runs
# every seed). Called by scripts/test.sh after the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/go/bin/go ] && export PATH=/usr/local/go/bin:$PATH
fuzztime=${AIRLOCK_FUZZTIME:-10s}
n=0
while IFS=: read -r file fn; do
  pkg=./$(dirname "$file")
  echo "fuzz: $fn in $pkg for $fuzztime"
  go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" -parallel 2 "$pkg"
  n=$((n + 1))
done < <(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' internal cmd | sed 's/:func /:/' | sort)
echo "fuzz: $n targets passed"
