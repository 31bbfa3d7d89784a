#!/bin/bash
# binsize.sh shows where the agent's binary goes, for issue 31 and for any change that moves it:
#
#   hack/binsize.sh LABEL     writes docs/runs/DATE-binsize-LABEL-COMMIT.md
#
# It builds holdfast as hack/firmware.sh does (static, stripped, -trimpath, its tags) for every
# architecture and records the sizes, the packages `go list -deps` links, and the peak RSS of
# `holdfast version` on this machine (the binary's pages touched by init, nothing else); then
# it builds the same binary unstripped for BREAKDOWN_ARCH and sums its symbols per module and
# per package (hack/binsize, which says what is measured and what is estimated).
#
#   hack/binsize.sh --compare BEFORE.md AFTER.md
#                             prints the per-module tables of two such runs side by side (est.
#                             stripped), for docs/benchmarks.md: the 12 largest modules of
#                             BEFORE, and every module whose estimate moved by 0.01 MiB or more
#
# Environment: ARCHES (default "amd64 arm64 armv7"), BREAKDOWN_ARCH (default amd64), TOP
# (packages listed, default 60), OUT (default docs/runs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if [[ ${1:-} == --compare ]]; then
	before=${2:?usage: hack/binsize.sh --compare BEFORE.md AFTER.md} after=${3:?usage: hack/binsize.sh --compare BEFORE.md AFTER.md}
	# A run's title line is "# Binary size breakdown: LABEL, COMMIT"; its per-module rows follow
	# "Per module" up to the "**all**" row, est. stripped in the 7th column.
	awk -v top=12 '
		FNR == 1 { file++; title = $0; sub(/^# Binary size breakdown: /, "", title); label[file] = title }
		/^Per module/ { inmod = 1; next }
		inmod && /^\| \*\*all/ { inmod = 0; next }
		inmod && /^\| [^-m]/ {
			split($0, f, "|"); m = f[2]; gsub(/^ +| +$/, "", m); v = f[8]; gsub(/[^0-9.]/, "", v)
			if (file == 1) { b[m] = v; order[++n] = m } else { a[m] = v; if (!(m in b)) order[++n] = m }
		}
		END {
			printf "| module | est. stripped, %s | est. stripped, %s | change |\n", label[1], label[2]
			print "| --- | ---: | ---: | ---: |"
			for (i = 1; i <= n; i++) {
				m = order[i]; d = a[m] - b[m]
				if (i <= top || d <= -0.005 || d >= 0.005)
					printf "| %s | %.2f MiB | %.2f MiB | %+.2f MiB |\n", m, b[m], a[m], d
			}
		}' "$before" "$after"
	exit 0
fi

label=${1:?usage: hack/binsize.sh LABEL}
ARCHES=${ARCHES:-amd64 arm64 armv7}
BREAKDOWN_ARCH=${BREAKDOWN_ARCH:-amd64}
TOP=${TOP:-60}
OUT=${OUT:-docs/runs}
commit=$(git rev-parse --short HEAD)
dirty=$(git diff --quiet HEAD -- . ':!docs/runs' || echo " (with uncommitted changes)")
out=$OUT/$(date -u +%F)-binsize-$label-$commit.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The packages listed are those of the build measured: its tags (grpcnotrace drops some).
tags=$(hack/firmware.sh --tags)

goarch() { if [[ $1 == armv7 ]]; then echo arm; else echo "$1"; fi; }

{
	echo "# Binary size breakdown: $label, $commit$dirty"
	echo
	echo "$(date -u '+%F %H:%M UTC'), $(go version | cut -d' ' -f3), \`hack/binsize.sh $label\`."
	echo
	echo "| architecture | holdfast (stripped) | holdfast-logger (stripped) | packages linked (go list -tags $tags -deps ./cmd/holdfast) |"
	echo "| --- | ---: | ---: | ---: |"
	for arch in $ARCHES; do
		hack/firmware.sh --build "$arch" "$tmp/$arch" >&2
		n=$(GOOS=linux GOARCH=$(goarch "$arch") GOARM=7 go list -tags "$tags" -deps ./cmd/holdfast | wc -l)
		for f in holdfast holdfast-logger; do
			s=$(stat -c %s "$tmp/$arch/$f")
			printf -v "size_$(tr - _ <<<"$f")" '%s' "$(awk -v s="$s" 'BEGIN { printf "%.1f MiB (%d bytes)", s/1048576, s }')"
		done
		echo "| linux/$arch | $size_holdfast | $size_holdfast_logger | $n |"
	done
	echo
	if [[ " $ARCHES " == *" amd64 "* && $(go env GOHOSTARCH) == amd64 ]]; then
		rss=()
		for _ in 1 2 3 4 5; do
			rss+=("$( { /usr/bin/time -v "$tmp/amd64/holdfast" version >/dev/null; } 2>&1 | awk '/Maximum resident/ { print $NF }')")
		done
		sorted=$(printf '%s\n' "${rss[@]}" | sort -n | tr '\n' ' ')
		echo "\`holdfast version\` peak RSS (linux/amd64, /usr/bin/time -v, 5 runs, KiB): $sorted"
		echo "(median $(printf '%s\n' "${rss[@]}" | sort -n | sed -n 3p | awk '{ printf "%.1f MiB", $1/1024 }'))."
		echo
	fi
	typed=$(go list -tags "$tags" -deps ./cmd/holdfast | grep -c '^k8s.io/client-go/kubernetes/typed/' || true)
	kubectl=$(go list -tags "$tags" -deps ./cmd/holdfast | grep -c '^k8s.io/kubectl/' || true)
	echo "Linked on linux/amd64: $typed typed clients of client-go (k8s.io/client-go/kubernetes/typed/...), $kubectl k8s.io/kubectl packages."
	echo
	echo "## Where linux/$BREAKDOWN_ARCH's bytes go"
	echo
	STRIP= hack/firmware.sh --build "$BREAKDOWN_ARCH" "$tmp/full" >&2
	GOOS=linux GOARCH=$(goarch "$BREAKDOWN_ARCH") GOARM=7 go list -tags "$tags" -deps \
		-f '{{.ImportPath}} {{with .Module}}{{.Path}}{{else}}std{{end}}' ./cmd/holdfast >"$tmp/pkgs"
	go run ./hack/binsize -bin "$tmp/full/holdfast" -pkgs "$tmp/pkgs" -stripped "$tmp/$BREAKDOWN_ARCH/holdfast" -top "$TOP" |
		sed "s|$tmp/full/holdfast|holdfast, unstripped|"
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "binsize.sh: $out"
