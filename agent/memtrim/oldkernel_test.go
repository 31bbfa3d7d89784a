package memtrim

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTrimWithoutPageoutLeavesTheTextAlone: on a kernel without MADV_PAGEOUT (before 5.4)
// the trim fails and trimming stops; the executable's mappings must not be left with
// MADV_RANDOM (VmFlags "rr"), which would turn off readahead for every later fault of the
// agent's code, for nothing given back.
func TestTrimWithoutPageoutLeavesTheTextAlone(t *testing.T) {
	exe, err := executable()
	if err != nil {
		t.Fatal(err)
	}
	maps, err := readMappings("/proc/self/smaps", exe)
	if err != nil {
		t.Fatal(err)
	}
	// An earlier test's trim left the mappings MADV_RANDOM: start from the kernel's default.
	for _, m := range maps {
		if !m.writable {
			if err := sysMadvise(m.start, m.end-m.start, unix.MADV_NORMAL); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := randomReadMappings(t, exe); n != 0 {
		t.Fatalf("%d mappings of the executable MADV_RANDOM before the trim", n)
	}
	madvise = func(start, length uintptr, advice int) error {
		if advice == unix.MADV_PAGEOUT {
			return unix.EINVAL // as Linux before 5.4
		}
		return sysMadvise(start, length, advice)
	}
	defer func() { madvise = sysMadvise }()
	if _, err := Trim(); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("Trim on a kernel without MADV_PAGEOUT: %v, want EINVAL", err)
	}
	if n := randomReadMappings(t, exe); n != 0 {
		t.Errorf("after a trim the kernel refused, %d mappings of the executable are left MADV_RANDOM (VmFlags rr): no readahead for the agent's code from then on", n)
	}
}

// randomReadMappings counts the executable's mappings whose VmFlags hold rr (MADV_RANDOM).
func randomReadMappings(t *testing.T, exe fileID) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var inExe bool
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			_, id, err := parseMapsLine(fields)
			inExe = err == nil && id == exe
			continue
		}
		if inExe && len(fields) > 0 && fields[0] == "VmFlags:" {
			for _, f := range fields[1:] {
				if f == "rr" {
					n++
				}
			}
		}
	}
	return n
}
