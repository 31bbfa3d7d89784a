package logs

import (
	"bufio"
	"errors"
	"io"
	"os"
	"time"
)

// Stream names a container output stream as the CRI log format writes it.
type Stream string

// The two streams of a container.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Tags of the CRI log format.
const (
	// TagFull ends a line: the message is the whole line, or its last chunk.
	TagFull = "F"
	// TagPartial marks a chunk of a line that goes on in the next chunk.
	TagPartial = "P"
)

// TimestampFormat is RFC 3339 with nine fixed fractional digits. Written in UTC it parses with
// time.RFC3339Nano (kubelet's parser) and sorts as text.
const TimestampFormat = "2006-01-02T15:04:05.000000000Z07:00"

// DefaultMaxLineBytes is the longest message one log line carries, as containerd's
// max_container_log_line_size: longer lines are cut into partial lines.
const DefaultMaxLineBytes = 16 * 1024

// minMaxLineBytes is the smallest line limit: bufio's smallest buffer.
const minMaxLineBytes = 16

// AppendLine appends one line in the CRI log format to dst:
// "TIMESTAMP STREAM TAG MESSAGE\n", the timestamp in UTC.
func AppendLine(dst []byte, t time.Time, s Stream, partial bool, msg []byte) []byte {
	dst = t.UTC().AppendFormat(dst, TimestampFormat)
	dst = append(dst, ' ')
	dst = append(dst, s...)
	dst = append(dst, ' ')
	if partial {
		dst = append(dst, TagPartial...)
	} else {
		dst = append(dst, TagFull...)
	}
	dst = append(dst, ' ')
	dst = append(dst, msg...)
	return append(dst, '\n')
}

// copyLines reads r to its end and calls emit with every CRI line it makes of it. Lines longer
// than maxLine bytes are cut into partial lines; output that ends without a newline is a
// partial line. A read deadline that expires (os.ErrDeadlineExceeded) counts as the end of the
// stream. The slice given to emit is reused: emit must not keep it.
func copyLines(r io.Reader, s Stream, maxLine int, now func() time.Time, emit func(line []byte)) error {
	if maxLine < minMaxLineBytes {
		maxLine = minMaxLineBytes
	}
	br := bufio.NewReaderSize(r, maxLine)
	var out []byte
	write := func(partial bool, msg []byte) {
		out = AppendLine(out[:0], now(), s, partial, msg)
		emit(out)
	}
	for {
		chunk, err := br.ReadSlice('\n')
		switch {
		case err == nil: // a whole line, or the end of one cut before
			msg := chunk[:len(chunk)-1]
			if n := len(msg); n > 0 && msg[n-1] == '\r' {
				msg = msg[:n-1]
			}
			write(false, msg)
		case errors.Is(err, bufio.ErrBufferFull):
			// A "\r\n" straddling the cut stays whole for the next read.
			if n := len(chunk); n > 1 && chunk[n-1] == '\r' {
				if uerr := br.UnreadByte(); uerr == nil {
					chunk = chunk[:n-1]
				}
			}
			write(true, chunk)
		default:
			if len(chunk) > 0 {
				write(true, chunk)
			}
			if errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, os.ErrClosed) || errors.Is(err, io.ErrClosedPipe) {
				return nil
			}
			return err
		}
	}
}
