package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/repo"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// MAC addresses of the guest's two NICs: the image's systemd-networkd configuration matches
// them (hack/vm/build-image.sh).
const (
	uplinkMAC     = "52:54:00:00:00:01"
	managementMAC = "52:54:00:00:00:02"
)

// HostFromGuest is the host's address on the guest's uplink (qemu user networking): a
// connection to it reaches the host's loopback, where the test control plane listens.
const HostFromGuest = "10.0.2.2"

// Image is a base image built by hack/vm/build-image.sh.
type Image struct {
	Dir string // holds disk.qcow2, vmlinuz, initrd.img, id_ed25519
}

// BuildImage runs hack/vm/build-image.sh (a no-op when the image for the current script is
// cached) and returns the image. The first build takes minutes (debootstrap).
func BuildImage(t testing.TB) Image {
	t.Helper()
	script := filepath.Join(repo.Root(t), "hack", "vm", "build-image.sh")
	start := time.Now()
	cmd := exec.Command(script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build the VM image (%s): %v", script, err)
	}
	// The directory is the script's last line: a first build's mkfs.ext4 -d also writes to
	// standard output ("Creating regular file ...").
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	t.Logf("VM image %s (%v)", dir, time.Since(start).Round(time.Millisecond))
	return Image{Dir: dir}
}

// VMOptions configures StartVM.
type VMOptions struct {
	// Payload is the payload disk (see BuildPayload) attached as /dev/vdb.
	Payload string
	// MemoryMiB is the guest's memory. Defaults to 1024.
	MemoryMiB int
	// CPUs is the guest's CPU count. Defaults to 2.
	CPUs int
	// TPMStateDir gives the VM a TPM 2.0 (/dev/tpmrm0 in the guest): a host swtpm per VM on
	// this state directory, which is the chip: kept across reboots and power cuts of the VM,
	// and another directory is another chip. Empty: no TPM.
	TPMStateDir string
	// Disk is a qcow2 disk to boot from (CopyDisk of another VM's), in place of a new
	// copy-on-write overlay of the image. The VM writes to it.
	Disk string
	// UplinkDown powers the VM on with its uplink cut.
	UplinkDown bool
	// KernelArgs are added to the guest kernel's command line at every boot, e.g.
	// systemd.unified_cgroup_hierarchy=0 for systemd's cgroup v1 (legacy) hierarchy.
	KernelArgs []string
}

// VM is a qemu virtual machine booted from a copy-on-write overlay of an Image (or from
// VMOptions.Disk). Its disk survives Reboot, PowerCut and PowerOff; the overlay is deleted
// with the test.
type VM struct {
	t       testing.TB
	dir     string
	image   Image
	opts    VMOptions
	overlay string
	key     string // a copy of the image's ssh key, mode 0600 as ssh wants
	sshPort int
	monitor string // qemu's human monitor, a unix socket
	qemu    *testenv.Process
	tpm     *testenv.SWTPM // nil without VMOptions.TPMStateDir
	uplink  bool           // the uplink's state; kept across PowerCut
	// PoweredOn is when qemu was last started (StartVM, PowerCut); a reboot inside the guest
	// does not change it.
	PoweredOn time.Time
	// Accel is "kvm" or "tcg" (software emulation).
	Accel string
}

// StartVM boots a VM from image with the payload disk, uplink up unless opts.UplinkDown, and
// stops it (and its TPM) when t ends.
// It returns once qemu runs; WaitSSH waits for the guest.
func StartVM(t testing.TB, image Image, opts VMOptions) *VM {
	t.Helper()
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = 1024
	}
	if opts.CPUs == 0 {
		opts.CPUs = 2
	}
	dir := t.TempDir()
	vm := &VM{t: t, dir: dir, image: image, opts: opts, uplink: !opts.UplinkDown,
		overlay: filepath.Join(dir, "disk.qcow2"),
		key:     filepath.Join(dir, "id_ed25519"),
		monitor: filepath.Join(dir, "monitor.sock"),
	}
	accel, why := accelerator()
	vm.Accel = accel
	t.Logf("qemu accelerator %s: %s", accel, why)
	key, err := os.ReadFile(filepath.Join(image.Dir, "id_ed25519"))
	if err != nil {
		t.Fatalf("start VM: %v", err)
	}
	if err := os.WriteFile(vm.key, key, 0o600); err != nil {
		t.Fatalf("start VM: %v", err)
	}
	if opts.Disk != "" {
		vm.overlay = opts.Disk
	} else if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2",
		"-b", filepath.Join(image.Dir, "disk.qcow2"), vm.overlay).CombinedOutput(); err != nil {
		t.Fatalf("start VM: qemu-img create: %v: %s", err, out)
	}
	if opts.TPMStateDir != "" {
		// Registered before qemu's cleanup, so it runs after: swtpm outlives qemu.
		vm.tpm = testenv.StartSWTPMWith(t, testenv.SWTPMOptions{StateDir: opts.TPMStateDir, ForQEMU: true})
	}
	vm.sshPort, err = freePort()
	if err != nil {
		t.Fatalf("start VM: %v", err)
	}
	vm.qemu = testenv.NewProcess("qemu", filepath.Join(dir, "qemu.log"), vm.argv()...)
	t.Cleanup(func() {
		if vm.qemu.Running() {
			_ = vm.qemu.Stop(syscall.SIGKILL, 10*time.Second)
		}
	})
	vm.powerOn()
	return vm
}

