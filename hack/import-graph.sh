#!/usr/bin/env bash
# The module's own import graph, from `go list` (never by hand), for docs/architecture.md.
#
#   hack/import-graph.sh           the table: each package, what of the module it imports
#                                  (non-test files), and what its tests add
#   hack/import-graph.sh layers    each package's layer: 0 imports nothing of the module,
#                                  n imports something of layer n-1 and nothing higher
#   hack/import-graph.sh check     the rules docs/architecture.md states; exit 1 if one breaks
#
# Paths are shown without the module prefix. Build tags and GOOS/GOARCH do not change the
# graph today (checked with -tags failpoints, -tags race, GOARCH=arm64, GOARCH=arm).
set -euo pipefail
shopt -s lastpipe # rule, at the end of a pipeline, sets check's fail
cd "$(dirname "$0")/.."
mod=$(go list -m)

# own FIELD...: "pkg dep dep ..." per package, the module's own packages of the fields only.
own() {
	local tmpl="{{.ImportPath}}" f
	for f in "$@"; do tmpl="$tmpl {{join .$f \" \"}}"; done
	go list -f "$tmpl" ./... |
		awk -v m="$mod/" '{ out = substr($1, length(m) + 1)
			for (i = 2; i <= NF; i++) if (index($i, m) == 1) { d = substr($i, length(m) + 1); if (!(d in seen)) { seen[d]; out = out " " d } }
			delete seen; print out }'
}

# Harness packages: everything under test/ (the judges, the test environment, the agent's
# integration suite, test-only helpers), the image writer, and the test helpers that sit
# beside the package they help (Go's httptest convention: metricstest, runtimetest, ...).
harness='^(test(/.*)?|hack/mkimage|agent/metrics/metricstest|agent/runtime/runtimetest|agent/kube/kubetest|wasm/wasmtest)$'
# The top-level folders that hold Go packages: the product's, test/ (the harnesses) and hack/.
toplevel='^(agent|cmd|internal|offline|policies|wasm|test|hack)$'

table() {
	local imports tests
	imports=$(own Imports)
	tests=$(own TestImports XTestImports)
	echo "| package | imports (module's own) | its tests add |"
	echo "| --- | --- | --- |"
	awk 'NR == FNR { t[$1] = substr($0, length($1) + 2); next }
		{ p = $1; imp = ""; for (i = 2; i <= NF; i++) { imp = imp (imp ? ", " : "") "`" $i "`"; has[$i] }
		  add = ""; n = split(t[p], b, " "); for (i = 1; i <= n; i++) if (!(b[i] in has) && b[i] != p && !(b[i] in dup)) { dup[b[i]]; add = add (add ? ", " : "") "`" b[i] "`" }
		  delete has; delete dup
		  printf "| `%s` | %s | %s |\n", p, (imp ? imp : "none"), add }' \
		<(echo "$tests") <(echo "$imports")
}

layers() {
	own Imports | awk '{ deps[$1] = ""; for (i = 2; i <= NF; i++) deps[$1] = deps[$1] " " $i; order[NR] = $1 }
		function layer(p,   n, a, i, l, best) { if (p in memo) return memo[p]; best = 0
			n = split(deps[p], a, " "); for (i = 1; i <= n; i++) { l = layer(a[i]) + 1; if (l > best) best = l }
			memo[p] = best; return best }
		END { for (i = 1; i <= NR; i++) print layer(order[i]), order[i] }' | sort -n -k1,1 -k2,2 |
		awk 'BEGIN { last = -1 } $1 != last { if (NR > 1) printf "\n"; printf "%d:", $1; last = $1 } { printf " %s", $2 } END { printf "\n" }'
}

