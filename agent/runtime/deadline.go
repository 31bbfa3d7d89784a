package runtime

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// DefaultRequestTimeout bounds each call to containerd, as kubelet's runtimeRequestTimeout
// (2m) bounds each CRI call.
const DefaultRequestTimeout = 2 * time.Minute

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

// CallBound says how long one gRPC call to a runtime may take, from its method and, for a
// unary call, its request (nil for a stream); 0: no bound of ours.
type CallBound func(method string, stream bool, req any) time.Duration

// callDeadlines are the gRPC interceptors that give every call to containerd its deadline.
func callDeadlines(log *slog.Logger, request time.Duration) []grpc.DialOption {
	return CallDeadlines(log, "containerd", containerdBound(request))
}

// containerdBound is callTimeout with that request timeout.
func containerdBound(request time.Duration) CallBound {
	return func(method string, stream bool, _ any) time.Duration { return callTimeout(method, stream, request) }
}

// CallDeadlines are the gRPC interceptors that give every call to a runtime (named runtime in
// the log) its deadline per bound (a caller's earlier one stands), in one place rather than at
// each call site: a runtime that hangs (its socket accepts, nothing answers) would otherwise
// hold every worker sync, garbage collection, preStop, relist and stats request that calls it
// until it answers, if ever. A call cut by it is logged with its method, so that a hung
// runtime is seen in the log by the call it hung, beside the relist's "PLEG is not healthy".
func CallDeadlines(log *slog.Logger, runtime string, bound CallBound) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(unaryDeadline(log, runtime, bound)),
		grpc.WithChainStreamInterceptor(streamDeadline(log, runtime, bound)),
	}
}

// timedOut logs a call cut by its deadline of ours, not by its caller.
func timedOut(log *slog.Logger, runtime string, ctx, callCtx context.Context, method string, d time.Duration) {
	if ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) {
		log.Warn(runtime+" call timed out: the runtime is hung or overloaded", "call", method, "timeout", d)
	}
}

func unaryDeadline(log *slog.Logger, runtime string, bound CallBound) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		d := bound(method, false, req)
		if d <= 0 {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		callCtx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		err := invoker(callCtx, method, req, reply, cc, opts...)
		if err != nil {
			timedOut(log, runtime, ctx, callCtx, method, d)
		}
		return err
	}
}

func streamDeadline(log *slog.Logger, runtime string, bound CallBound) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		d := bound(method, true, nil)
		if d <= 0 {
			return streamer(ctx, desc, cc, method, opts...)
		}
		callCtx, cancel := context.WithTimeout(ctx, d)
		s, err := streamer(callCtx, desc, cc, method, opts...)
		if err != nil {
			timedOut(log, runtime, ctx, callCtx, method, d)
			cancel()
			return nil, err
		}
		return &boundedStream{ClientStream: s, end: func() { timedOut(log, runtime, ctx, callCtx, method, d); cancel() }}, nil
	}
}

// boundedStream releases its deadline when the stream ends: at the first error of RecvMsg
// (io.EOF included), which every reader of a server stream reaches.
type boundedStream struct {
	grpc.ClientStream
	once sync.Once
	end  func()
}

func (s *boundedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.once.Do(s.end)
	}
	return err
}
