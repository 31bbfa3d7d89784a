package containerd

import (
	"log/slog"
	"strings"
	"time"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"google.golang.org/grpc"
)

// layerApplyTimeout bounds a layer's unpack into the snapshotter (Diff.Apply), which writes the
// whole layer: a large image on a gateway's flash takes minutes, not a request's time.
const layerApplyTimeout = 30 * time.Minute

// WithRequestTimeout bounds every call to containerd (see callDeadlines). Defaults to
// DefaultRequestTimeout.
func WithRequestTimeout(d time.Duration) Option {
	return func(r *Runtime) { r.requestTimeout = d }
}

// callTimeout is how long one containerd call of the given gRPC method may take; 0: no bound
// of ours. Kinds:
//   - Tasks.Wait waits for a process to exit, for as long as it runs: its caller bounds it
//     (StopContainer by the grace period, Exec by the probe's timeout);
//   - Diff.Apply unpacks a layer, Content.Read reads a blob: layerApplyTimeout;
//   - the listing streams (Containers.ListStream, which the client's container list uses,
//     Snapshots.List, Content.List) and every other unary call (records, labels, tasks'
//     state, create, start, kill, delete, leases, snapshots, images): the request timeout;
//   - the other streams (the event subscription, a pull's content writes and transfers)
//     last as long as what they carry: unbounded here.
func callTimeout(method string, stream bool, request time.Duration) time.Duration {
	switch {
	case strings.HasSuffix(method, ".Tasks/Wait"):
		return 0
	case strings.HasSuffix(method, ".Diff/Apply"), strings.HasSuffix(method, ".Content/Read"):
		return layerApplyTimeout
	case !stream:
		return request
	case strings.HasSuffix(method, ".Containers/ListStream"), strings.HasSuffix(method, ".Snapshots/List"),
		strings.HasSuffix(method, ".Content/List"):
		return request
	default:
		return 0
	}
}

// callDeadlines are the gRPC interceptors that give every call to containerd its deadline.
func callDeadlines(log *slog.Logger, request time.Duration) []grpc.DialOption {
	return runtime.CallDeadlines(log, "containerd", containerdBound(request))
}

// containerdBound is callTimeout with that request timeout.
func containerdBound(request time.Duration) runtime.CallBound {
	return func(method string, stream bool, _ any) time.Duration { return callTimeout(method, stream, request) }
}
