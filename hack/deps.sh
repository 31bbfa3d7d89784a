#!/bin/bash
# deps.sh installs the Debian packages that holdfast's integration tests stand on: a real
# containerd + runc, the CNI plugins, a static busybox for the test images, and the tools that
# build small Wasm test modules. Idempotent; run as root on Debian 12. It touches apt only when
# a package is missing, so a prepared machine spends no time (and needs no network) here.
#
# With arguments it installs those packages instead, the same way (hack/vm/deps.sh).
set -euo pipefail

packages=(
	containerd                   # the runtime holdfast drives (1.6 on Debian 12)
	runc                         # containerd's OCI runtime
	containernetworking-plugins  # bridge, host-local, loopback, portmap in /usr/lib/cni
	iptables                     # used by the bridge and portmap plugins
	busybox-static               # /bin/busybox, the base of every test image
	curl                         # in the conformance suite's agnhost image, as upstream's has it
	iproute2                     # ip(8), to inspect and clean up bridges and netns
	wabt                         # wat2wasm, for tiny hand-written Wasm test modules
	clang                        # C to wasm32 test modules
	lld                          # wasm-ld for clang
	swtpm                        # a software TPM 2.0, for the tests of the state key sealed by a TPM
)
if (($# > 0)); then
	packages=("$@")
fi

missing=()
for pkg in "${packages[@]}"; do
	status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
	if [[ "$status" != installed ]]; then
		missing+=("$pkg")
	fi
done

if ((${#missing[@]} == 0)); then
	exit 0
fi

if ((EUID != 0)); then
	echo "$0: missing packages (${missing[*]}); run as root to install them" >&2
	exit 1
fi

echo "$0: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
