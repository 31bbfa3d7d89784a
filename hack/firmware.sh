#!/bin/bash
# firmware.sh builds the gateway bundles of `make firmware`:
#
#   _output/firmware/holdfast-VERSION-linux-{amd64,arm64,armv7}.tar.gz
#
# each holding holdfast and holdfast-logger (static, stripped, -trimpath, the version stamped
# into internal/version), the systemd unit, the default configuration, the CNI network, the
# static manifests, the policies and preloaded-images directories, firmware/README.md and
# install.sh (see firmware/README.md).
#
#   hack/firmware.sh                 the bundles
#   hack/firmware.sh --check-size    build the binaries only and check them against the budget
#   hack/firmware.sh --build ARCH DIR   build the binaries for ARCH into DIR, nothing else
#                                    (hack/binsize.sh; STRIP= keeps the symbols and DWARF)
#   hack/firmware.sh --tags          print the build tags the binaries are built with
#
# Environment: VERSION (default: git describe), OUT (default _output/firmware), ARCHES
# (default "amd64 arm64 armv7"), STRIP (the linker's stripping flags, default "-s -w").
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)}
STRIP=${STRIP--s -w}
OUT=${OUT:-_output/firmware}
ARCHES=${ARCHES:-amd64 arm64 armv7}

# Size budget per binary (bytes, stripped), the same for every architecture: measured sizes
# plus headroom (the figures below and in firmware/README.md). A binary over budget fails
# `make check`: a gateway's flash is small, and growth should be a decision.
# Measured 2026-12-06, linux/amd64, stripped: holdfast 31.5 MiB (arm64 29.3, armv7 29.0;
# docs/runs/2026-12-06-binsize-cut4-90b4a59.md), down from 71.5 MiB by the cuts of issue 31
# (client-go's informer factory, its full clientset and the every-group scheme it registers,
# gentype and the fakes beside it; then strategicpatch and the OpenAPI models it links, with
# client-go's tools/record; then every reachable text/template execution, which had the linker
# keep every exported method of every type; then net/http/pprof and client-go's CBOR switch;
# hack/binsize.sh shows where the bytes go), holdfast-logger 1.9 MiB (1,953,954 bytes). The
# agent gets 0.25 MiB of headroom, lowered with each cut so that growth stays a decision (issue
# 31's target is 30 MiB; a dependency that brings back a template execution or another call of
# a method by a computed name costs about 6 MiB, and make check's check-reflectmethod names
# it); the logger, one process per container, 50%, as any growth there is multiplied by the pods.
# The systemd cgroup driver (go-systemd's dbus and godbus, +360 KiB, issue 29) was a decision
# to grow past 31.75 MiB: 31.9 MiB with it (docs/runs/2026-12-06-binsize-merge-*). Then
# GCFLAGS below (2026-12-07): 29.6 MiB on amd64, and the budget is issue 31's 30 MiB.
HOLDFAST_BUDGET=${HOLDFAST_BUDGET:-$((30 * 1024 * 1024))} # 30.0 MiB
LOGGER_BUDGET=${LOGGER_BUDGET:-$((3 * 1024 * 1024))}

# The build tags of every holdfast binary. grpcnotrace leaves out grpc's golang.org/x/net/trace,
# whose html/template execution (reachable from its init) makes the linker keep every exported
# method of every type: about 6 MiB of the agent (issue 31). holdfast never enabled grpc's
# tracing. Makefile's build, hack/run.sh and the test harness (test/testenv) use the same.
TAGS=grpcnotrace

