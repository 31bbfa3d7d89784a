package pods

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/prober"
)

// postStartTimeout bounds a postStart hook; kubelet bounds it only by the container's life,
// which lets one hanging hook stall its pod's worker forever.
const postStartTimeout = 2 * time.Minute

// minKillGrace is what SIGTERM always gets after a preStop hook, as in kubelet.
const minKillGrace = 2 * time.Second

// runHook runs a lifecycle handler (exec, httpGet, tcpSocket or sleep) against a running
// container, with the probe handlers, so hooks and probes share one implementation.
//
// timeout bounds every kind, the sleep too: a preStop hook gets the grace period, however
// long it sleeps (the kubelet's executePreStopHook), and a sleep cut short is a failed hook.
func (m *Manager) runHook(ctx context.Context, pod *v1.Pod, c *v1.Container, containerID string, pid uint32, h *v1.LifecycleHandler, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if h.Sleep != nil {
		sleep := time.NewTimer(time.Duration(h.Sleep.Seconds) * time.Second)
		defer sleep.Stop()
		select {
		case <-sleep.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("sleep of %ds cut short: %w", h.Sleep.Seconds, ctx.Err())
		}
	}
	if m.hooks == nil {
		return errors.New("no hook handler on this node")
	}
	probe := &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: h.Exec, HTTPGet: h.HTTPGet, TCPSocket: h.TCPSocket}}
	outcome, out, err := m.hooks.Probe(ctx, prober.Target{
		Pod: pod, Container: c, ContainerID: containerID, Kind: prober.Liveness, Probe: probe,
		PodIP: m.podIP(pod), Pid: pid, Timeout: timeout,
	})
	if err != nil {
		return err
	}
	if outcome == prober.Failure {
		return fmt.Errorf("%s", out)
	}
	return nil
}

// podIP is the address hooks reach the pod at.
func (m *Manager) podIP(pod *v1.Pod) string {
	var ips []string
	if pn := m.net.Get(string(pod.UID)); pn != nil {
		ips = pn.IPs
	}
	return first(podAddresses(pod, ips, m.hostIPs()))
}

// stopWithPreStop runs the container's preStop hook (bounded by the grace period), waits for
// its turn when the whole pod stops (order; nil when one container is killed), then stops it
// with what is left of the grace period (at least minKillGrace).
func (w *worker) stopWithPreStop(ctx context.Context, pod *v1.Pod, name, id string, pid uint32, grace time.Duration, order *terminationOrder) error {
	if order != nil {
		defer order.exitedNow(name)
	}
	c := findContainer(pod, name)
	if c != nil && c.Lifecycle != nil && c.Lifecycle.PreStop != nil && grace > 0 {
		start := time.Now()
		if err := w.m.runHook(ctx, pod, c, id, pid, c.Lifecycle.PreStop, grace); err != nil {
			w.m.event(pod, v1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed: %v", err)
		}
		grace -= time.Since(start)
	}
	if order != nil {
		grace -= order.waitTurn(ctx, name, grace)
	}
	return w.m.rt.StopContainer(ctx, id, max(grace, minKillGrace))
}

func findContainer(pod *v1.Pod, name string) *v1.Container {
	for _, c := range allContainers(pod) {
		if c.Name == name {
			return c
		}
	}
	return nil
}
