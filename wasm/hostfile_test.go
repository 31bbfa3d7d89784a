package wasm

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fixture builds a container root filesystem with the traps a workload can
// set for an agent that reads its files (containerd GHSA-rgh6-rfwx-v388).
func fixture(t *testing.T) (rootfs, volume, hostSecret string) {
	t.Helper()
	dir := t.TempDir()
	rootfs = filepath.Join(dir, "rootfs")
	volume = filepath.Join(dir, "volume")
	hostSecret = filepath.Join(dir, "host-secret")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"run/app/sub", "etc", "var"} {
		must(os.MkdirAll(filepath.Join(rootfs, d), 0o755))
	}
	must(os.MkdirAll(volume, 0o755))
	must(os.WriteFile(hostSecret, []byte("HOST SECRET"), 0o600))
	must(os.WriteFile(filepath.Join(rootfs, "run/app/heartbeat"), []byte("alive"), 0o644))
	must(os.WriteFile(filepath.Join(rootfs, "run/app/sub/deep"), []byte("deep"), 0o644))
	must(os.WriteFile(filepath.Join(rootfs, "etc/shadow"), []byte("CONTAINER SECRET"), 0o600))
	must(os.WriteFile(filepath.Join(volume, "state"), []byte("volume data"), 0o644))
	links := map[string]string{
		"run/app/abs-escape":  "/etc/shadow",
		"run/app/rel-escape":  "../../../../../../../../etc/shadow",
		"run/app/to-host":     hostSecret,
		"run/app/inside-link": "heartbeat",
		"run/app/sub/up":      "../heartbeat",
		"run/app/proc-root":   "/proc/self/root/etc/hostname",
		"var/run":             "/run",
	}
	for name, target := range links {
		must(os.Symlink(target, filepath.Join(rootfs, name)))
	}
	must(syscall.Mkfifo(filepath.Join(rootfs, "run/app/fifo"), 0o644))
	return rootfs, volume, hostSecret
}

func TestReadGuestFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		// skip-ok: not on this operating system
		t.Skip("holdfast reads container files on Linux")
	}
	// The agent hands /proc/<pid>/root of the container's process as its
	// root filesystem (volumes included); "via /proc" reaches the fixture
	// through our own /proc/self/root the same way.
	for _, mode := range []string{"openat2", "via /proc", "os.Root fallback"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "os.Root fallback" {
				openat2Missing.Store(true)
				defer openat2Missing.Store(false)
			}
			rootfs, volume, _ := fixture(t)
			if mode == "via /proc" {
				rootfs, volume = "/proc/self/root"+rootfs, "/proc/self/root"+volume
			}
			o := callOptions{}
			WithFiles([]string{"/run/app", "/var/run/app", "/data"},
				FileMount{GuestPath: "/", HostPath: rootfs},
				FileMount{GuestPath: "/data", HostPath: volume})(&o)
			cases := []struct {
				path string
				want string // content, or "err:<code>"
				// fallbackWant, if set, is the answer of the os.Root fallback,
				// which refuses absolute symlinks instead of reading them in
				// the container's root.
				fallbackWant string
			}{
				{"/run/app/heartbeat", "alive", ""},
				{"/run/app/./sub/../heartbeat", "alive", ""},
				{"/run/app/inside-link", "alive", ""},
				{"/run/app/sub/up", "alive", ""},
				{"/run/app/sub/deep", "deep", ""},
				{"/data/state", "volume data", ""},
				{"/var/run/app/heartbeat", "alive", "err:denied"},
				// Escapes: never the container's /etc/shadow, never the host's file.
				{"/run/app/abs-escape", "err:not_found", "err:denied"},
				{"/run/app/rel-escape", "err:not_found", "err:denied"},
				{"/run/app/to-host", "err:not_found", "err:denied"},
				{"/run/app/proc-root", "err:not_found", "err:denied"},
				{"/run/app/../../etc/shadow", "err:denied", ""},
				{"/etc/shadow", "err:denied", ""},
				{"/run/application/x", "err:denied", ""},
				{"run/app/heartbeat", "err:invalid", ""},
				{"/run/app/missing", "err:not_found", ""},
				{"/run/app/fifo", "err:invalid", ""},
				{"/run/app/sub", "err:invalid", ""},
			}
			for _, tc := range cases {
				want := tc.want
				if mode == "os.Root fallback" && tc.fallbackWant != "" {
					want = tc.fallbackWant
				}
				start := time.Now()
				f, _, err := o.files.openGuestFile(tc.path)
				got := ""
				if err != nil {
					var fe *fileError
					if !errors.As(err, &fe) {
						t.Fatalf("%s: unclassified error %v", tc.path, err)
					}
					got = "err:" + fe.code
				} else {
					b, _ := io.ReadAll(f) // through the descriptor, never by name
					f.Close()
					got = string(b)
				}
				if got != want {
					t.Errorf("%s: got %q, want %q (err %v)", tc.path, got, want, err)
				}
				if strings.Contains(got, "SECRET") {
					t.Errorf("%s: read a secret: %q", tc.path, got)
				}
				if d := time.Since(start); d > time.Second {
					t.Errorf("%s: took %s", tc.path, d)
				}
			}
		})
	}
}

func TestStatGuestFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		// skip-ok: not on this operating system
		t.Skip("holdfast reads container files on Linux")
	}
	rootfs, _, _ := fixture(t)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(filepath.Join(rootfs, "run/app/heartbeat"), old, old); err != nil {
		t.Fatal(err)
	}
	o := callOptions{}
	WithFiles([]string{"/run/app"}, FileMount{GuestPath: "/", HostPath: rootfs})(&o)
	fi, err := o.files.statGuestFile("/run/app/heartbeat")
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Equal(old) || fi.Size() != 5 {
		t.Fatalf("stat = %v %d", fi.ModTime(), fi.Size())
	}
	if fi, err := o.files.statGuestFile("/run/app/sub"); err != nil || !fi.IsDir() {
		t.Fatalf("stat dir: %v %v", fi, err)
	}
	if _, err := o.files.statGuestFile("/run/app/fifo"); err != nil {
		t.Fatalf("stat of a FIFO must not block or fail: %v", err)
	}
	if _, err := o.files.statGuestFile("/run/app/to-host"); err == nil {
		t.Fatal("stat followed a symlink to the host")
	}
}

func TestNoFileAccessWithoutOption(t *testing.T) {
	var o callOptions
	if _, _, err := o.files.openGuestFile("/etc/passwd"); err == nil {
		t.Fatal("a file was opened without WithFiles")
	}
	WithFiles(nil, FileMount{GuestPath: "/", HostPath: "/"})(&o)
	if _, _, err := o.files.openGuestFile("/etc/passwd"); err == nil {
		t.Fatal("a file was opened without an allowed prefix")
	}
}

func TestCheckImport(t *testing.T) {
	cases := []struct {
		grants []Grant
		module string
		name   string
		ok     bool
	}{
		{nil, "holdfast", "log", true},
		{nil, "holdfast", "response_read", true},
		{nil, "holdfast", "http_request", false},
		{[]Grant{GrantHTTP}, "holdfast", "http_request", true},
		{[]Grant{GrantHTTP}, "holdfast", "tcp_dial", false},
		{[]Grant{GrantTCP}, "holdfast", "tcp_dial", true},
		{[]Grant{GrantFile}, "holdfast", "read_file", true},
		{[]Grant{GrantFile}, "holdfast", "stat_file", true},
		{AllGrants, "holdfast", "exec", false},
		{AllGrants, "env", "abort", false},
		{AllGrants, "wasi_unstable", "fd_write", false},
		{nil, "wasi_snapshot_preview1", "fd_write", true},
		{nil, "wasi_snapshot_preview1", "clock_time_get", true},
	}
	for _, tc := range cases {
		gs, err := newGrantSet(tc.grants)
		if err != nil {
			t.Fatal(err)
		}
		err = gs.checkImport(tc.module, tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("%v %s.%s: err = %v, want ok=%v", tc.grants, tc.module, tc.name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), tc.module+"."+tc.name) {
			t.Errorf("error %q does not name the import", err)
		}
	}
	if _, err := ParseGrant("HTTP"); err != nil {
		t.Error(err)
	}
	if _, err := ParseGrant("exec"); err == nil {
		t.Error("unknown grant parsed")
	}
}

func TestLimitsDefaults(t *testing.T) {
	l := Limits{}.withDefaults(Limits{})
	if l.MemoryPages != DefaultMemoryPages || l.CallTimeout != DefaultCallTimeout || l.OutputBytes != DefaultOutputBytes ||
		l.MaxInstances != DefaultMaxInstances || l.LogRate != DefaultLogRate || l.LogFlood != DefaultLogFlood {
		t.Fatalf("defaults = %+v", l)
	}
	l = Limits{CallTimeout: time.Second}.withDefaults(Limits{CallTimeout: 5 * time.Second, MemoryPages: 10})
	if l.CallTimeout != time.Second || l.MemoryPages != 10 {
		t.Fatalf("spec over engine defaults = %+v", l)
	}
}

func TestAllowedTargets(t *testing.T) {
	var o callOptions
	WithNetwork("10.88.0.7", 8080, 9090)(&o)
	WithNetwork("not-an-ip", 80)(&o)
	for addr, ok := range map[string]bool{
		"10.88.0.7:8080":           true,
		"10.88.0.7:9090":           true,
		"10.88.0.7:22":             false,
		"10.88.0.8:8080":           false,
		"localhost:8080":           false,
		"[::ffff:10.88.0.7]:8080":  true,
		"not-an-ip:80":             false,
		"169.254.169.254:80":       false,
		"10.88.0.7":                false,
		"10.88.0.7:8080/../../etc": false,
	} {
		if err := o.allowed(addr); (err == nil) != ok {
			t.Errorf("%s: err = %v, want ok=%v", addr, err, ok)
		}
	}
}
