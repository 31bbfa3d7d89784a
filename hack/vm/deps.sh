#!/bin/bash
# deps.sh installs what the gateway test VM needs on the host: debootstrap to build the image,
# qemu to run it (KVM when /dev/kvm is usable, software emulation otherwise), qemu-img, mkfs.ext4
# for the image and payload disks, and an ssh client. Idempotent, like hack/deps.sh: apt runs
# only when a package is missing.
set -euo pipefail

packages=(
	debootstrap       # the guest's root filesystem from Debian's packages
	qemu-system-x86   # qemu-system-x86_64
	qemu-utils        # qemu-img: qcow2 base and per-run overlays
	e2fsprogs         # mkfs.ext4 -d: disk images from a directory, no loop device
	openssh-client    # ssh into the guest through qemu's hostfwd
)

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
	echo "hack/vm/deps.sh: missing packages (${missing[*]}); run as root to install them" >&2
	exit 1
fi
echo "hack/vm/deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
