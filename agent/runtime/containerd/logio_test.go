package containerd

import (
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

// TestTaskIO: the shim gets the container's stdin FIFO and a terminal when it has them, beside
// its output. Without logs.Install (a process-wide setting, which the contract test of this
// package must not inherit) the output goes raw to the log file; the installed logger's path
// is logs' TestInstallAndPrepareLog, and every container of the integration suite runs it.
func TestTaskIO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "default_web_uid-1", "app", "0.log")
	for _, stdio := range []Stdio{{}, {Stdin: "/s/io/c1.stdin", Terminal: true}} {
		creator, err := TaskIO(path, stdio)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Dir(path)); err != nil {
			t.Fatalf("TaskIO should have made the log's directory: %v", err)
		}
		io, err := creator("c1")
		if err != nil {
			t.Fatal(err)
		}
		cfg := io.Config()
		if u, err := url.Parse(cfg.Stdout); err != nil || u.Scheme != "file" || u.Path != path || cfg.Stderr != cfg.Stdout {
			t.Errorf("log URI %q / %q, want file://%s", cfg.Stdout, cfg.Stderr, path)
		}
		if cfg.Stdin != stdio.Stdin || cfg.Terminal != stdio.Terminal {
			t.Errorf("IO config %+v with stdio %+v", cfg, stdio)
		}
	}
}
