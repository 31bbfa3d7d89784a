package logs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// ReadOptions select what Read writes, as kubelet's PodLogOptions do for `kubectl logs`.
type ReadOptions struct {
	// Since drops lines written before it; zero keeps every line.
	Since time.Time
	// TailLines starts that many lines before the end of the file; negative starts at its
	// beginning.
	TailLines int64
	// LimitBytes stops after that many bytes of output; 0 or less: no limit.
	LimitBytes int64
	// Timestamps prefixes every line with its RFC 3339 timestamp, as kubelet does.
	Timestamps bool
	// Follow keeps reading as the container writes, across rotations, until Running reports
	// the container stopped and everything it wrote was read, or ctx ends.
	Follow bool
	// Running reports whether the container still runs; consulted when following. nil: it
	// is taken for stopped, and Read ends at the end of the file.
	Running func() bool
	// PollInterval is how often a follow looks for new lines once it reached the end of the
	// file. Defaults to 250ms.
	PollInterval time.Duration
	// Stderr, when set, receives the lines the container wrote to stderr, and Read's writer
	// only those of stdout: an attach keeps the two streams apart. nil: both go to the writer,
	// in file order.
	Stderr io.Writer
}

// errLimitReached ends Read once LimitBytes were written; Read itself returns nil then.
var errLimitReached = errors.New("log output limit reached")

// Read writes the container log file at path to w the way kubelet serves
// /containerLogs: the message of every line, partial lines joined, stdout and stderr in file
// order, optionally each prefixed with its timestamp. The file and its two parent directories
// are opened without following symlinks (see Open). When w has a Flush method it is called
// whenever the end of the file is reached, so a follower sees lines as they come. Lines not in
// the CRI format are skipped.
func Read(ctx context.Context, path string, opts ReadOptions, w io.Writer) error {
	if opts.PollInterval <= 0 {
		opts.PollInterval = 250 * time.Millisecond
	}
	f, err := Open(path)
	if err != nil {
		return err
	}
	defer func() { f.Close() }()
	if opts.TailLines >= 0 {
		off, err := tailOffset(f, opts.TailLines)
		if err != nil {
			return fmt.Errorf("read log %s: %w", path, err)
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return fmt.Errorf("read log %s: %w", path, err)
		}
	}
	out := &logWriter{w: w, opts: opts, left: opts.LimitBytes}
	r := bufio.NewReader(f)
	var pending []byte // a line whose end was not written yet
	var ticker *time.Ticker
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			pending = append(pending, line...)
			continue
		}
		if err == nil {
			if len(pending) > 0 {
				line = append(pending, line...)
				pending = pending[:0]
			}
			if werr := out.line(line); werr != nil {
				if errors.Is(werr, errLimitReached) {
					return nil
				}
				return werr
			}
			continue
		}
		if !errors.Is(err, io.EOF) {
			return fmt.Errorf("read log %s: %w", path, err)
		}
		pending = append(pending, line...)
		out.flush()
		if !opts.Follow {
			return nil
		}
		// At the end of the file: wait for more, a rotation, or the container's end.
		if ticker == nil {
			ticker = time.NewTicker(opts.PollInterval)
			defer ticker.Stop()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		// Rotation first: whatever was written to the old file before its rename is then
		// seen by hasMore and read before switching.
		rot := rotated(f, path)
		grown, err := hasMore(f)
		if err != nil {
			return fmt.Errorf("read log %s: %w", path, err)
		}
		if grown {
			continue
		}
		if rot {
			// The file read to its end was renamed away: go on with the new one from its start.
			next, err := Open(path)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue // between the rename and the creation of the next file
				}
				return err
			}
			f.Close()
			f = next
			r.Reset(f)
			pending = pending[:0]
			continue
		}
		if opts.Running == nil || !opts.Running() {
			// Stopped: whatever it wrote before stopping is read by now, unless it landed
			// between the last read and this check. One more pass settles it.
			if grown, err := hasMore(f); err == nil && grown {
				opts.Running = func() bool { return false }
				continue
			}
			return nil
		}
	}
}

