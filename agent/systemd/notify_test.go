package systemd

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// listen makes a unix datagram socket and points NOTIFY_SOCKET at it, as systemd does for a
// Type=notify service, and returns a function reading the next message.
func listen(t *testing.T) func() string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return func() string {
		t.Helper()
		buf := make([]byte, 4096)
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("read sd_notify message: %v", err)
		}
		return string(buf[:n])
	}
}

// The protocol as systemd sees it on its socket: READY=1 with a status first, then one message
// per tick carrying STATUS and WATCHDOG=1 while healthy; while unhealthy the message carries
// the reason and no WATCHDOG=1, so systemd's watchdog fires; pets resume once healthy again;
// STOPPING=1 at the end.
func TestNotifierPetsWatchdogOnlyWhileHealthy(t *testing.T) {
	next := listen(t)
	t.Setenv("WATCHDOG_USEC", "3000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))

	var mu sync.Mutex
	var health error
	setHealth := func(err error) { mu.Lock(); health = err; mu.Unlock() }
	ticks := make(chan time.Time)
	n := &Notifier{
		Healthy: func() error { mu.Lock(); defer mu.Unlock(); return health },
		Status:  func() string { return "2 pods, apiserver reachable" },
		Log:     slog.New(slog.DiscardHandler),
		ticks:   ticks,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()

	if got := next(); got != "READY=1\nSTATUS=2 pods, apiserver reachable" {
		t.Fatalf("first message %q, want READY=1 and the status", got)
	}
	ticks <- time.Now()
	if got := next(); got != "STATUS=2 pods, apiserver reachable\nWATCHDOG=1" {
		t.Fatalf("healthy tick sent %q", got)
	}
	setHealth(errors.New("PLEG is not healthy: pleg was last seen active 3m1s ago; threshold is 3m0s"))
	for range 3 {
		ticks <- time.Now()
		got := next()
		if strings.Contains(got, "WATCHDOG=1") || !strings.Contains(got, "STATUS=unhealthy") || !strings.Contains(got, "PLEG is not healthy") {
			t.Fatalf("unhealthy tick sent %q: want the reason and no watchdog pet", got)
		}
	}
	setHealth(nil)
	ticks <- time.Now()
	if got := next(); !strings.HasSuffix(got, "WATCHDOG=1") {
		t.Fatalf("healthy again, sent %q", got)
	}
	cancel()
	if got := next(); !strings.HasPrefix(got, "STOPPING=1") {
		t.Fatalf("at stop sent %q", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Unhealthy answers within the grace period after start are taken as starting up: the first
// relist of a loaded gateway must not cost a restart.
func TestNotifierGraceAtStart(t *testing.T) {
	next := listen(t)
	t.Setenv("WATCHDOG_USEC", "3000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	ticks := make(chan time.Time)
	n := &Notifier{
		Healthy: func() error { return errors.New("runtime not relisted yet") },
		Status:  func() string { return "starting" },
		Grace:   time.Minute,
		Log:     slog.New(slog.DiscardHandler),
		now:     clock,
		ticks:   ticks,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	next() // READY
	ticks <- time.Now()
	if got := next(); !strings.HasSuffix(got, "WATCHDOG=1") {
		t.Fatalf("within grace, sent %q; want a pet", got)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	ticks <- time.Now()
	if got := next(); strings.Contains(got, "WATCHDOG=1") {
		t.Fatalf("after grace, unhealthy, sent %q; want no pet", got)
	}
	cancel()
	next()
	<-done
}

// Without NOTIFY_SOCKET (not under systemd) the notifier runs and sends nothing, and fails
// nothing.
func TestNotifierWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	os.Unsetenv("NOTIFY_SOCKET")
	ticks := make(chan time.Time)
	n := &Notifier{Healthy: func() error { return nil }, Status: func() string { return "x" }, Log: slog.New(slog.DiscardHandler), ticks: ticks}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	ticks <- time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
