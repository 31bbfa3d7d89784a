package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// DefaultPullProgressTimeout is how long a pull may go without receiving a byte from the
// registry while it waits on one, as containerd's CRI plugin's image_pull_progress_timeout.
const DefaultPullProgressTimeout = 5 * time.Minute

// WithPullProgressTimeout cancels a pull that waits on the registry for d without a byte
// coming (0: never). Defaults to DefaultPullProgressTimeout.
func WithPullProgressTimeout(d time.Duration) Option {
	return func(r *Runtime) { r.pullProgressTimeout = d }
}

// errPullStalled is the cause of a pull cancelled by its progress watch.
var errPullStalled = errors.New("the registry sent nothing")

// pullProgress watches one pull's HTTP requests to the registry. A pull has no deadline of
// its own, since a large image over a slow link takes as long as it takes, and containerd's
// registry client bounds only the wait for an answer's headers (30 s), not its body: a
// registry whose answer stops half-way through a layer (a link dropping packets without a
// reset, a proxy that hangs) held the pod's worker in that pull forever. What bounds it
// instead is progress: while at least one request is in flight (sent, its body not yet
// closed), a byte must arrive every timeout. Between requests (resolving, unpacking a layer
// into the snapshotter) nothing is waited on the registry and nothing is timed here.
type pullProgress struct {
	mu     sync.Mutex
	active int       // requests in flight
	last   time.Time // when a request was sent or a byte of an answer came
}

func newPullProgress(now time.Time) *pullProgress { return &pullProgress{last: now} }

func (p *pullProgress) begin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active++
	p.last = time.Now()
}

func (p *pullProgress) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active--
	p.last = time.Now()
}

func (p *pullProgress) touch() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = time.Now()
}

// stalledFor is how long the pull has waited on the registry without a byte; 0 when it is
// not waiting on it.
func (p *pullProgress) stalledFor(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.active == 0 {
		return 0
	}
	return now.Sub(p.last)
}

// transport wraps a registry client's transport so that its requests are watched.
func (p *pullProgress) transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return progressTransport{next: next, p: p}
}

// watch cancels the pull with errPullStalled once it has waited timeout on the registry. It
// returns the function that stops the watch and waits for it: the caller owns its goroutine.
func (p *pullProgress) watch(cancel context.CancelCauseFunc, timeout time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(max(timeout/10, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				if stalled := p.stalledFor(now); stalled >= timeout {
					cancel(fmt.Errorf("image pull cancelled: %w for %s (containerd.imagePullProgressTimeout)", errPullStalled, stalled.Round(time.Second)))
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

type progressTransport struct {
	next http.RoundTripper
	p    *pullProgress
}

func (t progressTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.p.begin()
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.p.end()
		return nil, err
	}
	resp.Body = &progressBody{ReadCloser: resp.Body, p: t.p}
	return resp, nil
}

// progressBody counts an answer's bytes as progress and ends its request when closed.
type progressBody struct {
	io.ReadCloser
	p    *pullProgress
	once sync.Once
}

func (b *progressBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if n > 0 {
		b.p.touch()
	}
	if err != nil { // EOF or a failure: nothing more is waited on, closed or not
		b.once.Do(b.p.end)
	}
	return n, err
}

func (b *progressBody) Close() error {
	b.once.Do(b.p.end)
	return b.ReadCloser.Close()
}
