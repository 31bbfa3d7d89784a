package node

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
)

// leaseCalls counts the verbs the fake apiserver saw on leases.
type leaseCalls struct {
	mu    sync.Mutex
	verbs []string
}

func (c *leaseCalls) record(verb string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.verbs = append(c.verbs, verb)
}

func (c *leaseCalls) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.verbs
	c.verbs = nil
	return v
}

func newTestLeaseController(t *testing.T, cs *fake.Clientset, calls *leaseCalls, failures *int) *leaseController {
	t.Helper()
	for _, verb := range []string{"get", "create", "update"} {
		cs.PrependReactor(verb, "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
			calls.record(a.GetVerb())
			return false, nil, nil
		})
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gw-lease", UID: "node-uid"}}
	return &leaseController{
		client:                     kubetest.Wrap(cs).CoordinationV1().Leases(LeaseNamespace),
		holderIdentity:             node.Name,
		leaseName:                  node.Name,
		leaseNamespace:             LeaseNamespace,
		leaseDurationSeconds:       40,
		renewInterval:              10 * time.Second,
		onRepeatedHeartbeatFailure: func() { *failures++ },
		postProcess:                ownedByNode(node),
		log:                        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func equalVerbs(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The Lease's renewal, as the kubelet's lease controller does it (agent/node/lease.go is a
// copy): created owned by the Node, renewed without a read, a conflict read again and
// retried, a deleted Lease made again with its owner, the repeated-failure hook called on
// the retries of a renewal that keeps failing.
func TestLeaseRenewal(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	calls := &leaseCalls{}
	failures := 0
	c := newTestLeaseController(t, cs, calls, &failures)
	leases := cs.CoordinationV1().Leases(LeaseNamespace)

	c.sync(ctx)
	if got := calls.take(); !equalVerbs(got, []string{"get", "create"}) {
		t.Errorf("first sync: %v, want get and create", got)
	}
	l, err := leases.Get(ctx, "gw-lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != "node-uid" || *l.Spec.LeaseDurationSeconds != 40 ||
		*l.Spec.HolderIdentity != "gw-lease" || l.Spec.RenewTime == nil {
		t.Errorf("created lease %+v", l)
	}
	calls.take() // the test's own get

	c.sync(ctx)
	if got := calls.take(); !equalVerbs(got, []string{"update"}) {
		t.Errorf("renewal: %v, want an update alone (from the lease last written)", got)
	}

	// Another writer changed the Lease: the update conflicts, the Lease is read, the update
	// is tried again from it.
	conflicted := false
	cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicted {
			return false, nil, nil
		}
		conflicted = true
		calls.record("update") // answered here, before the recording reactor
		return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), "gw-lease", nil)
	})
	c.sync(ctx)
	if got := calls.take(); !equalVerbs(got, []string{"update", "get", "update"}) {
		t.Errorf("renewal after a conflict: %v, want update, get, update", got)
	}
	if failures != 0 {
		t.Errorf("repeated-failure hook called %d times on a conflict resolved at once", failures)
	}

	// The Lease deleted (an operator, a namespace cleanup): the renewal fails on every try
	// (the hook called on each retry), then the Lease is made again, owned by the Node.
	if err := leases.Delete(ctx, "gw-lease", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	calls.take()
	c.sync(ctx)
	want := []string{"update", "update", "update", "update", "update", "get", "create"}
	if got := calls.take(); !equalVerbs(got, want) {
		t.Errorf("renewal of a deleted lease: %v, want %v", got, want)
	}
	if failures != leaseUpdateRetries-1 {
		t.Errorf("repeated-failure hook called %d times, want %d (each retry)", failures, leaseUpdateRetries-1)
	}
	if l, err := leases.Get(ctx, "gw-lease", metav1.GetOptions{}); err != nil || len(l.OwnerReferences) != 1 {
		t.Errorf("the lease made again: %+v, %v", l, err)
	}
}
