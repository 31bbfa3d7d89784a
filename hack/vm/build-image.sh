#!/bin/bash
# build-image.sh builds the base disk of the gateway test VM (make gateway-test): a Debian 12
# root filesystem made with debootstrap from Debian's packages (kernel, systemd, containerd,
# runc, CNI plugins, an ssh server), and prints the directory that holds it:
#
#	DIR/disk.qcow2   the root filesystem (ext4 on the whole disk, /dev/vda)
#	DIR/vmlinuz      the kernel, booted directly by qemu (-kernel)
#	DIR/initrd.img   its initramfs (-initrd)
#	DIR/id_ed25519   the key root logs in with over ssh
#
# DIR is $VM_CACHE/base-HASH, HASH being that of this script (the package list and every
# setting are in it): a second run with the same script reuses the image and prints at once.
# holdfast itself is not in the base image: each test run hands the VM a fresh payload disk
# that the guest's holdfast-payload.service installs from (hack/vm/guest/).
#
# Run as root on Debian 12; installs debootstrap, qemu and e2fsprogs on the host if missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
VM_CACHE=${VM_CACHE:-/var/cache/holdfast/vm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
DISK_SIZE=3G

# What the guest runs: systemd as PID 1, containerd + runc + CNI plugins for holdfast, an ssh
# server and curl for the tests, and the least else that a bootable system needs.
guest_packages=(
	systemd systemd-sysv udev dbus kmod
	linux-image-amd64 initramfs-tools
	containerd runc containernetworking-plugins iptables
	openssh-server iproute2 procps e2fsprogs util-linux curl
)

"$here/deps.sh"

inputs_hash=$(cat "$0" "$here"/guest/* | sha256sum | cut -c1-16)
out="$VM_CACHE/base-$inputs_hash"
if [[ -f "$out/disk.qcow2" ]]; then
	echo "$out"
	exit 0
fi

mkdir -p "$VM_CACHE"
work=$(mktemp -d "$VM_CACHE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"

echo "build-image.sh: debootstrap $SUITE into $root (a few minutes)" >&2
include=$(IFS=,; echo "${guest_packages[*]}")
debootstrap --variant=minbase --include="$include" "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
	tail -30 "$work/debootstrap.log" >&2
	exit 1
}

# The kernel and initramfs qemu boots directly: no boot loader in the image.
cp "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/initrd.img"

echo gw-vm >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tgw-vm\n' >"$root/etc/hosts"
printf '/dev/vda / ext4 defaults,errors=remount-ro 0 1\n' >"$root/etc/fstab"
# No password: only the key below logs in, and the serial console is for reading.
sed -i 's/^root:[^:]*:/root:*:/' "$root/etc/shadow"

# Two NICs, told apart by the MAC addresses the tests give them (test/gateway/vm.go):
# the uplink, qemu user networking where the host (and its apiserver) is 10.0.2.2, the link the
# tests cut; and a management link the tests never cut, restricted to the ssh port forward, so
# the tests still see inside a gateway whose uplink is down. Static addresses, as gateways often
# have: a boot with the uplink down still has its address and default route.
cat >"$root/etc/systemd/network/10-uplink.network" <<'EOF'
[Match]
MACAddress=52:54:00:00:00:01

[Network]
Address=10.0.2.15/24
Gateway=10.0.2.2
DNS=10.0.2.3
ConfigureWithoutCarrier=yes
IgnoreCarrierLoss=yes
EOF
cat >"$root/etc/systemd/network/20-management.network" <<'EOF'
[Match]
MACAddress=52:54:00:00:00:02

[Network]
Address=10.0.3.15/24
ConfigureWithoutCarrier=yes
IgnoreCarrierLoss=yes
EOF
ln -sf /lib/systemd/system/systemd-networkd.service "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
# Nothing waits for "online": the point of the VM is booting with the uplink down.
ln -sf /dev/null "$root/etc/systemd/system/systemd-networkd-wait-online.service"
# Quiet, quick boots: no timers or getty on the VGA console nobody reads.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer getty@tty1.service; do
	ln -sf /dev/null "$root/etc/systemd/system/$unit"
done

# ssh: root with the key made here, no passwords; host keys made once, in the image.
ssh-keygen -q -t ed25519 -N '' -C holdfast-vm -f "$work/id_ed25519"
mkdir -p -m 0700 "$root/root/.ssh"
cp "$work/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
cat >"$root/etc/ssh/sshd_config.d/holdfast-vm.conf" <<'EOF'
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
EOF

# The payload: each test run attaches a fresh disk (/dev/vdb) with holdfast's binaries and
# firmware files; holdfast-payload.service installs them as a gateway's firmware update would.
install -m 0755 "$here/guest/holdfast-payload" "$root/usr/local/sbin/holdfast-payload"
install -m 0644 "$here/guest/holdfast-payload.service" "$root/etc/systemd/system/holdfast-payload.service"
ln -sf /etc/systemd/system/holdfast-payload.service "$root/etc/systemd/system/multi-user.target.wants/holdfast-payload.service"

# Journal on disk, so a test can read the previous boot's log after a reboot or power cut.
mkdir -p "$root/var/log/journal"

rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

echo "build-image.sh: writing the disk image" >&2
mkfs.ext4 -q -F -L root -d "$root" "$work/disk.raw" "$DISK_SIZE"
qemu-img convert -O qcow2 "$work/disk.raw" "$work/disk.qcow2"

mkdir -p "$out.tmp"
mv "$work/disk.qcow2" "$work/vmlinuz" "$work/initrd.img" "$work/id_ed25519" "$out.tmp/"
mv "$out.tmp" "$out"
echo "$out"