check() {
	local imports fail=0 bad
	imports=$(own Imports)
	rule() { # rule NAME: reads offending lines on stdin; none is a pass
		local out; out=$(cat)
		if [ -z "$out" ]; then echo "ok    $1"; else echo "FAIL  $1"; echo "$out" | sed 's/^/        /'; fail=1; fi
	}
	echo "$imports" | awk '$1 == "agent/config" && NF > 1' |
		rule "agent/config imports nothing of the module"
	{ go list -deps ./agent/config | grep -E 'containerd/containerd|tetratelabs/wazero|k8s.io/client-go' || true; } |
		rule "go list -deps ./agent/config: no containerd, wazero or client-go"
	echo "$imports" | awk '$1 ~ /^offline(\/|$)/ { for (i = 2; i <= NF; i++) if ($i ~ /^agent(\/|$)/) print $1 " -> " $i }' |
		rule "offline imports nothing of agent/"
	{ go list -deps ./wasm | grep -E "^$mod/(agent|offline)(/|\$)|containerd/containerd|k8s.io/" || true; } |
		rule "wasm's deps: nothing of agent/ or offline, no containerd, no k8s.io"
	echo "$imports" | awk -v h="$harness" '$1 !~ h { for (i = 2; i <= NF; i++) if ($i ~ h) print $1 " -> " $i }' |
		rule "no product package imports a harness package (non-test files)"
	echo "$imports" | awk -v t="$toplevel" '{ split($1, p, "/"); if (p[1] !~ t) print $1 }' |
		rule "the top level holds the product (agent, cmd, internal, offline, policies, wasm), test/ (the harnesses) and hack/"
	echo "$imports" | awk -v h="$harness" '$1 ~ /^test\// { next } $1 ~ h || $1 ~ /^hack\// { next } $1 ~ /(^|\/)[a-z]+test$/ { print $1 }' |
		rule "a test helper package outside test/ (NAMEtest, beside the package it helps) is listed as a harness here"
	echo "$imports" | awk -v h="$harness" '$1 != "agent" && $1 !~ h { for (i = 2; i <= NF; i++) if ($i ~ /^agent\/(pods|runtime\/(containerd|cri|hollow))$/) print $1 " -> " $i }' |
		rule "agent/pods and the runtime backends (agent/runtime/{containerd,cri,hollow}) are imported by agent (the wiring) alone, and by harnesses"
	{ for p in $(go list ./... | grep -vE "^$mod/agent/runtime/(containerd|cri)(/|\$)|^$mod/agent\$"); do
		rel=${p#"$mod"/}; echo "$rel" | grep -qE "$harness" && continue
		go list -f '{{.ImportPath}}: {{join .Imports " "}}' "$p" | grep -oE '^[^:]*: |github.com/containerd/containerd/v2/[^ ]*' | paste -sd' ' | grep 'containerd/v2' || true
	done; } | rule "no product package but agent/runtime/{containerd,cri} and agent (the wiring) imports containerd's client packages"
	echo "$imports" | awk '$1 == "agent/runtime" { for (i = 2; i <= NF; i++) if ($i != "agent/network") print $1 " -> " $i }' |
		rule "agent/runtime (the contract) imports nothing of the module but agent/network"
	echo "$imports" | awk '{ for (i = 2; i <= NF; i++) if ($i == "wasm" && $1 !~ /^(agent\/policy|cmd\/holdfast)$/) print $1 " -> " $i }' |
		rule "wasm is imported by agent/policy and cmd/holdfast alone"
	echo "$imports" | awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^cmd\//) print $1 " -> " $i }' |
		rule "nothing imports cmd/"
	# Issue 31: client-go's clientset registers every API group and links the code of all of
	# k8s.io/api (about 20 MiB of the binary); the agent speaks through agent/kube instead.
	{ go list -deps ./cmd/holdfast | grep -E '^(k8s.io/client-go/(kubernetes|informers|listers)(/|$)|k8s.io/kubectl/|k8s.io/client-go/util/certificate|k8s.io/component-helpers/apimachinery/lease|k8s.io/apimachinery/pkg/util/strategicpatch|k8s.io/client-go/tools/record|github.com/google/gnostic-models/)' || true; } |
		rule "go list -deps ./cmd/holdfast: no client-go clientset, typed clients, informers or listers, no kubectl, no strategicpatch (nor the OpenAPI models it links)"
	return $fail
}

case "${1:-table}" in
table) table ;;
layers) layers ;;
check) check ;;
*) echo "usage: $0 [table|layers|check]" >&2; exit 2 ;;
esac
