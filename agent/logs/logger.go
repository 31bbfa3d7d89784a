package logs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// LoggerName is the name of the dedicated logger binary (cmd/holdfast-logger) and of the
// link the shim runs; the holdfast binary answers to it as well: its main runs [Main] when
// filepath.Base(os.Args[0]) is this.
const LoggerName = "holdfast-logger"

// memoryLimit caps a logger's heap: one runs per container, and it needs two line buffers.
const memoryLimit = 8 << 20

// Keys of the logger's arguments: the query of the log URI, which the shim passes as key value
// pairs in map order.
const (
	argPath     = "path"
	argRoot     = "root"
	argMaxSize  = "max-size"
	argMaxFiles = "max-files"
	argMaxLine  = "max-line"
)

// DrainTimeout bounds how long the logger keeps reading after the shim asked it to stop
// (SIGTERM, sent when the task is deleted, after the shim closed its ends of the pipes). The
// shim kills it 12 s after asking.
const DrainTimeout = 5 * time.Second

// openRetry is how often a logger that could not open its file tries again; output read
// meanwhile is dropped.
const openRetry = 10 * time.Second

// Options are a logger's settings.
type Options struct {
	// Path is the log file.
	Path string
	// Root is the pod log root: symlinks are followed up to it and never below it. Empty
	// means three levels up from Path (kubelet's layout).
	Root string
	// MaxSize and MaxFiles: see FileOptions.
	MaxSize  int64
	MaxFiles int
	// MaxLine is the longest message of one line; longer lines are cut into partial lines.
	// Defaults to DefaultMaxLineBytes.
	MaxLine int
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Drain bounds the reading after ctx ends; defaults to DrainTimeout.
	Drain time.Duration
}

// Args are o as the logger's key value arguments (the log URI's query, see cio.BinaryIO).
func (o Options) Args() map[string]string {
	m := map[string]string{
		argPath:     o.Path,
		argMaxSize:  strconv.FormatInt(o.MaxSize, 10),
		argMaxFiles: strconv.Itoa(o.MaxFiles),
	}
	if o.Root != "" {
		m[argRoot] = o.Root
	}
	if o.MaxLine != 0 {
		m[argMaxLine] = strconv.Itoa(o.MaxLine)
	}
	return m
}

// ParseArgs reads the logger's arguments: key value pairs in any order, each key at most once.
func ParseArgs(args []string) (Options, error) {
	if len(args)%2 != 0 {
		return Options{}, fmt.Errorf("arguments must be key value pairs, got %q", args)
	}
	var o Options
	seen := map[string]bool{}
	for i := 0; i < len(args); i += 2 {
		k, v := args[i], args[i+1]
		if seen[k] {
			return Options{}, fmt.Errorf("argument %q given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case argPath:
			o.Path = v
		case argRoot:
			o.Root = v
		case argMaxSize:
			o.MaxSize, err = strconv.ParseInt(v, 10, 64)
		case argMaxFiles:
			o.MaxFiles, err = strconv.Atoi(v)
		case argMaxLine:
			o.MaxLine, err = strconv.Atoi(v)
		default:
			return Options{}, fmt.Errorf("unknown argument %q", k)
		}
		if err != nil {
			return Options{}, fmt.Errorf("argument %s: %w", k, err)
		}
	}
	switch {
	case o.Path == "":
		return Options{}, errors.New("argument path is required")
	case o.MaxSize < 0:
		return Options{}, fmt.Errorf("max-size %d is negative", o.MaxSize)
	case o.MaxFiles < 0:
		return Options{}, fmt.Errorf("max-files %d is negative", o.MaxFiles)
	case o.MaxLine != 0 && o.MaxLine < minMaxLineBytes:
		return Options{}, fmt.Errorf("max-line %d is below %d", o.MaxLine, minMaxLineBytes)
	}
	return o, nil
}

// Main is the logger process: it speaks containerd's logging-binary protocol (the container's
// stdout on fd 3, stderr on fd 4, the readiness pipe on fd 5, SIGTERM to stop) and returns the
// exit code. Errors go to stderr, which the shim discards: the ones that matter are caught
// before the task starts (see TaskIO).
func Main(args []string, stderr io.Writer) int {
	debug.SetMemoryLimit(memoryLimit)
	opts, err := ParseArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", LoggerName, err)
		return 2
	}
	for _, fd := range []int{3, 4, 5} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			fmt.Fprintf(stderr, "%s: file descriptor %d is not open: run by containerd's shim as a log binary, not by hand\n", LoggerName, fd)
			return 2
		}
	}
	// Non-blocking descriptors make the pipes pollable, so that reading them can be given a
	// deadline once the shim asks the logger to stop.
	stdout, stderrPipe := pollableFile(3, "CONTAINER_STDOUT"), pollableFile(4, "CONTAINER_STDERR")
	wait := os.NewFile(5, "CONTAINER_WAIT")
	ready := func() error {
		// A byte, then close: containerd's binary-v2 protocol wants the byte, v1 takes the EOF.
		_, err := wait.Write([]byte{0})
		return errors.Join(err, wait.Close())
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM)
	defer stop()
	if err := Serve(ctx, opts, stdout, stderrPipe, ready, stderr); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", LoggerName, err)
		return 1
	}
	return 0
}