// hasMore reports whether f has bytes past the current read offset of its reader (the file
// offset, which the bufio reader above has consumed entirely at EOF).
func hasMore(f *os.File) (bool, error) {
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return false, err
	}
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	return st.Size() > off, nil
}

// rotated reports whether path names another file than f now (f was renamed by a rotation).
func rotated(f *os.File, path string) bool {
	cur, err := f.Stat()
	if err != nil {
		return false
	}
	now, err := os.Lstat(path)
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	return !os.SameFile(cur, now)
}

// tailOffset returns the offset of the start of the n-th line before the end of f (0 when the
// file has n lines or fewer), as kubelet's tail does: a last line without its newline counts.
func tailOffset(f *os.File, n int64) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := st.Size()
	if n == 0 {
		return size, nil
	}
	const block = 4096
	buf := make([]byte, block)
	end := size
	var count int64
	// The newline ending the file ends the last line; it does not start one.
	skipLast := true
	for end > 0 {
		start := max(0, end-block)
		chunk := buf[:end-start]
		if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' {
				skipLast = false
				continue
			}
			if skipLast {
				skipLast = false
				continue
			}
			count++
			if count == n {
				return start + int64(i) + 1, nil
			}
		}
		end = start
	}
	return 0, nil
}

// ParsedLine is one line of a CRI-format log.
type ParsedLine struct {
	Time    time.Time
	Stream  Stream
	Partial bool
	// Message is the line's content without the newline the format adds; it aliases the input.
	Message []byte
}

// ParseLine parses "TIMESTAMP STREAM TAG MESSAGE\n" (the newline optional).
func ParseLine(line []byte) (ParsedLine, error) {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	var p ParsedLine
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return p, fmt.Errorf("log line %q: no timestamp", truncateLine(line))
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return p, fmt.Errorf("log line %q: timestamp: %w", truncateLine(line), err)
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != string(Stdout) && string(stream) != string(Stderr)) {
		return p, fmt.Errorf("log line %q: no stream", truncateLine(line))
	}
	tag, msg, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		// "TS STREAM F" with an empty message and no space after the tag is not written by
		// holdfast, but tolerate it as kubelet does.
		tag, msg = rest, nil
	}
	switch string(tag) {
	case TagFull:
	case TagPartial:
		p.Partial = true
	default:
		return p, fmt.Errorf("log line %q: tag %q", truncateLine(line), tag)
	}
	p.Time, p.Stream, p.Message = t, Stream(stream), msg
	return p, nil
}

func truncateLine(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}

// logWriter turns CRI lines into kubectl's output, applying Since, Timestamps and LimitBytes.
type logWriter struct {
	w    io.Writer
	opts ReadOptions
	left int64 // bytes still allowed when LimitBytes > 0
	buf  []byte
}

func (lw *logWriter) line(raw []byte) error {
	p, err := ParseLine(raw)
	if err != nil {
		return nil // kubelet skips what it cannot parse, and so do we
	}
	if !lw.opts.Since.IsZero() && p.Time.Before(lw.opts.Since) {
		return nil
	}
	lw.buf = lw.buf[:0]
	if lw.opts.Timestamps {
		lw.buf = p.Time.AppendFormat(lw.buf, time.RFC3339Nano)
		lw.buf = append(lw.buf, ' ')
	}
	lw.buf = append(lw.buf, p.Message...)
	if !p.Partial {
		lw.buf = append(lw.buf, '\n')
	}
	out := lw.buf
	limited := false
	if lw.opts.LimitBytes > 0 {
		if int64(len(out)) >= lw.left {
			out, limited = out[:lw.left], true
		}
		lw.left -= int64(len(out))
	}
	w := lw.w
	if lw.opts.Stderr != nil && p.Stream == Stderr {
		w = lw.opts.Stderr
	}
	if _, err := w.Write(out); err != nil {
		return err
	}
	if limited {
		lw.flush()
		return errLimitReached
	}
	return nil
}

func (lw *logWriter) flush() {
	for _, w := range []io.Writer{lw.w, lw.opts.Stderr} {
		if f, ok := w.(interface{ Flush() }); ok {
			f.Flush()
		}
	}
}
