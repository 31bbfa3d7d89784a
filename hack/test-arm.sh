#!/bin/bash
# test-arm.sh runs the unit tests (go test -short) of the packages that matter on a gateway
# for linux/arm64 and linux/arm (GOARM=7) under qemu-user, so that what only breaks on those
# architectures (64-bit atomics on unaligned fields on armv7, word size, wazero's interpreter
# on 32-bit ARM) shows up before a gateway does. Installs qemu-user-static if missing (root).
#
#   hack/test-arm.sh                      every package below, both architectures
#   ARM_TEST_PKGS="./offline/..." hack/test-arm.sh
#   ARM_TEST_ARCHES=arm64 hack/test-arm.sh
#
# go test's -exec runs each test binary through qemu-ARCH-static, so no binfmt_misc
# registration is needed; tests that start other binaries of the target architecture would
# need it, and the packages below start none.
set -euo pipefail
cd "$(dirname "$0")/.."

ARM_TEST_PKGS=${ARM_TEST_PKGS:-./offline/... ./wasm/... ./agent/pods/... ./agent/config/... ./agent/admission/... ./agent/logs/... ./agent/identity/... ./agent/systemd/... ./agent/cgroups/... ./agent/podcgroups/... ./agent/eviction/... ./agent/status/... ./internal/...}
ARM_TEST_ARCHES=${ARM_TEST_ARCHES:-arm64 armv7}

if ! command -v qemu-aarch64-static >/dev/null || ! command -v qemu-arm-static >/dev/null; then
	if ((EUID != 0)); then
		echo "test-arm.sh: qemu-user-static is missing; run as root to install it" >&2
		exit 1
	fi
	echo "test-arm.sh: installing qemu-user-static" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null
fi

fail=0
for arch in $ARM_TEST_ARCHES; do
	case $arch in
	arm64) env=(GOARCH=arm64) qemu=qemu-aarch64-static ;;
	armv7) env=(GOARCH=arm GOARM=7) qemu=qemu-arm-static ;;
	*) echo "test-arm.sh: unknown architecture $arch (arm64, armv7)" >&2; exit 2 ;;
	esac
	echo "test-arm.sh: $arch: go test -short $ARM_TEST_PKGS under $qemu" >&2
	start=$SECONDS
	# shellcheck disable=SC2086 # the package list is word-split on purpose
	if ! env "${env[@]}" CGO_ENABLED=0 go test -short -count=1 -exec "$qemu" $ARM_TEST_PKGS; then
		fail=1
	fi
	echo "test-arm.sh: $arch done in $((SECONDS - start))s" >&2
done
exit $fail
