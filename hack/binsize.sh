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
		if command -v perf >/dev/null && perf record -q -e page-faults -c 1 -d -o "$tmp/faults.data" "$tmp/amd64/holdfast" version >/dev/null 2>&1; then
			# Where that peak comes from: every page fault of one run, by the section of the
			# executable it hit (or anonymous memory), and the distinct 64 KiB windows of each
			# section they hit: a fault on the executable maps the 16 pages around it that the
			# page cache holds (the kernel's fault-around), so windows x 64 KiB is about what
			# the file pages add to the RSS; an anonymous fault maps one page.
			echo "Page faults of one \`holdfast version\` (perf record -e page-faults), by where they hit:"
			echo
			echo "| where | faults | distinct 64 KiB windows | windows x 64 KiB |"
			echo "| --- | ---: | ---: | ---: |"
			perf script -i "$tmp/faults.data" -F addr 2>/dev/null | awk -v sections="$(readelf -SW "$tmp/amd64/holdfast" | sed -n 's/^ *\[ *[0-9]*\] *//p' |
				awk '$1 ~ /^\./ && $3 ~ /^0*[1-9a-f]/ { printf "%s:%s:%s ", $1, $3, $5 }')" '
				function hex(h,   i, v, c) { v = 0; h = tolower(h); for (i = 1; i <= length(h); i++) { c = index("0123456789abcdef", substr(h, i, 1)) - 1; v = v * 16 + c }; return v }
				BEGIN { n = split(sections, s, " "); for (i = 1; i <= n; i++) { split(s[i], f, ":"); name[i] = f[1]; lo[i] = hex(f[2]); hi[i] = lo[i] + hex(f[3]) } }
				NF == 1 {
					a = hex($1); where = "anonymous (heap, stacks, runtime)"
					for (i = 1; i <= n; i++) if (a >= lo[i] && a < hi[i]) { where = "executable: " name[i]; break }
					faults[where]++; w = int(a / 65536); if (!((where, w) in seen)) { seen[where, w] = 1; windows[where]++ }
				}
				END {
					for (k in faults)
						if (k ~ /^anonymous/) printf "| %s | %d | - | (one page each: %.1f MiB) |\n", k, faults[k], faults[k] / 256
						else printf "| %s | %d | %d | %.1f MiB |\n", k, faults[k], windows[k], windows[k] / 16
				}' | sort
			echo
		fi
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