// accelerator is kvm when qemu can run a KVM guest here (hack/vm/kvm-works.sh: a /dev/kvm that
// opens is not enough behind a nested hypervisor), tcg (software emulation) otherwise, with
// the probe's reason.
var accelerator = sync.OnceValues(func() (accel, why string) {
	out, err := exec.Command("../../hack/vm/kvm-works.sh").CombinedOutput()
	if err != nil {
		return "tcg", strings.TrimSpace(string(out))
	}
	return "kvm", "KVM works here"
})

func (vm *VM) argv() []string {
	cpu := "max"
	if vm.Accel == "kvm" {
		cpu = "host"
	}
	argv := []string{
		"qemu-system-x86_64",
		"-machine", "q35,accel=" + vm.Accel,
		"-cpu", cpu,
		"-smp", strconv.Itoa(vm.opts.CPUs),
		"-m", strconv.Itoa(vm.opts.MemoryMiB),
		"-display", "none",
		// Started paused: powerOn sets the uplink's state before the guest runs.
		"-S",
		"-monitor", "unix:" + vm.monitor + ",server=on,wait=off",
		"-serial", "file:" + filepath.Join(vm.dir, "console.log"),
		"-kernel", filepath.Join(vm.image.Dir, "vmlinuz"),
		"-initrd", filepath.Join(vm.image.Dir, "initrd.img"),
		"-append", strings.Join(append([]string{"root=/dev/vda rw console=ttyS0 loglevel=4 panic=1"}, vm.opts.KernelArgs...), " "),
		// cache=writeback: what the guest wrote but did not flush is lost when qemu is killed,
		// as in a power cut; what it flushed is on the host.
		"-drive", "file=" + vm.overlay + ",if=virtio,format=qcow2,cache=writeback",
		"-drive", "file=" + vm.opts.Payload + ",if=virtio,format=raw,readonly=on",
		"-netdev", "user,id=uplink",
		"-device", "virtio-net-pci,netdev=uplink,mac=" + uplinkMAC,
		// The management link reaches nothing but the ssh port forward.
		"-netdev", fmt.Sprintf("user,id=mgmt,net=10.0.3.0/24,restrict=on,hostfwd=tcp:127.0.0.1:%d-10.0.3.15:22", vm.sshPort),
		"-device", "virtio-net-pci,netdev=mgmt,mac=" + managementMAC,
	}
	if vm.tpm != nil {
		// A TIS TPM at the standard address, described by ACPI (MSFT0101): the guest kernel's
		// built-in tpm_tis driver gives /dev/tpm0 and /dev/tpmrm0.
		argv = append(argv,
			"-chardev", "socket,id=chrtpm,path="+vm.tpm.Ctrl,
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
			"-device", "tpm-tis,tpmdev=tpm0")
	}
	return argv
}

// powerOn starts qemu paused (and its TPM first, which ended with the previous qemu), sets
// the uplink as it was, and lets the guest run.
func (vm *VM) powerOn() {
	vm.t.Helper()
	if vm.tpm != nil && !vm.tpm.Running() {
		vm.tpm.Start(vm.t)
	}
	_ = os.Remove(vm.monitor)
	if err := vm.qemu.Start(); err != nil {
		vm.t.Fatalf("start qemu: %v", err)
	}
	vm.PoweredOn = time.Now()
	testenv.Eventually(vm.t, 30*time.Second, "qemu's monitor", func() error {
		if !vm.qemu.Running() {
			vm.t.Fatalf("qemu (%s) ended before its monitor answered: %v\n%s",
				vm.Accel, vm.qemu.ExitError(), vm.qemu.LogTail(30))
		}
		_, err := vm.hmp("info status")
		return err
	})
	if !vm.uplink {
		vm.mustHMP("set_link uplink off")
	}
	vm.mustHMP("cont")
}

// SetUplink brings the guest's uplink up or down, as a cut cable would: the guest sees its
// carrier go.
func (vm *VM) SetUplink(up bool) {
	vm.t.Helper()
	state := "off"
	if up {
		state = "on"
	}
	vm.mustHMP("set_link uplink " + state)
	vm.uplink = up
}

// PowerCut kills qemu (no shutdown, nothing flushed) and starts it again on the same disk.
// The TPM loses its power too: it starts again on its state, as a chip does.
func (vm *VM) PowerCut() {
	vm.t.Helper()
	if err := vm.qemu.Stop(syscall.SIGKILL, 10*time.Second); err != nil && vm.qemu.Running() {
		vm.t.Fatalf("power cut: %v", err)
	}
	vm.stopTPM()
	vm.powerOn()
}

