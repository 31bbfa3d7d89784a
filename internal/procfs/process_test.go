package procfs

import (
	"os"
	"testing"
)

func TestReadProcessSelf(t *testing.T) {
	p, err := ReadProcess(os.Getpid(), true)
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != os.Getpid() || p.PPID != os.Getppid() {
		t.Errorf("pid %d ppid %d, want %d %d", p.PID, p.PPID, os.Getpid(), os.Getppid())
	}
	exe, _ := os.Executable()
	if len(p.Argv) == 0 || p.Argv[0] != os.Args[0] {
		t.Errorf("argv %q, want it to start with %q (%s)", p.Argv, os.Args[0], exe)
	}
	if p.StartTime == 0 || p.RSS == 0 || p.PSS == 0 {
		t.Errorf("start time %d, RSS %d, PSS %d: want them read", p.StartTime, p.RSS, p.PSS)
	}
	if rss := RSS(os.Getpid()); rss == 0 {
		t.Error("RSS of this process is 0")
	}
	if _, err := ReadProcess(-1, false); err == nil {
		t.Error("ReadProcess(-1) succeeded")
	}
}
