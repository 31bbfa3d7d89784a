package memtrim

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestParseSmapsOfThisProcess parses this process's own smaps ([heap], [stack], [vvar],
// [vdso], anonymous mappings, libraries, VmFlags and THP lines, whatever this kernel
// writes) and checks the executable's mappings against /proc/self/maps, parsed apart.
func TestParseSmapsOfThisProcess(t *testing.T) {
	exe, err := executable()
	if err != nil {
		t.Fatal(err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	// Every mapping line parses, though none is of this file.
	if got, err := parseSmaps(smaps, fileID{major: 0xfff, minor: 0xfffff, inode: 1<<64 - 1}); err != nil || len(got) != 0 {
		t.Fatalf("parseSmaps for no file: %v, %v", got, err)
	}
	got, err := parseSmaps(smaps, exe)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		var start, end, off uint64
		var perms string
		var maj, mnr uint32
		var inode uint64
		if _, err := fmt.Sscanf(line, "%x-%x %s %x %x:%x %d", &start, &end, &perms, &off, &maj, &mnr, &inode); err != nil {
			t.Fatalf("maps line %q: %v", line, err)
		}
		if (fileID{maj, mnr, inode}) == exe {
			want = append(want, fmt.Sprintf("%#x-%#x w=%v", start, end, strings.Contains(perms, "w")))
		}
	}
	if len(want) < 2 {
		t.Fatalf("/proc/self/maps has %d mappings of the executable, want its text and data at least", len(want))
	}
	if len(got) != len(want) {
		t.Fatalf("parseSmaps found %d mappings of the executable, /proc/self/maps %d: %v", len(got), len(want), want)
	}
	for i, m := range got {
		if s := fmt.Sprintf("%#x-%#x w=%v", m.start, m.end, m.writable); s != want[i] {
			t.Errorf("mapping %d: %s, want %s", i, s, want[i])
		}
		if m.resident < 0 || m.resident > int64(m.end-m.start) {
			t.Errorf("mapping %d: %d bytes resident of %d", i, m.resident, m.end-m.start)
		}
	}
}

// TestParseSmapsOddPaths: paths with spaces, dashes and "(deleted)", and lines of no
// mapping, as the kernel writes them.
func TestParseSmapsOddPaths(t *testing.T) {
	smaps := `00400000-00401000 r-xp 00000000 fd:01 7 /opt/my dir/holdfast - v2 (deleted)
Rss:                   4 kB
VmFlags: rd ex mr mw me dw sd
00401000-00403000 r--p 00001000 fd:01 7 /opt/my dir/holdfast - v2 (deleted)
THPeligible:    0
Rss:                   8 kB
ProtectionKey:         0
7ffc1000-7ffc3000 r--p 00000000 00:00 0                          [vvar]
Rss:                   0 kB
7ffc3000-7ffc5000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   8 kB
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
Rss:                   0 kB
`
	got, err := parseSmaps([]byte(smaps), fileID{0xfd, 1, 7})
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{start: 0x400000, end: 0x401000, resident: 4 << 10}, {start: 0x401000, end: 0x403000, resident: 8 << 10}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
