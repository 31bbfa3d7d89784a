#!/bin/bash
# deps.sh installs what the gateway test VM needs on the host: debootstrap to build the image,
# qemu to run it (KVM when /dev/kvm is usable, software emulation otherwise), qemu-img, mkfs.ext4
# for the image and payload disks, and an ssh client. Installed as hack/deps.sh installs the
# test packages: apt runs only when a package is missing.
set -euo pipefail

packages=(
	debootstrap       # the guest's root filesystem from Debian's packages
	qemu-system-x86   # qemu-system-x86_64
	qemu-utils        # qemu-img: qcow2 base and per-run overlays
	e2fsprogs         # mkfs.ext4 -d: disk images from a directory, no loop device; debugfs: a file read off one
	openssh-client    # ssh into the guest through qemu's hostfwd
)
exec "$(dirname "$0")/../deps.sh" "${packages[@]}"
