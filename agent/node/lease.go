package node

// The Lease's renewal: component-helpers' lease controller (k8s.io/component-helpers
// v0.37.2, apimachinery/lease, Apache License 2.0, the Kubernetes Authors) as the kubelet
// runs it, Run alone, over kube.LeaseInterface: that package imports client-go's full
// clientset, and with it the code of every API group (issue 31). Behaviour unchanged.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/kube"
)

const (
	// leaseUpdateRetries is how many times in a row a renewal is tried before waiting for
	// the next interval.
	leaseUpdateRetries = 5
	// leaseMaxBackoff caps the wait between attempts to create or read the Lease.
	leaseMaxBackoff = 7 * time.Second
)

// leaseController creates the node's Lease and renews it every renewInterval (4% jitter).
type leaseController struct {
	client                     kube.LeaseInterface
	holderIdentity, leaseName  string
	leaseNamespace             string
	leaseDurationSeconds       int32
	renewInterval              time.Duration
	onRepeatedHeartbeatFailure func() // may be nil
	postProcess                func(*coordinationv1.Lease) error
	log                        *slog.Logger

	// latestLease is the Lease last written: a renewal updates it without reading it first.
	// Only Run's goroutine touches it.
	latestLease *coordinationv1.Lease
}

// Run renews the Lease until ctx ends.
func (c *leaseController) Run(ctx context.Context) {
	wait.JitterUntilWithContext(ctx, c.sync, c.renewInterval, 0.04, true)
}

func (c *leaseController) sync(ctx context.Context) {
	if c.latestLease != nil {
		// The Lease is written by this agent alone: update from the last version written,
		// without a GET.
		err := c.retryUpdateLease(ctx, c.latestLease)
		if err == nil {
			return
		}
		c.log.Info("failed to update lease using latest lease, fallback to ensure lease", "err", err)
	}
	lease, created := c.backoffEnsureLease(ctx)
	c.latestLease = lease
	if !created && lease != nil {
		if err := c.retryUpdateLease(ctx, lease); err != nil {
			c.log.Error("will retry updating lease", "err", err, "interval", c.renewInterval)
		}
	}
}

// backoffEnsureLease reads or creates the Lease, retrying with a doubling wait up to
// leaseMaxBackoff; it returns the Lease and whether it created it, nil once ctx ends.
func (c *leaseController) backoffEnsureLease(ctx context.Context) (*coordinationv1.Lease, bool) {
	sleep := 100 * time.Millisecond
	for {
		lease, created, err := c.ensureLease(ctx)
		if err == nil {
			return lease, created
		}
		sleep = min(2*sleep, leaseMaxBackoff)
		c.log.Error("failed to ensure lease exists, will retry", "err", err, "interval", sleep)
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(sleep):
		}
	}
}

// ensureLease returns the Lease, creating it when it does not exist.
func (c *leaseController) ensureLease(ctx context.Context) (*coordinationv1.Lease, bool, error) {
	lease, err := c.client.Get(ctx, c.leaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		leaseToCreate, err := c.newLease(nil)
		if err != nil {
			// postProcess failed: not created this time, tried again at the next sync.
			return nil, false, nil
		}
		lease, err := c.client.Create(ctx, leaseToCreate, metav1.CreateOptions{})
		if err != nil {
			return nil, false, err
		}
		return lease, true, nil
	} else if err != nil {
		return nil, false, err
	}
	return lease, false, nil
}

// retryUpdateLease renews the Lease from base, up to leaseUpdateRetries times; a conflict
// reads the Lease again.
func (c *leaseController) retryUpdateLease(ctx context.Context, base *coordinationv1.Lease) error {
	for i := range leaseUpdateRetries {
		leaseToUpdate, err := c.newLease(base)
		if err != nil {
			c.log.Error("failed to prepare lease", "err", err)
		} else {
			lease, err := c.client.Update(ctx, leaseToUpdate, metav1.UpdateOptions{})
			if err == nil {
				c.latestLease = lease
				return nil
			}
			c.log.Error("failed to update lease", "err", err)
			if apierrors.IsConflict(err) {
				base, _ = c.backoffEnsureLease(ctx)
				continue
			}
		}
		if i > 0 && c.onRepeatedHeartbeatFailure != nil {
			c.onRepeatedHeartbeatFailure()
		}
	}
	return fmt.Errorf("failed %d attempts to update lease", leaseUpdateRetries)
}

// newLease is a new Lease (base nil) or a copy of base, with the duration and renew time
// set and postProcess applied. An error from postProcess: the Lease is not written this round,
// neither created nor updated (as upstream, whose comment says otherwise); ownedByNode never
// returns one.
func (c *leaseController) newLease(base *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	var lease *coordinationv1.Lease
	if base == nil {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: c.leaseName, Namespace: c.leaseNamespace},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(c.holderIdentity)},
		}
	} else {
		lease = base.DeepCopy()
	}
	lease.Spec.LeaseDurationSeconds = ptr.To(c.leaseDurationSeconds)
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if c.postProcess != nil {
		return lease, c.postProcess(lease)
	}
	return lease, nil
}
