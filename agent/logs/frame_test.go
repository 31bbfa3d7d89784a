package logs

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

var t0 = time.Date(2026, 11, 2, 10, 4, 5, 120000000, time.FixedZone("CET", 3600))

func TestAppendLine(t *testing.T) {
	got := string(AppendLine([]byte("x"), t0, Stderr, true, []byte("a b")))
	want := "x2026-11-02T09:04:05.120000000Z stderr P a b\n"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	ts := strings.Fields(got[1:])[0]
	if parsed, err := time.Parse(time.RFC3339Nano, ts); err != nil || !parsed.Equal(t0) {
		t.Fatalf("timestamp %q does not parse back with RFC3339Nano: %v %v", ts, parsed, err)
	}
}

// line is a CRI line without its timestamp.
type line struct {
	stream Stream
	tag    string
	msg    string
}

func collect(t *testing.T, r io.Reader, maxLine int) []line {
	t.Helper()
	var out []line
	err := copyLines(r, Stdout, maxLine, func() time.Time { return t0 }, func(b []byte) {
		s := string(b)
		if !strings.HasSuffix(s, "\n") {
			t.Fatalf("line %q does not end with a newline", s)
		}
		parts := strings.SplitN(strings.TrimSuffix(s, "\n"), " ", 4)
		if len(parts) != 4 || parts[0] != "2026-11-02T09:04:05.120000000Z" {
			t.Fatalf("malformed line %q", s)
		}
		out = append(out, line{Stream(parts[1]), parts[2], parts[3]})
	})
	if err != nil {
		t.Fatalf("copyLines: %v", err)
	}
	return out
}

func TestCopyLines(t *testing.T) {
	long := strings.Repeat("x", 40)
	for _, tc := range []struct {
		name    string
		in      string
		maxLine int
		want    []line
	}{
		{"empty", "", 16, nil},
		{"full lines", "one\ntwo\n", 16, []line{{Stdout, "F", "one"}, {Stdout, "F", "two"}}},
		{"empty line kept", "\n\n", 16, []line{{Stdout, "F", ""}, {Stdout, "F", ""}}},
		{"crlf stripped", "dos\r\n", 16, []line{{Stdout, "F", "dos"}}},
		{"lone cr kept", "a\rb\n", 16, []line{{Stdout, "F", "a\rb"}}},
		{"no newline at end is partial", "one\ntail", 16, []line{{Stdout, "F", "one"}, {Stdout, "P", "tail"}}},
		{"long line cut", long + "\n", 16, []line{
			{Stdout, "P", long[:16]}, {Stdout, "P", long[16:32]}, {Stdout, "F", long[32:]},
		}},
		{"exactly the limit then newline", long[:16] + "\n", 16, []line{{Stdout, "P", long[:16]}, {Stdout, "F", ""}}},
		{"crlf straddling the cut", long[:15] + "\r\nnext\n", 16, []line{{Stdout, "P", long[:15]}, {Stdout, "F", ""}, {Stdout, "F", "next"}}},
		{"spaces and utf-8", "héllo  wörld \n", 64, []line{{Stdout, "F", "héllo  wörld "}}},
		{"limit below bufio minimum is raised", long[:20] + "\n", 4, []line{{Stdout, "P", long[:16]}, {Stdout, "F", long[16:20]}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read too: lines are framed by content, not by read boundaries.
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				got := collect(t, r, tc.maxLine)
				if len(got) != len(tc.want) {
					t.Fatalf("got %q, want %q", got, tc.want)
				}
				for i := range got {
					if got[i] != tc.want[i] {
						t.Fatalf("line %d: got %q, want %q (all: %q)", i, got[i], tc.want[i], got)
					}
				}
			}
		})
	}
}

func TestCopyLinesReadError(t *testing.T) {
	boom := errors.New("boom")
	var got []string
	err := copyLines(io.MultiReader(strings.NewReader("half"), iotest.ErrReader(boom)), Stderr, 16, time.Now, func(b []byte) {
		got = append(got, string(b))
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	if len(got) != 1 || !strings.HasSuffix(got[0], " stderr P half\n") {
		t.Fatalf("pending output before the error: %q", got)
	}
}
