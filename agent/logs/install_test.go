package logs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestInstallAndPrepareLog(t *testing.T) {
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
	l, err := PrepareLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("PrepareLog should have made the log file: %v %v", fi, err)
	}
	if l.Path != path || l.Binary != filepath.Join(state, "bin", LoggerName) {
		t.Fatalf("logger %+v", l)
	}
	var args []string
	for k, v := range l.Args { // as the shim builds the arguments
		args = append(args, k, v)
	}
	opts, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Path != path || opts.Root != root || opts.MaxSize != 4096 || opts.MaxFiles != 3 {
		t.Fatalf("logger options %+v", opts)
	}

	// A symlinked container directory fails the start, with the reason.
	host := hostDir(t)
	pod := filepath.Join(root, "default_evil_uid-2")
	must(t, os.MkdirAll(pod, 0o755))
	must(t, os.Symlink(host, filepath.Join(pod, "app")))
	if _, err := PrepareLog(filepath.Join(pod, "app", "0.log")); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("PrepareLog on a symlinked dir: %v, want ErrUnsafePath", err)
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
