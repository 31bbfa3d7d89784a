package containerd

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestPullProgress: a request the server never answers, and an answer that stops half-way,
// stall the pull and cancel it with errPullStalled; an answer that trickles in slower than
// the timeout in all but faster per byte, and time spent between requests, do not.
func TestPullProgress(t *testing.T) {
	const timeout = 300 * time.Millisecond
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hang": // headers never sent
			<-release
		case "/half": // half an answer, then nothing
			w.Header().Set("Content-Length", "8")
			w.Write([]byte("half"))
			w.(http.Flusher).Flush()
			<-release
		case "/trickle": // 10 bytes, one per timeout/3: 1 s in all
			w.Header().Set("Content-Length", "10")
			for range 10 {
				w.Write([]byte("x"))
				w.(http.Flusher).Flush()
				time.Sleep(timeout / 3)
			}
		}
	}))
	defer srv.Close()
	defer close(release) // before the server's Close, which waits for the handlers

	get := func(path string, between time.Duration) error {
		// A backstop: without the watch, /hang would hang the test.
		backstop, cancelBackstop := context.WithTimeout(context.Background(), 20*timeout)
		defer cancelBackstop()
		ctx, cancel := context.WithCancelCause(backstop)
		defer cancel(nil)
		p := newPullProgress(time.Now())
		stop := p.watch(cancel, timeout)
		defer stop()
		c := &http.Client{Transport: p.transport(srv.Client().Transport)}
		time.Sleep(between) // no request in flight: not a stall
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		resp, err := c.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil {
			return context.Cause(ctx)
		}
		return nil
	}
	for _, path := range []string{"/hang", "/half"} {
		if err := get(path, 0); !errors.Is(err, errPullStalled) {
			t.Errorf("%s: %v, want the pull cancelled as stalled", path, err)
		}
	}
	if err := get("/trickle", 3*timeout); err != nil {
		t.Errorf("/trickle after a pause between requests: %v, want no stall", err)
	}
}
