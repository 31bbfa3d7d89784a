#!/bin/bash
# check-skips: a test that skips can pass without having run, so integration tests fail when
# the machine lacks what they need (test/prereq) instead of skipping. A call of Skip, Skipf
# or SkipNow on a test (t., b., f. or tb.) in any .go file is allowed only
#   - as the first statement of an `if testing.Short() {` block (the unit tests alone), or
#   - with a reason that is not a missing prerequisite, in a comment starting "skip-ok:" on the
#     same line or the line before: an entry point run by its own make target and flag
#     (make bench, make conformance, ...), a fuzz input too costly to run, a case that does
#     not exist on this architecture or backend.
# test/prereq is where the -short skips of prerequisites live. Prints every other skip with
# its place and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(git ls-files -co --exclude-standard '*.go' | sort -u | grep -v '^test/prereq/' | xargs awk '
	FNR == 1 { prev = "" }
	/(^|[^A-Za-z0-9_.])(t|b|f|tb)\.Skip(f|Now)?\(/ && !/^[[:space:]]*\/\// {
		ok = $0 ~ /skip-ok:/ || prev ~ /skip-ok:/ || prev ~ /^[[:space:]]*if testing\.Short\(\) \{[[:space:]]*$/
		if (!ok) print FILENAME ":" FNR ": " $0
	}
	!/^[[:space:]]*$/ { prev = $0 }
')
if [ -n "$bad" ]; then
	echo "tests that skip outside -short without a skip-ok: reason (a missing prerequisite must fail the test: test/prereq):"
	echo "$bad"
	exit 1
fi
