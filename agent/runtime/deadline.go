package runtime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// DefaultRequestTimeout bounds each call to containerd, as kubelet's runtimeRequestTimeout
// (2m) bounds each CRI call.
const DefaultRequestTimeout = 2 * time.Minute

// CallBound says how long one gRPC call to a runtime may take, from its method and, for a
// unary call, its request (nil for a stream); 0: no bound of ours.
type CallBound func(method string, stream bool, req any) time.Duration

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
