package nodeapi

import (
	"context"
	"fmt"
	"net"
	"os"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// dialInNetNS connects to address from inside the network namespace at netnsPath ("" for the
// agent's own). The socket is created by a thread switched into the namespace (a socket
// belongs to the namespace it was created in); the thread is switched back before it is
// released, or, if that fails, it is left locked so that the Go runtime discards it.
func dialInNetNS(ctx context.Context, netnsPath, address string) (net.Conn, error) {
	var d net.Dialer
	if netnsPath == "" {
		return d.DialContext(ctx, "tcp", address)
	}
	target, err := os.Open(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer target.Close()
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() { // ends after one dial; the caller waits for it
		goruntime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("open own network namespace: %w", err)}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter network namespace %s: %w", netnsPath, err)}
			return
		}
		conn, derr := d.DialContext(ctx, "tcp", address)
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays in the pod's namespace: keep it locked so it dies with this
			// goroutine instead of running other goroutines there.
			if conn != nil {
				conn.Close()
			}
			ch <- result{err: fmt.Errorf("leave network namespace %s: %w", netnsPath, err)}
			return
		}
		goruntime.UnlockOSThread()
		ch <- result{conn: conn, err: derr}
	}()
	res := <-ch
	return res.conn, res.err
}
