package runtime

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// TestCallDeadlines: a call gets its bound, a caller's earlier deadline stands, and a call cut
// by the bound (not by its caller) is logged by name.
func TestCallDeadlines(t *testing.T) {
	const request = time.Minute
	fixed := func(d time.Duration) CallBound { return func(string, bool, any) time.Duration { return d } }
	t.Run("bound", func(t *testing.T) {
		var got time.Duration
		invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			if d, ok := ctx.Deadline(); ok {
				got = time.Until(d)
			}
			return nil
		}
		if err := unaryDeadline(slog.New(slog.DiscardHandler), "containerd", fixed(request))(context.Background(), "/x.Tasks/Get", nil, nil, nil, invoker); err != nil {
			t.Fatal(err)
		}
		if got > request || got < request-time.Second {
			t.Errorf("deadline in %s, want %s", got, request)
		}
	})
	t.Run("caller's earlier deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		var logged bytes.Buffer
		err := unaryDeadline(slog.New(slog.NewTextHandler(&logged, nil)), "containerd", fixed(request))(ctx, "/x.Containers/List", nil, nil, nil,
			func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				<-ctx.Done()
				return ctx.Err()
			})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v", err)
		}
		if logged.Len() > 0 {
			t.Errorf("a call its caller gave up on was logged as a hung containerd: %s", logged.String())
		}
	})

	t.Run("hung call", func(t *testing.T) {
		var logged bytes.Buffer
		err := unaryDeadline(slog.New(slog.NewTextHandler(&logged, nil)), "containerd", fixed(10*time.Millisecond))(context.Background(), "/x.Containers/List", nil, nil, nil,
			func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				<-ctx.Done()
				return ctx.Err()
			})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v", err)
		}
		if !strings.Contains(logged.String(), "containerd call timed out") || !strings.Contains(logged.String(), "call=/x.Containers/List") {
			t.Errorf("log %q", logged.String())
		}
	})
}
