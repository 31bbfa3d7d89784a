#!/bin/sh
# install.sh installs holdfast from this bundle into a root file system:
#
#   ./install.sh [--root DIR]      (default /: this machine)
#
# Idempotent: run it again (an upgrade) and it replaces what the bundle owns (the binaries,
# the systemd unit, the preloaded images, the documentation) and leaves alone what the
# operator owns once installed (the configuration and the CNI network: a file already there is
# kept; the static manifests and policies: installed with their directory, on the first run
# only). It enables the unit
# (multi-user.target) and, on a running system, reloads systemd; it never starts or restarts
# holdfast. POSIX sh: the target may be a minimal gateway image.
set -eu

root=/
while [ $# -gt 0 ]; do
	case $1 in
	--root) root=${2:?--root needs a directory}; shift 2 ;;
	--root=*) root=${1#--root=}; shift ;;
	-h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "install.sh: unknown argument $1 (usage: install.sh [--root DIR])" >&2; exit 2 ;;
	esac
done
root=${root%/}
bundle=$(cd "$(dirname "$0")" && pwd)

say() { echo "install.sh: $*"; }

# replace SRC DST MODE: the bundle's file, always (written beside, then renamed over).
replace() {
	mkdir -p "$(dirname "$2")"
	cp "$1" "$2.new.$$"
	chmod "$3" "$2.new.$$"
	mv -f "$2.new.$$" "$2"
	say "installed $2"
}

# keep SRC DST MODE: the bundle's file only if the operator has none.
keep() {
	if [ -e "$2" ]; then
		say "kept existing $2"
		return 0
	fi
	replace "$1" "$2" "$3"
}

replace "$bundle/bin/holdfast" "$root/usr/bin/holdfast" 0755
replace "$bundle/bin/holdfast-logger" "$root/usr/bin/holdfast-logger" 0755
replace "$bundle/systemd/holdfast.service" "$root/etc/systemd/system/holdfast.service" 0644
replace "$bundle/README.md" "$root/usr/share/doc/holdfast/README.md" 0644
# An example, for operators who hand the state key over as a systemd credential.
replace "$bundle/systemd/state-key-credential.conf" "$root/usr/share/doc/holdfast/examples/state-key-credential.conf" 0644

keep "$bundle/config.yaml" "$root/etc/holdfast/config.yaml" 0644
for f in "$bundle"/cni/*; do
	if [ -f "$f" ]; then keep "$f" "$root/etc/cni/net.d/$(basename "$f")" 0644; fi
done
# Static manifests and policies only on the first install (their directory does not exist
# yet): removing a manifest is how an operator stops a static pod, and an upgrade must not
# bring it back.
for d in manifests policies; do
	if [ -d "$root/etc/holdfast/$d" ]; then
		say "kept existing $root/etc/holdfast/$d/"
		continue
	fi
	mkdir -p "$root/etc/holdfast/$d"
	for f in "$bundle/$d"/*; do
		if [ -f "$f" ]; then replace "$f" "$root/etc/holdfast/$d/$(basename "$f")" 0644; fi
	done
done
mkdir -p "$root/usr/lib/holdfast/images"
for f in "$bundle"/images/*.tar; do
	if [ -f "$f" ]; then replace "$f" "$root/usr/lib/holdfast/images/$(basename "$f")" 0644; fi
done
# The agent's state: the offline store, the node's key and certificates.
mkdir -p "$root/var/lib/holdfast"
chmod 0700 "$root/var/lib/holdfast"
# The key that encrypts the Secrets and service-account tokens kept for offline reboots
# (stateKeyFile): made once per gateway, never replaced, since a new key makes what the store
# holds unreadable. An image built for many gateways should leave it out and let the first boot's
# install make it, so that no two gateways share a key.
# Nor when the configuration takes the key from a systemd credential (stateKeyCredential):
# a raw key beside it would be unused, and readable by whoever holds the disk.
if [ -e "$root/etc/holdfast/state.key" ]; then
	say "kept existing $root/etc/holdfast/state.key"
elif grep -Eq '^[[:space:]]*stateKeyCredential:[[:space:]]*[^[:space:]#]' "$root/etc/holdfast/config.yaml" 2>/dev/null; then
	say "made no $root/etc/holdfast/state.key: config.yaml takes the key from a systemd credential (stateKeyCredential)"
else
	(umask 077 && head -c 32 /dev/urandom >"$root/etc/holdfast/state.key.new.$$")
	mv -f "$root/etc/holdfast/state.key.new.$$" "$root/etc/holdfast/state.key"
	say "made $root/etc/holdfast/state.key (32 random bytes, 0600)"
fi

# Enable at boot, as `systemctl enable` would (works on an image that is not running).
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sfn /etc/systemd/system/holdfast.service "$root/etc/systemd/system/multi-user.target.wants/holdfast.service"
say "enabled holdfast.service"
if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload
	say "systemd reloaded; start with: systemctl start holdfast"
fi