# The compiler's flags, by package (the last pattern a package matches wins). Inlining copies a
# function's body into each caller: where CPU goes, it is worth its bytes; in the rest of the
# agent it is only bytes. -l applies to the code a package compiles: the calls it makes (to
# any package, generic code it instantiates included) stay calls. Compiled with inlining: the
# runtime, sync, math, crypto, the standard library's leaves (reflect, strconv, bytes,
# strings, unicode, encoding/binary, sort, slices, maps, time, syscall, os), wazero (policies'
# compile and calls) and bbolt. With -l: everything else, that is the API machinery and its
# generated code (k8s.io/api alone is 4 MiB), the decoders, the clients of the apiserver,
# containerd and the registries, and the agent's own control code. 31.9 -> 29.6 MiB on amd64
# (issue 31; the steady state's CPU and the pod start times beside it in docs/benchmarks.md,
# 2026-12-07).
GCFLAGS=(-gcflags=all=-l)
for pkg in 'runtime/...' 'internal/...' 'sync/...' 'math/...' 'crypto/...' 'vendor/golang.org/x/crypto/...' \
	reflect strconv bytes strings 'unicode/...' encoding/binary sort slices maps time syscall os \
	'github.com/tetratelabs/wazero/...' go.etcd.io/bbolt; do
	GCFLAGS+=("-gcflags=$pkg=")
done

# build ARCH DIR: both binaries for linux/ARCH (armv7 = GOARCH=arm GOARM=7) into DIR.
build() {
	local arch=$1 dir=$2 goarch=$1 goarm=
	if [[ $arch == armv7 ]]; then
		goarch=arm goarm=7
	fi
	mkdir -p "$dir"
	CGO_ENABLED=0 GOOS=linux GOARCH=$goarch GOARM=$goarm go build -trimpath -tags "$TAGS" "${GCFLAGS[@]}" \
		-ldflags "$STRIP -X github.com/holdfast-dev/holdfast/internal/version.Version=$VERSION" \
		-o "$dir/" ./cmd/holdfast ./cmd/holdfast-logger
}

# check_size FILE BUDGET
check_size() {
	local size
	size=$(stat -c %s "$1")
	awk -v f="$1" -v s="$size" -v b="$2" 'BEGIN { printf "%-50s %5.1f MiB (budget %4.1f MiB)\n", f, s/1048576, b/1048576 }'
	if ((size > $2)); then
		echo "firmware.sh: $1 is $size bytes, over its budget of $2 bytes" >&2
		return 1
	fi
}

if [[ ${1:-} == --tags ]]; then
	echo "$TAGS"
	exit 0
fi

if [[ ${1:-} == --build ]]; then
	build "$2" "$3"
	exit 0
fi

if [[ ${1:-} == --check-size ]]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	fail=0
	for arch in $ARCHES; do
		build "$arch" "$tmp/$arch"
		check_size "$tmp/$arch/holdfast" "$HOLDFAST_BUDGET" || fail=1
		check_size "$tmp/$arch/holdfast-logger" "$LOGGER_BUDGET" || fail=1
	done
	exit $fail
fi

mkdir -p "$OUT"
for arch in $ARCHES; do
	name=holdfast-$VERSION-linux-$arch
	stage=$(mktemp -d)
	dir=$stage/$name
	build "$arch" "$dir/bin"
	check_size "$dir/bin/holdfast" "$HOLDFAST_BUDGET"
	check_size "$dir/bin/holdfast-logger" "$LOGGER_BUDGET"
	mkdir -p "$dir"/{systemd,cni,manifests,policies,images}
	cp firmware/systemd/holdfast.service firmware/systemd/state-key-credential.conf "$dir/systemd/"
	cp firmware/config.yaml firmware/README.md "$dir/"
	cp firmware/install.sh "$dir/"
	chmod 0755 "$dir/install.sh"
	cp firmware/cni/* "$dir/cni/"
	cp firmware/manifests/*.yaml "$dir/manifests/"
	cp firmware/images/README.md "$dir/images/"
	if compgen -G 'firmware/policies/*' >/dev/null; then cp -r firmware/policies/* "$dir/policies/"; fi
	# Reproducible archive: sorted names, fixed owner and time.
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='1970-01-01 00:00:00Z' \
		-C "$stage" -czf "$OUT/$name.tar.gz" "$name"
	rm -rf "$stage"
	echo "firmware.sh: $OUT/$name.tar.gz"
done
