package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/holdfast-dev/holdfast/agent/metrics"
)

// Reachability is what the apiserver's latest answer to a heartbeat (a Lease renewal, a node
// status write) says about the uplink. The node status is read from a watch and written only
// when it changed, so most status syncs make no request: the Lease renewals, every
// RenewInterval, are what tells whether the apiserver is there. Wrap the heartbeat client's
// transport with Wrap; the zero value is ready to use (not contacted yet).
type Reachability struct {
	// Metrics is told of every answer and failure; nil: nothing is recorded.
	Metrics *metrics.Metrics

	mu   sync.Mutex
	err  error
	seen bool
}

// Wrap returns rt observed: each request that got an answer below 500 is a reachable
// apiserver, a transport error or a 5xx (an apiserver starting, or without its etcd) is not.
// A request cancelled (the agent stopping) says nothing; one that ran out of its deadline says
// the apiserver did not answer in time.
func (r *Reachability) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		switch {
		case err != nil && errors.Is(req.Context().Err(), context.Canceled):
			// The agent stopping: nothing learnt about the uplink.
		case err != nil:
			r.observe(err)
		case resp.StatusCode >= 500:
			r.observe(fmt.Errorf("apiserver answered %s to %s %s", resp.Status, req.Method, req.URL.Path))
		default:
			r.observe(nil)
		}
		return resp, err
	})
}

func (r *Reachability) observe(err error) {
	r.mu.Lock()
	r.err, r.seen = err, true
	r.mu.Unlock()
	r.Metrics.APIReachable(err == nil)
}

// Err returns nil when the latest heartbeat reached the apiserver, else why it did not.
func (r *Reachability) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.seen {
		return errNotContacted
	}
	return r.err
}

// Down reports whether the latest heartbeat failed to reach the apiserver; false before the
// first.
func (r *Reachability) Down() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen && r.err != nil
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
