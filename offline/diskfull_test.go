package offline

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/test/prereq"
)

// TestBoltStoreOnFullFileSystem: with the state directory's file system full, a write fails
// with an error that says so, nothing acknowledged before is lost or damaged, reads go on,
// and writes succeed again by themselves once there is room: no reopen, no restart.
func TestBoltStoreOnFullFileSystem(t *testing.T) {
	dir := t.TempDir()
	prereq.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"), "mount a small tmpfs (root)")
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	path := filepath.Join(dir, "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})

	// Pods until the file system is full.
	var acked []string
	var full error
	for i := 0; full == nil && i < 10000; i++ {
		p := testPod(fmt.Sprintf("uid-%d", i), fmt.Sprintf("pod-%d", i))
		p.Annotations = map[string]string{"blob": strings.Repeat("b", 8<<10)}
		if err := s.PutPod(SourceAPI, p); err != nil {
			full = err
			break
		}
		acked = append(acked, string(p.UID))
	}
	if full == nil {
		t.Fatal("never ran out of space")
	}
	if !errorsIsNoSpace(full) {
		t.Errorf("error on a full file system: %v; want one that says no space left", full)
	}
	t.Logf("%d pods acknowledged before: %v", len(acked), full)
	// Whatever space bbolt still had, take it too.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := bytes.Repeat([]byte{'f'}, 4096); ; {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	if err := s.PutPod(SourceAPI, testPod("uid-late", "late")); err == nil {
		t.Log("a write still fit after the filler (bbolt had free pages)")
	}

	check := func(when string) {
		t.Helper()
		recs, errs, err := s.LoadPods()
		if err != nil || len(errs) != 0 {
			t.Fatalf("%s: LoadPods: %v %v", when, err, errs)
		}
		have := map[string]bool{}
		for _, r := range recs {
			have[string(r.UID)] = true
		}
		for _, uid := range acked {
			if !have[uid] {
				t.Errorf("%s: acknowledged pod %s lost", when, uid)
			}
		}
	}
	check("full")

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// Room again: the next writes succeed without a reopen.
	for _, uid := range acked[:min(len(acked), 20)] {
		if err := s.DeletePod(types.UID(uid)); err != nil {
			t.Fatalf("delete after room came back: %v", err)
		}
	}
	if err := s.PutPod(SourceAPI, testPod("uid-after", "after")); err != nil {
		t.Fatalf("write after room came back: %v", err)
	}
	acked = append(acked[min(len(acked), 20):], "uid-after")
	check("after")
}

func errorsIsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || (err != nil && strings.Contains(err.Error(), "no space left"))
}
