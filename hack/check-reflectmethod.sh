#!/bin/bash
# check-reflectmethod.sh fails when a function that calls a method by a name computed at run time
# (reflect.Value.Method, MethodByName, or a text/template or html/template execution, which do)
# becomes reachable in the firmware's binaries and is not in the baseline below.
#
# Such a caller turns off the linker's dead-code elimination of methods: every exported method
# of every reachable type is then kept, about 6 MiB of the agent (issue 31; a grpc trace page's
# html/template did it until the grpcnotrace tag). The linker marks each such function
# <ReflectMethod> in its -dumpdep output; this builds holdfast and holdfast-logger as
# hack/firmware.sh does (linux/amd64, its tags), lists the marked functions that are reachable,
# and prints the path from the program's root to each new one.
#
#   hack/check-reflectmethod.sh
#
# The baseline, hack/reflectmethod-baseline.txt, lists the callers accepted (one symbol a line;
# # starts a comment). It is empty: nothing reachable calls a method by name. Adding a line
# is a decision, with the binary size it costs measured (hack/binsize.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

baseline=hack/reflectmethod-baseline.txt
# TAGS overrides the firmware's build tags (TAGS= hack/check-reflectmethod.sh shows what grpc's
# trace page, left out by grpcnotrace, would bring back).
tags=${TAGS-$(hack/firmware.sh --tags)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail=0
for cmd in holdfast holdfast-logger; do
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -tags "$tags" -ldflags=-dumpdep \
		-o "$tmp/$cmd" "./cmd/$cmd" >"$tmp/$cmd.dep" 2>&1
	# Each line is "from -> to", written when "to" is first reached; flags (" <ReflectMethod>",
	# " <UsedInIface>") follow a name, and a name may hold spaces.
	sed -E 's/ ?<[A-Za-z]+>//g' "$tmp/$cmd.dep" >"$tmp/$cmd.edges"
	awk -F' -> ' 'NF == 2 && $2 ~ /<ReflectMethod>/ { print $2 }' "$tmp/$cmd.dep" | sed -E 's/ ?<[A-Za-z]+>//g' |
		sort -u >"$tmp/$cmd.found"
	{ grep -v -e '^#' -e '^[[:space:]]*$' "$baseline" || true; } | sort -u >"$tmp/baseline"
	comm -23 "$tmp/$cmd.found" "$tmp/baseline" >"$tmp/$cmd.new"
	n=$(wc -l <"$tmp/$cmd.found")
	if [[ ! -s $tmp/$cmd.new ]]; then
		echo "check-reflectmethod: $cmd: $n reachable callers of a method by name, all in $baseline"
		continue
	fi
	fail=1
	echo "check-reflectmethod: $cmd: reachable callers of a method by name, not in $baseline:" >&2
	while read -r sym; do
		echo "  $sym, reached by:" >&2
		# Follow each symbol's first parent back to the root.
		awk -v s="$sym" -F' -> ' '
			NF == 2 && !($2 in parent) { parent[$2] = $1 }
			END { for (x = s; (x in parent) && n < 40; n++) { x = parent[x]; print "    <- " x; if (x == "_") break } }' "$tmp/$cmd.edges" >&2
	done <"$tmp/$cmd.new"
done
if ((fail)); then
	echo "check-reflectmethod: the linker now keeps every exported method of every reachable type (about 6 MiB);" \
		"cut the path above, or add the symbol to $baseline with its cost measured" >&2
	exit 1
fi
