// Package systemd speaks the sd_notify protocol for the agent when systemd runs it as a
// Type=notify service (firmware/systemd/holdfast.service): READY=1 once the agent has restored
// its pods and started its loops, STATUS= lines an operator reads in `systemctl status`, and
// WATCHDOG=1 for as long as the agent is healthy. An agent whose relist is stuck stops petting
// the watchdog, and systemd restarts it (stopping the agent never stops the pods: they are
// containerd's). Without NOTIFY_SOCKET every call is a no-op.
package systemd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notify sends one sd_notify message (several "KEY=VALUE" lines), logging a failure: systemd
// going away must not stop the agent.
func Notify(log *slog.Logger, lines ...string) {
	if _, err := daemon.SdNotify(false, strings.Join(lines, "\n")); err != nil {
		log.Warn("sd_notify", "message", lines, "err", err)
	}
}

// ExtendStartTimeout asks systemd for d more before the start is declared failed: the agent
// waits for containerd at boot, which is progress, not a hang.
func ExtendStartTimeout(log *slog.Logger, d time.Duration, status string) {
	Notify(log, fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", d.Microseconds()), "STATUS="+status)
}

// defaultStatusPeriod is how often STATUS is refreshed when no watchdog is configured.
const defaultStatusPeriod = 10 * time.Second

// Notifier reports readiness, status and liveness to systemd.
type Notifier struct {
	// Healthy returns nil while the agent works (its relist is recent); an error stops the
	// watchdog pets and is shown in STATUS.
	Healthy func() error
	// Status is the one-line summary shown while healthy ("3 pods, apiserver reachable").
	Status func() string
	// Grace is how long after Run starts an unhealthy answer is still taken as starting up
	// (the first relist may take a while on a loaded gateway); it should be the relist
	// threshold.
	Grace time.Duration
	Log   *slog.Logger

	now   func() time.Time // tests
	ticks <-chan time.Time // tests drive the loop; nil: a ticker
}

// Run sends READY=1, then every third of the watchdog interval (or every 10s without a
// watchdog) one message: STATUS plus WATCHDOG=1 while healthy, STATUS alone while not. It
// sends STOPPING=1 when ctx ends.
func (n *Notifier) Run(ctx context.Context) error {
	if n.now == nil {
		n.now = time.Now
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.Log.Warn("systemd watchdog configuration unusable; not petting it", "err", err)
	}
	watchdog := interval > 0
	period := defaultStatusPeriod
	if watchdog {
		period = interval / 3
		n.Log.Info("systemd watchdog enabled", "timeout", interval, "petEvery", period)
	}
	ticks := n.ticks
	if ticks == nil {
		t := time.NewTicker(period)
		defer t.Stop()
		ticks = t.C
	}
	start := n.now()
	n.send("READY=1", "STATUS="+n.Status())
	wasHealthy := true
	for {
		select {
		case <-ctx.Done():
			n.send("STOPPING=1", "STATUS=stopping; pods keep running")
			return nil
		case <-ticks:
		}
		herr := n.Healthy()
		if herr != nil && n.now().Sub(start) < n.Grace {
			herr = nil // still starting
		}
		switch {
		case herr == nil:
			if !wasHealthy {
				n.Log.Info("agent healthy again; petting the systemd watchdog")
			}
			lines := []string{"STATUS=" + n.Status()}
			if watchdog {
				lines = append(lines, "WATCHDOG=1")
			}
			n.send(lines...)
		default:
			if wasHealthy {
				n.Log.Error("agent unhealthy; no longer petting the systemd watchdog, which restarts the agent (pods keep running)", "err", herr)
			}
			n.send("STATUS=unhealthy, watchdog not petted: " + herr.Error())
		}
		wasHealthy = herr == nil
	}
}

func (n *Notifier) send(lines ...string) {
	Notify(n.Log, lines...)
}
