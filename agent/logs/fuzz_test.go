package logs

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// FuzzParseLine: a line ParseLine accepts, written again with AppendLine (as the logger writes
// lines), parses to the same time, stream, tag and message; and that written form is a fixed
// point. (Times whose UTC year is outside 0000-9999 are left out: see below.)
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		"2026-12-03T10:00:00.000000000Z stdout F one\n",
		"2026-12-03T10:00:01.000000000Z stderr P thr",
		"2026-12-03T10:00:02.123456789+02:00 stdout F  two  spaces \n",
		"2016-10-06T00:17:09.669794202Z stdout F",
		"2016-10-06T00:17:09.669794202Z stdout F \r\n",
		"2016-10-06T00:17:09Z stderr F héllo \xff\xfe\n",
		"0000-01-01T00:00:00+23:59 stdout F early\n",
		"9999-12-31T23:59:59.999999999-23:59 stdout F late\n",
		"2026-12-03T10:00:00Z stdout X tag\n",
		"2026-12-03T10:00:00Z stdin F x\n",
		"garbage that is not a CRI line\n",
		"2026-12-03T10:00",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		p, err := ParseLine(line)
		if err != nil {
			return
		}
		if y := p.Time.UTC().Year(); y < 0 || y > 9999 {
			// "0000-01-01T00:00:00+01:00" parses, but in UTC it is in year -1, which RFC 3339
			// cannot write: AppendLine writes UTC, and only the logger's clock feeds it.
			return
		}
		out := AppendLine(nil, p.Time, p.Stream, p.Partial, p.Message)
		q, err := ParseLine(out)
		if err != nil {
			t.Fatalf("%q parsed, but as written again %q does not: %v", line, out, err)
		}
		if !q.Time.Equal(p.Time) || q.Stream != p.Stream || q.Partial != p.Partial || !bytes.Equal(q.Message, p.Message) {
			t.Fatalf("%q parsed as %+v, written again %q parses as %+v", line, p, out, q)
		}
		if again := AppendLine(nil, q.Time, q.Stream, q.Partial, q.Message); !bytes.Equal(again, out) {
			t.Fatalf("written form is not a fixed point: %q, then %q", out, again)
		}
	})
}

// FuzzCopyLines: the logger's framing of a container's output loses nothing and invents
// nothing. Every line it emits is a CRI line ParseLine reads, no message is over the limit,
// and the messages, each full line followed by its newline, are the output exactly (with the
// "\r" of "\r\n" dropped), however the output was split into reads.
func FuzzCopyLines(f *testing.F) {
	long := strings.Repeat("x", 40)
	for _, s := range []string{"", "one\ntwo\n", "\n\n", "dos\r\n", "a\rb\n", "one\ntail", long + "\n",
		long[:16] + "\n", long[:15] + "\r\nnext\n", "héllo  wörld \n", "\r", "\r\r\n\r", "\xff\xfe\x00\n"} {
		f.Add([]byte(s), uint8(16), false)
		f.Add([]byte(s), uint8(0), true)
	}
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, in []byte, maxLine uint8, oneByte bool) {
		var r io.Reader = bytes.NewReader(in)
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		limit := max(int(maxLine), minMaxLineBytes)
		var rebuilt []byte
		err := copyLines(r, Stderr, int(maxLine), func() time.Time { return t0 }, func(line []byte) {
			p, err := ParseLine(line)
			if err != nil {
				t.Fatalf("emitted %q, which ParseLine refuses: %v", line, err)
			}
			if !p.Time.Equal(t0) || p.Stream != Stderr {
				t.Fatalf("emitted %q: time %s, stream %s", line, p.Time, p.Stream)
			}
			if len(p.Message) > limit {
				t.Fatalf("emitted a %d-byte message, over the %d-byte limit", len(p.Message), limit)
			}
			rebuilt = append(rebuilt, p.Message...)
			if !p.Partial {
				rebuilt = append(rebuilt, '\n')
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := bytes.ReplaceAll(in, []byte("\r\n"), []byte("\n")); !bytes.Equal(rebuilt, want) {
			t.Fatalf("output %q came out as %q", in, rebuilt)
		}
	})
}

// FuzzRead: Read of any file content (CRI lines or not, complete or cut) writes what kubelet
// would: the messages of the complete lines ParseLine accepts, among the last tail lines, cut
// at limit bytes, optionally timestamped, stderr apart when asked.
func FuzzRead(f *testing.F) {
	var lines []byte
	for i, l := range []string{"stdout F one", "stderr F two", "stdout P thr", "stdout F ee", "stdout F four"} {
		parts := strings.SplitN(l, " ", 3)
		lines = AppendLine(lines, readT0.Add(time.Duration(i)*time.Second), Stream(parts[0]), parts[1] == TagPartial, []byte(parts[2]))
	}
	lines = append(lines, "garbage that is not a CRI line\n2026-12-03T10:00:05.000000000Z stdout F cut off without newline"...)
	f.Add(lines, int8(-1), uint16(0), false, false)
	f.Add(lines, int8(2), uint16(0), true, true)
	f.Add(lines, int8(0), uint16(0), false, false)
	f.Add(lines, int8(-1), uint16(7), true, false)
	f.Add([]byte("\n\n\n"), int8(1), uint16(1), false, false)
	f.Add([]byte(strings.Repeat("2026-12-03T10:00:00Z stdout P "+strings.Repeat("y", 5000)+"\n", 2)), int8(-1), uint16(0), false, true)

	// One file, rewritten for every input: a worker runs its inputs one at a time.
	dir := filepath.Join(f.TempDir(), "default_web_uid1", "app")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	path := filepath.Join(dir, "0.log")
	f.Fuzz(func(t *testing.T, content []byte, tail int8, limit uint16, timestamps, splitStderr bool) {
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		opts := ReadOptions{TailLines: int64(tail), LimitBytes: int64(limit), Timestamps: timestamps}
		var stderr bytes.Buffer
		if splitStderr && limit == 0 { // the limit counts both streams: modelled without the split
			opts.Stderr = &stderr
		}
		var stdout bytes.Buffer
		if err := Read(context.Background(), path, opts, &stdout); err != nil {
			t.Fatalf("Read: %v", err)
		}

		pieces := bytes.SplitAfter(content, []byte{'\n'})
		if len(pieces[len(pieces)-1]) == 0 {
			pieces = pieces[:len(pieces)-1]
		}
		if tail >= 0 && int(tail) < len(pieces) {
			pieces = pieces[len(pieces)-int(tail):]
		}
		var wantOut, wantErr []byte
		for _, piece := range pieces {
			if piece[len(piece)-1] != '\n' {
				continue // not written completely yet
			}
			p, err := ParseLine(piece)
			if err != nil {
				continue
			}
			dst := &wantOut
			if opts.Stderr != nil && p.Stream == Stderr {
				dst = &wantErr
			}
			if timestamps {
				*dst = append(p.Time.AppendFormat(*dst, time.RFC3339Nano), ' ')
			}
			*dst = append(*dst, p.Message...)
			if !p.Partial {
				*dst = append(*dst, '\n')
			}
		}
		if limit > 0 && len(wantOut) > int(limit) {
			wantOut = wantOut[:limit]
		}
		if !bytes.Equal(stdout.Bytes(), wantOut) || !bytes.Equal(stderr.Bytes(), wantErr) {
			t.Fatalf("Read(tail %d, limit %d, timestamps %v) of %q:\n got %q / %q\nwant %q / %q",
				tail, limit, timestamps, content, stdout.Bytes(), stderr.Bytes(), wantOut, wantErr)
		}
	})
}
