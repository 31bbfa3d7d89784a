package volumes

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/test/prereq"
)

// atime is p's access time, not following a symlink.
func atime(t *testing.T, p string) time.Time {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return time.Unix(st.Atim.Unix())
}

// backdateAtime sets p's access time to at, not following a symlink, leaving its mtime.
func backdateAtime(t *testing.T, p string, at time.Time) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), {Nsec: unix.UTIME_OMIT}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

// TestResyncTouchesNoAccessTime: a resync that finds every content volume up to date lists no
// directory, reads no link and no file. Each would update an access time (relatime does once a
// day, and the first time after a write): a dirtied inode, a write to the gateway's flash, for
// every volume of every pod; the bench saw two pages a minute in its steady state. A volume
// changed on the host is still put right by the next resync.
func TestResyncTouchesNoAccessTime(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	old := time.Now().Add(-48 * time.Hour).Truncate(time.Second)

	// Where access times are not kept (noatime), this test could not fail: it runs on a
	// tmpfs that keeps them (strictatime) instead.
	keepsAtimes := func() bool {
		probe := filepath.Join(base, "probe")
		if err := os.WriteFile(probe, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(probe)
		backdateAtime(t, probe, old)
		if _, err := os.ReadFile(probe); err != nil {
			t.Fatal(err)
		}
		return !atime(t, probe).Equal(old)
	}
	if !keepsAtimes() {
		prereq.NoError(t, unix.Mount("tmpfs", base, "tmpfs", unix.MS_STRICTATIME, ""), "a file system that keeps access times: a tmpfs mounted strictatime (root)")
		t.Cleanup(func() { _ = unix.Unmount(base, unix.MNT_DETACH) })
		if !keepsAtimes() {
			t.Fatalf("a tmpfs mounted strictatime at %s does not update access times", base)
		}
	}

	podsDir := filepath.Join(base, "pods")
	var tokens atomic.Int64
	m := NewManager(podsDir, kubetest.Wrap(newFakeAPI(&tokens)), nil, nil, Options{PlainDirs: true})
	pod := testPod(filepath.Join(base, "host"))
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}
	volumes := filepath.Join(podsDir, string(pod.UID), "volumes")
	var paths []string
	if err := filepath.WalkDir(volumes, func(p string, _ fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Listed first, backdated after: the listing itself updates the directories' times.
	for _, p := range paths {
		backdateAtime(t, p, old)
	}
	m.resync(ctx)
	m.resync(ctx)
	for _, p := range paths {
		if got := atime(t, p); !got.Equal(old) {
			rel, _ := filepath.Rel(volumes, p)
			t.Errorf("%s accessed by a resync with nothing to change (access time %s)", rel, got.Format(time.RFC3339))
		}
	}
	if n := tokens.Load(); n != 1 {
		t.Errorf("%d token requests, want 1", n)
	}

	// Changed on the host: a file rewritten in place (same size), a visible link removed, a
	// file added beside the payload. The next resync restores the payload.
	config := filepath.Join(volumes, dirConfigMap, "config")
	ts, err := os.Readlink(filepath.Join(config, dataDirName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(config, ts, "conf/greeting"), []byte("HELLO"), 0o600); err != nil {
		t.Fatal(err)
	}
	m.resync(ctx)
	if got := readFile(t, filepath.Join(config, "conf/greeting")); got != "hello" {
		t.Errorf("greeting rewritten on the host, after a resync: %q", got)
	}
	creds := filepath.Join(volumes, dirSecret, "creds")
	if err := os.Remove(filepath.Join(creds, "password")); err != nil {
		t.Fatal(err)
	}
	m.resync(ctx)
	if got := readFile(t, filepath.Join(creds, "password")); got != "s3cret" {
		t.Errorf("password link removed on the host, after a resync: %q", got)
	}
	ts, err = os.Readlink(filepath.Join(creds, dataDirName))
	if err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(creds, ts, "stray")
	if err := os.WriteFile(stray, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.resync(ctx)
	if _, err := os.Lstat(filepath.Join(creds, dataDirName, "stray")); err == nil {
		t.Errorf("a file added to the secret's data on the host is still there after a resync")
	}
}

// payloadDigest covers every file's bytes and mode, paths that are not clean included (an
// item path "conf/./greeting" is valid; its bytes were left out of the digest, so a change
// of them went unwritten).
func TestPayloadDigest(t *testing.T) {
	a := payloadDigest(map[string]file{"conf/./greeting": {data: []byte("hello"), mode: 0o644}})
	for name, other := range map[string]map[string]file{
		"bytes": {"conf/./greeting": {data: []byte("bonjour"), mode: 0o644}},
		"mode":  {"conf/./greeting": {data: []byte("hello"), mode: 0o600}},
		"path":  {"conf/greeting2": {data: []byte("hello"), mode: 0o644}},
	} {
		if payloadDigest(other) == a {
			t.Errorf("another %s, the same digest", name)
		}
	}
	if payloadDigest(map[string]file{"conf/greeting": {data: []byte("hello"), mode: 0o644}}) != a {
		t.Error("the same file under its clean path: another digest")
	}
}
