// Package gatewaytest runs holdfast on a gateway that reboots for real: a Debian 12 VM
// (qemu; KVM when /dev/kvm is usable, software emulation otherwise) booted from an image
// hack/vm/build-image.sh makes with debootstrap (kernel, systemd with cgroup v2, containerd,
// runc, CNI plugins), with this checkout's holdfast installed from a payload disk as a
// firmware bundle installs it, joined to a test control plane on the host
// (internal/testenv) through the VM's uplink.
//
// The VM has two links: the uplink (qemu user networking; the host is 10.0.2.2), which the
// tests cut and restore with qemu's monitor (set_link) as a pulled cable would, and a
// management link that only carries the tests' ssh, so they can look inside a gateway whose
// uplink is down. A reboot is `systemctl reboot` in the guest; a power cut kills qemu and
// starts it again on the same disk.
//
// The scenarios (scenarios_test.go) run only with -gateway.vm (make gateway-test; make test
// runs the first two): each boots its own VM, which takes minutes under software emulation.
package gatewaytest
