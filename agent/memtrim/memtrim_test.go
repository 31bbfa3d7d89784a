package memtrim

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestTrimGivesThePagesBack trims this test binary, which its init and the test runner have
// mostly mapped (and `go test` just wrote, so the page cache holds all of it): the
// executable's resident pages must fall, and the page cache must not keep what was unmapped
// (a trim that only unmapped the pages, MADV_DONTNEED, would free nothing: the next fault
// would map them again from the cache). The process then goes on running code it had
// paged out.
func TestTrimGivesThePagesBack(t *testing.T) {
	// `go test` has just written the binary: its pages are dirty, and the kernel drops no
	// dirty page. On a gateway the agent's binary was written long before its first trim.
	if f, err := os.Open("/proc/self/exe"); err != nil {
		t.Fatal(err)
	} else if err := errors.Join(f.Sync(), f.Close()); err != nil {
		t.Fatalf("sync the test binary: %v", err)
	}
	// All of the file in the page cache, most of it never mapped, as after the kernel's
	// readahead at boot or an upgrade that wrote the file.
	if _, err := os.ReadFile("/proc/self/exe"); err != nil {
		t.Fatal(err)
	}
	before, err := ExecutableResident()
	if err != nil {
		t.Fatal(err)
	}
	if before < 1<<20 {
		t.Fatalf("the test binary has %d bytes resident before the trim: expected its init's pages, at least 1 MiB", before)
	}
	res, err := Trim()
	if err != nil {
		t.Fatalf("Trim: %v", err)
	}
	t.Logf("executable resident %d -> %d KiB; heap released %d KiB; page cache of the executable after: %d KiB",
		res.ExecutableBefore>>10, res.ExecutableAfter>>10, res.HeapReleased>>10, cachedBytes(t)>>10)
	if res.ExecutableAfter > res.ExecutableBefore*6/10 {
		t.Errorf("the executable's resident bytes went from %d to %d: want at most 60%% left", res.ExecutableBefore, res.ExecutableAfter)
	}
	// The page cache holds what was read again since the trim (this test's code, the
	// runtime's; a fault reads a whole folio, so somewhat more than is mapped: 2.7 MiB cached
	// for 1.6 MiB mapped of a 4.4 MiB binary in one run under make test's load), not the file:
	// a trim that only unmapped the pages (MADV_DONTNEED) leaves all of it cached (98% in a
	// run here), and the next fault maps it again.
	if cached, size := cachedBytes(t), fileSize(t); cached > size*3/4 {
		t.Errorf("%d of the executable's %d bytes in the page cache after the trim, %d mapped: the pages were unmapped, not given back", cached, size, res.ExecutableAfter)
	}
	// Code paged out runs again (faulted back in).
	if _, err := parseSmaps([]byte("00400000-00401000 r-xp 00000000 fd:01 42 /x\nRss: 4 kB\n"), fileID{0xfd, 1, 42}); err != nil {
		t.Fatal(err)
	}
	after, err := ExecutableResident()
	if err != nil {
		t.Fatal(err)
	}
	if after > before {
		t.Errorf("the executable's resident bytes grew past the trim's start (%d -> %d)", before, after)
	}
}

// TestRunTrimsOnceWhenQuiet: the first trim comes After; a process whose executable's
// resident pages do not grow is not trimmed again.
func TestRunTrimsOnceWhenQuiet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var trims int
	log := slog.New(levelCounter{slog.LevelInfo, &trims}) // Run logs each trim, and nothing else, at Info
	if err := Run(ctx, Config{After: 10 * time.Millisecond, Period: 10 * time.Millisecond, MinInterval: time.Nanosecond, Growth: 64 << 20, Log: log}); err != nil {
		t.Fatal(err)
	}
	if trims != 1 {
		t.Errorf("%d trims, want 1: nothing grew by 64 MiB after the first", trims)
	}
}

func TestParseSmaps(t *testing.T) {
	smaps := `00400000-00c00000 r-xp 00000000 fd:01 1234 /usr/bin/holdfast (deleted)
Size:               8192 kB
Rss:                6000 kB
00c00000-01000000 r--p 00800000 fd:01 1234 /usr/bin/holdfast (deleted)
Rss:                1000 kB
01000000-01010000 rw-p 00c00000 fd:01 1234 /usr/bin/holdfast (deleted)
Rss:                  64 kB
01010000-01100000 rw-p 00000000 00:00 0
Rss:                 960 kB
7f0000000000-7f0000001000 r--p 00000000 fd:01 99 /usr/lib/other.so
Rss:                   4 kB
VmFlags: rd mr mw me
`
	got, err := parseSmaps([]byte(smaps), fileID{major: 0xfd, minor: 1, inode: 1234})
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{
		{start: 0x400000, end: 0xc00000, resident: 6000 << 10},
		{start: 0xc00000, end: 0x1000000, resident: 1000 << 10},
		{start: 0x1000000, end: 0x1010000, writable: true, resident: 64 << 10},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := parseSmaps([]byte("zz-00 r-xp 0 fd:01 1234 /x\n"), fileID{}); err == nil {
		t.Error("a malformed mapping line was accepted")
	}
}

// TestDropCache: a file read, so cached, and mapped by nobody leaves the page cache.
func TestDropCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, bytes.Repeat([]byte("holdfast"), 1<<17), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		t.Fatal(err) // a dirty page is never dropped
	}
	if _, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if cached := cachedBytesOf(t, path); cached == 0 {
		t.Fatalf("the file read is not in the page cache: the test proves nothing")
	}
	if err := dropCache(path); err != nil {
		t.Fatal(err)
	}
	if cached := cachedBytesOf(t, path); cached != 0 {
		t.Errorf("%d bytes of the file still cached after dropCache", cached)
	}
}

// cachedBytes is how much of the executable the page cache holds.
func cachedBytes(t *testing.T) int64 { return cachedBytesOf(t, "/proc/self/exe") }

// cachedBytesOf is how much of the file the page cache holds (mincore on a mapping of the
// whole file: residency in the page cache, whoever maps it).
func cachedBytesOf(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(data)
	page := int64(os.Getpagesize())
	vec := make([]byte, (size+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += page
		}
	}
	return n
}

func fileSize(t *testing.T) int64 {
	t.Helper()
	st, err := os.Stat("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}
