package cri

import (
	"context"
	"os"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// logMonitorPeriod is how often the container logs' sizes are checked (the kubelet's
// containerLogMonitorInterval).
const logMonitorPeriod = 10 * time.Second

// RotateLogs keeps the logs of running containers within LogMaxSize and LogMaxFiles until ctx
// ends, as the kubelet's container log manager does: the runtime writes them, so a log past
// its size is renamed aside and the runtime asked to reopen it (ReopenContainerLog). Nothing
// with LogMaxSize 0.
func (r *Runtime) RotateLogs(ctx context.Context) error {
	if r.cfg.LogMaxSize <= 0 {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(logMonitorPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cs, err := r.List(ctx)
		if err != nil {
			r.log.Warn("list containers for log rotation", "err", err)
			continue
		}
		for _, c := range cs {
			if c.State == runtime.StateRunning && c.LogPath != "" {
				r.rotateLog(ctx, c)
			}
		}
	}
}

func (r *Runtime) rotateLog(ctx context.Context, c runtime.Container) {
	st, err := os.Lstat(c.LogPath)
	if err != nil || st.Size() < r.cfg.LogMaxSize {
		return
	}
	undo, err := logs.RotateAside(c.LogPath, max(r.cfg.LogMaxFiles, 1), time.Now())
	if undo == nil {
		r.log.Warn("rotate container log", "path", c.LogPath, "err", err)
		return
	}
	if err != nil {
		r.log.Warn("prune rotated container logs", "path", c.LogPath, "err", err)
	}
	if _, err := r.rs.ReopenContainerLog(ctx, &criapi.ReopenContainerLogRequest{ContainerId: c.ID}); err != nil {
		r.log.Warn("reopen container log after rotation; rotation undone", "container", c.ID, "path", c.LogPath, "err", err)
		if err := undo(); err != nil {
			r.log.Error("container log left rotated aside", "path", c.LogPath, "err", err)
		}
	}
}
