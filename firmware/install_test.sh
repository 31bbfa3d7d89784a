#!/bin/bash
# install_test.sh checks firmware/install.sh on a staged bundle (stand-in binaries) and a
# scratch root: a first install lays everything out; a second changes nothing; an operator's
# edits to the configuration, CNI network and manifests (one removed) survive a third (an upgrade with new
# binaries), while the binaries are replaced. Run by `make check`; needs no root.
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bundle=$tmp/bundle root=$tmp/root
mkdir -p "$bundle"/{bin,systemd,cni,manifests,policies,images}
printf '#!/bin/sh\necho v1\n' >"$bundle/bin/holdfast"
printf '#!/bin/sh\necho logger v1\n' >"$bundle/bin/holdfast-logger"
cp firmware/systemd/holdfast.service firmware/systemd/state-key-credential.conf "$bundle/systemd/"
cp firmware/config.yaml firmware/README.md firmware/install.sh "$bundle/"
cp firmware/cni/* "$bundle/cni/"
cp firmware/manifests/*.yaml "$bundle/manifests/"
cp firmware/images/README.md "$bundle/images/"

fail() { echo "install_test.sh: $*" >&2; exit 1; }
snapshot() { (cd "$root" && find . -printf '%p %m %l\n' | sort && find . -type f -exec sha256sum {} + | sort); }

sh "$bundle/install.sh" --root "$root" >/dev/null
for f in usr/bin/holdfast usr/bin/holdfast-logger etc/systemd/system/holdfast.service usr/share/doc/holdfast/examples/state-key-credential.conf \
	etc/holdfast/config.yaml etc/cni/net.d/10-holdfast.conflist usr/share/doc/holdfast/README.md; do
	[[ -f $root/$f ]] || fail "first install: $f missing"
done
[[ -x $root/usr/bin/holdfast ]] || fail "holdfast not executable"
[[ $(readlink "$root/etc/systemd/system/multi-user.target.wants/holdfast.service") == /etc/systemd/system/holdfast.service ]] ||
	fail "unit not enabled"
[[ $(stat -c %a "$root/var/lib/holdfast") == 700 ]] || fail "state dir not 0700"
[[ $(stat -c '%a %s' "$root/etc/holdfast/state.key") == "600 32" ]] || fail "state key not 32 bytes, 0600"
for m in firmware/manifests/*.yaml; do
	cmp -s "$m" "$root/etc/holdfast/manifests/$(basename "$m")" || fail "manifest $m not installed"
done

first=$(snapshot)
sh "$bundle/install.sh" --root "$root" >/dev/null
[[ $(snapshot) == "$first" ]] || fail "a second install changed the root: $(diff <(echo "$first") <(snapshot))"

# The operator edits; an upgrade brings new binaries.
echo "nodeName: gw-edited" >>"$root/etc/holdfast/config.yaml"
echo '# edited' >>"$root/etc/cni/net.d/10-holdfast.conflist"
manifest=$(basename "$(ls firmware/manifests/*.yaml | head -1)")
echo '# edited' >>"$root/etc/holdfast/manifests/$manifest"
removed=$(basename "$(ls firmware/manifests/*.yaml | tail -1)")
rm "$root/etc/holdfast/manifests/$removed"
edited=$(sha256sum "$root/etc/holdfast/config.yaml" "$root/etc/cni/net.d/10-holdfast.conflist" "$root/etc/holdfast/manifests/$manifest" "$root/etc/holdfast/state.key")
printf '#!/bin/sh\necho v2\n' >"$bundle/bin/holdfast"
sh "$bundle/install.sh" --root "$root" >/dev/null
[[ $(sha256sum "$root/etc/holdfast/config.yaml" "$root/etc/cni/net.d/10-holdfast.conflist" "$root/etc/holdfast/manifests/$manifest" "$root/etc/holdfast/state.key") == "$edited" ]] ||
	fail "the upgrade overwrote the operator's configuration or the state key"
[[ $("$root/usr/bin/holdfast") == v2 ]] || fail "the upgrade did not replace the binary"
[[ ! -e $root/etc/holdfast/manifests/$removed ]] || fail "the upgrade brought back the manifest the operator removed"
# The key moved to a systemd credential (firmware/systemd/state-key-credential.conf): an
# upgrade makes no raw key again.
rm "$root/etc/holdfast/state.key"
echo "stateKeyCredential: holdfast-state-key" >>"$root/etc/holdfast/config.yaml"
sh "$bundle/install.sh" --root "$root" >/dev/null
[[ ! -e $root/etc/holdfast/state.key ]] || fail "the upgrade made a raw state key beside the systemd credential"
echo "install_test.sh: ok (install, reinstall unchanged, upgrade keeps configuration, no raw key beside a credential)"