// PowerOff shuts the guest down from inside (systemctl poweroff) and waits until qemu has
// ended, then stops the TPM: the disk is then as a gateway switched off leaves it, everything
// flushed. The VM stays off.
func (vm *VM) PowerOff(timeout time.Duration) {
	vm.t.Helper()
	_, _ = vm.SSH("systemctl poweroff") // the connection may drop before ssh reports success
	testenv.Eventually(vm.t, timeout, "qemu ended by the guest's poweroff", func() error {
		if vm.qemu.Running() {
			return errors.New("qemu still runs")
		}
		return nil
	})
	vm.stopTPM()
}

// stopTPM stops the VM's TPM once qemu has ended: swtpm ends with qemu's connection, but
// not at once, and powerOn must not find the old one still running.
func (vm *VM) stopTPM() {
	vm.t.Helper()
	if vm.tpm == nil {
		return
	}
	if err := vm.tpm.Stop(); err != nil {
		vm.t.Fatalf("stop the VM's TPM: %v", err)
	}
}

// CopyDisk copies the disk of a VM that is off (PowerOff) to a new file of the test's and
// returns its path: a qcow2 overlay on the same base image, byte for byte the disk as whoever
// takes it out of the gateway has it.
func (vm *VM) CopyDisk() string {
	vm.t.Helper()
	if vm.qemu.Running() {
		vm.t.Fatal("copy the VM's disk: the VM is on")
	}
	dst := filepath.Join(vm.t.TempDir(), "disk-copy.qcow2")
	if out, err := exec.Command("cp", "--sparse=always", vm.overlay, dst).CombinedOutput(); err != nil {
		vm.t.Fatalf("copy the VM's disk: %v: %s", err, out)
	}
	return dst
}

// Reboot reboots the guest from inside (systemctl reboot) and waits until it answers over
// ssh with a new boot id.
func (vm *VM) Reboot(timeout time.Duration) {
	vm.t.Helper()
	before := vm.BootID()
	_, _ = vm.SSH("systemctl reboot") // the connection may drop before ssh reports success
	testenv.Eventually(vm.t, timeout, "the guest back from its reboot", func() error {
		id, err := vm.SSH("cat /proc/sys/kernel/random/boot_id")
		if err != nil {
			return err
		}
		if strings.TrimSpace(id) == before {
			return errors.New("still the boot before the reboot")
		}
		return nil
	})
}

// BootID returns the guest's boot id, which changes at every boot.
func (vm *VM) BootID() string {
	vm.t.Helper()
	return strings.TrimSpace(vm.MustSSH("cat /proc/sys/kernel/random/boot_id"))
}

// WaitSSH waits until the guest answers over ssh.
func (vm *VM) WaitSSH(timeout time.Duration) {
	vm.t.Helper()
	testenv.Eventually(vm.t, timeout, "ssh into the guest", func() error {
		_, err := vm.SSH("true")
		return err
	})
}

// SSH runs a shell command in the guest as root and returns its standard output. The error
// carries standard error.
func (vm *VM) SSH(command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh",
		"-i", vm.key, "-p", strconv.Itoa(vm.sshPort),
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
		"-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
		"root@127.0.0.1", command)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ssh %q: %w: %s", command, err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// MustSSH is SSH failing the test on error.
func (vm *VM) MustSSH(command string) string {
	vm.t.Helper()
	out, err := vm.SSH(command)
	if err != nil {
		vm.t.Fatal(err)
	}
	return out
}

// Console returns what the guest wrote to its serial console, every boot of this VM.
func (vm *VM) Console() string {
	b, _ := os.ReadFile(filepath.Join(vm.dir, "console.log"))
	return string(b)
}

func (vm *VM) mustHMP(command string) string {
	vm.t.Helper()
	out, err := vm.hmp(command)
	if err != nil {
		vm.t.Fatal(err)
	}
	return out
}

// hmp sends one command to qemu's human monitor and returns its answer.
func (vm *VM) hmp(command string) (string, error) {
	conn, err := net.DialTimeout("unix", vm.monitor, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("qemu monitor: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := readUntilPrompt(r); err != nil { // the banner
		return "", fmt.Errorf("qemu monitor: %w", err)
	}
	if _, err := fmt.Fprintf(conn, "%s\n", command); err != nil {
		return "", fmt.Errorf("qemu monitor %q: %w", command, err)
	}
	out, err := readUntilPrompt(r)
	if err != nil {
		return "", fmt.Errorf("qemu monitor %q: %w", command, err)
	}
	if strings.Contains(out, "Error") || strings.Contains(out, "unknown command") {
		return out, fmt.Errorf("qemu monitor %q: %s", command, strings.TrimSpace(out))
	}
	return out, nil
}

// readUntilPrompt reads the monitor's output up to its next "(qemu) " prompt.
func readUntilPrompt(r *bufio.Reader) (string, error) {
	var b strings.Builder
	for !strings.HasSuffix(b.String(), "(qemu) ") {
		c, err := r.ReadByte()
		if err != nil {
			return b.String(), err
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
