#!/bin/bash
# kvm-works.sh exits 0 when qemu can run the gateway VM's machine under KVM on this host, and
# otherwise prints qemu's reason on standard error and exits 1. A /dev/kvm that opens is not
# enough: a container or a nested hypervisor may pass the device through while KVM_CREATE_VM or
# the host CPU model fails, and qemu then dies at start. So this starts the same machine type,
# CPU model and size the tests use (test/gateway/vm.go), paused, and quits it at once.
set -euo pipefail
if ! [[ -r /dev/kvm && -w /dev/kvm ]]; then
	echo "/dev/kvm is not readable and writable" >&2
	exit 1
fi
if ! command -v qemu-system-x86_64 >/dev/null; then
	echo "qemu-system-x86_64 is not installed (hack/vm/deps.sh installs it)" >&2
	exit 1
fi
if ! out=$(echo quit | timeout 60 qemu-system-x86_64 -machine q35,accel=kvm -cpu host -smp 2 -m 1024 \
	-display none -nodefaults -no-user-config -S -monitor stdio 2>&1); then
	echo "qemu cannot start a KVM guest here: $(echo "$out" | grep -v '^(qemu)\|QEMU .* monitor' | tr '\n' ' ')" >&2
	exit 1
fi