func pollableFile(fd int, name string) *os.File {
	_ = unix.SetNonblock(fd, true) // if it fails, the file is blocking and the drain is unbounded
	return os.NewFile(uintptr(fd), name)
}

// Serve writes the CRI lines of stdout and stderr to the log file until both streams end, then
// syncs and closes the file. It calls ready once the file is open (or could not be: logging
// must never stop a container from starting; its output is then dropped and the file tried
// again every 10 s). When ctx ends, reading goes on for at most Options.Drain, to take what the
// container wrote before it exited. diag receives what goes wrong while running.
func Serve(ctx context.Context, opts Options, stdout, stderr io.Reader, ready func() error, diag io.Writer) error {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxLine == 0 {
		opts.MaxLine = DefaultMaxLineBytes
	}
	if opts.Drain == 0 {
		opts.Drain = DrainTimeout
	}
	w := &lazyFile{opts: opts, diag: diag}
	w.open()
	if err := ready(); err != nil {
		w.close()
		return fmt.Errorf("signal readiness to the shim: %w", err)
	}

	var wg sync.WaitGroup
	streams := []struct {
		r io.Reader
		s Stream
	}{{stdout, Stdout}, {stderr, Stderr}}
	for _, st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := copyLines(st.r, st.s, opts.MaxLine, opts.Now, w.write); err != nil {
				fmt.Fprintf(diag, "%s: read %s: %v\n", LoggerName, st.s, err)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()

	select {
	case <-done:
	case <-ctx.Done():
		deadline := time.Now().Add(opts.Drain)
		for _, st := range streams {
			if d, ok := st.r.(interface{ SetReadDeadline(time.Time) error }); ok {
				_ = d.SetReadDeadline(deadline) // a blocking descriptor says no; closing below unblocks it
			}
		}
		select {
		case <-done:
		case <-time.After(opts.Drain + time.Second):
			for _, st := range streams {
				if c, ok := st.r.(io.Closer); ok {
					_ = c.Close()
				}
			}
			// A read blocked in the kernel on a blocking pipe survives Close; the process is
			// about to exit and takes it along, so waiting is bounded too.
			select {
			case <-done:
			case <-time.After(time.Second):
			}
		}
	}
	return w.close()
}

// lazyFile is the log file of a logger, opened again (at most every openRetry) if opening
// failed.
type lazyFile struct {
	opts Options
	diag io.Writer

	mu       sync.Mutex // protects the fields below
	f        *File
	nextOpen time.Time
	dropped  int // lines dropped because the file could not be opened
	// failing counts the lines dropped since writes began to fail (a full file system): the
	// first failure is reported, then only the count once a write succeeds again, rather than
	// one diagnostic per line of a chatty container.
	failing int
}

func (w *lazyFile) open() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.openLocked()
}

func (w *lazyFile) openLocked() {
	f, err := OpenFile(w.opts.Root, w.opts.Path, FileOptions{MaxSize: w.opts.MaxSize, MaxFiles: w.opts.MaxFiles, Now: w.opts.Now})
	if err != nil {
		fmt.Fprintf(w.diag, "%s: %v; output is dropped until it can be opened\n", LoggerName, err)
		w.nextOpen = w.opts.Now().Add(openRetry)
		return
	}
	w.f = f
}

func (w *lazyFile) write(line []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil && !w.opts.Now().Before(w.nextOpen) {
		w.openLocked()
	}
	if w.f == nil {
		w.dropped++
		return
	}
	if _, err := w.f.Write(line); err != nil {
		if w.failing == 0 {
			fmt.Fprintf(w.diag, "%s: %v; lines are dropped until writes succeed again\n", LoggerName, err)
		}
		w.failing++
		return
	}
	if w.failing > 0 {
		fmt.Fprintf(w.diag, "%s: writing again after %d lines were dropped\n", LoggerName, w.failing)
		w.failing = 0
	}
}

func (w *lazyFile) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dropped > 0 {
		fmt.Fprintf(w.diag, "%s: %d lines dropped: the log file could not be opened\n", LoggerName, w.dropped)
	}
	if w.failing > 0 {
		fmt.Fprintf(w.diag, "%s: %d lines dropped at the end: the log file could not be written\n", LoggerName, w.failing)
	}
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}
