// Package gateway runs holdfast on a gateway that reboots for real: a Debian 12 VM
// (qemu; KVM when /dev/kvm is usable, software emulation otherwise) booted from an image
// hack/vm/build-image.sh makes with debootstrap (kernel, systemd with cgroup v2, containerd,
// runc, CNI plugins). At its first boot the guest installs this checkout's amd64 firmware
// bundle (hack/firmware.sh, as `make firmware` builds it) from a payload disk with the
// bundle's own install.sh, plus the site's configuration and bootstrap kubeconfig, and
// holdfast joins a test control plane on the host (test/testenv, with
// kube-controller-manager's CSR approver and signer) through the VM's uplink by TLS
// bootstrap with a bootstrap token.
//
// The VM has two links: the uplink (qemu user networking; the host is 10.0.2.2), which the
// tests cut and restore with qemu's monitor (set_link) as a pulled cable would, and a
// management link that only carries the tests' ssh, so they can look inside a gateway whose
// uplink is down. A reboot is `systemctl reboot` in the guest; a power cut kills qemu and
// starts it again on the same disk. A VM may have a TPM 2.0 (VMOptions.TPMStateDir): a swtpm
// on the host per VM, whose state directory is the chip, so that a copy of a VM's disk
// (CopyDisk) booted in another VM meets another TPM, as a stolen disk does.
//
// The scenarios (scenarios_test.go; the systemd cgroup driver's, 10 to 12, in systemd_test.go)
// run only with -gateway.vm (make gateway-test; make test runs the first two): each boots its
// own VM, which takes minutes under software emulation. A scenario may boot the guest with
// kernel arguments of its own (VMOptions.KernelArgs: scenario 12's cgroup v1) and give it a
// containerd configuration (PayloadOptions.ContainerdConfig: scenario 11's CRI plugin).
package gateway
