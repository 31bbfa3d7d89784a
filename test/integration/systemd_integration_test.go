package integration

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/config"
)

// notifySocket plays systemd's side of sd_notify: a unix datagram socket whose messages arrive
// on the returned channel until the test ends.
func notifySocket(t *testing.T) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan string, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return // closed at the end of the test
			}
			select {
			case msgs <- string(buf[:n]):
			default: // nobody reads any more
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return path, msgs
}

// nextMessage waits for a message satisfying match, failing t after timeout. It returns the
// messages seen on the way too.
func nextMessage(t *testing.T, msgs <-chan string, timeout time.Duration, what string, match func(string) bool) (string, []string) {
	t.Helper()
	deadline := time.After(timeout)
	var seen []string
	for {
		select {
		case m := <-msgs:
			if match(m) {
				return m, seen
			}
			seen = append(seen, m)
		case <-deadline:
			t.Fatalf("%s: no such sd_notify message after %s; saw %q", what, timeout, seen)
		}
	}
}

// TestSystemdNotifyAndWatchdog runs the agent as systemd runs the firmware's Type=notify unit,
// with the notify socket a real unix datagram socket: READY=1 once it runs, STATUS lines, and
// WATCHDOG=1 pets; when containerd hangs (SIGSTOP) and the relist stalls past its threshold,
// the pets stop (systemd would restart the agent) and STATUS says why; they resume when
// containerd runs again.
func TestSystemdNotifyAndWatchdog(t *testing.T) {
	const threshold = 3 * time.Second
	sock, msgs := notifySocket(t)
	e := startEnvFor(t, nil, func(_ *env, c *config.Config) {
		c.Pods.RelistThreshold = config.D(threshold)
		c.Pods.RelistPeriod = config.D(time.Second) // a stall shows within the threshold
	}, []string{"NOTIFY_SOCKET=" + sock, "WATCHDOG_USEC=1500000"})

	ready, _ := nextMessage(t, msgs, 2*time.Minute, "READY=1", func(m string) bool { return strings.Contains(m, "READY=1") })
	if !strings.Contains(ready, "STATUS=0 pods, standalone") {
		t.Errorf("READY message %q: want the agent's status with it", ready)
	}
	nextMessage(t, msgs, time.Minute, "a watchdog pet", func(m string) bool {
		return strings.Contains(m, "WATCHDOG=1") && strings.Contains(m, "STATUS=0 pods, standalone")
	})

	e.cd.Freeze()
	unhealthy, _ := nextMessage(t, msgs, time.Minute, "unhealthy status", func(m string) bool { return strings.Contains(m, "STATUS=unhealthy") })
	if !strings.Contains(unhealthy, "PLEG is not healthy") || strings.Contains(unhealthy, "WATCHDOG=1") {
		t.Errorf("first unhealthy message %q: want the PLEG reason and no pet", unhealthy)
	}
	// While the runtime stays frozen, no message pets the watchdog: the next few are all
	// unhealthy statuses.
	for range 3 {
		m, _ := nextMessage(t, msgs, time.Minute, "another message", func(string) bool { return true })
		if strings.Contains(m, "WATCHDOG=1") || !strings.Contains(m, "STATUS=unhealthy") {
			t.Fatalf("while containerd is frozen the agent sent %q", m)
		}
	}

	e.cd.Thaw()
	nextMessage(t, msgs, time.Minute, "pets again after thaw", func(m string) bool { return strings.Contains(m, "WATCHDOG=1") })

	e.agent.Stop()
	nextMessage(t, msgs, time.Minute, "STOPPING=1", func(m string) bool { return strings.Contains(m, "STOPPING=1") })
}
