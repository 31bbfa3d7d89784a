package pods

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Kubelet's bounds on a container's termination message (kubecontainer's
// MaxContainerTerminationMessageLength, ...LogLength and ...LogLines).
const (
	maxTerminationMessage       = 4 * 1024 // the last bytes of the terminationMessagePath file
	maxLogMessageBytes          = 2 * 1024 // FallbackToLogsOnError: the last bytes...
	maxLogMessageLines          = 80       // ...of the last lines of the log
	logTailReadBytes      int64 = 16 * 1024
)

// terminationLogPath is the host file bind-mounted at a container attempt's
// terminationMessagePath, in the pod's directory (removed with the pod).
func terminationLogPath(podDir, name string, attempt int) string {
	return filepath.Join(podDir, "containers", name, strconv.Itoa(attempt)+".termination-log")
}

// terminationLogMount creates an empty termination log for the attempt, writable by whatever
// user the container runs as (as kubelet makes it), and returns its mount; none when the
// container has no terminationMessagePath.
func terminationLogMount(podDir string, c *v1.Container, attempt int) (*specs.Mount, error) {
	if c.TerminationMessagePath == "" {
		return nil, nil
	}
	path := terminationLogPath(podDir, c.Name, attempt)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create termination log directory: %w", err)
	}
	if err := os.WriteFile(path, nil, 0o666); err != nil {
		return nil, fmt.Errorf("create termination log: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil { // past the umask
		return nil, fmt.Errorf("create termination log: %w", err)
	}
	return &specs.Mount{Destination: c.TerminationMessagePath, Type: "bind", Source: path, Options: []string{"rbind", "rw"}}, nil
}

// terminationMessage is what kubelet reports as an exited container's termination message:
// the last 4 KiB of its termination log; with FallbackToLogsOnError, when that is empty and
// the container failed, the last 2 KiB of the last 80 lines of its log. ok is false while the
// message is to come from the log and the exit is not recorded yet: until the task is deleted
// the log may lack the last of the output (containerd's shim holds the logger's pipes open,
// and a last line with no newline waits in the logger for the end of the stream). The file is
// complete once the process has exited, recorded or not.
func terminationMessage(podDir string, c *v1.Container, ctr runtime.Container) (msg string, ok bool) {
	fallback := c.TerminationMessagePolicy == v1.TerminationMessageFallbackToLogsOnError && ctr.ExitCode != 0
	if c.TerminationMessagePath != "" {
		path := terminationLogPath(podDir, c.Name, ctr.Attempt)
		data, err := readTail(path, maxTerminationMessage)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Sprintf("Error on reading termination log %s: %v", path, err), true
		case len(data) > 0 || !fallback:
			return string(data), true
		}
	}
	if !fallback || ctr.LogPath == "" {
		return "", true
	}
	if !ctr.Recorded {
		return "", false
	}
	msg, err := logTail(ctr.LogPath)
	if err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err), true
	}
	return msg, true
}

// readTail returns the last max bytes of the file at path.
func readTail(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if off := st.Size() - max; off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// logTail reads the messages of a CRI-format container log (opened without following
// symlinks) and keeps the last maxLogMessageBytes of its last maxLogMessageLines lines.
func logTail(path string) (string, error) {
	f, err := logs.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	// Enough for the last 2 KiB of messages: every line holds at least one byte of message
	// (its newline) beside a header of under 64 bytes, and at most 80 lines count.
	start := max(0, st.Size()-logTailReadBytes)
	data, err := io.ReadAll(io.NewSectionReader(f, start, st.Size()-start))
	if err != nil {
		return "", err
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	if start > 0 && len(lines) > 0 {
		lines = lines[1:] // cut in the middle
	}
	if n := len(lines); n > 0 && len(lines[n-1]) == 0 {
		lines = lines[:n-1]
	}
	if len(lines) > maxLogMessageLines {
		lines = lines[len(lines)-maxLogMessageLines:]
	}
	var msg []byte
	for _, line := range lines {
		// "TIMESTAMP STREAM TAG MESSAGE\n"
		fields := bytes.SplitN(bytes.TrimSuffix(line, []byte("\n")), []byte(" "), 4)
		if len(fields) < 3 {
			continue
		}
		if len(fields) == 4 {
			msg = append(msg, fields[3]...)
		}
		if string(fields[2]) == logs.TagFull {
			msg = append(msg, '\n')
		}
	}
	if len(msg) > maxLogMessageBytes {
		msg = msg[len(msg)-maxLogMessageBytes:]
	}
	return string(msg), nil
}
