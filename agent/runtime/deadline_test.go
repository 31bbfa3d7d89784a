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

// TestCallDeadlines: each kind of containerd call gets its bound, a caller's earlier deadline
// stands, and a call cut by the bound (not by its caller) is logged by name.
func TestCallDeadlines(t *testing.T) {
	const request = time.Minute
	for _, tc := range []struct {
		method string
		want   time.Duration // 0: no deadline
	}{
		{"/containerd.services.containers.v1.Containers/List", request},
		{"/containerd.services.tasks.v1.Tasks/Get", request},
		{"/containerd.services.tasks.v1.Tasks/Kill", request},
		{"/containerd.services.tasks.v1.Tasks/Wait", 0},
		{"/containerd.services.diff.v1.Diff/Apply", layerApplyTimeout},
	} {
		if got, want := callTimeout(tc.method, false, request), tc.want; got != want {
			t.Errorf("%s: callTimeout %s, want %s", tc.method, got, want)
		}
		var got time.Duration
		invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			if d, ok := ctx.Deadline(); ok {
				got = time.Until(d)
			}
			return nil
		}
		if err := unaryDeadline(slog.New(slog.DiscardHandler), "containerd", containerdBound(request))(context.Background(), tc.method, nil, nil, nil, invoker); err != nil {
			t.Fatal(err)
		}
		if (tc.want == 0) != (got == 0) || got > tc.want || got < tc.want-time.Second {
			t.Errorf("%s: deadline in %s, want %s", tc.method, got, tc.want)
		}
	}

	for _, tc := range []struct {
		method string
		want   time.Duration
	}{
		{"/containerd.services.containers.v1.Containers/ListStream", request},
		{"/containerd.services.snapshots.v1.Snapshots/List", request},
		{"/containerd.services.content.v1.Content/Read", layerApplyTimeout},
		{"/containerd.services.content.v1.Content/Write", 0},
		{"/containerd.services.events.v1.Events/Subscribe", 0},
	} {
		if got := callTimeout(tc.method, true, request); got != tc.want {
			t.Errorf("stream %s: callTimeout %s, want %s", tc.method, got, tc.want)
		}
	}

	t.Run("caller's earlier deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		var logged bytes.Buffer
		err := unaryDeadline(slog.New(slog.NewTextHandler(&logged, nil)), "containerd", containerdBound(request))(ctx, "/x.Containers/List", nil, nil, nil,
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
		err := unaryDeadline(slog.New(slog.NewTextHandler(&logged, nil)), "containerd", containerdBound(10*time.Millisecond))(context.Background(), "/x.Containers/List", nil, nil, nil,
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
