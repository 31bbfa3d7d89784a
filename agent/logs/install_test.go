package logs

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

func TestInstallAndTaskIO(t *testing.T) {
	t.Cleanup(func() { current.Store(nil) })
	state := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe, _ = filepath.EvalSymlinks(exe)

	// A link left by an older binary is replaced.
	must(t, os.MkdirAll(filepath.Join(state, "bin"), 0o755))
	must(t, os.Symlink("/old/holdfast", filepath.Join(state, "bin", LoggerName)))
	for range 2 { // idempotent
		link, err := Install(Config{StateDir: state, MaxSize: 4096, MaxFiles: 3})
		if err != nil {
			t.Fatal(err)
		}
		if target, err := os.Readlink(link); err != nil || target != exe {
			t.Fatalf("link %s -> %q (%v), want %s", link, target, err, exe)
		}
	}

	root := t.TempDir()
	path := logPath(root)
	creator, err := TaskIO(path, Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("TaskIO should have made the log file: %v %v", fi, err)
	}
	io, err := creator("c1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := io.Config()
	u, err := url.Parse(cfg.Stdout)
	if err != nil || u.Scheme != "binary" || u.Path != filepath.Join(state, "bin", LoggerName) || cfg.Stderr != cfg.Stdout {
		t.Fatalf("log URI %q / %q", cfg.Stdout, cfg.Stderr)
	}
	var args []string
	for k, vs := range u.Query() { // as the shim builds the arguments
		args = append(args, k, vs[0])
	}
	opts, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Path != path || opts.Root != root || opts.MaxSize != 4096 || opts.MaxFiles != 3 {
		t.Fatalf("logger options %+v", opts)
	}
	if cfg.Stdin != "" || cfg.Terminal {
		t.Fatalf("no stdio asked for, got stdin %q terminal %v", cfg.Stdin, cfg.Terminal)
	}

	// stdin: true, tty: true: the shim gets the FIFO and a terminal, the output still goes
	// to the logger.
	creator, err = TaskIO(path, Stdio{Stdin: "/s/io/c1.stdin", Terminal: true})
	if err != nil {
		t.Fatal(err)
	}
	if io, err = creator("c1"); err != nil {
		t.Fatal(err)
	}
	cfg = io.Config()
	if u, _ := url.Parse(cfg.Stdout); cfg.Stdin != "/s/io/c1.stdin" || !cfg.Terminal || u.Scheme != "binary" || cfg.Stderr != cfg.Stdout {
		t.Fatalf("IO config with stdio %+v", cfg)
	}

	// A symlinked container directory fails the start, with the reason.
	host := hostDir(t)
	pod := filepath.Join(root, "default_evil_uid-2")
	must(t, os.MkdirAll(pod, 0o755))
	must(t, os.Symlink(host, filepath.Join(pod, "app")))
	if _, err := TaskIO(filepath.Join(pod, "app", "0.log"), Stdio{}); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("TaskIO on a symlinked dir: %v, want ErrUnsafePath", err)
	}
	if names := readDir(t, host); len(names) != 1 {
		t.Fatalf("host dir changed: %v", names)
	}
}

func TestInstallRejects(t *testing.T) {
	t.Cleanup(func() { current.Store(nil) })
	for _, cfg := range []Config{
		{},
		{StateDir: t.TempDir(), MaxFiles: 1},
		{StateDir: t.TempDir(), MaxLine: 8},
	} {
		if _, err := Install(cfg); err == nil {
			t.Errorf("Install(%+v) accepted", cfg)
		}
	}
	if current.Load() != nil {
		t.Fatal("a rejected Install installed a logger")
	}
}

func TestDefaultBinaryPrefersDedicatedLogger(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "holdfast")
	must(t, os.WriteFile(self, []byte("#!/bin/sh\n"), 0o755))
	if got := defaultBinary(self); got != self {
		t.Fatalf("no logger beside holdfast: got %s, want holdfast itself", got)
	}
	// Not executable: not a logger the shim could run.
	logger := filepath.Join(dir, LoggerName)
	must(t, os.WriteFile(logger, []byte("#!/bin/sh\n"), 0o644))
	if got := defaultBinary(self); got != self {
		t.Fatalf("non-executable %s: got %s, want holdfast itself", logger, got)
	}
	must(t, os.Chmod(logger, 0o755))
	if got := defaultBinary(self); got != logger {
		t.Fatalf("got %s, want the dedicated logger %s", got, logger)
	}
}
